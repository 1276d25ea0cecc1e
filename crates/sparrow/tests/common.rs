//! Shared helpers for tests that need the real models (fetched by scripts/fetch_models.py),
//! and the teacher-forced comparison the real-model tests share.
//!
//! # Comparing two runs of the real model
//!
//! The same model run twice can differ in the last bits of every logit without anything
//! being wrong: each SIMD level sums in its own order (`SPARROW_SIMD=scalar|avx2|avx512`),
//! and how a prompt is split into forward passes picks the kernels — the batched products
//! take sparrow-quant's panel GEMM from 16 tokens with AVX2 and from 6 with AVX-512, the
//! per-row kernels below that and in decode, each with its own f32 order. Activations are
//! quantized to 8 bits before each product (as in ggml), so a last-bit difference can move
//! one by a whole quantization step, and over 24 layers the logits of two such runs end up
//! several tenths apart (see [`ORDER_TOL`]): enough to turn a greedy near-tie the other way,
//! after which two free-running greedy paths share nothing. So the comparisons here are
//! *teacher-forced*: both runs are fed the same continuation and their logits compared step
//! by step ([`forced_logits`], [`assert_close`]), with a tolerance that says how far apart
//! the two runs may legitimately be; a step at which the two runs' top tokens differ is
//! accepted only when it is a near-tie within that tolerance.
//!
//! Where both sides make the same forward calls with the same kernels (same level, same
//! batch split, same attention path), the results are equal to the bit and the tests say so.
#![allow(dead_code)]

use sparrow::attention::AttentionChoice;
use sparrow::policy::quest::QuestSettings;
use sparrow::policy::saap::{Layout, Router, SaapSettings};
use sparrow::policy::sketch::SketchSettings;
use sparrow::synthetic::{synthetic_gguf, synthetic_saap_index, SyntheticSpec};
use sparrow::{Engine, Logits, Model, State};
use std::path::{Path, PathBuf};

pub fn models_dir() -> PathBuf {
    if let Ok(d) = std::env::var("SPARROW_MODELS") {
        return d.into();
    }
    let home = std::env::var("HOME").expect("HOME is set");
    PathBuf::from(home).join(".cache/sparrow/models")
}

/// The Qwen2.5 GGUF; a missing model is a failure (CI must fetch it), not a skip.
pub fn qwen_path() -> PathBuf {
    let p = models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        p.exists(),
        "{} is missing: run `python3 scripts/fetch_models.py qwen`",
        p.display()
    );
    p
}

/// A model `scripts/fetch_models.py NAME` fetches; missing is a failure (CI must fetch it).
fn fetched(file: &str, name: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(
        p.exists(),
        "{} is missing: run `python3 scripts/fetch_models.py {name}`",
        p.display()
    );
    p
}

/// The Qwen2.5-Coder-1.5B-Instruct GGUF (the long-context model: 28 layers, 2 KV heads of
/// 128).
pub fn qwen15b_path() -> PathBuf {
    fetched("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen1.5b")
}

/// The Gemma-3-270M GGUF (gemma3: sliding-window layers).
pub fn gemma_path() -> PathBuf {
    fetched("gemma-3-270m-q4_k_m.gguf", "gemma")
}

/// The SmolLM2-135M-Instruct GGUF (llama architecture, Q4_1).
pub fn smollm_path() -> PathBuf {
    fetched("smollm2-135m-instruct-q4_1.gguf", "smollm")
}

pub fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Logit tolerance ([`drift`]) between two runs that differ only in rounding: another SIMD
/// level, another batch split of the prompt, another attention kernel over the same keys
/// (H2O's two-pass softmax against the flash kernel), f16 against f32 cache rows, values
/// stored as Q8_0.
///
/// Derivation: Qwen2.5-Coder-0.5B Q4_K_M, teacher-forced on the prompts of
/// `kv_q8_0_real.rs` (5, 13 and 423 tokens, 24 steps), `greedy_reference.rs` (llama.cpp's
/// 64 steps) and `policies_ladder_h2o.rs` (34 tokens, 24 steps); largest [`drift`] over all
/// steps and prompts, with f16 / f32 / values-in-Q8_0 / keys-and-values-in-Q8_0 caches:
/// - one SIMD level against another, same cache type: avx2 vs scalar 0.44 / 0.40 / 0.72 /
///   0.74, avx512 vs scalar 0.49 / 0.36 / 0.71 / 0.78, avx512 vs avx2 0.35 / 0.36 / 0.35 /
///   0.37;
/// - prompt as one batch (panel GEMM) against token by token (per-row kernels), f16 / values
///   / keys and values in Q8_0: avx2 0.33 / 0.42 / 0.64, avx512 0.43 / 0.54 / 0.40 (only
///   avx512 takes the panels on the 13-token prompt: 0.27 there); at scalar, and below 6
///   (avx512) or 16 (avx2) tokens, both splits run the per-row kernels and agree to the bit;
/// - f16 against f32 cache: 0.71; values in Q8_0 against f16, any level and split: 0.65;
/// - H2O with a covering budget against `full` (its own decode kernel): 0.28 (scalar), 0.23
///   (avx2), 0.25 (avx512).
///
/// The spread is that large most likely because activations are quantized to 8 bits before
/// each product, as in ggml: a last-bit difference that moves a value across a rounding
/// boundary changes it by a whole quantization step. Twice the largest measured spread
/// (0.78), 1.6, leaves room for other prompts and hosts. A real error is far beyond it:
/// value rows read one position late move these logits by 7 to 29 per step (checked in
/// `kv_q8_0_real.rs`), a prompt missing its last token moves the first step by 11 and 19
/// (`greedy_reference.rs`), H2O or the ladder with small budgets by up to 14 and 7.4
/// (`policies_ladder_h2o.rs`).
pub const ORDER_TOL: f32 = 1.6;

/// How many of each run's highest logits [`drift`] compares: the tokens a greedy, top-k or
/// nucleus choice can land on. The other ~150k logits of the vocabulary decide nothing (over
/// all of them the same runs differ by up to 0.95, set by tokens no choice would pick).
pub const CANDIDATES: usize = 16;

/// Index of the largest logit (the first one on exact ties).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// How a prompt goes through the model before the forced continuation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefill {
    /// One forward pass over the whole prompt: the panel GEMM where the level has one and the
    /// prompt is long enough (AVX2 from 16 tokens, AVX-512 from 6).
    Batch,
    /// Forward passes of at most this many tokens; at most 5 keeps every level on its
    /// per-row kernels, so against [`Prefill::Batch`] the two runs take different kernels.
    Chunks(usize),
}

/// Teacher forcing: the logits after `prompt`, then after each token of `forced` but the
/// last, fed one at a time — step `i`'s logits are the ones that choose `forced[i]`.
pub fn forced_logits(
    model: &Model,
    state: &mut State,
    prompt: &[u32],
    forced: &[u32],
    prefill: Prefill,
) -> Vec<Vec<f32>> {
    let chunk = match prefill {
        Prefill::Batch => prompt.len(),
        Prefill::Chunks(n) => n,
    };
    let mut last = Vec::new();
    // As a prompt fed through `generate::prefill` does: the policy learns where it ends.
    state.expect_prompt_end(state.n_past() + prompt.len());
    for part in prompt.chunks(chunk.max(1)) {
        last = model.forward(state, part, Logits::Last).unwrap().to_vec();
    }
    let mut out = vec![last];
    for &t in &forced[..forced.len().saturating_sub(1)] {
        out.push(model.forward(state, &[t], Logits::Last).unwrap().to_vec());
    }
    out
}

/// Free-running greedy decoding: `steps` tokens after `prompt` (prefilled as one batch) and
/// the logits that chose each of them.
pub fn greedy(
    model: &Model,
    state: &mut State,
    prompt: &[u32],
    steps: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut logits = model.forward(state, prompt, Logits::Last).unwrap().to_vec();
    let (mut toks, mut all) = (Vec::new(), Vec::new());
    for i in 0..steps {
        let t = argmax(&logits) as u32;
        toks.push(t);
        all.push(logits);
        if i + 1 == steps {
            break;
        }
        logits = model.forward(state, &[t], Logits::Last).unwrap().to_vec();
    }
    (toks, all)
}

/// The `k` indices of the largest values, largest first.
pub fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    let k = k.min(v.len());
    if k == 0 {
        return Vec::new();
    }
    idx.select_nth_unstable_by(k - 1, |&a, &b| v[b].total_cmp(&v[a]));
    idx.truncate(k);
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    idx
}

/// Largest `|want[i] - got[i]|` over the [`CANDIDATES`] highest logits of either run.
pub fn drift(want: &[f32], got: &[f32]) -> f32 {
    top_k(want, CANDIDATES)
        .into_iter()
        .chain(top_k(got, CANDIDATES))
        .map(|i| (want[i] - got[i]).abs())
        .fold(0.0, f32::max)
}

/// A step at which two runs' top tokens differ.
#[derive(Clone, Copy, Debug)]
pub struct Flip {
    pub step: usize,
    /// The reference run's choice and the compared run's.
    pub want: usize,
    pub got: usize,
    /// How far the compared run's choice leads the reference's choice in the compared run,
    /// and the reference's choice leads it in the reference run (both ≥ 0).
    pub gap_got: f32,
    pub gap_want: f32,
}

/// Per-step comparison of two teacher-forced runs: each step's [`drift`] and its flip, if
/// any.
pub fn compare(want: &[Vec<f32>], got: &[Vec<f32>]) -> (Vec<f32>, Vec<Flip>) {
    assert_eq!(want.len(), got.len(), "runs of different lengths");
    let mut drifts = Vec::new();
    let mut flips = Vec::new();
    for (step, (w, g)) in want.iter().zip(got).enumerate() {
        drifts.push(drift(w, g));
        let (tw, tg) = (argmax(w), argmax(g));
        if tw != tg {
            flips.push(Flip {
                step,
                want: tw,
                got: tg,
                gap_got: g[tg] - g[tw],
                gap_want: w[tw] - w[tg],
            });
        }
    }
    (drifts, flips)
}

/// Why two teacher-forced runs are not within `tol` of each other, if they are not: a step
/// whose [`drift`] exceeds `tol`, or a flip that is not a near-tie — the two tokens more
/// than `2 * tol` apart in either run (two logits each within `tol` of the reference can
/// trade places only if they were within `2 * tol` of each other; with every candidate
/// within `tol` that follows, and it is checked on its own so the message names the step).
pub fn mismatch(want: &[Vec<f32>], got: &[Vec<f32>], tol: f32) -> Option<String> {
    mismatch_with(want, got, tol, 2.0 * tol)
}

/// [`mismatch`] with its own bound `tie` on a flip's gaps (for a lossy method whose choices
/// must still follow the reference's wherever rounding alone could not turn them).
pub fn mismatch_with(want: &[Vec<f32>], got: &[Vec<f32>], tol: f32, tie: f32) -> Option<String> {
    let (drifts, flips) = compare(want, got);
    if let Some((step, d)) = drifts.iter().enumerate().find(|(_, &d)| d > tol) {
        return Some(format!(
            "step {step}: candidate logits differ by {d} > {tol} (per step: {drifts:?})"
        ));
    }
    if let Some(f) = flips.iter().find(|f| f.gap_got > tie || f.gap_want > tie) {
        return Some(format!("{f:?}: not a near-tie within {tie}"));
    }
    None
}

/// Asserts [`mismatch`] finds nothing; returns the largest drift and the flips, for the log.
pub fn assert_close(what: &str, want: &[Vec<f32>], got: &[Vec<f32>], tol: f32) -> (f32, Vec<Flip>) {
    assert_close_with(what, want, got, tol, 2.0 * tol)
}

/// Asserts [`mismatch_with`] finds nothing; returns the largest drift and the flips.
pub fn assert_close_with(
    what: &str,
    want: &[Vec<f32>],
    got: &[Vec<f32>],
    tol: f32,
    tie: f32,
) -> (f32, Vec<Flip>) {
    if let Some(m) = mismatch_with(want, got, tol, tie) {
        panic!("{what}: {m}");
    }
    let (drifts, flips) = compare(want, got);
    let worst = drifts.iter().copied().fold(0.0, f32::max);
    let per: Vec<String> = drifts.iter().map(|d| format!("{d:.3}")).collect();
    eprintln!(
        "{what}: largest drift {worst:.4} (tolerance {tol}; per step {}), near-tie flips {flips:?}",
        per.join(" ")
    );
    (worst, flips)
}

/// Saap over a random index for `m`'s shapes (`buckets` buckets, a hidden width of 6,
/// `seed`), saved at `index`, visiting `probes` buckets through the hedged router with a
/// 1 + 31 dense part: it selects scattered positions through the store as a trained index
/// does, so the read path is exercised without one (none is trained in CI). `layout` says
/// whether the store keeps the sparse layers by position (`Positions`: scattered reads) or
/// grouped by bucket (`Buckets`: a bucket read as runs of the store's slots).
pub fn random_saap(
    m: &Model,
    index: &Path,
    (buckets, probes, seed): (usize, usize, u64),
    layout: Layout,
) -> AttentionChoice {
    synthetic_saap_index(&m.config, buckets, 6, seed)
        .save(index)
        .unwrap();
    AttentionChoice::named("saap").with(SaapSettings {
        index: Some(index.to_path_buf()),
        probes: Some(probes),
        router: Router::Hedged,
        window: 31,
        layout,
        ..Default::default()
    })
}

/// Quest in pages of 16 reading 48 positions per step, layer 0 dense: sparse on the small
/// synthetic models' contexts of a few hundred tokens.
pub fn small_quest() -> AttentionChoice {
    AttentionChoice::named("quest").with(QuestSettings {
        page: 16,
        budget: 48,
        dense_layers: vec![0],
        rerank: 0,
    })
}

/// The sketch at 8 of the small models' 32 channels, reading `budget` positions per step
/// after an exact second pass over twice as many, layer 0 dense.
pub fn small_sketch(budget: usize) -> AttentionChoice {
    small_sketch_sampling(budget, 0)
}

/// [`small_sketch`] with up to `sample`% of the budget a weighted sample of the keys the
/// ranking leaves out (`--sketch-sample`).
pub fn small_sketch_sampling(budget: usize, sample: usize) -> AttentionChoice {
    AttentionChoice::named("sketch").with(SketchSettings {
        block: 16,
        budget,
        channels: 8,
        dense_layers: vec![0],
        rerank: 2,
        sample,
    })
}

/// Full attention and every policy that keeps per-sequence summaries or reads less than
/// everything, on a small synthetic model `m` (Saap over a random index written into
/// `dir`): Quest, streaming, the sketch, Saap in both layouts, and an XAttention prefill
/// before Quest.
pub fn small_policies(m: &Model, dir: &Path) -> Vec<(&'static str, AttentionChoice)> {
    let saap = |layout| random_saap(m, &dir.join("random-small.saap"), (8, 2, 7), layout);
    vec![
        ("full", AttentionChoice::default()),
        ("quest", small_quest()),
        (
            "streaming",
            AttentionChoice::named("streaming").with(sparrow::attention::StreamingAttention {
                sinks: 2,
                window: 24,
            }),
        ),
        ("sketch", small_sketch(48)),
        ("saap", saap(Layout::Positions)),
        ("saap in bucket order", saap(Layout::Buckets)),
        ("xattention+quest", {
            let mut c = small_quest();
            c.prefill = Some("xattention".into());
            c
        }),
    ]
}

/// The small synthetic model of `seed` with heads of 32 (so Q8_0 caches fit) and a context
/// of `n_ctx`: 3 layers, 4 query heads, 2 KV heads.
pub fn small_spec(seed: u64, n_ctx: usize) -> sparrow::synthetic::SyntheticSpec {
    sparrow::synthetic::SyntheticSpec {
        n_layer: 3,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 2,
        context_length: n_ctx,
        seed,
        ..Default::default()
    }
}

/// Prefill `prompt` into `s` in batches of `batch`, then decode `steps` one at a time; the
/// last logits of every pass, in order.
pub fn prefill_and_decode(
    m: &Model,
    s: &mut sparrow::State,
    prompt: &[u32],
    batch: usize,
    steps: &[u32],
) -> Vec<f32> {
    let mut out = Vec::new();
    for chunk in prompt.chunks(batch) {
        out.extend_from_slice(m.forward(s, chunk, sparrow::Logits::Last).unwrap());
    }
    for &t in steps {
        out.extend_from_slice(m.forward(s, &[t], sparrow::Logits::Last).unwrap());
    }
    out
}

/// RAM a sequence of `m` running `choice` keeps beside its recent rows under a RAM budget at
/// `n_ctx` positions of `types`: the policy's summaries, and what a store in bucket order
/// keeps for it (open segments, slot maps; 0 for other policies) — the policy's share of a
/// budget and the store's.
pub fn ram_beside_rows(
    m: &Model,
    choice: &AttentionChoice,
    types: sparrow::KvTypes,
    n_ctx: usize,
) -> (usize, usize) {
    let c = &m.config;
    let policy = choice.build(c).unwrap();
    let partitions: Vec<_> = (0..c.n_layer).map(|l| policy.partition(l)).collect();
    let rings = vec![None; c.n_layer];
    let dims = (n_ctx, c.kv_dim(), c.head_dim);
    (
        policy.summary_bytes(n_ctx, c.kv_dim()),
        sparrow::kv::arranged::ram_bytes(&partitions, &rings, dims, types),
    )
}

/// `spec`'s synthetic model written to `path` as a GGUF file and loaded as an engine (with
/// the file's tokenizer), for tests of what goes through files and engines.
pub fn synthetic_engine(path: &Path, spec: &SyntheticSpec) -> Engine {
    std::fs::write(path, synthetic_gguf(spec)).unwrap();
    Engine::load(path).unwrap()
}
