//! matvec throughput on the real Qwen2.5-0.5B shapes, per weight format and kernel path:
//! scalar f32 activations (the reference), SIMD f32 activations, and int8 activations
//! (scalar and each SIMD level), single-threaded so the ratios measure the kernels, not the
//! (shared, noisy) cores. Each row is one call of the kernel, as `matvec` does.
//!
//! Besides criterion's per-case timings, a markdown table of speed-ups over the scalar f32
//! path, measured in the same run, is printed at the end.
//!
//! `cargo bench -p sparrow-quant --bench matvec` (set `SPARROW_BENCH_QUICK=1` to skip the
//! 151936x896 output shape).

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sparrow_quant::q8::{Q8Dot, Q8KActs, Q8_0Acts};
use sparrow_quant::{GgmlType, Kernels, SimdLevel};

use common::{fixed_scale_weights, xorshift_bytes};

/// (rows, cols) of the real matrices: attn q/o, ffn gate/up, ffn down, output. k-quants
/// only fit the 4864-wide one (896 is not a multiple of 256).
const SHAPES: [(usize, usize); 4] = [(896, 896), (4864, 896), (896, 4864), (151936, 896)];
const FORMATS: [GgmlType; 5] = [
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::F16,
];

/// Random weights with sane f16 scales (a fixed 2^-8) so nothing is NaN/inf.
fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = ty.bytes_for((rows * cols) as u64).unwrap();
    let mut w = fixed_scale_weights(ty, n, &mut ((0x5eed ^ n as u64) | 1), 1.0 / 256.0);
    if ty == GgmlType::F16 {
        for e in w.chunks_exact_mut(2) {
            e[1] &= 0x3B; // small finite values
        }
    }
    w
}

#[derive(Clone, Copy)]
enum Path {
    F32(SimdLevel),
    Int8(SimdLevel),
}

impl Path {
    fn name(self) -> String {
        match self {
            Path::F32(l) => format!("{}-f32", l.name()),
            Path::Int8(l) => format!("{}-int8", l.name()),
        }
    }
}

fn paths(ty: GgmlType) -> Vec<Path> {
    let mut v = vec![];
    for l in SimdLevel::supported() {
        v.push(Path::F32(l));
        if Kernels::for_level(ty, l).unwrap().dot_q8.is_some() {
            v.push(Path::Int8(l));
        }
    }
    v
}

/// One matvec (quantizing the activations first for int8, as `matvec` does).
fn run(ty: GgmlType, path: Path, w: &[u8], cols: usize, x: &[f32], out: &mut [f32]) {
    let rb = ty.bytes_for(cols as u64).unwrap();
    match path {
        Path::F32(l) => {
            let k = Kernels::for_level(ty, l).unwrap();
            for (o, row) in out.iter_mut().zip(w.chunks_exact(rb)) {
                *o = (k.dot)(row, x);
            }
        }
        Path::Int8(l) => match Kernels::for_level(ty, l).unwrap().dot_q8.unwrap() {
            Q8Dot::Q8_0(f) => {
                let a = Q8_0Acts::new(x);
                for (o, row) in out.iter_mut().zip(w.chunks_exact(rb)) {
                    *o = f(row, a.as_slice());
                }
            }
            Q8Dot::Q8K(f) => {
                let a = Q8KActs::new(x);
                for (o, row) in out.iter_mut().zip(w.chunks_exact(rb)) {
                    *o = f(row, a.as_slice());
                }
            }
        },
    }
}

fn shapes() -> Vec<(usize, usize)> {
    let quick = std::env::var_os("SPARROW_BENCH_QUICK").is_some();
    SHAPES
        .into_iter()
        .filter(|&(r, _)| !(quick && r > 100_000))
        .collect()
}

/// Median wall time of `reps` runs.
fn median_time(reps: usize, mut f: impl FnMut()) -> Duration {
    let mut t: Vec<Duration> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[reps / 2]
}

fn bench(c: &mut Criterion) {
    let mut table = vec![];
    for (rows, cols) in shapes() {
        let x: Vec<f32> = xorshift_bytes(cols, &mut 9)
            .iter()
            .map(|&b| b as f32 / 128.0 - 1.0)
            .collect();
        for ty in FORMATS {
            if !cols.is_multiple_of(ty.block_elems()) {
                continue; // e.g. k-quants need 256 | cols: only the 4864-wide matrices
            }
            let w = weights(ty, rows, cols);
            let mut out = vec![0f32; rows];
            let mut g = c.benchmark_group(format!("matvec/{ty}/{rows}x{cols}"));
            g.throughput(Throughput::Bytes(w.len() as u64))
                .sample_size(10)
                .warm_up_time(Duration::from_millis(300))
                .measurement_time(Duration::from_secs(if rows > 100_000 { 4 } else { 1 }));
            let mut line = vec![];
            for p in paths(ty) {
                g.bench_function(p.name(), |b| {
                    b.iter(|| run(ty, p, black_box(&w), cols, black_box(&x), &mut out))
                });
                let t = median_time(5, || run(ty, p, &w, cols, &x, &mut out));
                line.push((p.name(), t, w.len() as f64 / t.as_secs_f64() / 1e9));
            }
            g.finish();
            table.push((format!("{ty} {rows}x{cols}"), line));
        }
    }
    println!("\n## matvec, 1 thread: speed-up over scalar-f32 (GB/s of weights)\n");
    for (name, line) in &table {
        let base = line[0].1.as_secs_f64();
        let cells: Vec<String> = line
            .iter()
            .map(|(p, t, gbs)| format!("{p} {:.1}x ({gbs:.1})", base / t.as_secs_f64()))
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
