//! Criterion benchmarks.
//!
//! `cargo bench -p sparrow-attn --features parallel,fp16 --bench attention -- --warm-up-time 1 --measurement-time 3`
//!
//! * `prefill/*`: sparse `forward` and `forward_flash` vs `forward_dense` at seq 512…8192
//!   (8 heads, dim 64, window 128, block 64, 1 sink);
//! * `prefill_long/*`: sparse alone at 16384 and 32768;
//! * `decode/*`: one `decode_step` (32 q / 8 kv heads, dim 128) at T = 1K…32K, f32 and f16;
//! * `parallel/*`: rayon on vs off (needs feature `parallel` for "on" to differ);
//! * `evict/*`: `evict_and_append` on a full 32K cache;
//! * `gather/*` (feature `fp16`): the kernel primitive for one decode token of a
//!   Qwen2.5-0.5B-like layer (14 q / 2 kv heads, dim 64, f16 rows, 32768 cached keys),
//!   single-threaded, both kv heads: 1300 scattered single positions per kv head (a sparse
//!   policy's read plan; the token's visible list is those positions, or everything), vs
//!   the same number of keys as one contiguous range.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use sparrow_attn::{forward_dense, KvElement, LayerCache, SparseAttention, SparseConfig, Tensor3};

fn rand(seq: usize, heads: usize, dim: usize, seed: u64) -> Tensor3 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Tensor3::from_fn(seq, heads, dim, |_, _, _| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    })
    .unwrap()
}

fn cfg() -> SparseConfig {
    SparseConfig {
        window: 128,
        block_size: 64,
        sinks: 1,
        ..Default::default()
    }
}

fn prefill(c: &mut Criterion) {
    prefill_group(c, "prefill", &[512, 1024, 2048, 4096, 8192], true);
    prefill_group(c, "prefill_long", &[16384, 32768], false);
}

/// Sparse `forward` and `forward_flash` (and, with `dense`, `forward_dense`) at each length
/// (8 heads, dim 64).
fn prefill_group(c: &mut Criterion, name: &str, seqs: &[usize], dense: bool) {
    let a = SparseAttention::new(cfg()).unwrap();
    let mut g = c.benchmark_group(name);
    g.sample_size(10);
    for &seq in seqs {
        let (q, k, v) = (
            rand(seq, 8, 64, 1),
            rand(seq, 8, 64, 2),
            rand(seq, 8, 64, 3),
        );
        g.bench_with_input(BenchmarkId::new("sparse_forward", seq), &seq, |b, _| {
            b.iter(|| a.forward(black_box(&q), &k, &v).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("sparse_flash", seq), &seq, |b, _| {
            b.iter(|| a.forward_flash(black_box(&q), &k, &v).unwrap())
        });
        if dense {
            g.bench_with_input(BenchmarkId::new("dense", seq), &seq, |b, _| {
                b.iter(|| forward_dense(black_box(&q), &k, &v, true).unwrap())
            });
        }
    }
    g.finish();
}

fn filled<E: KvElement>(t: usize) -> LayerCache<E> {
    let mut c = LayerCache::<E>::new(t, 8, 128, 64).unwrap();
    c.append_all(&rand(t, 8, 128, 4), &rand(t, 8, 128, 5))
        .unwrap();
    c
}

fn decode_one<E: KvElement>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    a: &SparseAttention,
    t: usize,
) {
    let cache = filled::<E>(t);
    let q = rand(1, 32, 128, 6);
    g.bench_with_input(BenchmarkId::new(E::NAME, t), &t, |b, _| {
        b.iter(|| a.decode_step(black_box(&q), &cache).unwrap())
    });
}

fn decode(c: &mut Criterion) {
    let a = SparseAttention::new(cfg()).unwrap();
    let mut g = c.benchmark_group("decode");
    for t in [1024usize, 4096, 16384, 32768] {
        decode_one::<f32>(&mut g, &a, t);
        #[cfg(feature = "fp16")]
        decode_one::<sparrow_attn::f16>(&mut g, &a, t);
    }
    g.finish();
}

fn parallel(c: &mut Criterion) {
    let on = SparseAttention::new(cfg()).unwrap();
    let off = on.clone().with_parallel(false);
    let mut g = c.benchmark_group("parallel");
    g.sample_size(10);
    let (q, k, v) = (
        rand(4096, 8, 64, 1),
        rand(4096, 8, 64, 2),
        rand(4096, 8, 64, 3),
    );
    for (name, a) in [("on", &on), ("off", &off)] {
        g.bench_function(format!("forward_flash_4096/{name}"), |b| {
            b.iter(|| a.forward_flash(black_box(&q), &k, &v).unwrap())
        });
    }
    let cache = filled::<f32>(16384);
    let q1 = rand(1, 32, 128, 6);
    for (name, a) in [("on", &on), ("off", &off)] {
        g.bench_function(format!("decode_f32_16384/{name}"), |b| {
            b.iter(|| a.decode_step(black_box(&q1), &cache).unwrap())
        });
    }
    g.finish();
}

fn evict_one<E: KvElement>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
) {
    let config = cfg();
    let a = SparseAttention::new(config.clone()).unwrap();
    let mut cache = filled::<E>(32768);
    let q = rand(1, 32, 128, 6);
    for _ in 0..16 {
        a.decode_step_tracked(&q, &mut cache).unwrap();
    }
    let (k, v) = (rand(1, 8, 128, 7), rand(1, 8, 128, 8));
    g.bench_function(format!("{}_32768", E::NAME), |b| {
        b.iter(|| cache.evict_and_append(black_box(&k), &v, &config).unwrap())
    });
}

fn evict(c: &mut Criterion) {
    let mut g = c.benchmark_group("evict");
    g.sample_size(20);
    evict_one::<f32>(&mut g);
    #[cfg(feature = "fp16")]
    evict_one::<sparrow_attn::f16>(&mut g);
    g.finish();
}

#[cfg(feature = "fp16")]
#[allow(clippy::single_range_in_vec_init)] // lists of key ranges that hold one
fn gather(c: &mut Criterion) {
    use sparrow_attn::f16;
    use sparrow_attn::kernel::{attend_block, AttnShape, KvRows, KvSource, Level, Unit};
    use std::ops::Range;

    struct Rows {
        kv_dim: usize,
        k: Vec<f16>,
        v: Vec<f16>,
    }
    impl KvSource for Rows {
        fn kv_dim(&self) -> usize {
            self.kv_dim
        }
        fn key_rows(&self, start: usize, n: usize) -> KvRows<'_> {
            KvRows::F16(&self.k[start * self.kv_dim..(start + n) * self.kv_dim])
        }
        fn value_rows(&self, start: usize, n: usize) -> KvRows<'_> {
            KvRows::F16(&self.v[start * self.kv_dim..(start + n) * self.kv_dim])
        }
    }

    let shape = AttnShape {
        n_head: 14,
        n_head_kv: 2,
        head_dim: 64,
    };
    let (t, picks) = (32768usize, 1300usize);
    let mut r = sparrow_attn::kernel::reference::uniform(9);
    let src = Rows {
        kv_dim: shape.kv_dim(),
        k: (0..t * shape.kv_dim())
            .map(|_| f16::from_f32(r()))
            .collect(),
        v: (0..t * shape.kv_dim())
            .map(|_| f16::from_f32(r()))
            .collect(),
    };
    let q: Vec<f32> = (0..shape.q_dim()).map(|_| r()).collect();
    // Per kv head: `picks` distinct random positions, sorted, as single-key ranges.
    let scattered: Vec<Vec<Range<usize>>> = (0..shape.n_head_kv)
        .map(|_| {
            let mut p = Vec::new();
            while p.len() < picks {
                p.push(((r() + 1.0) * 0.5 * t as f32) as usize % t);
                p.sort_unstable();
                p.dedup();
            }
            p.into_iter().map(|p| p..p + 1).collect()
        })
        .collect();
    let units = |keys: &dyn Fn(usize) -> Vec<Range<usize>>| -> Vec<Unit> {
        (0..shape.n_head_kv)
            .map(|kv_head| Unit {
                tokens: 0..1,
                kv_head,
                keys: keys(kv_head),
            })
            .collect()
    };
    let sparse = units(&|h| scattered[h].clone());
    let dense = units(&|_| vec![t - picks..t]);
    // Per kv head, the one token's visible ranges.
    let own: Vec<Vec<Vec<Range<usize>>>> = scattered.iter().map(|s| vec![s.clone()]).collect();
    let all = vec![vec![vec![0..t]]; shape.n_head_kv];
    let level = Level::active();
    let run = |units: &[Unit], vis: &[Vec<Vec<Range<usize>>>]| {
        for u in units {
            black_box(attend_block(level, shape, &src, &q, u, &vis[u.kv_head]));
        }
    };
    let mut g = c.benchmark_group("gather");
    g.bench_function("scattered_1300", |b| b.iter(|| run(&sparse, &own)));
    g.bench_function("scattered_1300_visible_all", |b| {
        b.iter(|| run(&sparse, &all))
    });
    g.bench_function("contiguous_1300", |b| b.iter(|| run(&dense, &all)));
    g.finish();
}

#[cfg(not(feature = "fp16"))]
fn gather(_: &mut Criterion) {}

criterion_group!(benches, prefill, decode, parallel, evict, gather);
criterion_main!(benches);
