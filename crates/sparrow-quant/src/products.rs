//! The (multi-threaded) products of a [`QMatrix`] with activations: [`matvec`] and its
//! variants for one token, [`matmul`] for a batch (through [`crate::gemm`]'s panels when the
//! batch is big enough).

use std::cell::RefCell;

use rayon::prelude::*;

use crate::error::check_len;
use crate::error::QuantError;
use crate::kernels::Kernels;
use crate::level::SimdLevel;
use crate::matrix::QMatrix;
use crate::q8::{Q8Dot, Q8DotMulti, Q8KActs, Q8KSlice, Q8_0Acts, Q8_0Slice};
use crate::q8_tiles::{Q8KRows, Q8KTiles, TILE_TOKENS};
use crate::row_groups::{GroupDot, GROUP_ROWS};
use crate::types::GgmlType;

/// Roughly how many weight bytes one parallel task walks (per token, for [`matmul`]).
///
/// Large enough that rayon's per-task cost (a few microseconds) is small against the work,
/// small enough that a 896-wide layer still splits into a dozen tasks for load balancing.
/// A matrix no bigger than one task runs on the calling thread, so tiny projections don't
/// pay for waking the pool at all.
const TASK_BYTES: usize = 32 * 1024;

/// The row kernel a product with `acts` uses on `m` (for a matrix in row groups on int8
/// activations, its group kernel).
fn row_dot(m: &QMatrix<'_>, acts: Acts) -> Result<Dot, QuantError> {
    let k = m.kernels()?;
    Ok(match (acts, k.dot_q8) {
        (Acts::Int8, Some(_)) if m.is_grouped() => Dot::Groups(group_kernel(k)),
        (Acts::Int8, Some(q)) => Dot::Int8(q),
        _ => Dot::F32(k.dot),
    })
}

/// Rows of `m` per parallel task when each row is walked `passes` times.
fn rows_per_task(m: &QMatrix<'_>, passes: usize) -> usize {
    let per_row = m.row_bytes().saturating_mul(passes).max(1);
    TASK_BYTES.div_ceil(per_row).max(1)
}

/// How each row's dot is computed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Acts {
    /// The int8 kernel when the format has one, else f32.
    Int8,
    /// Always the f32-activation kernel.
    F32,
}

fn matvec_multi_with(
    ms: &[QMatrix<'_>],
    x: &[f32],
    outs: &mut [&mut [f32]],
    acts: Acts,
) -> Result<(), QuantError> {
    check_len("outputs", ms.len(), outs.len())?;
    let (mut uses_q8_0, mut uses_q8k) = (false, false);
    for (m, out) in ms.iter().zip(outs.iter()) {
        check_len("x", m.cols(), x.len())?;
        check_len("out", m.rows(), out.len())?;
        match row_dot(m, acts)? {
            Dot::Int8(q) => {
                uses_q8_0 |= q.act_type() == GgmlType::Q8_0;
                uses_q8k |= q.act_type() == GgmlType::Q8_K;
            }
            Dot::Groups(GroupDot::Q8K(_)) => uses_q8k = true,
            Dot::Groups(GroupDot::Q8_0(_)) => uses_q8_0 = true,
            Dot::F32(_) => {}
        }
    }
    with_scratch(|s| {
        if uses_q8_0 {
            s.0.quantize_from(x);
        }
        if uses_q8k {
            s.1.quantize_from(x);
        }
        let (a0, ak) = (s.0.as_slice(), s.1.as_slice());
        // Rows `first..first + out.len()` of `m`, with its row kernel `dot`.
        let run = |m: &QMatrix<'_>, dot: Dot, first: usize, out: &mut [f32]| {
            let row = |j: usize| {
                let r = first + j;
                &m.data()[r * m.row_bytes()..(r + 1) * m.row_bytes()]
            };
            match dot {
                Dot::Groups(GroupDot::Q8K(f)) => run_groups(m, f, first, &[ak], &mut [out]),
                Dot::Groups(GroupDot::Q8_0(f)) => run_groups(m, f, first, &[a0], &mut [out]),
                Dot::F32(f) if m.is_grouped() => {
                    // f32 activations on row groups: each row put back together first
                    let mut buf = Vec::new();
                    for (j, v) in out.iter_mut().enumerate() {
                        *v = f(row_bytes_of(m, first + j, &mut buf), x);
                    }
                }
                Dot::Int8(Q8Dot::Q8_0(f)) => out
                    .iter_mut()
                    .enumerate()
                    .for_each(|(j, v)| *v = f(row(j), a0)),
                Dot::Int8(Q8Dot::Q8K(f)) => out
                    .iter_mut()
                    .enumerate()
                    .for_each(|(j, v)| *v = f(row(j), ak)),
                Dot::F32(f) => out
                    .iter_mut()
                    .enumerate()
                    .for_each(|(j, v)| *v = f(row(j), x)),
            }
        };
        // Each matrix in ~32 KiB chunks of rows, all of them one parallel pass (nested
        // rayon iterators: no task list is allocated); a single small matrix stays on the
        // calling thread.
        let chunked = |m: &QMatrix<'_>, out: &mut [f32]| {
            let dot = row_dot(m, acts).expect("kernels resolved above");
            let chunk = match m.is_grouped() {
                true => rows_per_task(m, 1).next_multiple_of(GROUP_ROWS),
                false => rows_per_task(m, 1),
            };
            if m.rows() <= chunk {
                run(m, dot, 0, out);
            } else {
                out.par_chunks_mut(chunk)
                    .enumerate()
                    .for_each(|(c, o)| run(m, dot, c * chunk, o));
            }
        };
        match (ms, outs) {
            ([m], [out]) => chunked(m, out),
            (ms, outs) => ms
                .par_iter()
                .zip(outs.par_iter_mut())
                .for_each(|(m, out)| chunked(m, out)),
        }
    });
    Ok(())
}

/// The row kernel a product uses.
#[derive(Clone, Copy)]
enum Dot {
    Int8(Q8Dot),
    /// A group kernel of a matrix in row groups.
    Groups(GroupDot),
    F32(fn(&[u8], &[f32]) -> f32),
}

thread_local! {
    /// Per-thread activation buffers for [`matvec`], so the token path does not allocate
    /// once they have grown to the model's widths.
    static SCRATCH: RefCell<(Q8_0Acts, Q8KActs)> = RefCell::default();
}

/// Runs `f` with this thread's activation scratch, or fresh buffers if it is in use (a
/// `matvec` nested inside another on the same thread, e.g. through rayon work stealing).
fn with_scratch(f: impl FnOnce(&mut (Q8_0Acts, Q8KActs))) {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Default::default()),
    })
}

/// `out = m * x`: `out[r] = dot_q8(row r, x)` for every row, `x.len() == m.cols()`,
/// `out.len() == m.rows()`.
///
/// For quantized weights, `x` is quantized once to 8-bit blocks and every row uses the
/// integer kernel ([`crate::dot_q8`]); float weights use [`crate::dot`]. Rows are split
/// into chunks of about 32 KiB of weights and run on the current rayon pool (see the crate
/// docs for choosing the thread count); a matrix of a single chunk runs on the calling
/// thread. Each output is exactly [`crate::dot_q8`] of its row: threading never changes
/// the result.
pub fn matvec(m: &QMatrix<'_>, x: &[f32], out: &mut [f32]) -> Result<(), QuantError> {
    matvec_multi_with(std::slice::from_ref(m), x, &mut [out], Acts::Int8)
}

/// Several products with the same input: `outs[i] = ms[i] * x`, each output exactly what
/// [`matvec`] gives, computed as *one* parallel pass over the rows of all the matrices
/// (e.g. a layer's q, k and v projections, or its gate and up projections). `x` is
/// quantized once per activation type rather than once per matrix, and the pool is woken
/// once, which matters in decode where each product is short.
pub fn matvec_multi(
    ms: &[QMatrix<'_>],
    x: &[f32],
    outs: &mut [&mut [f32]],
) -> Result<(), QuantError> {
    matvec_multi_with(ms, x, outs, Acts::Int8)
}

/// `out[j]` = row `rows[j]` of `m` times `x`, each exactly the value [`matvec`] gives that
/// row, for a few scattered rows (a draft model's logits for the rare tokens its context
/// holds, beside [`QMatrix::first_rows`] for the frequent ones). One thread: meant for
/// hundreds of rows, not a matrix. A matrix in row groups runs the group kernel over each
/// group a row falls in (once for neighbouring rows of one group) and keeps that row.
///
/// Errors: [`QuantError::LenMismatch`] for `x` or `out`, [`QuantError::RowOutOfRange`] for
/// a row past the end, [`QuantError::Unsupported`] for a format without kernels.
pub fn matvec_rows(
    m: &QMatrix<'_>,
    rows: &[u32],
    x: &[f32],
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_len("x", m.cols(), x.len())?;
    check_len("out", rows.len(), out.len())?;
    if let Some(&r) = rows.iter().find(|&&r| r as usize >= m.rows()) {
        return Err(QuantError::RowOutOfRange {
            row: r as usize,
            rows: m.rows(),
        });
    }
    let dot = row_dot(m, Acts::Int8)?;
    with_scratch(|s| match dot {
        Dot::Int8(Q8Dot::Q8_0(f)) => {
            s.0.quantize_from(x);
            let a = s.0.as_slice();
            for (o, &r) in out.iter_mut().zip(rows) {
                *o = f(m.row(r as usize), a);
            }
        }
        Dot::Int8(Q8Dot::Q8K(f)) => {
            s.1.quantize_from(x);
            let a = s.1.as_slice();
            for (o, &r) in out.iter_mut().zip(rows) {
                *o = f(m.row(r as usize), a);
            }
        }
        Dot::Groups(GroupDot::Q8K(kernel)) => {
            s.1.quantize_from(x);
            scattered_group_rows(m, kernel, s.1.as_slice(), rows, out);
        }
        Dot::Groups(GroupDot::Q8_0(kernel)) => {
            s.0.quantize_from(x);
            scattered_group_rows(m, kernel, s.0.as_slice(), rows, out);
        }
        Dot::F32(f) => {
            let mut buf = Vec::new();
            for (o, &r) in out.iter_mut().zip(rows) {
                *o = f(row_bytes_of(m, r as usize, &mut buf), x);
            }
        }
    });
    Ok(())
}

/// [`matvec_rows`] of a matrix in row groups: the group kernel over each group a row falls
/// in (once for neighbouring rows of one group), keeping that row.
fn scattered_group_rows<X: Copy>(
    m: &QMatrix<'_>,
    kernel: GroupKernel<X>,
    x: X,
    rows: &[u32],
    out: &mut [f32],
) {
    let blocks = m.cols() / m.ty().block_elems();
    let mut vals = [0f32; GROUP_ROWS];
    let mut computed = None;
    for (o, &r) in out.iter_mut().zip(rows) {
        let g = r as usize / GROUP_ROWS;
        if computed != Some(g) {
            kernel(m.group(g), blocks, &[x], &mut vals);
            computed = Some(g);
        }
        *o = vals[r as usize % GROUP_ROWS];
    }
}

/// [`matvec`] with f32 activations throughout: each output is exactly [`crate::dot`] of
/// its row (the reference semantics; slower for quantized weights).
pub fn matvec_f32(m: &QMatrix<'_>, x: &[f32], out: &mut [f32]) -> Result<(), QuantError> {
    matvec_multi_with(std::slice::from_ref(m), x, &mut [out], Acts::F32)
}

/// Batched product: for each of `n_tokens` activation rows `xs[t*cols..(t+1)*cols]`,
/// `out[t*rows + r] = dot_q8(row r, x_t)`. `n_tokens` is `xs.len() / m.cols()`; `out` must
/// hold `n_tokens * m.rows()`.
///
/// Each token's activations are quantized once, as in [`matvec`]. Where the active level
/// has a panel kernel (AVX-512 VNNI and AVX2 from 16 tokens), the weights are
/// decoded 32 rows at a time and every token runs through the decoded panel (see
/// [`crate::gemm`]): the integer sums equal [`crate::dot_q8`]'s, the per-group f32 scaling
/// is ordered differently, so results agree with it to f32 rounding. Otherwise, where the
/// level has a rows kernel ([`Kernels::dot_q8_rows`]: AMX, Q4_K and Q6_K, from 8 and 16
/// tokens) the weights are multiplied sixteen rows by up to sixteen tokens at a time in the
/// tile unit; else each weight row is dotted against every token while it sits in L1
/// (through the multi-token kernel, [`Kernels::dot_q8_multi`], where the level has one:
/// each block unpacked once per group of tokens). Both give results equal to
/// [`crate::dot_q8`] exactly. A matrix in row groups ([`QMatrix::new_grouped`]) runs its
/// group kernel at every batch size below the panels' threshold, one token included, so
/// there too every token's outputs are what [`matvec`] gives it alone (a Q5_0 matrix in
/// row groups takes the panels from their threshold, as the other layouts do).
pub fn matmul(m: &QMatrix<'_>, xs: &[f32], out: &mut [f32]) -> Result<(), QuantError> {
    matmul_with(m, xs, out, Acts::Int8, m.kernels()?, Panels::Allowed)
}

/// [`matmul`] without the panel kernels: each token's outputs have exactly the bits
/// [`matvec`] gives it alone, at any batch size (the weights are still read once for all
/// tokens). For passes whose rows must match one-token passes to the bit — speculative
/// decoding's checks of drafted tokens.
pub fn matmul_rowwise(m: &QMatrix<'_>, xs: &[f32], out: &mut [f32]) -> Result<(), QuantError> {
    matmul_with(m, xs, out, Acts::Int8, m.kernels()?, Panels::Never)
}

/// Several batched products with the same input rows: `outs[i] = ms[i] * xs`, each output
/// exactly what [`matmul`] gives (`rowwise`: what [`matmul_rowwise`] gives). Where every
/// matrix is in row groups and the batch runs their group kernels (below the panels'
/// threshold, or `rowwise`), the rows are quantized once per activation type rather than
/// once per matrix and all the matrices are *one* parallel pass — a layer's q, k and v
/// projections, or its gate and up, in a speculative check or a batch of decode steps,
/// where each product is short and a pass per matrix leaves threads waiting on the small
/// ones. Otherwise each product runs on its own.
pub fn matmul_multi(
    ms: &[QMatrix<'_>],
    xs: &[f32],
    outs: &mut [&mut [f32]],
    rowwise: bool,
) -> Result<(), QuantError> {
    check_len("outputs", ms.len(), outs.len())?;
    let panels = match rowwise {
        true => Panels::Never,
        false => Panels::Allowed,
    };
    let n_tokens = ms.first().map_or(0, |m| xs.len() / m.cols().max(1));
    let mut fused = ms.iter().all(|m| m.is_grouped() && m.cols() > 0)
        && ms
            .first()
            .is_some_and(|m| ms.iter().all(|o| o.cols() == m.cols()));
    for m in ms {
        fused &= !takes_panels(m.kernels()?, m, n_tokens, Acts::Int8, panels);
    }
    if !fused {
        for (m, out) in ms.iter().zip(outs.iter_mut()) {
            matmul_with(m, xs, out, Acts::Int8, m.kernels()?, panels)?;
        }
        return Ok(());
    }
    let cols = ms[0].cols();
    if !xs.len().is_multiple_of(cols) {
        return Err(QuantError::LenMismatch {
            what: "xs (not a whole number of cols-long rows)",
            expected: xs.len() / cols * cols,
            actual: xs.len(),
        });
    }
    let mut dots = Vec::with_capacity(ms.len());
    for (m, out) in ms.iter().zip(outs.iter()) {
        check_len("out", n_tokens * m.rows(), out.len())?;
        dots.push(group_kernel(m.kernels()?));
    }
    if n_tokens == 0 {
        return Ok(());
    }
    let uses = |q8k: bool| dots.iter().any(|d| matches!(d, GroupDot::Q8K(_)) == q8k);
    let tokens = || xs.chunks_exact(cols);
    let a8k: Vec<Q8KActs> = match uses(true) {
        true => tokens().map(Q8KActs::new).collect(),
        false => Vec::new(),
    };
    let a80: Vec<Q8_0Acts> = match uses(false) {
        true => tokens().map(Q8_0Acts::new).collect(),
        false => Vec::new(),
    };
    let s8k: Vec<Q8KSlice<'_>> = a8k.iter().map(|a| a.as_slice()).collect();
    let s80: Vec<Q8_0Slice<'_>> = a80.iter().map(|a| a.as_slice()).collect();
    let run = |(m, dot, out): (&QMatrix<'_>, &GroupDot, &mut &mut [f32])| match *dot {
        GroupDot::Q8K(kernel) => matmul_groups(m, kernel, &s8k, out),
        GroupDot::Q8_0(kernel) => matmul_groups(m, kernel, &s80, out),
    };
    // One parallel pass: every matrix's chunks of groups are tasks of the same pool
    // (nested rayon iterators), so a thread done with a small matrix takes a big one's.
    ms.par_iter()
        .zip(dots.par_iter())
        .zip(outs.par_iter_mut())
        .map(|((m, d), o)| (m, d, o))
        .for_each(run);
    Ok(())
}

/// [`matmul`] with the kernels of `level` rather than the active one (for tests and
/// benchmarks). [`QuantError::Unsupported`] if the level is not supported here.
#[doc(hidden)]
pub fn matmul_at_level(
    level: SimdLevel,
    m: &QMatrix<'_>,
    xs: &[f32],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let k = m.kernels_at(level)?;
    matmul_with(m, xs, out, Acts::Int8, k, Panels::Allowed)
}

/// [`matmul`] with f32 activations throughout: results equal [`crate::dot`] exactly.
pub fn matmul_f32(m: &QMatrix<'_>, xs: &[f32], out: &mut [f32]) -> Result<(), QuantError> {
    matmul_with(m, xs, out, Acts::F32, m.kernels()?, Panels::Allowed)
}

/// Whether a batched product of `n` tokens of `m` with kernels `k` goes through the panels
/// (else through the row or group kernels).
fn takes_panels(k: &Kernels, m: &QMatrix<'_>, n: usize, acts: Acts, panels: Panels) -> bool {
    acts == Acts::Int8
        && panels == Panels::Allowed
        && k.dot_q8.is_some()
        && (!m.is_grouped() || crate::gemm::reads_groups(m.ty()))
        && crate::gemm::panels_take(k.level, m, n)
}

/// Whether a batched product may take the panel kernels (faster for many tokens, equal to
/// the one-token product only to f32 rounding).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Panels {
    Allowed,
    Never,
}

fn matmul_with(
    m: &QMatrix<'_>,
    xs: &[f32],
    out: &mut [f32],
    acts: Acts,
    k: &Kernels,
    panels: Panels,
) -> Result<(), QuantError> {
    let n_tokens = if m.cols() > 0 {
        if !xs.len().is_multiple_of(m.cols()) {
            return Err(QuantError::LenMismatch {
                what: "xs (not a whole number of cols-long rows)",
                expected: xs.len() / m.cols() * m.cols(),
                actual: xs.len(),
            });
        }
        xs.len() / m.cols()
    } else {
        // zero-width matrix: the token count can only come from `out`
        match out.len().checked_div(m.rows()) {
            Some(n) => n,
            None => return check_len("out", 0, out.len()),
        }
    };
    let expected_out = n_tokens
        .checked_mul(m.rows())
        .ok_or(QuantError::SizeOverflow {
            rows: n_tokens,
            cols: m.rows(),
        })?;
    check_len("out", expected_out, out.len())?;
    if n_tokens == 0 || m.rows() == 0 {
        return Ok(());
    }
    if m.cols() == 0 {
        out.fill(0.0);
        return Ok(());
    }
    // The panels from their threshold, for a matrix in row groups too where they read its
    // groups (Q5_0): a long prompt's prefill at their speed.
    if takes_panels(k, m, n_tokens, acts, panels)
        && crate::gemm::matmul_panels(k.level, m, &xs[..n_tokens * m.cols()], n_tokens, out)
    {
        return Ok(());
    }
    if m.is_grouped() {
        if acts == Acts::Int8 {
            let tokens = || xs.chunks_exact(m.cols()).take(n_tokens);
            match group_kernel(k) {
                GroupDot::Q8K(kernel) => {
                    let a: Vec<Q8KActs> = tokens().map(Q8KActs::new).collect();
                    let slices: Vec<Q8KSlice<'_>> = a.iter().map(|a| a.as_slice()).collect();
                    matmul_groups(m, kernel, &slices, out);
                }
                GroupDot::Q8_0(kernel) => {
                    let a: Vec<Q8_0Acts> = tokens().map(Q8_0Acts::new).collect();
                    let slices: Vec<Q8_0Slice<'_>> = a.iter().map(|a| a.as_slice()).collect();
                    matmul_groups(m, kernel, &slices, out);
                }
            }
        } else {
            let x: Vec<&[f32]> = xs.chunks_exact(m.cols()).take(n_tokens).collect();
            matmul_rows(m, n_tokens, 1, out, |row, o| {
                o.iter_mut().zip(&x).for_each(|(v, x)| *v = (k.dot)(row, x))
            });
        }
        return Ok(());
    }
    let tokens = || xs.chunks_exact(m.cols()).take(n_tokens);
    let tiles = (n_tokens >= tile_min_tokens(k.ty))
        .then_some(k.dot_q8_rows)
        .flatten();
    if let (Acts::Int8, Some(Q8Dot::Q8K(_)), Some(rows)) = (acts, k.dot_q8, tiles) {
        let a: Vec<Q8KActs> = tokens().map(Q8KActs::new).collect();
        matmul_tiles(m, &a, rows, out);
        return Ok(());
    }
    // Below the panel threshold each weight row is dotted with every token while it sits in
    // L1: through the multi-token kernel where the level has one (each block unpacked once
    // for a group of tokens, results bit-identical to `dot_q8`), else once per token.
    match (acts, k.dot_q8, k.dot_q8_multi) {
        (Acts::Int8, Some(Q8Dot::Q8_0(f)), multi) => {
            let a: Vec<Q8_0Acts> = tokens().map(Q8_0Acts::new).collect();
            let multi = match multi {
                Some(Q8DotMulti::Q8_0(g)) => Some(g),
                _ => None,
            };
            matmul_int8(
                m,
                out,
                &a.iter().map(|a| a.as_slice()).collect::<Vec<_>>(),
                f,
                multi,
            )
        }
        (Acts::Int8, Some(Q8Dot::Q8K(f)), multi) => {
            let a: Vec<Q8KActs> = tokens().map(Q8KActs::new).collect();
            let multi = match multi {
                Some(Q8DotMulti::Q8K(g)) => Some(g),
                _ => None,
            };
            matmul_int8(
                m,
                out,
                &a.iter().map(|a| a.as_slice()).collect::<Vec<_>>(),
                f,
                multi,
            )
        }
        _ => {
            let x: Vec<&[f32]> = tokens().collect();
            matmul_rows(m, n_tokens, 1, out, |row, o| {
                o.iter_mut().zip(&x).for_each(|(v, x)| *v = (k.dot)(row, x))
            });
        }
    }
    Ok(())
}

/// A multi-token int8 kernel on activations `X` (see [`Q8DotMulti`]).
type MultiDot<X> = fn(&[u8], &[X], &mut [f32]);

/// [`matmul_rows`] through an int8 kernel, the tokens' activations `acts` already
/// quantized: the multi-token kernel where the level has one (each block unpacked once for
/// a group of tokens, results bit-identical to `dot`), else `dot` once per token.
fn matmul_int8<X: Copy + Sync>(
    m: &QMatrix<'_>,
    out: &mut [f32],
    acts: &[X],
    dot: fn(&[u8], X) -> f32,
    multi: Option<MultiDot<X>>,
) {
    let n_tokens = acts.len();
    match multi {
        Some(g) => matmul_rows(m, n_tokens, MULTI_WIDTH, out, |row, o| g(row, acts, o)),
        None => matmul_rows(m, n_tokens, 1, out, |row, o| {
            o.iter_mut().zip(acts).for_each(|(v, &x)| *v = dot(row, x))
        }),
    }
}

/// Tokens a multi-token kernel takes per pass over a weight row, roughly (the x86 kernels
/// take 2 to 8 by format and level), for sizing parallel tasks by the passes they make.
const MULTI_WIDTH: usize = 4;

/// The fewest tokens a product of `ty` runs through a rows kernel
/// ([`Kernels::dot_q8_rows`]) for. Below it the multi-token row kernels (same bits) are
/// faster: a tile product costs about as much as the row kernels' work for two tokens,
/// whatever the token count, and on a two-thread host whose threads seem to share one tile
/// unit the tiles gain little from the second thread. Measured (`cargo run --release -p
/// sparrow-quant --example kernel_speed 2`, tiles at every count against the AVX-512 row
/// kernels, GMAC/s): Q4_K 8960 × 1536, 4 tokens 83.7 vs 86.5, 8 tokens 143.7 vs 98.9, 16
/// tokens 217.1 vs 99.4 (and a whole 4-row pass of the 1.5B model was 0.9× with tiles);
/// Q6_K 896 × 4864 (16-column sub-blocks: twice the tile products and scalings), 8 tokens
/// 64.3 vs 74.2, 16 tokens 93.6 vs 77.5.
fn tile_min_tokens(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q6_K => 16,
        _ => 8,
    }
}

/// [`matmul`] through a rows kernel (a matrix unit's): the tokens in sets of up to
/// [`TILE_TOKENS`], each rearranged once ([`Q8KTiles`]) and run through every row in
/// parallel chunks of whole tiles (16 rows). Results equal [`crate::dot_q8`] exactly (the
/// rows kernel's contract).
fn matmul_tiles(m: &QMatrix<'_>, acts: &[Q8KActs], rows_kernel: Q8KRows, out: &mut [f32]) {
    let chunk = rows_per_task(m, 1).next_multiple_of(16);
    for (set, tokens) in acts.chunks(TILE_TOKENS).enumerate() {
        let slices: Vec<_> = tokens.iter().map(|a| a.as_slice()).collect();
        let tiles = Q8KTiles::new(&slices);
        let n = tokens.len();
        let set_out = &mut out[set * TILE_TOKENS * m.rows()..][..n * m.rows()];
        par_row_chunks(m, n, chunk, set_out, |c, outs| {
            let rows = outs[0].len();
            let first = c * chunk;
            let data = &m.data()[first * m.row_bytes()..(first + rows) * m.row_bytes()];
            let mut vals = vec![0f32; rows * n];
            rows_kernel(data, rows, &tiles, &mut vals);
            for (t, o) in outs.iter_mut().enumerate() {
                for (j, v) in o.iter_mut().enumerate() {
                    *v = vals[j * n + t];
                }
            }
        });
    }
}

/// `out[t * rows + r]` for every token `t` and row `r`, `f(row r, o)` writing row `r`'s
/// value for every token into `o` (`n_tokens` long); parallel over chunks of rows, sized as
/// `n_tokens / per_pass` passes over each row.
fn matmul_rows(
    m: &QMatrix<'_>,
    n_tokens: usize,
    per_pass: usize,
    out: &mut [f32],
    f: impl Fn(&[u8], &mut [f32]) + Sync,
) {
    let chunk = rows_per_task(m, n_tokens.div_ceil(per_pass));
    par_row_chunks(m, n_tokens, chunk, out, |c, outs| {
        let mut stack = [0f32; 16];
        let mut heap = Vec::new();
        let vals: &mut [f32] = if n_tokens <= stack.len() {
            &mut stack[..n_tokens]
        } else {
            heap.resize(n_tokens, 0.0);
            &mut heap
        };
        let rows = outs.first().map_or(0, |o| o.len());
        let mut ungrouped = Vec::new();
        for j in 0..rows {
            f(row_bytes_of(m, c * chunk + j, &mut ungrouped), vals);
            for (o, &v) in outs.iter_mut().zip(vals.iter()) {
                o[j] = v;
            }
        }
    });
}

/// Runs `run(c, outs)` for each chunk `c` of `chunk` rows of `m`, in parallel, `outs[t]`
/// being token `t`'s outputs for those rows (`out` holds `n_tokens` × `m.rows()`,
/// token-major). Each task writes its rows of every token's output directly (the outputs
/// are split into per-chunk, per-token slices up front), so nothing is transposed
/// afterwards.
fn par_row_chunks(
    m: &QMatrix<'_>,
    n_tokens: usize,
    chunk: usize,
    out: &mut [f32],
    run: impl Fn(usize, &mut [&mut [f32]]) + Sync,
) {
    let n_chunks = m.rows().div_ceil(chunk);
    // Chunk-major: chunk `c`'s slice of token 0's outputs, of token 1's, ...
    let mut per_token: Vec<_> = out
        .chunks_exact_mut(m.rows())
        .map(|o| o.chunks_mut(chunk))
        .collect();
    let mut parts: Vec<&mut [f32]> = Vec::with_capacity(n_chunks * n_tokens);
    for _ in 0..n_chunks {
        for it in per_token.iter_mut() {
            parts.extend(it.next());
        }
    }
    if n_chunks == 1 {
        run(0, &mut parts);
    } else {
        parts
            .par_chunks_mut(n_tokens)
            .enumerate()
            .for_each(|(c, outs)| run(c, outs));
    }
}

/// The row-group kernel of a matrix in row groups with kernels `k`: the level's own, else
/// the portable one (same bits: every group kernel computes
/// [`crate::row_groups::q4_k_group_scalar`]'s numerics).
fn group_kernel(k: &Kernels) -> GroupDot {
    k.dot_q8_groups
        .or(crate::row_groups::scalar_kernel(k.ty))
        .expect("only formats with row groups are stored in them")
}

/// A row-group kernel on activations `X` (see [`GroupDot`]).
type GroupKernel<X> = fn(&[u8], usize, &[X], &mut [f32]);

/// Rows `first .. first + outs[0].len()` of `m` (in row groups; `first` and the count
/// whole groups, or the count reaching the last row) against every token of `xs`:
/// `outs[t][j]` is row `first + j` for token `t`.
fn run_groups<X>(
    m: &QMatrix<'_>,
    kernel: GroupKernel<X>,
    first: usize,
    xs: &[X],
    outs: &mut [&mut [f32]],
) {
    let rows = outs.first().map_or(0, |o| o.len());
    let blocks = m.cols() / m.ty().block_elems();
    // On the stack for a decode step's or a check's few tokens (no allocation per task).
    let mut stack = [0f32; 8 * GROUP_ROWS];
    let mut heap = Vec::new();
    let vals: &mut [f32] = if xs.len() <= 8 {
        &mut stack[..xs.len() * GROUP_ROWS]
    } else {
        heap.resize(xs.len() * GROUP_ROWS, 0.0);
        &mut heap
    };
    for j in (0..rows).step_by(GROUP_ROWS) {
        kernel(m.group((first + j) / GROUP_ROWS), blocks, xs, vals);
        for (t, o) in outs.iter_mut().enumerate() {
            o[j..j + GROUP_ROWS].copy_from_slice(&vals[t * GROUP_ROWS..][..GROUP_ROWS]);
        }
    }
}

/// [`matmul`] of a matrix in row groups: parallel over chunks of whole groups, each group
/// run against every token (the kernel takes them a few at a time, the group's weights
/// staying in cache).
fn matmul_groups<X: Sync>(m: &QMatrix<'_>, kernel: GroupKernel<X>, xs: &[X], out: &mut [f32]) {
    let chunk = rows_per_task(m, xs.len().div_ceil(MULTI_WIDTH)).next_multiple_of(GROUP_ROWS);
    par_row_chunks(m, xs.len(), chunk, out, |c, outs| {
        run_groups(m, kernel, c * chunk, xs, outs)
    });
}

/// Row `r` of `m` in ggml's (or the packed) layout: the matrix's own bytes, or for a
/// matrix in row groups the row put back together in `buf`.
fn row_bytes_of<'a: 'b, 'b>(m: &QMatrix<'a>, r: usize, buf: &'b mut Vec<u8>) -> &'b [u8] {
    if m.is_grouped() {
        buf.resize(m.row_bytes(), 0);
        crate::row_groups::ungroup_row(m.ty(), m.group(r / GROUP_ROWS), r % GROUP_ROWS, buf);
        buf
    } else {
        &m.data()[r * m.row_bytes()..(r + 1) * m.row_bytes()]
    }
}
