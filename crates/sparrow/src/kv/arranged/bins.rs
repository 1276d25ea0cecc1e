//! One KV head's sealed rows of an arranged layer, grouped by bin: the rows of a bin lie in
//! chunks of [`CHUNK`] consecutive slots, so reading a bin is a few contiguous runs instead
//! of one scattered row per position (what kept Saap behind Quest at 32K when it read by
//! position, docs/long-context.md).
//!
//! Slots live in one arena of chunks; a bin owns a list of chunks, filled in the order its
//! positions arrive (ascending: blocks are sealed in order). Entry `i` of a bin is slot
//! `i % CHUNK` of its chunk `i / CHUNK`. Chunks are numbered in the order they are first
//! needed, and a rewind frees exactly the highest-numbered ones (those first needed after
//! the positions it keeps), so the arena's layout depends only on the rows it holds, not on
//! the rewinds that led there: a policy reading slots in slot order sums in the same order
//! as on a store filled afresh (prefix imports, speculative rewinds stay bit for bit). Rows are kept in the store's element type, copied
//! bit for bit. Two maps tie slots to positions: the position of every slot, and the slot
//! of every position filed.

use super::super::elements::Elements;
use super::super::types::KvType;
use std::ops::Range;

/// Slots per chunk: a bin's reads are runs of up to this many rows, and a bin leaves at
/// most `CHUNK - 1` slots of its last chunk unused (memory the arena holds for nothing:
/// about `bins × CHUNK / 2` rows per head).
pub const CHUNK: usize = 8;

/// No position (a slot not in use).
const NONE: u32 = u32::MAX;

/// One KV head's filed rows, by bin.
pub(super) struct HeadBins {
    head_dim: usize,
    keys: Elements,
    values: Elements,
    /// Per bin: its chunks, in filing order.
    chunks: Vec<Vec<u32>>,
    /// Per bin: entries filed.
    counts: Vec<u32>,
    /// Chunks in use: exactly `0..used`.
    used: usize,
    /// Per slot: the position it holds ([`NONE`] where none).
    position: Vec<u32>,
    /// Per filed position (`0..filed`): its slot.
    slot: Vec<u32>,
}

impl HeadBins {
    /// No rows yet, in `bins` bins of rows `head_dim` wide, keys and values of `types`.
    pub(super) fn new(bins: usize, head_dim: usize, k: KvType, v: KvType) -> HeadBins {
        HeadBins {
            head_dim,
            keys: Elements::zeroed(k, 0),
            values: Elements::zeroed(v, 0),
            chunks: vec![Vec::new(); bins],
            counts: vec![0; bins],
            used: 0,
            position: Vec::new(),
            slot: Vec::new(),
        }
    }

    /// Positions filed (`0..filed`).
    pub(super) fn filed(&self) -> usize {
        self.slot.len()
    }

    /// The slot of filed position `pos`.
    pub(super) fn slot_of(&self, pos: usize) -> usize {
        self.slot[pos] as usize
    }

    /// The position slot `slot` holds.
    pub(super) fn position_of(&self, slot: usize) -> usize {
        self.position[slot] as usize
    }

    /// Keys (or, with `values`, values) of slots `slots`.
    pub(super) fn rows(&self, values: bool, slots: Range<usize>) -> super::super::KvRows<'_> {
        let hd = self.head_dim;
        let e = if values { &self.values } else { &self.keys };
        e.rows(slots.start * hd..slots.end * hd)
    }

    /// File the next position (`filed()`) in `bin`, its key and value copied from elements
    /// `from..from + head_dim` of `keys` and `values`.
    pub(super) fn file(&mut self, bin: usize, keys: &Elements, values: &Elements, from: usize) {
        let hd = self.head_dim;
        let i = self.counts[bin] as usize;
        if i.is_multiple_of(CHUNK) {
            let chunk = self.used;
            self.used += 1;
            let slots = self.used * CHUNK;
            if self.position.len() < slots {
                self.position.resize(slots, NONE);
                self.keys.grow(slots * hd);
                self.values.grow(slots * hd);
            }
            self.chunks[bin].push(chunk as u32);
        }
        let at = self.chunks[bin][i / CHUNK] as usize * CHUNK + i % CHUNK;
        let src = from..from + hd;
        self.keys
            .copy_from(at * hd, keys, src.clone())
            .expect("a store's rows of one type");
        self.values
            .copy_from(at * hd, values, src)
            .expect("a store's rows of one type");
        self.position[at] = self.slot.len() as u32;
        self.slot.push(at as u32);
        self.counts[bin] = i as u32 + 1;
    }

    /// Appends to `out` the slots of entries `entries` of `bin`, as runs; false when the bin
    /// holds fewer entries.
    pub(super) fn slots_of(
        &self,
        bin: usize,
        entries: Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) -> bool {
        if bin >= self.counts.len() || entries.end > self.counts[bin] as usize {
            return false;
        }
        let mut i = entries.start;
        while i < entries.end {
            let in_chunk = (CHUNK - i % CHUNK).min(entries.end - i);
            let at = self.chunks[bin][i / CHUNK] as usize * CHUNK + i % CHUNK;
            out.push(at..at + in_chunk);
            i += in_chunk;
        }
        true
    }

    /// Forget positions `from..` (a rewind): each bin keeps its entries below `from`, and
    /// its chunks past them are freed — the chunks first needed after `from`, which are the
    /// highest-numbered (positions are filed in order).
    pub(super) fn truncate(&mut self, from: usize) {
        if from >= self.filed() {
            return;
        }
        for bin in 0..self.chunks.len() {
            let count = self.counts[bin] as usize;
            let entry_pos = |i: usize| {
                let at = self.chunks[bin][i / CHUNK] as usize * CHUNK + i % CHUNK;
                self.position[at] as usize
            };
            // Entries are ascending by position: the first at or past `from`.
            let (mut lo, mut hi) = (0, count);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if entry_pos(mid) < from {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            let keep = lo;
            if keep == count {
                continue;
            }
            let chunks = &mut self.chunks[bin];
            for c in chunks.drain(keep.div_ceil(CHUNK)..) {
                self.position[c as usize * CHUNK..][..CHUNK].fill(NONE);
            }
            if keep % CHUNK != 0 {
                let c = chunks[keep / CHUNK] as usize;
                self.position[c * CHUNK + keep % CHUNK..(c + 1) * CHUNK].fill(NONE);
            }
            self.counts[bin] = keep as u32;
        }
        self.used = self.chunks.iter().map(Vec::len).sum();
        debug_assert!(
            self.chunks
                .iter()
                .flatten()
                .all(|&c| (c as usize) < self.used),
            "the chunks kept are the lowest-numbered"
        );
        self.slot.truncate(from);
    }

    /// Bytes held: rows, maps and chunk lists.
    pub(super) fn bytes(&self) -> usize {
        self.keys.bytes()
            + self.values.bytes()
            + (self.position.capacity() + self.slot.capacity()) * 4
            + self.chunks.iter().map(|c| c.capacity() * 4).sum::<usize>()
            + self.counts.len() * 4
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

    fn bin_of(p: usize) -> usize {
        (p * 7 + p / 5) % 3
    }

    /// Filed `0..upto`: each bin's entries are its positions in order, and their slots hold
    /// head 1's rows of those positions bit for bit.
    fn check(b: &HeadBins, src: &Elements, upto: usize) {
        assert_eq!(b.filed(), upto);
        for bin in 0..3 {
            let want: Vec<usize> = (0..upto).filter(|&p| bin_of(p) == bin).collect();
            let mut runs = Vec::new();
            assert!(b.slots_of(bin, 0..want.len(), &mut runs));
            assert!(
                !b.slots_of(bin, 0..want.len() + 1, &mut Vec::new()),
                "past the bin"
            );
            let slots: Vec<usize> = runs.into_iter().flatten().collect();
            let got: Vec<usize> = slots.iter().map(|&s| b.position_of(s)).collect();
            assert_eq!(got, want, "bin {bin}");
            for (&s, &p) in slots.iter().zip(&want) {
                assert_eq!(b.slot_of(p), s);
                for values in [false, true] {
                    let mut a = vec![0f32; 32];
                    let mut w = vec![0f32; 32];
                    b.rows(values, s..s + 1).to_f32(&mut a);
                    src.rows(p * 64 + 32..p * 64 + 64).to_f32(&mut w);
                    assert_eq!(a, w, "position {p}");
                }
            }
        }
    }

    /// Rows file into their bins and read back; a rewind takes the later ones out, and
    /// filing them again leaves the arena as a store filled afresh has it, slot for slot.
    #[test]
    fn bins_read_back_their_rows_and_rewinds_leave_the_fresh_layout() {
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            let src = rows(ty, 100);
            let fill = |b: &mut HeadBins, from: usize, to: usize| {
                for p in from..to {
                    b.file(bin_of(p), &src, &src, p * 64 + 32);
                }
            };
            let mut b = HeadBins::new(3, 32, ty, ty);
            fill(&mut b, 0, 100);
            check(&b, &src, 100);
            let mut fresh = HeadBins::new(3, 32, ty, ty);
            fill(&mut fresh, 0, 41);
            b.truncate(41);
            check(&b, &src, 41);
            assert_eq!(b.slot, fresh.slot, "{ty}: the layout a fresh store has");
            fill(&mut b, 41, 100);
            fill(&mut fresh, 41, 100);
            check(&b, &src, 100);
            assert_eq!(b.slot, fresh.slot);
        }
    }
}
