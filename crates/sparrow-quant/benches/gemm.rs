//! Batched products (prefill) on the real Qwen2.5-0.5B shapes: `matmul` of a 512-token
//! batch per weight format and SIMD level, on one thread, with the best wall time of 5
//! calls (the least disturbed on a shared machine) and the resulting GMAC/s.
//!
//! `cargo bench -p sparrow-quant --bench gemm` (`SPARROW_BENCH_TOKENS=n` changes the
//! batch, `SPARROW_BENCH_FORMAT=Q5_0` restricts the formats).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use sparrow_quant::{matmul_at_level, GgmlType, QMatrix, SimdLevel};

use common::{fixed_scale_weights, xorshift_bytes};

/// (format, rows, cols): attn q/o and ffn gate/up (Q5_0 and Q8_0 in the Q4_K_M file, as
/// 896 is not a multiple of 256), ffn down (Q4_K, Q6_K).
const CASES: [(GgmlType, usize, usize); 6] = [
    (GgmlType::Q5_0, 896, 896),
    (GgmlType::Q5_0, 4864, 896),
    (GgmlType::Q8_0, 896, 896),
    (GgmlType::Q4_K, 896, 4864),
    (GgmlType::Q6_K, 896, 4864),
    (GgmlType::Q4_0, 4864, 896),
];

/// Random weights with a fixed 2^-8 for every f16 scale field, so nothing is NaN/inf.
fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = ty.bytes_for((rows * cols) as u64).unwrap();
    fixed_scale_weights(ty, n, &mut ((0x5eed ^ n as u64) | 1), 1.0 / 256.0)
}

fn main() {
    let n: usize = std::env::var("SPARROW_BENCH_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let only = std::env::var("SPARROW_BENCH_FORMAT").ok();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    println!("| format | rows x cols | tokens | level | ms | GMAC/s |");
    println!("| --- | --- | ---: | --- | ---: | ---: |");
    for (ty, rows, cols) in CASES {
        if only.as_deref().is_some_and(|o| o != ty.to_string()) {
            continue;
        }
        let w = weights(ty, rows, cols);
        let m = QMatrix::new(ty, &w, rows, cols).unwrap();
        let xs: Vec<f32> = xorshift_bytes(n * cols, &mut 9)
            .iter()
            .map(|&b| b as f32 / 128.0 - 1.0)
            .collect();
        let mut out = vec![0f32; n * rows];
        for level in SimdLevel::supported() {
            if level == SimdLevel::Scalar {
                continue;
            }
            let best = pool.install(|| {
                (0..5)
                    .map(|_| {
                        let t = Instant::now();
                        matmul_at_level(level, &m, &xs, &mut out).unwrap();
                        t.elapsed()
                    })
                    .min()
                    .unwrap()
            });
            let gmac = (rows * cols * n) as f64 / best.as_secs_f64() / 1e9;
            println!(
                "| {ty} | {rows} x {cols} | {n} | {} | {:.1} | {gmac:.1} |",
                level.name(),
                best.as_secs_f64() * 1e3
            );
        }
    }
}
