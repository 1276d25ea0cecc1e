//! The RAM store: keys and values of every past position, per layer, of the element types
//! in [`super::types`], all in anonymous memory.
//!
//! Layout per layer is `[position][kv_head * head_dim]`, so one position's keys for all heads
//! are contiguous and a run of positions is a contiguous tile. A Q8_0 row is `kv_dim / 32`
//! blocks of ggml's `block_q8_0` (an f16 scale `d` and 32 `i8` quants, 34 bytes), so Q8_0
//! needs `kv_dim` (and, for attention, the head size) to be a multiple of 32.
//! The buffers are zero-initialised allocations: the OS backs them lazily, so a large
//! `-c` costs memory only as positions are actually written.

use super::elements::Elements;
use super::store::{export_prefix, KvStore, StoreLayer};
use super::types::{KvRows, KvType, KvTypes, QK8_0};

/// Keys and values for `n_layer` layers and up to `n_ctx` positions.
pub struct RamStore {
    /// One past the highest position written (any layer).
    high_water: usize,
    types: KvTypes,
    n_layer: usize,
    n_ctx: usize,
    kv_dim: usize,
    /// Rows each layer holds: `n_ctx`, or fewer for a layer that is a ring (a sliding-window
    /// layer keeps only its window: position `p` lives in row `p % rows`).
    rows: Vec<usize>,
    /// Where each layer's rows start (elements).
    base: Vec<usize>,
    /// Per layer, the lowest position whose row has not been overwritten by a later one
    /// (0 for a layer that is not a ring): what a rewind may keep.
    intact_from: Vec<usize>,
    k: Elements,
    v: Elements,
}

impl RamStore {
    /// A cache for `n_ctx` positions of width `kv_dim` (kv heads × head size) per layer, with
    /// keys and values of `types` (one [`KvType`] for both, or a [`KvTypes`]).
    ///
    /// Panics when the shape does not suit the types (see [`RamStore::try_new`]).
    pub fn new(types: impl Into<KvTypes>, n_layer: usize, n_ctx: usize, kv_dim: usize) -> Self {
        Self::try_new(types, n_layer, n_ctx, kv_dim, kv_dim).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`RamStore::new`], but a Q8_0 key or value cache whose `head_dim` (which must
    /// divide `kv_dim`) is not a multiple of 32 is an error, as is a size that overflows.
    pub fn try_new(
        types: impl Into<KvTypes>,
        n_layer: usize,
        n_ctx: usize,
        kv_dim: usize,
        head_dim: usize,
    ) -> Result<Self, String> {
        if n_layer
            .checked_mul(n_ctx)
            .and_then(|x| x.checked_mul(kv_dim))
            .and_then(|x| x.checked_mul(4))
            .is_none()
        {
            return Err(format!(
                "KV cache of {n_layer} layers × {n_ctx} positions × {kv_dim} is too large"
            ));
        }
        Self::with_rings(types, &vec![None; n_layer], n_ctx, kv_dim, head_dim)
    }

    /// Like [`RamStore::try_new`], with one entry per layer: `None` for a layer that holds
    /// every position, `Some(rows)` for a ring of that many rows (a sliding-window layer,
    /// whose memory then does not grow with the context).
    pub fn with_rings(
        types: impl Into<KvTypes>,
        rings: &[Option<usize>],
        n_ctx: usize,
        kv_dim: usize,
        head_dim: usize,
    ) -> Result<Self, String> {
        let types = types.into();
        for (what, ty) in [("key", types.k), ("value", types.v)] {
            if ty == KvType::Q8_0
                && (head_dim == 0
                    || !head_dim.is_multiple_of(QK8_0)
                    || !kv_dim.is_multiple_of(head_dim))
            {
                return Err(format!(
                    "{what} cache type q8_0 needs a head size that is a multiple of {QK8_0}; \
                     this model's is {head_dim} (use f16 or f32)"
                ));
            }
        }
        let n_layer = rings.len();
        let rows: Vec<usize> = rings
            .iter()
            .map(|r| r.map_or(n_ctx, |r| r.clamp(1, n_ctx.max(1))))
            .collect();
        let too_large =
            || format!("KV cache of {n_layer} layers × {n_ctx} positions × {kv_dim} is too large");
        let mut base = Vec::with_capacity(n_layer);
        let mut len = 0usize;
        for &r in &rows {
            base.push(len);
            len = r
                .checked_mul(kv_dim)
                .and_then(|x| x.checked_add(len))
                .ok_or_else(too_large)?;
        }
        if len.checked_mul(4).is_none() {
            return Err(too_large());
        }
        Ok(RamStore {
            high_water: 0,
            types,
            n_layer,
            n_ctx,
            kv_dim,
            rows,
            base,
            intact_from: vec![0; n_layer],
            k: Elements::zeroed(types.k, len),
            v: Elements::zeroed(types.v, len),
        })
    }

    /// Element types of keys and values.
    pub fn types(&self) -> KvTypes {
        self.types
    }

    /// Element type of the keys (see [`RamStore::types`] for both).
    pub fn kv_type(&self) -> KvType {
        self.types.k
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
        self.base[layer] + (pos % self.rows[layer]) * self.kv_dim
    }

    /// Rows `layer` holds (`n_ctx` unless it is a ring).
    pub fn layer_rows(&self, layer: usize) -> usize {
        self.rows[layer]
    }

    /// The lowest position of `layer` whose row still holds it (a ring overwrites its
    /// oldest rows as it goes round); every position from there up to the highest written
    /// is readable.
    pub fn intact_from(&self, layer: usize) -> usize {
        self.intact_from[layer]
    }

    /// How many rows from position `start` of `layer` (at most `max`) lie contiguously in
    /// memory: a ring's run ends where it wraps.
    pub fn run_len(&self, layer: usize, start: usize, max: usize) -> usize {
        let r = self.rows[layer];
        max.min(r - start % r)
    }

    /// Store the keys and values of `pos` in `layer`.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        assert!(
            k.len() == self.kv_dim && v.len() == self.kv_dim,
            "KV row width"
        );
        let at = self.offset(layer, pos);
        self.k.write(at, k);
        self.v.write(at, v);
        self.high_water = self.high_water.max(pos + 1);
        let lost = (pos + 1).saturating_sub(self.rows[layer]);
        self.intact_from[layer] = self.intact_from[layer].max(lost);
    }

    fn check_read(&self, layer: usize, start: usize, len: usize) -> usize {
        let n = len / self.kv_dim.max(1);
        assert!(
            len.is_multiple_of(self.kv_dim.max(1))
                && start + n <= self.n_ctx
                && (n == 0 || self.run_len(layer, start, n) == n),
            "KV read must cover whole rows within the cache"
        );
        self.offset(layer, start)
    }

    /// Read keys of positions `start..start + n` of `layer` into `dst` (n × kv_dim) as f32.
    pub fn read_keys(&self, layer: usize, start: usize, dst: &mut [f32]) {
        let at = self.check_read(layer, start, dst.len());
        self.k.read(at, dst);
    }

    /// Read values of positions `start..start + n` of `layer` into `dst` (n × kv_dim) as f32.
    pub fn read_values(&self, layer: usize, start: usize, dst: &mut [f32]) {
        let at = self.check_read(layer, start, dst.len());
        self.v.read(at, dst);
    }

    /// Keys of positions `start..start + n` of `layer`, borrowed in the cache's element type
    /// (`n × kv_dim` elements, position-major; `n × kv_dim / 32` blocks for Q8_0): attention
    /// reads them without a copy.
    pub fn key_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        self.k.rows(self.span(layer, start, n))
    }

    /// Values of positions `start..start + n` of `layer`, like [`RamStore::key_rows`].
    pub fn value_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        self.v.rows(self.span(layer, start, n))
    }

    /// One layer's rows as a `sparrow_attn::kernel::KvSource` for the attention kernels.
    pub fn layer(&self, layer: usize) -> StoreLayer<'_, RamStore> {
        assert!(layer < self.n_layer, "KV layer out of range");
        StoreLayer { store: self, layer }
    }

    /// Element range of positions `start..start + n` of `layer`, which must be one run
    /// ([`RamStore::run_len`]).
    fn span(&self, layer: usize, start: usize, n: usize) -> std::ops::Range<usize> {
        assert!(
            layer < self.n_layer
                && start + n <= self.n_ctx
                && (n == 0 || self.run_len(layer, start, n) == n),
            "KV index out of range"
        );
        let at = self.base[layer] + (start % self.rows[layer]) * self.kv_dim;
        at..at + n * self.kv_dim
    }

    /// Bytes of keys plus values of one position in one layer.
    pub fn row_bytes(&self) -> usize {
        self.types.k.row_bytes(self.kv_dim) + self.types.v.row_bytes(self.kv_dim)
    }

    /// Bytes of keys plus values one more position adds across all layers once every ring
    /// is full: the layers that hold every position (all of them, without rings).
    pub fn bytes_per_token(&self) -> usize {
        self.rows.iter().filter(|&&r| r == self.n_ctx).count() * self.row_bytes()
    }

    /// Bytes the first `n` positions occupy: each layer holds `min(n, its rows)`.
    pub fn bytes_for(&self, n: usize) -> usize {
        self.rows.iter().map(|&r| n.min(r)).sum::<usize>() * self.row_bytes()
    }

    /// One past the highest position written so far.
    pub fn high_water(&self) -> usize {
        self.high_water
    }

    /// Bytes held for keys and values.
    pub fn bytes(&self) -> usize {
        self.bytes_for(self.n_ctx)
    }
}

/// Export and import of the first positions (prompt cache files, prefix reuse). Added for the
/// serving issue; nothing above depends on it.
impl RamStore {
    /// Bytes [`RamStore::export_prefix`] produces for `n` positions.
    pub fn prefix_bytes(&self, n: usize) -> usize {
        self.bytes_for(n)
    }

    /// The positions of `layer` a prefix of `n` keeps: all of them, or a ring's last rows.
    fn kept(&self, layer: usize, n: usize) -> std::ops::Range<usize> {
        n - n.min(self.rows[layer])..n
    }

    /// Element ranges (at most two: a ring may wrap) holding positions `p` of `layer`.
    fn runs(&self, layer: usize, p: std::ops::Range<usize>) -> Vec<std::ops::Range<usize>> {
        let mut out = Vec::with_capacity(2);
        let mut at = p.start;
        while at < p.end {
            let n = self.run_len(layer, at, p.end - at);
            out.push(self.span(layer, at, n));
            at += n;
        }
        out
    }

    /// Keys then values of positions `0..n`, layer by layer, as little-endian raw data of
    /// each one's type (for Q8_0, ggml's 34-byte blocks). A ring layer contributes its last
    /// `min(n, rows)` positions, in position order.
    pub fn export_prefix(&self, n: usize) -> Vec<u8> {
        export_prefix(self, n)
    }

    /// Overwrite positions `0..n` from bytes made by [`RamStore::export_prefix`] of a cache
    /// with the same types and shape.
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
        let mut at = 0;
        for l in 0..self.n_layer {
            let (kb, vb) = self.layer_prefix_bytes(l, n);
            let (k, rest) = bytes[at..].split_at(kb);
            self.import_layer(l, n, k, &rest[..vb]);
            at += kb + vb;
        }
        Ok(())
    }

    /// Bytes of keys and of values layer `l` contributes to a prefix of `n` positions.
    pub fn layer_prefix_bytes(&self, l: usize, n: usize) -> (usize, usize) {
        let kept = self.kept(l, n).len();
        (
            kept * self.types.k.row_bytes(self.kv_dim),
            kept * self.types.v.row_bytes(self.kv_dim),
        )
    }

    /// Overwrite layer `l`'s share of a prefix of `n` positions (what
    /// [`RamStore::layer_prefix_bytes`] sizes) from raw keys `k` and values `v`.
    pub fn import_layer(&mut self, l: usize, n: usize, k: &[u8], v: &[u8]) {
        let (krow, vrow) = (
            self.types.k.row_bytes(self.kv_dim),
            self.types.v.row_bytes(self.kv_dim),
        );
        let kept = self.kept(l, n);
        let (mut ka, mut va) = (0, 0);
        for r in self.runs(l, kept.clone()) {
            let rows = r.len() / self.kv_dim.max(1);
            self.k.import(r.clone(), &k[ka..ka + rows * krow]);
            self.v.import(r, &v[va..va + rows * vrow]);
            ka += rows * krow;
            va += rows * vrow;
        }
        self.intact_from[l] = kept.start;
        self.high_water = self.high_water.max(n);
    }

    /// Copy positions `0..n` of every layer from `other` (same types, width and rows).
    pub fn copy_prefix_from(&mut self, other: &RamStore, n: usize) -> Result<(), String> {
        if other.types != self.types {
            return Err(format!(
                "KV caches of different types ({} and {})",
                other.types, self.types
            ));
        }
        if other.kv_dim != self.kv_dim || other.n_layer != self.n_layer {
            return Err("KV caches of different shapes".into());
        }
        if n > self.n_ctx || n > other.n_ctx {
            return Err("prefix longer than a cache".into());
        }
        for l in 0..self.n_layer {
            let kept = self.kept(l, n);
            if other.kept(l, n) != kept || other.intact_from[l] > kept.start {
                return Err("KV caches of different ring sizes".into());
            }
            let mut at = kept.start;
            while at < kept.end {
                let len =
                    self.run_len(l, at, kept.end - at)
                        .min(other.run_len(l, at, kept.end - at));
                let dst = self.span(l, at, len).start;
                self.k.copy_from(dst, &other.k, other.span(l, at, len))?;
                self.v.copy_from(dst, &other.v, other.span(l, at, len))?;
                at += len;
            }
            self.intact_from[l] = kept.start;
        }
        self.high_water = self.high_water.max(n);
        Ok(())
    }
}

/// The RAM store: one contiguous, lazily backed buffer per layer. Everything is resident,
/// so prefetching has nothing to do.
impl KvStore for RamStore {
    fn kv_dim(&self) -> usize {
        RamStore::kv_dim(self)
    }
    fn n_layer(&self) -> usize {
        RamStore::n_layer(self)
    }
    fn types(&self) -> KvTypes {
        RamStore::types(self)
    }
    fn bytes_per_token(&self) -> usize {
        RamStore::bytes_per_token(self)
    }
    fn n_ctx(&self) -> usize {
        RamStore::n_ctx(self)
    }
    fn append(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), String> {
        self.write(layer, pos, k, v);
        Ok(())
    }
    fn key_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        RamStore::key_rows(self, layer, start, n)
    }
    fn value_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        RamStore::value_rows(self, layer, start, n)
    }
    fn run_len(&self, layer: usize, start: usize, max: usize) -> usize {
        RamStore::run_len(self, layer, start, max)
    }
    fn intact_from(&self, layer: usize) -> usize {
        RamStore::intact_from(self, layer)
    }
    fn layer_rows(&self, layer: usize) -> usize {
        RamStore::layer_rows(self, layer)
    }
    /// The rows of the positions written so far (the high-water mark; a ring at most its
    /// rows): the untouched rest of the zeroed allocation is not backed by memory.
    fn bytes_resident(&self) -> usize {
        self.bytes_for(self.high_water())
    }
    fn import_prefix(&mut self, n: usize, bytes: &[u8]) -> Result<(), String> {
        RamStore::import_prefix(self, n, bytes)
    }
    fn import_layer(
        &mut self,
        layer: usize,
        n: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), String> {
        super::store::check_layer_import(self, layer, n, keys, values)?;
        RamStore::import_layer(self, layer, n, keys, values);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::types::BlockQ8_0;

    use sparrow_attn::kernel::reference::uniform as rng;

    #[test]
    fn kv_type_names_parse() {
        for t in [KvType::F16, KvType::F32, KvType::Q8_0] {
            assert_eq!(t.name().parse::<KvType>().unwrap(), t);
            assert_eq!(t.to_string(), t.name());
        }
        assert_eq!("Q8_0".parse::<KvType>().unwrap(), KvType::Q8_0);
        let e = "q4_0".parse::<KvType>().unwrap_err();
        assert!(e.contains("q4_0") && e.contains("f16, f32, q8_0"), "{e}");
        assert_eq!(
            KvTypes::new(KvType::F16, KvType::Q8_0).to_string(),
            "f16/q8_0"
        );
    }

    #[test]
    fn f16_and_f32_round_trip() {
        for ty in [KvType::F16, KvType::F32] {
            let mut c = RamStore::new(ty, 2, 4, 3);
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

    /// Every element of a Q8_0 row reads back within half its block's stored scale of the
    /// f32 value, the scale is ggml's `max|x| / 127` (to f16 rounding), and the quants use
    /// the full ±127 range; mixed K/V types keep each side's own precision.
    #[test]
    fn q8_0_round_trip_within_half_a_step() {
        let kv_dim = 128;
        let mut r = rng(3);
        let mut c = RamStore::new(KvTypes::new(KvType::Q8_0, KvType::F32), 3, 5, kv_dim);
        let mut q = RamStore::new(KvType::Q8_0, 3, 5, kv_dim);
        for scale in [1e-3f32, 0.7, 30.0, 900.0] {
            // Blocks with very different magnitudes, including an all-zero block.
            let mut k: Vec<f32> = (0..kv_dim)
                .map(|i| r() * scale * (1 + i / 32) as f32)
                .collect();
            k[64..96].fill(0.0);
            let v: Vec<f32> = (0..kv_dim).map(|_| r() * scale).collect();
            c.write(2, 3, &k, &v);
            q.write(2, 3, &k, &v);
            let (mut gk, mut gv) = (vec![0.0; kv_dim], vec![0.0; kv_dim]);
            c.read_keys(2, 3, &mut gk);
            c.read_values(2, 3, &mut gv);
            assert_eq!(gv, v, "f32 values stay exact");
            let KvRows::Q8_0(blocks) = c.key_rows(2, 3, 1) else {
                panic!("keys are q8_0")
            };
            assert_eq!(blocks.len(), kv_dim / QK8_0);
            let mut worst = 0.0f32;
            for (b, blk) in blocks.iter().enumerate() {
                let x = &k[b * QK8_0..][..QK8_0];
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = blk.d.to_f32();
                assert!(
                    (d - amax / 127.0).abs() <= amax / 127.0 * 1e-3 + 1e-7,
                    "{d}"
                );
                if amax > 0.0 {
                    assert_eq!(blk.qs.iter().map(|q| q.unsigned_abs()).max(), Some(127));
                }
                for (j, (&a, &g)) in x.iter().zip(&gk[b * QK8_0..][..QK8_0]).enumerate() {
                    let err = (a - g).abs();
                    assert!(
                        err <= d / 2.0 * (1.0 + 1e-5),
                        "block {b} elem {j}: {a} read {g}, d {d}"
                    );
                    worst = worst.max(err / d.max(f32::MIN_POSITIVE));
                }
            }
            assert!(
                worst > 0.3,
                "round-to-nearest should use most of d/2: {worst}"
            );
            // Keys and values of a q8_0/q8_0 cache are quantized alike.
            let mut qv = vec![0.0; kv_dim];
            q.read_values(2, 3, &mut qv);
            let mut want = vec![0.0; kv_dim];
            for (blk, d) in v.chunks_exact(32).zip(want.chunks_exact_mut(32)) {
                BlockQ8_0::quantize(blk).dequantize(d);
            }
            assert_eq!(qv, want);
        }
        // Other positions and layers are untouched (zero).
        let mut z = vec![1.0; 2 * kv_dim];
        c.read_keys(2, 1, &mut z);
        assert!(z.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn q8_0_needs_whole_blocks_per_head() {
        assert!(RamStore::try_new(KvType::Q8_0, 2, 4, 128, 64).is_ok());
        assert!(RamStore::try_new(KvType::Q8_0, 2, 4, 128, 128).is_ok());
        let e = RamStore::try_new(KvTypes::new(KvType::F16, KvType::Q8_0), 2, 4, 96, 48)
            .err()
            .unwrap();
        assert!(
            e.contains("value cache type q8_0") && e.contains("48"),
            "{e}"
        );
        let e = RamStore::try_new(KvType::Q8_0, 2, 4, 40, 20).err().unwrap();
        assert!(e.contains("key cache"), "{e}");
        // Not q8_0: any width.
        assert!(RamStore::try_new(KvType::F16, 2, 4, 40, 20).is_ok());
        assert!(RamStore::try_new(KvType::F32, usize::MAX, 4, 40, 20).is_err());
    }

    #[test]
    fn bytes_per_token_sums_both_sides() {
        // Qwen2.5-0.5B: 24 layers, 2 kv heads of 64.
        let bpt = |k, v| RamStore::new(KvTypes::new(k, v), 24, 1, 128).bytes_per_token();
        assert_eq!(bpt(KvType::F16, KvType::F16), 12_288);
        assert_eq!(bpt(KvType::F32, KvType::F32), 24_576);
        assert_eq!(bpt(KvType::Q8_0, KvType::Q8_0), 6_528);
        assert_eq!(bpt(KvType::F16, KvType::Q8_0), 9_408);
        assert_eq!(RamStore::new(KvType::Q8_0, 24, 10, 128).bytes(), 10 * 6_528);
    }

    #[test]
    fn prefix_export_import_round_trip() {
        let types = [
            KvTypes::from(KvType::F16),
            KvTypes::from(KvType::F32),
            KvTypes::from(KvType::Q8_0),
            KvTypes::new(KvType::Q8_0, KvType::F16),
            KvTypes::new(KvType::F32, KvType::Q8_0),
        ];
        for ty in types {
            let w = 64;
            let row = |x: f32| -> Vec<f32> { (0..w).map(|i| x + i as f32 * 0.25).collect() };
            let mut a = RamStore::new(ty, 2, 4, w);
            a.write(0, 0, &row(1.0), &row(4.0));
            a.write(1, 1, &row(-1.0), &row(0.5));
            a.write(1, 2, &row(9.0), &row(9.0));
            let bytes = a.export_prefix(2);
            assert_eq!(bytes.len(), a.prefix_bytes(2));
            assert_eq!(bytes.len(), 2 * a.bytes_per_token());
            let mut b = RamStore::new(ty, 2, 8, w);
            b.import_prefix(2, &bytes).unwrap();
            let (mut ka, mut kb) = (vec![0.0; w], vec![0.0; w]);
            a.read_keys(1, 1, &mut ka);
            b.read_keys(1, 1, &mut kb);
            assert_eq!(ka, kb, "{ty}");
            a.read_values(1, 1, &mut ka);
            b.read_values(1, 1, &mut kb);
            assert_eq!(ka, kb, "{ty}");
            b.read_keys(1, 2, &mut kb);
            assert_eq!(kb, vec![0.0; w]);
            assert!(b.import_prefix(3, &bytes).is_err());
            let mut c = RamStore::new(ty, 2, 4, w);
            c.copy_prefix_from(&b, 2).unwrap();
            assert_eq!(c.export_prefix(2), bytes);
            let other = if ty.k == KvType::Q8_0 {
                KvType::F16
            } else {
                KvType::Q8_0
            };
            let mut d = RamStore::new(KvTypes::new(other, ty.v), 2, 4, w);
            assert!(d.copy_prefix_from(&b, 2).unwrap_err().contains("types"));
        }
    }

    /// A layer kept as a ring of 5 rows beside a full one: position `p` reads back what was
    /// written for it while it is among the last 5, runs end where the ring wraps, and
    /// `intact_from` says which positions are still there.
    #[test]
    fn ring_layers_hold_their_last_rows() {
        let row = |l: usize, p: usize| [l as f32 * 100.0 + p as f32, -(p as f32)];
        let mut c = RamStore::with_rings(KvType::F32, &[None, Some(5)], 16, 2, 2).unwrap();
        assert_eq!((c.layer_rows(0), c.layer_rows(1)), (16, 5));
        for p in 0..12 {
            for l in 0..2 {
                c.write(l, p, &row(l, p), &row(l, p));
            }
        }
        assert_eq!((c.intact_from(0), c.intact_from(1)), (0, 7));
        let mut k = [0.0; 2];
        for p in 7..12 {
            c.read_keys(1, p, &mut k);
            assert_eq!(k, row(1, p), "position {p}");
        }
        for p in 0..12 {
            c.read_keys(0, p, &mut k);
            assert_eq!(k, row(0, p));
        }
        // Positions 7..12 sit in rows 2,3,4,0,1: the run from 7 ends at the wrap.
        assert_eq!(c.run_len(1, 7, 5), 3);
        assert_eq!(c.run_len(1, 10, 2), 2);
        assert_eq!(c.run_len(0, 7, 5), 5);
        // One more position per layer adds only the full layer's row.
        assert_eq!(c.bytes_per_token(), c.row_bytes());
        assert_eq!(c.bytes_for(12), (12 + 5) * c.row_bytes());
        // Export keeps the ring's last positions; an import into another ring cache reads
        // the same rows back.
        let bytes = c.export_prefix(12);
        assert_eq!(bytes.len(), c.prefix_bytes(12));
        let mut d = RamStore::with_rings(KvType::F32, &[None, Some(5)], 16, 2, 2).unwrap();
        d.import_prefix(12, &bytes).unwrap();
        assert_eq!(d.intact_from(1), 7);
        for p in 7..12 {
            d.read_keys(1, p, &mut k);
            assert_eq!(k, row(1, p));
        }
        let mut e = RamStore::with_rings(KvType::F32, &[None, Some(5)], 16, 2, 2).unwrap();
        e.copy_prefix_from(&c, 12).unwrap();
        assert_eq!(e.export_prefix(12), bytes);
        // A ring that has lost positions the copy needs is refused.
        let mut f = RamStore::with_rings(KvType::F32, &[None, Some(8)], 16, 2, 2).unwrap();
        assert!(f.copy_prefix_from(&c, 12).is_err());
    }
}
