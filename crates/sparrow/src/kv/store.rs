//! The KV store seam: where a sequence's keys and values live, per layer and position, as
//! the model and the attention executor see it. The model appends each position's rows,
//! the executor borrows runs of rows through [`StoreLayer`] (a kernel `KvSource`), and
//! between a policy's plan and its execution the store is told what will be read
//! ([`KvStore::prefetch`]) — the moment a store that keeps cold blocks outside RAM fetches
//! them. Two stores implement it: [`super::RamStore`] (everything in anonymous memory; prefetching is a
//! no-op) and [`super::TieredStore`] (a RAM budget, the rest in a file).

use super::types::{bytes_of, KvRows, KvTypes};
use sparrow_attn::kernel::{HeadRun, KvSource};
use sparrow_attn::policy::ReadPlan;
use std::ops::Range;

/// Keys and values of one sequence, per layer × position.
pub trait KvStore: Send + Sync {
    /// Values per row (kv heads × head size).
    fn kv_dim(&self) -> usize;
    /// Layers.
    fn n_layer(&self) -> usize;
    /// Element types of keys and values.
    fn types(&self) -> KvTypes;
    /// Bytes one position takes over all layers, keys and values.
    fn bytes_per_token(&self) -> usize;
    /// Positions each layer holds at most.
    fn n_ctx(&self) -> usize;
    /// Store the keys and values of position `pos` of `layer` (positions are appended in
    /// order; a rewind appends again from an earlier position). A store that writes to a
    /// file says why a write failed.
    fn append(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), String>;
    /// Keys of positions `start..start + n` of `layer`, borrowed.
    fn key_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_>;
    /// Values of positions `start..start + n` of `layer`, borrowed.
    fn value_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_>;
    /// How many rows from `start` (at most `max`) can be borrowed as one run.
    fn run_len(&self, _layer: usize, _start: usize, max: usize) -> usize {
        max
    }
    /// Rows `layer` holds: `n_ctx`, or the size of the ring a sliding-window layer is kept in.
    fn layer_rows(&self, _layer: usize) -> usize {
        self.n_ctx()
    }
    /// The lowest position of `layer` the store still holds (a layer kept as a ring of its
    /// sliding window loses its oldest positions as it goes round): a rewind to `n` keeps
    /// what it needs only if the positions it reads before `n` are at or above this.
    fn intact_from(&self, _layer: usize) -> usize {
        0
    }
    /// KV head `kv_head`'s rows of positions `start..start + max` of `layer` that can be
    /// read as one run. Default: [`KvStore::run_len`] (every head's rows side by side).
    fn head_run_len(&self, layer: usize, _kv_head: usize, start: usize, max: usize) -> usize {
        self.run_len(layer, start, max)
    }
    /// KV head `kv_head`'s keys of positions `start..start + n` of `layer`, one run.
    fn head_keys(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        HeadRun {
            rows: self.key_rows(layer, start, n),
            stride: self.kv_dim(),
            offset: kv_head * hd,
        }
    }
    /// KV head `kv_head`'s values of positions `start..start + n` of `layer`, one run.
    fn head_values(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        HeadRun {
            rows: self.value_rows(layer, start, n),
            stride: self.kv_dim(),
            offset: kv_head * hd,
        }
    }
    /// The block of positions `start..start + rows` of `layer` has been sealed, and its
    /// policy keeps each KV head's rows in bins (Saap's buckets): `bins[h * rows + r]` is
    /// head `h`'s bin for row `r`. A store that arranges the layer moves the rows into their
    /// bins ([`KvStore::bin_slots`] then names them); by default rows stay by position.
    fn arrange(&mut self, _layer: usize, _start: usize, _bins: &[u32]) -> Result<(), String> {
        Ok(())
    }
    /// Slots (see `sparrow_attn::kernel::KvSource`): KV head `kv_head`'s rows of `layer` in
    /// the order the store keeps them. By default the slots are the positions.
    fn slot_run_len(&self, layer: usize, kv_head: usize, start: usize, max: usize) -> usize {
        self.head_run_len(layer, kv_head, start, max)
    }
    /// KV head `kv_head`'s keys in slots `start..start + n` of `layer`.
    fn slot_keys(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        self.head_keys(layer, kv_head, hd, start, n)
    }
    /// KV head `kv_head`'s values in slots `start..start + n` of `layer`.
    fn slot_values(
        &self,
        layer: usize,
        kv_head: usize,
        hd: usize,
        start: usize,
        n: usize,
    ) -> HeadRun<'_> {
        self.head_values(layer, kv_head, hd, start, n)
    }
    /// The position KV head `kv_head`'s slot `slot` of `layer` holds.
    fn slot_position(&self, _layer: usize, _kv_head: usize, slot: usize) -> usize {
        slot
    }
    /// Whether `layer` keeps KV head `kv_head`'s rows by bin ([`KvSource::keeps_bins`]).
    fn keeps_bins(&self, _layer: usize, _kv_head: usize) -> bool {
        false
    }
    /// Appends to `out` the slots of the entries `entries` of bin `bin` of KV head
    /// `kv_head` of `layer` kept by bin, as runs; how many entries, from the first, that is
    /// (0 when the layer is kept by position).
    fn bin_slots(
        &self,
        _layer: usize,
        _kv_head: usize,
        _bin: usize,
        _entries: Range<usize>,
        _out: &mut Vec<Range<usize>>,
    ) -> usize {
        0
    }
    /// The raw bytes (as [`KvStore::export_prefix`] writes them) of the keys, or with
    /// `values` the values, of positions `start..start + n` of `layer`, in position order,
    /// to `out`.
    fn write_rows(
        &self,
        layer: usize,
        values: bool,
        start: usize,
        n: usize,
        out: &mut dyn std::io::Write,
    ) -> std::io::Result<()> {
        let mut at = start;
        while at < start + n {
            let len = self.run_len(layer, at, start + n - at);
            let rows = if values {
                self.value_rows(layer, at, len)
            } else {
                self.key_rows(layer, at, len)
            };
            out.write_all(bytes_of(&rows))?;
            at += len;
        }
        Ok(())
    }
    /// `plan` is about to be executed over `layer`: make what it reads available.
    fn prefetch(&self, _layer: usize, _plan: &ReadPlan<'_>) {}
    /// Bytes of keys and values held in RAM.
    fn bytes_resident(&self) -> usize;
    /// Bytes of keys and values held outside RAM (a cold tier's file).
    fn bytes_cold(&self) -> usize {
        0
    }
    /// Drop the cold tier's pages from memory (the OS's page cache included), so the next
    /// reads come from the disk: for measuring a cold start. Nothing to do in RAM.
    fn drop_cold_pages(&self) -> Result<(), String> {
        Ok(())
    }
    /// Keys then values of positions `0..n`, layer by layer, as little-endian raw data of
    /// each one's type (for Q8_0, ggml's 34-byte blocks): what prompt cache files hold.
    fn export_prefix(&self, n: usize) -> Vec<u8> {
        export_prefix(self, n)
    }
    /// [`KvStore::export_prefix`] streamed to `out`, a run of rows at a time, so saving a
    /// long context takes no memory of its size (a cold tier's rows go file to file).
    fn write_prefix(&self, n: usize, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        write_prefix(self, n, out)
    }
    /// Overwrite positions `0..n` from bytes made by [`KvStore::export_prefix`] of a store
    /// with the same types and shape, or say why they do not fit.
    fn import_prefix(&mut self, n: usize, bytes: &[u8]) -> Result<(), String> {
        if n > self.n_ctx() {
            return Err(format!(
                "{n} cached positions do not fit a context of {}",
                self.n_ctx()
            ));
        }
        let want = prefix_bytes(self, n);
        if bytes.len() != want {
            return Err(format!(
                "KV data has {} bytes, expected {want} for {n} positions",
                bytes.len()
            ));
        }
        let mut at = 0;
        for l in 0..self.n_layer() {
            let (kb, vb) = layer_prefix_bytes(self, l, n);
            self.import_layer(l, n, &bytes[at..at + kb], &bytes[at + kb..at + kb + vb])?;
            at += kb + vb;
        }
        Ok(())
    }
    /// Overwrite layer `layer`'s share of a prefix of `n` positions — the keys, then the
    /// values, of the positions it keeps ([`layer_prefix_bytes`]), laid out as
    /// [`KvStore::export_prefix`] lays them out — or say why they do not fit. A prefix is
    /// imported a layer at a time this way without the whole of it in memory at once.
    fn import_layer(
        &mut self,
        layer: usize,
        n: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), String>;
}

/// One layer of a store, as the attention kernels read it.
pub struct StoreLayer<'a, S: KvStore + ?Sized> {
    /// The store.
    pub store: &'a S,
    /// The layer.
    pub layer: usize,
}

impl<S: KvStore + ?Sized> KvSource for StoreLayer<'_, S> {
    fn kv_dim(&self) -> usize {
        self.store.kv_dim()
    }
    fn key_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        self.store.key_rows(self.layer, start, n)
    }
    fn value_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        self.store.value_rows(self.layer, start, n)
    }
    fn run_len(&self, start: usize, max: usize) -> usize {
        self.store.run_len(self.layer, start, max)
    }
    fn head_run_len(&self, kv_head: usize, start: usize, max: usize) -> usize {
        self.store.head_run_len(self.layer, kv_head, start, max)
    }
    fn head_keys(&self, kv_head: usize, hd: usize, start: usize, n: usize) -> HeadRun<'_> {
        self.store.head_keys(self.layer, kv_head, hd, start, n)
    }
    fn head_values(&self, kv_head: usize, hd: usize, start: usize, n: usize) -> HeadRun<'_> {
        self.store.head_values(self.layer, kv_head, hd, start, n)
    }
    fn slot_run_len(&self, kv_head: usize, start: usize, max: usize) -> usize {
        self.store.slot_run_len(self.layer, kv_head, start, max)
    }
    fn slot_keys(&self, kv_head: usize, hd: usize, start: usize, n: usize) -> HeadRun<'_> {
        self.store.slot_keys(self.layer, kv_head, hd, start, n)
    }
    fn slot_values(&self, kv_head: usize, hd: usize, start: usize, n: usize) -> HeadRun<'_> {
        self.store.slot_values(self.layer, kv_head, hd, start, n)
    }
    fn slot_position(&self, kv_head: usize, slot: usize) -> usize {
        self.store.slot_position(self.layer, kv_head, slot)
    }
    fn keeps_bins(&self, kv_head: usize) -> bool {
        self.store.keeps_bins(self.layer, kv_head)
    }
    fn bin_slots(
        &self,
        kv_head: usize,
        bin: usize,
        entries: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> usize {
        self.store.bin_slots(self.layer, kv_head, bin, entries, out)
    }
}

/// The positions of `layer` a prefix of `n` keeps: all of them, or a ring's last rows.
fn kept(store: &(impl KvStore + ?Sized), layer: usize, n: usize) -> std::ops::Range<usize> {
    n - n.min(store.layer_rows(layer))..n
}

/// Bytes of keys and of values `layer` contributes to a prefix of `n` positions of `store`.
pub fn layer_prefix_bytes(
    store: &(impl KvStore + ?Sized),
    layer: usize,
    n: usize,
) -> (usize, usize) {
    let t = store.types();
    let kept = kept(store, layer, n).len();
    (
        kept * t.k.row_bytes(store.kv_dim()),
        kept * t.v.row_bytes(store.kv_dim()),
    )
}

/// Why `keys` and `values` cannot be layer `layer`'s share of a prefix of `n` positions of
/// `store`, if they cannot.
pub fn check_layer_import(
    store: &(impl KvStore + ?Sized),
    layer: usize,
    n: usize,
    keys: &[u8],
    values: &[u8],
) -> Result<(), String> {
    if layer >= store.n_layer() || n > store.n_ctx() {
        return Err(format!(
            "layer {layer} positions 0..{n} are outside the cache ({} layers × {})",
            store.n_layer(),
            store.n_ctx()
        ));
    }
    let (kb, vb) = layer_prefix_bytes(store, layer, n);
    if (keys.len(), values.len()) != (kb, vb) {
        return Err(format!(
            "layer {layer}: {} + {} bytes of keys and values, expected {kb} + {vb} for {n} positions",
            keys.len(),
            values.len()
        ));
    }
    Ok(())
}

/// Bytes [`export_prefix`] makes for `n` positions of `store`.
pub fn prefix_bytes(store: &(impl KvStore + ?Sized), n: usize) -> usize {
    let t = store.types();
    let row = t.k.row_bytes(store.kv_dim()) + t.v.row_bytes(store.kv_dim());
    (0..store.n_layer())
        .map(|l| kept(store, l, n).len() * row)
        .sum()
}

/// [`KvStore::export_prefix`] for any store, read through its rows: per layer the keys of
/// the positions kept, then their values, as raw little-endian data.
pub fn export_prefix(store: &(impl KvStore + ?Sized), n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix_bytes(store, n));
    write_prefix(store, n, &mut out).expect("writing to a Vec cannot fail");
    out
}

/// [`export_prefix`]'s bytes, written to `out` one run of rows at a time.
pub fn write_prefix(
    store: &(impl KvStore + ?Sized),
    n: usize,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    assert!(n <= store.n_ctx(), "export beyond the cache");
    for l in 0..store.n_layer() {
        let kept = kept(store, l, n);
        for values in [false, true] {
            store.write_rows(l, values, kept.start, kept.len(), out)?;
        }
    }
    Ok(())
}
