//! 8-bit rows kept in tiles of eight and scored against a group of queries at once: for a
//! policy that scores every key of the context each decode step (the sketch: 32K rows per
//! KV head and layer at 32K, against the six or seven query heads of the group).
//!
//! Rows are quantized as [`super::quantize_row`] does (one scale each, values within ±127)
//! and stored tile by tile: a tile holds eight rows, four channels of each row after
//! another (`[channel / 4][row][channel % 4]`), so one 32-byte load holds four channels of
//! eight rows, and one 4-by-8 integer product per query adds them into eight per-row sums —
//! no horizontal sums, each tile read once for all the queries. The quants are kept offset
//! by 128 (as unsigned bytes), the form AVX-512 VNNI's `vpdpbusd` multiplies by a signed
//! byte in one instruction; the offset's share, `128 · Σ q`, is one constant per query.
//! Plain AVX2 flips the offset back and multiplies by the sign trick. Sums are exact in
//! i32 at every level, so every level gives the same bits as the portable loop.

use super::quantize_row;
use crate::kernel::Level;

/// Rows per tile.
pub const TILE_ROWS: usize = 8;

/// 8-bit rows of `dim` values each, in tiles of [`TILE_ROWS`].
#[derive(Clone, Debug, Default)]
pub struct Int8Tiles {
    dim: usize,
    /// `dim` rounded up to a multiple of 4 (the padding channels hold the offset zero).
    width: usize,
    /// Tiles of `TILE_ROWS × width` bytes, each a quant plus 128.
    bytes: Vec<u8>,
    scales: Vec<f32>,
    /// Scratch: the row being pushed, quantized.
    scratch: Vec<i8>,
}

impl Int8Tiles {
    /// No rows, of `dim` values each.
    pub fn new(dim: usize) -> Self {
        Int8Tiles {
            dim,
            width: dim.div_ceil(4) * 4,
            ..Default::default()
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.scales.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bytes the rows take (quants and scales, whole tiles).
    pub fn memory_bytes(&self) -> usize {
        self.bytes.len() + 4 * self.scales.len()
    }

    fn tile_bytes(&self) -> usize {
        TILE_ROWS * self.width
    }

    /// Append `values` (`dim` of them) as the next row.
    pub fn push(&mut self, values: &[f32]) {
        assert_eq!(values.len(), self.dim, "a row of another length");
        let row = self.len();
        if row.is_multiple_of(TILE_ROWS) {
            let size = self.bytes.len() + self.tile_bytes();
            self.bytes.resize(size, 128);
        }
        self.scratch.resize(self.dim, 0);
        let scale = quantize_row(values, &mut self.scratch);
        let tile = row / TILE_ROWS * self.tile_bytes();
        let r = row % TILE_ROWS;
        for (c, &q) in self.scratch.iter().enumerate() {
            self.bytes[tile + (c / 4) * 4 * TILE_ROWS + r * 4 + c % 4] = (q as u8) ^ 0x80;
        }
        self.scales.push(scale);
    }

    /// Keep the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        if rows >= self.len() {
            return;
        }
        self.scales.truncate(rows);
        self.bytes
            .truncate(rows.div_ceil(TILE_ROWS) * self.tile_bytes());
        // The kept tile's later rows go back to zero, as a new tile's are.
        if !rows.is_multiple_of(TILE_ROWS) {
            let tile = rows / TILE_ROWS * self.tile_bytes();
            for c4 in 0..self.width / 4 {
                let at = tile + c4 * 4 * TILE_ROWS;
                self.bytes[at + (rows % TILE_ROWS) * 4..at + 4 * TILE_ROWS].fill(128);
            }
        }
    }

    /// What the AVX2 kernel scores: the first `n` rows against `queries`.
    #[cfg(target_arch = "x86_64")]
    fn job<'a>(&'a self, queries: &'a Int8Queries, n: usize) -> crate::kernel::avx2::TileJob<'a> {
        crate::kernel::avx2::TileJob {
            tiles: &self.bytes,
            scales: &self.scales,
            width: self.width,
            queries: &queries.quants,
            q_scales: &queries.scales,
            sums: &queries.sums,
            n,
        }
    }

    /// Row `row`'s quants and scale.
    pub fn row(&self, row: usize) -> (Vec<i8>, f32) {
        let tile = row / TILE_ROWS * self.tile_bytes();
        let r = row % TILE_ROWS;
        let quants = (0..self.dim)
            .map(|c| (self.bytes[tile + (c / 4) * 4 * TILE_ROWS + r * 4 + c % 4] ^ 0x80) as i8)
            .collect();
        (quants, self.scales[row])
    }
}

/// Queries quantized for [`Int8Tiles`] of the same `dim`: each one's quants (padded with
/// zeros to a multiple of 4), scale and quant sum.
#[derive(Clone, Debug, Default)]
pub struct Int8Queries {
    width: usize,
    quants: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<i32>,
}

impl Int8Queries {
    /// `queries` (each `dim` values) quantized.
    pub fn new<'a>(dim: usize, queries: impl IntoIterator<Item = &'a [f32]>) -> Self {
        let width = dim.div_ceil(4) * 4;
        let mut out = Int8Queries {
            width,
            ..Default::default()
        };
        for q in queries {
            assert_eq!(q.len(), dim, "a query of another length");
            let at = out.quants.len();
            out.quants.resize(at + width, 0);
            out.scales
                .push(quantize_row(q, &mut out.quants[at..at + dim]));
            out.sums
                .push(out.quants[at..].iter().map(|&v| v as i32).sum());
        }
        out
    }

    /// Queries held.
    pub fn len(&self) -> usize {
        self.scales.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }
}

/// `out[h · n + r] = Σ_d q_h[d] · row_r[d] · (s_r · s_h)` for query `h` and the first `n` rows
/// of `tiles` (`out` holds `queries.len() × n`). The AVX2 kernel (with VNNI when the CPU has
/// it and `SPARROW_SIMD` does not cap it at `avx2`) when `level` allows; this portable loop
/// is their reference.
pub fn tile_scores(
    level: Level,
    tiles: &Int8Tiles,
    queries: &Int8Queries,
    n: usize,
    out: &mut [f32],
) {
    assert!(n <= tiles.len(), "more rows asked for than held");
    assert_eq!(queries.width, tiles.width, "queries of another width");
    assert!(out.len() >= queries.len() * n, "too small an output");
    if n == 0 || queries.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && level.usable() {
        let vnni = crate::kernel::vnni_available();
        // SAFETY: AVX2 is available (`usable`), and AVX-512 VL + VNNI when `vnni`; the
        // lengths are checked above.
        unsafe { crate::kernel::avx2::int8_tile_scores(vnni, &tiles.job(queries, n), out) };
        return;
    }
    let _ = level; // (elsewhere than x86_64 only the portable loop below exists)
    portable_scores(tiles, queries, n, out);
}

/// [`tile_scores`]'s reference.
fn portable_scores(tiles: &Int8Tiles, queries: &Int8Queries, n: usize, out: &mut [f32]) {
    let w = tiles.width;
    for h in 0..queries.len() {
        let q = &queries.quants[h * w..][..w];
        for r in 0..n {
            let tile = &tiles.bytes[r / TILE_ROWS * tiles.tile_bytes()..][..tiles.tile_bytes()];
            let rr = r % TILE_ROWS;
            let sum: i32 = (0..w)
                .map(|c| {
                    let k = (tile[(c / 4) * 4 * TILE_ROWS + rr * 4 + c % 4] ^ 0x80) as i8;
                    k as i32 * q[c] as i32
                })
                .sum();
            out[h * n + r] = sum as f32 * (tiles.scales[r] * queries.scales[h]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::reference::uniform;

    fn filled(dim: usize, rows: usize, seed: u64) -> Int8Tiles {
        let mut r = uniform(seed);
        let mut t = Int8Tiles::new(dim);
        for i in 0..rows {
            let spread = 1.0 + (i % 5) as f32;
            let v: Vec<f32> = (0..dim).map(|_| r() * spread).collect();
            t.push(&v);
        }
        t
    }

    fn queries(dim: usize, heads: usize, seed: u64) -> Int8Queries {
        let mut r = uniform(seed);
        let qs: Vec<Vec<f32>> = (0..heads)
            .map(|_| (0..dim).map(|_| r() * 3.0).collect())
            .collect();
        Int8Queries::new(dim, qs.iter().map(|q| q.as_slice()))
    }

    #[test]
    fn rows_come_back_as_quantized_and_scores_are_their_dots() {
        let mut r = uniform(9);
        for dim in [1usize, 3, 4, 13, 64] {
            let mut t = Int8Tiles::new(dim);
            let rows: Vec<Vec<f32>> = (0..19)
                .map(|_| (0..dim).map(|_| r() * 2.0).collect())
                .collect();
            for row in &rows {
                t.push(row);
            }
            let q: Vec<f32> = (0..dim).map(|_| r()).collect();
            let qs = Int8Queries::new(dim, [q.as_slice()]);
            let mut out = vec![0f32; rows.len()];
            tile_scores(Level::Scalar, &t, &qs, rows.len(), &mut out);
            let mut qq = vec![0i8; dim];
            let qs_scale = quantize_row(&q, &mut qq);
            for (i, row) in rows.iter().enumerate() {
                let mut want = vec![0i8; dim];
                let scale = quantize_row(row, &mut want);
                assert_eq!(t.row(i), (want.clone(), scale), "dim {dim} row {i}");
                let dot: i32 = want
                    .iter()
                    .zip(&qq)
                    .map(|(&a, &b)| a as i32 * b as i32)
                    .sum();
                assert_eq!(out[i], dot as f32 * (scale * qs_scale), "dim {dim} row {i}");
                // And within a quantization step of the exact dot.
                let exact: f32 = row.iter().zip(&q).map(|(a, b)| a * b).sum();
                let step: f32 = row.iter().map(|v| v.abs()).sum::<f32>() * qs_scale
                    + q.iter().map(|v| v.abs()).sum::<f32>() * scale;
                assert!((out[i] - exact).abs() <= step, "dim {dim} row {i}");
            }
        }
    }

    #[test]
    fn truncated_tiles_equal_tiles_built_that_short() {
        let full = filled(20, 29, 4);
        for keep in [0usize, 5, 8, 13, 16, 29] {
            let mut t = full.clone();
            t.truncate(keep);
            let short = filled(20, keep, 4);
            assert_eq!(t.len(), keep);
            assert_eq!(t.scales, short.scales, "keep {keep}");
            assert_eq!(t.bytes, short.bytes, "keep {keep}");
            // And rows pushed after the cut land as on tiles that never held more.
            let (mut a, mut b) = (t, short);
            for row in [vec![0.5f32; 20], vec![-2.0; 20]] {
                a.push(&row);
                b.push(&row);
            }
            assert_eq!(a.bytes, b.bytes, "keep {keep}");
        }
    }

    /// Every level (and, on a CPU with VNNI, the plain AVX2 form too) gives the portable
    /// loop's bits, for group sizes across the kernel's head blocks and partial tiles.
    #[test]
    fn every_level_scores_as_the_portable_loop() {
        for (dim, rows, heads) in [
            (64usize, 37usize, 7usize),
            (16, 8, 1),
            (13, 21, 9),
            (128, 64, 6),
            (4, 3, 16),
        ] {
            let t = filled(dim, rows, dim as u64);
            let qs = queries(dim, heads, rows as u64);
            for n in [rows, rows - 1, 1] {
                let mut want = vec![0f32; heads * n];
                portable_scores(&t, &qs, n, &mut want);
                for level in Level::supported() {
                    let mut got = vec![f32::NAN; heads * n];
                    tile_scores(level, &t, &qs, n, &mut got);
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{level:?} dim {dim} n {n} heads {heads}"
                    );
                }
                #[cfg(target_arch = "x86_64")]
                if Level::Avx2.usable() {
                    for vnni in [false, true] {
                        if vnni && !crate::kernel::vnni_available() {
                            continue;
                        }
                        let mut got = vec![f32::NAN; heads * n];
                        // SAFETY: AVX2 is usable, VNNI when asked for; lengths as checked
                        // by `tile_scores`.
                        unsafe {
                            crate::kernel::avx2::int8_tile_scores(vnni, &t.job(&qs, n), &mut got)
                        };
                        assert_eq!(
                            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "avx2 vnni {vnni} dim {dim} n {n} heads {heads}"
                        );
                    }
                }
            }
        }
    }
}
