//! One KV head's sorted segments: the rows of each complete segment of `segment` positions,
//! sorted by bin (and by position within a bin), one after the other. A bin's entries in
//! one segment are therefore one run of slots (Saap's cells — a bucket within a position
//! segment — are exactly that), and a whole bin is a run per segment. Slot `s` of segment
//! `g` is slot `g × segment + s`: the layout depends only on the rows held and their bins,
//! never on the rewinds that led there, so reading slots in slot order sums in the same
//! order on a rewound, restored or freshly filled store. Nothing is padded: the arena holds
//! exactly the sorted positions' rows — in RAM, or in a region of a cold file
//! ([`Backing`]), where a segment is written once, in one piece, as it is sorted.

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
    /// In region `region` of `file` (rows a head wide); the sorted segment is built in the
    /// head's buffers, written, and the buffers reused.
    Cold { file: Arc<ColdFile>, region: usize },
}

/// The longest segment: offsets within one fit two bytes.
pub(super) const MAX_SEGMENT: usize = 1 << 16;

/// One KV head's sorted segments, and the maps between slots and positions.
pub(super) struct HeadSegments {
    head_dim: usize,
    bins: usize,
    segment: usize,
    /// The rows (with [`Backing::Ram`]), or the segment being written (cold).
    keys: Elements,
    values: Elements,
    backing: Backing,
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
    pub(super) fn new(
        bins: usize,
        segment: usize,
        head_dim: usize,
        (k, v): (KvType, KvType),
        backing: Backing,
    ) -> Self {
        HeadSegments {
            head_dim,
            bins,
            segment,
            keys: Elements::zeroed(k, 0),
            values: Elements::zeroed(v, 0),
            backing,
            position: Vec::new(),
            slot: Vec::new(),
            starts: Vec::new(),
            before: vec![0; bins],
        }
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

    /// Sort the next segment (positions `sorted()..sorted() + segment`): position
    /// `sorted() + i` is in bin `bins[i]`, its key and value the `head_dim` elements from
    /// `at(i)` of `keys` and `values`. A cold file's write may fail: the error says why,
    /// and the segment stays unsorted.
    pub(super) fn sort_segment(
        &mut self,
        bins: &[u32],
        keys: &Elements,
        values: &Elements,
        at: impl Fn(usize) -> usize,
    ) -> Result<(), String> {
        let (s, hd, first) = (self.segment, self.head_dim, self.sorted());
        debug_assert_eq!(bins.len(), s);
        let base = first; // slot of the segment's first row
                          // Where the segment's rows go: after the others in RAM, or at the start of the
                          // buffers that are written to the file.
        let buf_first = match self.backing {
            Backing::Ram => first,
            Backing::Cold { .. } => 0,
        };
        self.keys.grow((buf_first + s) * hd);
        self.values.grow((buf_first + s) * hd);
        let mut order = vec![0u16; s];
        // Stable: positions ascend within a bin.
        let mut starts = vec![0u32; self.bins + 1];
        let (own_keys, own_values) = (&mut self.keys, &mut self.values);
        sort_by_bin(bins, &mut starts, &mut Vec::new(), |rank, i| {
            let src = at(i)..at(i) + hd;
            let dst = (buf_first + rank) * hd;
            own_keys
                .copy_from(dst, keys, src.clone())
                .expect("a store's rows of one type");
            own_values
                .copy_from(dst, values, src)
                .expect("a store's rows of one type");
            order[rank] = i as u16;
        });
        if let Backing::Cold { file, region } = &self.backing {
            let what = || format!("sorted KV positions {first}..{}", first + s);
            for values in [false, true] {
                let e = if values { &self.values } else { &self.keys };
                let (at, row, _) = self.cold_at(file, *region, values, base);
                file.write(bytes_of(&e.rows(0..s * hd)), at, what)?;
                file.start_writeback(at..at + s * row);
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

    /// Keep the sorted segments before `g`.
    pub(super) fn truncate_segments(&mut self, g: usize) {
        if g >= self.segments() {
            return;
        }
        let (s, hd, c) = (self.segment, self.head_dim, self.bins);
        self.position.truncate(g * s);
        self.slot.truncate(g * s);
        if let Backing::Ram = self.backing {
            self.keys.shrink(g * s * hd);
            self.values.shrink(g * s * hd);
        }
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

    /// Bytes held in RAM: rows (or the cold segment's buffers) and maps.
    pub(super) fn bytes(&self) -> usize {
        self.keys.bytes()
            + self.values.bytes()
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

    /// Segments sort into their bins and read back; dropping segments and sorting them again
    /// gives the slots a fresh fill gives.
    #[test]
    fn segments_read_back_by_bin_and_refill_as_fresh() {
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let src = rows(ty, 100);
            let fill = |h: &mut HeadSegments, from: usize, to: usize| {
                for g in from / 10..to / 10 {
                    let bins: Vec<u32> = (g * 10..(g + 1) * 10).map(bin_of).collect();
                    h.sort_segment(&bins, &src, &src, |i| (g * 10 + i) * 64 + 32)
                        .unwrap();
                }
            };
            let mut h = HeadSegments::new(3, 10, 32, (ty, ty), Backing::Ram);
            fill(&mut h, 0, 100);
            check(&h, &src, 100);
            h.truncate_segments(4);
            check(&h, &src, 40);
            fill(&mut h, 40, 100);
            let mut fresh = HeadSegments::new(3, 10, 32, (ty, ty), Backing::Ram);
            fill(&mut fresh, 0, 100);
            assert_eq!(h.slot, fresh.slot, "{ty}");
            assert_eq!(h.position, fresh.position);
            check(&h, &src, 100);
        }
    }
}
