//! AMX-INT8 kernels: Q4_K and Q6_K weight rows sixteen at a time against up to sixteen
//! tokens in the tile unit.
//!
//! A pass of a few tokens (a speculative check, a batch of serving slots) is bound by
//! arithmetic, not by reading weights: the row kernels spend two vector instructions per
//! token and 64 weights. A tile product (`tdpbusd`) multiplies 16 rows × one sub-block of
//! weights (32 columns for Q4_K, 16 for Q6_K) by that sub-block of up to 16 tokens in one
//! instruction, so what is left is unpacking the weights to bytes and scaling the sub-block
//! sums.
//!
//! Per group of 16 rows and super-block: the rows' quants are unpacked to bytes (one tile
//! per sub-block), each sub-block's tile product gives its integer sum for every (row,
//! token), and the vector unit weighs those sums with the rows' sub-block scales into the
//! super-block's integer total (Q4_K's minimums and Q6_K's `-32` offset as integer sums of
//! scales times the tokens' sub-block sums), then scales it in floats. That is the *block
//! totals* order of `super::avx512::q4_k_totals` and `q6_k_totals`, the AMX level's
//! single-token kernels, so every row and token gets those kernels' bits. The rows' f16
//! factors and scales are gathered sixteen rows at a time and decoded in vectors.
//!
//! The sums are kept `[row][token]`, sixteen to a vector; the lane of element `e` holds row
//! `e / tokens` and token `e % tokens`, and per-row or per-token values are spread to those
//! lanes by one permute each.

use core::arch::asm;
use core::arch::x86_64::*;

use crate::q8_tiles::{Q8KTiles, SUBS, SUB_COLS, TILE_TOKENS};

/// Rows a tile holds.
const TILE_ROWS: usize = 16;
/// Bytes of a Q4_K super-block.
const Q4_K_BYTES: usize = 144;

/// A tile configuration (`ldtilecfg`'s 64-byte operand), palette 1.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    /// Tiles 0–3: sums (`rows` × `tokens` i32); 4 and 5: weights (`rows` × `k` bytes); 6
    /// and 7: activations (`k / 4` × `4 * tokens` bytes). `k` is a sub-block's columns.
    fn new(rows: usize, tokens: usize, k: usize) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        for tile in 0..8 {
            let (r, colsb) = match tile {
                0..4 => (rows, 4 * tokens),
                4 | 5 => (rows, k),
                _ => (k / 4, 4 * tokens),
            };
            c[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&(colsb as u16).to_le_bytes());
            c[48 + tile] = r as u8;
        }
        TileConfig(c)
    }

    /// Loads this configuration into the tile unit.
    ///
    /// # Safety
    /// AMX-TILE must be available and granted to the process.
    #[inline(always)]
    unsafe fn load(&self) {
        asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(), options(nostack, readonly));
    }
}

/// One sub-block's product into tile `$c`: zeroed, weights `$a` loaded from `$w` (row
/// stride `$ws`), activations `$b` from `$x` (row stride `$xs`), `tdpbusd`, stored to
/// `$out` (row stride `$os`).
macro_rules! sub_product {
    (
        $c:literal, $a:literal, $b:literal,
        $w:expr, $ws:expr, $x:expr, $xs:expr, $out:expr, $os:expr
    ) => {
        asm!(
            concat!("tilezero tmm", $c),
            concat!("tileloadd tmm", $a, ", [{w} + {ws}]"),
            concat!("tileloadd tmm", $b, ", [{x} + {xs}]"),
            concat!("tdpbusd tmm", $c, ", tmm", $a, ", tmm", $b),
            concat!("tilestored [{o} + {os}], tmm", $c),
            w = in(reg) $w,
            ws = in(reg) $ws,
            x = in(reg) $x,
            xs = in(reg) $xs,
            o = in(reg) $out,
            os = in(reg) $os,
            options(nostack),
        )
    };
}

/// Per super-block, a group's unpacked nibbles (four quarters of 16 rows × 64 bytes; see
/// [`unpack_row`]) and its sub-block sums (`[sub][row][token]`).
#[repr(C, align(64))]
struct Scratch {
    nibbles: [[[u8; 64]; TILE_ROWS]; 4],
    sums: [[i32; TILE_ROWS * TILE_TOKENS]; SUBS],
}

/// Row `r`'s 128 nibble bytes of a Q4_K super-block (`qs`) as bytes: quarter 0 holds
/// sub-blocks 0 and 2, quarter 1 sub-blocks 1 and 3, quarters 2 and 3 the same for 4–7
/// (each 32-byte step of `qs` is sub-block `2c` in its low nibbles, `2c + 1` in its high).
#[inline(always)]
unsafe fn unpack_row(qs: *const u8, r: usize, scratch: &mut Scratch) {
    let m4 = _mm512_set1_epi8(0x0F);
    for h in 0..2 {
        let v = _mm512_loadu_si512(qs.add(64 * h).cast());
        let lo = _mm512_and_si512(v, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
        _mm512_store_si512(scratch.nibbles[2 * h][r].as_mut_ptr().cast(), lo);
        _mm512_store_si512(scratch.nibbles[2 * h + 1][r].as_mut_ptr().cast(), hi);
    }
}

/// Where sub-block `s` starts in [`Scratch::nibbles`]: its quarter and byte offset.
const fn sub_place(s: usize) -> (usize, usize) {
    (s / 4 * 2 + s % 2, s / 2 % 2 * 32)
}

/// The heads (factors, scales, minimums) of one super-block of a group's 16 rows, one row
/// per 32-bit lane, decoded in vectors as `scales_mins_k4` decodes one row.
struct Head {
    d: __m512,
    dmin: __m512,
    /// bytes 0–3: the 6-bit scales of sub-blocks 0–3; `sc_hi` those of 4–7
    sc_lo: __m512i,
    sc_hi: __m512i,
    m_lo: __m512i,
    m_hi: __m512i,
}

impl Head {
    /// The heads of the super-block at `block` (row 0's) in each live row, `offsets` bytes on
    /// (lanes outside `live` read nothing and are zero).
    #[inline(always)]
    unsafe fn gather(block: *const u8, offsets: __m512i, live: __mmask16) -> Head {
        let word = |at: i32| {
            let at = _mm512_add_epi32(offsets, _mm512_set1_epi32(at));
            _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), live, at, block.cast())
        };
        let (factors, a, b, c) = (word(0), word(4), word(8), word(12));
        let low6 = _mm512_set1_epi32(0x3F3F_3F3F);
        let low4 = _mm512_set1_epi32(0x0F0F_0F0F);
        let top2 = |v: __m512i| {
            let v = _mm512_and_si512(_mm512_srli_epi32::<6>(v), _mm512_set1_epi32(0x0303_0303));
            _mm512_slli_epi32::<4>(v)
        };
        Head {
            d: _mm512_cvtph_ps(_mm512_cvtepi32_epi16(factors)),
            dmin: _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(factors))),
            sc_lo: _mm512_and_si512(a, low6),
            m_lo: _mm512_and_si512(b, low6),
            sc_hi: _mm512_or_si512(_mm512_and_si512(c, low4), top2(a)),
            m_hi: _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(c), low4), top2(b)),
        }
    }

    /// Each sub-block's scale, one vector per sub-block (lane = row).
    #[inline(always)]
    unsafe fn scales(&self) -> [__m512i; SUBS] {
        let byte = |v: __m512i, k: u32| {
            _mm512_and_si512(
                _mm512_srlv_epi32(v, _mm512_set1_epi32(8 * k as i32)),
                _mm512_set1_epi32(0xFF),
            )
        };
        core::array::from_fn(|s| {
            let v = if s < 4 { self.sc_lo } else { self.sc_hi };
            byte(v, s as u32 % 4)
        })
    }

    /// The minimums of sub-blocks `2p` (low half) and `2p + 1` (high half), per lane (row).
    #[inline(always)]
    unsafe fn min_pairs(&self) -> [__m512i; SUBS / 2] {
        // per 32-bit lane: bytes 0 and 1 (or 2 and 3) to the low bytes of its two halves
        let spread = |first: i8| {
            let (a, b, z) = (first, first + 1, -1i8);
            _mm512_set4_epi32(
                i32::from_le_bytes([(a + 12) as u8, z as u8, (b + 12) as u8, z as u8]),
                i32::from_le_bytes([(a + 8) as u8, z as u8, (b + 8) as u8, z as u8]),
                i32::from_le_bytes([(a + 4) as u8, z as u8, (b + 4) as u8, z as u8]),
                i32::from_le_bytes([a as u8, z as u8, b as u8, z as u8]),
            )
        };
        let (first, second) = (spread(0), spread(2));
        [
            _mm512_shuffle_epi8(self.m_lo, first),
            _mm512_shuffle_epi8(self.m_lo, second),
            _mm512_shuffle_epi8(self.m_hi, first),
            _mm512_shuffle_epi8(self.m_hi, second),
        ]
    }
}

/// `unpack(block of row r, r)` for each of a group's `rows` rows, `row_bytes` apart from
/// row 0's `block`, each block prefetched ahead first.
#[inline(always)]
unsafe fn each_row<const BLOCK_BYTES: usize>(
    block: *const u8,
    row_bytes: usize,
    rows: usize,
    mut unpack: impl FnMut(*const u8, usize),
) {
    for r in 0..rows {
        let b = block.add(r * row_bytes);
        super::avx2::prefetch_ahead::<BLOCK_BYTES>(b);
        unpack(b, r);
    }
}

/// Lane `r`: row `r`'s offset from row 0 (`row_bytes` apart), and the mask of the group's
/// `rows` live rows, for gathering the rows' heads.
#[inline(always)]
unsafe fn row_lanes(row_bytes: usize, rows: usize) -> (__m512i, __mmask16) {
    let offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(row_bytes as i32),
    );
    (offsets, (1u32 << rows).wrapping_sub(1) as __mmask16)
}

/// One sub-block's tile product (see [`sub_product!`]) in the `slot`-th of four sum tiles,
/// the weights and activations alternating between two tiles each, so that consecutive
/// products do not wait on one another's tiles. Weights at `a` (`a_stride` bytes per row),
/// activations at `x` (`4 * tokens` bytes per row), sums stored at `c`.
#[inline(always)]
unsafe fn tile_product(
    slot: usize,
    a: *const u8,
    a_stride: usize,
    x: *const i8,
    m: usize,
    c: *mut i32,
) {
    match slot % 4 {
        0 => sub_product!("0", "4", "6", a, a_stride, x, 4 * m, c, 4 * m),
        1 => sub_product!("1", "5", "7", a, a_stride, x, 4 * m, c, 4 * m),
        2 => sub_product!("2", "4", "6", a, a_stride, x, 4 * m, c, 4 * m),
        _ => sub_product!("3", "5", "7", a, a_stride, x, 4 * m, c, 4 * m),
    }
}

/// Vector `j` of a super-block's integer total: each sub-block's sums (`[row][token]`) times
/// its scale (one vector per sub-block, lane = row, spread to the lanes by `rows`), added.
#[inline(always)]
unsafe fn weighed_sums<const SUBS_: usize>(
    sums: &[[i32; TILE_ROWS * TILE_TOKENS]; SUBS_],
    scales: &[__m512i; SUBS_],
    j: usize,
    rows: __m512i,
) -> __m512i {
    let mut total = _mm512_setzero_si512();
    for (sub, &scale) in sums.iter().zip(scales) {
        let sums = _mm512_load_si512(sub.as_ptr().add(16 * j).cast());
        let scale = _mm512_permutexvar_epi32(rows, scale);
        total = _mm512_add_epi32(total, _mm512_mullo_epi32(sums, scale));
    }
    total
}

/// `sum_p row_pairs[p] · token_pairs[p]` over 16-bit pairs, each spread to the lanes of
/// vector `j` (per row by `rows`, per token by `tokens`): the rows' minimums or scales
/// against the tokens' sub-block sums.
#[inline(always)]
unsafe fn pair_products(
    row_pairs: &[__m512i],
    token_pairs: &[__m512i],
    rows: __m512i,
    tokens: __m512i,
) -> __m512i {
    let mut acc = _mm512_setzero_si512();
    for (&r, &t) in row_pairs.iter().zip(token_pairs) {
        let (r, t) = (
            _mm512_permutexvar_epi32(rows, r),
            _mm512_permutexvar_epi32(tokens, t),
        );
        acc = _mm512_dpwssd_epi32(acc, r, t);
    }
    acc
}

/// A group's results, `out[r * tokens + t]` for its `rows` rows, from the vectors `acc`.
#[inline(always)]
unsafe fn write_group(acc: &[__m512; TILE_TOKENS], m: usize, rows: usize, out: &mut [f32]) {
    let mut all = [0f32; TILE_ROWS * TILE_TOKENS];
    for (j, &v) in acc.iter().enumerate().take(m) {
        _mm512_storeu_ps(all.as_mut_ptr().add(16 * j), v);
    }
    out.copy_from_slice(&all[..rows * m]);
}

/// What every group of one call shares: the tokens, their lanes, the rows' shape.
struct Pass<'a> {
    xs: &'a Q8KTiles,
    lanes: Lanes,
    row_bytes: usize,
    blocks: usize,
}

/// One group of `rows` (≤ 16) Q4_K rows from `w`, against every token of the pass;
/// `out[r * tokens + t]`.
#[inline(always)]
unsafe fn q4_k_group(
    pass: &Pass<'_>,
    w: *const u8,
    rows: usize,
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    let (xs, lanes, row_bytes, blocks) = (pass.xs, &pass.lanes, pass.row_bytes, pass.blocks);
    let m = xs.tokens();
    let mut acc = [_mm512_setzero_ps(); TILE_TOKENS];
    let mut macc = [_mm512_setzero_ps(); TILE_TOKENS];
    let (row_offsets, live) = row_lanes(row_bytes, rows);
    for i in 0..blocks {
        let block = w.add(i * Q4_K_BYTES);
        each_row::<144>(block, row_bytes, rows, |b, r| {
            unpack_row(b.add(16), r, scratch)
        });
        let head = Head::gather(block, row_offsets, live);
        for s in 0..SUBS {
            let (q, off) = sub_place(s);
            let a = scratch.nibbles[q].as_ptr().cast::<u8>().add(off);
            let c = scratch.sums[s].as_mut_ptr();
            tile_product(s, a, 64, xs.quants(i, s).as_ptr(), m, c);
        }
        let (scales, min_pairs) = (head.scales(), head.min_pairs());
        let dx = _mm512_loadu_ps(xs.scales(i).as_ptr());
        let sum_pairs: [__m512i; SUBS / 2] =
            core::array::from_fn(|p| _mm512_loadu_si512(xs.sum_pairs(i, p).as_ptr().cast()));
        for j in 0..m {
            let (ri, ti) = (lanes.row[j], lanes.token[j]);
            let total = weighed_sums(&scratch.sums, &scales, j, ri);
            let min_total = pair_products(&min_pairs, &sum_pairs, ri, ti);
            let dxl = _mm512_permutexvar_ps(ti, dx);
            let a = _mm512_mul_ps(dxl, _mm512_permutexvar_ps(ri, head.d));
            let b = _mm512_mul_ps(dxl, _mm512_permutexvar_ps(ri, head.dmin));
            acc[j] = _mm512_fmadd_ps(a, _mm512_cvtepi32_ps(total), acc[j]);
            macc[j] = _mm512_fmadd_ps(b, _mm512_cvtepi32_ps(min_total), macc[j]);
        }
    }
    for (a, &mins) in acc.iter_mut().zip(&macc) {
        *a = _mm512_sub_ps(*a, mins);
    }
    write_group(&acc, m, rows, out);
}

/// For each vector `j` of a group's `[row][token]` sums, the row and the token of each lane.
struct Lanes {
    row: [__m512i; TILE_TOKENS],
    token: [__m512i; TILE_TOKENS],
}

impl Lanes {
    #[inline(always)]
    unsafe fn new(m: usize) -> Lanes {
        let at = |j: usize, f: &dyn Fn(usize) -> usize| {
            let v: [i32; 16] = core::array::from_fn(|l| f(16 * j + l) as i32);
            _mm512_loadu_si512(v.as_ptr().cast())
        };
        Lanes {
            row: core::array::from_fn(|j| at(j, &|e| e / m % TILE_ROWS)),
            token: core::array::from_fn(|j| at(j, &|e| e % m)),
        }
    }
}

/// Every group of 16 rows (the last may be fewer) of `n_rows` rows through `group`, the
/// tiles configured for sub-blocks of `k` columns; `blocks` super-blocks of `block_bytes`.
///
/// # Safety
/// AMX-INT8 must be granted and AVX-512 F/BW/VL/VNNI/VBMI available; `group` must read only
/// its rows (`blocks` super-blocks each) and `blocks` super-blocks of `xs`.
#[inline(always)]
unsafe fn run_groups(
    rows: &[u8],
    n_rows: usize,
    xs: &Q8KTiles,
    out: &mut [f32],
    (k, block_bytes): (usize, usize),
    mut group: impl FnMut(&Pass<'_>, *const u8, usize, &mut [f32]),
) {
    let m = xs.tokens();
    assert!(
        n_rows > 0 && rows.len().is_multiple_of(n_rows),
        "whole rows"
    );
    assert_eq!(out.len(), n_rows * m, "one output per row and token");
    let row_bytes = rows.len() / n_rows;
    let pass = Pass {
        xs,
        lanes: Lanes::new(m),
        row_bytes,
        blocks: xs.blocks().min(row_bytes / block_bytes),
    };
    let mut configured = 0;
    for (g, out) in out.chunks_mut(TILE_ROWS * m).enumerate() {
        let group_rows = out.len() / m;
        if group_rows != configured {
            TileConfig::new(group_rows, m, k).load();
            configured = group_rows;
        }
        let w = rows.as_ptr().add(g * TILE_ROWS * row_bytes);
        group(&pass, w, group_rows, out);
    }
    asm!("tilerelease", options(nostack, nomem));
}

/// Q4_K rows against up to sixteen tokens in the tiles (see the module docs and
/// [`crate::q8_tiles::Q8KRows`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub(crate) fn q4_k_rows(rows: &[u8], n_rows: usize, xs: &Q8KTiles, out: &mut [f32]) {
    let mut scratch = Scratch {
        nibbles: [[[0; 64]; TILE_ROWS]; 4],
        sums: [[0; TILE_ROWS * TILE_TOKENS]; SUBS],
    };
    // SAFETY: AMX-INT8 is granted (this level's tables are only handed out after
    // `SimdLevel::Amx.is_supported()`), and every feature the vector code needs is enabled
    // here. Each group reads its rows of `rows` (`blocks` super-blocks each, within
    // `row_bytes`) and `blocks` super-blocks of `xs`; the tiles write only `scratch`, whose
    // sums hold 16 rows × 16 tokens per sub-block and whose nibbles 16 rows × 64 bytes.
    unsafe {
        run_groups(
            rows,
            n_rows,
            xs,
            out,
            (SUB_COLS, Q4_K_BYTES),
            |pass, w, n, out| q4_k_group(pass, w, n, &mut scratch, out),
        )
    }
}

// ---- Q6_K ---------------------------------------------------------------------------------

/// Bytes of a Q6_K super-block.
const Q6_K_BYTES: usize = 210;
/// Columns of a Q6_K sub-block (one signed 8-bit scale each).
const SUB16_COLS: usize = 16;
/// Sub-blocks per Q6_K super-block.
const SUBS16: usize = 16;

/// A group's Q6_K quants of one super-block as bytes (`[row][column]`) and its sub-block
/// sums (`[sub][row][token]`).
#[repr(C, align(64))]
struct Scratch6 {
    quants: [[u8; 256]; TILE_ROWS],
    sums: [[i32; TILE_ROWS * TILE_TOKENS]; SUBS16],
}

/// Row `r`'s super-block (a Q6_K block at `b`) as 256 unsigned 6-bit quants, in order.
#[inline(always)]
unsafe fn unpack_row6(b: *const u8, r: usize, scratch: &mut Scratch6) {
    let unused_scales = _mm_setzero_si128();
    for h in 0..2 {
        let ql0 = _mm256_loadu_si256(b.add(64 * h).cast());
        let ql1 = _mm256_loadu_si256(b.add(64 * h + 32).cast());
        let qh = _mm256_loadu_si256(b.add(128 + 32 * h).cast());
        for s in 0..4 {
            let (q, _) = super::avx2::q6_k_step(ql0, ql1, qh, unused_scales, h, s);
            let dst = scratch.quants[r][128 * h + 32 * s..].as_mut_ptr();
            _mm256_storeu_si256(dst.cast(), q);
        }
    }
}

/// The heads (16 signed scales, the factor) of one Q6_K super-block of a group's 16 rows,
/// one row per 32-bit lane.
struct Head6 {
    d: __m512,
    /// bytes 0–3 of word `w`: the scales of sub-blocks `4w .. 4w + 4`
    words: [__m512i; 4],
}

impl Head6 {
    /// As [`Head::gather`], for a Q6_K super-block.
    #[inline(always)]
    unsafe fn gather(block: *const u8, offsets: __m512i, live: __mmask16) -> Head6 {
        let word = |at: i32| {
            let at = _mm512_add_epi32(offsets, _mm512_set1_epi32(at));
            _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), live, at, block.cast())
        };
        // the f16 factor is the block's last two bytes: the high half of the word at 206
        let d = _mm512_srli_epi32::<16>(word(206));
        Head6 {
            d: _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)),
            words: [word(192), word(196), word(200), word(204)],
        }
    }

    /// Each sub-block's scale, sign-extended, one vector per sub-block (lane = row).
    #[inline(always)]
    unsafe fn scales(&self) -> [__m512i; SUBS16] {
        core::array::from_fn(|g| {
            let up = _mm512_set1_epi32(24 - 8 * (g % 4) as i32);
            _mm512_srav_epi32(
                _mm512_sllv_epi32(self.words[g / 4], up),
                _mm512_set1_epi32(24),
            )
        })
    }
}

/// One group of `rows` (≤ 16) Q6_K rows from `w`, against every token of the pass;
/// `out[r * tokens + t]`. Per super-block, `total = sum_g scale_g * (sum q x - 32 *
/// bsum_g)` in integers, then `acc = fma(dx * d, total, acc)`: the block totals of
/// `super::avx512::q6_k_totals`.
#[inline(always)]
unsafe fn q6_k_group(
    pass: &Pass<'_>,
    w: *const u8,
    rows: usize,
    scratch: &mut Scratch6,
    out: &mut [f32],
) {
    let (xs, lanes, row_bytes, blocks) = (pass.xs, &pass.lanes, pass.row_bytes, pass.blocks);
    let m = xs.tokens();
    let mut acc = [_mm512_setzero_ps(); TILE_TOKENS];
    let (row_offsets, live) = row_lanes(row_bytes, rows);
    for i in 0..blocks {
        let block = w.add(i * Q6_K_BYTES);
        each_row::<210>(block, row_bytes, rows, |b, r| unpack_row6(b, r, scratch));
        let head = Head6::gather(block, row_offsets, live);
        for g in 0..SUBS16 {
            let a = scratch.quants[0].as_ptr().add(SUB16_COLS * g);
            // the 16-column sub-block's 4 rows of the 32-column one that holds it
            let x = xs.quants(i, g / 2).as_ptr().add(g % 2 * SUB16_COLS * m);
            tile_product(g, a, 256, x, m, scratch.sums[g].as_mut_ptr());
        }
        let scales = head.scales();
        // lane r: row r's scales of sub-blocks 2p (low half) and 2p + 1 (high half)
        let scale_pairs: [__m512i; SUBS16 / 2] = core::array::from_fn(|p| {
            let low = _mm512_and_si512(scales[2 * p], _mm512_set1_epi32(0xFFFF));
            _mm512_or_si512(low, _mm512_slli_epi32::<16>(scales[2 * p + 1]))
        });
        let sum_pairs: [__m512i; SUBS16 / 2] =
            core::array::from_fn(|p| _mm512_loadu_si512(xs.sum16_pairs(i, p).as_ptr().cast()));
        let dx = _mm512_loadu_ps(xs.scales(i).as_ptr());
        for (j, acc) in acc.iter_mut().enumerate().take(m) {
            let (ri, ti) = (lanes.row[j], lanes.token[j]);
            let total = weighed_sums(&scratch.sums, &scales, j, ri);
            let bias = pair_products(&scale_pairs, &sum_pairs, ri, ti);
            let total = _mm512_sub_epi32(total, _mm512_slli_epi32::<5>(bias));
            let dxl = _mm512_permutexvar_ps(ti, dx);
            let a = _mm512_mul_ps(dxl, _mm512_permutexvar_ps(ri, head.d));
            *acc = _mm512_fmadd_ps(a, _mm512_cvtepi32_ps(total), *acc);
        }
    }
    write_group(&acc, m, rows, out);
}

/// Q6_K rows against up to sixteen tokens in the tiles (as [`q4_k_rows`], 16-column
/// sub-blocks with signed scales; see [`q6_k_group`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub(crate) fn q6_k_rows(rows: &[u8], n_rows: usize, xs: &Q8KTiles, out: &mut [f32]) {
    let mut scratch = Scratch6 {
        quants: [[0; 256]; TILE_ROWS],
        sums: [[0; TILE_ROWS * TILE_TOKENS]; SUBS16],
    };
    // SAFETY: as for `q4_k_rows`; the tiles write only the scratch's sums (16 rows × 16
    // tokens per sub-block) and read its quants (16 rows × 256 bytes).
    unsafe {
        run_groups(
            rows,
            n_rows,
            xs,
            out,
            (SUB16_COLS, Q6_K_BYTES),
            |pass, w, n, out| q6_k_group(pass, w, n, &mut scratch, out),
        )
    }
}
