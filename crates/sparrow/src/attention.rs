//! The attention seam. The model hands each layer's queries and the KV cache to an
//! [`AttentionBackend`]; today that is exact dense attention, and the sparse policies plug in
//! here without the model changing.

use crate::attention_simd::{convert_tile, dequant_q8_0_tile, pv, scores, softmax_tile, Level};
#[allow(unused_imports)] // named in doc links
use crate::kv_blocks::DEFAULT_BLOCK;
use crate::kv_cache::{KvCache, KvRows, KvType, QK8_0};
pub use crate::policy::{AttentionChoice, POLICY_NAMES};
use rayon::prelude::*;
use sparrow_attn::policy::KeysView;
use std::ops::Range;

/// Shapes the backend needs to interpret queries and cache rows.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

/// Computes causal attention for a batch of query rows against the cache.
pub trait AttentionBackend: Send + Sync {
    /// Short name for logs and benchmarks.
    fn name(&self) -> &str;

    /// `q` holds `n` rows of `n_head * head_dim` (already rotated); row `i` is at position
    /// `pos0 + i` and may attend to cache positions `0..=pos0 + i` of `layer`, which the
    /// caller has already written. Writes `n` rows of `n_head * head_dim` to `out`.
    fn attend(
        &self,
        shape: AttnShape,
        cache: &KvCache,
        layer: usize,
        q: &[f32],
        pos0: usize,
        out: &mut [f32],
    );

    /// The cache positions from `pos` on are about to be rewritten (a rewind, a restored or
    /// reused prefix): forget any per-position state kept for them.
    fn forget_from(&self, _pos: usize) {}

    /// Fraction of the `n_ctx` cached positions one decode query reads (1.0 for exact
    /// attention): the selectivity a policy reports.
    fn fraction_read(&self, _n_ctx: usize) -> f64 {
        1.0
    }

    /// Whether the policy may be used for prompt processing (batches of several tokens).
    fn supports_prefill(&self) -> bool {
        true
    }

    /// Whether the policy may be used for generation (one token at a time).
    fn supports_decode(&self) -> bool {
        true
    }

    /// True when the policy itself chooses which KV blocks a query reads (Quest), so a
    /// tiered store would only need to load those blocks.
    fn requires_block_selection(&self) -> bool {
        false
    }

    /// Positions per KV block the policy works in, if it summarises blocks: the store is
    /// paged (and blocks sealed) at this size, else at [`DEFAULT_BLOCK`].
    fn block_size(&self) -> Option<usize> {
        None
    }

    /// Block `block` of `layer` (positions `block * block_size ..`) has just been completely
    /// written and is sealed: `keys` holds its keys in f32. Blocks are sealed in order; a
    /// block may be sealed again after a rewind ([`Self::forget_from`]).
    fn on_block_sealed(&self, _layer: usize, _block: usize, _keys: KeysView<'_>) {}

    /// The cache positions each KV head's query group reads when the single query row `q`
    /// at position `pos` of `layer` attends (one list of ascending ranges per KV head), for
    /// evaluation (selectivity, attention mass captured). Default: everything up to `pos`.
    fn read_set(
        &self,
        shape: AttnShape,
        _cache: &KvCache,
        _layer: usize,
        _q: &[f32],
        pos: usize,
    ) -> Vec<Vec<Range<usize>>> {
        vec![std::iter::once(0..pos + 1).collect(); shape.n_head_kv]
    }
}

/// Exact causal attention, flash-style: a block of query rows (every head of a GQA group for
/// a few consecutive tokens) walks the keys in tiles, each K/V row read once per block
/// straight from the cache (f16 rows converted with F16C), scores and values accumulated
/// with a one-pass online softmax. Long key ranges are split across threads and the pieces
/// merged exactly by their log-sum-exp. Kernels: [`crate::attention_simd`].
pub struct DenseAttention;

/// Keys per tile.
const TILE: usize = 64;
/// Query rows (tokens × group heads) a block aims for.
pub(crate) const BLOCK_ROWS: usize = 56;
/// Fewest keys a split piece of a long range gets.
pub(crate) const MIN_PIECE: usize = 256;

/// The online-softmax state of one block of query rows over some keys: running maximum `m`
/// and denominator `l` per row, unnormalised outputs `o` (`rows × head_dim`).
pub(crate) struct Partial {
    pub(crate) m: Vec<f32>,
    pub(crate) l: Vec<f32>,
    pub(crate) o: Vec<f32>,
}

/// One task: the query rows of tokens `tokens` (indices into the batch) for `kv_head`, over
/// the key positions in `keys`.
pub(crate) struct Unit {
    pub(crate) tokens: Range<usize>,
    pub(crate) kv_head: usize,
    pub(crate) keys: Vec<Range<usize>>,
}

/// Attention of the query rows of `unit` over its keys. Row `r` is head `r % group` of the
/// group of token `unit.tokens.start + r / group`; each token only sees the keys of its own
/// entry in `visible` (indexed by batch position), the others are masked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_unit(
    level: Level,
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    q: &[f32],
    unit: &Unit,
    visible: &[Vec<Range<usize>>],
) -> Partial {
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let q_dim = shape.n_head * hd;
    let kv_dim = cache.kv_dim();
    let head_off = unit.kv_head * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let rows = unit.tokens.len() * group;
    let rw = rows.div_ceil(8) * 8;

    // Queries transposed (`qt[d * rw + r]`); padding rows stay zero and are never output.
    let mut qt = vec![0.0f32; hd * rw];
    for r in 0..rows {
        let token = unit.tokens.start + r / group;
        let head = unit.kv_head * group + r % group;
        let qr = &q[token * q_dim + head * hd..][..hd];
        for (d, &x) in qr.iter().enumerate() {
            qt[d * rw + r] = x;
        }
    }
    let mut part = Partial {
        m: vec![f32::NEG_INFINITY; rw],
        l: vec![0.0; rw],
        o: vec![0.0; rows * hd],
    };
    let mut corr = vec![0.0f32; rw];
    let mut s = vec![0.0f32; TILE * rw];
    // Tiles to convert f16 or dequantize Q8_0 rows into; f32 rows are read in place.
    let types = cache.types();
    let tile_for = |t: KvType| {
        if t == KvType::F32 {
            Vec::new()
        } else {
            vec![0.0f32; TILE * hd]
        }
    };
    let mut ktile = tile_for(types.k);
    let mut vtile = tile_for(types.v);

    for range in &unit.keys {
        for start in range.clone().step_by(TILE) {
            let n = TILE.min(range.end - start);
            let s = &mut s[..n * rw];
            let (k, k_stride) = rows_of(
                level,
                cache.key_rows(layer, start, n),
                head_off,
                kv_dim,
                hd,
                n,
                &mut ktile,
            );
            scores(level, k, k_stride, n, hd, &qt, rw, scale, s);
            mask(&unit.tokens, visible, start, n, group, rw, s);
            softmax_tile(level, s, n, rw, &mut part.m, &mut part.l, &mut corr);
            for (r, &c) in corr[..rows].iter().enumerate() {
                if c != 1.0 {
                    part.o[r * hd..(r + 1) * hd]
                        .iter_mut()
                        .for_each(|a| *a *= c);
                }
            }
            let (v, v_stride) = rows_of(
                level,
                cache.value_rows(layer, start, n),
                head_off,
                kv_dim,
                hd,
                n,
                &mut vtile,
            );
            pv(level, s, rw, rows, v, v_stride, n, hd, &mut part.o);
        }
    }
    part
}

/// Attention of one token's query heads sharing `kv_head` over the cache positions in
/// `ranges` (ascending, disjoint), writing `group × head_dim` outputs; `q_row` is the
/// token's whole query row. Runs on the calling thread.
pub(crate) fn attend_group(
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    q_row: &[f32],
    kv_head: usize,
    ranges: &[Range<usize>],
    out_group: &mut [f32],
) {
    let hd = shape.head_dim;
    let unit = Unit {
        tokens: 0..1,
        kv_head,
        keys: ranges.to_vec(),
    };
    let visible = [ranges.to_vec()];
    let part = attend_unit(Level::active(), shape, cache, layer, q_row, &unit, &visible);
    for (r, dst) in out_group.chunks_exact_mut(hd).enumerate() {
        if part.m[r] == f32::NEG_INFINITY {
            dst.fill(0.0);
            continue;
        }
        let inv = 1.0 / part.l[r];
        dst.iter_mut()
            .zip(&part.o[r * hd..(r + 1) * hd])
            .for_each(|(d, &a)| *d = a * inv);
    }
}

/// One kv head's `n` rows of a tile as f32 with their stride: borrowed from an f32 cache,
/// converted into `buf` from an f16 one, dequantized into `buf` from a Q8_0 one (whose head
/// size and offset must then be whole 32-value blocks, as [`KvCache::try_new`] checks).
pub(crate) fn rows_of<'a>(
    level: Level,
    rows: KvRows<'a>,
    head_off: usize,
    kv_dim: usize,
    hd: usize,
    n: usize,
    buf: &'a mut [f32],
) -> (&'a [f32], usize) {
    match rows {
        KvRows::F32(x) => (&x[head_off..], kv_dim),
        KvRows::F16(x) => {
            convert_tile(level, &x[head_off..], kv_dim, n, hd, buf);
            (&buf[..n * hd], hd)
        }
        KvRows::Q8_0(x) => {
            assert!(
                hd.is_multiple_of(QK8_0) && head_off.is_multiple_of(QK8_0),
                "a Q8_0 KV cache needs head sizes that are multiples of {QK8_0}, got {hd}"
            );
            let (b_off, b_stride, b_width) = (head_off / QK8_0, kv_dim / QK8_0, hd / QK8_0);
            dequant_q8_0_tile(level, &x[b_off..], b_stride, n, b_width, buf);
            (&buf[..n * hd], hd)
        }
    }
}

/// Set to `-inf` the scores of keys `start..start + n` that a token of the block does not
/// see (causal diagonal, or a policy's gaps).
fn mask(
    tokens: &Range<usize>,
    visible: &[Vec<Range<usize>>],
    start: usize,
    n: usize,
    group: usize,
    rw: usize,
    s: &mut [f32],
) {
    let end = start + n;
    for (j, token) in tokens.clone().enumerate() {
        let vis = &visible[token];
        let seen: usize = vis
            .iter()
            .map(|r| r.end.min(end).saturating_sub(r.start.max(start)))
            .sum();
        if seen == n {
            continue;
        }
        for t in 0..n {
            if !vis.iter().any(|r| r.contains(&(start + t))) {
                s[t * rw + j * group..][..group].fill(f32::NEG_INFINITY);
            }
        }
    }
}

/// Sorted union of ranges.
pub(crate) fn union(mut ranges: Vec<Range<usize>>) -> Vec<Range<usize>> {
    ranges.retain(|r| !r.is_empty());
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Cut `keys` (sorted, disjoint) into `pieces` runs of about equal key counts, on tile
/// boundaries.
pub(crate) fn split_keys(keys: &[Range<usize>], pieces: usize) -> Vec<Vec<Range<usize>>> {
    let total: usize = keys.iter().map(|r| r.len()).sum();
    if pieces <= 1 || total == 0 {
        return vec![keys.to_vec()];
    }
    let per = total.div_ceil(pieces).div_ceil(TILE) * TILE;
    let mut out = vec![Vec::new()];
    let mut room = per;
    for r in keys {
        let mut start = r.start;
        while start < r.end {
            if room == 0 {
                out.push(Vec::new());
                room = per;
            }
            let take = room.min(r.end - start);
            out.last_mut().unwrap().push(start..start + take);
            start += take;
            room -= take;
        }
    }
    out
}

/// Run dense attention for every token of a batch, with the key ranges `ranges_for(position)`
/// gives for each token's position.
pub(crate) fn attend_batch(
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
    ranges_for: impl Fn(usize) -> Vec<Range<usize>> + Sync,
) {
    attend_batch_with(
        Level::active(),
        rayon::current_num_threads(),
        shape,
        cache,
        layer,
        q,
        pos0,
        out,
        ranges_for,
    );
}

/// [`attend_batch`] at a given kernel level, splitting key ranges for `threads` workers.
#[allow(clippy::too_many_arguments)]
fn attend_batch_with(
    level: Level,
    threads: usize,
    shape: AttnShape,
    cache: &KvCache,
    layer: usize,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
    ranges_for: impl Fn(usize) -> Vec<Range<usize>> + Sync,
) {
    let hd = shape.head_dim;
    let q_dim = shape.n_head * hd;
    let group = shape.n_head / shape.n_head_kv;
    let n = q.len() / q_dim;
    if n == 0 {
        return;
    }
    let visible: Vec<Vec<Range<usize>>> = (0..n).map(|i| ranges_for(pos0 + i)).collect();
    let block = (BLOCK_ROWS / group).max(1);
    let n_blocks = n.div_ceil(block);

    // Units ordered by (block, kv head, piece); a (block, kv head) with few siblings gets its
    // keys split so that every thread has several tasks.
    let base = n_blocks * shape.n_head_kv;
    let target = 4 * threads.max(1);
    let mut units = Vec::new();
    for b in 0..n_blocks {
        let tokens = b * block..((b + 1) * block).min(n);
        let keys = union(visible[tokens.clone()].concat());
        let total: usize = keys.iter().map(|r| r.len()).sum();
        let pieces = if base >= target {
            1
        } else {
            target.div_ceil(base).min(total / MIN_PIECE).max(1)
        };
        let split = split_keys(&keys, pieces);
        for kv_head in 0..shape.n_head_kv {
            for piece in &split {
                units.push(Unit {
                    tokens: tokens.clone(),
                    kv_head,
                    keys: piece.clone(),
                });
            }
        }
    }
    let parts: Vec<Partial> = units
        .par_iter()
        .map(|u| attend_unit(level, shape, cache, layer, q, u, &visible))
        .collect();

    let owners: Vec<(Range<usize>, usize)> = units
        .iter()
        .map(|u| (u.tokens.clone(), u.kv_head))
        .collect();
    write_merged(shape, &owners, &parts, out);
}

/// Write the results of a batch's tasks to `out`: consecutive parts that share an owner
/// (token range, kv head) are merged by log-sum-exp and normalised; row `r` of an owner is
/// head `r % group` of its kv head's group for token `tokens.start + r / group`. A row no
/// part saw a key for is written as zeros.
pub(crate) fn write_merged(
    shape: AttnShape,
    owners: &[(Range<usize>, usize)],
    parts: &[Partial],
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let q_dim = shape.n_head * hd;
    let group = shape.n_head / shape.n_head_kv;
    let mut i = 0;
    while i < owners.len() {
        let j = i + owners[i..].iter().take_while(|o| **o == owners[i]).count();
        let (tokens, kv_head) = &owners[i];
        let pieces = &parts[i..j];
        for r in 0..tokens.len() * group {
            let token = tokens.start + r / group;
            let head = kv_head * group + r % group;
            let dst = &mut out[token * q_dim + head * hd..][..hd];
            let mx = pieces
                .iter()
                .map(|p| p.m[r])
                .fold(f32::NEG_INFINITY, f32::max);
            if mx == f32::NEG_INFINITY {
                dst.fill(0.0);
                continue;
            }
            if let [p] = pieces {
                let inv = 1.0 / p.l[r];
                dst.iter_mut()
                    .zip(&p.o[r * hd..(r + 1) * hd])
                    .for_each(|(d, &a)| *d = a * inv);
                continue;
            }
            dst.fill(0.0);
            let mut l = 0.0f32;
            for p in pieces {
                let w = (p.m[r] - mx).exp();
                if w == 0.0 {
                    continue;
                }
                l += w * p.l[r];
                dst.iter_mut()
                    .zip(&p.o[r * hd..(r + 1) * hd])
                    .for_each(|(d, &a)| *d += w * a);
            }
            let inv = 1.0 / l;
            dst.iter_mut().for_each(|d| *d *= inv);
        }
        i = j;
    }
}

impl AttentionBackend for DenseAttention {
    fn name(&self) -> &str {
        "full"
    }

    fn attend(
        &self,
        shape: AttnShape,
        cache: &KvCache,
        layer: usize,
        q: &[f32],
        pos0: usize,
        out: &mut [f32],
    ) {
        attend_batch(shape, cache, layer, q, pos0, out, |pos| {
            std::iter::once(0..pos + 1).collect()
        });
    }
}

/// StreamingLLM's pattern: every query attends to the first `sinks` positions (attention
/// sinks) and the `window` most recent ones, whatever the context length. Positions keep
/// their original RoPE angles; nothing is evicted, the middle is simply not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamingAttention {
    pub sinks: usize,
    pub window: usize,
}

impl StreamingAttention {
    /// The key ranges a query at `pos` reads: sinks, then the recent window (merged when
    /// they touch).
    #[allow(clippy::single_range_in_vec_init)] // a list of ranges that may hold one
    pub fn ranges(&self, pos: usize) -> Vec<Range<usize>> {
        let n = pos + 1;
        let recent = n.saturating_sub(self.window.max(1));
        let sinks = self.sinks.min(n);
        if recent <= sinks {
            vec![0..n]
        } else if sinks == 0 {
            vec![recent..n]
        } else {
            vec![0..sinks, recent..n]
        }
    }
}

impl AttentionBackend for StreamingAttention {
    fn name(&self) -> &str {
        "streaming"
    }

    fn attend(
        &self,
        shape: AttnShape,
        cache: &KvCache,
        layer: usize,
        q: &[f32],
        pos0: usize,
        out: &mut [f32],
    ) {
        attend_batch(shape, cache, layer, q, pos0, out, |pos| self.ranges(pos));
    }

    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        let read: usize = self.ranges(n_ctx - 1).iter().map(|r| r.len()).sum();
        read as f64 / n_ctx as f64
    }

    fn read_set(
        &self,
        shape: AttnShape,
        _cache: &KvCache,
        _layer: usize,
        _q: &[f32],
        pos: usize,
    ) -> Vec<Vec<Range<usize>>> {
        vec![self.ranges(pos); shape.n_head_kv]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive f64 causal attention as the reference.
    fn reference(
        shape: AttnShape,
        keys: &[Vec<f32>],
        vals: &[Vec<f32>],
        q: &[f32],
        pos: usize,
    ) -> Vec<f32> {
        reference_over(shape, keys, vals, q, &(0..=pos).collect::<Vec<_>>())
    }

    /// Naive f64 attention over the listed key positions.
    fn reference_over(
        shape: AttnShape,
        keys: &[Vec<f32>],
        vals: &[Vec<f32>],
        q: &[f32],
        visible: &[usize],
    ) -> Vec<f32> {
        let hd = shape.head_dim;
        let group = shape.n_head / shape.n_head_kv;
        let mut out = vec![0.0f32; shape.n_head * hd];
        for h in 0..shape.n_head {
            let g = h / group;
            let qh = &q[h * hd..(h + 1) * hd];
            let s: Vec<f64> = visible
                .iter()
                .map(|&t| {
                    let k = &keys[t][g * hd..(g + 1) * hd];
                    qh.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for d in 0..hd {
                let v: f64 = visible
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| w[i] * vals[t][g * hd + d] as f64)
                    .sum();
                out[h * hd + d] = (v / z) as f32;
            }
        }
        out
    }

    #[test]
    fn streaming_ranges_cover_sinks_and_window() {
        let s = StreamingAttention {
            sinks: 4,
            window: 10,
        };
        assert_eq!(s.ranges(5), vec![0..6]);
        assert_eq!(s.ranges(13), vec![0..14]);
        assert_eq!(s.ranges(14), vec![0..4, 5..15]);
        assert_eq!(s.ranges(99), vec![0..4, 90..100]);
        let no_sinks = StreamingAttention {
            sinks: 0,
            window: 3,
        };
        assert_eq!(no_sinks.ranges(9), vec![7..10]);
    }

    #[test]
    fn dense_matches_f64_reference_across_tiles() {
        let shape = AttnShape {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 16,
        };
        let kv_dim = 32;
        let n = 300; // spans several tiles
        let mut seed = 12345u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..kv_dim).map(|_| rnd() * 3.0).collect())
            .collect();
        let vals: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..kv_dim).map(|_| rnd()).collect())
            .collect();
        let mut cache = KvCache::new(KvType::F32, 1, n, kv_dim);
        for t in 0..n {
            cache.write(0, t, &keys[t], &vals[t]);
        }
        let n_q = 3;
        let pos0 = n - n_q;
        let q: Vec<f32> = (0..n_q * 96).map(|_| rnd()).collect();
        let mut out = vec![0.0; n_q * 96];
        DenseAttention.attend(shape, &cache, 0, &q, pos0, &mut out);
        for i in 0..n_q {
            let r = reference(shape, &keys, &vals, &q[i * 96..(i + 1) * 96], pos0 + i);
            for (a, b) in out[i * 96..(i + 1) * 96].iter().zip(&r) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
        // Streaming reads only sinks and the recent window: equal to the reference over
        // exactly those keys, and different from full attention.
        let streaming = StreamingAttention {
            sinks: 3,
            window: 130,
        };
        let mut sout = vec![0.0; n_q * 96];
        streaming.attend(shape, &cache, 0, &q, pos0, &mut sout);
        for i in 0..n_q {
            let visible: Vec<usize> = streaming.ranges(pos0 + i).into_iter().flatten().collect();
            assert_eq!(visible.len(), 133);
            let r = reference_over(shape, &keys, &vals, &q[i * 96..(i + 1) * 96], &visible);
            for (a, b) in sout[i * 96..(i + 1) * 96].iter().zip(&r) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
        assert!(out.iter().zip(&sout).any(|(a, b)| (a - b).abs() > 1e-3));
    }

    /// Every level, both cache types, head sizes with tails, MHA and GQA groups, batches of
    /// several blocks and forced key splits: equal to the f64 reference, and the SIMD
    /// levels equal to the scalar one.
    #[test]
    fn levels_cache_types_and_splits_match() {
        let mut seed = 99u64;
        let mut rnd = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let shapes = [(14, 2, 64), (4, 4, 20), (8, 2, 13), (6, 1, 72)];
        for &(n_head, n_head_kv, head_dim) in &shapes {
            let shape = AttnShape {
                n_head,
                n_head_kv,
                head_dim,
            };
            let kv_dim = n_head_kv * head_dim;
            let q_dim = n_head * head_dim;
            let depth = 700;
            let keys: Vec<Vec<f32>> = (0..depth)
                .map(|_| (0..kv_dim).map(|_| rnd() * 2.0).collect())
                .collect();
            let vals: Vec<Vec<f32>> = (0..depth)
                .map(|_| (0..kv_dim).map(|_| rnd()).collect())
                .collect();
            for ty in [KvType::F32, KvType::F16] {
                let mut cache = KvCache::new(ty, 2, depth, kv_dim);
                // What the cache holds (f16-rounded for an f16 cache), for the reference.
                let (mut hk, mut hv) = (keys.clone(), vals.clone());
                for t in 0..depth {
                    cache.write(1, t, &keys[t], &vals[t]);
                    cache.read_keys(1, t, &mut hk[t]);
                    cache.read_values(1, t, &mut hv[t]);
                }
                for &n in &[1usize, 3, 19] {
                    let pos0 = depth - n;
                    let q: Vec<f32> = (0..n * q_dim).map(|_| rnd()).collect();
                    let mut want = vec![0.0; n * q_dim];
                    attend_batch_with(
                        Level::Scalar,
                        1,
                        shape,
                        &cache,
                        1,
                        &q,
                        pos0,
                        &mut want,
                        |p| std::iter::once(0..p + 1).collect(),
                    );
                    for i in 0..n {
                        let r = reference(shape, &hk, &hv, &q[i * q_dim..][..q_dim], pos0 + i);
                        for (a, b) in want[i * q_dim..][..q_dim].iter().zip(&r) {
                            assert!((a - b).abs() < 2e-5, "{a} vs {b}");
                        }
                    }
                    for level in Level::supported() {
                        for threads in [1, 2, 16] {
                            let mut got = vec![0.0; n * q_dim];
                            attend_batch_with(
                                level,
                                threads,
                                shape,
                                &cache,
                                1,
                                &q,
                                pos0,
                                &mut got,
                                |p| std::iter::once(0..p + 1).collect(),
                            );
                            for (a, b) in got.iter().zip(&want) {
                                assert!(
                                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                                    "{level:?} {threads} {ty:?} {shape:?} n {n}: {a} vs {b}"
                                );
                            }
                        }
                    }
                    // Per-token key ranges with a gap (sinks + a window that slides within
                    // the batch): masked in the middle of tiles, equal to the reference over
                    // exactly those keys at every level and split.
                    let streaming = StreamingAttention {
                        sinks: 5,
                        window: 150,
                    };
                    for level in Level::supported() {
                        for threads in [1, 16] {
                            let mut got = vec![0.0; n * q_dim];
                            attend_batch_with(
                                level,
                                threads,
                                shape,
                                &cache,
                                1,
                                &q,
                                pos0,
                                &mut got,
                                |p| streaming.ranges(p),
                            );
                            for i in 0..n {
                                let visible: Vec<usize> =
                                    streaming.ranges(pos0 + i).into_iter().flatten().collect();
                                let qi = &q[i * q_dim..][..q_dim];
                                let r = reference_over(shape, &hk, &hv, qi, &visible);
                                for (a, b) in got[i * q_dim..][..q_dim].iter().zip(&r) {
                                    assert!((a - b).abs() < 2e-5, "{level:?} {a} vs {b}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Dense attention over Q8_0 keys and/or values (mixed with f16 and f32): at every level
    /// and split within 2e-5 of the f64 reference over what the cache holds (the
    /// dequantized rows), and within the quantization error of the reference over the
    /// original f32 rows — a loose bound, but one a misread block, scale or head offset
    /// exceeds by far.
    #[test]
    fn q8_0_cache_matches_f64_reference() {
        use crate::kv_cache::KvTypes;
        let mut seed = 4242u64;
        let mut rnd = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let types = [
            KvTypes::from(KvType::Q8_0),
            KvTypes::new(KvType::Q8_0, KvType::F16),
            KvTypes::new(KvType::F32, KvType::Q8_0),
        ];
        for &(n_head, n_head_kv, head_dim) in &[(14, 2, 64), (8, 4, 32), (4, 1, 128)] {
            let shape = AttnShape {
                n_head,
                n_head_kv,
                head_dim,
            };
            let kv_dim = n_head_kv * head_dim;
            let q_dim = n_head * head_dim;
            let depth = 333;
            let keys: Vec<Vec<f32>> = (0..depth)
                .map(|_| (0..kv_dim).map(|_| rnd() * 2.0).collect())
                .collect();
            let vals: Vec<Vec<f32>> = (0..depth)
                .map(|_| (0..kv_dim).map(|_| rnd()).collect())
                .collect();
            for ty in types {
                let mut cache =
                    KvCache::try_new(ty, 2, depth, kv_dim, head_dim).expect("q8_0 shape");
                let (mut hk, mut hv) = (keys.clone(), vals.clone());
                for t in 0..depth {
                    cache.write(0, t, &keys[t], &vals[t]);
                    cache.read_keys(0, t, &mut hk[t]);
                    cache.read_values(0, t, &mut hv[t]);
                }
                for &n in &[1usize, 5] {
                    let pos0 = depth - n;
                    let q: Vec<f32> = (0..n * q_dim).map(|_| rnd()).collect();
                    for level in Level::supported() {
                        for threads in [1, 8] {
                            let mut got = vec![0.0; n * q_dim];
                            attend_batch_with(
                                level,
                                threads,
                                shape,
                                &cache,
                                0,
                                &q,
                                pos0,
                                &mut got,
                                |p| std::iter::once(0..p + 1).collect(),
                            );
                            let mut worst = 0.0f32;
                            for i in 0..n {
                                let qi = &q[i * q_dim..][..q_dim];
                                let held = reference(shape, &hk, &hv, qi, pos0 + i);
                                let exact = reference(shape, &keys, &vals, qi, pos0 + i);
                                let g = &got[i * q_dim..][..q_dim];
                                for ((a, b), c) in g.iter().zip(&held).zip(&exact) {
                                    assert!(
                                        (a - b).abs() < 2e-5,
                                        "{ty} {shape:?} {level:?}: {a} vs {b}"
                                    );
                                    worst = worst.max((a - c).abs());
                                }
                            }
                            assert!(worst < 2e-3, "{ty} {shape:?}: {worst} from f32 inputs");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn key_splits_cover_each_key_once() {
        let keys = vec![0..5, 100..300, 301..1000];
        for pieces in 1..9 {
            let split = split_keys(&keys, pieces);
            assert!(split.len() <= pieces.max(1));
            let flat: Vec<usize> = split.into_iter().flatten().flatten().collect();
            let want: Vec<usize> = keys.iter().cloned().flatten().collect();
            assert_eq!(flat, want);
        }
        assert_eq!(
            union(vec![5..9, 0..3, 2..4, 9..9, 10..12]),
            vec![0..4, 5..9, 10..12]
        );
    }
}
