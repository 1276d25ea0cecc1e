//! The KV cache: keys and values of every past position, per layer, in FP16 by default
//! (half the memory and bandwidth of f32, with errors far below what 4-bit weights already
//! introduce) or f32 on request.
//!
//! Layout per layer is `[position][kv_head * head_dim]`, so one position's keys for all heads
//! are contiguous and a run of positions is a contiguous tile.
//! The buffers are zero-initialised allocations: the OS backs them lazily, so a large
//! `-c` costs memory only as positions are actually written.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    F32,
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            other => Err(format!("unknown KV cache type '{other}' (use f16 or f32)")),
        }
    }
}

enum Store {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

impl Store {
    fn new(ty: KvType, len: usize) -> Self {
        match ty {
            KvType::F16 => Store::F16(vec![f16::ZERO; len]),
            KvType::F32 => Store::F32(vec![0.0; len]),
        }
    }

    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Store::F16(v) => v[at..at + src.len()].convert_from_f32_slice(src),
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
        }
    }

    fn read(&self, at: usize, dst: &mut [f32]) {
        match self {
            Store::F16(v) => v[at..at + dst.len()].convert_to_f32_slice(dst),
            Store::F32(v) => dst.copy_from_slice(&v[at..at + dst.len()]),
        }
    }
}

/// Keys and values for `n_layer` layers and up to `n_ctx` positions.
pub struct KvCache {
    ty: KvType,
    n_layer: usize,
    n_ctx: usize,
    kv_dim: usize,
    k: Store,
    v: Store,
}

impl KvCache {
    /// A cache for `n_ctx` positions of width `kv_dim` (kv heads × head size) per layer.
    pub fn new(ty: KvType, n_layer: usize, n_ctx: usize, kv_dim: usize) -> Self {
        let len = n_layer * n_ctx * kv_dim;
        KvCache {
            ty,
            n_layer,
            n_ctx,
            kv_dim,
            k: Store::new(ty, len),
            v: Store::new(ty, len),
        }
    }

    /// Element type.
    pub fn kv_type(&self) -> KvType {
        self.ty
    }

    /// Maximum number of positions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Number of layers.
    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    /// Width of one position (kv heads × head size).
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    fn offset(&self, layer: usize, pos: usize) -> usize {
        assert!(
            layer < self.n_layer && pos < self.n_ctx,
            "KV index out of range"
        );
        (layer * self.n_ctx + pos) * self.kv_dim
    }

    /// Store the keys and values of `pos` in `layer`.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let at = self.offset(layer, pos);
        self.k.write(at, k);
        self.v.write(at, v);
    }

    /// Read keys of positions `start..start + n` of `layer` into `dst` (n × kv_dim) as f32.
    pub fn read_keys(&self, layer: usize, start: usize, dst: &mut [f32]) {
        let at = self.offset(layer, start);
        self.k.read(at, dst);
    }

    /// Read values of positions `start..start + n` of `layer` into `dst` (n × kv_dim) as f32.
    pub fn read_values(&self, layer: usize, start: usize, dst: &mut [f32]) {
        let at = self.offset(layer, start);
        self.v.read(at, dst);
    }

    /// Bytes held for keys and values.
    pub fn bytes(&self) -> usize {
        let elem = match self.ty {
            KvType::F16 => 2,
            KvType::F32 => 4,
        };
        2 * self.n_layer * self.n_ctx * self.kv_dim * elem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_and_f32_round_trip() {
        for ty in [KvType::F16, KvType::F32] {
            let mut c = KvCache::new(ty, 2, 4, 3);
            c.write(1, 2, &[1.0, -2.5, 0.125], &[4.0, 5.0, 6.0]);
            let mut k = [0.0; 3];
            let mut v = [0.0; 3];
            c.read_keys(1, 2, &mut k);
            c.read_values(1, 2, &mut v);
            assert_eq!(k, [1.0, -2.5, 0.125]);
            assert_eq!(v, [4.0, 5.0, 6.0]);
            c.read_keys(0, 2, &mut k);
            assert_eq!(k, [0.0; 3]);
        }
    }
}
