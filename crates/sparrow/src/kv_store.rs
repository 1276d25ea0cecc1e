//! The KV store seam: where a sequence's keys and values live, per layer and position, as
//! the model and the attention executor see it. The model appends each position's rows,
//! the executor borrows runs of rows through [`StoreLayer`] (a kernel `KvSource`), and
//! between a policy's plan and its execution the store is told what will be read
//! ([`KvStore::prefetch`]) — the moment a store that keeps cold blocks outside RAM fetches
//! them. Today's one store is the RAM cache ([`KvCache`]), for which prefetching is a no-op.

use crate::kv_cache::{KvCache, KvRows, KvTypes};
use sparrow_attn::kernel::KvSource;
use sparrow_attn::policy::ReadPlan;

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
    /// order; a rewind appends again from an earlier position).
    fn append(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]);
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
    /// `plan` is about to be executed over `layer`: make what it reads available.
    fn prefetch(&self, _layer: usize, _plan: &ReadPlan<'_>) {}
    /// Bytes of keys and values held in RAM.
    fn bytes_resident(&self) -> usize;
    /// Keys then values of positions `0..n`, layer by layer, as little-endian raw data of
    /// each one's type (for Q8_0, ggml's 34-byte blocks): what prompt cache files hold.
    fn export_prefix(&self, n: usize) -> Vec<u8>;
    /// Overwrite positions `0..n` from bytes made by [`KvStore::export_prefix`] of a store
    /// with the same types and shape, or say why they do not fit.
    fn import_prefix(&mut self, n: usize, bytes: &[u8]) -> Result<(), String>;
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
}

/// The RAM store: one contiguous, lazily backed buffer per layer. Everything is resident,
/// so prefetching has nothing to do.
impl KvStore for KvCache {
    fn kv_dim(&self) -> usize {
        KvCache::kv_dim(self)
    }
    fn n_layer(&self) -> usize {
        KvCache::n_layer(self)
    }
    fn types(&self) -> KvTypes {
        KvCache::types(self)
    }
    fn bytes_per_token(&self) -> usize {
        KvCache::bytes_per_token(self)
    }
    fn n_ctx(&self) -> usize {
        KvCache::n_ctx(self)
    }
    fn append(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        self.write(layer, pos, k, v);
    }
    fn key_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        KvCache::key_rows(self, layer, start, n)
    }
    fn value_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        KvCache::value_rows(self, layer, start, n)
    }
    fn run_len(&self, layer: usize, start: usize, max: usize) -> usize {
        KvCache::run_len(self, layer, start, max)
    }
    fn intact_from(&self, layer: usize) -> usize {
        KvCache::intact_from(self, layer)
    }
    fn layer_rows(&self, layer: usize) -> usize {
        KvCache::layer_rows(self, layer)
    }
    /// The rows of the positions written so far (the high-water mark; a ring at most its
    /// rows): the untouched rest of the zeroed allocation is not backed by memory.
    fn bytes_resident(&self) -> usize {
        self.bytes_for(self.high_water())
    }
    fn export_prefix(&self, n: usize) -> Vec<u8> {
        KvCache::export_prefix(self, n)
    }
    fn import_prefix(&mut self, n: usize, bytes: &[u8]) -> Result<(), String> {
        KvCache::import_prefix(self, n, bytes)
    }
}
