//! Every SIMD level compiled and supported here (each forced explicitly through
//! `Kernels::for_level`, not only the active one) against the scalar reference, for every
//! format, on random blocks that include edge scales (zero, f16 subnormals, the f16
//! maximum, both signs); and the int8-activation path against the f32 reference.
//!
//! Tolerances, all relative to a magnitude `M` at which f32 rounding happens
//! (`EPS = 2^-24`):
//!
//! * f32 activations, SIMD vs scalar: both sum `n` products in f32 (the scalar in 8 lanes
//!   with f64 carries, the SIMD kernels in 8- or 16-lane vectors plus a final reduction), so
//!   each is within `(n / 8 + 16) * EPS * M` of the exact value, `M = sum |w_i x_i|`;
//!   the test allows the sum of the two.
//! * int8 activations, SIMD vs scalar: the integer sums are exact in both, so only the
//!   few f32 operations per block differ (scale products, lane-wise scaling, accumulation
//!   across `nb` blocks): `2 * (nb + 16) * EPS * M`, where `M` sums the magnitudes of both
//!   terms `|scale part| + |minimum part|` of each weight times the dequantized activation
//!   (the terms are computed separately, so cancellation between them must not shrink M).
//! * int8 vs f32: `q8::act_error_bound` (the activation rounding, derived in `q8`'s docs)
//!   plus the two f32 errors above.

mod common;

use common::{random_row, Rng, SUPPORTED};
use sparrow_quant::q8::{act_error_bound, Q8Dot, Q8KActs, Q8_0Acts};
use sparrow_quant::{dequantize, GgmlType, Kernels, SimdLevel};

const EPS: f64 = 1.0 / (1u64 << 24) as f64;

/// The formats these tests cover are exactly those with kernels: a format added to the
/// catalogue fails here until the tests (and `common`'s block builders) know it.
#[test]
fn the_tests_cover_every_format_with_kernels() {
    let with_kernels: Vec<GgmlType> = GgmlType::all().filter(|t| t.has_kernels()).collect();
    assert_eq!(with_kernels.len(), SUPPORTED.len(), "{with_kernels:?}");
    assert!(
        with_kernels.iter().all(|t| SUPPORTED.contains(t)),
        "{with_kernels:?}"
    );
}

/// Byte offset and kind of each block's scale fields: `(offset, is_f32)`.
fn scale_fields(ty: GgmlType) -> &'static [(usize, bool)] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[(0, false)],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
            &[(0, false), (2, false)]
        }
        GgmlType::Q2_K => &[(80, false), (82, false)],
        GgmlType::Q3_K => &[(108, false)],
        GgmlType::Q6_K => &[(208, false)],
        GgmlType::Q8_K => &[(0, true)],
        _ => &[],
    }
}

/// The byte offset of the multiplicative scale `d` (zeroing it leaves the minimum part).
fn d_field(ty: GgmlType) -> Option<usize> {
    scale_fields(ty).first().map(|f| f.0)
}

/// Edge values for scale fields, cycled through the blocks after the first few random ones.
const EDGE_F16: [u16; 7] = [
    0x0000, // +0
    0x8000, // -0
    0x0001, // smallest subnormal
    0x83FF, // largest subnormal, negative
    0x0400, // smallest normal
    0x7BFF, // max f16 (65504)
    0xFBFF, // -65504
];
const EDGE_F32: [f32; 5] = [0.0, -0.0, 1e-40, 65504.0, -3.0e-5];

/// A random row of `n` elements whose blocks, from the fourth on, have their scale fields
/// replaced by edge values (each field independently).
fn edge_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let mut row = random_row(rng, ty, n);
    if scale_fields(ty).is_empty() {
        return row;
    }
    for (i, b) in row.chunks_exact_mut(ty.block_bytes()).enumerate().skip(3) {
        for (k, &(off, is_f32)) in scale_fields(ty).iter().enumerate() {
            let pick = (i * 3 + k * 5 + rng.next_u64() as usize % 2) % 9;
            if is_f32 {
                if let Some(v) = EDGE_F32.get(pick) {
                    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
                }
            } else if let Some(v) = EDGE_F16.get(pick) {
                b[off..off + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    row
}

/// Float rows with edge values mixed in (zeros, subnormals, the format's large values).
fn float_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let mut row = random_row(rng, ty, n);
    let eb = ty.block_bytes();
    for (i, e) in row.chunks_exact_mut(eb).enumerate() {
        let edge: Option<f32> = match i % 11 {
            3 => Some(0.0),
            5 => Some(if ty == GgmlType::F16 { 6.0e-8 } else { 1e-40 }),
            7 => Some(if ty == GgmlType::F16 { -65504.0 } else { 3.0e4 }),
            _ => None,
        };
        if let Some(v) = edge {
            match ty {
                GgmlType::F32 => e.copy_from_slice(&v.to_le_bytes()),
                GgmlType::F16 => e.copy_from_slice(&half::f16::from_f32(v).to_le_bytes()),
                _ => e.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            }
        }
    }
    row
}

fn row_for(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    if ty.block_elems() == 1 {
        float_row(rng, ty, n)
    } else {
        edge_row(rng, ty, n)
    }
}

/// Activations with varied block magnitudes: ordinary, tiny (below f16's normal range once
/// divided by 127), large, and an all-zero block.
fn activations(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut x = rng.vec(n);
    for (i, c) in x.chunks_mut(32).enumerate() {
        let s = match i % 6 {
            1 => 1e-6,
            3 => 300.0,
            4 => 0.0,
            _ => 1.0,
        };
        c.iter_mut().for_each(|v| *v *= s);
    }
    x
}

fn dequant(ty: GgmlType, row: &[u8]) -> Vec<f32> {
    let n = row.len() / ty.block_bytes() * ty.block_elems();
    let mut w = vec![0f32; n];
    dequantize(ty, row, &mut w).unwrap();
    w
}

fn abs_dot(w: &[f32], x: &[f32]) -> f64 {
    w.iter()
        .zip(x)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum()
}

/// `sum_i (|scale part_i| + |min part_i|) * |x_i|`: the min part is the row dequantized with
/// every `d` zeroed.
fn split_magnitude(ty: GgmlType, row: &[u8], x: &[f32]) -> f64 {
    let w = dequant(ty, row);
    let mut mins = row.to_vec();
    if let Some(off) = d_field(ty) {
        let width = if ty == GgmlType::Q8_K { 4 } else { 2 };
        for b in mins.chunks_exact_mut(ty.block_bytes()) {
            b[off..off + width].fill(0);
        }
    }
    let m = dequant(ty, &mins);
    w.iter()
        .zip(&m)
        .zip(x)
        .map(|((&w, &m), &x)| ((w as f64 - m as f64).abs() + (m as f64).abs()) * (x as f64).abs())
        .sum()
}

fn simd_levels() -> Vec<SimdLevel> {
    let l: Vec<_> = SimdLevel::supported()
        .into_iter()
        .filter(|&l| l != SimdLevel::Scalar)
        .collect();
    eprintln!("SIMD levels tested here: {l:?}");
    l
}

/// On AArch64 the NEON kernels are always compiled in and usable, so the tests above must
/// see them (the `dotprod` level too where the CPU has it): a run that fell back to testing
/// nothing but the scalar path would pass for the wrong reason.
#[cfg(target_arch = "aarch64")]
#[test]
fn aarch64_tests_the_neon_levels() {
    let levels = simd_levels();
    assert!(levels.contains(&SimdLevel::Neon), "{levels:?}");
    assert_eq!(
        levels.contains(&SimdLevel::NeonDot),
        std::arch::is_aarch64_feature_detected!("dotprod")
    );
    assert!(levels
        .iter()
        .all(|l| matches!(l, SimdLevel::Neon | SimdLevel::NeonDot)));
}

const BLOCK_COUNTS: [usize; 3] = [1, 3, 17];

fn f32_tol(n: usize, mag: f64) -> f64 {
    2.0 * (n as f64 / 8.0 + 16.0) * EPS * mag
}

#[test]
fn simd_f32_dot_matches_scalar_for_every_format_and_level() {
    let mut rng = Rng::new(21);
    for level in simd_levels() {
        for &ty in SUPPORTED {
            let fast = Kernels::for_level(ty, level).unwrap();
            let slow = Kernels::scalar(ty).unwrap();
            // float formats: odd lengths too, to cover the vector tails
            let lens: Vec<usize> = if ty.block_elems() == 1 {
                vec![1, 7, 15, 16, 33, 100, 4864]
            } else {
                BLOCK_COUNTS.iter().map(|b| b * ty.block_elems()).collect()
            };
            for n in lens {
                for _ in 0..3 {
                    let row = row_for(&mut rng, ty, n);
                    let x = activations(&mut rng, n);
                    let (a, b) = ((fast.dot)(&row, &x) as f64, (slow.dot)(&row, &x) as f64);
                    let tol = f32_tol(n, abs_dot(&dequant(ty, &row), &x));
                    assert!(
                        (a - b).abs() <= tol,
                        "{ty} {level:?} n={n}: simd {a:e} vs scalar {b:e}, tol {tol:e}"
                    );
                }
            }
        }
    }
}

/// Runs the int8 kernel with already quantized activations.
fn run_q8(q: Q8Dot, row: &[u8], a0: &Q8_0Acts, ak: &Q8KActs) -> f32 {
    match q {
        Q8Dot::Q8_0(f) => f(row, a0.as_slice()),
        Q8Dot::Q8K(f) => f(row, ak.as_slice()),
    }
}

#[test]
fn simd_int8_dot_matches_scalar_int8_for_every_format_and_level() {
    let mut rng = Rng::new(22);
    for level in simd_levels() {
        for &ty in SUPPORTED {
            let Some(slow) = Kernels::scalar(ty).unwrap().dot_q8 else {
                continue;
            };
            let fast = Kernels::for_level(ty, level).unwrap().dot_q8.unwrap();
            assert_eq!(fast.act_type(), slow.act_type());
            for nb in BLOCK_COUNTS {
                let n = nb * ty.block_elems();
                for _ in 0..4 {
                    let row = edge_row(&mut rng, ty, n);
                    let x = activations(&mut rng, n);
                    let n8 = n.div_ceil(256) * 256; // Q8_K needs whole 256-blocks
                    let a0 = Q8_0Acts::new(&x);
                    let mut xk = x.clone();
                    xk.resize(n8, 0.0);
                    let ak = Q8KActs::new(&xk);
                    let xdq = if fast.act_type() == GgmlType::Q8_0 {
                        a0.dequantize()
                    } else {
                        ak.dequantize()
                    };
                    let a = run_q8(fast, &row, &a0, &ak) as f64;
                    let b = run_q8(slow, &row, &a0, &ak) as f64;
                    let blocks = n / ty.block_elems();
                    let tol = 2.0 * (blocks as f64 + 16.0) * EPS * split_magnitude(ty, &row, &xdq);
                    assert!(
                        (a - b).abs() <= tol,
                        "{ty} {level:?} n={n}: simd int8 {a:e} vs scalar int8 {b:e}, tol {tol:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn int8_dot_matches_f32_reference_within_activation_rounding() {
    let mut rng = Rng::new(23);
    for level in SimdLevel::supported() {
        for &ty in SUPPORTED {
            let k = Kernels::for_level(ty, level).unwrap();
            let Some(q) = k.dot_q8 else { continue };
            let reference = Kernels::scalar(ty).unwrap().dot;
            let mut worst = 0f64;
            for nb in BLOCK_COUNTS {
                let n = nb * ty.block_elems();
                for _ in 0..4 {
                    let row = random_row(&mut rng, ty, n);
                    let x = activations(&mut rng, n);
                    let w = dequant(ty, &row);
                    let got = q.quantize_and_dot(&row, &x) as f64;
                    let want = reference(&row, &x) as f64;
                    let bound = act_error_bound(q.act_type(), &w, &x);
                    let mag = split_magnitude(ty, &row, &x) * 1.01; // activations moved by <1%
                    let tol = bound + f32_tol(n, mag);
                    worst = worst.max((got - want).abs() / bound.max(f64::MIN_POSITIVE));
                    assert!(
                        (got - want).abs() <= tol,
                        "{ty} {level:?} n={n}: int8 {got:e} vs f32 {want:e}, \
                         |diff| {:e} > bound {bound:e} + f32 slack",
                        (got - want).abs()
                    );
                }
            }
            eprintln!("{ty} {level:?}: worst |int8 - f32| / bound = {worst:.3}");
        }
    }
}

#[test]
fn activation_quantizers_follow_ggml() {
    let mut rng = Rng::new(24);
    let x = activations(&mut rng, 512);
    let a = Q8_0Acts::new(&x);
    let s = a.as_slice();
    assert_eq!((s.len(), s.d.len(), s.sum.len()), (512, 16, 16));
    for (b, xb) in x.chunks_exact(32).enumerate() {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(s.d[b], half::f16::from_f32(amax / 127.0).to_f32());
        let q = &s.qs[32 * b..32 * b + 32];
        assert_eq!(s.sum[b], q.iter().map(|&v| v as i32).sum::<i32>());
        assert!(q.iter().all(|&v| v != -128));
    }
    let k = Q8KActs::new(&x);
    let s = k.as_slice();
    assert_eq!((s.len(), s.d.len(), s.bsums.len()), (512, 2, 32));
    for (g, q) in s.qs.chunks_exact(16).enumerate() {
        assert_eq!(s.bsums[g], q.iter().map(|&v| v as i16).sum::<i16>());
        assert!(q.iter().all(|&v| v != -128));
    }
    // all-zero input gives zero scales and quants, not NaN
    let z = Q8KActs::new(&[0.0; 256]);
    assert_eq!(z.as_slice().d, &[0.0]);
    assert!(Q8_0Acts::new(&[0.0; 32])
        .dequantize()
        .iter()
        .all(|&v| v == 0.0));
}

/// Checks `matmul` at every supported level (through the panel kernels where the level
/// has one and the batch is big enough) and the portable panel reference against the
/// scalar int8 kernel row by row. The integer sums are exact; the f32 work per group
/// differs in order, so the tolerance is the int8-vs-int8 one with one term per scale
/// group (16 elements).
fn check_batched(ty: GgmlType, m: &sparrow_quant::QMatrix<'_>, xs: &[f32], what: &str) {
    check_batched_against(ty, m, m, xs, what)
}

/// [`check_batched`] for a matrix `m` whose rows may be packed, with the reference computed
/// on `reference` (the same matrix in ggml's layout).
fn check_batched_against(
    ty: GgmlType,
    m: &sparrow_quant::QMatrix<'_>,
    reference: &sparrow_quant::QMatrix<'_>,
    xs: &[f32],
    what: &str,
) {
    use sparrow_quant::{gemm::matmul_panels_scalar, matmul_at_level};
    let slow = Kernels::scalar(ty).unwrap().dot_q8.unwrap();
    let (rows, cols) = (m.rows(), m.cols());
    let n_tokens = xs.len() / cols;
    let tol = |r: usize, t: usize| {
        let x = &xs[t * cols..(t + 1) * cols];
        let xdq = if slow.act_type() == GgmlType::Q8_0 {
            Q8_0Acts::new(x).dequantize()
        } else {
            Q8KActs::new(x).dequantize()
        };
        4.0 * ((cols / 16) as f64 + 16.0) * EPS * split_magnitude(ty, reference.row(r), &xdq)
    };
    let want: Vec<f64> = (0..n_tokens * rows)
        .map(|i| {
            let (t, r) = (i / rows, i % rows);
            slow.quantize_and_dot(reference.row(r), &xs[t * cols..(t + 1) * cols]) as f64
        })
        .collect();
    let mut runs: Vec<(String, Vec<f32>)> = Vec::new();
    for level in SimdLevel::supported() {
        let mut out = vec![f32::NAN; n_tokens * rows];
        matmul_at_level(level, m, xs, &mut out).unwrap();
        runs.push((format!("{level:?}"), out));
    }
    let mut out = vec![f32::NAN; n_tokens * rows];
    assert!(matmul_panels_scalar(m, xs, &mut out));
    runs.push(("panel reference".into(), out));
    for (name, out) in &runs {
        for (i, &got) in out.iter().enumerate() {
            let (t, r) = (i / rows, i % rows);
            let d = (got as f64 - want[i]).abs();
            assert!(
                d <= tol(r, t),
                "{ty} {what} {name} n={n_tokens} {rows}x{cols} row {r} token {t}: \
                 {got:e} vs {:e}, tol {:e}",
                want[i],
                tol(r, t)
            );
        }
    }
}

/// Batched products (`matmul`, which decodes weight panels once per batch where a level
/// has a panel kernel: AVX2, AVX-512 and NEON with `sdot`; plain NEON runs its per-row
/// kernels) at every level, and the portable panel reference,
/// against the scalar int8 kernel row by row. Shapes cover a partial last panel (37 rows),
/// rows wider than one column chunk of the AVX2 kernel (512), batches from 16 tokens (the
/// panels' threshold for most formats) that are exact multiples of the AVX2 tiles (4
/// tokens, 3 for Q5_0 / Q5_1 / Q6_K) or leave every remainder, 64 and 65 (Q4_K's and Q6_K's
/// AVX-512 threshold, below which their multi-token row kernels run), 9 tokens and the
/// small-batch fallback (2 tokens); blocks carry edge scales (see `edge_row`). The formats
/// of 32-element blocks here, the k-quants in the next test: two tests that run side by side
/// (under qemu, scripts/test-aarch64.sh, the whole took a minute and a half).
#[test]
fn batched_matmul_matches_scalar_int8_for_every_32_block_format_and_level() {
    batched_matmul_matches_scalar_int8(24, |ty| ty.block_elems() == 32);
}

/// As above, for every other format with an int8 kernel (the k-quants' 256-element blocks).
#[test]
fn batched_matmul_matches_scalar_int8_for_every_k_quant_and_level() {
    batched_matmul_matches_scalar_int8(25, |ty| ty.block_elems() != 32);
}

/// The body of the two tests above for the supported formats `chosen` picks.
fn batched_matmul_matches_scalar_int8(seed: u64, chosen: impl Fn(GgmlType) -> bool) {
    use sparrow_quant::QMatrix;
    let mut rng = Rng::new(seed);
    for &ty in SUPPORTED.iter().filter(|&&ty| chosen(ty)) {
        if Kernels::scalar(ty).unwrap().dot_q8.is_none() {
            continue;
        }
        let narrow = 2 * ty.block_elems().max(32) * if ty.block_elems() == 32 { 3 } else { 1 };
        let wide = if ty.block_elems() == 32 {
            32 * 19
        } else {
            3 * 256
        };
        for cols in [narrow, wide] {
            let rows = 37;
            let mut data = Vec::new();
            for _ in 0..rows {
                data.extend(edge_row(&mut rng, ty, cols));
            }
            let m = QMatrix::new(ty, &data, rows, cols).unwrap();
            for n_tokens in [16, 17, 18, 19, 64, 65, 9, 2] {
                let xs: Vec<f32> = (0..n_tokens)
                    .flat_map(|_| activations(&mut rng, cols))
                    .collect();
                check_batched(ty, &m, &xs, "random");
            }
        }
    }
}

/// The panel kernels at the extremes of every format's quants, where AVX2's saturating
/// `vpmaddubsw` and its i16 partial sums would overflow if the bounds were wrong: every
/// quant byte set to one pattern (all bits set gives each format's largest stored value,
/// `0x80` Q8's -128), unit scales, and activations that quantize to +-127 throughout.
#[test]
fn batched_matmul_is_exact_at_extreme_quants() {
    use sparrow_quant::QMatrix;
    for &ty in SUPPORTED {
        if Kernels::scalar(ty).unwrap().dot_q8.is_none() {
            continue;
        }
        let cols = 2 * 256;
        let rows = 40;
        for fill in [0xFFu8, 0x00, 0x80, 0x7F, 0x77] {
            let mut data = vec![fill; ty.bytes_for(cols as u64).unwrap() * rows];
            for b in data.chunks_exact_mut(ty.block_bytes()) {
                for &(off, is_f32) in scale_fields(ty) {
                    if is_f32 {
                        b[off..off + 4].copy_from_slice(&1.0f32.to_le_bytes());
                    } else {
                        b[off..off + 2].copy_from_slice(&0x3C00u16.to_le_bytes());
                    }
                }
            }
            let m = QMatrix::new(ty, &data, rows, cols).unwrap();
            for sign in [1.0f32, -1.0] {
                let n_tokens = 19;
                let xs: Vec<f32> = (0..n_tokens * cols)
                    .map(|i| if i % 97 == 5 { -sign } else { sign })
                    .collect();
                check_batched(ty, &m, &xs, &format!("fill {fill:#x} sign {sign}"));
            }
        }
    }
}

/// `matvec` (rows split into parallel chunks of ~32 KiB) against the scalar int8 kernel row
/// by row, for small row counts and one that spans two chunks.
#[test]
fn matvec_row_blocks_match_scalar_int8() {
    use sparrow_quant::{matvec, QMatrix};
    let mut rng = Rng::new(26);
    for &ty in SUPPORTED {
        let Some(slow) = Kernels::scalar(ty).unwrap().dot_q8 else {
            continue;
        };
        let cols = if ty.block_elems() == 32 { 32 * 7 } else { 256 };
        for rows in [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 301] {
            let mut data = Vec::new();
            for _ in 0..rows {
                data.extend(edge_row(&mut rng, ty, cols));
            }
            let m = QMatrix::new(ty, &data, rows, cols).unwrap();
            let x = activations(&mut rng, cols);
            let mut out = vec![f32::NAN; rows];
            matvec(&m, &x, &mut out).unwrap();
            let xdq = if slow.act_type() == GgmlType::Q8_0 {
                Q8_0Acts::new(&x).dequantize()
            } else {
                Q8KActs::new(&x).dequantize()
            };
            let nb = cols / ty.block_elems();
            for (r, &got) in out.iter().enumerate() {
                let want = slow.quantize_and_dot(m.row(r), &x) as f64;
                let tol = 2.0 * (nb as f64 + 16.0) * EPS * split_magnitude(ty, m.row(r), &xdq);
                assert!(
                    (got as f64 - want).abs() <= tol,
                    "{ty} {rows}x{cols} row {r}: matvec {got:e} vs scalar int8 {want:e}, tol {tol:e}"
                );
            }
        }
    }
}

/// Q5_0 rows packed for decode (`sparrow_quant::packed`): unpacking restores them, the
/// scalar packed kernels equal the ggml-layout scalar kernels exactly (dequantization and
/// int8 dot bit for bit; the f32 dot to rounding), and every SIMD level's packed int8 dot
/// stays within the int8 tolerance of the scalar one. Block counts cover rows shorter than
/// one group of four, whole groups, and a ggml-layout tail after the groups.
#[test]
fn packed_q5_0_kernels_match_the_ggml_layout() {
    use sparrow_quant::packed::{pack_rows, unpack_rows};
    let ty = GgmlType::Q5_0;
    let mut rng = Rng::new(27);
    let plain = Kernels::scalar(ty).unwrap();
    let packed_scalar = Kernels::packed_for_level(ty, SimdLevel::Scalar).unwrap();
    assert!(packed_scalar.packed && !plain.packed);
    for nb in [1usize, 3, 4, 5, 17, 28, 152] {
        let n = nb * 32;
        for _ in 0..4 {
            let row = edge_row(&mut rng, ty, n);
            let mut packed = vec![0u8; row.len()];
            pack_rows(ty, &row, row.len(), &mut packed).unwrap();
            let mut back = vec![0u8; row.len()];
            unpack_rows(ty, &packed, row.len(), &mut back).unwrap();
            assert_eq!(back, row, "nb={nb}");
            let x = activations(&mut rng, n);
            let a0 = Q8_0Acts::new(&x);
            let ak = Q8KActs::new(&[]);

            let mut w_plain = vec![0f32; n];
            let mut w_packed = vec![0f32; n];
            (plain.dequantize)(&row, &mut w_plain);
            (packed_scalar.dequantize)(&packed, &mut w_packed);
            assert_eq!(
                w_plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                w_packed.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "dequantized, nb={nb}"
            );
            let want = run_q8(plain.dot_q8.unwrap(), &row, &a0, &ak);
            let got = run_q8(packed_scalar.dot_q8.unwrap(), &packed, &a0, &ak);
            assert_eq!(want.to_bits(), got.to_bits(), "scalar int8, nb={nb}");
            let (a, b) = ((packed_scalar.dot)(&packed, &x), (plain.dot)(&row, &x));
            let tol = f32_tol(n, abs_dot(&w_plain, &x));
            assert!((a as f64 - b as f64).abs() <= tol, "f32 dot nb={nb}");

            let xdq = a0.dequantize();
            let tol = 2.0 * (nb as f64 + 16.0) * EPS * split_magnitude(ty, &row, &xdq);
            for level in simd_levels() {
                let fast = Kernels::packed_for_level(ty, level).unwrap();
                let got = run_q8(fast.dot_q8.unwrap(), &packed, &a0, &ak) as f64;
                assert!(
                    (got - want as f64).abs() <= tol,
                    "{level:?} nb={nb}: packed int8 {got:e} vs scalar {want:e}, tol {tol:e}"
                );
            }
        }
    }
    assert!(Kernels::packed_for_level(GgmlType::Q4_K, SimdLevel::Scalar).is_none());
}

/// `matmul` (per-row kernels for small batches, panels for large ones) and `matvec` on a
/// packed Q5_0 matrix against the scalar int8 kernel on the same matrix in ggml's layout.
#[test]
fn packed_matrix_products_match_the_ggml_layout() {
    use sparrow_quant::packed::pack_rows;
    use sparrow_quant::{matvec, QMatrix};
    let ty = GgmlType::Q5_0;
    let mut rng = Rng::new(28);
    for cols in [32 * 3, 32 * 28, 32 * 19] {
        let rows = 37;
        let mut data = Vec::new();
        for _ in 0..rows {
            data.extend(edge_row(&mut rng, ty, cols));
        }
        let rb = data.len() / rows;
        let mut packed = vec![0u8; data.len()];
        pack_rows(ty, &data, rb, &mut packed).unwrap();
        let plain = QMatrix::new(ty, &data, rows, cols).unwrap();
        let m = QMatrix::new_packed(ty, &packed, rows, cols).unwrap();
        assert!(m.is_packed() && !plain.is_packed());
        for n_tokens in [1, 2, 9, 16, 17] {
            let xs: Vec<f32> = (0..n_tokens)
                .flat_map(|_| activations(&mut rng, cols))
                .collect();
            check_batched_against(ty, &m, &plain, &xs, "packed");
            if n_tokens == 1 {
                let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
                matvec(&m, &xs, &mut a).unwrap();
                matvec(&plain, &xs, &mut b).unwrap();
                let xdq = Q8_0Acts::new(&xs).dequantize();
                for r in 0..rows {
                    let tol = 4.0
                        * ((cols / 32) as f64 + 16.0)
                        * EPS
                        * split_magnitude(ty, plain.row(r), &xdq);
                    assert!((a[r] as f64 - b[r] as f64).abs() <= tol, "matvec row {r}");
                }
            }
        }
        let mut row = vec![0f32; cols];
        let mut want = vec![0f32; cols];
        m.dequantize_row(5, &mut row).unwrap();
        plain.dequantize_row(5, &mut want).unwrap();
        assert_eq!(row, want);
    }
    assert!(QMatrix::new_packed(GgmlType::Q8_0, &[0u8; 34], 1, 32).is_err());
}

/// The multi-token kernels (`Kernels::dot_q8_multi`: one weight row against a group of
/// tokens, each block unpacked once), which `matmul` runs below the panel threshold, give
/// every token exactly what the same level's single-token `dot_q8` gives, to the bit: for
/// every level and format that has one (on x86_64 at least Q8_0, Q4_K, Q6_K and packed
/// Q5_0), 1..=9 tokens (whole groups and every remainder) and 16 and 17 (where `matmul`
/// takes a level's rows kernel, `Kernels::dot_q8_rows`: AMX's tiles of 16 rows and up to 16
/// tokens, here with 37 rows for whole and partial tiles), rows with edge scales (see
/// `edge_row`) and rows of all-extreme quants, row lengths with an odd last block (Q8_0's
/// AVX-512 pairs) and, packed, a row shorter than a group, whole groups, and whole groups
/// plus a partial trailing group in ggml's layout. Checked through `matmul_at_level`, the
/// kernel called directly, and at the active level against `matvec` per token.
#[test]
fn multi_token_kernels_equal_the_single_token_kernel_bit_for_bit() {
    use sparrow_quant::packed::pack_rows;
    use sparrow_quant::q8::Q8DotMulti;
    use sparrow_quant::{matmul, matmul_at_level, matvec, QMatrix};
    let mut rng = Rng::new(29);
    let mut tested = Vec::new();
    for level in simd_levels() {
        for &ty in SUPPORTED {
            for packed in [false, true] {
                let k = if packed {
                    Kernels::packed_for_level(ty, level)
                } else {
                    Kernels::for_level(ty, level)
                };
                let Some(k) = k else { continue };
                let (Some(single), Some(multi)) = (k.dot_q8, k.dot_q8_multi) else {
                    continue;
                };
                tested.push((level, ty, packed));
                let col_counts: &[usize] = match ty.block_elems() {
                    32 if packed => &[32 * 3, 32 * 8, 32 * 11],
                    32 => &[32 * 7, 32 * 8],
                    _ => &[256, 256 * 3],
                };
                // 37 rows: two whole tiles of 16 rows and a partial one (AMX)
                for (&cols, rows) in col_counts.iter().zip([13, 37, 13]) {
                    let mut data = Vec::new();
                    for r in 0..rows {
                        let mut row = edge_row(&mut rng, ty, cols);
                        if r == 5 {
                            // every quant byte at its extreme, unit scales
                            row.fill(0xFF);
                            for b in row.chunks_exact_mut(ty.block_bytes()) {
                                for &(off, is_f32) in scale_fields(ty) {
                                    let one: &[u8] = if is_f32 {
                                        &[0, 0, 0x80, 0x3F]
                                    } else {
                                        &[0, 0x3C]
                                    };
                                    b[off..off + one.len()].copy_from_slice(one);
                                }
                            }
                        }
                        data.extend(row);
                    }
                    if packed {
                        let plain = data.clone();
                        pack_rows(ty, &plain, plain.len() / rows, &mut data).unwrap();
                    }
                    let m = if packed {
                        QMatrix::new_packed(ty, &data, rows, cols).unwrap()
                    } else {
                        QMatrix::new(ty, &data, rows, cols).unwrap()
                    };
                    // 16 and 17 tokens: one whole set of tiles, and one more token (below
                    // the panel threshold only where the level has a rows kernel)
                    let tiles: &[usize] = match k.dot_q8_rows {
                        Some(_) => &[16, 17],
                        None => &[],
                    };
                    for n_tokens in (1..=9).chain(tiles.iter().copied()) {
                        let mut xs: Vec<f32> = (0..n_tokens)
                            .flat_map(|_| activations(&mut rng, cols))
                            .collect();
                        if n_tokens == 3 {
                            // one token of +-1 only: every activation quantizes to +-127
                            for (i, v) in xs[..cols].iter_mut().enumerate() {
                                *v = if i % 7 == 3 { -1.0 } else { 1.0 };
                            }
                        }
                        let tokens: Vec<&[f32]> = xs.chunks_exact(cols).collect();
                        let a0: Vec<Q8_0Acts> = tokens.iter().map(|x| Q8_0Acts::new(x)).collect();
                        let ak: Vec<Q8KActs> = tokens
                            .iter()
                            .map(|x| match single.act_type() {
                                GgmlType::Q8_K => Q8KActs::new(x),
                                _ => Q8KActs::new(&[]),
                            })
                            .collect();
                        let mut got = vec![f32::NAN; n_tokens * rows];
                        matmul_at_level(level, &m, &xs, &mut got).unwrap();
                        for r in 0..rows {
                            let row = m.row(r);
                            let mut direct = vec![f32::NAN; n_tokens];
                            match multi {
                                Q8DotMulti::Q8_0(f) => {
                                    let s: Vec<_> = a0.iter().map(|a| a.as_slice()).collect();
                                    f(row, &s, &mut direct)
                                }
                                Q8DotMulti::Q8K(f) => {
                                    let s: Vec<_> = ak.iter().map(|a| a.as_slice()).collect();
                                    f(row, &s, &mut direct)
                                }
                            }
                            for t in 0..n_tokens {
                                let want = run_q8(single, row, &a0[t], &ak[t]);
                                let what = format!(
                                    "{level:?} {ty} packed={packed} {rows}x{cols} \
                                     n={n_tokens} row {r} token {t}"
                                );
                                assert_eq!(
                                    got[t * rows + r].to_bits(),
                                    want.to_bits(),
                                    "{what}: matmul {:e} vs dot_q8 {want:e}",
                                    got[t * rows + r]
                                );
                                assert_eq!(
                                    direct[t].to_bits(),
                                    want.to_bits(),
                                    "{what}: multi kernel {:e} vs dot_q8 {want:e}",
                                    direct[t]
                                );
                            }
                        }
                        if level == SimdLevel::active() {
                            let mut all = vec![f32::NAN; n_tokens * rows];
                            matmul(&m, &xs, &mut all).unwrap();
                            for (t, x) in tokens.iter().enumerate() {
                                let mut one = vec![f32::NAN; rows];
                                matvec(&m, x, &mut one).unwrap();
                                let bits =
                                    |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                                assert_eq!(
                                    bits(&all[t * rows..(t + 1) * rows]),
                                    bits(&one),
                                    "{level:?} {ty} packed={packed} cols={cols} n={n_tokens} \
                                     token {t}: matmul vs matvec"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!("multi-token kernels tested: {tested:?}");
    #[cfg(target_arch = "x86_64")]
    for level in simd_levels() {
        for (ty, packed) in [
            (GgmlType::Q8_0, false),
            (GgmlType::Q4_K, false),
            (GgmlType::Q6_K, false),
            (GgmlType::Q5_0, true),
        ] {
            assert!(
                tested.contains(&(level, ty, packed)),
                "{level:?} {ty} packed={packed} has no multi-token kernel"
            );
        }
    }
}
