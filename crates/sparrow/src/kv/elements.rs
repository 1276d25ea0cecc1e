//! Rows of keys or values in one buffer of their element type (f16, f32 or ggml's Q8_0
//! blocks): written from f32, borrowed as the kernels' [`KvRows`], imported from raw bytes,
//! copied between buffers. The RAM store's layers and an arranged layer's bins both keep
//! their rows in these.

use super::types::{BlockQ8_0, KvRows, KvType, BLOCK_Q8_0_BYTES, QK8_0};
use half::f16;
use half::slice::HalfFloatSliceExt;

fn block_from_bytes(b: &[u8]) -> BlockQ8_0 {
    let mut qs = [0i8; QK8_0];
    for (q, &x) in qs.iter_mut().zip(&b[2..BLOCK_Q8_0_BYTES]) {
        *q = x as i8;
    }
    BlockQ8_0 {
        d: f16::from_le_bytes([b[0], b[1]]),
        qs,
    }
}

/// Rows of one element type in one buffer, addressed by element (for Q8_0, element offsets
/// and lengths are whole 32-value blocks).
pub(super) enum Elements {
    F16(Vec<f16>),
    F32(Vec<f32>),
    Q8_0(Vec<BlockQ8_0>),
}

impl Elements {
    /// `len` elements (a multiple of 32 for Q8_0), zeroed by the allocator
    /// (`alloc_zeroed`): the OS maps zero pages lazily, so nothing is committed until a
    /// position is written. (`vec![f16::ZERO; n]` would write every element: `-c 32768`
    /// committed 384 MiB at start.)
    pub(super) fn zeroed(ty: KvType, len: usize) -> Self {
        match ty {
            KvType::F16 => Elements::F16(bytemuck::zeroed_vec(len)),
            KvType::F32 => Elements::F32(bytemuck::zeroed_vec(len)),
            KvType::Q8_0 => Elements::Q8_0(bytemuck::zeroed_vec(len / QK8_0)),
        }
    }

    // Element offsets `at` and lengths are whole rows, so for Q8_0 they are multiples of 32.

    pub(super) fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Elements::F16(v) => v[at..at + src.len()].convert_from_f32_slice(src),
            Elements::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Elements::Q8_0(v) => {
                debug_assert!(at.is_multiple_of(QK8_0) && src.len().is_multiple_of(QK8_0));
                let b = at / QK8_0;
                for (blk, x) in v[b..b + src.len() / QK8_0]
                    .iter_mut()
                    .zip(src.chunks_exact(QK8_0))
                {
                    *blk = BlockQ8_0::quantize(x);
                }
            }
        }
    }

    pub(super) fn rows(&self, r: std::ops::Range<usize>) -> KvRows<'_> {
        match self {
            Elements::F16(v) => KvRows::F16(&v[r]),
            Elements::F32(v) => KvRows::F32(&v[r]),
            Elements::Q8_0(v) => KvRows::Q8_0(&v[r.start / QK8_0..r.end / QK8_0]),
        }
    }

    pub(super) fn read(&self, at: usize, dst: &mut [f32]) {
        match self {
            Elements::F16(v) => v[at..at + dst.len()].convert_to_f32_slice(dst),
            Elements::F32(v) => dst.copy_from_slice(&v[at..at + dst.len()]),
            Elements::Q8_0(v) => {
                debug_assert!(at.is_multiple_of(QK8_0) && dst.len().is_multiple_of(QK8_0));
                let b = at / QK8_0;
                for (blk, d) in v[b..b + dst.len() / QK8_0]
                    .iter()
                    .zip(dst.chunks_exact_mut(QK8_0))
                {
                    blk.dequantize(d);
                }
            }
        }
    }

    /// Overwrite elements `r` from their raw little-endian bytes (exactly their size).
    pub(super) fn import(&mut self, r: std::ops::Range<usize>, src: &[u8]) {
        match self {
            Elements::F16(v) => {
                for (d, c) in v[r].iter_mut().zip(src.chunks_exact(2)) {
                    *d = f16::from_le_bytes([c[0], c[1]]);
                }
            }
            Elements::F32(v) => {
                for (d, c) in v[r].iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            Elements::Q8_0(v) => {
                for (d, c) in v[r.start / QK8_0..r.end / QK8_0]
                    .iter_mut()
                    .zip(src.chunks_exact(BLOCK_Q8_0_BYTES))
                {
                    *d = block_from_bytes(c);
                }
            }
        }
    }

    /// Copy elements `src_r` of `other` (same type) to `dst_at..`.
    pub(super) fn copy_from(
        &mut self,
        dst_at: usize,
        other: &Elements,
        src_r: std::ops::Range<usize>,
    ) -> Result<(), String> {
        let len = src_r.len();
        match (self, other) {
            (Elements::F16(d), Elements::F16(s)) => {
                d[dst_at..dst_at + len].copy_from_slice(&s[src_r])
            }
            (Elements::F32(d), Elements::F32(s)) => {
                d[dst_at..dst_at + len].copy_from_slice(&s[src_r])
            }
            (Elements::Q8_0(d), Elements::Q8_0(s)) => {
                let (a, b) = (dst_at / QK8_0, src_r.start / QK8_0);
                let nb = len / QK8_0;
                d[a..a + nb].copy_from_slice(&s[b..b + nb]);
            }
            _ => return Err("KV caches of different types".into()),
        }
        Ok(())
    }
}

impl Elements {
    /// The element type.
    pub(super) fn kind(&self) -> KvType {
        match self {
            Elements::F16(_) => KvType::F16,
            Elements::F32(_) => KvType::F32,
            Elements::Q8_0(_) => KvType::Q8_0,
        }
    }

    /// Elements held (values; for Q8_0, 32 per block).
    pub(super) fn len(&self) -> usize {
        match self {
            Elements::F16(v) => v.len(),
            Elements::F32(v) => v.len(),
            Elements::Q8_0(v) => v.len() * QK8_0,
        }
    }

    /// Make room for `len` elements (new ones zero; never shrinks).
    pub(super) fn grow(&mut self, len: usize) {
        if len <= self.len() {
            return;
        }
        match self {
            Elements::F16(v) => v.resize(len, f16::ZERO),
            Elements::F32(v) => v.resize(len, 0.0),
            Elements::Q8_0(v) => v.resize(len / QK8_0, bytemuck::Zeroable::zeroed()),
        }
    }

    /// Overwrite elements from `at` with `rows` (of this type), bit for bit.
    pub(super) fn put(&mut self, at: usize, rows: &KvRows<'_>) {
        match (self, rows) {
            (Elements::F16(d), KvRows::F16(s)) => d[at..at + s.len()].copy_from_slice(s),
            (Elements::F32(d), KvRows::F32(s)) => d[at..at + s.len()].copy_from_slice(s),
            (Elements::Q8_0(d), KvRows::Q8_0(s)) => {
                d[at / QK8_0..at / QK8_0 + s.len()].copy_from_slice(s)
            }
            _ => unreachable!("rows of one store have one element type"),
        }
    }

    /// Copy elements `src` to `dst_at..` within this buffer (ranges may not overlap).
    pub(super) fn copy_within(&mut self, src: std::ops::Range<usize>, dst_at: usize) {
        match self {
            Elements::F16(v) => v.copy_within(src, dst_at),
            Elements::F32(v) => v.copy_within(src, dst_at),
            Elements::Q8_0(v) => v.copy_within(src.start / QK8_0..src.end / QK8_0, dst_at / QK8_0),
        }
    }
}
