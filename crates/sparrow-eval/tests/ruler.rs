//! RULER's generators produce what they claim, checked by reading each prompt back
//! independently of how it was built: every expected answer is in the text as asked (needles
//! with the asked keys and their values, and no other value for those keys), the variable
//! chain links from the asked number to exactly the expected names, the word lists have the
//! specified counts, and the prompt is within 2% of its token budget in the model's own
//! tokenizer. Then a real run at 4K on the 0.5B model: full attention finds the needles, a
//! decode window that cannot see them loses them (the benchmark can see a policy lose), and
//! the shared prefill leaves no trace of one policy in the next.

#[path = "../../sparrow/tests/common.rs"]
mod common;

use sparrow::attention::AttentionChoice;
use sparrow::kv::KvOptions;
use sparrow::policy::StreamingAttention;
use sparrow::{Engine, KvType};
use sparrow_eval::answer::RunSettings;
use sparrow_eval::ruler::{
    build_case, run_case, Case, CommonWordsSpec, Corpus, FrequentWordsSpec, Task, DOTS,
};
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| Engine::load(common::qwen_path()).unwrap())
}

fn corpus() -> &'static Corpus {
    static C: OnceLock<Corpus> = OnceLock::new();
    C.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/data/haystack/books");
        Corpus::new(&sparrow_eval::text::load_haystack(&dir).unwrap()).unwrap()
    })
}

/// The part of the prompt after the worked example (the tracing and common-words tasks
/// show one first), i.e. after the last occurrence of `marker`.
fn main_part<'a>(prompt: &'a str, marker: &str) -> &'a str {
    &prompt[prompt
        .rfind(marker)
        .expect("the instruction is in the prompt")..]
}

/// `One of the special magic KINDS for KEY is: VALUE.` sentences of `text` as (key, value).
fn needles(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("One of the special magic ") {
        rest = &rest[at + "One of the special magic ".len()..];
        let after_for = &rest[rest.find(" for ").unwrap() + 5..];
        let (key, tail) = after_for.split_once(" is: ").unwrap();
        let end = tail.find(['\n', ' ']).unwrap_or(tail.len());
        let value = tail[..end].trim_end_matches('.');
        out.push((key.to_string(), value.to_string()));
        rest = tail;
    }
    out
}

fn check_length(case: &Case) {
    let budget = case.length - case.task.max_new_tokens();
    let n = case.ids.len();
    assert!(
        n <= budget && n as f64 >= 0.98 * budget as f64,
        "{} at {}: {n} prompt tokens for a budget of {budget}",
        case.task.name(),
        case.length
    );
    assert_eq!(
        engine().tokenizer.encode(&case.prompt, true, true),
        case.ids
    );
}

fn check_niah(case: &Case) {
    let spec = case.task.niah().unwrap();
    let found = needles(&case.prompt);
    let question = &case.prompt[case.prompt.rfind("\nWhat ").unwrap()..];
    // The asked keys: those whose values are expected.
    let mut by_key: HashMap<&str, Vec<&str>> = HashMap::new();
    for (k, v) in &found {
        by_key.entry(k.as_str()).or_default().push(v.as_str());
    }
    let asked: Vec<&str> = by_key
        .iter()
        .filter(|(_, vs)| vs.iter().any(|v| case.expected.iter().any(|e| e == v)))
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(
        asked.len(),
        spec.queries,
        "{}: asked keys {asked:?}",
        case.task.name()
    );
    let mut want: Vec<&str> = case.expected.iter().map(String::as_str).collect();
    let mut got: Vec<&str> = asked.iter().flat_map(|k| by_key[k].clone()).collect();
    want.sort();
    got.sort();
    assert_eq!(
        got,
        want,
        "{}: the asked keys' values are the expected ones",
        case.task.name()
    );
    assert_eq!(want.len(), spec.queries * spec.values);
    for k in &asked {
        assert!(
            question.contains(k),
            "{}: the question names {k}",
            case.task.name()
        );
    }
    // Distractor keys: every hidden key but the asked ones, at least keys - queries of them
    // (the needle haystack adds one per line).
    assert!(
        by_key.len() >= spec.keys,
        "{}: {} keys",
        case.task.name(),
        by_key.len()
    );
    if spec.haystack == sparrow_eval::ruler::Haystack::Needles {
        assert!(by_key.len() > 20, "the haystack is made of needles");
    }
}

fn check_tracking(case: &Case) {
    let text = main_part(&case.prompt, "Keep track of the chains");
    let value: &str = text
        .split("assigned the value ")
        .nth(1)
        .unwrap()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap();
    // Statements `VAR X = Y`: follow assignments from the number.
    let mut holds: HashSet<String> = HashSet::new();
    let statements: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("VAR "))
        .map(|l| {
            let (a, b) = l.split_once(" = ").unwrap();
            (a.to_string(), b.trim_start_matches("VAR ").to_string())
        })
        .collect();
    assert_eq!(statements.len(), 5, "one chain of four hops");
    loop {
        let before = holds.len();
        for (a, b) in &statements {
            if b == value || holds.contains(b) {
                holds.insert(a.clone());
            }
        }
        if holds.len() == before {
            break;
        }
    }
    let want: HashSet<String> = case.expected.iter().cloned().collect();
    assert_eq!(
        holds, want,
        "vt: the chain from {value} names the expected variables"
    );
}

fn numbered_list(text: &str) -> Vec<&str> {
    let list = text.lines().nth(1).unwrap();
    let words: Vec<&str> = list.split_whitespace().collect();
    words
        .chunks(2)
        .enumerate()
        .map(|(i, pair)| {
            assert_eq!(
                pair[0],
                format!("{}.", i + 1),
                "the list is numbered in order"
            );
            pair[1]
        })
        .collect()
}

fn check_common_words(case: &Case) {
    let spec = CommonWordsSpec::for_budget(case.length - case.task.max_new_tokens());
    let list = numbered_list(main_part(&case.prompt, "Below is a numbered list"));
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for w in &list {
        *counts.entry(w).or_default() += 1;
    }
    assert_eq!(case.expected.len(), spec.common);
    for (w, n) in &counts {
        let want = if case.expected.iter().any(|e| e == w) {
            spec.common_reps
        } else {
            spec.uncommon_reps
        };
        assert_eq!(*n, want, "cwe: '{w}' appears {n} times");
    }
    assert!(case
        .expected
        .iter()
        .all(|e| counts.contains_key(e.as_str())));
}

fn check_frequent_words(case: &Case) {
    let spec = FrequentWordsSpec::for_budget(case.length - case.task.max_new_tokens());
    let text = main_part(&case.prompt, "Read the coded text below");
    let body = text.split_once("most often. ").unwrap().1;
    let body = body.split_once("\nQuestion:").unwrap().0;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for w in body.split(' ') {
        *counts.entry(w).or_default() += 1;
    }
    let mut ranked: Vec<(&str, usize)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    assert_eq!(ranked[0].0, DOTS, "the dots are the most frequent");
    let top: Vec<&str> = ranked[1..4].iter().map(|r| r.0).collect();
    assert_eq!(top, case.expected, "fwe: ranks 2–4 are the answer");
    assert!(
        ranked[3].1 > ranked[4].1,
        "the third answer is strictly ahead of the rest"
    );
    // Zipf: rank k appears ⌊N · k^-α / ζ(α)⌋ times, so within 2 of rank 1's count / k^α.
    let first = ranked[0].1 as f64;
    for (k, (_, n)) in ranked.iter().enumerate().take(6) {
        let want = first * ((k + 1) as f64).powf(-spec.alpha);
        assert!(
            (*n as f64 - want).abs() <= 2.0,
            "rank {}: {n} vs {want:.1}",
            k + 1
        );
    }
    assert!(ranked.iter().skip(1).all(|(w, _)| w.len() == spec.word_len));
}

#[test]
fn generators_produce_what_they_claim_at_their_length() {
    for &length in &[4096, 8192] {
        for task in Task::ALL {
            let a = build_case(engine(), corpus(), task, length, 0, 11).unwrap();
            let b = build_case(engine(), corpus(), task, length, 1, 11).unwrap();
            assert_ne!(a.prompt, b.prompt, "{}: cases differ", task.name());
            let again = build_case(engine(), corpus(), task, length, 0, 11).unwrap();
            assert_eq!(
                a.ids,
                again.ids,
                "{}: a case is the same every time",
                task.name()
            );
            for case in [&a, &b] {
                check_length(case);
                match task {
                    Task::Vt => check_tracking(case),
                    Task::Cwe => check_common_words(case),
                    Task::Fwe => check_frequent_words(case),
                    _ => check_niah(case),
                }
            }
        }
    }
}

#[test]
fn a_length_too_short_for_the_task_is_refused_by_name() {
    let e = build_case(engine(), corpus(), Task::Fwe, 300, 0, 1).unwrap_err();
    assert!(e.to_string().starts_with("fwe at 300 tokens"), "{e}");
}

/// 4K on the 0.5B, one case of a task per needle family (the whole grid, tracing and
/// aggregation too, is `sparrow eval ruler`'s job; their generators are checked above, and
/// this keeps CI's share small): full attention scores on the needle tasks; a decode window
/// of 64 recent tokens (the needles lie thousands back) loses them; and full's answer to the
/// single needle is the same, to the byte, on the fresh prefill and after the window's decode
/// on the same prefill (one prefill a case: the state is cut back to the prompt between
/// policies).
#[test]
fn ruler_at_4k_on_the_small_model_sees_a_policy_lose() {
    let settings = RunSettings {
        kv: KvOptions::from(KvType::F16),
        batch_size: 512,
        prefill_cache: None,
    };
    let window = AttentionChoice {
        prefill: Some("full".into()),
        decode: Some("streaming".into()),
        ..AttentionChoice::named("full")
    }
    .with(StreamingAttention {
        sinks: 4,
        window: 64,
    });
    let full_choice = AttentionChoice::named("full");
    // The single needle's short answer is decoded twice by full attention; the other tasks'
    // lists (a hundred tokens and more) once.
    let choices = [full_choice.clone(), window, full_choice];
    let (mut full, mut windowed) = (Vec::new(), Vec::new());
    let tasks = [
        Task::NiahSingle2,
        Task::NiahMultikey3,
        Task::NiahMultivalue,
        Task::NiahMultiquery,
    ];
    for task in tasks {
        let case = build_case(engine(), corpus(), task, 4096, 0, 3).unwrap();
        let asked = if task == Task::NiahSingle2 {
            &choices[..]
        } else {
            &choices[..2]
        };
        let r = run_case(engine(), &case, &settings, asked, &mut |_, _, _| {}).unwrap();
        eprintln!(
            "{}: window {:.2} {:?}, full {:.2} {:?}",
            task.name(),
            r[1].score,
            r[1].answer,
            r[0].score,
            r[0].answer
        );
        if let Some(again) = r.get(2) {
            assert_eq!(again.answer, r[0].answer, "full after the window's decode");
        }
        full.push(r[0].score);
        windowed.push(r[1].score);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    assert!(mean(&full) >= 0.9, "full finds the needles at 4K: {full:?}");
    assert!(
        mean(&windowed) <= 0.2,
        "a 64-token window cannot: {windowed:?}"
    );
}
