//! int8 activations: the activation vector quantized once per product to 8-bit blocks, and
//! the scalar reference of the integer dot products against each weight format.
//!
//! This is ggml's trick: rather than decoding every weight to f32, quantize `x` to 8 bits
//! (Q8_0 blocks of 32 for the legacy formats, Q8_K blocks of 256 for the k-quants), then
//! multiply small integers with integer multiply-accumulate and apply the f32 scales once
//! per block. The SIMD kernels in `crate::x86` compute exactly the same integer sums; only
//! the order of the few f32 operations per block differs.
//!
//! # Layout
//!
//! Activations are stored as a structure of arrays (all quants contiguous, then the
//! per-block scales and sums), so a wide vector can span several blocks of quants:
//!
//! * [`Q8_0Acts`]: per 32 elements, `d` (the scale, rounded through f16 exactly as ggml's
//!   `block_q8_0` stores it) and `sum` (the sum of the 32 quants, used by formats with an
//!   offset or a minimum); quants `round(x / d)` in `-127..=127`.
//! * [`Q8KActs`]: per 256 elements, `d` (f32); per 16 elements, `bsums` (sum of the quants);
//!   quants in `-127..=127`, as ggml's `block_q8_K`.
//!
//! # Accuracy against the f32-activation [`crate::dot`]
//!
//! Each activation `x_i` in a block with largest magnitude `a` is replaced by
//! `q_i * d` with `|x_i - q_i d| <= d/2 = a/254` (Q8_K, `d` exact) and, for Q8_0, a further
//! error of at most `2^-11 a` (or `127 * 2^-25` once `d` is below f16's normal range) from
//! rounding `d` to f16. The int8 dot therefore differs from the f32 dot by at most about
//! `sum_blocks (a_b * (1/254 + 2^-11)) * sum_{i in b} |w_i|` plus f32 rounding;
//! [`act_error_bound`] computes the exact bound, and the tests hold every kernel to it.

use crate::formats::kquants::{self, scale_min_k4};
use crate::formats::{f16_at, legacy, BlockFormat};
use crate::types::GgmlType;

/// Elements per [`Q8_0Acts`] block.
pub const Q8_0_BLOCK: usize = 32;
/// Elements per [`Q8KActs`] block.
pub const Q8K_BLOCK: usize = 256;
/// Elements per Q8_K partial sum (`bsums`).
pub const Q8K_BSUM: usize = 16;

/// `x.round_ties_even() as i8` (saturating; NaN to 0), computed from the bits of
/// `x + 1.5 * 2^23`, whose low mantissa bits hold the rounded integer (adding it rounds to
/// an integer in the default ties-to-even mode, for `|x| < 2^22`): float and integer
/// operations that vectorize, where the saturating float-to-int cast becomes one scalar
/// conversion and two compares per element (most of a prefill's activation quantizing).
/// `x` is first limited to `±256`, which saturates alike and keeps the trick exact.
#[inline(always)]
fn round_to_i8(x: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let limited = x.clamp(-256.0, 256.0); // (NaN stays NaN: answered below)
    let i = ((limited + MAGIC).to_bits() as i32) - MAGIC.to_bits() as i32;
    let q = i.clamp(-128, 127) as i8;
    if x.is_nan() {
        0
    } else {
        q
    }
}

/// The largest `|v|` of `xs` (NaNs ignored; 0 for none), over 16 independent lanes so that
/// the loop compiles to vector `max`es: a single running maximum is a chain the compiler
/// may not reorder (and a prefill quantizes every token's activations before each matrix).
#[inline(always)]
fn abs_max(xs: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = xs.chunks_exact(16);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    let tail = chunks.remainder().iter().fold(0f32, |m, v| m.max(v.abs()));
    lanes.iter().fold(tail, |m, &v| m.max(v))
}

/// An activation vector quantized to Q8_0 blocks of 32 (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Q8_0Acts {
    d: Vec<f32>,
    sum: Vec<i32>,
    qs: Vec<i8>,
}

/// A borrowed [`Q8_0Acts`]: `qs.len() == 32 * d.len() == 32 * sum.len()`.
#[derive(Clone, Copy, Debug)]
pub struct Q8_0Slice<'a> {
    /// Per-block scale (an f16 value widened to f32).
    pub d: &'a [f32],
    /// Per-block sum of the quants.
    pub sum: &'a [i32],
    /// The quants, 32 per block.
    pub qs: &'a [i8],
}

/// An activation vector quantized to Q8_K blocks of 256 (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Q8KActs {
    d: Vec<f32>,
    bsums: Vec<i16>,
    qs: Vec<i8>,
    pairs: Vec<i32>,
}

/// A borrowed [`Q8KActs`]: `qs.len() == 256 * d.len() == 16 * bsums.len()`.
#[derive(Clone, Copy, Debug)]
pub struct Q8KSlice<'a> {
    /// Per-block scale.
    pub d: &'a [f32],
    /// Per-16-element sum of the quants.
    pub bsums: &'a [i16],
    /// Per block four i32, each the i16 pair `(s[2p], s[2p + 1])` (low half first) of the
    /// sums `s[g]` of 32-element sub-blocks (two `bsums` each; at most 4,096 in magnitude):
    /// what the row-group kernels ([`crate::row_groups`]) multiply minimum pairs by.
    pub pairs: &'a [i32],
    /// The quants, 256 per block.
    pub qs: &'a [i8],
}

impl Q8_0Acts {
    /// Quantizes `x` (whose length must be a multiple of 32) into `self`, reusing its
    /// buffers. Mirrors ggml's `quantize_row_q8_0`: `d = max|x| / 127` stored as f16,
    /// quants `round(x * 127 / max|x|)` (ties to even, as ggml's x86 code rounds).
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of 32.
    pub fn quantize_from(&mut self, x: &[f32]) {
        assert!(
            x.len().is_multiple_of(Q8_0_BLOCK),
            "Q8_0 activations need a multiple of 32 elements, got {}",
            x.len()
        );
        let nb = x.len() / Q8_0_BLOCK;
        self.d.clear();
        self.sum.clear();
        self.qs.clear();
        self.qs.resize(x.len(), 0);
        for (xb, qb) in x
            .chunks_exact(Q8_0_BLOCK)
            .zip(self.qs.chunks_exact_mut(Q8_0_BLOCK))
        {
            let amax = abs_max(xb);
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = round_to_i8(v * id);
                sum += *q as i32;
            }
            self.d.push(half::f16::from_f32(d).to_f32());
            self.sum.push(sum);
        }
        assert_eq!(self.d.len(), nb);
    }

    /// `x` quantized; see [`Q8_0Acts::quantize_from`].
    pub fn new(x: &[f32]) -> Self {
        let mut a = Self::default();
        a.quantize_from(x);
        a
    }

    /// The borrowed view kernels take.
    pub fn as_slice(&self) -> Q8_0Slice<'_> {
        Q8_0Slice {
            d: &self.d,
            sum: &self.sum,
            qs: &self.qs,
        }
    }

    /// The dequantized activations (`q * d`), for tests and error analysis.
    pub fn dequantize(&self) -> Vec<f32> {
        self.qs
            .iter()
            .enumerate()
            .map(|(i, &q)| q as f32 * self.d[i / Q8_0_BLOCK])
            .collect()
    }
}

impl Q8_0Slice<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.qs.len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.qs.is_empty()
    }
}

impl Q8KActs {
    /// Quantizes `x` (whose length must be a multiple of 256) into `self`, reusing its
    /// buffers. Mirrors ggml's `quantize_row_q8_K`: the scale maps the element of largest
    /// magnitude to -127, quants round to nearest (ties to even), `bsums` are sums of 16.
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of 256.
    pub fn quantize_from(&mut self, x: &[f32]) {
        assert!(
            x.len().is_multiple_of(Q8K_BLOCK),
            "Q8_K activations need a multiple of 256 elements, got {}",
            x.len()
        );
        self.d.clear();
        self.bsums.clear();
        self.qs.clear();
        self.qs.resize(x.len(), 0);
        for (xb, qb) in x
            .chunks_exact(Q8K_BLOCK)
            .zip(self.qs.chunks_exact_mut(Q8K_BLOCK))
        {
            // the signed value of largest magnitude (the first one on ties, as ggml)
            let amax = abs_max(xb);
            if amax == 0.0 {
                self.d.push(0.0);
                self.bsums.extend_from_slice(&[0; Q8K_BLOCK / Q8K_BSUM]);
                continue; // quants already zero
            }
            let max = *xb
                .iter()
                .find(|v| v.abs() == amax)
                .expect("amax is one of them");
            let iscale = -127.0 / max;
            for (q, &v) in qb.iter_mut().zip(xb) {
                // `min` before rounding equals `min` after (127 is an integer), NaN included
                *q = round_to_i8((iscale * v).min(127.0));
            }
            for q16 in qb.chunks_exact(Q8K_BSUM) {
                self.bsums.push(q16.iter().map(|&q| q as i16).sum::<i16>());
            }
            self.d.push(1.0 / iscale);
        }
        self.pairs.clear();
        self.pairs.extend(self.bsums.chunks_exact(4).map(|b| {
            let lo = b[0] as i32 + b[1] as i32;
            let hi = b[2] as i32 + b[3] as i32;
            (lo & 0xFFFF) | (hi << 16)
        }));
    }

    /// `x` quantized; see [`Q8KActs::quantize_from`].
    pub fn new(x: &[f32]) -> Self {
        let mut a = Self::default();
        a.quantize_from(x);
        a
    }

    /// The borrowed view kernels take.
    pub fn as_slice(&self) -> Q8KSlice<'_> {
        Q8KSlice {
            d: &self.d,
            bsums: &self.bsums,
            qs: &self.qs,
            pairs: &self.pairs,
        }
    }

    /// The dequantized activations (`q * d`), for tests and error analysis.
    pub fn dequantize(&self) -> Vec<f32> {
        self.qs
            .iter()
            .enumerate()
            .map(|(i, &q)| q as f32 * self.d[i / Q8K_BLOCK])
            .collect()
    }
}

impl<'a> Q8KSlice<'a> {
    /// The super-blocks of a k-quant `row` (of `bb` bytes each) beside their activations:
    /// block bytes, the 256 quants, the scale and the 16 `bsums`. (Every k-quant kernel,
    /// scalar or SIMD, walks a row this way.)
    #[inline(always)]
    pub(crate) fn blocks(
        self,
        row: &'a [u8],
        bb: usize,
    ) -> impl Iterator<Item = (&'a [u8], &'a [i8], f32, &'a [i16])> {
        row.chunks_exact(bb)
            .zip(self.qs.chunks_exact(Q8K_BLOCK))
            .zip(self.d)
            .zip(self.bsums.chunks_exact(Q8K_BLOCK / Q8K_BSUM))
            .map(|(((b, xq), &dx), bs)| (b, xq, dx, bs))
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.qs.len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.qs.is_empty()
    }
}

/// An int8-activation dot kernel: which activation format it takes, and the function.
///
/// The function computes `sum_i w_i * (q_i d)` for a row of whole weight blocks against
/// activations of exactly as many elements. Like [`crate::Kernels::dot`] it may panic (but
/// never misbehave) when handed mismatched lengths.
#[derive(Clone, Copy, Debug)]
pub enum Q8Dot {
    /// Takes Q8_0 activations (legacy 32-element formats).
    Q8_0(fn(row: &[u8], x: Q8_0Slice<'_>) -> f32),
    /// Takes Q8_K activations (k-quants).
    Q8K(fn(row: &[u8], x: Q8KSlice<'_>) -> f32),
}

impl Q8Dot {
    /// The activation format this kernel takes (`Q8_0` or `Q8_K`).
    pub fn act_type(&self) -> GgmlType {
        match self {
            Q8Dot::Q8_0(_) => GgmlType::Q8_0,
            Q8Dot::Q8K(_) => GgmlType::Q8_K,
        }
    }

    /// Quantizes `x` as this kernel expects and computes the dot with `row`.
    /// Lengths must already be validated (see [`crate::dot_q8`] for the checked form).
    pub fn quantize_and_dot(&self, row: &[u8], x: &[f32]) -> f32 {
        match self {
            Q8Dot::Q8_0(f) => f(row, Q8_0Acts::new(x).as_slice()),
            Q8Dot::Q8K(f) => f(row, Q8KActs::new(x).as_slice()),
        }
    }
}

/// A multi-token int8 kernel: one weight row against several tokens' activations at once,
/// unpacking each weight block once and dotting it with every token. `out[t]` (for `t <
/// xs.len()`, `out.len() == xs.len()`) is bit for bit what the same level's [`Q8Dot`]
/// gives for `xs[t]`: the single-token kernel is the same body instantiated for one
/// token, and every token sees the same integer sums and f32 operations in the same order.
/// Any number of tokens is accepted; the kernel takes them in groups of its width.
#[derive(Clone, Copy, Debug)]
pub enum Q8DotMulti {
    /// Takes Q8_0 activations (legacy 32-element formats).
    Q8_0(fn(row: &[u8], xs: &[Q8_0Slice<'_>], out: &mut [f32])),
    /// Takes Q8_K activations (k-quants).
    Q8K(fn(row: &[u8], xs: &[Q8KSlice<'_>], out: &mut [f32])),
}

/// The bound on `|int8 dot - f32 dot|` due to quantizing `x` as the kernel for `ty` does,
/// given the dequantized weights `w` (see the module docs). Per activation block of largest
/// magnitude `a`, each activation moves by at most `d/2 = a/254` (rounding to the grid)
/// plus, for Q8_0, `127 * |d - f16(d)| <= 127 * max(d * 2^-11, 2^-25)` (the f16 rounding of
/// the scale, absolute below the f16 normal range); times `sum |w_i|` over the block.
/// Assumes finite activations with `a / 127` below the f16 maximum (65504) for Q8_0.
pub fn act_error_bound(act: GgmlType, w: &[f32], x: &[f32]) -> f64 {
    let block = if act == GgmlType::Q8_0 {
        Q8_0_BLOCK
    } else {
        Q8K_BLOCK
    };
    w.chunks(block)
        .zip(x.chunks(block))
        .map(|(wb, xb)| {
            let a = xb.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
            let mut e = a / 254.0;
            if act == GgmlType::Q8_0 {
                e += (a * 2f64.powi(-11)).max(127.0 * 2f64.powi(-25));
            }
            let sw: f64 = wb.iter().map(|v| v.abs() as f64).sum();
            e * sw
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// Scalar reference int8 dots.
//
// Each weight block is first decoded to small integers plus f32 factors, in the form the
// SIMD kernels use, then the integer products are summed exactly in i32 and scaled once.

/// Where the fields of a legacy block lie, for the SIMD kernels, which name the format by
/// a const index `TY`: Q4_0 (0), Q4_1 (1), Q5_0 (2), Q5_1 (3), Q8_0 (4).
pub(crate) struct LegacyLayout {
    /// Bytes per block.
    pub(crate) bytes: usize,
    /// Whether an f16 minimum follows the scale.
    pub(crate) has_min: bool,
    /// Whether 32 fifth bits (`qh`) follow.
    pub(crate) has_qh: bool,
    /// Offset of `qh`, then of the quants.
    pub(crate) qh_off: usize,
    pub(crate) qs_off: usize,
    /// The offset subtracted from the unsigned quants (8, 16 or 0).
    pub(crate) off: i32,
}

/// The [`LegacyLayout`] of format index `ty`.
pub(crate) const fn legacy_layout(ty: u8) -> LegacyLayout {
    let (bytes, has_min, has_qh, off) = match ty {
        0 => (18, false, false, 8),
        1 => (20, true, false, 0),
        2 => (22, false, true, 16),
        3 => (24, true, true, 0),
        _ => (34, false, false, 0),
    };
    LegacyLayout {
        bytes,
        has_min,
        has_qh,
        qh_off: if has_min { 4 } else { 2 },
        qs_off: 2 + 2 * has_min as usize + 4 * has_qh as usize,
        off,
    }
}

/// Number of whole blocks a legacy-format row (of `block_bytes` blocks) and its Q8_0
/// activations have in common (the shorter of the two decides, as a zip of the blocks
/// would): the bound within which the kernels' block reads stay.
#[inline(always)]
pub(crate) fn common_blocks(row: &[u8], block_bytes: usize, x: Q8_0Slice<'_>) -> usize {
    (row.len() / block_bytes)
        .min(x.d.len())
        .min(x.sum.len())
        .min(x.qs.len() / Q8_0_BLOCK)
}

/// A legacy block as integers: `w_i = d * q_i + m`.
pub(crate) struct LegacyInts {
    pub(crate) d: f32,
    pub(crate) m: f32,
    pub(crate) q: [i8; 32],
}

#[inline(always)]
fn nib5(qs: &[u8], qh: Option<u32>, off: i32) -> [i8; 32] {
    let mut q = [0i8; 32];
    for j in 0..16 {
        let (mut lo, mut hi) = ((qs[j] & 0x0F) as i32, (qs[j] >> 4) as i32);
        if let Some(h) = qh {
            lo |= (((h >> j) & 1) << 4) as i32;
            hi |= (((h >> (j + 16)) & 1) << 4) as i32;
        }
        q[j] = (lo - off) as i8;
        q[j + 16] = (hi - off) as i8;
    }
    q
}

pub(crate) fn legacy_ints(ty: GgmlType, b: &[u8]) -> LegacyInts {
    let qh = |o: usize| Some(u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]));
    let (m, q) = match ty {
        GgmlType::Q4_0 => (0.0, nib5(&b[2..18], None, 8)),
        GgmlType::Q4_1 => (f16_at(b, 2), nib5(&b[4..20], None, 0)),
        GgmlType::Q5_0 => (0.0, nib5(&b[6..22], qh(2), 16)),
        GgmlType::Q5_1 => (f16_at(b, 2), nib5(&b[8..24], qh(4), 0)),
        GgmlType::Q8_0 => {
            let mut q = [0i8; 32];
            for (d, &s) in q.iter_mut().zip(&b[2..34]) {
                *d = s as i8;
            }
            (0.0, q)
        }
        _ => unreachable!("not a legacy format: {ty}"),
    };
    LegacyInts {
        d: f16_at(b, 0),
        m,
        q,
    }
}

/// The scalar int8 dot of a legacy format `F`.
fn legacy_dot<F: BlockFormat>(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    let ty = F::TYPE;
    let bb = ty.block_bytes();
    let mut acc = 0f32;
    for (((b, xq), &dx), &sx) in row
        .chunks_exact(bb)
        .zip(x.qs.chunks_exact(Q8_0_BLOCK))
        .zip(x.d)
        .zip(x.sum)
    {
        add_legacy_block(&mut acc, ty, b, xq, dx, sx);
    }
    acc
}

/// Adds one legacy block's int8 dot (block bytes `b` of format `ty`, activation quants
/// `xq` with scale `dx` and sum `sx`) to `acc`: the scalar reference's per-block step,
/// shared with the packed layout's reference (`crate::packed`).
pub(crate) fn add_legacy_block(acc: &mut f32, ty: GgmlType, b: &[u8], xq: &[i8], dx: f32, sx: i32) {
    let w = legacy_ints(ty, b);
    let isum: i32 = w.q.iter().zip(xq).map(|(&a, &c)| a as i32 * c as i32).sum();
    *acc += (w.d * dx) * isum as f32;
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        *acc += w.m * (dx * sx as f32);
    }
}

/// Scalar int8 dot of Q4_0 weights with Q8_0 activations.
pub fn q4_0(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    legacy_dot::<legacy::Q4_0>(row, x)
}
/// Scalar int8 dot of Q4_1 weights with Q8_0 activations.
pub fn q4_1(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    legacy_dot::<legacy::Q4_1>(row, x)
}
/// Scalar int8 dot of Q5_0 weights with Q8_0 activations.
pub fn q5_0(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    legacy_dot::<legacy::Q5_0>(row, x)
}
/// Scalar int8 dot of Q5_1 weights with Q8_0 activations.
pub fn q5_1(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    legacy_dot::<legacy::Q5_1>(row, x)
}
/// Scalar int8 dot of Q8_0 weights with Q8_0 activations.
pub fn q8_0(row: &[u8], x: Q8_0Slice<'_>) -> f32 {
    legacy_dot::<legacy::Q8_0>(row, x)
}

/// A k-quant super-block as integers: per 16-element group `g`,
/// `w_i = d * sc[g] * q_i - dmin * m[g]`.
pub(crate) struct KInts {
    pub(crate) d: f32,
    pub(crate) dmin: f32,
    pub(crate) q: [i8; 256],
    pub(crate) sc: [i32; 16],
    pub(crate) m: [i32; 16],
}

/// The eight 6-bit scales and eight 6-bit minimums of a Q4_K/Q5_K super-block (the 12
/// bytes at offset 4), as eight bytes each, unpacked with word-wide masks and shifts.
#[inline(always)]
pub(crate) fn scales_mins_k4(s: &[u8]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    let sc_lo = a & 0x3F3F_3F3F;
    let m_lo = b & 0x3F3F_3F3F;
    let sc_hi = (c & 0x0F0F_0F0F) | (((a >> 6) & 0x0303_0303) << 4);
    let m_hi = ((c >> 4) & 0x0F0F_0F0F) | (((b >> 6) & 0x0303_0303) << 4);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        m_lo as u64 | (m_hi as u64) << 32,
    )
}

/// The sixteen signed 6-bit scales of Q3_K (bias removed).
#[inline(always)]
pub(crate) fn q3_k_scales(sb: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let lo = if i < 8 { sb[i] & 0x0F } else { sb[i - 8] >> 4 };
        let hi = (sb[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = ((lo | hi << 4) as i32 - 32) as i8;
    }
    out
}

pub(crate) fn k_ints(ty: GgmlType, b: &[u8]) -> KInts {
    let mut k = KInts {
        d: 0.0,
        dmin: 0.0,
        q: [0; 256],
        sc: [0; 16],
        m: [0; 16],
    };
    match ty {
        GgmlType::Q2_K => {
            let (scales, qs) = (&b[0..16], &b[16..80]);
            k.d = f16_at(b, 80);
            k.dmin = f16_at(b, 82);
            for (g, &s) in scales.iter().enumerate() {
                k.sc[g] = (s & 0x0F) as i32;
                k.m[g] = (s >> 4) as i32;
            }
            for h in 0..2 {
                for s in 0..4 {
                    for l in 0..32 {
                        k.q[h * 128 + s * 32 + l] = ((qs[h * 32 + l] >> (2 * s)) & 3) as i8;
                    }
                }
            }
        }
        GgmlType::Q3_K => {
            let (hmask, qs) = (&b[0..32], &b[32..96]);
            k.d = f16_at(b, 108);
            for (g, s) in q3_k_scales(&b[96..108]).iter().enumerate() {
                k.sc[g] = *s as i32;
            }
            for h in 0..2 {
                for s in 0..4 {
                    for l in 0..32 {
                        let idx = h * 128 + s * 32 + l;
                        let low = ((qs[h * 32 + l] >> (2 * s)) & 3) as i8;
                        let high = (hmask[l] >> (idx / 32)) & 1;
                        k.q[idx] = if high == 0 { low - 4 } else { low };
                    }
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            k.d = f16_at(b, 0);
            k.dmin = f16_at(b, 2);
            let scales = &b[4..16];
            let (qh, qs) = if ty == GgmlType::Q5_K {
                (Some(&b[16..48]), &b[48..176])
            } else {
                (None, &b[16..144])
            };
            for j in 0..8 {
                let (sc, m) = scale_min_k4(scales, j);
                k.sc[2 * j] = sc as i32;
                k.sc[2 * j + 1] = sc as i32;
                k.m[2 * j] = m as i32;
                k.m[2 * j + 1] = m as i32;
                for l in 0..32 {
                    let mut v = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0x0F;
                    if let Some(qh) = qh {
                        v |= ((qh[l] >> j) & 1) << 4;
                    }
                    k.q[32 * j + l] = v as i8;
                }
            }
        }
        GgmlType::Q6_K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            k.d = f16_at(b, 208);
            for (sc, &s) in k.sc.iter_mut().zip(scales) {
                *sc = s as i8 as i32;
            }
            for h in 0..2 {
                for s in 0..4 {
                    for l in 0..32 {
                        let lo = (ql[h * 64 + (s % 2) * 32 + l] >> (4 * (s / 2))) & 0x0F;
                        let hi = (qh[h * 32 + l] >> (2 * s)) & 3;
                        k.q[h * 128 + s * 32 + l] = ((lo | hi << 4) as i32 - 32) as i8;
                    }
                }
            }
        }
        GgmlType::Q8_K => {
            k.d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            k.sc = [1; 16];
            for (d, &s) in k.q.iter_mut().zip(&b[4..260]) {
                *d = s as i8;
            }
        }
        _ => unreachable!("not a k-quant: {ty}"),
    }
    k
}

/// The scalar int8 dot of a k-quant `F`.
fn k_dot<F: BlockFormat>(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    let ty = F::TYPE;
    let mut acc = 0f32;
    for (b, xq, dx, bsums) in x.blocks(row, ty.block_bytes()) {
        let k = k_ints(ty, b);
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for (g, &bsum) in bsums.iter().enumerate() {
            let r = g * 16..g * 16 + 16;
            let s: i32 = k.q[r.clone()]
                .iter()
                .zip(&xq[r])
                .map(|(&a, &c)| a as i32 * c as i32)
                .sum();
            sumi += k.sc[g] * s;
            summ += k.m[g] * bsum as i32;
        }
        acc += (dx * k.d) * sumi as f32 - (dx * k.dmin) * summ as f32;
    }
    acc
}

/// Scalar int8 dot of Q2_K weights with Q8_K activations.
pub fn q2_k(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    k_dot::<kquants::Q2_K>(row, x)
}
/// Scalar int8 dot of Q3_K weights with Q8_K activations.
pub fn q3_k(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    k_dot::<kquants::Q3_K>(row, x)
}
/// Scalar int8 dot of Q4_K weights with Q8_K activations.
pub fn q4_k(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    k_dot::<kquants::Q4_K>(row, x)
}
/// Scalar int8 dot of Q5_K weights with Q8_K activations.
pub fn q5_k(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    k_dot::<kquants::Q5_K>(row, x)
}
/// Scalar int8 dot of Q6_K weights with Q8_K activations.
pub fn q6_k(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    k_dot::<kquants::Q6_K>(row, x)
}
/// Scalar int8 dot of Q8_K weights with Q8_K activations.
pub fn q8_k(row: &[u8], x: Q8KSlice<'_>) -> f32 {
    k_dot::<kquants::Q8_K>(row, x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_to_i8_is_the_saturating_cast_of_ties_to_even_over_a_sweep_of_floats() {
        let specials = [
            0.5f32,
            1.5,
            2.5,
            -0.5,
            -1.5,
            126.5,
            127.5,
            -127.5,
            -128.5,
            128.0,
            -129.0,
            4_194_303.5,
            8_388_607.0,
            -8_388_609.0,
            1e9,
            -1e9,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -0.0,
            f32::MIN_POSITIVE,
        ];
        // every 251st bit pattern: every exponent, both signs, the NaN range
        let sweep = (0..=u32::MAX).step_by(251).map(f32::from_bits);
        for x in specials.into_iter().chain(sweep) {
            assert_eq!(
                round_to_i8(x),
                x.round_ties_even() as i8,
                "x = {x:e} ({:#010x})",
                x.to_bits()
            );
        }
    }

    /// ggml's `quantize_row_q8_K`, written out plainly: the signed value of largest
    /// magnitude (the first on ties), `iscale = -127 / max`, quants `min(round(iscale * x),
    /// 127)`, `d = 1 / iscale`, sums per 16.
    fn q8_k_reference(x: &[f32]) -> (Vec<f32>, Vec<i16>, Vec<i8>) {
        let (mut d, mut bsums, mut qs) = (vec![], vec![], vec![]);
        for xb in x.chunks_exact(Q8K_BLOCK) {
            let (mut max, mut amax) = (0f32, 0f32);
            for &v in xb {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            if amax == 0.0 {
                d.push(0.0);
                bsums.extend([0i16; Q8K_BLOCK / Q8K_BSUM]);
                qs.extend([0i8; Q8K_BLOCK]);
                continue;
            }
            let iscale = -127.0 / max;
            let q: Vec<i8> = xb
                .iter()
                .map(|&v| (iscale * v).round_ties_even().min(127.0) as i8)
                .collect();
            bsums.extend(
                q.chunks_exact(16)
                    .map(|c| c.iter().map(|&v| v as i16).sum::<i16>()),
            );
            qs.extend(q);
            d.push(1.0 / iscale);
        }
        (d, bsums, qs)
    }

    #[test]
    fn q8_k_quantizing_matches_the_plain_definition_and_takes_the_first_extreme_on_ties() {
        let mut seed = 0x9e37_79b9_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32 - 0.5) * 8.0
        };
        let mut x: Vec<f32> = (0..4 * Q8K_BLOCK).map(|_| next()).collect();
        // block 1: the extreme magnitude twice, positive first; block 2: negative first;
        // block 3: all zero but a NaN (ignored by the maximum)
        x[Q8K_BLOCK + 7] = 9.0;
        x[Q8K_BLOCK + 200] = -9.0;
        x[2 * Q8K_BLOCK + 3] = -9.0;
        x[2 * Q8K_BLOCK + 100] = 9.0;
        x[3 * Q8K_BLOCK..].fill(0.0);
        x[3 * Q8K_BLOCK + 5] = f32::NAN;
        let got = Q8KActs::new(&x);
        let (d, bsums, qs) = q8_k_reference(&x);
        assert_eq!(
            got.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            d.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(got.bsums, bsums);
        assert_eq!(got.qs, qs);
        assert!(
            got.d[1] < 0.0 && got.d[2] > 0.0,
            "the first extreme sets the sign: {:?}",
            got.d
        );
    }
}
