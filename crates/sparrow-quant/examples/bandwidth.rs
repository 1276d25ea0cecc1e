//! How fast this machine streams memory, and how close each weight format's `matvec` comes
//! to it: the numbers behind the decode roofline in docs/performance.md.
//!
//! `cargo run --release -p sparrow-quant --example bandwidth [MiB]`
//!
//! For 1 thread and for every core: a plain read of a buffer far larger than the caches
//! (a xor over 8-byte words, which the compiler vectorises), then `matvec` over a matrix of
//! the same size in each format the Qwen2.5 Q4_K_M file uses (Q5_0 in ggml's and in
//! sparrow's packed layout and in row groups, Q4_K and Q6_K in ggml's and in row groups), as GB/s of weights
//! read. Best of 5 runs each; the machine
//! should be otherwise idle.

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::Instant;

use sparrow_quant::packed::pack_rows;
use sparrow_quant::row_groups::{group_rows, GROUP_ROWS};
use sparrow_quant::{matvec, GgmlType, QMatrix};

use common::{fixed_scale_weights, xorshift_bytes};

/// Random blocks with a fixed small f16 scale in every scale field, so nothing is inf/NaN.
fn weights(ty: GgmlType, len: usize) -> Vec<u8> {
    fixed_scale_weights(ty, len, &mut ((0x5eed ^ len as u64) | 1), 1.0 / 256.0)
}

/// Best GB/s of `bytes` moved by `f` over 5 runs (after one warm-up).
fn best_gbs(bytes: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            bytes as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

fn read_all(buf: &[u8]) -> u64 {
    buf.chunks_exact(8)
        .fold(0u64, |a, c| a ^ u64::from_le_bytes(c.try_into().unwrap()))
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("size in MiB"))
        .unwrap_or(256);
    let bytes = mib << 20;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: Vec<usize> = if cores > 1 { vec![1, cores] } else { vec![1] };
    println!(
        "| what ({mib} MiB) | {} |",
        threads
            .iter()
            .map(|t| format!("{t} thread(s), GB/s"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("| --- |{}", " ---: |".repeat(threads.len()));

    // One pool per thread count, each row of the table measured in every one of them.
    let pools: Vec<rayon::ThreadPool> = threads
        .iter()
        .map(|&t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        })
        .collect();

    let buf = xorshift_bytes(bytes, &mut 3);
    let cells: Vec<f64> = pools
        .iter()
        .map(|pool| {
            let part = bytes.div_ceil(pool.current_num_threads());
            best_gbs(bytes, || {
                pool.install(|| {
                    use rayon::prelude::*;
                    let x = buf
                        .par_chunks(part)
                        .map(read_all)
                        .reduce(|| 0, |a, b| a ^ b);
                    black_box(x);
                })
            })
        })
        .collect();
    print_row("plain read", &cells);

    /// How a matrix's rows are stored.
    #[derive(PartialEq)]
    enum Layout {
        Ggml,
        Packed,
        Groups,
    }
    let formats = [
        ("Q5_0 (ggml layout)", GgmlType::Q5_0, 896, Layout::Ggml),
        ("Q5_0 (packed)", GgmlType::Q5_0, 896, Layout::Packed),
        ("Q5_0 (row groups)", GgmlType::Q5_0, 896, Layout::Groups),
        ("Q8_0", GgmlType::Q8_0, 896, Layout::Ggml),
        ("Q4_K", GgmlType::Q4_K, 4864, Layout::Ggml),
        ("Q4_K (row groups)", GgmlType::Q4_K, 4864, Layout::Groups),
        ("Q6_K", GgmlType::Q6_K, 4864, Layout::Ggml),
        ("Q6_K (row groups)", GgmlType::Q6_K, 4864, Layout::Groups),
    ];
    for (name, ty, cols, layout) in formats {
        let row_bytes = ty.bytes_for(cols as u64).unwrap();
        let rows = bytes / row_bytes / GROUP_ROWS * GROUP_ROWS;
        let mut w = weights(ty, rows * row_bytes);
        let src = w.clone();
        let m = match layout {
            Layout::Ggml => QMatrix::new(ty, &w, rows, cols),
            Layout::Packed => {
                pack_rows(ty, &src, row_bytes, &mut w).unwrap();
                QMatrix::new_packed(ty, &w, rows, cols)
            }
            Layout::Groups => {
                group_rows(ty, &src, row_bytes, &mut w).unwrap();
                QMatrix::new_grouped(ty, &w, rows, cols)
            }
        }
        .unwrap();
        let x: Vec<f32> = (0..cols).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
        let mut out = vec![0f32; rows];
        let cells: Vec<f64> = pools
            .iter()
            .map(|pool| {
                best_gbs(w.len(), || {
                    pool.install(|| matvec(&m, &x, &mut out).unwrap())
                })
            })
            .collect();
        print_row(&format!("matvec {name}"), &cells);
    }
}

fn print_row(name: &str, cells: &[f64]) {
    let c: Vec<String> = cells.iter().map(|g| format!("{g:.1}")).collect();
    println!("| {name} | {} |", c.join(" | "));
}
