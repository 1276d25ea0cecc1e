//! One arranged layer: per KV head its complete segments sorted by bin ([`HeadSegments`]),
//! and the positions after them — the open segment, sealed or not — in a tail kept by
//! position. A segment is sorted when its last block is placed; every position reads as in
//! a store kept by position, a KV head at a time: through the tail, or through the head's
//! slot map.

use super::super::elements::Elements;
use super::super::types::{bytes_of, KvTypes};
use super::segments::{Backing, HeadSegments};
use sparrow_attn::kernel::HeadRun;
use std::ops::Range;

/// An arranged layer of rows `kv_dim = heads × head_dim` wide.
pub(super) struct ArrangedLayer {
    kv_dim: usize,
    head_dim: usize,
    bins: usize,
    segment: usize,
    types: KvTypes,
    /// Where each head's sorted rows live (kept to start afresh on an import).
    backings: Vec<Backing>,
    /// Per KV head: positions `0..sorted` in sorted segments (every head has the same).
    heads: Vec<HeadSegments>,
    /// Per KV head: the bins of positions `sorted..sorted + placed`, placed but waiting for
    /// their segment to complete.
    pending: Vec<Vec<u32>>,
    /// Positions `sorted..sorted + tail_len`, row `tail_first + i` holding position
    /// `sorted + i` (rows before `tail_first` were sorted and await compaction).
    tail_k: Elements,
    tail_v: Elements,
    tail_first: usize,
    tail_len: usize,
}

impl ArrangedLayer {
    /// A layer of `bins` bins sorted in segments of `segment` positions, head `h`'s sorted
    /// rows where `backings[h]` says.
    pub(super) fn new(
        (bins, segment): (usize, usize),
        kv_dim: usize,
        head_dim: usize,
        types: KvTypes,
        backings: Vec<Backing>,
    ) -> Self {
        let n_heads = kv_dim / head_dim;
        debug_assert_eq!(backings.len(), n_heads);
        ArrangedLayer {
            kv_dim,
            head_dim,
            bins,
            segment,
            types,
            heads: backings
                .iter()
                .map(|b| HeadSegments::new(bins, segment, head_dim, (types.k, types.v), b.clone()))
                .collect(),
            backings,
            pending: vec![Vec::new(); n_heads],
            tail_k: Elements::zeroed(types.k, 0),
            tail_v: Elements::zeroed(types.v, 0),
            tail_first: 0,
            tail_len: 0,
        }
    }

    /// Positions in sorted segments.
    fn sorted(&self) -> usize {
        self.heads[0].sorted()
    }

    /// One past the last position placed in a bin.
    fn placed(&self) -> usize {
        self.sorted() + self.pending[0].len()
    }

    /// One past the last position held.
    fn end(&self) -> usize {
        self.sorted() + self.tail_len
    }

    /// Element offset of tail row `row`.
    fn tail_at(&self, row: usize) -> usize {
        (self.tail_first + row) * self.kv_dim
    }

    /// Store position `pos`'s rows (positions are appended in order; an earlier one starts
    /// a rewind: positions from there on are forgotten first).
    pub(super) fn append(&mut self, pos: usize, k: &[f32], v: &[f32]) -> Result<(), String> {
        if pos < self.sorted() {
            self.unsort_from(pos);
        }
        if pos > self.end() {
            return Err(format!(
                "KV position {pos} written before positions {}..{pos}",
                self.end()
            ));
        }
        let row = pos - self.sorted();
        self.pending.iter_mut().for_each(|p| p.truncate(row));
        self.tail_len = row + 1;
        let at = self.tail_at(row);
        self.tail_k.grow(at + self.kv_dim);
        self.tail_v.grow(at + self.kv_dim);
        self.tail_k.write(at, k);
        self.tail_v.write(at, v);
        Ok(())
    }

    /// Place the sealed block `start..start + bins.len() / heads` in its bins (`bins`
    /// head-major), sorting every segment that completes. A block before what is placed is
    /// a rewind's: placements from `start` are forgotten first. A block beyond a gap, or past
    /// what the tail holds, is not placed (its entries are then read by position).
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
        if start < self.sorted() {
            self.unsort_from(start);
        }
        if start < self.placed() {
            let keep = start - self.sorted();
            self.pending.iter_mut().for_each(|p| p.truncate(keep));
        }
        if start != self.placed() || start + rows > self.end() {
            return Ok(());
        }
        for (h, p) in self.pending.iter_mut().enumerate() {
            p.extend_from_slice(&bins[h * rows..(h + 1) * rows]);
        }
        while self.pending[0].len() >= self.segment {
            self.sort_segment()?;
        }
        Ok(())
    }

    /// Sort the first `segment` pending positions into each head's segments and drop them
    /// from the tail.
    fn sort_segment(&mut self) -> Result<(), String> {
        let (s, hd, kv_dim, first) = (self.segment, self.head_dim, self.kv_dim, self.tail_first);
        for (h, head) in self.heads.iter_mut().enumerate() {
            let at = |i: usize| (first + i) * kv_dim + h * hd;
            if let Err(e) = head.sort_segment(&self.pending[h][..s], &self.tail_k, &self.tail_v, at)
            {
                // The heads sorted before this one give the segment back: it stays in the
                // tail, unsorted, for every head.
                let g = self.heads[h].sorted() / s;
                self.heads[..h]
                    .iter_mut()
                    .for_each(|x| x.truncate_segments(g));
                return Err(e);
            }
        }
        self.pending.iter_mut().for_each(|p| {
            p.drain(..s);
        });
        self.tail_first += s;
        self.tail_len -= s;
        // The rows still waiting move to the front at once (fewer than a segment and a
        // batch, each moved at most once per segment): the tail's memory, every byte of
        // which has been written, stays one segment and a batch instead of growing by a
        // segment before each compaction.
        let live = self.tail_at(0)..self.tail_at(self.tail_len);
        let keep = live.len();
        self.tail_k.copy_within(live.clone(), 0);
        self.tail_v.copy_within(live, 0);
        self.tail_k.shrink(keep);
        self.tail_v.shrink(keep);
        self.tail_first = 0;
        Ok(())
    }

    /// Undo the sorting of the segment holding `pos` and every later one: their rows go back
    /// to the tail, ahead of it, and their bins back to the pending ones.
    fn unsort_from(&mut self, pos: usize) {
        let sorted = self.sorted();
        let g = pos / self.segment;
        let from = g * self.segment;
        if from >= sorted {
            return;
        }
        let (moved, hd, kv_dim) = (sorted - from, self.head_dim, self.kv_dim);
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
        for p in from..sorted {
            let at = self.tail_at(p - from);
            for (h, head) in self.heads.iter().enumerate() {
                let s = head.slot_of(p);
                self.tail_k.put(at + h * hd, &head.rows(false, s..s + 1));
                self.tail_v.put(at + h * hd, &head.rows(true, s..s + 1));
            }
        }
        let segments = sorted / self.segment;
        for (head, pending) in self.heads.iter_mut().zip(&mut self.pending) {
            let mut back: Vec<u32> = (g..segments).flat_map(|g| head.bins_of(g)).collect();
            back.append(pending);
            *pending = back;
            head.truncate_segments(g);
        }
    }

    /// Replace everything with positions `0..n` from raw rows (as a prompt cache holds them):
    /// they wait in the tail until their blocks are placed again.
    pub(super) fn import(&mut self, n: usize, keys: &[u8], values: &[u8]) {
        *self = ArrangedLayer::new(
            (self.bins, self.segment),
            self.kv_dim,
            self.head_dim,
            self.types,
            std::mem::take(&mut self.backings),
        );
        self.tail_k.grow(n * self.kv_dim);
        self.tail_v.grow(n * self.kv_dim);
        self.tail_k.import(0..n * self.kv_dim, keys);
        self.tail_v.import(0..n * self.kv_dim, values);
        self.tail_len = n;
    }

    /// KV head `h`'s rows from position `start` (at most `max`) that lie in one run.
    pub(super) fn head_run_len(&self, h: usize, start: usize, max: usize) -> usize {
        let sorted = self.sorted();
        if start >= sorted {
            return max.min(self.end().saturating_sub(start)).max(1);
        }
        let head = &self.heads[h];
        let first = head.slot_of(start);
        let limit = max.min(sorted - start);
        (1..limit)
            .find(|&i| head.slot_of(start + i) != first + i)
            .unwrap_or(limit)
            .max(1)
    }

    /// KV head `h`'s keys (or values) of positions `start..start + n`, one run.
    pub(super) fn head_rows(&self, values: bool, h: usize, start: usize, n: usize) -> HeadRun<'_> {
        let sorted = self.sorted();
        if start >= sorted {
            let at = self.tail_at(start - sorted);
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

    /// Whether KV head `h` is one of the layer's.
    pub(super) fn has_head(&self, h: usize) -> bool {
        h < self.heads.len()
    }

    /// Appends the slots of the sorted ones among entries `entries` of `bin` of head `h` to
    /// `out`; how many entries, from the first, that is.
    pub(super) fn bin_slots(
        &self,
        h: usize,
        bin: usize,
        entries: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> usize {
        self.heads
            .get(h)
            .map_or(0, |head| head.slots_of(bin, entries, out))
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

    /// Ask for the slots `slots` of head `h` to be read in (a cold file's).
    pub(super) fn will_need(&self, h: usize, slots: Range<usize>) {
        if let Some(head) = self.heads.get(h) {
            head.will_need(slots);
        }
    }

    /// Bytes of sorted rows in a cold file.
    pub(super) fn bytes_cold(&self) -> usize {
        self.heads.iter().map(HeadSegments::bytes_cold).sum()
    }

    /// Bytes held in RAM: the sorted segments (unless cold) and their maps, the pending
    /// bins and the tail.
    pub(super) fn bytes(&self) -> usize {
        self.heads.iter().map(HeadSegments::bytes).sum::<usize>()
            + self.pending.iter().map(|p| p.capacity() * 4).sum::<usize>()
            + self.tail_k.bytes()
            + self.tail_v.bytes()
    }
}
