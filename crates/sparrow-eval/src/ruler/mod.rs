//! RULER-style long-context tasks (Hsieh et al., "RULER: What's the Real Context Size of
//! Your Long-Context Language Models?", 2024), generated from the haystack folder and the
//! model's own tokenizer, and answered under any list of attention policies.
//!
//! The tasks follow the paper's definitions and parameters: eight needle variants, variable
//! tracking, common- and frequent-words extraction. The two QA tasks need SQuAD and
//! HotpotQA, which we do not have offline: they are left out. Prompts are worded in our own
//! words, with RULER's structure: instructions and text in the user turn, the answer begun
//! for the model in its turn ("The special magic number for … is"). A case of length L
//! holds as much filler as keeps its prompt within L minus the task's answer budget (as
//! RULER counts: the prompt and the answer fit in L). Scoring is RULER's: the share of the
//! expected strings found in the answer, case-insensitively.

mod aggregation;
mod corpus;
mod niah;
mod tracking;

pub use aggregation::{CommonWordsSpec, FrequentWordsSpec, DOTS};
pub use corpus::{Corpus, ValueKind};
pub use niah::{needle, Haystack, NiahSpec, NOISE};
pub use tracking::TrackingSpec;

use crate::answer::{answer_with_policies, RunSettings};
use serde::{Deserialize, Serialize};
use sparrow::attention::AttentionChoice;
use sparrow::chat::ChatMessage;
use sparrow::engine::Engine;
use sparrow::{Error, Result};

/// A task's prompt before the chat template: the user's message, the beginning of the
/// answer written for the model, and the strings a right answer contains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Draft {
    pub user: String,
    pub answer_prefix: String,
    pub expected: Vec<String>,
}

/// RULER's synthetic tasks (by their names in the paper's configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Task {
    #[serde(rename = "niah_single_1")]
    NiahSingle1,
    #[serde(rename = "niah_single_2")]
    NiahSingle2,
    #[serde(rename = "niah_single_3")]
    NiahSingle3,
    #[serde(rename = "niah_multikey_1")]
    NiahMultikey1,
    #[serde(rename = "niah_multikey_2")]
    NiahMultikey2,
    #[serde(rename = "niah_multikey_3")]
    NiahMultikey3,
    #[serde(rename = "niah_multivalue")]
    NiahMultivalue,
    #[serde(rename = "niah_multiquery")]
    NiahMultiquery,
    #[serde(rename = "vt")]
    Vt,
    #[serde(rename = "cwe")]
    Cwe,
    #[serde(rename = "fwe")]
    Fwe,
}

/// Groups of tasks that test one ability; results are summarised per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// One needle to find.
    Single,
    /// One needle among needles of other keys.
    MultiKey,
    /// Every value of one key.
    MultiValue,
    /// The values of several keys.
    MultiQuery,
    /// Multi-hop tracing: variable chains.
    Tracing,
    /// Aggregation: common and frequent words.
    Aggregation,
}

impl Family {
    /// Every family, in table order.
    pub const ALL: [Family; 6] = [
        Family::Single,
        Family::MultiKey,
        Family::MultiValue,
        Family::MultiQuery,
        Family::Tracing,
        Family::Aggregation,
    ];

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Family::Single => "single needle",
            Family::MultiKey => "multi-key",
            Family::MultiValue => "multi-value",
            Family::MultiQuery => "multi-query",
            Family::Tracing => "tracing",
            Family::Aggregation => "aggregation",
        }
    }
}

impl Task {
    /// Every task, in the paper's order.
    pub const ALL: [Task; 11] = [
        Task::NiahSingle1,
        Task::NiahSingle2,
        Task::NiahSingle3,
        Task::NiahMultikey1,
        Task::NiahMultikey2,
        Task::NiahMultikey3,
        Task::NiahMultivalue,
        Task::NiahMultiquery,
        Task::Vt,
        Task::Cwe,
        Task::Fwe,
    ];

    /// The paper's name (`niah_single_1`, `vt`, …).
    pub fn name(self) -> &'static str {
        match self {
            Task::NiahSingle1 => "niah_single_1",
            Task::NiahSingle2 => "niah_single_2",
            Task::NiahSingle3 => "niah_single_3",
            Task::NiahMultikey1 => "niah_multikey_1",
            Task::NiahMultikey2 => "niah_multikey_2",
            Task::NiahMultikey3 => "niah_multikey_3",
            Task::NiahMultivalue => "niah_multivalue",
            Task::NiahMultiquery => "niah_multiquery",
            Task::Vt => "vt",
            Task::Cwe => "cwe",
            Task::Fwe => "fwe",
        }
    }

    /// The task named `name`, or an error listing the names.
    pub fn named(name: &str) -> std::result::Result<Task, String> {
        Task::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| {
                format!(
                    "unknown RULER task '{name}' (tasks: {}; QA tasks need datasets we do not have offline)",
                    Task::ALL.map(Task::name).join(", ")
                )
            })
    }

    /// The family it is summarised in.
    pub fn family(self) -> Family {
        match self {
            Task::NiahSingle1 | Task::NiahSingle2 | Task::NiahSingle3 => Family::Single,
            Task::NiahMultikey1 | Task::NiahMultikey2 | Task::NiahMultikey3 => Family::MultiKey,
            Task::NiahMultivalue => Family::MultiValue,
            Task::NiahMultiquery => Family::MultiQuery,
            Task::Vt => Family::Tracing,
            Task::Cwe | Task::Fwe => Family::Aggregation,
        }
    }

    /// Tokens the answer may take (the paper's per-task budget).
    pub fn max_new_tokens(self) -> usize {
        match self {
            Task::Vt => 30,
            Task::Cwe => 120,
            Task::Fwe => 50,
            _ => 128,
        }
    }

    /// The needle task's parameters (the paper's `synthetic.yaml`), if it is one.
    pub fn niah(self) -> Option<NiahSpec> {
        use Haystack::*;
        use ValueKind::*;
        let spec = |haystack, key, value, keys, values, queries| NiahSpec {
            haystack,
            key,
            value,
            keys,
            values,
            queries,
        };
        Some(match self {
            Task::NiahSingle1 => spec(Repeat, Word, Number, 1, 1, 1),
            Task::NiahSingle2 => spec(Essay, Word, Number, 1, 1, 1),
            Task::NiahSingle3 => spec(Essay, Word, Uuid, 1, 1, 1),
            Task::NiahMultikey1 => spec(Essay, Word, Number, 4, 1, 1),
            Task::NiahMultikey2 => spec(Needles, Word, Number, 1, 1, 1),
            Task::NiahMultikey3 => spec(Needles, Uuid, Uuid, 1, 1, 1),
            Task::NiahMultivalue => spec(Essay, Word, Number, 1, 4, 1),
            Task::NiahMultiquery => spec(Essay, Word, Number, 4, 1, 4),
            _ => return None,
        })
    }

    /// The draft with `size` units of filler (sentences, lines or words: the unit the
    /// length is fitted in), drawn from `seed`, for a prompt budget of `budget` tokens.
    pub fn draft(self, corpus: &Corpus, budget: usize, size: usize, seed: u64) -> Result<Draft> {
        if let Some(spec) = self.niah() {
            return spec.draft(corpus, size, seed);
        }
        match self {
            Task::Vt => TrackingSpec { chains: 1, hops: 4 }.draft(size, seed),
            Task::Cwe => CommonWordsSpec::for_budget(budget).draft(corpus, size, seed),
            Task::Fwe => FrequentWordsSpec::for_budget(budget).draft(size, seed),
            _ => unreachable!("needle tasks are drafted above"),
        }
    }

    /// The smallest filler size the task can be drafted with.
    fn min_size(self) -> usize {
        match self {
            Task::Cwe => 11,
            Task::Fwe => 200,
            _ => 1,
        }
    }
}

/// One generated case: a task at a length, its prompt and what a right answer contains.
#[derive(Clone, Debug)]
pub struct Case {
    pub task: Task,
    /// The target length in tokens (prompt and answer budget).
    pub length: usize,
    /// Which of the task's cases at this length (0-based).
    pub index: usize,
    /// The seed the case was drawn from.
    pub seed: u64,
    /// The prompt as text (chat template applied, answer begun).
    pub prompt: String,
    /// The prompt's token ids.
    pub ids: Vec<u32>,
    pub expected: Vec<String>,
}

/// The seed of case `index` of `task` at `length` under the run's `seed`: each case its
/// own, the same on every run.
pub fn case_seed(seed: u64, task: Task, length: usize, index: usize) -> u64 {
    let t = Task::ALL.iter().position(|&x| x == task).unwrap_or(0) as u64;
    let mut z = seed
        ^ (t << 56)
        ^ ((length as u64) << 20)
        ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // SplitMix64's finaliser: nearby inputs give unrelated seeds.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The prompt text of `draft` for `engine`: the user turn in the model's chat template
/// with the answer begun in the assistant's turn (or, without a template, the user text
/// and the answer's beginning on the next line).
pub fn render(engine: &Engine, draft: &Draft) -> Result<String> {
    Ok(match &engine.chat_template {
        Some(t) => {
            let mut p = t.render(&[ChatMessage::new("user", &draft.user)], true)?;
            p.push_str(&draft.answer_prefix);
            p
        }
        None => format!("{}\n{}", draft.user, draft.answer_prefix),
    })
}

/// Generate case `index` of `task` at `length` tokens: the most filler whose prompt stays
/// within `length - task.max_new_tokens()` tokens of the model's tokenizer. Filler comes in
/// whole units (a sentence, a line, a listed word), so the prompt falls short of that budget
/// by less than one unit: under 2% from 4K tokens (RULER's shortest length) up; the
/// longest unit, a line of the UUID needle haystack, is ~60 tokens, 3% of a 2K budget.
pub fn build_case(
    engine: &Engine,
    corpus: &Corpus,
    task: Task,
    length: usize,
    index: usize,
    seed: u64,
) -> Result<Case> {
    let budget = length.saturating_sub(task.max_new_tokens());
    let seed = case_seed(seed, task, length, index);
    let prompt_at = |size: usize| -> Result<(Vec<u32>, Draft, String)> {
        let draft = task.draft(corpus, budget, size, seed)?;
        let prompt = render(engine, &draft)?;
        Ok((engine.tokenizer.encode(&prompt, true, true), draft, prompt))
    };
    let (size, _) = fit(budget, task.min_size(), |s| Ok(prompt_at(s)?.0.len()))
        .map_err(|e| Error::Other(format!("{} at {length} tokens: {e}", task.name())))?;
    let (ids, draft, prompt) = prompt_at(size)?;
    Ok(Case {
        task,
        length,
        index,
        seed,
        prompt,
        ids,
        expected: draft.expected,
    })
}

/// The largest size from `min` up whose token count stays within `budget`, with its count.
/// Counts grow with size (not always strictly: a size's count is measured, never assumed).
pub fn fit(
    budget: usize,
    min: usize,
    mut tokens: impl FnMut(usize) -> Result<usize>,
) -> Result<(usize, usize)> {
    let at_min = tokens(min)?;
    if at_min > budget {
        return Err(Error::Other(format!(
            "the smallest prompt of this task takes {at_min} tokens, more than the {budget} available"
        )));
    }
    // Bracket by proportion, then bisect: [lo fits, hi does not].
    let (mut lo, mut lo_tokens) = (min, at_min);
    let mut hi = (min as f64 * budget as f64 / at_min.max(1) as f64 * 1.05).ceil() as usize + 1;
    loop {
        let t = tokens(hi)?;
        if t > budget {
            break;
        }
        (lo, lo_tokens) = (hi, t);
        hi *= 2;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let t = tokens(mid)?;
        if t <= budget {
            (lo, lo_tokens) = (mid, t);
        } else {
            hi = mid;
        }
    }
    Ok((lo, lo_tokens))
}

/// RULER's score of one answer: the share of `expected` found in it (case-insensitive
/// substrings), 0 to 1.
pub fn score(answer: &str, expected: &[String]) -> f64 {
    if expected.is_empty() {
        return 0.0;
    }
    let answer = answer.to_lowercase();
    let found = expected
        .iter()
        .filter(|e| answer.contains(&e.to_lowercase()))
        .count();
    found as f64 / expected.len() as f64
}

/// One policy's result on one case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseResult {
    pub task: Task,
    pub length: usize,
    pub index: usize,
    pub seed: u64,
    pub prompt_tokens: usize,
    /// The attention choice's label (`full`, `quest`, `xattention+quest`, …).
    pub attention: String,
    /// The settings behind the label (budgets, re-rank factor, …: [`choice_settings`]), so
    /// a JSON that grew over several runs with different flags still says what ran.
    #[serde(default)]
    pub settings: String,
    pub expected: Vec<String>,
    pub answer: String,
    /// RULER's score, 0 to 1.
    pub score: f64,
    /// Seconds the prefill took (for a state read from the prefill cache, when it ran).
    pub prefill_seconds: f64,
    /// Whether the prefilled state was read from the prefill cache.
    #[serde(default)]
    pub prefill_cached: bool,
    /// What went wrong with the prefill cache, if anything (the answer stands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_note: Option<String>,
    pub decode_seconds: f64,
}

/// The settings of each policy `choice` runs, as `name: Settings { … }` per phase (one entry
/// when both phases run the same policy; none for `full`, which has no settings).
pub fn choice_settings(choice: &AttentionChoice) -> String {
    let Ok((prefill, decode)) = choice.phase_names() else {
        return String::new();
    };
    let mut names = vec![prefill];
    if decode != names[0] {
        names.push(decode);
    }
    names
        .iter()
        .filter(|n| n.as_str() != "full")
        .map(|n| format!("{n}: {}", choice.describe(n)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Answer `case` under every policy of `choices` (one prefill per prefill policy) and
/// score each answer. Results come in the order of `choices`.
pub fn run_case(
    engine: &Engine,
    case: &Case,
    settings: &RunSettings,
    choices: &[AttentionChoice],
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Vec<CaseResult>> {
    let answers = answer_with_policies(
        engine,
        &case.ids,
        case.task.max_new_tokens(),
        settings,
        choices,
        progress,
    )?;
    Ok(answers
        .into_iter()
        .zip(choices)
        .map(|(a, choice)| CaseResult {
            task: case.task,
            length: case.length,
            index: case.index,
            seed: case.seed,
            prompt_tokens: case.ids.len(),
            attention: a.attention,
            settings: choice_settings(choice),
            expected: case.expected.clone(),
            score: score(&a.answer, &case.expected),
            answer: a.answer,
            prefill_seconds: a.prefill_seconds,
            prefill_cached: a.prefill_cached,
            prefill_note: a.prefill_note,
            decode_seconds: a.decode_seconds,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_names_the_settings_behind_its_label() {
        use sparrow::policy::QuestSettings;
        let quest = AttentionChoice::named("quest").with(QuestSettings {
            budget: 410,
            rerank: 4,
            ..Default::default()
        });
        let s = choice_settings(&quest);
        assert!(
            s.starts_with("quest: ") && s.contains("budget: 410") && s.contains("rerank: 4"),
            "{s}"
        );
        let mut pair = quest.clone();
        pair.prefill = Some("xattention".into());
        let s = choice_settings(&pair);
        assert!(
            s.starts_with("xattention: ") && s.contains("; quest: "),
            "{s}"
        );
        assert_eq!(choice_settings(&AttentionChoice::named("full")), "");
    }

    #[test]
    fn scores_are_the_share_of_expected_strings_found() {
        let exp: Vec<String> = ["Alpha", "beta", "4821937"].map(String::from).to_vec();
        assert_eq!(score("alpha, BETA and 4821937", &exp), 1.0);
        assert!((score("only 4821937", &exp) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(score("nothing here", &exp), 0.0);
        assert_eq!(score("anything", &[]), 0.0);
    }

    #[test]
    fn fit_finds_the_largest_size_within_the_budget() {
        // Three tokens per unit plus ten, with a bump at 50 (counts are measured, not
        // assumed monotone).
        let count = |s: usize| Ok(10 + 3 * s + usize::from(s == 50) * 5);
        assert_eq!(fit(1000, 1, count).unwrap(), (330, 1000));
        assert_eq!(fit(13, 1, count).unwrap(), (1, 13));
        let e = fit(12, 1, count).unwrap_err();
        assert!(e.to_string().contains("more than the 12 available"), "{e}");
    }

    #[test]
    fn task_names_round_trip_and_unknown_ones_are_refused() {
        for t in Task::ALL {
            assert_eq!(Task::named(t.name()).unwrap(), t);
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(
                json,
                format!("\"{}\"", t.name()),
                "JSON names are the paper's"
            );
        }
        let e = Task::named("qa_1").unwrap_err();
        assert!(e.contains("QA tasks"), "{e}");
    }

    #[test]
    fn case_seeds_differ_by_task_length_and_index() {
        let mut seen = std::collections::HashSet::new();
        for t in Task::ALL {
            for l in [4096, 8192] {
                for i in 0..4 {
                    assert!(seen.insert(case_seed(1, t, l, i)));
                }
            }
        }
        assert_eq!(
            case_seed(1, Task::Vt, 4096, 2),
            case_seed(1, Task::Vt, 4096, 2)
        );
    }
}
