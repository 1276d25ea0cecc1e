//! Needle in a haystack: hide one fact ("the magic number for Lisbon is 4821937") at a chosen
//! depth of a long filler text, ask for it at the end, and check the answer. Run over a grid
//! of context lengths × depths, it shows where a model (or an attention policy) stops
//! finding what it was told.

use crate::answer::{answer_with_policies, RunSettings};
use serde::Serialize;
use sparrow::attention::AttentionChoice;
use sparrow::chat::ChatMessage;
use sparrow::engine::Engine;
use sparrow::kv::KvOptions;
use sparrow::{Error, Result};

/// Keys for needles: words that do not occur near a long number in the haystack corpus.
const KEYS: &[&str] = &[
    "Oslo",
    "Nairobi",
    "Santiago",
    "Reykjavik",
    "Hanoi",
    "Quito",
    "Tbilisi",
    "Perth",
    "Montreal",
    "Dakar",
    "Lima",
    "Helsinki",
    "Osaka",
    "Bergen",
    "Zagreb",
    "Valencia",
];

/// One needle: the sentence to hide, the question, and the expected answer.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Needle {
    pub key: String,
    pub value: String,
    pub sentence: String,
    pub question: String,
}

impl Needle {
    /// A deterministic needle for `seed`: a key word and a 7-digit number.
    pub fn new(seed: u64) -> Needle {
        let mut s = seed
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(0x2545_f491_4f6c_dd1d);
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let key = KEYS[(next() % KEYS.len() as u64) as usize].to_string();
        let value = (1_000_000 + next() % 9_000_000).to_string();
        Needle {
            sentence: format!(" The special magic number for {key} is {value}. "),
            question: format!(
                "What is the special magic number for {key} mentioned in the text above? \
                 Answer with the number only."
            ),
            key,
            value,
        }
    }

    /// `n` other needles for a multi-key haystack (RULER's multi-key needle): each with a key
    /// of its own, different from this one's and each other's, and its own number, drawn
    /// deterministically from `seed`. At most one fewer than the keys there are.
    pub fn distractors(&self, seed: u64, n: usize) -> Result<Vec<Needle>> {
        if n >= KEYS.len() {
            return Err(Error::Other(format!(
                "{n} distractor needles asked for; at most {} (each needs a key of its own)",
                KEYS.len() - 1
            )));
        }
        let mut out: Vec<Needle> = Vec::with_capacity(n);
        let mut k = 0u64;
        while out.len() < n {
            let cand = Needle::new(seed.wrapping_mul(0x100_0193).wrapping_add(1 + k));
            k += 1;
            let clash = |o: &Needle| o.key == cand.key || o.value == cand.value;
            if !clash(self) && !out.iter().any(clash) {
                out.push(cand);
            }
        }
        Ok(out)
    }

    /// True when `answer` contains the number as a whole run of digits.
    pub fn is_found_in(&self, answer: &str) -> bool {
        answer
            .split(|c: char| !c.is_ascii_digit())
            .any(|run| run == self.value)
    }
}

/// Build the document of about `n_tokens` prompt tokens (filler plus needle, before the
/// chat wrapping) with the needle at `depth` (0 = start, 1 = end), placed at a sentence
/// boundary. Returns the text and the needle's token offset.
pub fn build_document(
    engine: &Engine,
    haystack: &str,
    needle: &Needle,
    n_tokens: usize,
    depth: f64,
) -> Result<(String, usize)> {
    build_document_with(engine, haystack, needle, n_tokens, depth, &[])
}

/// [`build_document`] with `distractors` hidden too, distractor `i` of `k` at depth
/// `(i + 0.5) / k` (each at a sentence boundary): a multi-key haystack, where the answer
/// must be the asked key's number and not a neighbour's. The offset is the needle's.
pub fn build_document_with(
    engine: &Engine,
    haystack: &str,
    needle: &Needle,
    n_tokens: usize,
    depth: f64,
    distractors: &[Needle],
) -> Result<(String, usize)> {
    let tok = &engine.tokenizer;
    let needles_len: usize = std::iter::once(needle)
        .chain(distractors)
        .map(|n| tok.encode(&n.sentence, false, false).len())
        .sum();
    let filler_tokens = n_tokens.saturating_sub(needles_len);
    // Tokenize a generous prefix of the haystack and cut it at the token budget.
    let approx_bytes = (filler_tokens * 6).min(haystack.len());
    let mut end = approx_bytes;
    while !haystack.is_char_boundary(end) {
        end -= 1;
    }
    let ids = tok.encode(&haystack[..end], false, false);
    if ids.len() < filler_tokens {
        return Err(Error::Other(format!(
            "the haystack holds only {} tokens, fewer than the {filler_tokens} asked for",
            ids.len()
        )));
    }
    let filler = tok.decode(&ids[..filler_tokens]);
    // (insertion point, sentence, is the asked needle), in document order; at one point
    // the distractors come first.
    let k = distractors.len();
    let mut inserts: Vec<(usize, &str, bool)> = distractors
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let at = sentence_boundary(&filler, (i as f64 + 0.5) / k as f64);
            (at, d.sentence.as_str(), false)
        })
        .collect();
    inserts.push((
        sentence_boundary(&filler, depth),
        needle.sentence.as_str(),
        true,
    ));
    inserts.sort_by_key(|&(at, _, main)| (at, main));
    let mut doc = String::with_capacity(filler.len() + 64 * (k + 1));
    let (mut from, mut needle_at) = (0, 0);
    for (at, sentence, main) in inserts {
        doc.push_str(&filler[from..at]);
        if main {
            needle_at = doc.len();
        }
        doc.push_str(sentence);
        from = at;
    }
    doc.push_str(&filler[from..]);
    let offset = tok.encode(&doc[..needle_at], false, false).len();
    Ok((doc, offset))
}

/// The byte offset of the sentence end in `filler` nearest to `depth` (0 = start, 1 = end)
/// of its length; exactly the start and the end at depths 0 and 1.
fn sentence_boundary(filler: &str, depth: f64) -> usize {
    if depth >= 1.0 {
        return filler.len();
    }
    if depth <= 0.0 {
        return 0;
    }
    let target = ((filler.len() as f64) * depth) as usize;
    let mut at = target.min(filler.len());
    while !filler.is_char_boundary(at) {
        at -= 1;
    }
    let before = filler[..at].rfind(". ").map(|i| i + 1);
    let after = filler[at..].find(". ").map(|i| at + i + 1);
    match (before, after) {
        (Some(b), Some(a)) => {
            if target - b <= a - target {
                b
            } else {
                a
            }
        }
        (Some(b), None) => b,
        (None, Some(a)) => a,
        (None, None) => at,
    }
}

/// The outcome of one (length, depth) cell.
#[derive(Clone, Debug, Serialize)]
pub struct NeedleResult {
    pub length: usize,
    pub depth: f64,
    pub prompt_tokens: usize,
    pub needle: Needle,
    /// Other needles hidden in the same document (multi-key; 0 for a single needle).
    pub distractors: usize,
    pub answer: String,
    pub found: bool,
    /// Seconds the prefill took (for a state read from the prefill cache, when it ran).
    pub prefill_seconds: f64,
    /// Whether the prefilled state was read from the prefill cache.
    pub prefill_cached: bool,
    /// What went wrong with the prefill cache, if anything (the answer stands).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_note: Option<String>,
    /// The attention policy that answered (its label, e.g. `quest`).
    pub attention: String,
}

/// How the question is put to the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NeedleFormat {
    /// The document and question as one user message in the model's chat template (or,
    /// without one, followed by `Answer:`); the model writes the whole reply.
    #[default]
    Chat,
    /// As `Chat`, with the reply begun for the model: "The special magic number for KEY
    /// is". Small models that ramble or restate the document still have to say a number.
    Primed,
}

impl NeedleFormat {
    /// By name: `chat` or `primed`.
    pub fn named(name: &str) -> std::result::Result<Self, String> {
        match name {
            "chat" => Ok(NeedleFormat::Chat),
            "primed" => Ok(NeedleFormat::Primed),
            other => Err(format!(
                "unknown needle format '{other}' (expected chat or primed)"
            )),
        }
    }

    /// The prompt for `user` (document + question) about `needle`.
    fn prompt(self, engine: &Engine, user: &str, needle: &Needle) -> Result<String> {
        let mut prompt = match &engine.chat_template {
            Some(t) => t.render(&[ChatMessage::new("user", user)], true)?,
            None => format!("{user}\nAnswer:"),
        };
        if self == NeedleFormat::Primed {
            prompt += &format!(" The special magic number for {} is", needle.key);
            if engine.chat_template.is_some() {
                prompt = prompt.replacen(" The special", "The special", 1);
            }
        }
        Ok(prompt)
    }
}

/// One cell's prompt, tokenized.
#[derive(Clone, Debug)]
pub struct NeedlePrompt {
    /// The prompt's token ids (special tokens of the chat template parsed).
    pub ids: Vec<u32>,
    /// The needle asked for.
    pub needle: Needle,
    /// Positions of the needle's sentence in `ids` (token boundaries may blur it by one).
    pub span: std::ops::Range<usize>,
}

/// One cell of a needle grid: a document of `length` tokens with the needle chosen by `seed`
/// hidden at `depth` (0 = start, 1 = end).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cell {
    pub length: usize,
    pub depth: f64,
    pub seed: u64,
}

/// The prompt of one cell, with `settings.distractors` other needles hidden beside the one
/// asked for, asked in `settings.format`.
pub fn needle_prompt(
    engine: &Engine,
    haystack: &str,
    cell: &Cell,
    settings: &CellSettings,
) -> Result<NeedlePrompt> {
    let Cell {
        length,
        depth,
        seed,
    } = *cell;
    let (distractors, format) = (settings.distractors, settings.format);
    let needle = Needle::new(seed);
    let others = needle.distractors(seed, distractors)?;
    let (doc, _) = build_document_with(engine, haystack, &needle, length, depth, &others)?;
    let user = format!("{doc}\n\n{}", needle.question);
    let prompt = format.prompt(engine, &user, &needle)?;
    let tok = &engine.tokenizer;
    let ids = tok.encode(&prompt, true, true);
    // The sentence is unique in the prompt (its key is no distractor's); the question
    // names the key but not the number.
    let start = prompt
        .find(&needle.sentence)
        .ok_or_else(|| Error::Other("the needle's sentence is not in its own prompt".into()))?;
    let end = start + needle.sentence.len();
    let span = tok.encode(&prompt[..start], true, true).len()
        ..tok.encode(&prompt[..end], true, true).len();
    Ok(NeedlePrompt { ids, needle, span })
}

/// How the model runs each cell: the same for every cell of a grid.
#[derive(Clone, Debug)]
pub struct CellSettings {
    /// KV cache element types (keys, values), and a cold tier if any.
    pub kv: KvOptions,
    /// Prompt tokens per prefill batch.
    pub batch_size: usize,
    /// How the question is asked.
    pub format: NeedleFormat,
    /// Other needles hidden beside the one asked for ([`Needle::distractors`]).
    pub distractors: usize,
    /// Where prefilled states are kept between runs (none: every prefill runs).
    pub prefill_cache: Option<crate::prefill_cache::PrefillCache>,
}

/// Ask the model, attending by `attention`, for the needle of `cell`.
pub fn run_cell(
    engine: &Engine,
    haystack: &str,
    cell: &Cell,
    settings: &CellSettings,
    attention: &AttentionChoice,
) -> Result<NeedleResult> {
    let choices = std::slice::from_ref(attention);
    let mut results =
        run_cell_policies(engine, haystack, cell, settings, choices, &mut |_, _, _| {})?;
    Ok(results.remove(0))
}

/// Ask the needle question of `cell` of every policy in `choices`, with one prefill per
/// prefill policy ([`answer_with_policies`]). Each prefill reports `progress(label, tokens
/// done, tokens in all)` after every batch (a 32K cell prefills for minutes). Results come
/// in the order of `choices`.
pub fn run_cell_policies(
    engine: &Engine,
    haystack: &str,
    cell: &Cell,
    settings: &CellSettings,
    choices: &[AttentionChoice],
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Vec<NeedleResult>> {
    let Cell { length, depth, .. } = *cell;
    let NeedlePrompt { ids, needle, .. } = needle_prompt(engine, haystack, cell, settings)?;
    let run = RunSettings {
        kv: settings.kv.clone(),
        batch_size: settings.batch_size,
        prefill_cache: settings.prefill_cache.clone(),
    };
    let answers = answer_with_policies(engine, &ids, 16, &run, choices, progress)?;
    Ok(answers
        .into_iter()
        .map(|a| NeedleResult {
            length,
            depth,
            prompt_tokens: ids.len(),
            found: needle.is_found_in(&a.answer),
            needle: needle.clone(),
            distractors: settings.distractors,
            answer: a.answer,
            prefill_seconds: a.prefill_seconds,
            prefill_cached: a.prefill_cached,
            prefill_note: a.prefill_note,
            attention: a.attention,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needles_are_deterministic_and_varied() {
        assert_eq!(Needle::new(3), Needle::new(3));
        let values: std::collections::HashSet<String> =
            (0..50).map(|s| Needle::new(s).value).collect();
        assert!(values.len() > 45);
        let n = Needle::new(1);
        assert_eq!(n.value.len(), 7);
        assert!(n.sentence.contains(&n.value) && n.question.contains(&n.key));
    }

    #[test]
    fn distractors_have_keys_and_numbers_of_their_own() {
        for seed in 0..20 {
            let n = Needle::new(seed);
            let d = n.distractors(seed, KEYS.len() - 1).unwrap();
            let mut keys: Vec<&str> = d.iter().map(|x| x.key.as_str()).collect();
            keys.push(&n.key);
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), KEYS.len(), "seed {seed}");
            assert!(d
                .iter()
                .all(|x| x.value != n.value && !n.is_found_in(&x.sentence)));
            assert_eq!(d, n.distractors(seed, KEYS.len() - 1).unwrap());
        }
        let e = Needle::new(1).distractors(1, KEYS.len()).unwrap_err();
        assert!(e.to_string().contains("at most 15"), "{e}");
    }

    #[test]
    fn sentence_boundaries_are_nearest_sentence_ends() {
        let text = "One two. Three four five. Six. Seven eight nine ten.";
        assert_eq!(sentence_boundary(text, 0.0), 0);
        assert_eq!(sentence_boundary(text, 1.0), text.len());
        let at = sentence_boundary(text, 0.5);
        assert_eq!(&text[at - 1..at + 1], ". ");
        assert_eq!(at, text.find("Six").unwrap() - 1);
    }

    #[test]
    fn answers_are_checked_for_the_exact_number() {
        let n = Needle {
            key: "Oslo".into(),
            value: "4821937".into(),
            sentence: String::new(),
            question: String::new(),
        };
        assert!(n.is_found_in("4821937"));
        assert!(n.is_found_in("The number is 4821937."));
        assert!(!n.is_found_in("482193"));
        assert!(!n.is_found_in("48219370"));
        assert!(!n.is_found_in("I don't know"));
    }
}
