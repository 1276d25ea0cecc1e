//! The prefill cache on a synthetic model: answers from a cached prefill equal the answers
//! from a fresh one for every decode policy, the cached result reports the seconds its
//! prefill took, each prefill policy and batch size has its own file, and a damaged file is
//! refused with the reason, prefilled again and rewritten.

#[path = "../../sparrow/tests/common.rs"]
mod common;

use sparrow::attention::AttentionChoice;
use sparrow::policy::QuestSettings;
use sparrow::synthetic::{synthetic_tokens, SyntheticSpec};
use sparrow::{Engine, KvOptions, KvType};
use sparrow_eval::answer::{answer_with_policies, PolicyAnswer, RunSettings};
use sparrow_eval::prefill_cache::{PrefillCache, PrefillRecipe};
use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sparrow-eval-prefill-cache-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn engine(dir: &std::path::Path) -> Engine {
    let spec = SyntheticSpec {
        context_length: 1024,
        seed: 11,
        ..Default::default()
    };
    common::synthetic_engine(&dir.join("synthetic.gguf"), &spec)
}

/// Full attention, Quest decoding after a full prefill, and full decoding after an
/// XAttention prefill: two prefill groups.
fn choices() -> Vec<AttentionChoice> {
    let quest = AttentionChoice {
        prefill: Some("full".into()),
        decode: Some("quest".into()),
        kv_block: Some(16),
        ..AttentionChoice::named("full")
    }
    .with(QuestSettings {
        budget: 64,
        ..Default::default()
    });
    let xattention = AttentionChoice {
        prefill: Some("xattention".into()),
        decode: Some("full".into()),
        ..AttentionChoice::named("full")
    };
    vec![AttentionChoice::named("full"), quest, xattention]
}

fn run(
    engine: &Engine,
    ids: &[u32],
    batch: usize,
    cache: Option<&PrefillCache>,
) -> Vec<PolicyAnswer> {
    let settings = RunSettings {
        kv: KvOptions::from(KvType::F16),
        batch_size: batch,
        prefill_cache: cache.cloned(),
    };
    answer_with_policies(engine, ids, 12, &settings, &choices(), &mut |_, _, _| {}).unwrap()
}

fn texts(answers: &[PolicyAnswer]) -> Vec<&str> {
    answers.iter().map(|a| a.answer.as_str()).collect()
}

fn files(cache: &PrefillCache) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(cache.dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sparrow-prefill"))
        .collect();
    v.sort();
    v
}

#[test]
fn cached_prefills_answer_as_fresh_ones_and_damaged_files_are_refused() {
    let dir = scratch("main");
    let engine = engine(&dir);
    let ids = synthetic_tokens(400, 3);
    let fresh = run(&engine, &ids, 64, None);
    assert!(fresh
        .iter()
        .all(|a| !a.prefill_cached && a.prefill_note.is_none()));
    assert!(fresh.iter().all(|a| a.n_generated > 0));

    let cache = PrefillCache::new(dir.join("cache")).unwrap();
    let first = run(&engine, &ids, 64, Some(&cache));
    assert_eq!(texts(&first), texts(&fresh));
    assert!(first
        .iter()
        .all(|a| !a.prefill_cached && a.prefill_note.is_none()));
    let kept = files(&cache);
    assert_eq!(kept.len(), 2, "one file per prefill policy: {kept:?}");

    let second = run(&engine, &ids, 64, Some(&cache));
    assert_eq!(texts(&second), texts(&fresh));
    for (a, b) in second.iter().zip(&first) {
        assert!(a.prefill_cached, "{} prefilled again", a.attention);
        assert_eq!(a.prefill_seconds, b.prefill_seconds, "{}", a.attention);
        assert!(a.prefill_note.is_none());
    }

    // Another batch size is another recipe: its own files, prefilled afresh.
    let other_batch = run(&engine, &ids, 32, Some(&cache));
    assert!(other_batch.iter().all(|a| !a.prefill_cached));
    assert_eq!(files(&cache).len(), 4);

    // A flipped byte in one file: refused by its checksum, prefilled again, rewritten.
    let before = files(&cache);
    let victim = before
        .iter()
        .find(|p| {
            let full = AttentionChoice::named("full");
            let recipe = PrefillRecipe::new(&full, ids.len() - 1, 64, KvType::F16.into()).unwrap();
            cache.path(&engine, &ids[..ids.len() - 1], &recipe) == **p
        })
        .expect("the full prefill's file")
        .clone();
    let mut bytes = std::fs::read(&victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&victim, &bytes).unwrap();
    let third = run(&engine, &ids, 64, Some(&cache));
    assert_eq!(texts(&third), texts(&fresh));
    for a in &third {
        if a.attention == "xattention" || a.attention.starts_with("xattention") {
            assert!(
                a.prefill_cached,
                "{}: its file was not touched",
                a.attention
            );
        } else {
            assert!(!a.prefill_cached, "{}: read a damaged file", a.attention);
            let note = a.prefill_note.as_deref().unwrap_or("");
            assert!(note.contains("checksum"), "{}: note {note:?}", a.attention);
        }
    }
    let fourth = run(&engine, &ids, 64, Some(&cache));
    assert!(fourth
        .iter()
        .all(|a| a.prefill_cached && a.prefill_note.is_none()));
    assert_eq!(texts(&fourth), texts(&fresh));
    let _ = std::fs::remove_dir_all(&dir);
}
