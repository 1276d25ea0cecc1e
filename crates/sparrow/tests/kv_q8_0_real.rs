//! The real Qwen2.5 model with Q8_0 KV caches, against the f16 cache and against an emulation.
//!
//! Q8_0 is lossy, and on Qwen2.5 lossy for keys in a way that matters: its large k-projection
//! biases give some key channels magnitudes up to ~200, a thousand times the median of their
//! 32-value block, so the block's scale (max/127 ≈ 1.7) rounds that block's other channels
//! to a step comparable to their size. An independent ggml-style quantizer (f32 inverse
//! scale, as `quantize_row_q8_0_ref`) reproduces the same logit shifts (≈ 15 on the
//! five-token prompt below, whose first greedy token drops to rank ~150), so that is the
//! format's doing, not this code's. Values quantize harmlessly.
//!
//! Every comparison is teacher-forced along the f16 cache's 16 greedy tokens, step by step
//! (see `tests/common.rs`), on prompts of 5, 13 and ~420 tokens:
//!
//! 1. K and V in q8_0 against an f32 cache whose attention reads K/V rounded through
//!    `BlockQ8_0` (a test backend), same kernels and same batch split: every logit within
//!    [`EMULATION_TOL`]. The cache layout, the per-head dequantization and the kernels add
//!    nothing to the format's rounding (a misread block, scale, stride or head offset would
//!    move logits by whole units).
//! 2. V in q8_0 (keys f16), prompt prefilled in chunks of 5 (per-row kernels) against the f16
//!    cache with the prompt in one batch (the panel GEMM with AVX2 or AVX-512 from 16 or 6
//!    tokens): within [`common::ORDER_TOL`] — Q8_0 values cost no more than a change of
//!    summation order does, and the split makes this host's run differ from the reference
//!    as another host's kernels would.
//! 3. K and V in q8_0 on the code and long prompts: within [`KV_Q8_TOL`].
//! 4. The check can fail: value rows read one position late exceed [`common::ORDER_TOL`]
//!    by far.

mod common;

use common::{assert_close, forced_logits, mismatch, Prefill, ORDER_TOL};
use sparrow::attention::{PlanContext, ReadPlan, SideTable, Source, SparsePolicy};
use sparrow::kv::{BlockQ8_0, QK8_0};
use sparrow::{Engine, KvType, KvTypes, Model};
use sparrow_attn::kernel::{read_f32, F32Rows};

const STEPS: usize = 16;

/// Largest difference of any logit between the q8_0 cache and its emulation. Both runs
/// make the same forward calls through the same kernels, on the same rounded K/V values
/// (the cache stores `BlockQ8_0::quantize`'s blocks and dequantizes them as
/// `BlockQ8_0::dequantize` does; the emulation rounds f32 rows through the same two
/// functions), so they agree to the bit at every level (measured: 0 with SPARROW_SIMD=scalar
/// and avx2, on all three prompts). 1e-3 leaves room for a dequantization kernel whose
/// multiply is fused differently, and is a thousandth of what a misread block does.
const EMULATION_TOL: f32 = 1e-3;

/// Tolerance ([`common::drift`]) of keys and values in Q8_0 against the f16 cache on the
/// code and long prompts. Measured, teacher-forced over 24 steps, SPARROW_SIMD=scalar and
/// avx2, the prompt in one batch and token by token: at most 1.13 on the code prompt, 1.74
/// on the long one (and 1.21 on a 34-token chat prompt); twice the largest, 3.5. Not a
/// near-tie bound but the format's measured cost: keys in Q8_0 round Qwen2.5's large-bias
/// channels coarsely (the module docs); on the five-token prompt the same rounding moves
/// logits by 10.8, which is why that prompt is only reported. Value rows read one position
/// late move logits by 7 to 19 per step on the code prompt (part 4), up to 29 on others.
const KV_Q8_TOL: f32 = 3.5;

/// Dense attention over an f32 cache holding the cache's keys and values, rounded through
/// Q8_0 blocks (`round`), values taken `value_lag` positions late (a deliberate error).
#[derive(Default)]
struct Emulated {
    round: bool,
    value_lag: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn round_q8(x: &mut [f32]) {
    for b in x.chunks_exact_mut(QK8_0) {
        BlockQ8_0::quantize(b).dequantize(b);
    }
}

impl SparsePolicy for Emulated {
    fn name(&self) -> &str {
        "emulated-q8_0"
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let n = ctx.pos0 + ctx.n_tokens();
        let w = ctx.store.kv_dim();
        self.k.resize(n * w, 0.0);
        self.v.resize(n * w, 0.0);
        read_f32(ctx.store, false, ctx.shape.head_dim, 0, &mut self.k);
        // Value row `t` holds position `t - value_lag`'s values (a deliberate error).
        let lag = self.value_lag.min(n);
        read_f32(
            ctx.store,
            true,
            ctx.shape.head_dim,
            0,
            &mut self.v[lag * w..],
        );
        for t in 0..lag {
            self.v.copy_within(lag * w..(lag + 1) * w, t * w);
        }
        if self.round {
            round_q8(&mut self.k);
            round_q8(&mut self.v);
        }
        let mut plan = ReadPlan::causal(ctx.shape, ctx.pos0, ctx.n_tokens());
        plan.entries[0].source = Source::Side(0);
        plan.side.push(SideTable {
            rows: F32Rows::all_heads(&self.k, &self.v, w).into(),
            positions: None,
        });
        plan
    }
}

fn state(model: &Model, types: KvTypes, backend: Option<Emulated>) -> sparrow::State {
    let mut st = model.new_state(1024, types).unwrap();
    if let Some(b) = backend {
        st.set_attention(Box::new(b));
    }
    st
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn q8_0_cache_on_qwen() {
    let engine = Engine::load(common::qwen_path()).unwrap();
    let model = &engine.model;
    let tok = &engine.tokenizer;
    let long_text = "The following notes describe how the warehouse inventory system works. \
        Each item has a stock keeping unit, a location code made of an aisle letter and a shelf \
        number, and a count that is updated whenever a pallet arrives or leaves. Counts are \
        reconciled every night against the scanner logs; any item whose count differs by more \
        than two units is flagged for a manual check the next morning. Items that have not \
        moved for ninety days are listed in a separate report so that the purchasing team can \
        decide whether to keep ordering them. "
        .repeat(4)
        + "Question: how often are counts reconciled? Answer:";
    let code = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
    let prompts = [
        (
            "capital",
            tok.encode("The capital of France is", true, true),
        ),
        ("code", tok.encode(code, true, true)),
        ("long", tok.encode(&long_text, true, true)),
    ];
    assert!(prompts[2].1.len() > 300, "{}", prompts[2].1.len());
    let q8 = KvTypes::from(KvType::Q8_0);
    let f16 = KvTypes::from(KvType::F16);
    let v_only = KvTypes::new(KvType::F16, KvType::Q8_0);
    for (name, prompt) in &prompts {
        let (want, f16_logits) = common::greedy(model, &mut state(model, f16, None), prompt, STEPS);
        let forced = |types: KvTypes, backend: Option<Emulated>, prefill: Prefill| {
            forced_logits(
                model,
                &mut state(model, types, backend),
                prompt,
                &want,
                prefill,
            )
        };

        // 1. Q8_0 K+V equals the emulation.
        let got = forced(q8, None, Prefill::Batch);
        let emu = Emulated {
            round: true,
            ..Default::default()
        };
        let emulated = forced(KvType::F32.into(), Some(emu), Prefill::Batch);
        let d = max_diff(&got, &emulated);
        eprintln!("{name}: q8_0 vs emulation: max logit diff {d}");
        assert!(
            d <= EMULATION_TOL,
            "{name}: q8_0 cache vs emulated rounding: {d}"
        );

        // 2. Q8_0 values only, another batch split: within a change of summation order.
        let values = forced(v_only, None, Prefill::Chunks(5));
        assert_close(
            &format!("{name}: f16/q8_0 (chunks of 5) vs f16 (one batch)"),
            &f16_logits,
            &values,
            ORDER_TOL,
        );

        // 3. Q8_0 K+V tracks f16 within the format's measured cost, where the keys allow it.
        if *name == "capital" {
            let (drifts, flips) = common::compare(&f16_logits, &got);
            eprintln!(
                "{name}: q8_0/q8_0 vs f16 (reported only): drift {drifts:?}, flips {flips:?}"
            );
        } else {
            assert_close(
                &format!("{name}: q8_0/q8_0 vs f16"),
                &f16_logits,
                &got,
                KV_Q8_TOL,
            );
        }

        // 4. A deliberate error is caught: value rows one position late.
        if *name == "code" {
            let lagged = Emulated {
                value_lag: 1,
                ..Default::default()
            };
            let bad = forced(f16, Some(lagged), Prefill::Batch);
            let m = mismatch(&f16_logits, &bad, ORDER_TOL);
            eprintln!("{name}: values one position late: {m:?}");
            assert!(m.is_some(), "values read one position late went unnoticed");
        }
    }
}
