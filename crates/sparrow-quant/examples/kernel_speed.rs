//! Rough timing of `matvec` / `matmul` on Qwen2.5-0.5B-shaped random matrices:
//! `cargo run --release -p sparrow-quant --example kernel_speed [threads]`.
//! Prints GB/s of weights for matvec (decode) and GMAC/s for matmul of 2 to 16 tokens (the
//! multi-token row kernels: speculative checks, batched slots) and of 512 (prefill).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use sparrow_quant::{matmul, matvec, GgmlType, QMatrix};

use common::fixed_scale_weights;

/// Random blocks with small finite f16 scales at every f16 field.
fn weights(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    fixed_scale_weights(
        ty,
        rows * cols / ty.block_elems() * ty.block_bytes(),
        seed,
        0.01,
    )
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut seed = 0x1234_5678_9abc_def1u64;
    let shapes = [
        (GgmlType::Q5_0, 896, 896),
        (GgmlType::Q5_0, 4864, 896),
        (GgmlType::Q8_0, 4864, 896),
        (GgmlType::Q4_K, 896, 4864),
        (GgmlType::Q6_K, 896, 4864),
        (GgmlType::Q4_K, 8960, 1536),
    ];
    println!(
        "level {:?}, {threads} threads",
        sparrow_quant::SimdLevel::active()
    );
    for (ty, rows, cols) in shapes {
        let w = weights(ty, rows, cols, &mut seed);
        let m = QMatrix::new(ty, &w, rows, cols).unwrap();
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let mut out = vec![0f32; rows];
        let reps = 200;
        pool.install(|| {
            for _ in 0..10 {
                matvec(&m, &x, &mut out).unwrap();
            }
        });
        let t = Instant::now();
        pool.install(|| {
            for _ in 0..reps {
                matvec(&m, &x, &mut out).unwrap();
            }
        });
        let s = t.elapsed().as_secs_f64() / reps as f64;
        let gbs = w.len() as f64 / s / 1e9;
        // A few tokens (a speculative check, a batch of slots: the multi-token row
        // kernels below the panel threshold) and a prefill batch (the panels).
        let mut batches = Vec::new();
        for n in [2usize, 4, 8, 16, 512] {
            let xs: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut outs = vec![0f32; n * rows];
            pool.install(|| matmul(&m, &xs, &mut outs).unwrap());
            let mreps = (2048 / n).max(3);
            let t = Instant::now();
            pool.install(|| {
                for _ in 0..mreps {
                    matmul(&m, &xs, &mut outs).unwrap();
                }
            });
            let sm = t.elapsed().as_secs_f64() / mreps as f64;
            let gmacs = (rows * cols * n) as f64 / sm / 1e9;
            batches.push(format!("x{n} {gmacs:.1}"));
        }
        println!(
            "{ty:?} {rows}x{cols}: matvec {:.1} us ({gbs:.1} GB/s)  matmul GMAC/s: {}",
            s * 1e6,
            batches.join(", ")
        );
    }
}
