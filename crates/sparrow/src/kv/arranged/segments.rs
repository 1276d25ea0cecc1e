//! One KV head's rows: its complete segments of `segment` positions, each sorted by bin (and
//! by position within a bin), one after the other, and after them the open positions, by
//! position. A bin's entries in one segment are therefore one run of slots (Saap's cells —
//! a bucket within a position segment — are exactly that), and a whole bin is a run per
//! segment. Slot `s` of segment `g` is slot `g × segment + s`: the layout depends only on
//! the rows held and their bins, never on the rewinds that led there, so reading slots in
//! slot order sums in the same order on a rewound, restored or freshly filled store.
//!
//! In RAM every row has one place for good: open position `p` is slot `p`, and sorting a
//! segment permutes its rows where they are (through a segment of scratch the store
//! shares), so the head holds each position's row once — no tail beside the segments that
//! would keep a segment's worth of written pages of its own. With a cold file
//! ([`Backing`]) the sorted segments are in the file, written once, in one piece, as each
//! is sorted, and the open positions wait in RAM.

use super::super::cold_file::ColdFile;
use super::super::elements::Elements;
use super::super::types::{bytes_of, KvRows, KvType};
use sparrow_attn::policy::sort_by_bin;
use std::ops::Range;
use std::sync::Arc;

/// Where a head's sorted rows live.
#[derive(Clone)]
pub(super) enum Backing {
    /// In RAM.
    Ram,
    /// In region `region` of `file` (rows a head wide); the open positions stay in RAM.
    Cold { file: Arc<ColdFile>, region: usize },
}

/// The longest segment: offsets within one fit two bytes.
pub(super) const MAX_SEGMENT: usize = 1 << 16;

/// Copy `n` rows of `head_dim` values from row `from` of `src` (keys, values) to row `to`
/// of `dst` (all of a store's rows are of its types).
fn copy_rows(
    dst: (&mut Elements, &mut Elements),
    to: usize,
    src: (&Elements, &Elements),
    from: usize,
    n: usize,
    head_dim: usize,
) {
    const ONE_TYPE: &str = "a store's rows of one type";
    let rows = from * head_dim..(from + n) * head_dim;
    dst.0
        .copy_from(to * head_dim, src.0, rows.clone())
        .expect(ONE_TYPE);
    dst.1.copy_from(to * head_dim, src.1, rows).expect(ONE_TYPE);
}

/// A segment of one head's keys and values, to sort through (one per store: segments are
/// sorted one at a time).
pub(super) struct Scratch {
    keys: Elements,
    values: Elements,
}

impl Scratch {
    /// Room for `rows` rows of `head_dim` values of types `k` and `v`.
    pub(super) fn new(rows: usize, head_dim: usize, (k, v): (KvType, KvType)) -> Self {
        Scratch {
            keys: Elements::zeroed(k, rows * head_dim),
            values: Elements::zeroed(v, rows * head_dim),
        }
    }

    /// Its bytes (written whole by the first sort).
    pub(super) fn bytes(&self) -> usize {
        let rows = |e: &Elements| e.kind().row_bytes(e.len());
        rows(&self.keys) + rows(&self.values)
    }
}

/// One KV head's sorted segments, its open positions, and the maps between slots and
/// positions.
///
/// In RAM the rows are allocated zeroed for the whole context, once: the OS commits a page
/// when a position is first written into it, and nothing reallocates as the context grows
/// (a growing vector briefly holds its old and new rows, and the allocator may keep the old).
pub(super) struct HeadSegments {
    head_dim: usize,
    bins: usize,
    segment: usize,
    /// RAM: every slot, sorted segments then open positions. Cold: the open positions, row
    /// `i` holding position `sorted + i`.
    keys: Elements,
    values: Elements,
    backing: Backing,
    /// One past the last open position held.
    end: usize,
    /// Rows of `keys` and `values` ever written (their pages resident; the rest untouched).
    written: usize,
    /// Per slot: the position it holds, as its offset in the segment (both lie in the same
    /// segment; two bytes each instead of four, at most [`MAX_SEGMENT`] positions).
    position: Vec<u16>,
    /// Per sorted position: its slot, as its offset in the segment.
    slot: Vec<u16>,
    /// Per segment `g`, `bins + 1` offsets: bin `b`'s rows are slots
    /// `g × segment + starts[g][b] .. g × segment + starts[g][b + 1]`.
    starts: Vec<u32>,
    /// Per segment boundary `g` (0 ..= segments), per bin: the bin's entries in segments
    /// before `g` (so entry `i` of bin `b` is in the segment whose range holds it).
    before: Vec<u32>,
}

impl HeadSegments {
    /// A head of `head_dim` values in a context of `n_ctx` positions, sorted in segments of
    /// `segment` positions into `bins` bins; with a cold file, `open` rows of open positions
    /// allocated at first (a longer run of them grows it).
    pub(super) fn new(
        (bins, segment): (usize, usize),
        (n_ctx, head_dim, open): (usize, usize, usize),
        (k, v): (KvType, KvType),
        backing: Backing,
    ) -> Self {
        let rows = match backing {
            Backing::Ram => n_ctx,
            Backing::Cold { .. } => open.min(n_ctx),
        };
        HeadSegments {
            head_dim,
            bins,
            segment,
            keys: Elements::zeroed(k, rows * head_dim),
            values: Elements::zeroed(v, rows * head_dim),
            backing,
            end: 0,
            written: 0,
            position: Vec::new(),
            slot: Vec::new(),
            starts: Vec::new(),
            before: vec![0; bins],
        }
    }

    /// The row of `keys` and `values` holding open position `pos`.
    fn open_row(&self, pos: usize) -> usize {
        match self.backing {
            Backing::Ram => pos,
            Backing::Cold { .. } => pos - self.sorted(),
        }
    }

    /// Bins.
    pub(super) fn bins(&self) -> usize {
        self.bins
    }

    /// One past the last position held.
    pub(super) fn end(&self) -> usize {
        self.end
    }

    /// Store open position `pos` (at most [`Self::end`]; positions after it are forgotten):
    /// its key `k` and value `v`, `head_dim` values each.
    pub(super) fn put_open(&mut self, pos: usize, k: &[f32], v: &[f32]) {
        debug_assert!(pos >= self.sorted() && pos <= self.end);
        let (row, hd) = (self.open_row(pos), self.head_dim);
        self.keys.grow((row + 1) * hd);
        self.values.grow((row + 1) * hd);
        self.keys.write(row * hd, k);
        self.values.write(row * hd, v);
        self.end = pos + 1;
        self.written = self.written.max(row + 1);
    }

    /// Replace everything with positions `0..n` from raw rows (`keys` and `values` of
    /// `n` rows of `stride` bytes, this head's at byte `at` of each).
    pub(super) fn import(
        &mut self,
        n: usize,
        (keys, values): (&[u8], &[u8]),
        (stride_k, stride_v): (usize, usize),
        (at_k, at_v): (usize, usize),
    ) {
        self.truncate_segments(0);
        let hd = self.head_dim;
        self.keys.grow(n * hd);
        self.values.grow(n * hd);
        let (rk, rv) = (
            self.keys.kind().row_bytes(hd),
            self.values.kind().row_bytes(hd),
        );
        for p in 0..n {
            let k = &keys[p * stride_k + at_k..][..rk];
            let v = &values[p * stride_v + at_v..][..rv];
            self.keys.import(p * hd..(p + 1) * hd, k);
            self.values.import(p * hd..(p + 1) * hd, v);
        }
        self.end = n;
        self.written = self.written.max(n);
    }

    /// Open positions `start..start + n`' keys (or, with `values`, values), by position.
    pub(super) fn open_rows(&self, values: bool, start: usize, n: usize) -> KvRows<'_> {
        let (row, hd) = (self.open_row(start), self.head_dim);
        let e = if values { &self.values } else { &self.keys };
        e.rows(row * hd..(row + n) * hd)
    }

    /// Positions sorted (`0..sorted`, whole segments).
    pub(super) fn sorted(&self) -> usize {
        self.slot.len()
    }

    fn segments(&self) -> usize {
        self.sorted() / self.segment
    }

    /// The slot of sorted position `pos`.
    pub(super) fn slot_of(&self, pos: usize) -> usize {
        pos - pos % self.segment + self.slot[pos] as usize
    }

    /// The position slot `slot` holds.
    pub(super) fn position_of(&self, slot: usize) -> usize {
        slot - slot % self.segment + self.position[slot] as usize
    }

    /// Keys (or, with `values`, values) of slots `slots`.
    pub(super) fn rows(&self, values: bool, slots: Range<usize>) -> KvRows<'_> {
        let hd = self.head_dim;
        match &self.backing {
            Backing::Ram => {
                let e = if values { &self.values } else { &self.keys };
                e.rows(slots.start * hd..slots.end * hd)
            }
            Backing::Cold { file, region } => {
                let (at, row, ty) = self.cold_at(file, *region, values, slots.start);
                file.rows(at, slots.len(), row, ty)
            }
        }
    }

    /// Where slot `slot`'s key (or value) is in `file`, the bytes of a row and its type.
    fn cold_at(
        &self,
        file: &ColdFile,
        region: usize,
        values: bool,
        slot: usize,
    ) -> (usize, usize, KvType) {
        if values {
            (file.v_at(region, slot), file.v_row, self.values.kind())
        } else {
            (file.k_at(region, slot), file.k_row, self.keys.kind())
        }
    }

    /// Ask for slots `slots`' keys and values to be read in from a cold file.
    pub(super) fn will_need(&self, slots: Range<usize>) {
        if let Backing::Cold { file, region } = &self.backing {
            for values in [false, true] {
                let (at, row, _) = self.cold_at(file, *region, values, slots.start);
                file.will_need(at..at + slots.len() * row);
            }
        }
    }

    /// Bytes of sorted rows in a cold file.
    pub(super) fn bytes_cold(&self) -> usize {
        match &self.backing {
            Backing::Ram => 0,
            Backing::Cold { file, .. } => self.sorted() * (file.k_row + file.v_row),
        }
    }

    /// Sort the next segment (open positions `sorted()..sorted() + segment`, all held):
    /// position `sorted() + i` is in bin `bins[i]`. A cold file's write may fail: the
    /// error says why, and the segment stays open.
    pub(super) fn sort_segment(
        &mut self,
        bins: &[u32],
        scratch: &mut Scratch,
    ) -> Result<(), String> {
        let (s, hd, first) = (self.segment, self.head_dim, self.sorted());
        debug_assert_eq!(bins.len(), s);
        debug_assert!(
            self.end >= first + s,
            "a segment is sorted once all of it is held"
        );
        let mut order = vec![0u16; s];
        // Stable: positions ascend within a bin.
        let mut starts = vec![0u32; self.bins + 1];
        sort_by_bin(bins, &mut starts, &mut Vec::new(), |rank, i| {
            order[rank] = i as u16;
        });
        match &self.backing {
            Backing::Ram => {
                // The segment's rows (slots `first..first + s`, by position) go through the
                // scratch back into the same slots, by bin.
                let own = (&mut self.keys, &mut self.values);
                copy_rows(
                    (&mut scratch.keys, &mut scratch.values),
                    0,
                    (own.0, own.1),
                    first,
                    s,
                    hd,
                );
                for (rank, &i) in order.iter().enumerate() {
                    let from = (&scratch.keys, &scratch.values);
                    copy_rows(
                        (&mut *own.0, &mut *own.1),
                        first + rank,
                        from,
                        i as usize,
                        1,
                        hd,
                    );
                }
            }
            Backing::Cold { file, region } => {
                // Open rows `0..s`, by bin into the scratch, and the scratch to the file.
                for (rank, &i) in order.iter().enumerate() {
                    let (to, from) = (
                        (&mut scratch.keys, &mut scratch.values),
                        (&self.keys, &self.values),
                    );
                    copy_rows(to, rank, from, i as usize, 1, hd);
                }
                let what = || format!("sorted KV positions {first}..{}", first + s);
                for values in [false, true] {
                    let e = if values {
                        &scratch.values
                    } else {
                        &scratch.keys
                    };
                    let (at, row, _) = self.cold_at(file, *region, values, first);
                    file.write(bytes_of(&e.rows(0..s * hd)), at, what)?;
                    file.start_writeback(at..at + s * row);
                }
                // The open positions after the segment move to the front.
                let rest = s * hd..(self.end - first) * hd;
                self.keys.copy_within(rest.clone(), 0);
                self.values.copy_within(rest, 0);
            }
        }
        self.position.extend_from_slice(&order);
        self.slot.resize(first + s, 0);
        for (rank, &i) in order.iter().enumerate() {
            self.slot[first + i as usize] = rank as u16;
        }
        let g = self.segments() - 1;
        let prev = g * self.bins;
        for b in 0..self.bins {
            let here = starts[b + 1] - starts[b];
            let total = self.before[prev + b] + here;
            self.before.push(total);
        }
        self.starts.extend_from_slice(&starts);
        Ok(())
    }

    /// Open the sorted segments from `g` on again: their rows go back to their positions,
    /// ahead of the open ones.
    pub(super) fn unsort_from(&mut self, g: usize, scratch: &mut Scratch) {
        let (s, hd, segments) = (self.segment, self.head_dim, self.segments());
        if g >= segments {
            return;
        }
        let (from, sorted) = (g * s, self.sorted());
        match &self.backing {
            Backing::Ram => {
                // Each segment through the scratch, back by position into its own slots.
                for seg in g..segments {
                    let own = (&mut self.keys, &mut self.values);
                    copy_rows(
                        (&mut scratch.keys, &mut scratch.values),
                        0,
                        (own.0, own.1),
                        seg * s,
                        s,
                        hd,
                    );
                    for rank in 0..s {
                        let p = seg * s + self.position[seg * s + rank] as usize;
                        let from = (&scratch.keys, &scratch.values);
                        copy_rows((&mut *own.0, &mut *own.1), p, from, rank, 1, hd);
                    }
                }
            }
            Backing::Cold { file, region } => {
                // The open rows make room at the front, which the file's rows fill.
                let (moved, open) = (sorted - from, self.end - sorted);
                self.keys.grow((moved + open) * hd);
                self.values.grow((moved + open) * hd);
                self.keys.copy_within(0..open * hd, moved * hd);
                self.values.copy_within(0..open * hd, moved * hd);
                let (file, region) = (file.clone(), *region);
                for p in from..sorted {
                    let slot = self.slot_of(p);
                    for values in [false, true] {
                        let (at, row, ty) = self.cold_at(&file, region, values, slot);
                        let rows = file.rows(at, 1, row, ty);
                        let e = if values {
                            &mut self.values
                        } else {
                            &mut self.keys
                        };
                        e.put((p - from) * hd, &rows);
                    }
                }
                self.written = self.written.max(moved + open);
            }
        }
        self.truncate_segments(g);
    }

    /// The bin of each position of sorted segment `g`, in position order.
    pub(super) fn bins_of(&self, g: usize) -> Vec<u32> {
        let (s, c) = (self.segment, self.bins);
        let starts = &self.starts[g * (c + 1)..(g + 1) * (c + 1)];
        let mut out = vec![0u32; s];
        for b in 0..c {
            for r in starts[b]..starts[b + 1] {
                out[self.position[g * s + r as usize] as usize] = b as u32;
            }
        }
        out
    }

    /// Keep the maps of the sorted segments before `g`.
    fn truncate_segments(&mut self, g: usize) {
        if g >= self.segments() {
            return;
        }
        let (s, c) = (self.segment, self.bins);
        self.position.truncate(g * s);
        self.slot.truncate(g * s);
        self.starts.truncate(g * (c + 1));
        self.before.truncate((g + 1) * c);
    }

    /// Appends to `out` the slots of bin `bin`'s entries `entries` that are sorted (a
    /// prefix of them, as runs: one per segment); returns how many entries that is.
    pub(super) fn slots_of(
        &self,
        bin: usize,
        entries: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> usize {
        let (c, s, segs) = (self.bins, self.segment, self.segments());
        if bin >= c || entries.is_empty() {
            return 0;
        }
        let before = |g: usize| self.before[g * c + bin] as usize;
        let end = entries.end.min(before(segs));
        if entries.start >= end {
            return 0;
        }
        // The segment holding entry `entries.start`: the last boundary at or below it.
        let (mut lo, mut hi) = (0, segs);
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if before(mid) <= entries.start {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let mut i = entries.start;
        let mut g = lo;
        while i < end {
            let (first, last) = (before(g), before(g + 1));
            if i < last {
                let start = self.starts[g * (c + 1) + bin] as usize;
                let take = last.min(end) - i;
                let slot = g * s + start + (i - first);
                out.push(slot..slot + take);
                i += take;
            }
            g += 1;
        }
        end - entries.start
    }

    /// Bytes held in RAM: the rows written (in a cold file's case, the open positions')
    /// and the maps.
    pub(super) fn bytes(&self) -> usize {
        let hd = self.head_dim;
        let row = self.keys.kind().row_bytes(hd) + self.values.kind().row_bytes(hd);
        self.written * row
            + (self.position.len() + self.slot.len()) * 2
            + (self.starts.len() + self.before.len()) * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` positions × 2 heads × 32 values of `ty`, value = position * 100 + column.
    fn rows(ty: KvType, n: usize) -> Elements {
        let x: Vec<f32> = (0..n * 64)
            .map(|i| ((i / 64) * 100 + i % 64) as f32 / 64.0)
            .collect();
        let mut e = Elements::zeroed(ty, n * 64);
        e.write(0, &x);
        e
    }

    fn bin_of(p: usize) -> u32 {
        ((p * 7 + p / 5) % 3) as u32
    }

    /// Sorted `0..upto`: each bin's entries, read as slots, are its positions in order,
    /// holding head 1's rows of those positions bit for bit; a range past what is sorted is
    /// served up to the sorted part.
    fn check(h: &HeadSegments, src: &Elements, upto: usize) {
        assert_eq!(h.sorted(), upto);
        for bin in 0..3 {
            let want: Vec<usize> = (0..upto).filter(|&p| bin_of(p) == bin as u32).collect();
            let mut runs = Vec::new();
            assert_eq!(h.slots_of(bin, 0..want.len() + 5, &mut runs), want.len());
            assert_eq!(runs.len(), upto / 10, "one run per segment");
            let slots: Vec<usize> = runs.into_iter().flatten().collect();
            let got: Vec<usize> = slots.iter().map(|&s| h.position_of(s)).collect();
            assert_eq!(got, want, "bin {bin}");
            // Any sub-range of entries.
            let mut part = Vec::new();
            assert_eq!(
                h.slots_of(bin, 3..want.len() - 2, &mut part),
                want.len() - 5
            );
            let got: Vec<usize> = part
                .into_iter()
                .flatten()
                .map(|s| h.position_of(s))
                .collect();
            assert_eq!(got, want[3..want.len() - 2]);
            for (&s, &p) in slots.iter().zip(&want) {
                assert_eq!(h.slot_of(p), s);
                for values in [false, true] {
                    let (mut a, mut w) = (vec![0f32; 32], vec![0f32; 32]);
                    h.rows(values, s..s + 1).to_f32(&mut a);
                    src.rows(p * 64 + 32..p * 64 + 64).to_f32(&mut w);
                    assert_eq!(a, w, "position {p}");
                }
            }
        }
        for g in 0..upto / 10 {
            let want: Vec<u32> = (g * 10..(g + 1) * 10).map(bin_of).collect();
            assert_eq!(h.bins_of(g), want);
        }
    }

    /// Open positions `from..to` read back, by position, head 1's rows of `src`.
    fn check_open(h: &HeadSegments, src: &Elements, from: usize, to: usize) {
        assert_eq!(h.end(), to);
        for p in from..to {
            for values in [false, true] {
                let (mut a, mut w) = (vec![0f32; 32], vec![0f32; 32]);
                h.open_rows(values, p, 1).to_f32(&mut a);
                src.rows(p * 64 + 32..p * 64 + 64).to_f32(&mut w);
                assert_eq!(a, w, "open position {p}");
            }
        }
    }

    /// Segments sort into their bins where their rows are and read back; opening segments
    /// again gives every row back to its position, and sorting them again gives the slots
    /// a fresh fill gives.
    #[test]
    fn segments_read_back_by_bin_and_refill_as_fresh() {
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let src = rows(ty, 100);
            let x = |p: usize| -> Vec<f32> {
                (0..32).map(|c| (p * 100 + 32 + c) as f32 / 64.0).collect()
            };
            let mut scratch = Scratch::new(10, 32, (ty, ty));
            let fill = |h: &mut HeadSegments, scratch: &mut Scratch, from: usize, to: usize| {
                for p in from..to {
                    h.put_open(p, &x(p), &x(p));
                }
                for g in h.sorted() / 10..to / 10 {
                    let bins: Vec<u32> = (g * 10..(g + 1) * 10).map(bin_of).collect();
                    h.sort_segment(&bins, scratch).unwrap();
                }
            };
            let mut h = HeadSegments::new((3, 10), (100, 32, 25), (ty, ty), Backing::Ram);
            fill(&mut h, &mut scratch, 0, 95);
            check(&h, &src, 90);
            check_open(&h, &src, 90, 95);
            h.unsort_from(4, &mut scratch);
            check(&h, &src, 40);
            check_open(&h, &src, 40, 95);
            // A rewind into the open positions, and the rest filled again.
            fill(&mut h, &mut scratch, 60, 100);
            let mut fresh = HeadSegments::new((3, 10), (100, 32, 25), (ty, ty), Backing::Ram);
            fill(&mut fresh, &mut scratch, 0, 100);
            assert_eq!(h.slot, fresh.slot, "{ty}");
            assert_eq!(h.position, fresh.position);
            check(&h, &src, 100);
        }
    }
}
