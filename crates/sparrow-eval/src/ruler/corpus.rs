//! What RULER's generators draw from: the haystack's prose cut into sentences (the "essay"
//! haystack), a vocabulary of plain English words taken from the same prose (keys, and the
//! words of the common-words task), and random values (7-digit numbers, UUIDs, word pairs).
//!
//! RULER draws its words from a dictionary package we do not have offline; the haystack's
//! own lower-case words serve the same purpose (ordinary English words, no proper nouns) and
//! keep the benchmark self-contained.

use rand::seq::index::sample;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use sparrow::{Error, Result};

/// Fewest distinct words the vocabulary must hold: the common-words task at 32K tokens
/// needs about 2,500.
pub const MIN_VOCABULARY: usize = 4000;

/// The prose and words every task draws from, built once per haystack.
pub struct Corpus {
    /// Sentences of the haystack, whitespace collapsed, in order.
    sentences: Vec<String>,
    /// Distinct lower-case words of 4–10 letters, sorted.
    words: Vec<String>,
}

impl Corpus {
    /// Cut `text` into sentences and collect its vocabulary; an error when it holds too
    /// few words for the tasks.
    pub fn new(text: &str) -> Result<Corpus> {
        let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let sentences = split_sentences(&collapsed);
        let mut words: Vec<String> = collapsed
            .split(|c: char| !c.is_ascii_alphabetic())
            .filter(|w| (4..=10).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_lowercase()))
            .map(str::to_string)
            .collect();
        words.sort_unstable();
        words.dedup();
        if words.len() < MIN_VOCABULARY {
            return Err(Error::Other(format!(
                "the haystack has {} distinct lower-case words; RULER's tasks need at least {MIN_VOCABULARY}",
                words.len()
            )));
        }
        Ok(Corpus { sentences, words })
    }

    /// The sentences of the haystack.
    pub fn sentences(&self) -> &[String] {
        &self.sentences
    }

    /// The vocabulary.
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// `n` consecutive sentences starting at a point drawn from `rng` (so cases differ in
    /// their prose), or an error when the haystack is shorter.
    pub fn essay(&self, rng: &mut ChaCha8Rng, n: usize) -> Result<&[String]> {
        if n > self.sentences.len() {
            return Err(Error::Other(format!(
                "the haystack holds {} sentences, fewer than the {n} asked for",
                self.sentences.len()
            )));
        }
        let start = rng.random_range(0..=self.sentences.len() - n);
        Ok(&self.sentences[start..start + n])
    }

    /// `n` distinct words of the vocabulary, in random order.
    pub fn distinct_words(&self, rng: &mut ChaCha8Rng, n: usize) -> Result<Vec<String>> {
        if n > self.words.len() {
            return Err(Error::Other(format!(
                "{n} distinct words asked for; the vocabulary holds {}",
                self.words.len()
            )));
        }
        Ok(sample(rng, self.words.len(), n)
            .into_iter()
            .map(|i| self.words[i].clone())
            .collect())
    }

    /// A random value of `kind`.
    pub fn value(&self, rng: &mut ChaCha8Rng, kind: ValueKind) -> String {
        match kind {
            ValueKind::Number => rng.random_range(1_000_000u32..10_000_000).to_string(),
            ValueKind::Uuid => uuid_v4(rng.random()),
            ValueKind::Word => {
                let a = &self.words[rng.random_range(0..self.words.len())];
                let b = &self.words[rng.random_range(0..self.words.len())];
                format!("{a}-{b}")
            }
        }
    }
}

/// What a key or value is made of (RULER's `numbers`, `uuids`, `words`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// A 7-digit number.
    Number,
    /// A version-4 UUID in its usual hex form.
    Uuid,
    /// Two vocabulary words joined by a hyphen (`quiet-harbour`).
    Word,
}

impl ValueKind {
    /// How the prompt names one value of this kind and several.
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            ValueKind::Number => ("number", "numbers"),
            ValueKind::Uuid => ("UUID", "UUIDs"),
            ValueKind::Word => ("word", "words"),
        }
    }
}

/// 128 random bits as a version-4 UUID (`xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx`).
fn uuid_v4(bits: u128) -> String {
    let b = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{b:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Sentences of `text` (whitespace already collapsed): each ends after `.`, `!` or `?`
/// (and any closing quotes) followed by a space.
fn split_sentences(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if matches!(bytes[i], b'.' | b'!' | b'?') {
            let mut end = i + 1;
            while end < bytes.len() && matches!(bytes[end], b'"' | b'\'' | b')') {
                end += 1;
            }
            if end < bytes.len() && bytes[end] == b' ' {
                let s = text[start..end].trim();
                if !s.is_empty() {
                    out.push(s.to_string());
                }
                start = end + 1;
                i = end;
            }
        }
        i += 1;
    }
    let rest = text[start..].trim();
    if !rest.is_empty() {
        out.push(rest.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn sentences_end_at_stops_followed_by_a_space() {
        let s = split_sentences("One two. \"Three?\" Four! Mr.Five e.g.six. Last");
        assert_eq!(
            s,
            [
                "One two.",
                "\"Three?\"",
                "Four!",
                "Mr.Five e.g.six.",
                "Last"
            ]
        );
    }

    #[test]
    fn uuids_are_version_4_and_distinct() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let a = uuid_v4(rng.random());
        let b = uuid_v4(rng.random());
        assert_ne!(a, b);
        for u in [&a, &b, &uuid_v4(u128::MAX), &uuid_v4(0)] {
            assert_eq!(u.len(), 36);
            let parts: Vec<&str> = u.split('-').collect();
            assert_eq!(
                parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
                [8, 4, 4, 4, 12]
            );
            assert!(parts[2].starts_with('4'), "{u}");
            assert!("89ab".contains(&parts[3][..1]), "{u}");
        }
    }

    #[test]
    fn a_small_text_is_refused_by_its_word_count() {
        let e = Corpus::new("only a few words here.").err().unwrap();
        assert!(e.to_string().contains("distinct lower-case words"), "{e}");
    }
}
