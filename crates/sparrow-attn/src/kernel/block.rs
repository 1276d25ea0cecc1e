//! The attention primitive every path runs on: a block of query rows (every head of one
//! GQA group for a few consecutive tokens) attends over a list of key ranges of one
//! [`KvSource`], walking the keys in tiles of up to [`TILE`] rows — each K/V row read once
//! per block, short ranges gathered into one tile — with a one-pass online softmax. The
//! result is a [`BlockPartial`]: running max `m`, denominator `l` and unnormalised output
//! `o` per row, so blocks over disjoint key sets (pieces of a long range, a policy's
//! landmarks) merge exactly by log-sum-exp ([`write_merged`]).
//!
//! [`attend_batch`] is the dense executor on top: it cuts a batch into blocks, splits long
//! key lists when there are too few blocks to keep every thread busy (decode), runs the
//! blocks (in parallel with feature `parallel`) and merges the pieces.

use super::level::Level;
#[cfg(feature = "fp16")]
use super::rows::QK8_0;
use super::rows::{for_each_head_run, prefetch_head_rows, HeadRun, KvRows, KvSource};
#[cfg(feature = "fp16")]
use super::tile::{convert_tile, dequant_q8_0_tile};
use super::tile::{pv, scores, softmax_tile, Tile};
use std::ops::Range;

/// Head counts and size: query heads, KV heads (a divisor of `n_head`) and head size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// KV heads; each serves `n_head / n_head_kv` query heads (a GQA group).
    pub n_head_kv: usize,
    /// Values per head.
    pub head_dim: usize,
}

impl AttnShape {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.n_head / self.n_head_kv.max(1)
    }
    /// Values in one token's query row.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    /// Values in one token's key (or value) row.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// Keys per tile.
pub const TILE: usize = 64;
/// Query rows (tokens × group heads) a block aims for.
pub const BLOCK_ROWS: usize = 56;
/// Fewest keys a split piece of a long range gets.
pub const MIN_PIECE: usize = 256;

/// The online-softmax state of one block of query rows over some keys: running maximum `m`
/// and denominator `l` per row (padded to a multiple of 8), unnormalised outputs `o`
/// (`rows × head_dim`). A row that saw no key has `m = -inf`.
#[derive(Clone, Debug)]
pub struct BlockPartial {
    /// Running maximum score per row.
    pub m: Vec<f32>,
    /// Softmax denominator per row, relative to `m`.
    pub l: Vec<f32>,
    /// Unnormalised weighted values, `rows × head_dim`.
    pub o: Vec<f32>,
}

/// One task: the query rows of batch tokens `tokens` for `kv_head`, over the key positions
/// in `keys` (ascending, disjoint, and within the union of the tokens' visible ranges, as
/// [`plan_units`] and the plan executor build them: a one-token unit sees all of them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Batch indices of the block's tokens.
    pub tokens: Range<usize>,
    /// The KV head whose query group the rows are.
    pub kv_head: usize,
    /// Key positions read.
    pub keys: Vec<Range<usize>>,
}

/// Attention of the query rows of `unit` over its keys in `src`. `q` holds the batch's
/// query rows (`n × n_head × head_dim`, already rotated). Row `r` is head `r % group` of
/// the group of token `unit.tokens.start + r / group`; each token only sees the keys of its
/// own entry in `visible` (indexed by batch index, ascending disjoint ranges), the others
/// are masked.
///
/// The keys are walked in tiles of up to [`TILE`] rows, each tile a list of pieces
/// `(start, n)` of consecutive rows that [`KvSource::run_len`] hands out as one run, filled
/// across runs and consecutive ranges (a tile ends only when it is full or the keys are). The work per tile (softmax pass, rescale of the outputs, the
/// calls, the SIMD lanes) does not shrink with its keys, so a plan of many short ranges —
/// scattered single positions, small pages — would otherwise pay it once per range: short
/// ranges are gathered into full tiles instead. A tile of one piece (the tiles of a long
/// range) reads f32 rows in place; a tile of several pieces copies (f32), converts (f16)
/// or dequantizes (Q8_0) each piece's head rows into the tile buffers.
pub fn attend_block<S: KvSource + ?Sized>(
    level: Level,
    shape: AttnShape,
    src: &S,
    q: &[f32],
    unit: &Unit,
    visible: &[Vec<Range<usize>>],
) -> BlockPartial {
    let hd = shape.head_dim;
    let group = shape.group();
    let q_dim = shape.q_dim();
    let kv_head = unit.kv_head;
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
    let mut part = BlockPartial {
        m: vec![f32::NEG_INFINITY; rw],
        l: vec![0.0; rw],
        o: vec![0.0; rows * hd],
    };
    let mut corr = vec![0.0f32; rw];
    let mut s = vec![0.0f32; TILE * rw];
    // Tiles that f16 rows are converted into, Q8_0 rows dequantized into and the pieces of
    // a gathered tile copied into (a one-piece tile of f32 rows is read in place); sized on
    // first use.
    let mut ktile = Vec::new();
    let mut vtile = Vec::new();

    // The pieces `(start, n)` of the current tile, each at least one key, and the part of
    // the current range not yet tiled.
    let mut pieces = [(0usize, 0usize); TILE];
    let mut ranges = unit.keys.iter().filter(|r| r.start < r.end);
    let mut cur = ranges.next().map(|r| (r.start, r.end));
    loop {
        let (mut np, mut n) = (0, 0);
        while n < TILE {
            let Some((start, end)) = cur else { break };
            let len = src
                .head_run_len(kv_head, start, (TILE - n).min(end - start))
                .max(1);
            pieces[np] = (start, len);
            np += 1;
            n += len;
            cur = if start + len < end {
                Some((start + len, end))
            } else {
                ranges.next().map(|r| (r.start, r.end))
            };
        }
        if n == 0 {
            break;
        }
        let pieces = &pieces[..np];
        let s = &mut s[..n * rw];
        let (k, k_stride) = match pieces {
            &[(start, n)] => head_run(
                level,
                src.head_keys(kv_head, hd, start, n),
                hd,
                n,
                &mut ktile,
            ),
            _ => {
                for &(start, len) in pieces {
                    for run in [
                        src.head_keys(kv_head, hd, start, len),
                        src.head_values(kv_head, hd, start, len),
                    ] {
                        prefetch_head_rows(run.rows, run.offset, run.stride, hd, len);
                    }
                }
                gather_rows(
                    level,
                    pieces,
                    |a, b| src.head_keys(kv_head, hd, a, b),
                    hd,
                    &mut ktile,
                )
            }
        };
        scores(level, Tile::new(k, k_stride, n, hd), &qt, rw, scale, s);
        // Per piece: its rows of the tile are keys `start..start + len`. A block of one
        // token sees every key of its unit (the unit's keys are the union of its tokens'
        // visible ranges): nothing to mask, which a decode over thousands of scattered
        // ranges would otherwise search for piece by piece.
        let mut at = 0;
        for &(start, len) in pieces.iter().filter(|_| unit.tokens.len() > 1) {
            let sp = &mut s[at * rw..(at + len) * rw];
            mask(&unit.tokens, visible, start, len, group, rw, sp);
            at += len;
        }
        softmax_tile(level, s, n, rw, &mut part.m, &mut part.l, &mut corr);
        for (r, &c) in corr[..rows].iter().enumerate() {
            if c != 1.0 {
                part.o[r * hd..(r + 1) * hd]
                    .iter_mut()
                    .for_each(|a| *a *= c);
            }
        }
        let (v, v_stride) = match pieces {
            &[(start, n)] => head_run(
                level,
                src.head_values(kv_head, hd, start, n),
                hd,
                n,
                &mut vtile,
            ),
            _ => gather_rows(
                level,
                pieces,
                |a, b| src.head_values(kv_head, hd, a, b),
                hd,
                &mut vtile,
            ),
        };
        pv(
            level,
            s,
            rw,
            rows,
            Tile::new(v, v_stride, n, hd),
            &mut part.o,
        );
    }
    part
}

/// One kv head's `n` rows of a tile as f32 with their stride: borrowed from f32 rows,
/// converted into `buf` from f16 ones, dequantized into `buf` from Q8_0 ones (whose head
/// size and offset must then be whole 32-value blocks). `head_off` is the head's first
/// value within a row of `kv_dim`.
#[allow(unused_variables, clippy::ptr_arg)] // without `fp16` only f32 rows exist: nothing to convert
pub fn head_rows<'a>(
    level: Level,
    rows: KvRows<'a>,
    head_off: usize,
    kv_dim: usize,
    hd: usize,
    n: usize,
    buf: &'a mut Vec<f32>,
) -> (&'a [f32], usize) {
    match rows {
        KvRows::F32(x) => (&x[head_off..], kv_dim),
        #[cfg(feature = "fp16")]
        _ => {
            if buf.len() < n * hd {
                buf.resize(TILE.max(n) * hd, 0.0);
            }
            head_rows_into(level, rows, head_off, kv_dim, hd, n, &mut buf[..n * hd]);
            (&buf[..n * hd], hd)
        }
    }
}

/// [`head_rows`] of a [`HeadRun`].
fn head_run<'a>(
    level: Level,
    run: HeadRun<'a>,
    hd: usize,
    n: usize,
    buf: &'a mut Vec<f32>,
) -> (&'a [f32], usize) {
    head_rows(level, run.rows, run.offset, run.stride, hd, n, buf)
}

/// One kv head's `n` rows as f32, written densely (`hd` apart) to `dst[..n * hd]`: copied
/// from f32 rows, converted from f16 ones, dequantized from Q8_0 ones (whose head size and
/// offset must then be whole 32-value blocks). `head_off` is the head's first value within
/// a row of `kv_dim`.
#[allow(unused_variables)] // without `fp16` only f32 rows exist: `level` is unused
pub fn head_rows_into(
    level: Level,
    rows: KvRows<'_>,
    head_off: usize,
    kv_dim: usize,
    hd: usize,
    n: usize,
    dst: &mut [f32],
) {
    assert!(dst.len() >= n * hd, "tile out of bounds");
    match rows {
        KvRows::F32(x) => {
            for (t, d) in dst[..n * hd].chunks_exact_mut(hd).enumerate() {
                d.copy_from_slice(&x[head_off + t * kv_dim..][..hd]);
            }
        }
        #[cfg(feature = "fp16")]
        KvRows::F16(x) => convert_tile(level, &x[head_off..], kv_dim, n, hd, dst),
        #[cfg(feature = "fp16")]
        KvRows::Q8_0(x) => {
            assert!(
                hd.is_multiple_of(QK8_0) && head_off.is_multiple_of(QK8_0),
                "Q8_0 rows need head sizes that are multiples of {QK8_0}, got {hd}"
            );
            let (b_off, b_stride, b_width) = (head_off / QK8_0, kv_dim / QK8_0, hd / QK8_0);
            dequant_q8_0_tile(level, &x[b_off..], b_stride, n, b_width, dst);
        }
    }
}

/// KV head `kv_head`'s keys (or, with `values`, values) of positions
/// `start..start + dst.len() / hd` of `src` as f32, written densely (`hd` apart) to `dst`,
/// in runs as the source hands them out ([`head_rows_into`] per run).
pub fn read_head_f32<S: KvSource + ?Sized>(
    level: Level,
    src: &S,
    values: bool,
    kv_head: usize,
    hd: usize,
    start: usize,
    dst: &mut [f32],
) {
    let n = dst.len() / hd.max(1);
    for_each_head_run(src, values, kv_head, hd, start, n, |rows, done, run| {
        let d = &mut dst[done * hd..(done + run) * hd];
        head_rows_into(level, rows.rows, rows.offset, rows.stride, hd, run, d);
    });
}

/// A gathered tile: the head rows of every piece `(start, n)` (rows `rows(start, n)`, in
/// order) written densely into `buf`; returns them with their stride `hd`.
fn gather_rows<'s, 'b>(
    level: Level,
    pieces: &[(usize, usize)],
    rows: impl Fn(usize, usize) -> HeadRun<'s>,
    hd: usize,
    buf: &'b mut Vec<f32>,
) -> (&'b [f32], usize) {
    let n: usize = pieces.iter().map(|p| p.1).sum();
    if buf.len() < n * hd {
        buf.resize(TILE.max(n) * hd, 0.0);
    }
    let mut at = 0;
    for &(start, len) in pieces {
        let dst = &mut buf[at * hd..(at + len) * hd];
        let run = rows(start, len);
        head_rows_into(level, run.rows, run.offset, run.stride, hd, len, dst);
        at += len;
    }
    (&buf[..n * hd], hd)
}

/// Set to `-inf` the scores of keys `start..start + n` (rows `0..n` of `s`) that a token of
/// the block does not see (causal diagonal, or a policy's gaps). A token's ranges are found
/// by binary search: a gathered tile masks each of its pieces, and a sparse plan's token
/// may list thousands of ranges.
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
        let first = vis.partition_point(|r| r.end <= start);
        let overlap = vis[first..].iter().take_while(|r| r.start < end);
        let seen: usize = overlap
            .clone()
            .map(|r| r.end.min(end).saturating_sub(r.start.max(start)))
            .sum();
        if seen == n {
            continue;
        }
        // Walk the token's ranges once across the tile, masking the gaps between them.
        let mut t = start;
        for r in overlap {
            for key in t..r.start.max(start) {
                s[(key - start) * rw + j * group..][..group].fill(f32::NEG_INFINITY);
            }
            t = r.end.min(end);
        }
        for key in t..end {
            s[(key - start) * rw + j * group..][..group].fill(f32::NEG_INFINITY);
        }
    }
}

/// Ascending positions as ranges of consecutive ones (`[3, 4, 5, 9]` → `3..6, 9..10`).
pub fn runs(positions: impl IntoIterator<Item = usize>) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for p in positions {
        match out.last_mut() {
            Some(r) if r.end == p => r.end = p + 1,
            _ => out.push(p..p + 1),
        }
    }
    out
}

/// Sorted union of ranges.
pub fn union(mut ranges: Vec<Range<usize>>) -> Vec<Range<usize>> {
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

/// Cut `keys` (sorted, disjoint) into at most `pieces` runs of about equal key counts, on
/// tile boundaries.
pub fn split_keys(keys: &[Range<usize>], pieces: usize) -> Vec<Vec<Range<usize>>> {
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
            if let Some(last) = out.last_mut() {
                last.push(start..start + take);
            }
            start += take;
            room -= take;
        }
    }
    out
}

/// The tasks of a batch of `n` tokens whose token `i` sees `visible[i]`: blocks of
/// [`BLOCK_ROWS`] query rows × kv heads, ordered by (block, kv head, piece). When there are
/// fewer than four blocks per thread (decode), each block's keys are split into pieces of
/// at least [`MIN_PIECE`] keys so every thread has work; consecutive units of one owner are
/// merged by [`write_merged`].
pub fn plan_units(shape: AttnShape, threads: usize, visible: &[Vec<Range<usize>>]) -> Vec<Unit> {
    let n = visible.len();
    let block = (BLOCK_ROWS / shape.group()).max(1);
    let n_blocks = n.div_ceil(block);
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
            target.div_ceil(base.max(1)).min(total / MIN_PIECE).max(1)
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
    units
}

/// Run `units` over `src` (in parallel with feature `parallel`).
pub fn run_units<S: KvSource + ?Sized>(
    level: Level,
    shape: AttnShape,
    src: &S,
    q: &[f32],
    units: &[Unit],
    visible: &[Vec<Range<usize>>],
) -> Vec<BlockPartial> {
    #[cfg(feature = "parallel")]
    {
        use rayon::prelude::*;
        units
            .par_iter()
            .map(|u| attend_block(level, shape, src, q, u, visible))
            .collect()
    }
    #[cfg(not(feature = "parallel"))]
    {
        units
            .iter()
            .map(|u| attend_block(level, shape, src, q, u, visible))
            .collect()
    }
}

/// Attention of a batch of `n = visible.len()` query rows (`q`, `n × n_head × head_dim`)
/// where token `i` sees the keys `visible[i]` of `src`; writes `n × n_head × head_dim`
/// normalised outputs to `out` (zeros for a row that sees no key). Long key lists are
/// split for `threads` workers.
pub fn attend_batch<S: KvSource + ?Sized>(
    level: Level,
    threads: usize,
    shape: AttnShape,
    src: &S,
    q: &[f32],
    visible: &[Vec<Range<usize>>],
    out: &mut [f32],
) {
    if visible.is_empty() {
        return;
    }
    let units = plan_units(shape, threads, visible);
    let parts = run_units(level, shape, src, q, &units, visible);
    let owners: Vec<(Range<usize>, usize)> = units
        .iter()
        .map(|u| (u.tokens.clone(), u.kv_head))
        .collect();
    write_merged(shape, &owners, &parts, out, None);
}

/// Write the results of a batch's tasks to `out`: consecutive parts that share an owner
/// (token range, kv head) are merged by log-sum-exp and normalised; row `r` of an owner is
/// head `r % group` of its kv head's group for token `tokens.start + r / group`. A row no
/// part saw a key for is written as zeros. With `lse` (`tokens × n_head`), each row's
/// log-sum-exp of its scores is written too (`-inf` for a row that saw no key).
pub fn write_merged(
    shape: AttnShape,
    owners: &[(Range<usize>, usize)],
    parts: &[BlockPartial],
    out: &mut [f32],
    mut lse: Option<&mut [f32]>,
) {
    let hd = shape.head_dim;
    let q_dim = shape.q_dim();
    let group = shape.group();
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
            let lse_at = token * shape.n_head + head;
            if mx == f32::NEG_INFINITY {
                dst.fill(0.0);
                if let Some(l) = lse.as_deref_mut() {
                    l[lse_at] = f32::NEG_INFINITY;
                }
                continue;
            }
            if let [p] = pieces {
                let inv = 1.0 / p.l[r];
                dst.iter_mut()
                    .zip(&p.o[r * hd..(r + 1) * hd])
                    .for_each(|(d, &a)| *d = a * inv);
                if let Some(l) = lse.as_deref_mut() {
                    l[lse_at] = p.m[r] + p.l[r].ln();
                }
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
            if let Some(ls) = lse.as_deref_mut() {
                ls[lse_at] = mx + l.ln();
            }
        }
        i = j;
    }
}
