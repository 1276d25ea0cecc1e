//! RULER's needle-in-a-haystack variants: one or several keys, each with one or several
//! values, hidden in prose (`essay`), in a repeated noise line (`repeat`) or among other
//! needles (`needles`); one or several keys asked for. The answer is every value of every
//! key asked.

use super::corpus::{Corpus, ValueKind};
use super::Draft;
use rand::seq::index::sample;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sparrow::Result;

/// The noise line of the `repeat` haystack and the tracing task: short sentences that say
/// nothing, repeated.
pub const NOISE: &str =
    "The sea is grey. The hills are brown. The road runs on. Here we stay. Back and forth again.";

/// Relative depths a needle may be placed at in prose: 40 evenly spaced from start to end.
const DEPTHS: usize = 40;

/// What the needles hide in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Haystack {
    /// The haystack's prose, needles between sentences.
    Essay,
    /// [`NOISE`] line after line.
    Repeat,
    /// Other needles (other keys, other values) line after line: every line looks like
    /// the answer.
    Needles,
}

/// One needle task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NiahSpec {
    pub haystack: Haystack,
    pub key: ValueKind,
    pub value: ValueKind,
    /// Keys hidden (the asked ones and distractors).
    pub keys: usize,
    /// Values per key.
    pub values: usize,
    /// Keys asked for (at most `keys`).
    pub queries: usize,
}

impl NiahSpec {
    /// The prompt with `size` units of haystack (sentences or lines), drawn from `seed`.
    pub fn draft(&self, corpus: &Corpus, size: usize, seed: u64) -> Result<Draft> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (one, many) = self.value.names();
        let keys = distinct(self.keys, || corpus.value(&mut rng, self.key), &[]);
        let mut values: Vec<Vec<String>> = Vec::with_capacity(self.keys);
        let mut all_values: Vec<String> = Vec::new();
        for _ in 0..self.keys {
            let v = distinct(
                self.values,
                || corpus.value(&mut rng, self.value),
                &all_values,
            );
            all_values.extend(v.iter().cloned());
            values.push(v);
        }
        let mut needles: Vec<String> = keys
            .iter()
            .zip(&values)
            .flat_map(|(k, vs)| vs.iter().map(move |v| needle(many, k, v)))
            .collect();
        needles.shuffle(&mut rng);
        let context = match self.haystack {
            Haystack::Essay => {
                let sentences = corpus.essay(&mut rng, size)?;
                let mut at: Vec<usize> = if needles.len() <= DEPTHS {
                    sample(&mut rng, DEPTHS, needles.len()).into_vec()
                } else {
                    (0..needles.len()).map(|i| i % DEPTHS).collect()
                };
                at.sort_unstable();
                let positions: Vec<usize> = at
                    .iter()
                    .map(|&d| size * d / (DEPTHS - 1))
                    .map(|p| p.min(size))
                    .collect();
                interleave(sentences, &positions, &needles, " ")
            }
            Haystack::Repeat | Haystack::Needles => {
                let lines: Vec<String> = if self.haystack == Haystack::Repeat {
                    vec![NOISE.to_string(); size]
                } else {
                    (0..size)
                        .map(|_| {
                            let k = distinct(1, || corpus.value(&mut rng, self.key), &keys);
                            let v = distinct(1, || corpus.value(&mut rng, self.value), &all_values);
                            needle(many, &k[0], &v[0])
                        })
                        .collect()
                };
                let mut positions: Vec<usize> = random_positions(&mut rng, size + 1, needles.len());
                positions.sort_unstable();
                interleave(&lines, &positions, &needles, "\n")
            }
        };
        let asked: Vec<usize> = sample(&mut rng, self.keys, self.queries).into_vec();
        let query = join_and(&asked.iter().map(|&i| keys[i].as_str()).collect::<Vec<_>>());
        let expected: Vec<String> = asked.iter().flat_map(|&i| values[i].clone()).collect();
        let (user, answer_prefix) = if expected.len() == 1 {
            (
                format!(
                    "A special magic {one} is hidden in the text below. Remember it: I will ask \
                     you about it afterwards.\n{context}\nWhat is the special magic {one} for \
                     {query} in the text above?"
                ),
                format!("The special magic {one} for {query} in the text above is"),
            )
        } else {
            (
                format!(
                    "Some special magic {many} are hidden in the text below. Remember them: I \
                     will ask you about them afterwards.\n{context}\nWhat are all the special \
                     magic {many} for {query} in the text above?"
                ),
                format!("The special magic {many} for {query} in the text above are"),
            )
        };
        Ok(Draft {
            user,
            answer_prefix,
            expected,
        })
    }
}

/// The sentence that hides `value` for `key`.
pub fn needle(kinds: &str, key: &str, value: &str) -> String {
    format!("One of the special magic {kinds} for {key} is: {value}.")
}

/// `n` values from `draw`, distinct from each other and from `avoid`.
fn distinct(n: usize, mut draw: impl FnMut() -> String, avoid: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(n);
    while out.len() < n {
        let v = draw();
        if !out.contains(&v) && !avoid.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// `n` insertion points in `0..slots`, distinct while there are enough slots.
pub(super) fn random_positions(rng: &mut ChaCha8Rng, slots: usize, n: usize) -> Vec<usize> {
    if n <= slots {
        sample(rng, slots, n).into_vec()
    } else {
        (0..n).map(|i| i % slots).collect()
    }
}

/// `units` joined by `sep`, with `inserts[i]` placed before unit `positions[i]` (sorted;
/// `units.len()` places it at the end).
pub(super) fn interleave(
    units: &[String],
    positions: &[usize],
    inserts: &[String],
    sep: &str,
) -> String {
    interleaved(units, positions, inserts).join(sep)
}

/// [`interleave`]'s parts in order, not joined.
pub(super) fn interleaved<'a>(
    units: &'a [String],
    positions: &[usize],
    inserts: &'a [String],
) -> Vec<&'a str> {
    let mut parts: Vec<&str> = Vec::with_capacity(units.len() + inserts.len());
    let mut next = 0;
    for (i, unit) in units.iter().enumerate() {
        while next < inserts.len() && positions[next] <= i {
            parts.push(&inserts[next]);
            next += 1;
        }
        parts.push(unit);
    }
    parts.extend(inserts[next..].iter().map(String::as_str));
    parts
}

/// `a`, `a and b`, `a, b, and c`.
fn join_and(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [a, b] => format!("{a} and {b}"),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_land_before_their_unit_in_order() {
        let units: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let ins: Vec<String> = ["X", "Y", "Z"].map(String::from).to_vec();
        assert_eq!(interleave(&units, &[0, 2, 3], &ins, " "), "X a b Y c Z");
        assert_eq!(interleave(&units, &[1, 1, 1], &ins, "|"), "a|X|Y|Z|b|c");
    }

    #[test]
    fn keys_are_joined_as_a_list() {
        assert_eq!(join_and(&["a"]), "a");
        assert_eq!(join_and(&["a", "b"]), "a and b");
        assert_eq!(join_and(&["a", "b", "c"]), "a, b, and c");
    }
}
