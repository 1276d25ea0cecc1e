//! Perplexity scoring on a small synthetic model: chunked scoring equals token-by-token
//! scoring, and decode-mode scoring is what sees a decode-phase policy.

#[path = "../../sparrow/tests/policy_harness/mod.rs"]
mod policy_harness;

use policy_harness::{model, quest};
use sparrow::attention::AttentionChoice;
use sparrow::synthetic::{synthetic_model, synthetic_tokens, SyntheticSpec};
use sparrow::{KvType, Logits, Model};
use sparrow_eval::perplexity::{log_prob, score_chunk, ChunkScore, ChunkScoring};

/// Scores `chunk` in batches of `batch` over an f32 cache.
fn score(
    m: &Model,
    chunk: &[u32],
    bos: Option<u32>,
    batch: usize,
    attention: &AttentionChoice,
    decode: Option<usize>,
) -> sparrow::Result<ChunkScore> {
    let how = ChunkScoring {
        bos,
        batch,
        kv: KvType::F32.into(),
        attention: attention.clone(),
        decode,
    };
    score_chunk(m, chunk, &how)
}

#[test]
fn chunk_perplexity_equals_token_by_token_scoring() {
    let full = AttentionChoice::default();
    let model = synthetic_model(&SyntheticSpec::default()).unwrap();
    let chunk: Vec<u32> = (0..24).map(|i| (i * 37 % 250) as u32).collect();
    // Reference: one token at a time, scoring positions 12..23 (second half).
    let mut st = model.new_state(24, KvType::F32).unwrap();
    let mut nll = 0.0;
    for j in 0..23 {
        let logits = model.forward(&mut st, &[chunk[j]], Logits::Last).unwrap();
        if j >= 12 {
            nll -= log_prob(logits, chunk[j + 1]);
        }
    }
    for batch in [1, 5, 12, 64] {
        let s = score(&model, &chunk, None, batch, &full, None).unwrap();
        assert_eq!(s.count, 11);
        assert!(
            (s.nll - nll).abs() < 1e-3,
            "batch {batch}: {} vs {nll}",
            s.nll
        );
    }
    // BOS replacement changes the first token only, and so the score.
    let s = score(&model, &chunk, Some(256), 8, &full, None).unwrap();
    assert!((s.nll - nll).abs() > 1e-6);
    assert!(score(&model, &chunk[..3], None, 8, &full, None).is_err());
}

/// Decode-mode perplexity scores the same tokens as llama.cpp's batched scoring when asked
/// for the same half, and it is what sees a decode policy: with full attention both agree,
/// with a small Quest budget only the decode-mode figure moves.
#[test]
fn decode_scored_perplexity_sees_decode_policies() {
    let m = model();
    let chunk = synthetic_tokens(256, 21);
    let full = AttentionChoice::default();
    let batched = score(&m, &chunk, None, 64, &full, None).unwrap();
    let k = 256 - 1 - 128;
    let stepped = score(&m, &chunk, None, 64, &full, Some(k)).unwrap();
    assert_eq!((batched.count, stepped.count), (k, k));
    assert!(
        (batched.nll - stepped.nll).abs() < 1e-3 * k as f64,
        "{} vs {}",
        batched.nll,
        stepped.nll
    );
    let sparse = quest(8, 16);
    let q_batched = score(&m, &chunk, None, 64, &sparse, None).unwrap();
    let q_stepped = score(&m, &chunk, None, 64, &sparse, Some(k)).unwrap();
    assert_eq!(
        q_batched.nll, batched.nll,
        "quest must not touch batched prefill"
    );
    assert!(
        (q_stepped.nll - stepped.nll).abs() > 1e-3,
        "quest had no effect in decode"
    );
    assert!(score(&m, &chunk, None, 64, &full, Some(256)).is_err());
}
