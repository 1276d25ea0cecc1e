//! The cold KV tier: keys and values under a RAM budget, the rest in a file.
//!
//! A long context's cache can outgrow the machine (Qwen2.5-0.5B's FP16 cache at 32K is
//! 384 MiB, more than its weights). [`TieredStore`] keeps in anonymous memory only what the
//! budget pays for — per global layer the first block (the sink every policy reads) and a
//! ring of the most recent positions, plus the sliding-window layers' own rings — and
//! writes every position of a global layer through to one file per session. The file is
//! created unnamed in `--kv-dir` (else the system temp dir), so a crash leaves nothing
//! behind, and sized once (sparse: unwritten positions take no disk).
//!
//! Reads of positions outside the hot rows go straight to a read-only shared mapping of
//! that file: the kernel reads page-cache pages in place, with no copy and no staging
//! buffer, and the bytes are the ones the RAM store would hold, so attention over a tiered
//! store is bit for bit the RAM store's. Those pages are the OS's clean file cache — they
//! count as file pages (RssFile), not anonymous memory, and the OS drops them under
//! pressure; a read of a dropped page goes back to disk. [`KvStore::prefetch`] turns a
//! policy's plan into `MADV_WILLNEED` on the mapping before the plan runs, so the disk
//! reads for a layer's selected blocks are in flight together rather than one fault at a
//! time — for the blocks not already known to be cached (`residency`), since advising
//! cached pages costs a page-cache lookup each and, every layer of every step, more than
//! it saves.
//!
//! Writes go through `pwrite` in blocks of [`TieredStore::flush_rows`] positions (≥ 4 KiB),
//! so a full disk or a failing write is an error naming the file's directory and the
//! positions, returned from the forward pass, never a fault on a mapped page. Each flush
//! also queues its bytes' writeback (`sync_file_range`), so a prefill's pages are written
//! back during the prefill and not, 30 s later, during the decode that follows.

mod residency;

pub use super::cold_file::ColdWrite;
use super::cold_file::{ColdFile, NoWriter};
use super::options::ColdTier;
use super::ram::RamStore;
use super::store::KvStore;
use super::types::{bytes_of, KvRows, KvTypes};
use residency::Residency;
use sparrow_attn::policy::{ReadPlan, Source};
use std::ops::Range;

/// What a store's RAM is made of, before the budget picks the hot ring's size.
struct Layout {
    /// Positions per write (and in the sink).
    flush_rows: usize,
    /// Bytes that do not depend on the budget: sliding rings, sinks, reserved summaries.
    fixed: usize,
    /// Bytes one more hot position costs (all global layers).
    per_row: usize,
}

impl Layout {
    fn new(
        types: KvTypes,
        rings: &[Option<usize>],
        n_ctx: usize,
        kv_dim: usize,
        reserved: usize,
    ) -> Self {
        let (k_row, v_row) = (types.k.row_bytes(kv_dim), types.v.row_bytes(kv_dim));
        let row = k_row + v_row;
        let n_global = rings.iter().filter(|r| r.is_none()).count();
        // Writes of at least a page; the sink is one such block.
        let flush_rows = 4096usize
            .div_ceil(k_row.max(1))
            .next_multiple_of(16)
            .min(n_ctx.max(1));
        let fixed = rings
            .iter()
            .flatten()
            .map(|&r| r.min(n_ctx) * row)
            .sum::<usize>()
            + n_global * flush_rows * row
            + reserved;
        Layout {
            flush_rows,
            fixed,
            per_row: n_global.max(1) * row,
        }
    }

    /// The smallest budget: the fixed part and one block of recent positions.
    fn minimum(&self) -> usize {
        self.fixed + self.flush_rows * self.per_row
    }
}

/// The smallest `--kv-ram-budget` a tiered store of this shape accepts (one block of recent
/// positions per global layer besides the fixed part).
pub fn minimum_budget(
    types: KvTypes,
    rings: &[Option<usize>],
    n_ctx: usize,
    kv_dim: usize,
    reserved: usize,
) -> usize {
    Layout::new(types, rings, n_ctx, kv_dim, reserved).minimum()
}

#[cfg(target_endian = "big")]
compile_error!("the KV file layouts (prompt caches, the cold tier) are little-endian");

/// A KV store whose global layers keep a RAM budget's worth of rows and the rest in a
/// file (module docs).
pub struct TieredStore {
    /// Sliding layers' rings (never cold) and each global layer's ring of recent rows.
    hot: RamStore,
    /// The first `sink_rows` positions of every layer.
    sinks: RamStore,
    cold: ColdFile,
    /// Per layer: its index among the global layers, `None` for a sliding one.
    global: Vec<Option<usize>>,
    n_ctx: usize,
    sink_rows: usize,
    hot_rows: usize,
    flush_rows: usize,
    /// Per layer: one past the highest position written.
    high: Vec<usize>,
    /// Per layer: every position below is in the file.
    flushed_to: Vec<usize>,
    /// Per layer: positions from here up to `high` are read from the hot ring.
    hot_from: Vec<usize>,
    /// Per layer: positions below are read from the sink rows.
    sinks_valid: Vec<usize>,
    /// Which cold blocks are believed cached, so prefetches skip them.
    resident: Residency,
}

impl TieredStore {
    /// A store for `n_ctx` positions: `rings[l]` is `Some(rows)` for a sliding layer kept
    /// in a ring, `None` for a global layer, whose rows beyond `tier.ram_budget` (less
    /// `reserved`, the sliding rings and the sinks) live in the file.
    pub fn new(
        types: KvTypes,
        rings: &[Option<usize>],
        n_ctx: usize,
        kv_dim: usize,
        head_dim: usize,
        tier: &ColdTier,
        reserved: usize,
    ) -> Result<Self, String> {
        let (k_row, v_row) = (types.k.row_bytes(kv_dim), types.v.row_bytes(kv_dim));
        let layout = Layout::new(types, rings, n_ctx, kv_dim, reserved);
        let flush_rows = layout.flush_rows;
        let sink_rows = flush_rows;
        let hot_rows =
            tier.ram_budget.saturating_sub(layout.fixed) / layout.per_row / flush_rows * flush_rows;
        if hot_rows < flush_rows {
            return Err(format!(
                "--kv-ram-budget {} is too small: at -c {n_ctx} the KV store needs at least {} \
                 ({} of sliding-window rings, sinks, policy summaries and bucket-ordered layers' open segments, plus {flush_rows} \
                 recent positions per global layer)",
                crate::memory::human_bytes(tier.ram_budget as u64),
                crate::memory::human_bytes(layout.minimum() as u64),
                crate::memory::human_bytes(layout.fixed as u64),
            ));
        }
        let hot_rings: Vec<Option<usize>> =
            rings.iter().map(|r| Some(r.unwrap_or(hot_rows))).collect();
        let hot = RamStore::with_rings(types, &hot_rings, n_ctx, kv_dim, head_dim)?;
        let sinks =
            RamStore::with_rings(types, &vec![None; rings.len()], sink_rows, kv_dim, head_dim)?;
        let dir = tier.dir.clone().unwrap_or_else(std::env::temp_dir);
        let cold = ColdFile::create(
            &dir,
            rings.iter().filter(|r| r.is_none()).count(),
            n_ctx,
            k_row,
            v_row,
        )?;
        let mut next = 0;
        let global = rings
            .iter()
            .map(|r| {
                r.is_none().then(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect();
        let n_layer = rings.len();
        let n_global = rings.iter().filter(|r| r.is_none()).count();
        Ok(TieredStore {
            resident: Residency::new(n_global, n_ctx, flush_rows),
            hot,
            sinks,
            cold,
            global,
            n_ctx,
            sink_rows,
            hot_rows,
            flush_rows,
            high: vec![0; n_layer],
            flushed_to: vec![0; n_layer],
            hot_from: vec![0; n_layer],
            sinks_valid: vec![0; n_layer],
        })
    }

    /// Wrap the writer of the file (tests inject full disks and short writes with it).
    pub fn wrap_writer(&mut self, wrap: impl FnOnce(Box<dyn ColdWrite>) -> Box<dyn ColdWrite>) {
        let placeholder: Box<dyn ColdWrite> = Box::new(NoWriter);
        let inner = std::mem::replace(&mut self.cold.writer, placeholder);
        self.cold.writer = wrap(inner);
    }

    /// Recent positions each global layer keeps in RAM.
    pub fn hot_rows(&self) -> usize {
        self.hot_rows
    }

    /// Positions per write to the file (the first block is also kept in RAM as the sink).
    pub fn flush_rows(&self) -> usize {
        self.flush_rows
    }

    /// Write positions `flushed_to..end` of global layer `l` from the hot ring to the file.
    fn flush(&mut self, l: usize, gl: usize, end: usize) -> Result<(), String> {
        let start = self.flushed_to[l];
        let mut at = start;
        while at < end {
            let n = self.hot.run_len(l, at, end - at);
            let what = || format!("layer {l} positions {at}..{}", at + n);
            let k = self.hot.key_rows(l, at, n);
            self.cold
                .write(bytes_of(&k), self.cold.k_at(gl, at), what)?;
            let v = self.hot.value_rows(l, at, n);
            self.cold
                .write(bytes_of(&v), self.cold.v_at(gl, at), what)?;
            self.resident.mark(gl, at..at + n);
            at += n;
        }
        if start < end {
            self.cold
                .start_writeback(self.cold.k_at(gl, start)..self.cold.k_at(gl, end));
            self.cold
                .start_writeback(self.cold.v_at(gl, start)..self.cold.v_at(gl, end));
        }
        self.flushed_to[l] = end;
        Ok(())
    }

    /// Where reads of `start..` of global layer `l` come from, and how far that run goes.
    fn locate(&self, l: usize, start: usize, max: usize) -> (Tier, usize) {
        if start >= self.hot_from[l] {
            (Tier::Hot, self.hot.run_len(l, start, max))
        } else if start < self.sinks_valid[l] {
            (
                Tier::Sink,
                max.min(self.sinks_valid[l].min(self.hot_from[l]) - start),
            )
        } else {
            (Tier::Cold, max.min(self.hot_from[l] - start))
        }
    }

    fn rows(&self, l: usize, start: usize, n: usize, keys: bool) -> KvRows<'_> {
        let Some(gl) = self.global[l] else {
            return if keys {
                self.hot.key_rows(l, start, n)
            } else {
                self.hot.value_rows(l, start, n)
            };
        };
        let (tier, run) = self.locate(l, start, n);
        assert!(
            run == n || n == 0,
            "KV read must be one run (layer {l}, {start}+{n})"
        );
        let types = self.hot.types();
        match (tier, keys) {
            (Tier::Hot, true) => self.hot.key_rows(l, start, n),
            (Tier::Hot, false) => self.hot.value_rows(l, start, n),
            (Tier::Sink, true) => self.sinks.key_rows(l, start, n),
            (Tier::Sink, false) => self.sinks.value_rows(l, start, n),
            (Tier::Cold, true) => {
                self.cold
                    .rows(self.cold.k_at(gl, start), n, self.cold.k_row, types.k)
            }
            (Tier::Cold, false) => {
                self.cold
                    .rows(self.cold.v_at(gl, start), n, self.cold.v_row, types.v)
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tier {
    Hot,
    Sink,
    Cold,
}

impl KvStore for TieredStore {
    fn kv_dim(&self) -> usize {
        self.hot.kv_dim()
    }
    fn n_layer(&self) -> usize {
        self.hot.n_layer()
    }
    fn types(&self) -> KvTypes {
        self.hot.types()
    }
    fn bytes_per_token(&self) -> usize {
        self.global.iter().flatten().count() * self.hot.row_bytes()
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn append(&mut self, l: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), String> {
        let Some(gl) = self.global[l] else {
            self.hot.write(l, pos, k, v);
            return Ok(());
        };
        if pos > self.high[l] {
            return Err(format!(
                "KV position {pos} of layer {l} written before position {}",
                self.high[l]
            ));
        }
        if pos < self.high[l] {
            // A rewind: the file takes what the ring still holds unwritten, then holds every
            // position below `pos`; the ring vouches only for what is written from here.
            let high = self.high[l];
            self.flush(l, gl, high)?;
            self.flushed_to[l] = pos;
            self.hot_from[l] = pos;
            self.sinks_valid[l] = self.sinks_valid[l].min(pos);
        }
        self.hot.write(l, pos, k, v);
        if pos < self.sink_rows && pos == self.sinks_valid[l] {
            self.sinks.write(l, pos, k, v);
            self.sinks_valid[l] = pos + 1;
        }
        self.high[l] = pos + 1;
        self.hot_from[l] = self.hot_from[l].max((pos + 1).saturating_sub(self.hot_rows));
        if (pos + 1).is_multiple_of(self.flush_rows)
            || pos + 1 - self.flushed_to[l] >= self.flush_rows
        {
            self.flush(l, gl, pos + 1)?;
        }
        Ok(())
    }

    fn key_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        self.rows(layer, start, n, true)
    }
    fn value_rows(&self, layer: usize, start: usize, n: usize) -> KvRows<'_> {
        self.rows(layer, start, n, false)
    }
    fn run_len(&self, layer: usize, start: usize, max: usize) -> usize {
        match self.global[layer] {
            None => self.hot.run_len(layer, start, max),
            Some(_) => self.locate(layer, start, max).1,
        }
    }
    fn layer_rows(&self, layer: usize) -> usize {
        match self.global[layer] {
            None => self.hot.layer_rows(layer),
            Some(_) => self.n_ctx,
        }
    }
    fn intact_from(&self, layer: usize) -> usize {
        match self.global[layer] {
            None => self.hot.intact_from(layer),
            Some(_) => 0,
        }
    }

    /// Ask the OS for the file pages the plan reads below the hot rows, merged into spans
    /// (gaps under 64 KiB are read too: one larger request costs less than two).
    fn prefetch(&self, layer: usize, plan: &ReadPlan<'_>) {
        let Some(gl) = self.global[layer] else { return };
        if gl == 0 {
            // Once per step: evictions since the last one void what the map says.
            self.resident.forget_if_evicted();
        }
        let hot_from = self.hot_from[layer];
        let mut ranges: Vec<Range<usize>> = plan
            .entries
            .iter()
            .filter(|e| e.source == Source::Store)
            .flat_map(|e| e.visible.iter().flatten())
            .filter(|r| r.start < hot_from)
            .map(|r| r.start.max(self.sinks_valid[layer].min(hot_from))..r.end.min(hot_from))
            .filter(|r| !r.is_empty())
            .collect();
        ranges.sort_unstable_by_key(|r| r.start);
        // Only blocks not already known to be cached: advising cached pages costs a lookup
        // per page for nothing.
        let mut uncached = Vec::new();
        for r in ranges {
            self.resident.claim(gl, r, &mut uncached);
        }
        // `claim` has merged adjacent blocks; gaps are not bridged, so a cold step reads
        // the blocks it selected and no others.
        for r in uncached {
            let end = r.end.min(self.n_ctx);
            self.cold
                .will_need(self.cold.k_at(gl, r.start)..self.cold.k_at(gl, end));
            self.cold
                .will_need(self.cold.v_at(gl, r.start)..self.cold.v_at(gl, end));
        }
    }

    /// The hot rings and sinks as far as written (their zeroed rest is never touched).
    fn bytes_resident(&self) -> usize {
        let high = self.high.iter().copied().max().unwrap_or(0);
        self.hot.bytes_for(high) + self.sinks.bytes_for(high)
    }

    fn drop_cold_pages(&self) -> Result<(), String> {
        self.cold.drop_pages()?;
        self.resident.clear();
        Ok(())
    }

    fn bytes_cold(&self) -> usize {
        self.flushed_to
            .iter()
            .zip(&self.global)
            .filter(|(_, g)| g.is_some())
            .map(|(&f, _)| f)
            .sum::<usize>()
            * self.hot.row_bytes()
    }

    fn import_layer(
        &mut self,
        layer: usize,
        n: usize,
        keys: &[u8],
        values: &[u8],
    ) -> Result<(), String> {
        crate::kv::store::check_layer_import(self, layer, n, keys, values)?;
        let l = layer;
        match self.global[l] {
            None => self.hot.import_layer(l, n, keys, values),
            Some(gl) => {
                let what = || format!("layer {l} positions 0..{n}");
                self.cold.write(keys, self.cold.k_at(gl, 0), what)?;
                self.cold.write(values, self.cold.v_at(gl, 0), what)?;
                self.cold
                    .start_writeback(self.cold.k_at(gl, 0)..self.cold.k_at(gl, n));
                self.cold
                    .start_writeback(self.cold.v_at(gl, 0)..self.cold.v_at(gl, n));
                self.resident.mark(gl, 0..n);
                self.high[l] = n;
                self.flushed_to[l] = n;
                self.hot_from[l] = n;
                self.sinks_valid[l] = 0;
            }
        }
        Ok(())
    }
}
