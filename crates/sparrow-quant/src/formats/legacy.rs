//! The original ggml formats: 32-element blocks with one f16 scale (and, for the `_1`
//! variants, an f16 minimum).
//!
//! Weight formulas, in the f32 operation order of ggml's reference dequantizers (which the
//! `gguf` Python package follows too), so results are bit-identical:
//!
//! | format | bytes | layout                               | weight          |
//! |--------|-------|--------------------------------------|-----------------|
//! | Q4_0   | 18    | `d:f16, qs[16]` | `d * (q - 8)`   |
//! | Q4_1   | 20    | `d:f16, m:f16, qs[16]` | `d * q + m`     |
//! | Q5_0   | 22    | `d:f16, qh:u32, qs[16]` | `d * (q - 16)`  |
//! | Q5_1   | 24    | `d:f16, m:f16, qh:u32, qs[16]` | `d * q + m`     |
//! | Q8_0   | 34    | `d:f16, qs:i8[32]` | `d * q`         |
//!
//! Nibble packing: element `j < 16` is the low nibble of `qs[j]`, element `j + 16` the high
//! nibble. For the 5-bit formats, bit `i` of the little-endian `qh` is bit 4 of element `i`.

use super::{block_formats, f16_at};
use crate::types::GgmlType;

#[inline(always)]
fn q4_0_each(b: &[u8], mut f: impl FnMut(usize, f32)) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for (j, &q) in qs.iter().enumerate() {
        f(j, d * ((q & 0x0F) as i32 - 8) as f32);
        f(j + 16, d * ((q >> 4) as i32 - 8) as f32);
    }
}

#[inline(always)]
fn q4_1_each(b: &[u8], mut f: impl FnMut(usize, f32)) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for (j, &q) in qs.iter().enumerate() {
        f(j, d * (q & 0x0F) as f32 + m);
        f(j + 16, d * (q >> 4) as f32 + m);
    }
}

#[inline(always)]
fn q5_0_each(b: &[u8], mut f: impl FnMut(usize, f32)) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for (j, &q) in qs.iter().enumerate() {
        let lo = (q & 0x0F) as u32 | ((qh >> j) & 1) << 4;
        let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        f(j, d * (lo as i32 - 16) as f32);
        f(j + 16, d * (hi as i32 - 16) as f32);
    }
}

#[inline(always)]
fn q5_1_each(b: &[u8], mut f: impl FnMut(usize, f32)) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for (j, &q) in qs.iter().enumerate() {
        let lo = (q & 0x0F) as u32 | ((qh >> j) & 1) << 4;
        let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        f(j, d * lo as f32 + m);
        f(j + 16, d * hi as f32 + m);
    }
}

#[inline(always)]
fn q8_0_each(b: &[u8], mut f: impl FnMut(usize, f32)) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..34].iter().enumerate() {
        f(j, d * (q as i8) as f32);
    }
}

block_formats! {
    /// 4-bit symmetric quantization, 32 elements in 18 bytes.
    Q4_0, GgmlType::Q4_0, 32, 18, q4_0_each;
    /// 4-bit affine quantization (scale and minimum), 32 elements in 20 bytes.
    Q4_1, GgmlType::Q4_1, 32, 20, q4_1_each;
    /// 5-bit symmetric quantization, 32 elements in 22 bytes.
    Q5_0, GgmlType::Q5_0, 32, 22, q5_0_each;
    /// 5-bit affine quantization, 32 elements in 24 bytes.
    Q5_1, GgmlType::Q5_1, 32, 24, q5_1_each;
    /// 8-bit symmetric quantization, 32 elements in 34 bytes.
    Q8_0, GgmlType::Q8_0, 32, 34, q8_0_each;
}
