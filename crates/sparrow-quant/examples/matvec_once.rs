//! One int8 matvec of a random matrix at a chosen SIMD level, on one thread and nothing
//! else: the workload `scripts/insn-count-aarch64.sh` runs under qemu to count guest
//! instructions per weight block (docs/aarch64.md).
//!
//! `matvec_once TYPE LEVEL ROWS COLS REPS`: quantizes a random activation vector once, then
//! runs the level's row kernel over every row `REPS` times (`REPS = 0` measures everything
//! around the kernel calls, which the script subtracts). Prints a checksum so the calls
//! cannot be optimized away. Bad arguments are reported, not panicked on.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::ExitCode;

use sparrow_quant::q8::{Q8Dot, Q8KActs, Q8_0Acts};
use sparrow_quant::{GgmlType, Kernels, SimdLevel};

use common::{fixed_scale_weights, xorshift_bytes};

fn parse_args() -> Result<(GgmlType, SimdLevel, usize, usize, usize), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [ty, level, rows, cols, reps] = args.as_slice() else {
        return Err("usage: matvec_once TYPE LEVEL ROWS COLS REPS".into());
    };
    let ty = GgmlType::all()
        .find(|t| t.name().eq_ignore_ascii_case(ty))
        .ok_or_else(|| format!("unknown type {ty}"))?;
    let level = SimdLevel::ALL
        .into_iter()
        .find(|l| l.name() == level.as_str())
        .ok_or_else(|| format!("unknown level {level}"))?;
    let num = |s: &str, what: &str| s.parse::<usize>().map_err(|e| format!("{what} '{s}': {e}"));
    let (rows, cols, reps) = (num(rows, "rows")?, num(cols, "cols")?, num(reps, "reps")?);
    if cols == 0 || !cols.is_multiple_of(256) {
        return Err(format!(
            "cols must be a positive multiple of 256, got {cols}"
        ));
    }
    Ok((ty, level, rows, cols, reps))
}

fn main() -> ExitCode {
    let (ty, level, rows, cols, reps) = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(k) = Kernels::for_level(ty, level) else {
        eprintln!(
            "error: no {} kernels for {ty} on this machine",
            level.name()
        );
        return ExitCode::FAILURE;
    };
    let Some(dot) = k.dot_q8 else {
        eprintln!("error: {ty} has no int8 kernel");
        return ExitCode::FAILURE;
    };
    let mut seed = 0x1234_5678_9abc_def1u64;
    let Some(row_bytes) = ty.bytes_for(cols as u64) else {
        eprintln!("error: {cols} columns are not whole {ty} blocks");
        return ExitCode::FAILURE;
    };
    let w = fixed_scale_weights(ty, rows * row_bytes, &mut seed, 0.01);
    let x: Vec<f32> = xorshift_bytes(cols, &mut seed)
        .iter()
        .map(|&b| b as f32 / 128.0 - 1.0)
        .collect();
    let (a0, ak) = (Q8_0Acts::new(&x), Q8KActs::new(&x));
    let mut sum = 0f64;
    for _ in 0..reps {
        for r in w.chunks_exact(row_bytes) {
            sum += match dot {
                Q8Dot::Q8_0(f) => f(r, a0.as_slice()),
                Q8Dot::Q8K(f) => f(r, ak.as_slice()),
            } as f64;
        }
    }
    println!(
        "{ty} {} {rows}x{cols} x{reps}: checksum {sum:e}",
        level.name()
    );
    ExitCode::SUCCESS
}
