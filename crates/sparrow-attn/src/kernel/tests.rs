//! The primitive against f64 references: every level, f32 / f16 / Q8_0 rows, head sizes
//! with tails, MHA and GQA groups, batches of several blocks, forced key splits, per-token
//! masks, and a source that cuts its runs short.

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

use super::reference::uniform as rng;

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
/// exceeds it by far).
#[test]
fn batches_match_f64_reference_at_every_level() {
    let mut rnd = rng(99);
    let shapes = [(14, 2, 64), (4, 4, 20), (8, 2, 13), (6, 1, 72), (8, 4, 32)];
    for &(n_head, n_head_kv, head_dim) in &shapes {
        let shape = AttnShape {
            n_head,
            n_head_kv,
            head_dim,
        };
        let (kv_dim, q_dim) = (shape.kv_dim(), shape.q_dim());
        let depth = 700;
        let keys: Vec<Vec<f32>> = (0..depth)
            .map(|_| (0..kv_dim).map(|_| rnd() * 2.0).collect())
            .collect();
        let vals: Vec<Vec<f32>> = (0..depth)
            .map(|_| (0..kv_dim).map(|_| rnd()).collect())
            .collect();
        let mut types = vec![(Ty::F32, Ty::F32), (Ty::F16, Ty::F16)];
        if head_dim.is_multiple_of(QK8_0) {
            types.extend([(Ty::Q8, Ty::Q8), (Ty::Q8, Ty::F16), (Ty::F32, Ty::Q8)]);
        }
        for (tk, tv) in types {
            for run in [usize::MAX, 48] {
                let store = Store {
                    kv_dim,
                    k: Stored::new(tk, &keys),
                    v: Stored::new(tv, &vals),
                    run,
                };
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
                        for level in Level::supported() {
                            for threads in [1, 2, 16] {
                                let mut got = vec![0.0; n * q_dim];
                                attend_batch(level, threads, shape, &store, &q, &visible, &mut got);
                                for (a, b) in got.iter().zip(&want) {
                                    assert!(
                                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                                        "{level:?} {threads} {tk:?} {shape:?} n {n}: {a} vs {b}"
                                    );
                                }
                            }
                        }
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
