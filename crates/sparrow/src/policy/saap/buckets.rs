//! Saap's inverted file: one KV head's keys and values copied bucket by bucket, so a
//! decode step reads each chosen bucket as a few contiguous runs instead of one scattered
//! store row per position (docs/long-context.md, "Saap", "Speed": the scattered gather,
//! not the routing, was what kept saap behind Quest at 32K).
//!
//! Rows live in an arena of chunks of [`CHUNK`] rows; a bucket owns a list of chunks, filled
//! in the order its positions arrive (ascending, as the policy's inverted lists). Row `i`
//! of a bucket's list is row `i % CHUNK` of its chunk `i / CHUNK`. Rows are kept in the
//! store's own element type (f32, f16 or Q8_0, keys and values each their own), copied
//! bit for bit, so reading a copy converts exactly as reading the store would.

use half::f16;
use sparrow_attn::kernel::{BlockQ8_0, KvRows, KvSource, QK8_0};
use std::ops::Range;

/// Rows per chunk: a bucket's reads are runs of up to this many rows, and a bucket wastes
/// at most `CHUNK - 1` rows in its last chunk.
pub const CHUNK: usize = 16;

/// One KV head's rows (`head_dim` values each) in a store's element type.
#[derive(Clone, Debug)]
enum HeadRows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0(Vec<BlockQ8_0>),
}

impl HeadRows {
    /// Empty rows of `rows`'s element type.
    fn like(rows: &KvRows<'_>) -> HeadRows {
        match rows {
            KvRows::F32(_) => HeadRows::F32(Vec::new()),
            KvRows::F16(_) => HeadRows::F16(Vec::new()),
            KvRows::Q8_0(_) => HeadRows::Q8_0(Vec::new()),
        }
    }

    /// Elements per row of `hd` values (Q8_0: blocks).
    fn width(&self, hd: usize) -> usize {
        match self {
            HeadRows::Q8_0(_) => hd / QK8_0,
            _ => hd,
        }
    }

    /// Room for `rows` rows (new rows zero).
    fn grow(&mut self, rows: usize, hd: usize) {
        let n = rows * self.width(hd);
        match self {
            HeadRows::F32(v) => v.resize(n, 0.0),
            HeadRows::F16(v) => v.resize(n, f16::ZERO),
            HeadRows::Q8_0(v) => v.resize(
                n,
                BlockQ8_0 {
                    d: f16::ZERO,
                    qs: [0; QK8_0],
                },
            ),
        }
    }

    /// Copy row `t` of the run `src` (rows `kv_dim` values wide), the `hd` values from
    /// `head_off`, to row `at`. `src` must be of this element type.
    fn copy_row(
        &mut self,
        at: usize,
        src: &KvRows<'_>,
        t: usize,
        head_off: usize,
        kv_dim: usize,
        hd: usize,
    ) {
        match (self, src) {
            (HeadRows::F32(d), KvRows::F32(s)) => {
                d[at * hd..][..hd].copy_from_slice(&s[t * kv_dim + head_off..][..hd])
            }
            (HeadRows::F16(d), KvRows::F16(s)) => {
                d[at * hd..][..hd].copy_from_slice(&s[t * kv_dim + head_off..][..hd])
            }
            (HeadRows::Q8_0(d), KvRows::Q8_0(s)) => {
                let (w, stride, off) = (hd / QK8_0, kv_dim / QK8_0, head_off / QK8_0);
                d[at * w..][..w].copy_from_slice(&s[t * stride + off..][..w])
            }
            _ => unreachable!("a store hands out one element type for keys and one for values"),
        }
    }

    /// Rows `start..start + n`.
    fn rows(&self, start: usize, n: usize, hd: usize) -> KvRows<'_> {
        let w = self.width(hd);
        match self {
            HeadRows::F32(v) => KvRows::F32(&v[start * w..(start + n) * w]),
            HeadRows::F16(v) => KvRows::F16(&v[start * w..(start + n) * w]),
            HeadRows::Q8_0(v) => KvRows::Q8_0(&v[start * w..(start + n) * w]),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            HeadRows::F32(v) => v.capacity() * 4,
            HeadRows::F16(v) => v.capacity() * 2,
            HeadRows::Q8_0(v) => v.capacity() * std::mem::size_of::<BlockQ8_0>(),
        }
    }
}

/// One KV head's share of one row of a run of the store: row `row` of the key run `keys`
/// and the value run `values` (rows `kv_dim` wide), the head's values from `head_offset`.
#[derive(Clone, Copy)]
pub struct SourceRow<'a> {
    pub keys: &'a KvRows<'a>,
    pub values: &'a KvRows<'a>,
    pub row: usize,
    pub head_offset: usize,
    pub kv_dim: usize,
}

/// One (layer, KV head)'s keys and values grouped by bucket: a [`KvSource`] of one head
/// (`kv_dim = head_dim`) whose row `r` holds store position [`Self::positions`]`[r]`.
#[derive(Clone, Debug)]
pub struct BucketRows {
    head_dim: usize,
    /// Typed on the first row filed.
    keys: Option<HeadRows>,
    values: Option<HeadRows>,
    /// Per bucket: its chunks, in filing order.
    chunks: Vec<Vec<u32>>,
    /// Per bucket: rows filed.
    counts: Vec<usize>,
    /// Chunks given back by [`Self::truncate`], reused first.
    free: Vec<u32>,
    /// Per arena row: the store position it copies (`usize::MAX` where none).
    positions: Vec<usize>,
}

impl BucketRows {
    /// An empty file of `clusters` buckets of rows `head_dim` wide.
    pub fn new(clusters: usize, head_dim: usize) -> BucketRows {
        BucketRows {
            head_dim,
            keys: None,
            values: None,
            chunks: vec![Vec::new(); clusters],
            counts: vec![0; clusters],
            free: Vec::new(),
            positions: Vec::new(),
        }
    }

    /// Rows filed in `bucket`.
    pub fn count(&self, bucket: usize) -> usize {
        self.counts[bucket]
    }

    /// Store position of each arena row (`usize::MAX` for rows not in use).
    pub fn positions(&self) -> &[usize] {
        &self.positions
    }

    /// Append store position `pos` to `bucket`, its rows copied from `src`.
    pub fn file(&mut self, bucket: usize, pos: usize, src: &SourceRow<'_>) {
        let SourceRow {
            keys: k,
            values: v,
            row: t,
            head_offset: head_off,
            kv_dim,
        } = *src;
        let hd = self.head_dim;
        let i = self.counts[bucket];
        if i.is_multiple_of(CHUNK) {
            let chunk = match self.free.pop() {
                Some(c) => c,
                None => {
                    let c = self.positions.len() / CHUNK;
                    let rows = (c + 1) * CHUNK;
                    self.positions.resize(rows, usize::MAX);
                    self.keys
                        .get_or_insert_with(|| HeadRows::like(k))
                        .grow(rows, hd);
                    self.values
                        .get_or_insert_with(|| HeadRows::like(v))
                        .grow(rows, hd);
                    c as u32
                }
            };
            self.chunks[bucket].push(chunk);
        }
        let at = self.chunks[bucket][i / CHUNK] as usize * CHUNK + i % CHUNK;
        let (keys, values) = (self.keys.as_mut(), self.values.as_mut());
        keys.expect("typed with the first chunk")
            .copy_row(at, k, t, head_off, kv_dim, hd);
        values
            .expect("typed with the first chunk")
            .copy_row(at, v, t, head_off, kv_dim, hd);
        self.positions[at] = pos;
        self.counts[bucket] = i + 1;
    }

    /// Appends to `out` the arena rows of entries `entries` of `bucket`'s list, as runs.
    pub fn rows_of(&self, bucket: usize, entries: Range<usize>, out: &mut Vec<Range<usize>>) {
        debug_assert!(entries.end <= self.counts[bucket], "entries not filed");
        let mut i = entries.start;
        while i < entries.end {
            let in_chunk = (CHUNK - i % CHUNK).min(entries.end - i);
            let at = self.chunks[bucket][i / CHUNK] as usize * CHUNK + i % CHUNK;
            out.push(at..at + in_chunk);
            i += in_chunk;
        }
    }

    /// Keep the first `keep` rows of `bucket` (a rewind), giving its later chunks back.
    pub fn truncate(&mut self, bucket: usize, keep: usize) {
        if keep >= self.counts[bucket] {
            return;
        }
        let chunks = &mut self.chunks[bucket];
        for c in chunks.drain(keep.div_ceil(CHUNK)..) {
            self.positions[c as usize * CHUNK..][..CHUNK].fill(usize::MAX);
            self.free.push(c);
        }
        let last = keep % CHUNK;
        if last != 0 {
            let c = chunks[keep / CHUNK] as usize;
            self.positions[c * CHUNK + last..(c + 1) * CHUNK].fill(usize::MAX);
        }
        self.counts[bucket] = keep;
    }

    /// Bytes held (rows, positions and chunk lists).
    pub fn bytes(&self) -> usize {
        let rows = self.keys.as_ref().map_or(0, HeadRows::bytes)
            + self.values.as_ref().map_or(0, HeadRows::bytes);
        rows + self.positions.capacity() * 8
            + self.chunks.iter().map(|c| c.capacity() * 4).sum::<usize>()
            + (self.counts.len() + self.free.capacity()) * 8
    }
}

impl KvSource for BucketRows {
    fn kv_dim(&self) -> usize {
        self.head_dim
    }
    fn head_offset(&self, _kv_head: usize, _head_dim: usize) -> usize {
        0
    }
    fn key_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        match &self.keys {
            Some(k) => k.rows(start, n, self.head_dim),
            None => KvRows::F32(&[]),
        }
    }
    fn value_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        match &self.values {
            Some(v) => v.rows(start, n, self.head_dim),
            None => KvRows::F32(&[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row `row` of 64-wide runs `k` and `v`, the head whose values start at `offset`.
    fn source<'a>(
        k: &'a KvRows<'a>,
        v: &'a KvRows<'a>,
        row: usize,
        offset: usize,
    ) -> SourceRow<'a> {
        SourceRow {
            keys: k,
            values: v,
            row,
            head_offset: offset,
            kv_dim: 64,
        }
    }

    /// Rows of `n` positions × 2 heads × 32 values, value = position * 100 + column.
    fn run(n: usize, first: usize) -> Vec<f32> {
        (0..n * 64)
            .map(|i| ((first + i / 64) * 100 + i % 64) as f32)
            .collect()
    }

    /// Filed rows read back as the store rows they copy, in list order, through rewinds
    /// that give chunks back and refill them.
    #[test]
    fn filed_rows_read_back_in_list_order_across_rewinds() {
        let hd = 32;
        let mut b = BucketRows::new(3, hd);
        let keys = run(100, 0);
        let values: Vec<f32> = keys.iter().map(|x| -x).collect();
        let (k, v) = (KvRows::F32(&keys), KvRows::F32(&values));
        let bucket = |p: usize| (p * 7 + p / 5) % 3;
        let check = |b: &BucketRows, upto: usize| {
            for c in 0..3 {
                let want: Vec<usize> = (0..upto).filter(|&p| bucket(p) == c).collect();
                assert_eq!(b.count(c), want.len());
                let mut ranges = Vec::new();
                b.rows_of(c, 0..want.len(), &mut ranges);
                let rows: Vec<usize> = ranges.into_iter().flatten().collect();
                let got: Vec<usize> = rows.iter().map(|&r| b.positions()[r]).collect();
                assert_eq!(got, want, "bucket {c}");
                for (&r, &p) in rows.iter().zip(&want) {
                    let mut row = vec![0f32; hd];
                    b.key_rows(r, 1).to_f32(&mut row);
                    assert_eq!(row, keys[p * 64 + hd..][..hd], "head 1's keys of {p}");
                    b.value_rows(r, 1).to_f32(&mut row);
                    assert_eq!(row, values[p * 64 + hd..][..hd]);
                }
            }
        };
        for p in 0..100 {
            b.file(bucket(p), p, &source(&k, &v, p, hd));
        }
        check(&b, 100);
        let arena = b.positions().len();
        // Rewind to 41: each bucket keeps its positions below 41.
        for c in 0..3 {
            let keep = (0..41).filter(|&p| bucket(p) == c).count();
            b.truncate(c, keep);
        }
        check(&b, 41);
        assert!(b.positions().iter().all(|&p| p == usize::MAX || p < 41));
        for p in 41..100 {
            b.file(bucket(p), p, &source(&k, &v, p, hd));
        }
        check(&b, 100);
        assert_eq!(b.positions().len(), arena, "freed chunks are reused");
    }

    /// f16 and Q8_0 rows are copied bit for bit.
    #[test]
    fn f16_and_q8_0_rows_are_copied_exactly() {
        let hd = 32;
        let src = run(4, 0);
        let h: Vec<f16> = src.iter().map(|&x| f16::from_f32(x / 64.0)).collect();
        let q: Vec<BlockQ8_0> = src.chunks_exact(QK8_0).map(BlockQ8_0::quantize).collect();
        let mut b = BucketRows::new(1, hd);
        for t in 0..4 {
            let (k, v) = (KvRows::F16(&h), KvRows::Q8_0(&q));
            b.file(0, t, &source(&k, &v, t, hd));
        }
        for t in 0..4 {
            let (mut want, mut got) = (vec![0f32; 64], vec![0f32; hd]);
            KvRows::F16(&h[t * 64..][..64]).to_f32(&mut want);
            b.key_rows(t, 1).to_f32(&mut got);
            assert_eq!(got, want[hd..]);
            KvRows::Q8_0(&q[t * 2..][..2]).to_f32(&mut want);
            b.value_rows(t, 1).to_f32(&mut got);
            assert_eq!(got, want[hd..]);
        }
    }
}
