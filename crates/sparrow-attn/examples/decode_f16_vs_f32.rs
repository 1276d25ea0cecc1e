//! f16 vs f32 KV cache, one decode step (32 q / 8 kv heads, dim 128), measured interleaved
//! so machine noise hits both equally. Prints the median of 400 steps each.
//!
//! `cargo run -p sparrow-attn --example decode_f16_vs_f32 --release --features parallel,fp16`

use std::hint::black_box;
use std::time::Instant;

use sparrow_attn::{KvCache, KvCacheF16, SparseAttention, SparseConfig, Tensor3};

fn main() {
    let mut s = 1u64;
    let mut r = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    for t in [4096usize, 16384, 32768] {
        let k = Tensor3::from_fn(t, 8, 128, |_, _, _| r()).unwrap();
        let v = Tensor3::from_fn(t, 8, 128, |_, _, _| r()).unwrap();
        let q = Tensor3::from_fn(1, 32, 128, |_, _, _| r()).unwrap();
        let mut c32 = KvCache::new(t, 8, 128, 64).unwrap();
        c32.append_all(&k, &v).unwrap();
        let mut c16 = KvCacheF16::new(t, 8, 128, 64).unwrap();
        c16.append_all(&k, &v).unwrap();
        for parallel in [true, false] {
            let a = SparseAttention::new(SparseConfig::default())
                .unwrap()
                .with_parallel(parallel);
            let (mut x, mut y) = (Vec::new(), Vec::new());
            for _ in 0..400 {
                let i = Instant::now();
                black_box(a.decode_step(&q, &c32).unwrap());
                x.push(i.elapsed().as_secs_f64());
                let i = Instant::now();
                black_box(a.decode_step(&q, &c16).unwrap());
                y.push(i.elapsed().as_secs_f64());
            }
            x.sort_by(f64::total_cmp);
            y.sort_by(f64::total_cmp);
            println!(
                "T={t:>5} parallel={:<5}: f32 {:>7.1} µs, f16 {:>7.1} µs ({} bytes vs {} bytes of K/V)",
                a.is_parallel(),
                x[200] * 1e6,
                y[200] * 1e6,
                c32.storage_bytes(),
                c16.storage_bytes()
            );
        }
    }
}
