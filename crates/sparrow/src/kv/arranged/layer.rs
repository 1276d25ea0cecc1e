//! One arranged layer: its sealed rows per KV head in bins ([`HeadBins`]), the positions
//! after them (written, not yet sealed and arranged) in a tail kept by position. Every
//! position reads as in a store kept by position, a KV head at a time: through the tail, or
//! through the head's slot map.

use super::super::elements::Elements;
use super::super::types::{bytes_of, KvTypes};
use super::bins::HeadBins;
use sparrow_attn::kernel::HeadRun;
use std::ops::Range;

/// An arranged layer of rows `kv_dim = heads × head_dim` wide.
pub(super) struct ArrangedLayer {
    kv_dim: usize,
    head_dim: usize,
    /// Per KV head: positions `0..filed` in bins (every head has filed the same).
    heads: Vec<HeadBins>,
    /// Positions `filed..filed + tail_len`, row `tail_first + i` holding position
    /// `filed + i` (rows before `tail_first` were arranged and await compaction).
    tail_k: Elements,
    tail_v: Elements,
    tail_first: usize,
    tail_len: usize,
    bins: usize,
    types: KvTypes,
}

impl ArrangedLayer {
    pub(super) fn new(bins: usize, kv_dim: usize, head_dim: usize, types: KvTypes) -> Self {
        let heads = (0..kv_dim / head_dim)
            .map(|_| HeadBins::new(bins, head_dim, types.k, types.v))
            .collect();
        ArrangedLayer {
            kv_dim,
            head_dim,
            heads,
            tail_k: Elements::zeroed(types.k, 0),
            tail_v: Elements::zeroed(types.v, 0),
            tail_first: 0,
            tail_len: 0,
            bins,
            types,
        }
    }

    /// Positions in bins.
    fn filed(&self) -> usize {
        self.heads[0].filed()
    }

    /// One past the last position held.
    fn end(&self) -> usize {
        self.filed() + self.tail_len
    }

    /// Element offset of tail row `row`.
    fn tail_at(&self, row: usize) -> usize {
        (self.tail_first + row) * self.kv_dim
    }

    /// Store position `pos`'s rows (positions are appended in order; an earlier one starts
    /// a rewind: positions from there on are forgotten first).
    pub(super) fn append(&mut self, pos: usize, k: &[f32], v: &[f32]) -> Result<(), String> {
        if pos < self.filed() {
            self.unarrange_from(pos);
        }
        if pos > self.end() {
            return Err(format!(
                "KV position {pos} written before positions {}..{pos}",
                self.end()
            ));
        }
        let row = pos - self.filed();
        self.tail_len = row + 1;
        let at = self.tail_at(row);
        self.tail_k.grow(at + self.kv_dim);
        self.tail_v.grow(at + self.kv_dim);
        self.tail_k.write(at, k);
        self.tail_v.write(at, v);
        Ok(())
    }

    /// Move the sealed block `start..start + bins.len() / heads` into its bins (`bins`
    /// head-major). A block before the bins' end is a rewind's: positions from `start` go
    /// back to the tail first. A block past what the tail holds, or beyond a gap, is left
    /// where it is (the policy then reads by position: its bins have fewer entries).
    pub(super) fn arrange(&mut self, start: usize, bins: &[u32]) -> Result<(), String> {
        let heads = self.heads.len();
        let rows = bins.len() / heads;
        if rows * heads != bins.len() || bins.iter().any(|&b| b as usize >= self.bins) {
            return Err(format!(
                "a placement of {} bins for {heads} KV heads into {} bins",
                bins.len(),
                self.bins
            ));
        }
        if start < self.filed() {
            self.unarrange_from(start);
        }
        if start != self.filed() || start + rows > self.end() {
            return Ok(());
        }
        let hd = self.head_dim;
        for r in 0..rows {
            let at = self.tail_at(r);
            for (h, head) in self.heads.iter_mut().enumerate() {
                let bin = bins[h * rows + r] as usize;
                head.file(bin, &self.tail_k, &self.tail_v, at + h * hd);
            }
        }
        self.tail_first += rows;
        self.tail_len -= rows;
        // Compact once the arranged rows outnumber the waiting ones: each row moves O(1)
        // times on average.
        if self.tail_first > self.tail_len.max(64) {
            let live = self.tail_at(0)..self.tail_at(self.tail_len);
            let keep = live.len();
            self.tail_k.copy_within(live.clone(), 0);
            self.tail_v.copy_within(live, 0);
            self.tail_k.shrink(keep);
            self.tail_v.shrink(keep);
            self.tail_first = 0;
        }
        Ok(())
    }

    /// Positions `from..filed` back to the tail, ahead of it, and out of the bins.
    fn unarrange_from(&mut self, from: usize) {
        let filed = self.filed();
        if from >= filed {
            return;
        }
        let (moved, hd, kv_dim) = (filed - from, self.head_dim, self.kv_dim);
        // Room before the tail: its rows move back by `moved` (or the tail starts earlier).
        if self.tail_first >= moved {
            self.tail_first -= moved;
        } else {
            let (old, len) = (self.tail_at(0), self.tail_len * kv_dim);
            let new = moved * kv_dim;
            self.tail_k.grow(new + len);
            self.tail_v.grow(new + len);
            self.tail_k.copy_within(old..old + len, new);
            self.tail_v.copy_within(old..old + len, new);
            self.tail_first = 0;
        }
        self.tail_len += moved;
        for p in from..filed {
            let at = self.tail_at(p - from);
            for (h, head) in self.heads.iter().enumerate() {
                let s = head.slot_of(p);
                self.tail_k.put(at + h * hd, &head.rows(false, s..s + 1));
                self.tail_v.put(at + h * hd, &head.rows(true, s..s + 1));
            }
        }
        self.heads.iter_mut().for_each(|h| h.truncate(from));
    }

    /// Replace everything with positions `0..n` from raw rows (as a prompt cache holds them):
    /// they wait in the tail until their blocks are sealed again.
    pub(super) fn import(&mut self, n: usize, keys: &[u8], values: &[u8]) {
        let fresh = ArrangedLayer::new(self.bins, self.kv_dim, self.head_dim, self.types);
        *self = fresh;
        self.tail_k.grow(n * self.kv_dim);
        self.tail_v.grow(n * self.kv_dim);
        self.tail_k.import(0..n * self.kv_dim, keys);
        self.tail_v.import(0..n * self.kv_dim, values);
        self.tail_len = n;
    }

    /// KV head `h`'s rows from position `start` (at most `max`) that lie in one run.
    pub(super) fn head_run_len(&self, h: usize, start: usize, max: usize) -> usize {
        let filed = self.filed();
        if start >= filed {
            return max.min(self.end().saturating_sub(start)).max(1);
        }
        let head = &self.heads[h];
        let first = head.slot_of(start);
        let limit = max.min(filed - start);
        (1..limit)
            .find(|&i| head.slot_of(start + i) != first + i)
            .unwrap_or(limit)
            .max(1)
    }

    /// KV head `h`'s keys (or values) of positions `start..start + n`, one run.
    pub(super) fn head_rows(&self, values: bool, h: usize, start: usize, n: usize) -> HeadRun<'_> {
        let filed = self.filed();
        if start >= filed {
            let at = self.tail_at(start - filed);
            let tail = if values { &self.tail_v } else { &self.tail_k };
            return HeadRun {
                rows: tail.rows(at..at + n * self.kv_dim),
                stride: self.kv_dim,
                offset: h * self.head_dim,
            };
        }
        let slot = self.heads[h].slot_of(start);
        self.slot_rows(values, h, slot, n)
    }

    /// KV head `h`'s keys (or values) in slots `start..start + n`.
    pub(super) fn slot_rows(&self, values: bool, h: usize, start: usize, n: usize) -> HeadRun<'_> {
        HeadRun {
            rows: self.heads[h].rows(values, start..start + n),
            stride: self.head_dim,
            offset: 0,
        }
    }

    /// The position KV head `h`'s slot `slot` holds.
    pub(super) fn slot_position(&self, h: usize, slot: usize) -> usize {
        self.heads[h].position_of(slot)
    }

    /// Appends the slots of entries `entries` of `bin` of head `h` to `out`.
    pub(super) fn bin_slots(
        &self,
        h: usize,
        bin: usize,
        entries: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> bool {
        self.heads
            .get(h)
            .is_some_and(|head| head.slots_of(bin, entries, out))
    }

    /// Keys (or values) of positions `start..start + n` as raw rows, in position order.
    pub(super) fn write_rows(
        &self,
        values: bool,
        start: usize,
        n: usize,
        out: &mut dyn std::io::Write,
    ) -> std::io::Result<()> {
        for p in start..start + n {
            for h in 0..self.heads.len() {
                let run = self.head_rows(values, h, p, 1);
                out.write_all(bytes_of(&run.rows.slice(run.offset, self.head_dim)))?;
            }
        }
        Ok(())
    }

    /// Positions held.
    pub(super) fn len(&self) -> usize {
        self.end()
    }

    /// Bytes held: the bins, their maps and the tail.
    pub(super) fn bytes(&self) -> usize {
        self.heads.iter().map(HeadBins::bytes).sum::<usize>()
            + self.tail_k.bytes()
            + self.tail_v.bytes()
    }
}
