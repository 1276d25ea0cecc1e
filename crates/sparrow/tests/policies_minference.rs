//! MInference (vertical-slash prefill): exact within its pattern, the pattern's forced and
//! planted parts selected, dense where it claims to be, and on the real Qwen model near full
//! attention (teacher-forced logits within a measured tolerance).

mod common;

use common::{assert_close_with, forced_logits, mismatch_with, Prefill, ORDER_TOL};
use sparrow::attention::{
    attend, AttentionChoice, AttnShape, DenseAttention, PlanContext, ReadPlan, SparsePolicy,
    StreamingAttention,
};
use sparrow::kv_cache::KvCache;
use sparrow::policy::minference::{attend_pattern, HeadScores, Pattern};
use sparrow::policy::{MInferenceAttention, MInferenceSettings};
use sparrow::{Engine, KvType, Logits, Model, State};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

struct Rng(u64);

impl Rng {
    fn f(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

/// A one-layer cache of `depth` random positions; returns it with the keys and values it
/// holds (f16-rounded for an f16 cache), one `kv_dim` row per position.
fn random_cache(
    ty: KvType,
    depth: usize,
    kv_dim: usize,
    rng: &mut Rng,
) -> (KvCache, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let keys: Vec<Vec<f32>> = (0..depth).map(|_| rng.vec(kv_dim, 2.0)).collect();
    let vals: Vec<Vec<f32>> = (0..depth).map(|_| rng.vec(kv_dim, 1.0)).collect();
    cache_of(ty, keys, vals)
}

fn cache_of(
    ty: KvType,
    keys: Vec<Vec<f32>>,
    vals: Vec<Vec<f32>>,
) -> (KvCache, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let kv_dim = keys[0].len();
    let mut cache = KvCache::new(ty, 1, keys.len(), kv_dim);
    let (mut hk, mut hv) = (keys.clone(), vals.clone());
    for t in 0..keys.len() {
        cache.write(0, t, &keys[t], &vals[t]);
        cache.read_keys(0, t, &mut hk[t]);
        cache.read_values(0, t, &mut hv[t]);
    }
    (cache, hk, hv)
}

fn settings(budget: f64) -> MInferenceSettings {
    MInferenceSettings {
        budget,
        ..Default::default()
    }
}

/// Naive f64 attention of one query row (all heads) over the listed key positions of each
/// KV head: the shared oracle.
fn reference_over(
    shape: AttnShape,
    keys: &[Vec<f32>],
    vals: &[Vec<f32>],
    q: &[f32],
    kv_head_visible: &[Vec<usize>],
) -> Vec<f32> {
    sparrow_attn::kernel::reference::attention_f64(shape, keys, vals, q, kv_head_visible)
}

/// The keys the query at `pos` reads under `pattern`, built independently of the backend:
/// columns up to `pos` and keys `pos − o` of the offsets up to `pos`, as a set.
fn visible_set(pattern: &Pattern, pos: usize) -> Vec<usize> {
    let mut set = BTreeSet::new();
    set.extend(pattern.columns.iter().copied().filter(|&k| k <= pos));
    set.extend(
        pattern
            .offsets
            .iter()
            .filter(|&&o| o <= pos)
            .map(|&o| pos - o),
    );
    set.into_iter().collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

const SHAPES: [(usize, usize, usize); 5] =
    [(14, 2, 64), (4, 4, 32), (6, 1, 24), (8, 2, 18), (12, 1, 16)];

#[test]
fn budget_one_equals_dense_on_random_caches() {
    let mut rng = Rng(7);
    for &(n_head, n_head_kv, head_dim) in &SHAPES {
        let shape = AttnShape {
            n_head,
            n_head_kv,
            head_dim,
        };
        for ty in [KvType::F32, KvType::F16] {
            let depth = 1500;
            let (cache, _, _) = random_cache(ty, depth, n_head_kv * head_dim, &mut rng);
            let mut mi = MInferenceAttention::new(settings(1.0), 1).unwrap();
            for n in [1usize, 77, 300] {
                let q_dim = n_head * head_dim;
                let q = rng.vec(n * q_dim, 1.0);
                let pos0 = depth - n;
                let (mut want, mut got) = (vec![0.0; n * q_dim], vec![1.0; n * q_dim]);
                attend(&mut DenseAttention, shape, &cache, 0, &q, pos0, &mut want);
                attend(&mut mi, shape, &cache, 0, &q, pos0, &mut got);
                let d = max_diff(&want, &got);
                assert!(d < 1e-5, "{shape:?} {ty:?} n {n}: {d}");
            }
        }
    }
}

/// The sparse kernel itself (not the dense shortcut) over a pattern that covers every key
/// — all columns plus overlapping diagonals, each key counted once — equals dense.
#[test]
fn sparse_kernel_over_a_covering_pattern_equals_dense() {
    let mut rng = Rng(8);
    for &(n_head, n_head_kv, head_dim) in &SHAPES {
        let shape = AttnShape {
            n_head,
            n_head_kv,
            head_dim,
        };
        for ty in [KvType::F32, KvType::F16] {
            let depth = 1300;
            let (cache, _, _) = random_cache(ty, depth, n_head_kv * head_dim, &mut rng);
            let n = 150;
            let q_dim = n_head * head_dim;
            let q = rng.vec(n * q_dim, 1.0);
            let pos0 = depth - n;
            // Every column, plus diagonals (a run and scattered ones) that double-cover keys.
            let pattern = Pattern {
                columns: (0..depth).collect(),
                offsets: (0..90).chain([95, 300, 301, 302, 700, 1299]).collect(),
            };
            let patterns = vec![pattern; n_head_kv];
            let (mut want, mut got) = (vec![0.0; n * q_dim], vec![1.0; n * q_dim]);
            attend(&mut DenseAttention, shape, &cache, 0, &q, pos0, &mut want);
            let (sum, count) =
                attend_pattern(shape, &cache.layer(0), &q, pos0, &patterns, &mut got);
            let d = max_diff(&want, &got);
            assert!(d < 1e-5, "{shape:?} {ty:?}: {d}");
            assert!(
                (sum / count - 1.0).abs() < 1e-12,
                "reads counted {sum}/{count}"
            );
            // And with only diagonals covering everything (every offset).
            let diag_only = vec![
                Pattern {
                    columns: vec![],
                    offsets: (0..depth).collect(),
                };
                n_head_kv
            ];
            attend_pattern(shape, &cache.layer(0), &q, pos0, &diag_only, &mut got);
            let d = max_diff(&want, &got);
            assert!(d < 1e-5, "diagonals only {shape:?} {ty:?}: {d}");
        }
    }
}

#[test]
fn sparse_output_matches_an_f64_reference_over_its_own_pattern() {
    let mut rng = Rng(9);
    for &(n_head, n_head_kv, head_dim) in &SHAPES {
        let shape = AttnShape {
            n_head,
            n_head_kv,
            head_dim,
        };
        for ty in [KvType::F32, KvType::F16] {
            let depth = 2300; // estimation spans several 1024-key chunks
            let (cache, hk, hv) = random_cache(ty, depth, n_head_kv * head_dim, &mut rng);
            let n = 130; // blocks of the column part with a partial last one
            let q_dim = n_head * head_dim;
            let q = rng.vec(n * q_dim, 1.5);
            let pos0 = depth - n;
            let mut mi = MInferenceAttention::new(settings(0.2), 1).unwrap();
            let patterns = mi
                .patterns(shape, &cache.layer(0), 0, &q, pos0)
                .expect("a 2300-token context at budget 0.2 is sparse");
            for p in &patterns {
                // Both parts beyond the forced ones are exercised.
                assert!(p.columns.len() > 30 && p.offsets.len() > 100, "{p:?}");
                assert!(p.columns.len() + p.offsets.len() <= 460 + 1);
            }
            let mut got = vec![0.0; n * q_dim];
            attend(&mut mi, shape, &cache, 0, &q, pos0, &mut got);
            let mut frac = 0.0;
            for i in 0..n {
                let pos = pos0 + i;
                let sets: Vec<Vec<usize>> = patterns.iter().map(|p| visible_set(p, pos)).collect();
                frac += sets
                    .iter()
                    .map(|s| s.len() as f64 / (pos + 1) as f64)
                    .sum::<f64>();
                let r = reference_over(shape, &hk, &hv, &q[i * q_dim..][..q_dim], &sets);
                let d = max_diff(&got[i * q_dim..][..q_dim], &r);
                assert!(d < 1e-4, "{shape:?} {ty:?} row {i}: {d}");
            }
            let want = frac / (n * n_head_kv) as f64;
            let measured = mi.last_selectivity().unwrap();
            assert!((measured - want).abs() < 1e-9, "{measured} vs {want}");
            assert!(measured < 0.3, "{measured}");
            // And it differs from full attention.
            let mut full = vec![0.0; n * q_dim];
            attend(&mut DenseAttention, shape, &cache, 0, &q, pos0, &mut full);
            assert!(max_diff(&full, &got) > 1e-3);
        }
    }
}

#[test]
fn estimate_equals_naive_softmax_sums() {
    let mut rng = Rng(10);
    let shape = AttnShape {
        n_head: 6,
        n_head_kv: 2,
        head_dim: 16,
    };
    let depth = 2200;
    let (cache, hk, _) = random_cache(KvType::F16, depth, 32, &mut rng);
    let n = 90;
    let q = rng.vec(n * 96, 2.0);
    let pos0 = depth - n;
    let mi = MInferenceAttention::new(settings(0.3), 1).unwrap();
    let got = mi.estimate(shape, &cache.layer(0), &q, pos0);
    let (sinks, recent) = (30, 100);
    for g in 0..2 {
        let mut vert = vec![0.0f64; depth];
        let mut slash = vec![0.0f64; depth];
        for i in n - 64..n {
            let pos = pos0 + i;
            for h in g * 3..g * 3 + 3 {
                let qh = &q[i * 96 + h * 16..][..16];
                let s: Vec<f64> = (0..=pos)
                    .map(|k| {
                        qh.iter()
                            .zip(&hk[k][g * 16..(g + 1) * 16])
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            / 4.0
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for (k, x) in s.iter().enumerate() {
                    let p = (x - m).exp() / z;
                    if k >= sinks && pos - k >= recent {
                        vert[k] += p;
                        slash[pos - k] += p;
                    }
                }
            }
        }
        let HeadScores {
            vertical,
            slash: sl,
        } = &got[g];
        assert_eq!(vertical.len(), depth);
        for k in 0..depth {
            assert!((vertical[k] as f64 - vert[k]).abs() < 1e-5, "v {k}");
            assert!((sl[k] as f64 - slash[k]).abs() < 1e-5, "s {k}");
        }
        // Something is left to rank: most of the mass is outside the forced keys here.
        assert!(vert.iter().sum::<f64>() > 10.0);
    }
}

#[test]
fn sinks_and_recent_diagonals_are_always_selected() {
    let mi = MInferenceAttention::new(settings(0.25), 1).unwrap();
    let mut rng = Rng(11);
    for ctx in [700usize, 2000, 9000] {
        // Adversarial scores: nothing on the forced keys, large mass everywhere else.
        let scores = HeadScores {
            vertical: (0..ctx)
                .map(|k| if k < 30 { 0.0 } else { 5.0 + rng.f() })
                .collect(),
            slash: (0..ctx)
                .map(|o| if o < 100 { 0.0 } else { 5.0 + rng.f() })
                .collect(),
        };
        let p = mi.select(&scores, ctx);
        assert!((0..30).all(|k| p.columns.contains(&k)), "{ctx}");
        assert!((0..100).all(|o| p.offsets.contains(&o)), "{ctx}");
        let budget = (0.25 * ctx as f64).ceil() as usize;
        assert_eq!(p.columns.len() + p.offsets.len(), budget, "{ctx}");
        assert!(p.columns.windows(2).all(|w| w[0] < w[1]));
        assert!(p.offsets.windows(2).all(|w| w[0] < w[1]));
    }
    // And through estimation on a random cache, for every KV head.
    let shape = AttnShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
    };
    let (cache, _, _) = random_cache(KvType::F32, 3000, 64, &mut rng);
    let q = rng.vec(200 * 128, 1.0);
    let patterns = mi.patterns(shape, &cache.layer(0), 0, &q, 2800).unwrap();
    for p in &patterns {
        assert!(p.columns.starts_with(&(0..30).collect::<Vec<_>>()));
        assert!(p.offsets.starts_with(&(0..100).collect::<Vec<_>>()));
        assert!(p.columns.len() + p.offsets.len() <= 750);
    }
}

/// A key that every one of the last queries attends to strongly is a selected column; a
/// diagonal the last queries attend along is a selected offset. Both far from the forced
/// keys, with a budget leaving room for few others.
#[test]
fn planted_vertical_column_and_slash_diagonal_are_selected() {
    let shape = AttnShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
    };
    let (depth, n, hd) = (4000usize, 256usize, 32usize);
    let pos0 = depth - n;
    let mut rng = Rng(12);
    let mut keys: Vec<Vec<f32>> = (0..depth).map(|_| rng.vec(64, 0.5)).collect();
    let vals: Vec<Vec<f32>> = (0..depth).map(|_| rng.vec(64, 1.0)).collect();
    let mut q = rng.vec(n * 128, 0.5);
    // KV head 0: column 1234, along direction `u`, which every query of heads 0–1 carries.
    let u = rng.vec(hd, 1.0);
    let col = 1234;
    keys[col][..hd]
        .iter_mut()
        .zip(&u)
        .for_each(|(k, x)| *k = 4.0 * x);
    // KV head 1: diagonal 777: the key at `pos − 777` carries the query's own direction.
    let diag = 777;
    for i in 0..n {
        for h in 0..2 {
            let qh = &mut q[i * 128 + h * hd..][..hd];
            qh.iter_mut().zip(&u).for_each(|(a, x)| *a += 2.0 * x);
        }
        let w = rng.vec(hd, 1.0);
        for h in 2..4 {
            q[i * 128 + h * hd..][..hd].copy_from_slice(&w);
        }
        let k = pos0 + i - diag;
        keys[k][hd..]
            .iter_mut()
            .zip(&w)
            .for_each(|(a, x)| *a = 4.0 * x);
    }
    let (cache, _, _) = cache_of(KvType::F16, keys, vals);
    let mi = MInferenceAttention::new(settings(0.05), 1).unwrap();
    let patterns = mi.patterns(shape, &cache.layer(0), 0, &q, pos0).unwrap();
    assert!(
        patterns[0].columns.contains(&col),
        "{:?}",
        patterns[0].columns
    );
    assert!(
        patterns[1].offsets.contains(&diag),
        "{:?}",
        patterns[1].offsets
    );
    // Neither head picked the other's plant: selection follows each head's own scores.
    assert!(!patterns[1].columns.contains(&col));
    assert!(!patterns[0].offsets.contains(&diag));
}

#[test]
fn short_contexts_dense_layers_and_single_rows_run_dense() {
    let shape = AttnShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
    };
    let mut rng = Rng(13);
    let (cache, _, _) = random_cache(KvType::F16, 2000, 64, &mut rng);
    let mut mi = MInferenceAttention::new(
        MInferenceSettings {
            dense_layers: vec![0],
            ..settings(0.3)
        },
        1,
    )
    .unwrap();
    let mut sparse = MInferenceAttention::new(settings(0.3), 1).unwrap();
    let check = |be: &mut MInferenceAttention, n: usize, pos0: usize, dense: bool| {
        let q = Rng(n as u64).vec(n * 128, 1.0);
        assert_eq!(
            be.patterns(shape, &cache.layer(0), 0, &q, pos0).is_none(),
            dense
        );
        let (mut want, mut got) = (vec![0.0; n * 128], vec![0.0; n * 128]);
        attend(&mut DenseAttention, shape, &cache, 0, &q, pos0, &mut want);
        attend(be, shape, &cache, 0, &q, pos0, &mut got);
        assert_eq!(want == got, dense, "n {n} pos0 {pos0}");
    };
    check(&mut sparse, 300, 0, true); // context 300 ≤ 30 + 100 + 256
    check(&mut sparse, 1, 1900, true); // decode
    check(&mut mi, 300, 1600, true); // dense layer
    check(&mut sparse, 300, 1600, false);
}

#[test]
fn bad_settings_name_the_setting_and_its_range() {
    for budget in [0.0, -0.5, 1.5, f64::NAN] {
        let e = MInferenceAttention::new(settings(budget), 2).err().unwrap();
        assert!(e.contains("budget") && e.contains("0 < budget <= 1"), "{e}");
    }
    let e = MInferenceAttention::new(
        MInferenceSettings {
            last_q: 0,
            ..Default::default()
        },
        2,
    )
    .err()
    .unwrap();
    assert!(e.contains("last_q") && e.contains("at least 1"), "{e}");
    let mut choice = AttentionChoice::named("minference");
    choice.settings_mut::<MInferenceSettings>().budget = 2.0;
    assert!(choice.build(&shapes()).err().unwrap().contains("budget 2"));
}

#[test]
fn fraction_read_estimates_prefill_selectivity() {
    let mi = MInferenceAttention::new(settings(0.3), 24).unwrap();
    assert_eq!(mi.fraction_read(300), 1.0);
    let f = mi.fraction_read(32768);
    assert!(f > 0.3 && f < 0.4, "{f}");
    let half_dense = MInferenceAttention::new(
        MInferenceSettings {
            dense_layers: (0..12).collect(),
            ..settings(0.3)
        },
        24,
    )
    .unwrap();
    let g = half_dense.fraction_read(32768);
    assert!((g - (1.0 + f) / 2.0).abs() < 1e-9, "{g}");
    assert!(mi.last_selectivity().is_none());
}

// ---- the real Qwen model ----

/// A ~1500-token chat prompt: a list of facts and a question about one of them.
fn qwen_prompt(engine: &Engine) -> Vec<u32> {
    let mut doc = String::new();
    for i in 0..66 {
        doc.push_str(&format!(
            "Record {i}: the locker code of employee {} is {}.\n",
            (i * 37) % 1000,
            (i * 7919 + 1234) % 10000
        ));
    }
    let msg = format!(
        "{doc}\nUsing the records above, what is the locker code of employee {}? Answer with the number only.",
        (42 * 37) % 1000
    );
    let tmpl = engine.chat_template.as_ref().unwrap();
    let text = tmpl
        .render(&[sparrow::ChatMessage::new("user", &msg)], true)
        .unwrap();
    engine.tokenizer.encode(&text, true, true)
}

/// Prefill in 512-token batches, then 8 greedy tokens; the tokens and the logits that chose
/// them.
fn greedy(model: &Model, state: &mut State, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut logits = Vec::new();
    for chunk in prompt.chunks(512) {
        logits = model.forward(state, chunk, Logits::Last).unwrap().to_vec();
    }
    let (mut out, mut all) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        let t = common::argmax(&logits) as u32;
        out.push(t);
        all.push(logits);
        logits = model.forward(state, &[t], Logits::Last).unwrap().to_vec();
    }
    (out, all)
}

struct Qwen {
    engine: Engine,
    prompt: Vec<u32>,
    full: Vec<u32>,
    full_logits: Vec<Vec<f32>>,
}

fn qwen() -> &'static Qwen {
    static Q: OnceLock<Qwen> = OnceLock::new();
    Q.get_or_init(|| {
        let engine = Engine::load(common::qwen_path()).unwrap();
        let prompt = qwen_prompt(&engine);
        assert!((1400..1700).contains(&prompt.len()), "{}", prompt.len());
        let mut s = engine.model.new_state(2048, KvType::F16).unwrap();
        let (full, full_logits) = greedy(&engine.model, &mut s, &prompt);
        Qwen {
            engine,
            prompt,
            full,
            full_logits,
        }
    })
}

fn state_with(q: &Qwen, choice: &AttentionChoice) -> State {
    let m = &q.engine.model;
    let mut s = m.new_state(2048, KvType::F16).unwrap();
    s.set_attention(choice.build(&m.config).unwrap());
    s
}

/// Lends a shared policy to a state, so its measurements stay readable.
struct Shared(Arc<Mutex<MInferenceAttention>>);

impl SparsePolicy for Shared {
    fn name(&self) -> &str {
        "minference"
    }
    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        // MInference's plans own everything (no side tables), so they outlive the lock.
        let entries = self.0.lock().unwrap().plan(ctx).entries;
        ReadPlan {
            entries,
            side: Vec::new(),
        }
    }
    fn attend_own(&mut self, ctx: &PlanContext<'_>, out: &mut [f32]) -> bool {
        self.0.lock().unwrap().attend_own(ctx, out)
    }
}

/// Tolerance ([`common::drift`]) of MInference's sparse prefill (default budget 0.3) against
/// full attention, teacher-forced along full's answer (the record's 4 digits and the end of
/// the turn): the pattern's approximation, measured at most 2.34 (SPARROW_SIMD=avx2 and
/// avx512 alike); twice that, 5.0. Alone it would not tell a prefill that lost the record
/// (a streaming window of 64 keys: 5.4), so the choices are held tighter, below.
const MINFERENCE_TOL: f32 = 5.0;

/// Sparse prefill keeps full attention's answer: teacher-forced along full attention's greedy
/// tokens, logits within [`MINFERENCE_TOL`], and the top token full's at every step except
/// where full's own choice is a near-tie that a change of summation order could turn (both
/// gaps within `2 * ORDER_TOL`, see `tests/common.rs`). Comparing free-running greedy tokens
/// instead would hang on the SIMD level: full's lead for its first token is only 0.82.
/// Measured: the same top token at all 5 steps (MInference's lead for it 1.2 to 7.2). A
/// streaming prefill of 64 keys, which cannot see the record, answers 4 for 3 and 3 for 8,
/// where full led by 1.0 and 4.7 (> 2 * ORDER_TOL = 3.2): caught.
#[test]
fn qwen_minference_prefill_keeps_full_attentions_answer() {
    let q = qwen();
    let m = &q.engine.model;
    let forced = |choice: &AttentionChoice| {
        let mut s = state_with(q, choice);
        forced_logits(m, &mut s, &q.prompt, &q.full, Prefill::Chunks(512))
    };
    let tie = 2.0 * ORDER_TOL;
    // The answer: up to and including the end of the turn (what follows is noise).
    let tok = &q.engine.tokenizer;
    let n = q
        .full
        .iter()
        .position(|&t| tok.is_eog(t))
        .map_or(q.full.len(), |i| i + 1);
    let want = &q.full_logits[..n];
    let mi = forced(&AttentionChoice::named("minference"));
    assert_close_with("minference vs full", want, &mi[..n], MINFERENCE_TOL, tie);
    let leads: Vec<f32> = mi
        .iter()
        .zip(&q.full)
        .map(|(l, &t)| {
            let t = t as usize;
            l[t] - l
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != t)
                .map(|(_, &x)| x)
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .collect();
    eprintln!("minference's lead for full's token per step: {leads:?}");
    // The check can fail: a prefill that cannot see the records (the last 64 keys only).
    let streaming = AttentionChoice {
        prefill: Some("streaming".into()),
        ..AttentionChoice::named("full")
    }
    .with(StreamingAttention {
        window: 64,
        sinks: 4,
    });
    let st = forced(&streaming);
    let mis = mismatch_with(want, &st[..n], MINFERENCE_TOL, tie);
    eprintln!("streaming prefill: {mis:?}");
    assert!(mis.is_some(), "a 64-key prefill window went unnoticed");

    // The same backend, shared so its selectivity can be read: sparse prefill did run.
    let be = Arc::new(Mutex::new(
        MInferenceAttention::new(Default::default(), m.config.n_layer).unwrap(),
    ));
    let mut s = m.new_state(2048, KvType::F16).unwrap();
    s.set_attention(Box::new(Shared(be.clone())));
    for chunk in q.prompt.chunks(512) {
        m.forward(&mut s, chunk, Logits::None).unwrap();
    }
    let sel = be.lock().unwrap().last_selectivity().unwrap();
    eprintln!("last batch selectivity {sel:.3}");
    assert!(sel < 0.6, "{sel}");
}

/// Budget 1 takes the dense path: the same `DenseAttention` calls as `full`, on the same rows,
/// in the same split (512-token batches, then single tokens), so the logits — and with them
/// the greedy tokens — are equal to the bit at any SIMD level.
#[test]
fn qwen_minference_with_budget_one_equals_full_for_8_tokens() {
    let q = qwen();
    let mut choice = AttentionChoice::named("minference");
    choice.settings_mut::<MInferenceSettings>().budget = 1.0;
    let (got, logits) = greedy(&q.engine.model, &mut state_with(q, &choice), &q.prompt);
    assert_eq!(got, q.full);
    assert!(logits == q.full_logits, "logits differ from full's");
}

// ---- a hand-run timing ----

/// One layer's prefill batch of 512 rows at context 16K (Qwen2.5-0.5B's attention shape,
/// f16 cache, random data): full vs minference, best of 3.
/// `cargo test --release -p sparrow --test policies_minference -- --ignored --nocapture`
#[test]
#[ignore]
fn time_minference_vs_full_16k() {
    let shape = AttnShape {
        n_head: 14,
        n_head_kv: 2,
        head_dim: 64,
    };
    let (depth, n) = (16384usize, 512usize);
    let pos0 = depth - n;
    let mut rng = Rng(14);
    let mut cache = KvCache::new(KvType::F16, 1, depth, 128);
    for t in 0..depth {
        cache.write(0, t, &rng.vec(128, 2.0), &rng.vec(128, 1.0));
    }
    let q = rng.vec(n * 896, 1.0);
    let mut out = vec![0.0; n * 896];
    let best = |f: &mut dyn FnMut()| {
        (0..1)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let mut mi = MInferenceAttention::new(Default::default(), 1).unwrap();
    let patterns = mi.patterns(shape, &cache.layer(0), 0, &q, pos0).unwrap();
    // Interleaved, best of 5 each: the machine may be shared.
    let (mut full, mut sparse, mut est, mut kernel) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..5 {
        full = full.min(best(&mut || {
            attend(&mut DenseAttention, shape, &cache, 0, &q, pos0, &mut out)
        }));
        sparse = sparse.min(best(&mut || {
            attend(&mut mi, shape, &cache, 0, &q, pos0, &mut out)
        }));
        est = est.min(best(&mut || {
            mi.patterns(shape, &cache.layer(0), 0, &q, pos0).unwrap();
        }));
        kernel = kernel.min(best(&mut || {
            attend_pattern(shape, &cache.layer(0), &q, pos0, &patterns, &mut out);
        }));
    }
    let cols: usize = patterns.iter().map(|p| p.columns.len()).sum();
    let offs: usize = patterns.iter().map(|p| p.offsets.len()).sum();
    println!(
        "threads {}: full {:.1} ms, minference {:.1} ms (estimate + select {:.1} ms, \
         attention over the pattern {:.1} ms; {cols} columns, {offs} diagonals over {} KV heads), \
         selectivity {:.3}, full / minference = {:.2}x",
        rayon::current_num_threads(),
        full * 1e3,
        sparse * 1e3,
        est * 1e3,
        kernel * 1e3,
        shape.n_head_kv,
        mi.last_selectivity().unwrap(),
        full / sparse
    );
}

/// A small model's shapes, for building policies whose settings are refused before use.
fn shapes() -> sparrow::ModelConfig {
    sparrow::synthetic::synthetic_config(&sparrow::synthetic::SyntheticSpec::default()).unwrap()
}
