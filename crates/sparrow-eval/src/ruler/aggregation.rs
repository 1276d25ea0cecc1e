//! RULER's aggregation tasks, where the answer is spread over the whole text and no single
//! passage holds it — the tasks top-k selection is expected to lose.
//!
//! * Common words: a numbered list of words in which ten words appear many times each and
//!   every other word a few times; name the ten. A short worked example comes first.
//! * Frequent words: "coded" words (random letter strings) drawn from a Zipf distribution,
//!   the most frequent one a run of dots to ignore; name the three most frequent others.

use super::corpus::Corpus;
use super::Draft;
use rand::seq::SliceRandom;
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sparrow::{Error, Result};

/// The common-words task: `common` words `common_reps` times each, the rest
/// `uncommon_reps` times each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonWordsSpec {
    pub common: usize,
    pub common_reps: usize,
    pub uncommon_reps: usize,
}

impl CommonWordsSpec {
    /// RULER's setting for a prompt of `budget` tokens: 30 and 3 repetitions, or 6 and 1
    /// under 4K tokens (where 30 would not leave room for uncommon words).
    pub fn for_budget(budget: usize) -> Self {
        if budget < 4096 {
            CommonWordsSpec {
                common: 10,
                common_reps: 6,
                uncommon_reps: 1,
            }
        } else {
            CommonWordsSpec {
                common: 10,
                common_reps: 30,
                uncommon_reps: 3,
            }
        }
    }

    /// The prompt with `size` distinct words in the list, drawn from `seed`.
    pub fn draft(&self, corpus: &Corpus, size: usize, seed: u64) -> Result<Draft> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let example_spec = if self.uncommon_reps == 1 {
            CommonWordsSpec {
                common: self.common,
                common_reps: 3,
                uncommon_reps: 1,
            }
        } else {
            CommonWordsSpec {
                common: self.common,
                common_reps: 10,
                uncommon_reps: 3,
            }
        };
        let example_size = if self.uncommon_reps == 1 { 20 } else { 40 };
        let example = example_spec.instance(corpus, &mut rng, example_size)?;
        let main = self.instance(corpus, &mut rng, size)?;
        let user = format!(
            "{}\n{} {}\n\n{}",
            example.user,
            example.answer_prefix,
            numbered(&example.expected),
            main.user
        );
        Ok(Draft { user, ..main })
    }

    fn instance(&self, corpus: &Corpus, rng: &mut ChaCha8Rng, size: usize) -> Result<Draft> {
        if size <= self.common {
            return Err(Error::Other(format!(
                "the common-words list needs more than {} distinct words, got {size}",
                self.common
            )));
        }
        let words = corpus.distinct_words(rng, size)?;
        let (common, uncommon) = words.split_at(self.common);
        let mut list: Vec<&str> = Vec::new();
        for w in common {
            list.extend(std::iter::repeat_n(w.as_str(), self.common_reps));
        }
        for w in uncommon {
            list.extend(std::iter::repeat_n(w.as_str(), self.uncommon_reps));
        }
        list.shuffle(rng);
        let n = self.common;
        Ok(Draft {
            user: format!(
                "Below is a numbered list of words. Some words appear more often than others. \
                 Remember the ones that appear most often.\n{}\nQuestion: Which are the {n} \
                 words that appear most often in the list above?",
                numbered(&list)
            ),
            answer_prefix: format!(
                "Answer: The {n} words that appear most often in the list above are:"
            ),
            expected: common.to_vec(),
        })
    }
}

/// `1. a 2. b 3. c`.
fn numbered<S: AsRef<str>>(items: &[S]) -> String {
    items
        .iter()
        .enumerate()
        .map(|(i, w)| format!("{}. {}", i + 1, w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The frequent-words task: coded words of `word_len` letters, a vocabulary of
/// `vocabulary` of them, word of rank k drawn in proportion to k^-`alpha`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FrequentWordsSpec {
    pub alpha: f64,
    pub word_len: usize,
    pub vocabulary: usize,
}

/// The most frequent "word", which the question says to ignore.
pub const DOTS: &str = "....";

impl FrequentWordsSpec {
    /// RULER's setting for a prompt of `budget` tokens: α = 2, six letters, a vocabulary of
    /// one word per 50 tokens.
    pub fn for_budget(budget: usize) -> Self {
        FrequentWordsSpec {
            alpha: 2.0,
            word_len: 6,
            vocabulary: (budget / 50).max(10),
        }
    }

    /// How often the word of rank `k` (1-based) appears among `size` draws:
    /// ⌊size · k^-α / ζ(α)⌋.
    pub fn count(&self, size: usize, k: usize) -> usize {
        (size as f64 * (k as f64).powf(-self.alpha) / self.zeta()) as usize
    }

    /// ζ(α): the first thousand terms, and the rest by the Euler–Maclaurin tail.
    fn zeta(&self) -> f64 {
        let a = self.alpha;
        let n = 1000.0f64;
        let head: f64 = (1..1000).map(|k| (k as f64).powf(-a)).sum();
        head + n.powf(1.0 - a) / (a - 1.0) + 0.5 * n.powf(-a)
    }

    /// The prompt with about `size` coded words, drawn from `seed`.
    pub fn draft(&self, size: usize, seed: u64) -> Result<Draft> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut vocab: Vec<String> = Vec::with_capacity(self.vocabulary);
        while vocab.len() < self.vocabulary {
            let w: String = (0..self.word_len)
                .map(|_| rng.random_range(b'a'..=b'z') as char)
                .collect();
            if !vocab.contains(&w) {
                vocab.push(w);
            }
        }
        vocab[0] = DOTS.to_string();
        let mut words: Vec<&str> = Vec::new();
        for (k, w) in vocab.iter().enumerate() {
            words.extend(std::iter::repeat_n(w.as_str(), self.count(size, k + 1)));
        }
        if self.count(size, 4) <= self.count(size, 5) {
            return Err(Error::Other(format!(
                "{size} coded words are too few to tell the third most frequent from the fourth"
            )));
        }
        words.shuffle(&mut rng);
        Ok(Draft {
            user: format!(
                "Read the coded text below and count how often each coded word appears. Find \
                 the three coded words that appear most often. {}\nQuestion: Give no \
                 explanation, and ignore the dots '{DOTS}'. Which three coded words appear \
                 most often in the coded text above?",
                words.join(" ")
            ),
            answer_prefix: "Answer: The three coded words that appear most often in the coded \
                            text above are:"
                .to_string(),
            expected: vocab[1..4].to_vec(),
        })
    }
}
