//! Helpers shared by the integration tests, the benches and the examples (which include
//! this file with `#[path]`): tiny deterministic RNGs (no `rand` dependency) and
//! random-block builders.

#![allow(dead_code)]

use sparrow_quant::GgmlType;

/// The types with kernels, i.e. everything the tests must cover.
pub const SUPPORTED: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
];

/// xorshift64*: deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
}

/// Byte offsets of the f16 scale fields of each quantized block format.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// Deterministic bytes from the xorshift state `s` (non-zero), advanced as they are drawn:
/// the benches' and examples' data, kept as it was so their figures stay comparable.
pub fn xorshift_bytes(n: usize, s: &mut u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *s ^= *s << 13;
            *s ^= *s >> 7;
            *s ^= *s << 17;
            *s as u8
        })
        .collect()
}

/// `n_bytes` of random `ty` blocks ([`xorshift_bytes`] from `s`) with every f16 scale
/// field set to `scale`, so nothing is NaN or infinite (for timing: the kernels have no
/// data-dependent branches).
pub fn fixed_scale_weights(ty: GgmlType, n_bytes: usize, s: &mut u64, scale: f32) -> Vec<u8> {
    let mut w = xorshift_bytes(n_bytes, s);
    let h = half::f16::from_f32(scale).to_le_bytes();
    for b in w.chunks_exact_mut(ty.block_bytes()) {
        for &o in f16_fields(ty) {
            b[o..o + 2].copy_from_slice(&h);
        }
    }
    w
}

/// `n_elems` elements of `ty` with random quants and realistic, finite scales (magnitudes
/// 2^-12..2^0, either sign), so dots are well inside the f32 range.
pub fn random_row(rng: &mut Rng, ty: GgmlType, n_elems: usize) -> Vec<u8> {
    let n_bytes = ty.bytes_for(n_elems as u64).expect("whole blocks");
    match ty {
        GgmlType::F32 => {
            return rng
                .vec(n_elems)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        }
        GgmlType::F16 => {
            return (0..n_elems)
                .flat_map(|_| half::f16::from_f32(rng.unit()).to_le_bytes())
                .collect()
        }
        GgmlType::BF16 => {
            return (0..n_elems)
                .flat_map(|_| half::bf16::from_f32(rng.unit()).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let mut bytes = rng.bytes(n_bytes);
    let bb = ty.block_bytes();
    for block in bytes.chunks_exact_mut(bb) {
        for &off in f16_fields(ty) {
            let mag = (2f32).powi(-((rng.next_u64() % 13) as i32)) * (0.5 + rng.unit().abs());
            let v = if rng.next_u64() & 1 == 0 { mag } else { -mag };
            block[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        if ty == GgmlType::Q8_K {
            block[0..4].copy_from_slice(&(rng.unit() / 64.0).to_le_bytes());
        }
    }
    bytes
}

/// f64 reference dot of dequantized weights with x.
pub fn ref_dot(w: &[f32], x: &[f32]) -> (f64, f64) {
    let mut s = 0f64;
    let mut abs = 0f64;
    for (&a, &b) in w.iter().zip(x) {
        s += a as f64 * b as f64;
        abs += (a as f64 * b as f64).abs();
    }
    (s, abs)
}
