//! Needle documents on the real default model: the asked length and depth, distractors in
//! order, and the model finds an easy needle.

#[path = "../../sparrow/tests/common.rs"]
mod common;

use sparrow::{Engine, KvType};
use sparrow_eval::needle::{
    build_document, build_document_with, run_cell, Cell, CellSettings, Needle,
};

#[test]
fn needle_documents_have_the_asked_length_and_depth_and_the_model_finds_it() {
    let engine = Engine::load(common::qwen_path()).unwrap();
    // A small generated haystack: numbered sentences, so positions are easy to read.
    let haystack: String = (0..3000)
        .map(|i| format!("Sentence {i} says that the weather was mild and the road was long. "))
        .collect();
    for (len, depth) in [(300usize, 0.0f64), (600, 0.5), (900, 0.25), (600, 1.0)] {
        let needle = Needle::new(len as u64);
        let (doc, offset) = build_document(&engine, &haystack, &needle, len, depth).unwrap();
        let n = engine.tokenizer.encode(&doc, false, false).len();
        assert!(n.abs_diff(len) <= 4, "asked {len} tokens, got {n}");
        assert_eq!(doc.matches(&needle.value).count(), 1);
        let at = offset as f64 / len as f64;
        assert!((at - depth).abs() < 0.05, "depth {depth}: needle at {at}");
    }
    // Multi-key: every distractor once, spread over the document, the asked needle where it
    // was asked, the length still the one asked for.
    let needle = Needle::new(5);
    let others = needle.distractors(5, 4).unwrap();
    let (doc, offset) =
        build_document_with(&engine, &haystack, &needle, 900, 0.6, &others).unwrap();
    let n = engine.tokenizer.encode(&doc, false, false).len();
    assert!(n.abs_diff(900) <= 6, "asked 900 tokens, got {n}");
    let at: Vec<usize> = others
        .iter()
        .map(|d| {
            assert_eq!(doc.matches(&d.sentence).count(), 1, "{}", d.key);
            doc.find(&d.sentence).unwrap()
        })
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "distractors out of order"
    );
    assert_eq!(doc.matches(&needle.value).count(), 1);
    assert!(
        (offset as f64 / 900.0 - 0.6).abs() < 0.05,
        "needle at {offset}"
    );
    let mut settings = CellSettings {
        kv: KvType::F16.into(),
        batch_size: 128,
        format: Default::default(),
        distractors: 0,
        prefill_cache: None,
    };
    let full = sparrow::attention::AttentionChoice::default();
    let cell = |length| Cell {
        length,
        depth: 0.5,
        seed: 7,
    };
    let r = run_cell(&engine, &haystack, &cell(400), &settings, &full).unwrap();
    assert!(
        r.found,
        "the model missed an easy needle: {:?} vs {}",
        r.answer, r.needle.value
    );
    settings.distractors = 3;
    let r = run_cell(&engine, &haystack, &cell(600), &settings, &full).unwrap();
    assert_eq!(r.distractors, 3);
    assert!(
        r.found,
        "the model took a distractor for the needle: {:?} vs {}",
        r.answer, r.needle.value
    );
    // A haystack too short for the request is an error, not a silent shorter test.
    assert!(build_document(&engine, "tiny text.", &Needle::new(1), 500, 0.5).is_err());
}
