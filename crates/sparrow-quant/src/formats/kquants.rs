//! The k-quants: 256-element super-blocks split into sub-blocks with their own small
//! integer scales (and minimums), which are themselves scaled by f16 super-block factors.
//! Q8_K is the activation format ggml quantizes `x` into for k-quant dots; it is here so an
//! int8-activation path can be checked against it.
//!
//! Weight formulas in the f32 operation order of ggml's reference dequantizers (and the
//! `gguf` Python package), so results are bit-identical. `sc`/`m` are the sub-block scale
//! and minimum, products in parentheses are rounded to f32 first:
//!
//! | format | bytes | layout                                            | weight                          |
//! |--------|-------|---------------------------------------------------|---------------------------------|
//! | Q2_K   | 84    | `scales[16], qs[64], d:f16, dmin:f16` | `(d*sc) * q - (dmin*m)`, 16/sub |
//! | Q3_K   | 110   | `hmask[32], qs[64], scales[12], d:f16` | `(d*(sc-32)) * q`, 16/sub       |
//! | Q4_K   | 144   | `d:f16, dmin:f16, scales[12], qs[128]` | `(d*sc) * q - (dmin*m)`, 32/sub |
//! | Q5_K   | 176   | `d:f16, dmin:f16, scales[12], qh[32], qs[128]` | `(d*sc) * q - (dmin*m)`, 32/sub |
//! | Q6_K   | 210   | `ql[128], qh[64], scales:i8[16], d:f16` | `(d*sc) * (q - 32)`, 16/sub     |
//! | Q8_K   | 292   | `d:f32, qs:i8[256], bsums:i16[16]` | `d * q`                         |

use super::{block_formats, f16_at};
use crate::types::GgmlType;

/// Q2_K: 2-bit quants. Each 128-element half uses 32 bytes of `qs`; element
/// `h*128 + s*32 + l` is bits `2s..2s+2` of `qs[h*32 + l]`. `scales[k]` holds the scale of
/// sub-block `k` (16 elements) in its low nibble and the minimum in its high nibble.
#[inline(always)]
fn q2_k_each(b: &[u8], mut f: impl FnMut(usize, f32)) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for h in 0..2 {
        for s in 0..4 {
            let base = h * 128 + s * 32;
            // each 32-element run spans two 16-element sub-blocks
            for half in 0..2 {
                let sc = scales[base / 16 + half];
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                for l in half * 16..half * 16 + 16 {
                    let q = (qs[h * 32 + l] >> (2 * s)) & 3;
                    f(base + l, dl * q as f32 - ml);
                }
            }
        }
    }
}

/// Q3_K: 3-bit quants, the low two bits laid out as in Q2_K, the high bit in `hmask`
/// (element `b*32 + l` is bit `b` of `hmask[l]`). A *clear* high bit subtracts 4, so quants
/// run -4..=3. The sixteen 6-bit scales are packed in 12 bytes: scale `i` has its low
/// nibble in `scales[i % 8]` (low nibble for `i < 8`, high for `i >= 8`) and its top two
/// bits at bit `2*(i/4)` of `scales[8 + i%4]`; it is stored with a +32 bias.
#[inline(always)]
fn q3_k_each(b: &[u8], mut f: impl FnMut(usize, f32)) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sb = &b[96..108];
    let d = f16_at(b, 108);
    for h in 0..2 {
        for s in 0..4 {
            let base = h * 128 + s * 32;
            for half in 0..2 {
                let i = base / 16 + half;
                let lo = if i < 8 { sb[i] & 0x0F } else { sb[i - 8] >> 4 };
                let hi = (sb[8 + i % 4] >> (2 * (i / 4))) & 3;
                let sc = (lo | hi << 4) as i32 - 32;
                let dl = d * sc as f32;
                for l in half * 16..half * 16 + 16 {
                    let idx = base + l;
                    let low = ((qs[h * 32 + l] >> (2 * s)) & 3) as i32;
                    let high = (hmask[l] >> (idx / 32)) & 1;
                    let q = if high == 0 { low - 4 } else { low };
                    f(idx, dl * q as f32);
                }
            }
        }
    }
}

/// The eight 6-bit scales and minimums of Q4_K/Q5_K, packed in 12 bytes: for `j < 4`
/// scale/min are the low 6 bits of bytes `j`/`j+4`; for `j >= 4` the low/high nibble of
/// byte `j+4` supplies the low four bits and the top two bits of bytes `j-4`/`j` the rest.
#[inline(always)]
pub(crate) fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3F, s[j + 4] & 0x3F)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K: eight 32-element sub-blocks; sub-blocks `2c` and `2c+1` are the low and high
/// nibbles of `qs[32c..32c+32]`.
#[inline(always)]
fn q4_k_each(b: &[u8], f: impl FnMut(usize, f32)) {
    k4_each::<false>(b, f)
}

/// Q5_K: Q4_K plus a fifth bit: bit `j` of `qh[l]` is bit 4 of element `32j + l`.
#[inline(always)]
fn q5_k_each(b: &[u8], f: impl FnMut(usize, f32)) {
    k4_each::<true>(b, f)
}

/// Q4_K, or with `FIFTH` Q5_K (whose `qh[32]` sits between the scales and `qs`).
#[inline(always)]
fn k4_each<const FIFTH: bool>(b: &[u8], mut f: impl FnMut(usize, f32)) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let (qh, qs) = if FIFTH {
        (&b[16..48], &b[48..176])
    } else {
        (&b[..0], &b[16..144])
    };
    for j in 0..8 {
        let (sc, m) = scale_min_k4(scales, j);
        let dl = d * sc as f32;
        let ml = dmin * m as f32;
        let shift = 4 * (j & 1);
        let q32 = &qs[32 * (j / 2)..32 * (j / 2) + 32];
        for (l, &q) in q32.iter().enumerate() {
            let mut v = (q >> shift) & 0x0F;
            if FIFTH {
                v |= ((qh[l] >> j) & 1) << 4;
            }
            f(32 * j + l, dl * v as f32 - ml);
        }
    }
}

/// Q6_K: 6-bit quants with a -32 bias. In each 128-element half `h`, element
/// `h*128 + s*64 + k` takes its low nibble from `ql[h*64 + k]` (nibble `s`), and element
/// `h*128 + s*32 + l` its top two bits from bits `2s..2s+2` of `qh[h*32 + l]`. Sixteen i8
/// scales, one per 16 elements.
#[inline(always)]
fn q6_k_each(b: &[u8], mut f: impl FnMut(usize, f32)) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16_at(b, 208);
    for h in 0..2 {
        for s in 0..4 {
            // 32-element run `s` of half `h`: low nibbles from ql, top bits from qh
            let base = h * 128 + s * 32;
            let ql_off = h * 64 + (s % 2) * 32;
            let ql_shift = 4 * (s / 2);
            for half in 0..2 {
                let dl = d * (scales[base / 16 + half] as i8) as f32;
                for l in half * 16..half * 16 + 16 {
                    let lo = (ql[ql_off + l] >> ql_shift) & 0x0F;
                    let hi = (qh[h * 32 + l] >> (2 * s)) & 3;
                    let q = (lo | hi << 4) as i32 - 32;
                    f(base + l, dl * q as f32);
                }
            }
        }
    }
}

/// Q8_K: f32 scale and 256 i8 quants. The `bsums` (sums of each 16 quants) exist to speed up
/// k-quant dots with minimums; they do not enter the dequantized value.
#[inline(always)]
fn q8_k_each(b: &[u8], mut f: impl FnMut(usize, f32)) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (j, &q) in b[4..260].iter().enumerate() {
        f(j, d * (q as i8) as f32);
    }
}

block_formats! {
    /// 2-bit k-quant (about 2.6 bits per weight), 256 elements in 84 bytes.
    Q2_K, GgmlType::Q2_K, 256, 84, q2_k_each;
    /// 3-bit k-quant, 256 elements in 110 bytes.
    Q3_K, GgmlType::Q3_K, 256, 110, q3_k_each;
    /// 4-bit k-quant with minimums, 256 elements in 144 bytes.
    Q4_K, GgmlType::Q4_K, 256, 144, q4_k_each;
    /// 5-bit k-quant with minimums, 256 elements in 176 bytes.
    Q5_K, GgmlType::Q5_K, 256, 176, q5_k_each;
    /// 6-bit k-quant, 256 elements in 210 bytes.
    Q6_K, GgmlType::Q6_K, 256, 210, q6_k_each;
    /// 8-bit activation format for k-quant dots, 256 elements in 292 bytes.
    Q8_K, GgmlType::Q8_K, 256, 292, q8_k_each;
}
