//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`: Gemma, Llama 2, Mistral 0.1):
//! merges chosen by token *score*, not by a merge list. Spaces become U+2581 (`▁`) before
//! merging; the text starts as one symbol per UTF-8 character, and the adjacent pair whose
//! concatenation is a vocabulary token with the highest score is merged (ties: the leftmost
//! pair) until no pair forms a token. A symbol left that is not a token is written as its
//! bytes' `<0xNN>` tokens (byte fallback). This is the algorithm llama.cpp runs for these
//! models, so the ids are its ids.

use std::collections::{BinaryHeap, HashMap};

/// U+2581, SentencePiece's visible space.
pub const SPACE: char = '\u{2581}';

/// What SPM encoding needs besides the text → id map.
#[derive(Clone, Debug)]
pub struct Spm {
    /// Per token id.
    pub scores: Vec<f32>,
    /// The `<0xNN>` token of each byte (or the unknown token where the vocabulary lacks it).
    pub byte_ids: [u32; 256],
}

/// A candidate merge: symbols `left` and `right` (adjacent now), whose concatenation is a
/// token of `score` and `len` bytes.
#[derive(Clone, Copy, Debug)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// The heap pops the highest score first; among equal scores, the leftmost pair.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

/// A run of the text: bytes `start..start + len`, linked to its neighbours.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Spm {
    /// Appends the ids of `text` (spaces already turned into [`SPACE`]) to `out`.
    pub fn encode(&self, text: &str, vocab: &HashMap<String, u32>, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        let mut heap = BinaryHeap::with_capacity(symbols.len());
        let token_of = |s: &Symbol, len: usize| vocab.get(&text[s.start..s.start + len]).copied();
        let push = |heap: &mut BinaryHeap<Bigram>, symbols: &[Symbol], l: usize, r: usize| {
            let len = symbols[l].len + symbols[r].len;
            if let Some(id) = token_of(&symbols[l], len) {
                if let Some(&score) = self.scores.get(id as usize) {
                    heap.push(Bigram {
                        score,
                        left: l,
                        right: r,
                        len,
                    });
                }
            }
        };
        for i in 1..symbols.len() {
            push(&mut heap, &symbols, i - 1, i);
        }
        while let Some(b) = heap.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // Stale: one side has merged since (or grown, so the pair is another text).
            if l.len == 0 || r.len == 0 || l.len + r.len != b.len || l.next != Some(b.right) {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            if let Some(p) = l.prev {
                push(&mut heap, &symbols, p, b.left);
            }
            if let Some(n) = r.next {
                push(&mut heap, &symbols, b.left, n);
            }
        }
        let mut at = Some(0);
        while let Some(i) = at {
            let s = symbols[i];
            match token_of(&s, s.len) {
                Some(id) => out.push(id),
                None => out.extend(
                    text.as_bytes()[s.start..s.start + s.len]
                        .iter()
                        .map(|&b| self.byte_ids[b as usize]),
                ),
            }
            at = s.next;
        }
    }
}

/// `text` with every space turned into [`SPACE`].
pub fn escape_spaces(text: &str) -> String {
    text.replace(' ', "\u{2581}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary of byte tokens plus a few scored pieces.
    fn toy(pieces: &[(&str, f32)]) -> (Spm, HashMap<String, u32>) {
        let mut vocab = HashMap::new();
        let mut scores = Vec::new();
        let mut byte_ids = [0u32; 256];
        for b in 0..=255u8 {
            byte_ids[b as usize] = scores.len() as u32;
            vocab.insert(format!("<0x{b:02X}>"), scores.len() as u32);
            scores.push(0.0);
        }
        for &(p, s) in pieces {
            vocab.insert(p.to_string(), scores.len() as u32);
            scores.push(s);
        }
        (Spm { scores, byte_ids }, vocab)
    }

    fn ids(spm: &Spm, vocab: &HashMap<String, u32>, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        spm.encode(&escape_spaces(text), vocab, &mut out);
        let by_id: HashMap<u32, &String> = vocab.iter().map(|(k, &v)| (v, k)).collect();
        out.iter().map(|i| by_id[i].clone()).collect()
    }

    #[test]
    fn highest_score_merges_first() {
        // "abc": "ab" (-1) and "bc" (-0.5) compete; "bc" wins, then "abc" is not a token.
        let (spm, v) = toy(&[
            ("a", -5.0),
            ("b", -5.0),
            ("c", -5.0),
            ("ab", -1.0),
            ("bc", -0.5),
        ]);
        assert_eq!(ids(&spm, &v, "abc"), ["a", "bc"]);
        // With "abc" a token, it forms from either side.
        let (spm, v) = toy(&[
            ("a", -5.0),
            ("b", -5.0),
            ("c", -5.0),
            ("ab", -1.0),
            ("bc", -0.5),
            ("abc", -3.0),
        ]);
        assert_eq!(ids(&spm, &v, "abc"), ["abc"]);
    }

    #[test]
    fn equal_scores_merge_leftmost_first() {
        let (spm, v) = toy(&[("a", -5.0), ("aa", -1.0)]);
        assert_eq!(ids(&spm, &v, "aaa"), ["aa", "a"]);
        assert_eq!(ids(&spm, &v, "aaaa"), ["aa", "aa"]);
    }

    #[test]
    fn spaces_become_the_visible_space_and_unknown_characters_fall_back_to_bytes() {
        let (spm, v) = toy(&[
            ("▁", -2.0),
            ("h", -5.0),
            ("i", -5.0),
            ("▁hi", -1.0),
            ("hi", -1.5),
        ]);
        assert_eq!(ids(&spm, &v, " hi hi"), ["▁hi", "▁hi"]);
        // "é" is not a token: its two UTF-8 bytes are.
        assert_eq!(ids(&spm, &v, "hié"), ["hi", "<0xC3>", "<0xA9>"]);
        assert!(ids(&spm, &v, "").is_empty());
    }
}
