//! Side by side with `ruvllm_sparse_attention` 0.1.1 (dev-dependency only): same shapes,
//! same pattern parameters, same inputs, one run. Prints median times and the ratio
//! seed / sparrow per shape, plus output agreement where the pattern covers everything.
//!
//! `cargo bench -p sparrow-attn --features parallel,fp16 --bench vs_ruvllm`
//! (set `VS_QUICK=1` to skip the slowest rows).

use std::hint::black_box;
use std::time::{Duration, Instant};

use ruv::AttentionBackend;
use ruvllm_sparse_attention as ruv;
use sparrow_attn as sp;

struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn data(seq: usize, heads: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    (0..seq * heads * dim).map(|_| r.uniform()).collect()
}

fn both(seq: usize, heads: usize, dim: usize, seed: u64) -> (sp::Tensor3, ruv::Tensor3) {
    let d = data(seq, heads, dim, seed);
    (
        sp::Tensor3::from_vec(d.clone(), seq, heads, dim).unwrap(),
        ruv::Tensor3::from_vec(d, seq, heads, dim).unwrap(),
    )
}

/// Median of `n` alternating runs of `a` and `b` (alternating spreads machine noise).
fn race(n: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (Duration, Duration) {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    a();
    b();
    for _ in 0..n {
        let t = Instant::now();
        a();
        ta.push(t.elapsed());
        let t = Instant::now();
        b();
        tb.push(t.elapsed());
    }
    ta.sort();
    tb.sort();
    (ta[n / 2], tb[n / 2])
}

fn row(name: &str, seed: Duration, ours: Duration) {
    println!(
        "{name:<46} {:>12.3} ms {:>12.3} ms {:>8.2}x",
        seed.as_secs_f64() * 1e3,
        ours.as_secs_f64() * 1e3,
        seed.as_secs_f64() / ours.as_secs_f64()
    );
}

fn seed_cfg(window: usize, landmarks: bool) -> ruv::SubquadraticSparseAttention {
    ruv::SubquadraticSparseAttention::new(ruv::SparseAttentionConfig {
        window,
        block_size: 64,
        global_tokens: vec![0],
        causal: true,
        use_log_stride: true,
        use_landmarks: landmarks,
        sort_candidates: false,
    })
    .unwrap()
}

fn our_cfg(window: usize, landmarks: sp::LandmarkMode) -> sp::SparseAttention {
    sp::SparseAttention::new(sp::SparseConfig {
        window,
        block_size: 64,
        sinks: 1,
        landmarks,
        ..Default::default()
    })
    .unwrap()
}

fn main() {
    let quick = std::env::var("VS_QUICK").is_ok();
    println!(
        "kernels: {}, parallel: {}",
        sp::kernel_name(),
        cfg!(feature = "parallel")
    );
    println!(
        "{:<46} {:>15} {:>15} {:>9}",
        "shape", "seed", "sparrow", "seed/ours"
    );

    // Prefill, MHA: 8 heads, dim 64, window 128, block 64, sink token 0.
    for seq in [1024usize, 4096] {
        let (q, rq) = both(seq, 8, 64, 1);
        let (k, rk) = both(seq, 8, 64, 2);
        let (v, rv) = both(seq, 8, 64, 3);
        let s = seed_cfg(128, true);
        let n = if seq > 2048 { 5 } else { 9 };
        for (mode, name) in [
            (sp::LandmarkMode::Ladder, "ladder"),
            (sp::LandmarkMode::All, "all"),
        ] {
            let o = our_cfg(128, mode);
            let (a, b) = race(
                n,
                || drop(black_box(s.forward(&rq, &rk, &rv).unwrap())),
                || drop(black_box(o.forward(&q, &k, &v).unwrap())),
            );
            row(&format!("forward seq {seq} (ours: landmarks {name})"), a, b);
            let (a, b) = race(
                n,
                || drop(black_box(s.forward_flash(&rq, &rk, &rv, 0).unwrap())),
                || drop(black_box(o.forward_flash(&q, &k, &v).unwrap())),
            );
            row(
                &format!("forward_flash seq {seq} (ours: landmarks {name})"),
                a,
                b,
            );
        }
    }
    // Dense reference.
    {
        let seq = if quick { 1024 } else { 2048 };
        let (q, rq) = both(seq, 8, 64, 4);
        let (k, rk) = both(seq, 8, 64, 5);
        let (v, rv) = both(seq, 8, 64, 6);
        let (a, b) = race(
            3,
            || {
                drop(black_box(
                    ruv::dense_attention(&rq, &rk, &rv, true).unwrap(),
                ))
            },
            || drop(black_box(sp::forward_dense(&q, &k, &v, true).unwrap())),
        );
        row(&format!("dense causal seq {seq}"), a, b);
        // Where the pattern covers everything, outputs must equal dense.
        let ours = our_cfg(seq, sp::LandmarkMode::All)
            .forward(&q, &k, &v)
            .unwrap();
        let dense = sp::forward_dense(&q, &k, &v, true).unwrap();
        let seed_full = seed_cfg(seq, false).forward(&rq, &rk, &rv).unwrap();
        let seed_full_lm = seed_cfg(seq, true).forward(&rq, &rk, &rv).unwrap();
        let diff = |x: &[f32]| {
            x.iter()
                .zip(dense.data())
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        };
        println!("  full-window outputs vs dense: sparrow {:.2e}, seed (landmarks off) {:.2e}, seed (landmarks on) {:.2e}",
            diff(ours.data()), diff(&seed_full.data), diff(&seed_full_lm.data));
    }
    // GQA forward_auto: 32 q / 8 kv heads, dim 128.
    {
        let seq = 4096;
        let (q, rq) = both(seq, 32, 128, 7);
        let (k, rk) = both(seq, 8, 128, 8);
        let (v, rv) = both(seq, 8, 128, 9);
        let s = seed_cfg(128, true);
        for (mode, name) in [
            (sp::LandmarkMode::Ladder, "ladder"),
            (sp::LandmarkMode::All, "all"),
        ] {
            let o = our_cfg(128, mode);
            let (a, b) = race(
                3,
                || drop(black_box(s.forward_auto(&rq, &rk, &rv).unwrap())),
                || drop(black_box(o.forward_auto(&q, &k, &v).unwrap())),
            );
            row(&format!("gqa forward_auto seq {seq} (ours: {name})"), a, b);
        }
    }
    // Decode: 32 q / 8 kv heads, dim 128.
    let ts: &[usize] = if quick {
        &[4096, 16384]
    } else {
        &[1024, 4096, 16384, 32768]
    };
    for &t in ts {
        let (k, rk) = both(t, 8, 128, 10);
        let (v, rv) = both(t, 8, 128, 11);
        let (q, rq) = both(1, 32, 128, 12);
        let s = seed_cfg(128, true);
        let mut rc = ruv::KvCache::new(t, 8, 128, 64);
        rc.append_all(&rk, &rv).unwrap();
        let mut rc16 = ruv::KvCacheF16::new(t, 8, 128, 64);
        for i in 0..t {
            let w = 8 * 128;
            let kt =
                ruv::Tensor3::from_vec(rk.data[i * w..(i + 1) * w].to_vec(), 1, 8, 128).unwrap();
            let vt =
                ruv::Tensor3::from_vec(rv.data[i * w..(i + 1) * w].to_vec(), 1, 8, 128).unwrap();
            rc16.try_append(&kt, &vt).unwrap();
        }
        let mut c = sp::KvCache::new(t, 8, 128, 64).unwrap();
        c.append_all(&k, &v).unwrap();
        let mut c16 = sp::KvCacheF16::new(t, 8, 128, 64).unwrap();
        c16.append_all(&k, &v).unwrap();
        for (mode, name) in [
            (sp::LandmarkMode::Ladder, "ladder"),
            (sp::LandmarkMode::All, "all"),
        ] {
            let o = our_cfg(128, mode);
            let (a, b) = race(
                201,
                || drop(black_box(s.decode_step(&rq, &rc).unwrap())),
                || drop(black_box(o.decode_step(&q, &c).unwrap())),
            );
            row(&format!("decode_step f32 T={t} (ours: {name})"), a, b);
            let (a, b) = race(
                201,
                || drop(black_box(rc16.decode_step_f16(&s, &rq).unwrap())),
                || drop(black_box(o.decode_step(&q, &c16).unwrap())),
            );
            row(&format!("decode_step f16 T={t} (ours: {name})"), a, b);
        }
    }
    // H2O eviction on a full 32K cache (8 kv heads, dim 128). Scores: uniform random, so
    // the victim is anywhere in the cache (ours: real scores from tracked decode steps).
    if !quick {
        let t = 32768;
        let (k, rk) = both(t, 8, 128, 13);
        let (v, rv) = both(t, 8, 128, 14);
        let (kn, rkn) = both(1, 8, 128, 15);
        let (vn, rvn) = both(1, 8, 128, 16);
        let (q, _) = both(1, 32, 128, 17);
        let mut rc = ruv::KvCache::new(t, 8, 128, 64);
        rc.append_all(&rk, &rv).unwrap();
        let mut r = Rng(99);
        let scores: Vec<f32> = (0..t).map(|_| r.uniform().abs()).collect();
        let mut c = sp::KvCache::new(t, 8, 128, 64).unwrap();
        c.append_all(&k, &v).unwrap();
        let cfg = sp::SparseConfig {
            block_size: 64,
            ..Default::default()
        };
        let o = sp::SparseAttention::new(cfg.clone()).unwrap();
        for _ in 0..32 {
            o.decode_step_tracked(&q, &mut c).unwrap();
        }
        let mut victims = Vec::new();
        let (a, b) = race(
            7,
            || rc.evict_and_append(&rkn, &rvn, &scores, &[0], 128).unwrap(),
            || victims.push(c.evict_and_append(&kn, &vn, &cfg).unwrap().unwrap()),
        );
        row("evict_and_append full cache T=32768", a, b);
        println!("  our victims: {victims:?}");
    }
    // Candidate counts (one head), seed vs ours.
    for seq in [4096usize, 8192, 32768] {
        let s = seed_cfg(128, true).estimate_sparse_edges(seq);
        let l = sp::candidates(
            &sp::SparseConfig {
                sinks: 1,
                landmarks: sp::LandmarkMode::Ladder,
                ..Default::default()
            },
            seq,
        )
        .unwrap();
        let a = sp::candidates(
            &sp::SparseConfig {
                sinks: 1,
                ..Default::default()
            },
            seq,
        )
        .unwrap();
        println!("  candidates seq {seq}: seed {s}, ours ladder {} ({} tokens + {} landmarks), ours all {} ({} + {})",
            l.total(), l.token_pairs, l.landmark_pairs, a.total(), a.token_pairs, a.landmark_pairs);
    }
}
