//! A store whose sparse layers keep their sealed rows in bins — one copy of the KV, in the
//! order a partitioning policy reads it (Saap's buckets: a chosen bucket is a few contiguous
//! runs). The policy names each sealed row's bin per KV head
//! (`SparsePolicy::placement`, passed on by the block table as [`KvStore::arrange`]); the
//! store sorts each complete segment of positions by bin. Every other reader still reads by
//! position, a KV head at a time, through the slot maps ([`KvStore::head_keys`]), so full
//! attention, Quest, exports and prefix caches see the same rows bit for bit.
//!
//! [`ArrangedStore`] wraps the store of the other layers (a [`super::RamStore`], or a
//! [`super::TieredStore`] under a RAM budget). Under a budget the sorted segments go to a
//! file of their own, written a segment at a time in bucket order — a chosen bucket is then
//! a few contiguous ranges of the file, which `prefetch` asks for — while the open segment
//! waits in RAM (its share of the budget, with the slot maps: [`ram_bytes`]). In RAM each
//! position's row has one place: open positions are in the slots their segment will be
//! sorted into, and a segment is sorted where it lies, through one segment of scratch.
//!
//! Files: [`segments`] (one KV head's rows: complete segments sorted by bin, the open
//! positions, the slot maps), [`layer`] (a layer: its heads, and the bins placed while
//! their segment is open).

mod layer;
mod segments;

use super::cold_file::ColdFile;
use super::options::ColdTier;
use super::store::KvStore;
use super::types::{KvRows, KvTypes};
use layer::ArrangedLayer;
use segments::{Backing, Scratch, MAX_SEGMENT};
use sparrow_attn::kernel::HeadRun;
use sparrow_attn::policy::{Partition, ReadPlan, Source};
use std::ops::Range;
use std::sync::Arc;

/// Positions a prefill pass may append beyond the open segment before its blocks are
/// placed (a batch of the default `-b`): what [`ram_bytes`] allows for.
const TAIL_SLACK: usize = 512;

/// Which layers a store arranges: those with a partition (`partitions[l]`) whose segment is
/// at most 65,536 positions, that are not kept as a ring (`rings[l]`: a sliding window).
pub fn arranged_layers(partitions: &[Option<Partition>], rings: &[Option<usize>]) -> Vec<bool> {
    (0..rings.len())
        .map(|l| {
            rings[l].is_none()
                && partitions
                    .get(l)
                    .copied()
                    .flatten()
                    .is_some_and(|p| p.bins > 0 && (1..=MAX_SEGMENT).contains(&p.segment))
        })
        .collect()
}

/// RAM the arranged layers keep when their sorted rows are in a file (under a RAM budget,
/// whose share this is): per arranged layer, the open segment and a batch of rows, and the
/// slot maps (two offsets of two bytes per position and KV head); and one head's segment of
/// scratch to sort through.
pub fn ram_bytes(
    partitions: &[Option<Partition>],
    rings: &[Option<usize>],
    (n_ctx, kv_dim, head_dim): (usize, usize, usize),
    types: KvTypes,
) -> usize {
    let row = types.k.row_bytes(kv_dim) + types.v.row_bytes(kv_dim);
    let heads = kv_dim / head_dim.max(1);
    let layers: Vec<Partition> = arranged_layers(partitions, rings)
        .iter()
        .zip(partitions)
        .filter(|(a, _)| **a)
        .filter_map(|(_, p)| *p)
        .collect();
    let scratch = scratch_rows(layers.iter().copied(), n_ctx) * row / heads.max(1);
    layers
        .iter()
        .map(|p| (p.segment + TAIL_SLACK).min(n_ctx) * row + n_ctx * heads * 4)
        .sum::<usize>()
        + scratch
}

/// Rows of the scratch segments are sorted through: the longest segment of the arranged
/// layers' partitions `parts`, in a context of `n_ctx` positions.
fn scratch_rows(parts: impl Iterator<Item = Partition>, n_ctx: usize) -> usize {
    parts.map(|p| p.segment.min(n_ctx)).max().unwrap_or(0)
}

/// A store whose partitioned layers are arranged, the others kept by `inner`.
pub struct ArrangedStore {
    /// The layers kept by position, numbered among themselves.
    inner: Box<dyn KvStore>,
    /// Per layer: its number in `inner`, if it is kept there.
    to_inner: Vec<Option<usize>>,
    layers: Vec<Option<ArrangedLayer>>,
    /// A segment of one head's rows, which every sort and unsort goes through.
    scratch: Scratch,
    /// The arranged layers' file under a RAM budget.
    cold: Option<Arc<ColdFile>>,
    n_ctx: usize,
    kv_dim: usize,
    types: KvTypes,
}

impl ArrangedStore {
    /// A store of `arranged.len()` layers of `n_ctx` positions: those `arranged` marks are
    /// arranged by `partitions` (heads of `head_dim` values; sorted rows in RAM, or with
    /// `cold` in a file in its directory), the others are `inner`'s layers, in order.
    pub fn new(
        inner: Box<dyn KvStore>,
        arranged: &[bool],
        partitions: &[Option<Partition>],
        (n_ctx, head_dim): (usize, usize),
        cold: Option<&ColdTier>,
    ) -> Result<Self, String> {
        let (kv_dim, types) = (inner.kv_dim(), inner.types());
        if head_dim == 0 || !kv_dim.is_multiple_of(head_dim) {
            return Err(format!(
                "rows of {kv_dim} values are not KV heads of {head_dim}"
            ));
        }
        let kept = arranged.iter().filter(|a| !**a).count();
        if kept != inner.n_layer() {
            return Err(format!(
                "{kept} layers kept by position, but the store under them has {}",
                inner.n_layer()
            ));
        }
        let heads = kv_dim / head_dim;
        let n_arranged = arranged.len() - kept;
        let file = match cold {
            Some(tier) if n_arranged > 0 => {
                let dir = tier.dir.clone().unwrap_or_else(std::env::temp_dir);
                Some(Arc::new(ColdFile::create(
                    &dir,
                    n_arranged * heads,
                    n_ctx,
                    types.k.row_bytes(head_dim),
                    types.v.row_bytes(head_dim),
                )?))
            }
            _ => None,
        };
        let (mut next_inner, mut next_arranged) = (0, 0);
        let parts = arranged.iter().zip(partitions).filter(|(a, _)| **a);
        let scratch = scratch_rows(parts.filter_map(|(_, p)| *p), n_ctx);
        let mut to_inner = Vec::with_capacity(arranged.len());
        let mut layers = Vec::with_capacity(arranged.len());
        for (l, &a) in arranged.iter().enumerate() {
            match partitions.get(l).copied().flatten().filter(|_| a) {
                Some(p) => {
                    let backings = (0..heads)
                        .map(|h| match &file {
                            Some(f) => Backing::Cold {
                                file: f.clone(),
                                region: next_arranged * heads + h,
                            },
                            None => Backing::Ram,
                        })
                        .collect();
                    next_arranged += 1;
                    to_inner.push(None);
                    layers.push(Some(ArrangedLayer::new(
                        (p.bins, p.segment),
                        (n_ctx, kv_dim, head_dim),
                        types,
                        backings,
                    )));
                }
                None => {
                    to_inner.push(Some(next_inner));
                    next_inner += 1;
                    layers.push(None);
                }
            }
        }
        Ok(ArrangedStore {
            inner,
            to_inner,
            layers,
            scratch: Scratch::new(scratch, head_dim, (types.k, types.v)),
            cold: file,
            n_ctx,
            kv_dim,
            types,
        })
    }

    fn arranged(&self, layer: usize) -> Option<&ArrangedLayer> {
        self.layers.get(layer).and_then(Option::as_ref)
    }

    /// `layer`'s number in the inner store (it must be kept there).
    fn inner_layer(&self, layer: usize) -> usize {
        self.to_inner[layer].expect("a layer kept by position")
    }

    /// `arranged(layer)` for an arranged layer, else `inner(store, its number there)`.
    fn by_layer<'a, T>(
        &'a self,
        layer: usize,
        arranged: impl FnOnce(&'a ArrangedLayer) -> T,
        inner: impl FnOnce(&'a dyn KvStore, usize) -> T,
    ) -> T {
        match self.arranged(layer) {
            Some(a) => arranged(a),
            None => inner(self.inner.as_ref(), self.inner_layer(layer)),
        }
    }

    /// Layers arranged.
    pub fn arranged_layers(&self) -> usize {
        self.layers.iter().flatten().count()
    }

    fn row_bytes(&self) -> usize {
        self.types.k.row_bytes(self.kv_dim) + self.types.v.row_bytes(self.kv_dim)
    }
}

const BY_HEAD: &str = "an arranged layer's rows are read a KV head at a time";

impl KvStore for ArrangedStore {
    fn kv_dim(&self) -> usize {
        self.kv_dim
    }
    fn n_layer(&self) -> usize {
        self.layers.len()
    }
    fn types(&self) -> KvTypes {
        self.types
    }
    fn bytes_per_token(&self) -> usize {
        self.inner.bytes_per_token() + self.arranged_layers() * self.row_bytes()
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn append(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), String> {
        if pos >= self.n_ctx {
            return Err(format!(
                "KV position {pos} beyond the context of {}",
                self.n_ctx
            ));
        }
        match self.layers.get_mut(layer).and_then(Option::as_mut) {
            Some(a) => a.append(pos, (k, v), &mut self.scratch),
            None => {
                let l = self.inner_layer(layer);
                self.inner.append(l, pos, k, v)
            }
        }
    }
    fn key_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        assert!(self.arranged(layer).is_none(), "{BY_HEAD}");
        self.inner.key_rows(self.inner_layer(layer), start, n)
    }
    fn value_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        assert!(self.arranged(layer).is_none(), "{BY_HEAD}");
        self.inner.value_rows(self.inner_layer(layer), start, n)
    }
    fn run_len(&self, layer: usize, start: usize, max: usize) -> usize {
        assert!(self.arranged(layer).is_none(), "{BY_HEAD}");
        self.inner.run_len(self.inner_layer(layer), start, max)
    }
    fn layer_rows(&self, layer: usize) -> usize {
        self.by_layer(layer, |_| self.n_ctx, |s, l| s.layer_rows(l))
    }
    fn intact_from(&self, layer: usize) -> usize {
        self.by_layer(layer, |_| 0, |s, l| s.intact_from(l))
    }
    fn head_run_len(&self, layer: usize, kv_head: usize, start: usize, max: usize) -> usize {
        self.by_layer(
            layer,
            |a| a.head_run_len(kv_head, start, max),
            |s, l| s.head_run_len(l, kv_head, start, max),
        )
    }
    fn head_keys(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        self.by_layer(
            layer,
            |a| a.head_rows(false, kv_head, start, n),
            |s, l| s.head_keys(l, kv_head, hd, start, n),
        )
    }
    fn head_values(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        self.by_layer(
            layer,
            |a| a.head_rows(true, kv_head, start, n),
            |s, l| s.head_values(l, kv_head, hd, start, n),
        )
    }
    fn arrange(&mut self, layer: usize, start: usize, bins: &[u32]) -> Result<(), String> {
        match self.layers.get_mut(layer).and_then(Option::as_mut) {
            Some(a) => a.arrange(start, bins, &mut self.scratch),
            None => Ok(()),
        }
    }
    fn slot_run_len(&self, layer: usize, kv_head: usize, start: usize, max: usize) -> usize {
        self.by_layer(
            layer,
            |_| max,
            |s, l| s.slot_run_len(l, kv_head, start, max),
        )
    }
    fn slot_keys(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        self.by_layer(
            layer,
            |a| a.slot_rows(false, kv_head, start, n),
            |s, l| s.slot_keys(l, kv_head, hd, start, n),
        )
    }
    fn slot_values(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        self.by_layer(
            layer,
            |a| a.slot_rows(true, kv_head, start, n),
            |s, l| s.slot_values(l, kv_head, hd, start, n),
        )
    }
    fn slot_position(&self, layer: usize, kv_head: usize, slot: usize) -> usize {
        self.by_layer(
            layer,
            |a| a.slot_position(kv_head, slot),
            |s, l| s.slot_position(l, kv_head, slot),
        )
    }
    fn keeps_bins(&self, layer: usize, kv_head: usize) -> bool {
        self.arranged(layer).is_some_and(|a| a.has_head(kv_head))
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
            None => self
                .inner
                .write_rows(self.inner_layer(layer), values, start, n, out),
        }
    }
    /// An arranged layer in a file: the plan's slot ranges (a chosen bucket's few runs per
    /// segment) are asked for; open positions it reads are in RAM, the others come through
    /// the maps as pages fault in.
    fn prefetch(&self, layer: usize, plan: &ReadPlan<'_>) {
        match self.arranged(layer) {
            Some(a) if self.cold.is_some() => {
                for e in plan.entries.iter().filter(|e| e.source == Source::Slots) {
                    for h in e.kv_heads.clone() {
                        for r in e.visible.iter().flatten() {
                            a.will_need(h, r.clone());
                        }
                    }
                }
            }
            Some(_) => {}
            None => self.inner.prefetch(self.inner_layer(layer), plan),
        }
    }
    /// The inner store's, plus the arranged layers' rows written (sorted ones unless in a
    /// file), maps and pending bins, and the scratch.
    fn bytes_resident(&self) -> usize {
        self.inner.bytes_resident()
            + self.scratch.bytes()
            + self
                .layers
                .iter()
                .flatten()
                .map(|a| a.bytes())
                .sum::<usize>()
    }
    fn bytes_cold(&self) -> usize {
        self.inner.bytes_cold()
            + self
                .layers
                .iter()
                .flatten()
                .map(|a| a.bytes_cold())
                .sum::<usize>()
    }
    fn drop_cold_pages(&self) -> Result<(), String> {
        self.inner.drop_cold_pages()?;
        match &self.cold {
            Some(f) => f.drop_pages(),
            None => Ok(()),
        }
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
            None => {
                let l = self.inner_layer(layer);
                self.inner.import_layer(l, n, keys, values)
            }
        }
    }
}
