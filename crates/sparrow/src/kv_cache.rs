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

/// A run of cache rows borrowed in the cache's element type.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
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

    fn rows(&self, r: std::ops::Range<usize>) -> KvRows<'_> {
        match self {
            Store::F16(v) => KvRows::F16(&v[r]),
            Store::F32(v) => KvRows::F32(&v[r]),
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

    /// Keys of positions `start..start + n` of `layer`, borrowed in the cache's element type
    /// (`n × kv_dim` elements, position-major): attention reads them without a copy.
    pub fn key_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        self.k.rows(self.span(layer, start, n))
    }

    /// Values of positions `start..start + n` of `layer`, like [`KvCache::key_rows`].
    pub fn value_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        self.v.rows(self.span(layer, start, n))
    }

    fn span(&self, layer: usize, start: usize, n: usize) -> std::ops::Range<usize> {
        assert!(
            layer < self.n_layer && start + n <= self.n_ctx,
            "KV index out of range"
        );
        let at = (layer * self.n_ctx + start) * self.kv_dim;
        at..at + n * self.kv_dim
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

/// Export and import of the first positions (prompt cache files, prefix reuse). Added for the
/// serving issue; nothing above depends on it.
impl KvCache {
    /// Bytes of one element (2 for f16, 4 for f32).
    pub fn elem_bytes(&self) -> usize {
        match self.ty {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }

    /// Bytes [`KvCache::export_prefix`] produces for `n` positions.
    pub fn prefix_bytes(&self, n: usize) -> usize {
        2 * self.n_layer * n * self.kv_dim * self.elem_bytes()
    }

    /// Keys then values of positions `0..n`, layer by layer, as little-endian raw elements
    /// of the cache type.
    pub fn export_prefix(&self, n: usize) -> Vec<u8> {
        assert!(n <= self.n_ctx, "export beyond the cache");
        let mut out = Vec::with_capacity(self.prefix_bytes(n));
        for l in 0..self.n_layer {
            let r = l * self.n_ctx * self.kv_dim..(l * self.n_ctx + n) * self.kv_dim;
            for s in [&self.k, &self.v] {
                match s {
                    Store::F16(v) => v[r.clone()]
                        .iter()
                        .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
                    Store::F32(v) => v[r.clone()]
                        .iter()
                        .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
                }
            }
        }
        out
    }

    /// Overwrite positions `0..n` from bytes made by [`KvCache::export_prefix`] of a cache
    /// with the same type and shape.
    pub fn import_prefix(&mut self, n: usize, bytes: &[u8]) -> Result<(), String> {
        if n > self.n_ctx {
            return Err(format!(
                "{n} cached positions do not fit a context of {}",
                self.n_ctx
            ));
        }
        if bytes.len() != self.prefix_bytes(n) {
            return Err(format!(
                "KV data has {} bytes, expected {} for {n} positions",
                bytes.len(),
                self.prefix_bytes(n)
            ));
        }
        let per = n * self.kv_dim * self.elem_bytes();
        let mut chunks = bytes.chunks_exact(per.max(1));
        for l in 0..self.n_layer {
            let start = l * self.n_ctx * self.kv_dim;
            for which in 0..2 {
                let src = if per == 0 {
                    &[][..]
                } else {
                    chunks.next().unwrap_or(&[])
                };
                let store = if which == 0 { &mut self.k } else { &mut self.v };
                match store {
                    Store::F16(v) => {
                        for (d, c) in v[start..start + n * self.kv_dim]
                            .iter_mut()
                            .zip(src.chunks_exact(2))
                        {
                            *d = f16::from_le_bytes([c[0], c[1]]);
                        }
                    }
                    Store::F32(v) => {
                        for (d, c) in v[start..start + n * self.kv_dim]
                            .iter_mut()
                            .zip(src.chunks_exact(4))
                        {
                            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Copy positions `0..n` of every layer from `other` (same type and width).
    pub fn copy_prefix_from(&mut self, other: &KvCache, n: usize) -> Result<(), String> {
        if other.ty != self.ty || other.kv_dim != self.kv_dim || other.n_layer != self.n_layer {
            return Err("KV caches of different shapes".into());
        }
        if n > self.n_ctx || n > other.n_ctx {
            return Err("prefix longer than a cache".into());
        }
        for l in 0..self.n_layer {
            let (a, b) = (l * self.n_ctx * self.kv_dim, l * other.n_ctx * other.kv_dim);
            let len = n * self.kv_dim;
            match (&mut self.k, &other.k, &mut self.v, &other.v) {
                (Store::F16(dk), Store::F16(sk), Store::F16(dv), Store::F16(sv)) => {
                    dk[a..a + len].copy_from_slice(&sk[b..b + len]);
                    dv[a..a + len].copy_from_slice(&sv[b..b + len]);
                }
                (Store::F32(dk), Store::F32(sk), Store::F32(dv), Store::F32(sv)) => {
                    dk[a..a + len].copy_from_slice(&sk[b..b + len]);
                    dv[a..a + len].copy_from_slice(&sv[b..b + len]);
                }
                _ => return Err("KV caches of different types".into()),
            }
        }
        Ok(())
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

    #[test]
    fn prefix_export_import_round_trip() {
        for ty in [KvType::F16, KvType::F32] {
            let mut a = KvCache::new(ty, 2, 4, 3);
            a.write(0, 0, &[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]);
            a.write(1, 1, &[-1.0, -2.0, -3.0], &[0.5, 0.25, 0.125]);
            a.write(1, 2, &[9.0; 3], &[9.0; 3]);
            let bytes = a.export_prefix(2);
            assert_eq!(bytes.len(), a.prefix_bytes(2));
            let mut b = KvCache::new(ty, 2, 8, 3);
            b.import_prefix(2, &bytes).unwrap();
            let mut k = [0.0; 3];
            b.read_keys(1, 1, &mut k);
            assert_eq!(k, [-1.0, -2.0, -3.0]);
            b.read_keys(1, 2, &mut k);
            assert_eq!(k, [0.0; 3]);
            assert!(b.import_prefix(3, &bytes).is_err());
            let mut c = KvCache::new(ty, 2, 4, 3);
            c.copy_prefix_from(&b, 2).unwrap();
            assert_eq!(c.export_prefix(2), bytes);
        }
    }
}
