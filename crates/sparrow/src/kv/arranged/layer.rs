//! One arranged layer: per KV head its complete segments sorted by bin and its open
//! positions ([`HeadSegments`]). A segment is sorted when its last block is placed; every
//! position reads as in a store kept by position, a KV head at a time: an open one
//! directly, a sorted one through the head's slot map.

use super::super::types::{bytes_of, KvTypes};
use super::segments::{Backing, HeadSegments, Scratch};
use super::TAIL_SLACK;
use sparrow_attn::kernel::HeadRun;
use std::ops::Range;

/// An arranged layer of rows `kv_dim = heads × head_dim` wide.
pub(super) struct ArrangedLayer {
    kv_dim: usize,
    head_dim: usize,
    segment: usize,
    types: KvTypes,
    /// Per KV head: positions `0..sorted` in sorted segments, then the open ones (every
    /// head holds the same).
    heads: Vec<HeadSegments>,
    /// Per KV head: the bins of positions `sorted..sorted + placed`, placed but waiting for
    /// their segment to complete.
    pending: Vec<Vec<u32>>,
}

impl ArrangedLayer {
    /// A layer of `n_ctx` positions in bins `bins` sorted in segments of `segment`
    /// positions, head `h`'s sorted rows where `backings[h]` says.
    pub(super) fn new(
        (bins, segment): (usize, usize),
        (n_ctx, kv_dim, head_dim): (usize, usize, usize),
        types: KvTypes,
        backings: Vec<Backing>,
    ) -> Self {
        let n_heads = kv_dim / head_dim;
        debug_assert_eq!(backings.len(), n_heads);
        // With a cold file: room for the open segment and a batch of positions after it.
        let open = segment + TAIL_SLACK;
        ArrangedLayer {
            kv_dim,
            head_dim,
            segment,
            types,
            heads: backings
                .into_iter()
                .map(|b| {
                    HeadSegments::new(
                        (bins, segment),
                        (n_ctx, head_dim, open),
                        (types.k, types.v),
                        b,
                    )
                })
                .collect(),
            pending: vec![Vec::new(); n_heads],
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
        self.heads[0].end()
    }

    /// Store position `pos`'s rows (positions are appended in order; an earlier one starts
    /// a rewind: positions from there on are forgotten first).
    pub(super) fn append(
        &mut self,
        pos: usize,
        (k, v): (&[f32], &[f32]),
        scratch: &mut Scratch,
    ) -> Result<(), String> {
        if pos < self.sorted() {
            self.unsort_from(pos, scratch);
        }
        if pos > self.end() {
            return Err(format!(
                "KV position {pos} written before positions {}..{pos}",
                self.end()
            ));
        }
        let row = pos - self.sorted();
        self.pending.iter_mut().for_each(|p| p.truncate(row));
        let hd = self.head_dim;
        for (h, head) in self.heads.iter_mut().enumerate() {
            let at = h * hd..(h + 1) * hd;
            head.put_open(pos, &k[at.clone()], &v[at]);
        }
        Ok(())
    }

    /// Place the sealed block `start..start + bins.len() / heads` in its bins (`bins`
    /// head-major), sorting every segment that completes. A block before what is placed is
    /// a rewind's: placements from `start` are forgotten first. A block beyond a gap, or past
    /// what is held, is not placed (its entries are then read by position).
    pub(super) fn arrange(
        &mut self,
        start: usize,
        bins: &[u32],
        scratch: &mut Scratch,
    ) -> Result<(), String> {
        let heads = self.heads.len();
        let rows = bins.len() / heads;
        if rows * heads != bins.len() || bins.iter().any(|&b| b as usize >= self.bins()) {
            return Err(format!(
                "a placement of {} bins for {heads} KV heads into {} bins",
                bins.len(),
                self.bins()
            ));
        }
        if start < self.sorted() {
            self.unsort_from(start, scratch);
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
            self.sort_segment(scratch)?;
        }
        Ok(())
    }

    fn bins(&self) -> usize {
        self.heads[0].bins()
    }

    /// Sort the first `segment` pending positions into each head's segments.
    fn sort_segment(&mut self, scratch: &mut Scratch) -> Result<(), String> {
        let s = self.segment;
        for h in 0..self.heads.len() {
            if let Err(e) = self.heads[h].sort_segment(&self.pending[h][..s], scratch) {
                // The heads sorted before this one give the segment back: it stays open,
                // for every head.
                let g = self.heads[h].sorted() / s;
                self.heads[..h]
                    .iter_mut()
                    .for_each(|x| x.unsort_from(g, scratch));
                return Err(e);
            }
        }
        self.pending.iter_mut().for_each(|p| {
            p.drain(..s);
        });
        Ok(())
    }

    /// Open again the segment holding `pos` and every later one: their bins go back to
    /// the pending ones.
    fn unsort_from(&mut self, pos: usize, scratch: &mut Scratch) {
        let g = pos / self.segment;
        if g * self.segment >= self.sorted() {
            return;
        }
        let segments = self.sorted() / self.segment;
        for (head, pending) in self.heads.iter_mut().zip(&mut self.pending) {
            let mut back: Vec<u32> = (g..segments).flat_map(|g| head.bins_of(g)).collect();
            back.append(pending);
            *pending = back;
            head.unsort_from(g, scratch);
        }
    }

    /// Replace everything with positions `0..n` from raw rows (as a prompt cache holds them):
    /// they stay open until their blocks are placed again.
    pub(super) fn import(&mut self, n: usize, keys: &[u8], values: &[u8]) {
        let (hd, kv_dim) = (self.head_dim, self.kv_dim);
        let strides = (
            self.types.k.row_bytes(kv_dim),
            self.types.v.row_bytes(kv_dim),
        );
        let (hk, hv) = (self.types.k.row_bytes(hd), self.types.v.row_bytes(hd));
        for (h, head) in self.heads.iter_mut().enumerate() {
            head.import(n, (keys, values), strides, (h * hk, h * hv));
        }
        self.pending.iter_mut().for_each(Vec::clear);
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
        if start >= self.sorted() {
            return HeadRun {
                rows: self.heads[h].open_rows(values, start, n),
                stride: self.head_dim,
                offset: 0,
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

    /// Bytes held in RAM: the heads' rows written (unless in a file) and maps, and the
    /// pending bins.
    pub(super) fn bytes(&self) -> usize {
        self.heads.iter().map(HeadSegments::bytes).sum::<usize>()
            + self.pending.iter().map(|p| p.capacity() * 4).sum::<usize>()
    }
}
