//! Positional cells of a Saap partition: each bucket of one (layer, KV head) split by
//! position segment, with the count, the longest RoPE'd key and the mean of the others
//! filed in each (segment, bucket).
//!
//! Why: a bucket groups keys by direction from the whole context, so at 32K a bucket of
//! ~31 keys holds a few a query wants among many it does not, and no ranking of whole
//! buckets — not even one by their true mass — captured as much as Quest's position pages
//! (docs/long-context.md, "The partition's ceiling"). Splitting each bucket by position
//! gives cells that are both alike in direction and near in position; and a cell's mean
//! RoPE'd key scores exactly the mean logit of its keys against the step's query
//! (`q · mean(k) = mean(q · k)`), position effects included, which the de-roped centroids
//! cannot. The statistics are the live context's, not the index's.
//!
//! A mean hides the one key a needle query wants among others it does not (the mass of a
//! cell is `Σ exp(q · k)`, which a single high logit dominates and `n · exp(mean)`
//! understates most), so each cell keeps its longest key (the largest `|k|`, the one that
//! can give the largest logit) apart and is scored as that key's exact term plus the rest
//! by their mean: never below the mean's estimate, and still below the true mass
//! (docs/long-context.md, "A cell's longest key").
//!
//! A decode step scores every cell of every sparse layer and KV head (4,096 cells per head
//! at 32K with the default segment): each cell's rest mean and longest key are kept as
//! 8-bit quants with one scale each (68 bytes at head size 64 instead of 256), which the
//! step scores with [`scaled_row_dots`]'s SIMD kernel. Exact f32 sums are kept only for
//! the segment keys still fold into; a rewind refolds that segment from the store.

use sparrow_attn::kernel::Level;
use sparrow_attn::policy::{log_masses, quantize_row, rank_keys, scaled_row_dots};

/// Per (segment, bucket): how many keys, the longest one and the others' mean (8-bit); the
/// open segment's exact sums.
#[derive(Clone, Debug)]
pub struct CellStats {
    segment: usize,
    clusters: usize,
    dim: usize,
    /// The segment keys fold into (the last one): its cells' key sums (f32, `clusters ×
    /// dim`) and longest keys' squared lengths (`clusters`). A closed segment needs neither
    /// (positions fold in order, and a rewind refolds its segment from the store), so only
    /// its quantized rows stay: 2 · `dim` + 16 bytes per cell.
    open: usize,
    sums: Vec<f32>,
    longest_norms: Vec<f32>,
    /// `segments × clusters`.
    counts: Vec<u32>,
    /// Per cell, the keys of its bucket in the segments before its own (`segments ×
    /// clusters`): with the bucket's left-out positions, where the cell's keys start in
    /// the bucket's entries, ascending by position — found without a search of the
    /// bucket's list.
    before: Vec<u32>,
    /// Per bucket, the positions left out (the sinks) filed in it: they precede every
    /// cell's keys in the bucket's entries.
    left_out: Vec<u32>,
    /// Per cell `ln (count − 1)`, the keys beside the longest (−∞ for none; a step scores
    /// thousands of cells: the logarithm is taken when a key is folded in, not per step).
    ln_rests: Vec<f32>,
    /// Per cell the mean of its keys but the longest, quantized (`dim` each,
    /// [`quantize_row`]), and that row's scale.
    means: Vec<i8>,
    mean_scales: Vec<f32>,
    /// Per cell its longest key quantized, and that row's scale.
    longest: Vec<i8>,
    longest_scales: Vec<f32>,
    /// Per cell the position of its longest key (where a halo of neighbours centres).
    longest_at: Vec<u32>,
    /// Scratch: a mean being quantized.
    mean_buf: Vec<f32>,
    /// Positions below this are folded in.
    upto: usize,
}

impl CellStats {
    /// Empty statistics of `clusters` buckets of `dim`-value keys, cut every `segment`
    /// positions (`segment ≥ 1`).
    pub fn new(segment: usize, clusters: usize, dim: usize) -> CellStats {
        CellStats {
            segment: segment.max(1),
            clusters,
            dim,
            open: 0,
            sums: vec![0.0; clusters * dim],
            longest_norms: vec![f32::NEG_INFINITY; clusters],
            counts: Vec::new(),
            before: Vec::new(),
            left_out: vec![0; clusters],
            ln_rests: Vec::new(),
            means: Vec::new(),
            mean_scales: Vec::new(),
            longest: Vec::new(),
            longest_scales: Vec::new(),
            longest_at: Vec::new(),
            mean_buf: Vec::new(),
            upto: 0,
        }
    }

    /// Buckets.
    pub fn clusters(&self) -> usize {
        self.clusters
    }

    /// Positions per segment.
    pub fn segment(&self) -> usize {
        self.segment
    }

    /// Positions below this are folded in.
    pub fn upto(&self) -> usize {
        self.upto
    }

    /// The first position of the segment keys fold into next.
    pub fn open_start(&self) -> usize {
        self.upto / self.segment * self.segment
    }

    /// Segments holding room (some may be empty).
    pub fn segments(&self) -> usize {
        self.counts.len() / self.clusters.max(1)
    }

    /// Folds in the key of position `pos` (the next one: `pos == upto`), filed in
    /// `bucket`; `key` is `dim` RoPE'd values, or `None` for a position left out (the
    /// sink), which only advances.
    pub fn add(&mut self, pos: usize, bucket: u32, key: Option<&[f32]>) {
        debug_assert_eq!(pos, self.upto, "positions fold in order");
        self.upto = pos + 1;
        let Some(key) = key else {
            self.left_out[bucket as usize] += 1;
            return;
        };
        let s = pos / self.segment;
        if s >= self.segments() {
            let (c, had) = (self.clusters, self.segments());
            let cells = (s + 1) * c;
            self.counts.resize(cells, 0);
            // The segments before `s` are complete (positions fold in order).
            self.before.resize(cells, 0);
            for g in had.max(1)..=s {
                for b in 0..c {
                    self.before[g * c + b] =
                        self.before[(g - 1) * c + b] + self.counts[(g - 1) * c + b];
                }
            }
            self.ln_rests.resize(cells, f32::NEG_INFINITY);
            self.means.resize(cells * self.dim, 0);
            self.mean_scales.resize(cells, 0.0);
            self.longest.resize(cells * self.dim, 0);
            self.longest_scales.resize(cells, 0.0);
            self.longest_at.resize(cells, 0);
        }
        if s != self.open {
            self.open_segment(s);
        }
        let (b, cell) = (bucket as usize, s * self.clusters + bucket as usize);
        let d = self.dim;
        self.counts[cell] += 1;
        let n = self.counts[cell];
        let sum = &mut self.sums[b * d..][..d];
        sum.iter_mut().zip(key).for_each(|(s, &k)| *s += k);
        // The first of the longest keys stays apart (a NaN key never replaces one).
        let norm: f32 = key.iter().map(|&k| k * k).sum();
        if norm > self.longest_norms[b] || n == 1 {
            self.longest_norms[b] = norm;
            let row = &mut self.longest[cell * d..][..d];
            self.longest_scales[cell] = quantize_row(key, row);
            self.longest_at[cell] = pos as u32;
        }
        if n == 1 {
            return;
        }
        // The rest: the sum less the longest key (as its quants hold it).
        self.ln_rests[cell] = ((n - 1) as f32).ln();
        let (row, scale) = (&self.longest[cell * d..][..d], self.longest_scales[cell]);
        let rest = (n - 1) as f32;
        let mean = &mut self.mean_buf;
        mean.clear();
        mean.extend(
            self.sums[b * d..][..d]
                .iter()
                .zip(row)
                .map(|(&s, &l)| (s - scale * l as f32) / rest),
        );
        self.mean_scales[cell] = quantize_row(mean, &mut self.means[cell * d..][..d]);
    }

    /// Forgets every position from `from` on. Sums cannot be unwound exactly, so the
    /// segments from `from`'s on are cleared and `upto` drops to the start of `from`'s
    /// segment: the caller folds that segment's remaining positions in again.
    pub fn forget_from(&mut self, from: usize) {
        if from >= self.upto {
            return;
        }
        let s = from / self.segment;
        let cells = s * self.clusters;
        self.counts.truncate(cells);
        self.before.truncate(cells);
        if s == 0 {
            self.left_out.fill(0);
        }
        self.ln_rests.truncate(cells);
        self.means.truncate(cells * self.dim);
        self.mean_scales.truncate(cells);
        self.longest.truncate(cells * self.dim);
        self.longest_scales.truncate(cells);
        self.longest_at.truncate(cells);
        self.open_segment(s);
        self.upto = s * self.segment;
    }

    /// Starts folding segment `s` from nothing: its sums and lengths cleared.
    fn open_segment(&mut self, s: usize) {
        self.open = s;
        self.sums.fill(0.0);
        self.longest_norms.fill(f32::NEG_INFINITY);
    }

    /// The (segment, bucket) of cell `index` (as [`CellStats::score`] numbers them).
    pub fn cell(&self, index: u32) -> (usize, usize) {
        let i = index as usize;
        (i / self.clusters, i % self.clusters)
    }

    /// Where cell `index`'s keys are in its bucket's entries (the bucket's positions,
    /// ascending, left-out ones included): `start..start + count`.
    pub fn entries(&self, index: u32) -> std::ops::Range<usize> {
        let (i, b) = (index as usize, self.cell(index).1);
        let start = (self.left_out[b] + self.before[i]) as usize;
        start..start + self.counts[i] as usize
    }

    /// The position of cell `index`'s longest key (the first of them).
    pub fn longest_at(&self, index: u32) -> usize {
        self.longest_at[index as usize] as usize
    }

    /// The positions cell `index` covers.
    pub fn span(&self, index: u32) -> std::ops::Range<usize> {
        let s = self.cell(index).0;
        s * self.segment..(s + 1) * self.segment
    }

    /// Scores every cell of the segments starting below `end` for the summed query `q`
    /// (`dim` values, the GQA group's RoPE'd query rows added up) and leaves in `ranks` one
    /// [`rank_key`](sparrow_attn::policy::rank_key) per cell, by cell index — an empty
    /// cell's sorting after every other — and returns how many are not empty. A cell's score
    /// is its estimated log-mass `ln(exp(scale · q · longest) + (count − 1) · exp(scale · q
    /// · rest mean))`, the longest key's term plus the others' count times the exponent of
    /// their mean logit (`scale`: 1 / (group · √head_dim) makes these the group's mean
    /// logits), rows read from their quants against the query quantized to 8 bits as they
    /// are (`scaled_row_dots`: exact integer sums). `dots` is scratch, which on return holds
    /// in its first half every cell's estimated log-mass and in its second half its `q ·
    /// longest` (unscaled), by cell index: what tells a cell chosen for one sharp key from
    /// one chosen for its many.
    pub fn score(
        &self,
        q: &[f32],
        scale: f32,
        end: usize,
        dots: &mut Vec<f32>,
        ranks: &mut Vec<u64>,
    ) -> usize {
        let cells = self.segments().min(end.div_ceil(self.segment)) * self.clusters;
        // Both halves are written whole below: only a longer scratch needs new room.
        dots.resize(2 * cells, 0.0);
        // The query in 8 bits as the rows are, so their products are exact integer sums.
        let mut q8 = vec![0i8; self.dim];
        let q_scale = quantize_row(&q[..self.dim], &mut q8);
        let (rests, longest) = dots.split_at_mut(cells);
        let level = Level::active();
        scaled_row_dots(level, &self.means, &self.mean_scales, &q8, q_scale, rests);
        scaled_row_dots(
            level,
            &self.longest,
            &self.longest_scales,
            &q8,
            q_scale,
            longest,
        );
        log_masses(level, longest, rests, &self.ln_rests[..cells], scale);
        rank_keys(level, rests, &self.counts[..cells], ranks)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        (self.sums.len() + self.longest_norms.len()) * 4
            + (self.counts.len() + self.before.len()) * 4
            + self.ln_rests.len() * 4
            + self.left_out.len() * 4
            + (self.means.len() + self.longest.len())
            + (self.mean_scales.len() + self.longest_scales.len()) * 4
            + self.longest_at.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparrow_attn::policy::rank_key;

    /// Keys of `n` positions, `d` values each, and a bucket per position, pseudo-random.
    fn case(n: usize, d: usize, c: usize) -> (Vec<f32>, Vec<u32>) {
        let mut x = 0x9e37_79b9u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let keys = (0..n * d)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let buckets = (0..n).map(|_| next() % c as u32).collect();
        (keys, buckets)
    }

    /// Every cell's score against an f64 reference written from the definition: the keys of
    /// the cell's positions (sink left out), the first of the longest scored alone, the
    /// others by their count and mean logit; the score may differ by what quantizing the
    /// rows can move it (half a row's scale per value, times `|q|`, for the longest key and
    /// for the rest mean, which the longest key's quants enter) and quantizing the query
    /// (half its scale per value, times each row's absolute sum).
    fn assert_scores_match(st: &CellStats, keys: &[f32], buckets: &[u32], n: usize, end: usize) {
        let (d, seg, c) = (st.dim, st.segment, st.clusters);
        let q: Vec<f32> = (0..d).map(|i| (i as f32 * 0.37).sin()).collect();
        let scale = 0.25;
        let (mut ranks, mut dots) = (Vec::new(), Vec::new());
        let live = st.score(&q, scale, end, &mut dots, &mut ranks);
        // The non-empty cells, by index, with their log-masses; the empty ones' keys last.
        let got: Vec<(u32, f32)> = (0..ranks.len())
            .filter(|&c| ranks[c] != u64::MAX)
            .map(|c| (c as u32, dots[c]))
            .collect();
        assert_eq!(got.len(), live, "non-empty cells counted");
        for (c, &k) in ranks.iter().enumerate() {
            if k != u64::MAX {
                assert_eq!(k, rank_key(dots[c], c as u32), "cell {c}'s key");
            }
        }
        let logit = |p: usize| -> f64 {
            let k = &keys[p * d..][..d];
            let dot: f64 = k.iter().zip(&q).map(|(&a, &b)| a as f64 * b as f64).sum();
            scale as f64 * dot
        };
        let norm = |p: usize| -> f64 {
            keys[p * d..][..d]
                .iter()
                .map(|&a| a as f64 * a as f64)
                .sum()
        };
        let mut want = Vec::new();
        for s in 0..end.div_ceil(seg) {
            for b in 0..c {
                let mut ps: Vec<usize> = (s * seg..((s + 1) * seg).min(n))
                    .filter(|&p| p >= 1 && buckets[p] as usize == b)
                    .collect();
                let Some(longest) =
                    ps.iter()
                        .copied()
                        .reduce(|best, p| if norm(p) > norm(best) { p } else { best })
                else {
                    continue;
                };
                ps.retain(|&p| p != longest);
                let mut mass = logit(longest).exp();
                if !ps.is_empty() {
                    let mean = ps.iter().map(|&p| logit(p)).sum::<f64>() / ps.len() as f64;
                    mass += ps.len() as f64 * mean.exp();
                }
                want.push(((s * c + b) as u32, mass.ln()));
            }
        }
        assert_eq!(got.len(), want.len(), "non-empty cells");
        let q_abs: f64 = q.iter().map(|x| x.abs() as f64).sum();
        for ((gc, gs), (wc, ws)) in got.iter().zip(&want) {
            assert_eq!(gc, wc);
            let i = *gc as usize;
            let half_steps = (st.mean_scales[i] + st.longest_scales[i]) as f64 / 2.0;
            // The query's own quantization: half its step times each row's absolute sum.
            let abs_sum = |rows: &[i8], scale: f32| -> f64 {
                rows[i * d..][..d]
                    .iter()
                    .map(|&x| (x as f64).abs())
                    .sum::<f64>()
                    * scale as f64
            };
            let rows_abs =
                abs_sum(&st.means, st.mean_scales[i]) + abs_sum(&st.longest, st.longest_scales[i]);
            let q_half_step = q.iter().fold(0f32, |m, x| m.max(x.abs())) as f64 / 127.0 / 2.0;
            // And the fast log-add-exp's 1e-5.
            let tolerance =
                2e-5 + scale as f64 * (half_steps * q_abs + q_half_step * rows_abs) * (1.0 + 1e-4);
            assert!(
                (*gs as f64 - ws).abs() < tolerance,
                "cell {gc}: {gs} vs {ws} (tolerance {tolerance})"
            );
        }
    }

    fn fold(st: &mut CellStats, keys: &[f32], buckets: &[u32], to: usize) {
        let d = st.dim;
        for p in st.upto()..to {
            let key = (p >= 1).then(|| &keys[p * d..][..d]);
            st.add(p, buckets[p], key);
        }
    }

    #[test]
    fn scores_equal_a_reference_over_each_cells_keys() {
        for d in [12, 64] {
            let (n, c) = (300, 5);
            let (keys, buckets) = case(n, d, c);
            let mut st = CellStats::new(64, c, d);
            fold(&mut st, &keys, &buckets, n);
            assert_eq!(st.segments(), n.div_ceil(64));
            assert_scores_match(&st, &keys, &buckets, n, n);
            // Only the segments starting below `end`.
            assert_scores_match(&st, &keys, &buckets, n, 100);
        }
    }

    #[test]
    fn a_rewind_refolds_to_what_a_fresh_fold_gives() {
        let (n, d, c) = (300, 32, 4);
        let (keys, buckets) = case(n, d, c);
        let (other, _) = case(n + 7, d, c);
        let mut st = CellStats::new(50, c, d);
        // Fold other keys past 130, rewind to 130, fold the right ones: as if never wrong.
        fold(&mut st, &keys, &buckets, 130);
        let mut wrong = keys[..130 * d].to_vec();
        wrong.extend_from_slice(&other[130 * d..n * d]);
        fold(&mut st, &wrong, &buckets, n);
        st.forget_from(130);
        assert_eq!(st.upto(), 100, "back to the start of the segment");
        fold(&mut st, &keys, &buckets, n);
        let mut fresh = CellStats::new(50, c, d);
        fold(&mut fresh, &keys, &buckets, n);
        assert_eq!(st.sums, fresh.sums);
        assert_eq!(st.counts, fresh.counts);
        assert_eq!(st.means, fresh.means);
        assert_eq!(st.mean_scales, fresh.mean_scales);
        assert_eq!(st.longest, fresh.longest);
        assert_eq!(st.longest_scales, fresh.longest_scales);
        assert_scores_match(&st, &keys, &buckets, n, n);
    }

    /// Each cell's entries are where its keys sit in its bucket's list (the bucket's
    /// positions, ascending, the sink included), whole and partly folded segments, after a
    /// rewind into segment 0 and into a later one, and with one position a segment.
    #[test]
    fn entries_locate_each_cells_keys_in_its_buckets_list() {
        let (d, c) = (8, 5);
        for (segment, n) in [(50, 300), (7, 64), (1, 20)] {
            let (keys, buckets) = case(n, d, c);
            let mut st = CellStats::new(segment, c, d);
            let check = |st: &CellStats, upto: usize| {
                for cell in 0..(st.segments() * c) as u32 {
                    let (s, b) = st.cell(cell);
                    let list: Vec<usize> = (0..upto).filter(|&p| buckets[p] == b as u32).collect();
                    let want: Vec<usize> = list
                        .iter()
                        .copied()
                        .filter(|&p| p >= 1 && p / segment == s)
                        .collect();
                    let got = &list[st.entries(cell)];
                    assert_eq!(
                        got,
                        &want[..],
                        "segment {segment}, cell ({s}, {b}), upto {upto}"
                    );
                }
            };
            for (to, rewind) in [(n / 2 + 3, None), (n, Some(n / 3)), (n, Some(0)), (n, None)] {
                fold(&mut st, &keys, &buckets, to);
                check(&st, to);
                if let Some(at) = rewind {
                    st.forget_from(at);
                    check(&st, st.upto());
                }
            }
        }
    }
}
