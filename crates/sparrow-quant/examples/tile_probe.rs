//! The AMX rows kernel (Q4_K, `SimdLevel::Amx`) called directly against the same level's
//! multi-token row kernels, on a Qwen2.5-1.5B-shaped matrix (8960 × 1536): nanoseconds per
//! tile of 16 rows and one super-block, and GMAC/s, for 1 to 16 tokens on one thread, and
//! the tiles on two threads (two halves of the rows):
//! `cargo run --release -p sparrow-quant --example tile_probe`. Needs a CPU with AMX-INT8.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use sparrow_quant::q8::{Q8DotMulti, Q8KActs};
use sparrow_quant::q8_tiles::Q8KTiles;
use sparrow_quant::{GgmlType, Kernels, SimdLevel};

fn main() {
    let (rows, cols) = (8960usize, 1536usize);
    let row_bytes = cols / 256 * 144;
    let Some(k) = Kernels::for_level(GgmlType::Q4_K, SimdLevel::Amx) else {
        eprintln!("this CPU (or OS) has no AMX-INT8: nothing to probe");
        return;
    };
    let (Some(tiles_kernel), Some(Q8DotMulti::Q8K(multi))) = (k.dot_q8_rows, k.dot_q8_multi) else {
        unreachable!("the AMX level has Q4_K rows and multi-token kernels");
    };
    let mut seed = 0x1234_5678_9abc_def1u64;
    let w = common::fixed_scale_weights(GgmlType::Q4_K, rows * row_bytes, &mut seed, 0.01);
    let units = rows as f64 / 16.0 * (cols / 256) as f64;
    let reps = 20;
    for m in [1usize, 2, 4, 8, 16] {
        let acts: Vec<Q8KActs> = (0..m)
            .map(|t| {
                let x: Vec<f32> = (0..cols)
                    .map(|i| ((i * 7919 + t) % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                Q8KActs::new(&x)
            })
            .collect();
        let slices: Vec<_> = acts.iter().map(|a| a.as_slice()).collect();
        let tiles = Q8KTiles::new(&slices);
        let macs = (rows * cols * m) as f64;
        let mut out = vec![0f32; rows * m];
        tiles_kernel(&w, rows, &tiles, &mut out);
        let t = Instant::now();
        for _ in 0..reps {
            tiles_kernel(&w, rows, &tiles, &mut out);
        }
        let one = t.elapsed().as_secs_f64() / reps as f64;
        let mut vals = vec![0f32; m];
        let t = Instant::now();
        for _ in 0..reps {
            for row in w.chunks_exact(row_bytes) {
                multi(row, &slices, &mut vals);
            }
        }
        let row_kernels = t.elapsed().as_secs_f64() / reps as f64;
        let half = rows / 2;
        let (wa, wb) = w.split_at(half * row_bytes);
        let (oa, ob) = out.split_at_mut(half * m);
        let t = Instant::now();
        for _ in 0..reps {
            rayon::join(
                || tiles_kernel(wa, half, &tiles, oa),
                || tiles_kernel(wb, half, &tiles, ob),
            );
        }
        let two = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{m:2} tokens: tiles {:6.1} ns/tile ({:5.1} GMAC/s), row kernels {:6.1} ns ({:5.1}); \
             tiles on two threads {:5.1} GMAC/s",
            one / units * 1e9,
            macs / one / 1e9,
            row_kernels / units * 1e9,
            macs / row_kernels / 1e9,
            macs / two / 1e9,
        );
    }
}
