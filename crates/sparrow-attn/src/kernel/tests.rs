//! The primitive against f64 references: every level, f32 / f16 / Q8_0 rows, head sizes
//! with tails, MHA and GQA groups, batches of several blocks, forced key splits, per-token
//! masks, a source that cuts its runs short, and plans of many short ranges gathered into
//! shared tiles; a plan of one range stays the plain tile loop bit for bit.

#![allow(clippy::single_range_in_vec_init)] // lists of key ranges that may hold one

use super::*;
use half::f16;
use std::ops::Range;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ty {
    F32,
    F16,
    Q8,
}

/// Rows stored as `Ty`, with what they hold read back in f32 (the reference's input).
struct Store {
    kv_dim: usize,
    k: Stored,
    v: Stored,
    /// Largest run handed out (to exercise `run_len`).
    run: usize,
}

enum Stored {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8(Vec<BlockQ8_0>),
}

impl Stored {
    fn new(ty: Ty, rows: &[Vec<f32>]) -> Stored {
        let flat: Vec<f32> = rows.concat();
        match ty {
            Ty::F32 => Stored::F32(flat),
            Ty::F16 => Stored::F16(flat.iter().map(|&x| f16::from_f32(x)).collect()),
            Ty::Q8 => Stored::Q8(flat.chunks_exact(QK8_0).map(BlockQ8_0::quantize).collect()),
        }
    }
    fn held(&self, kv_dim: usize) -> Vec<Vec<f32>> {
        let flat: Vec<f32> = match self {
            Stored::F32(v) => v.clone(),
            Stored::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            Stored::Q8(v) => v
                .iter()
                .flat_map(|b| {
                    let mut o = [0.0; QK8_0];
                    b.dequantize(&mut o);
                    o
                })
                .collect(),
        };
        flat.chunks_exact(kv_dim).map(<[f32]>::to_vec).collect()
    }
    fn rows(&self, kv_dim: usize, start: usize, n: usize) -> KvRows<'_> {
        let r = start * kv_dim..(start + n) * kv_dim;
        match self {
            Stored::F32(v) => KvRows::F32(&v[r]),
            Stored::F16(v) => KvRows::F16(&v[r]),
            Stored::Q8(v) => KvRows::Q8_0(&v[r.start / QK8_0..r.end / QK8_0]),
        }
    }
}

impl KvSource for Store {
    fn kv_dim(&self) -> usize {
        self.kv_dim
    }
    fn key_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        self.k.rows(self.kv_dim, start, n)
    }
    fn value_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        self.v.rows(self.kv_dim, start, n)
    }
    fn run_len(&self, start: usize, max: usize) -> usize {
        // Runs end on multiples of `run`, as a paged store's would.
        max.min(self.run - start % self.run)
    }
}

impl Store {
    /// `keys` stored as `tk`, `vals` as `tv`, handed out in runs of at most `run` rows.
    fn new(tk: Ty, keys: &[Vec<f32>], tv: Ty, vals: &[Vec<f32>], run: usize) -> Store {
        Store {
            kv_dim: keys[0].len(),
            k: Stored::new(tk, keys),
            v: Stored::new(tv, vals),
            run,
        }
    }
}

use super::reference::uniform as rng;

/// A Qwen2.5-0.5B-like layer: 14 query heads over 2 KV heads of 64.
const QWEN: AttnShape = AttnShape {
    n_head: 14,
    n_head_kv: 2,
    head_dim: 64,
};

/// The shape `(n_head, n_head_kv, head_dim)`.
fn shape((n_head, n_head_kv, head_dim): (usize, usize, usize)) -> AttnShape {
    AttnShape {
        n_head,
        n_head_kv,
        head_dim,
    }
}

/// `depth` rows of keys (uniform in [-2, 2), so scores spread) and of values ([-1, 1)).
fn random_kv(
    rnd: &mut impl FnMut() -> f32,
    depth: usize,
    kv_dim: usize,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let keys = (0..depth)
        .map(|_| (0..kv_dim).map(|_| rnd() * 2.0).collect())
        .collect();
    let vals = (0..depth)
        .map(|_| (0..kv_dim).map(|_| rnd()).collect())
        .collect();
    (keys, vals)
}

/// Every level at 1, 2 and 16 threads gives `want` (the scalar single-thread run) within
/// the twins' rounding.
fn assert_levels_match(
    shape: AttnShape,
    store: &Store,
    q: &[f32],
    visible: &[Vec<Range<usize>>],
    want: &[f32],
    what: &str,
) {
    for level in Level::supported() {
        for threads in [1, 2, 16] {
            let mut got = vec![0.0; want.len()];
            attend_batch(level, threads, shape, store, q, visible, &mut got);
            for (a, b) in got.iter().zip(want) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{level:?} {threads} {what}: {a} vs {b}"
                );
            }
        }
    }
}

/// The f64 oracle over the same positions for every KV head.
fn reference(
    shape: AttnShape,
    keys: &[Vec<f32>],
    vals: &[Vec<f32>],
    q: &[f32],
    visible: &[usize],
) -> Vec<f32> {
    super::reference::attention_f64(
        shape,
        keys,
        vals,
        q,
        &vec![visible.to_vec(); shape.n_head_kv],
    )
}

/// Sinks + a sliding window: a per-token mask with a gap that moves within a batch.
fn streaming(sinks: usize, window: usize, pos: usize) -> Vec<Range<usize>> {
    let n = pos + 1;
    let recent = n.saturating_sub(window);
    if recent <= sinks {
        vec![0..n]
    } else {
        vec![0..sinks, recent..n]
    }
}

/// Every level and split equals the scalar single-thread run, and that equals the f64
/// reference over what the store holds; Q8_0 also stays within its quantization error of
/// the reference over the original rows (loose, but a misread block, scale or head offset
/// exceeds it by far). Groups of 4–7 query heads here, the rest in the next test: two tests
/// that run side by side (under qemu, scripts/test-aarch64.sh, the whole took a minute and a
/// half).
#[test]
fn batches_match_f64_reference_at_every_level_grouped() {
    batches_match_f64_reference(99, &[(14, 2, 64), (8, 2, 13), (6, 1, 72)]);
}

/// As above: multi-head (one query head a KV head) and groups of two.
#[test]
fn batches_match_f64_reference_at_every_level_few_heads_a_group() {
    batches_match_f64_reference(98, &[(4, 4, 20), (8, 4, 32)]);
}

/// The body of the two tests above for `shapes` (query heads, KV heads, head size).
fn batches_match_f64_reference(seed: u64, shapes: &[(usize, usize, usize)]) {
    let mut rnd = rng(seed);
    for &s in shapes {
        let shape = shape(s);
        let (kv_dim, q_dim, head_dim) = (shape.kv_dim(), shape.q_dim(), shape.head_dim);
        let depth = 700;
        let (keys, vals) = random_kv(&mut rnd, depth, kv_dim);
        let mut types = vec![(Ty::F32, Ty::F32), (Ty::F16, Ty::F16)];
        if head_dim.is_multiple_of(QK8_0) {
            types.extend([(Ty::Q8, Ty::Q8), (Ty::Q8, Ty::F16), (Ty::F32, Ty::Q8)]);
        }
        for (tk, tv) in types {
            for run in [usize::MAX, 48] {
                let store = Store::new(tk, &keys, tv, &vals, run);
                let (hk, hv) = (store.k.held(kv_dim), store.v.held(kv_dim));
                for &n in &[1usize, 3, 19] {
                    let pos0 = depth - n;
                    let q: Vec<f32> = (0..n * q_dim).map(|_| rnd()).collect();
                    let masks: [&dyn Fn(usize) -> Vec<Range<usize>>; 2] =
                        [&|p| vec![0..p + 1], &|p| streaming(5, 150, p)];
                    for ranges in masks {
                        let visible: Vec<Vec<Range<usize>>> =
                            (0..n).map(|i| ranges(pos0 + i)).collect();
                        let mut want = vec![0.0; n * q_dim];
                        attend_batch(Level::Scalar, 1, shape, &store, &q, &visible, &mut want);
                        let mut worst = 0.0f32;
                        for i in 0..n {
                            let keys_i: Vec<usize> = visible[i].iter().cloned().flatten().collect();
                            let qi = &q[i * q_dim..][..q_dim];
                            let held = reference(shape, &hk, &hv, qi, &keys_i);
                            let exact = reference(shape, &keys, &vals, qi, &keys_i);
                            let w = &want[i * q_dim..][..q_dim];
                            for ((a, b), c) in w.iter().zip(&held).zip(&exact) {
                                assert!((a - b).abs() < 2e-5, "{shape:?} {tk:?}: {a} vs {b}");
                                worst = worst.max((a - c).abs());
                            }
                        }
                        let bound = if (tk, tv) == (Ty::F32, Ty::F32) {
                            2e-5
                        } else {
                            2e-2
                        };
                        assert!(worst < bound, "{shape:?} {tk:?}/{tv:?}: {worst}");
                        let what = format!("{tk:?} {shape:?} n {n}");
                        assert_levels_match(shape, &store, &q, &visible, &want, &what);
                    }
                }
            }
        }
    }
}

/// A token that sees no key gets zeros, not NaN.
#[test]
fn a_row_with_no_keys_is_zero() {
    let shape = AttnShape {
        n_head: 2,
        n_head_kv: 1,
        head_dim: 8,
    };
    let keys = vec![1.0f32; 8 * 10];
    let vals = vec![2.0f32; 8 * 10];
    let src = F32Rows::all_heads(&keys, &vals, 8);
    let q = vec![0.5f32; 2 * 16];
    let visible = vec![vec![], vec![3..5]];
    let mut out = vec![f32::NAN; 2 * 16];
    attend_batch(Level::active(), 2, shape, &src, &q, &visible, &mut out);
    assert!(out[..16].iter().all(|&x| x == 0.0));
    assert!(out[16..].iter().all(|&x| (x - 2.0).abs() < 1e-6));
}

#[test]
fn key_splits_cover_each_key_once() {
    let keys = vec![0..5, 100..300, 301..1000];
    for pieces in 1..9 {
        let split = split_keys(&keys, pieces);
        assert!(split.len() <= pieces.max(1));
        let flat: Vec<usize> = split.into_iter().flatten().flatten().collect();
        let want: Vec<usize> = keys.iter().cloned().flatten().collect();
        assert_eq!(flat, want);
    }
    assert_eq!(
        union(vec![5..9, 0..3, 2..4, 9..9, 10..12]),
        vec![0..4, 5..9, 10..12]
    );
}

/// Positions as ascending disjoint ranges (adjacent positions joined).
fn runs(positions: impl IntoIterator<Item = usize>) -> Vec<Range<usize>> {
    union(positions.into_iter().map(|p| p..p + 1).collect())
}

/// Sparse plans of many short ranges (single positions, 2–5 key runs, mixed with long
/// ranges), gathered into shared tiles: every level, every split and row type equals the
/// scalar single-thread run, and that equals the f64 reference, for decode and for blocks
/// of tokens that each see their own subset (causal, with per-token holes and an empty
/// range), over a source whose runs are whole, 48 or 3 rows long.
#[test]
fn scattered_short_ranges_match_f64_reference_at_every_level() {
    let mut rnd = rng(7);
    let mut below = |n: usize| ((rnd() + 1.0) * 0.5 * n as f32) as usize % n;
    let depth = 700;
    // Plans over positions `0..depth`.
    let singles: Vec<usize> = {
        let mut p: Vec<usize> = (0..160).map(|_| below(depth)).collect();
        p.sort_unstable();
        p.dedup();
        p
    };
    let short_runs: Vec<usize> = {
        let mut p = Vec::new();
        let mut at = below(8);
        while at < depth {
            let len = 2 + below(4);
            p.extend(at..(at + len).min(depth));
            at += len + 1 + below(12);
        }
        p
    };
    let mixed: Vec<usize> = (0..4)
        .chain(singles.iter().copied().filter(|&p| (10..200).contains(&p)))
        .chain(200..330)
        .chain(
            short_runs
                .iter()
                .copied()
                .filter(|&p| (340..590).contains(&p)),
        )
        .chain(600..depth)
        .collect();
    let plans = [singles, short_runs, mixed];

    let shapes = [(14, 2, 64), (4, 4, 20), (8, 2, 13), (6, 1, 32)].map(shape);
    for shape in shapes {
        let (kv_dim, q_dim, head_dim) = (shape.kv_dim(), shape.q_dim(), shape.head_dim);
        let (keys, vals) = random_kv(&mut rnd, depth, kv_dim);
        let mut types = vec![(Ty::F32, Ty::F32), (Ty::F16, Ty::F16)];
        if head_dim.is_multiple_of(QK8_0) {
            types.extend([(Ty::Q8, Ty::Q8), (Ty::F32, Ty::Q8)]);
        }
        for (tk, tv) in types {
            for run in [usize::MAX, 48, 3] {
                let store = Store::new(tk, &keys, tv, &vals, run);
                let (hk, hv) = (store.k.held(kv_dim), store.v.held(kv_dim));
                for plan in &plans {
                    for &n in &[1usize, 3, 19] {
                        let pos0 = depth - n;
                        let q: Vec<f32> = (0..n * q_dim).map(|_| rnd()).collect();
                        // Token `i` (position `pos0 + i`) sees the plan's keys up to its own
                        // position, less a fifth that differs from token to token.
                        let visible: Vec<Vec<Range<usize>>> = (0..n)
                            .map(|i| {
                                let mut v = runs(plan.iter().copied().filter(|&p| {
                                    p <= pos0 + i && (n == 1 || (p * 7 + i * 3) % 5 != 0)
                                }));
                                if i == 1 {
                                    v.insert(0, 0..0);
                                }
                                v
                            })
                            .collect();
                        let mut want = vec![0.0; n * q_dim];
                        attend_batch(Level::Scalar, 1, shape, &store, &q, &visible, &mut want);
                        for i in 0..n {
                            let keys_i: Vec<usize> = visible[i].iter().cloned().flatten().collect();
                            let qi = &q[i * q_dim..][..q_dim];
                            let held = reference(shape, &hk, &hv, qi, &keys_i);
                            for (a, b) in want[i * q_dim..][..q_dim].iter().zip(&held) {
                                assert!(
                                    (a - b).abs() < 2e-5,
                                    "{shape:?} {tk:?}/{tv:?} run {run} n {n}: {a} vs {b}"
                                );
                            }
                        }
                        let what = format!("{tk:?}/{tv:?} {shape:?} run {run} n {n}");
                        assert_levels_match(shape, &store, &q, &visible, &want, &what);
                    }
                }
            }
        }
    }
}

/// Each KV head of a GQA model reading its own scattered positions (a plan entry per head,
/// as a sparse policy states it): decode over 2000 keys, ~120 single positions and a few
/// short runs per head, against the f64 reference with per-head key sets.
#[test]
fn per_head_scattered_plans_match_f64_reference() {
    use crate::policy::{execute, Batch, PlanEntry, ReadPlan, Source};
    let mut rnd = rng(3);
    let shape = QWEN;
    let (kv_dim, q_dim, depth) = (shape.kv_dim(), shape.q_dim(), 2000);
    let (keys, vals) = random_kv(&mut rnd, depth, kv_dim);
    let per_head: Vec<Vec<usize>> = (0..shape.n_head_kv)
        .map(|h| {
            let mut p: Vec<usize> = (0..depth)
                .filter(|&p| (p * 2654435761 + h * 97) % 1000 < 60 + 20 * (p % 3 == 0) as usize)
                .collect();
            p.extend(depth - 5..depth);
            p.sort_unstable();
            p.dedup();
            p
        })
        .collect();
    let plan = ReadPlan {
        entries: (0..shape.n_head_kv)
            .map(|h| PlanEntry {
                kv_heads: h..h + 1,
                source: Source::Store,
                weight: 1.0,
                visible: vec![runs(per_head[h].iter().copied())],
            })
            .collect(),
        side: Vec::new(),
    };
    let q: Vec<f32> = (0..q_dim).map(|_| rnd()).collect();
    for ty in [Ty::F32, Ty::F16, Ty::Q8] {
        let store = Store::new(ty, &keys, ty, &vals, 256);
        let (hk, hv) = (store.k.held(kv_dim), store.v.held(kv_dim));
        let want = super::reference::attention_f64(shape, &hk, &hv, &q, &per_head);
        for level in Level::supported() {
            for threads in [1, 2, 16] {
                let mut got = vec![0.0; q_dim];
                let batch = Batch {
                    q: &q,
                    out: &mut got,
                    lse: None,
                };
                execute(level, threads, shape, &store, &plan, batch);
                for (a, b) in got.iter().zip(&want) {
                    assert!(
                        (a - b).abs() < 2e-5,
                        "{level:?} {threads} {ty:?}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// A weighted entry counts each of its keys `weight` times: a plan of exact keys plus an
/// every-7th sample of the rest weighted 7.5 equals the f64 reference with those weights —
/// outputs and log-sum-exps — at every level, thread count and element type.
#[test]
fn weighted_entries_match_weighted_f64_reference() {
    use crate::policy::{execute, Batch, PlanEntry, ReadPlan, Source};
    let mut rnd = rng(5);
    let shape = QWEN;
    let (kv_dim, q_dim, depth) = (shape.kv_dim(), shape.q_dim(), 1500);
    let (keys, vals) = random_kv(&mut rnd, depth, kv_dim);
    let weight = 7.5f32;
    let exact: Vec<Vec<usize>> = (0..shape.n_head_kv)
        .map(|h| {
            (0..depth)
                .filter(|&p| (p * 31 + h * 7) % 50 == 0 || p >= depth - 9)
                .collect()
        })
        .collect();
    let sample: Vec<Vec<usize>> = (0..shape.n_head_kv)
        .map(|h| {
            (0..depth)
                .filter(|&p| !exact[h].contains(&p) && (p + h) % 7 == 3)
                .collect()
        })
        .collect();
    let mut entries = Vec::new();
    for h in 0..shape.n_head_kv {
        entries.push(PlanEntry::exact(
            h..h + 1,
            Source::Store,
            vec![runs(exact[h].iter().copied())],
        ));
        entries.push(PlanEntry {
            kv_heads: h..h + 1,
            source: Source::Store,
            visible: vec![runs(sample[h].iter().copied())],
            weight,
        });
    }
    let plan = ReadPlan {
        entries,
        side: Vec::new(),
    };
    let weighted: Vec<Vec<(usize, f64)>> = (0..shape.n_head_kv)
        .map(|h| {
            let mut v: Vec<(usize, f64)> = exact[h].iter().map(|&p| (p, 1.0)).collect();
            v.extend(sample[h].iter().map(|&p| (p, weight as f64)));
            v
        })
        .collect();
    let q: Vec<f32> = (0..q_dim).map(|_| 3.0 * rnd()).collect();
    for ty in [Ty::F32, Ty::F16, Ty::Q8] {
        let store = Store::new(ty, &keys, ty, &vals, 256);
        let (hk, hv) = (store.k.held(kv_dim), store.v.held(kv_dim));
        let (want, want_lse) =
            super::reference::weighted_attention_f64(shape, &hk, &hv, &q, &weighted);
        let unweighted = super::reference::attention_f64(
            shape,
            &hk,
            &hv,
            &q,
            &weighted
                .iter()
                .map(|v| v.iter().map(|&(p, _)| p).collect::<Vec<_>>())
                .collect::<Vec<_>>(),
        );
        // The weights move the result, so the comparison below can see them dropped.
        let moved = want
            .iter()
            .zip(&unweighted)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(moved > 1e-2, "weights barely move the output ({moved})");
        for level in Level::supported() {
            for threads in [1, 2, 16] {
                let mut got = vec![0.0; q_dim];
                let mut lse = vec![0.0; shape.n_head];
                let batch = Batch {
                    q: &q,
                    out: &mut got,
                    lse: Some(&mut lse),
                };
                execute(level, threads, shape, &store, &plan, batch);
                for (a, b) in got.iter().zip(&want) {
                    assert!(
                        (a - b).abs() < 2e-5,
                        "{level:?} {threads} {ty:?}: {a} vs {b}"
                    );
                }
                for (a, b) in lse.iter().zip(&want_lse) {
                    assert!(
                        (*a as f64 - b).abs() < 1e-4 * b.abs().max(1.0),
                        "{level:?} {threads} {ty:?}: lse {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// Adjacent ranges are the same keys as their union: a plan split at arbitrary points
/// (0..10, 10..20, …, and uneven cuts) equals the one-range result within float tolerance,
/// and one split on tile boundaries walks the very same tiles, so it equals it bit for bit.
#[test]
fn adjacent_split_ranges_equal_one_range() {
    let mut rnd = rng(11);
    let shape = QWEN;
    let (kv_dim, q_dim, depth) = (shape.kv_dim(), shape.q_dim(), 700);
    let (keys, vals) = random_kv(&mut rnd, depth, kv_dim);
    let cut = |points: &[usize]| -> Vec<Range<usize>> {
        let mut b = vec![0];
        b.extend(points.iter().copied().filter(|&p| p > 0 && p < depth));
        b.push(depth);
        b.windows(2).map(|w| w[0]..w[1]).collect()
    };
    let tens: Vec<usize> = (1..70).map(|i| i * 10).collect();
    let uneven = [1, 3, 64, 65, 70, 127, 200, 201, 202, 333, 500, 699];
    let tiles: Vec<usize> = (1..11).map(|i| i * TILE).collect();
    let q: Vec<f32> = (0..q_dim).map(|_| rnd()).collect();
    for ty in [Ty::F32, Ty::F16, Ty::Q8] {
        let store = Store::new(ty, &keys, ty, &vals, usize::MAX);
        for level in Level::supported() {
            let run = |keys: Vec<Range<usize>>| {
                (0..shape.n_head_kv)
                    .map(|kv_head| {
                        let unit = Unit {
                            tokens: 0..1,
                            kv_head,
                            keys: keys.clone(),
                        };
                        attend_block(level, shape, &store, &q, &unit, &[vec![0..depth]])
                    })
                    .collect::<Vec<_>>()
            };
            let one = run(vec![0..depth]);
            let bits = |p: &[BlockPartial]| -> Vec<u32> {
                p.iter()
                    .flat_map(|b| b.m.iter().chain(&b.l).chain(&b.o).map(|x| x.to_bits()))
                    .collect()
            };
            assert_eq!(bits(&one), bits(&run(cut(&tiles))), "{level:?} {ty:?}");
            for points in [&tens[..], &uneven[..]] {
                let split = run(cut(points));
                for (a, b) in one.iter().zip(&split) {
                    for r in 0..shape.group() {
                        let (la, lb) = (a.m[r] + a.l[r].ln(), b.m[r] + b.l[r].ln());
                        assert!((la - lb).abs() < 1e-5, "{level:?} {ty:?}: lse {la} vs {lb}");
                        for d in 0..shape.head_dim {
                            let x = a.o[r * shape.head_dim + d] / a.l[r];
                            let y = b.o[r * shape.head_dim + d] / b.l[r];
                            assert!((x - y).abs() < 1e-5, "{level:?} {ty:?}: {x} vs {y}");
                        }
                    }
                }
            }
        }
    }
}

/// A plan of one long range is the plain tile loop — head rows in place (f32) or converted,
/// scores, mask, online softmax, rescale, P·V per [`TILE`] keys — bit for bit: gathering
/// leaves the one-piece path as it was.
#[test]
fn one_range_is_the_plain_tile_loop_bit_for_bit() {
    use super::tile::{pv, scores, softmax_tile, Tile};
    let mut rnd = rng(5);
    let shape = QWEN;
    let (kv_dim, q_dim, depth) = (shape.kv_dim(), shape.q_dim(), 1000);
    let (hd, group) = (shape.head_dim, shape.group());
    let (keys, vals) = random_kv(&mut rnd, depth, kv_dim);
    let q: Vec<f32> = (0..q_dim).map(|_| rnd()).collect();
    let range = 37..depth;
    for ty in [Ty::F32, Ty::F16, Ty::Q8] {
        let store = Store::new(ty, &keys, ty, &vals, usize::MAX);
        for level in Level::supported() {
            for kv_head in 0..shape.n_head_kv {
                let unit = Unit {
                    tokens: 0..1,
                    kv_head,
                    keys: vec![range.clone()],
                };
                let got = attend_block(level, shape, &store, &q, &unit, &[vec![0..depth]]);
                // The loop, written out.
                let rw = group.div_ceil(8) * 8;
                let mut qt = vec![0.0f32; hd * rw];
                for r in 0..group {
                    for d in 0..hd {
                        qt[d * rw + r] = q[(kv_head * group + r) * hd + d];
                    }
                }
                let (mut m, mut l) = (vec![f32::NEG_INFINITY; rw], vec![0.0f32; rw]);
                let mut o = vec![0.0f32; group * hd];
                let (mut corr, mut s) = (vec![0.0f32; rw], vec![0.0f32; TILE * rw]);
                let (mut kb, mut vb) = (Vec::new(), Vec::new());
                let scale = 1.0 / (hd as f32).sqrt();
                let mut start = range.start;
                while start < range.end {
                    let n = TILE.min(range.end - start);
                    let s = &mut s[..n * rw];
                    let rows = store.key_rows(start, n);
                    let (k, ks) = head_rows(level, rows, kv_head * hd, kv_dim, hd, n, &mut kb);
                    scores(level, Tile::new(k, ks, n, hd), &qt, rw, scale, s);
                    softmax_tile(level, s, n, rw, &mut m, &mut l, &mut corr);
                    for (r, &c) in corr[..group].iter().enumerate() {
                        if c != 1.0 {
                            o[r * hd..(r + 1) * hd].iter_mut().for_each(|a| *a *= c);
                        }
                    }
                    let rows = store.value_rows(start, n);
                    let (v, vs) = head_rows(level, rows, kv_head * hd, kv_dim, hd, n, &mut vb);
                    pv(level, s, rw, group, Tile::new(v, vs, n, hd), &mut o);
                    start += n;
                }
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.m), bits(&m), "{level:?} {ty:?}");
                assert_eq!(bits(&got.l), bits(&l), "{level:?} {ty:?}");
                assert_eq!(bits(&got.o), bits(&o), "{level:?} {ty:?}");
            }
        }
    }
}

/// The helper a gathered tile is built with writes what [`head_rows`] yields, densely, at
/// any offset of a destination: f32, f16 and Q8_0 rows, every level.
#[test]
fn head_rows_into_matches_head_rows() {
    let mut rnd = rng(13);
    let (kv_dim, hd, depth) = (3 * 64, 64, 40);
    let rows: Vec<Vec<f32>> = (0..depth)
        .map(|_| (0..kv_dim).map(|_| rnd()).collect())
        .collect();
    for ty in [Ty::F32, Ty::F16, Ty::Q8] {
        let st = Stored::new(ty, &rows);
        for level in Level::supported() {
            for head in 0..3 {
                let (start, n) = (5, 17);
                let mut buf = Vec::new();
                let (want, stride) = head_rows(
                    level,
                    st.rows(kv_dim, start, n),
                    head * hd,
                    kv_dim,
                    hd,
                    n,
                    &mut buf,
                );
                let mut dst = vec![f32::NAN; (n + 4) * hd];
                head_rows_into(
                    level,
                    st.rows(kv_dim, start, n),
                    head * hd,
                    kv_dim,
                    hd,
                    n,
                    &mut dst[3 * hd..],
                );
                for t in 0..n {
                    assert_eq!(&dst[(3 + t) * hd..][..hd], &want[t * stride..][..hd]);
                }
                assert!(dst[..3 * hd]
                    .iter()
                    .chain(&dst[(3 + n) * hd..])
                    .all(|x| x.is_nan()));
            }
        }
    }
}
