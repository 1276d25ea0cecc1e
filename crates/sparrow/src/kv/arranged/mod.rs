//! A store whose sparse layers keep their sealed rows in bins — one copy of the KV, in the
//! order a partitioning policy reads it (Saap's buckets: a chosen bucket is a few contiguous
//! runs). The policy names each sealed row's bin per KV head
//! (`SparsePolicy::placement`, passed on by the block table as [`KvStore::arrange`]); the
//! store moves the rows there. Every other reader still reads by position, a KV head at a
//! time, through the slot maps ([`KvStore::head_keys`]), so full attention, Quest, exports
//! and prefix caches see the same rows bit for bit.
//!
//! [`ArrangedStore`] wraps the store of the other layers (a [`super::RamStore`]; the
//! arranged layers' share of it is never written, so never backed by memory).
//!
//! Files: [`segments`] (one KV head's complete segments sorted by bin, and the slot maps),
//! [`layer`] (a layer: sorted segments per head and the tail of the open segment).

mod layer;
mod segments;

use super::store::KvStore;
use super::types::{KvRows, KvTypes};
use layer::ArrangedLayer;
use sparrow_attn::kernel::HeadRun;
use sparrow_attn::policy::{Partition, ReadPlan};
use std::ops::Range;

/// A store whose layers with bins are arranged, the others kept by `inner`.
pub struct ArrangedStore {
    inner: Box<dyn KvStore>,
    layers: Vec<Option<ArrangedLayer>>,
}

impl ArrangedStore {
    /// Arrange the layers `partitions` gives a partition for (`None` keeps a layer in
    /// `inner`); heads are `head_dim` values. A layer `inner` keeps as a ring (a sliding
    /// window), or one whose segments are longer than 65,536 positions, is not arranged.
    pub fn new(
        inner: Box<dyn KvStore>,
        partitions: &[Option<Partition>],
        head_dim: usize,
    ) -> Result<Self, String> {
        let (kv_dim, types) = (inner.kv_dim(), inner.types());
        if head_dim == 0 || !kv_dim.is_multiple_of(head_dim) {
            return Err(format!(
                "rows of {kv_dim} values are not KV heads of {head_dim}"
            ));
        }
        let layers = (0..inner.n_layer())
            .map(|l| match partitions.get(l).copied().flatten() {
                Some(p)
                    if p.bins > 0
                        && (1..=segments::MAX_SEGMENT).contains(&p.segment)
                        && inner.layer_rows(l) == inner.n_ctx() =>
                {
                    Some(ArrangedLayer::new(
                        p.bins, p.segment, kv_dim, head_dim, types,
                    ))
                }
                _ => None,
            })
            .collect();
        Ok(ArrangedStore { inner, layers })
    }

    fn arranged(&self, layer: usize) -> Option<&ArrangedLayer> {
        self.layers.get(layer).and_then(Option::as_ref)
    }

    /// Layers arranged.
    pub fn arranged_layers(&self) -> usize {
        self.layers.iter().flatten().count()
    }

    fn row_bytes(&self) -> usize {
        let t = self.types();
        t.k.row_bytes(self.kv_dim()) + t.v.row_bytes(self.kv_dim())
    }
}

const BY_HEAD: &str = "an arranged layer's rows are read a KV head at a time";

impl KvStore for ArrangedStore {
    fn kv_dim(&self) -> usize {
        self.inner.kv_dim()
    }
    fn n_layer(&self) -> usize {
        self.inner.n_layer()
    }
    fn types(&self) -> KvTypes {
        self.inner.types()
    }
    fn bytes_per_token(&self) -> usize {
        self.inner.bytes_per_token()
    }
    fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }
    fn append(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), String> {
        match self.layers.get_mut(layer).and_then(Option::as_mut) {
            Some(a) => a.append(pos, k, v),
            None => self.inner.append(layer, pos, k, v),
        }
    }
    fn key_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        assert!(self.arranged(layer).is_none(), "{BY_HEAD}");
        self.inner.key_rows(layer, start, n)
    }
    fn value_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        assert!(self.arranged(layer).is_none(), "{BY_HEAD}");
        self.inner.value_rows(layer, start, n)
    }
    fn run_len(&self, layer: usize, start: usize, max: usize) -> usize {
        assert!(self.arranged(layer).is_none(), "{BY_HEAD}");
        self.inner.run_len(layer, start, max)
    }
    fn layer_rows(&self, layer: usize) -> usize {
        self.inner.layer_rows(layer)
    }
    fn intact_from(&self, layer: usize) -> usize {
        self.inner.intact_from(layer)
    }
    fn head_run_len(&self, layer: usize, kv_head: usize, start: usize, max: usize) -> usize {
        match self.arranged(layer) {
            Some(a) => a.head_run_len(kv_head, start, max),
            None => self.inner.head_run_len(layer, kv_head, start, max),
        }
    }
    fn head_keys(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        match self.arranged(layer) {
            Some(a) => a.head_rows(false, kv_head, start, n),
            None => self.inner.head_keys(layer, kv_head, hd, start, n),
        }
    }
    fn head_values(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        match self.arranged(layer) {
            Some(a) => a.head_rows(true, kv_head, start, n),
            None => self.inner.head_values(layer, kv_head, hd, start, n),
        }
    }
    fn arrange(&mut self, layer: usize, start: usize, bins: &[u32]) -> Result<(), String> {
        match self.layers.get_mut(layer).and_then(Option::as_mut) {
            Some(a) => a.arrange(start, bins),
            None => Ok(()),
        }
    }
    fn slot_run_len(&self, layer: usize, kv_head: usize, start: usize, max: usize) -> usize {
        match self.arranged(layer) {
            Some(_) => max,
            None => self.inner.slot_run_len(layer, kv_head, start, max),
        }
    }
    fn slot_keys(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        match self.arranged(layer) {
            Some(a) => a.slot_rows(false, kv_head, start, n),
            None => self.inner.slot_keys(layer, kv_head, hd, start, n),
        }
    }
    fn slot_values(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        match self.arranged(layer) {
            Some(a) => a.slot_rows(true, kv_head, start, n),
            None => self.inner.slot_values(layer, kv_head, hd, start, n),
        }
    }
    fn slot_position(&self, layer: usize, kv_head: usize, slot: usize) -> usize {
        match self.arranged(layer) {
            Some(a) => a.slot_position(kv_head, slot),
            None => self.inner.slot_position(layer, kv_head, slot),
        }
    }
    fn bin_slots(
        &self,
        layer: usize,
        kv_head: usize,
        bin: usize,
        entries: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> usize {
        self.arranged(layer)
            .map_or(0, |a| a.bin_slots(kv_head, bin, entries, out))
    }
    fn write_rows(
        &self,
        layer: usize,
        values: bool,
        start: usize,
        n: usize,
        out: &mut dyn std::io::Write,
    ) -> std::io::Result<()> {
        match self.arranged(layer) {
            Some(a) => a.write_rows(values, start, n, out),
            None => self.inner.write_rows(layer, values, start, n, out),
        }
    }
    fn prefetch(&self, layer: usize, plan: &ReadPlan<'_>) {
        if self.arranged(layer).is_none() {
            self.inner.prefetch(layer, plan);
        }
    }
    /// The other layers' rows in `inner` (which counts every layer as written up to its
    /// high-water mark, so the arranged ones' untouched share is taken off), plus the
    /// arranged layers' bins, maps and tails.
    fn bytes_resident(&self) -> usize {
        let arranged: Vec<&ArrangedLayer> = self.layers.iter().flatten().collect();
        let unused: usize = arranged.iter().map(|a| a.len()).max().unwrap_or(0) * self.row_bytes();
        let inner = self
            .inner
            .bytes_resident()
            .saturating_sub(unused * arranged.len());
        inner + arranged.iter().map(|a| a.bytes()).sum::<usize>()
    }
    fn bytes_cold(&self) -> usize {
        self.inner.bytes_cold()
    }
    fn drop_cold_pages(&self) -> Result<(), String> {
        self.inner.drop_cold_pages()
    }
    fn import_layer(
        &mut self,
        layer: usize,
        n: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), String> {
        super::store::check_layer_import(self, layer, n, keys, values)?;
        match self.layers.get_mut(layer).and_then(Option::as_mut) {
            Some(a) => {
                a.import(n, keys, values);
                Ok(())
            }
            None => self.inner.import_layer(layer, n, keys, values),
        }
    }
}
