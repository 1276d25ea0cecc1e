//! Up to sixteen tokens' Q8_K activations rearranged for a kernel that multiplies many
//! weight rows at a time in a matrix unit (see [`Q8KRows`]).
//!
//! A row kernel walks one weight row against each token's quants in turn; a matrix unit
//! (AMX's tiles) multiplies a block of weight rows by a block of tokens in one
//! instruction, and wants the tokens' side in the "VNNI" layout: for each group of four
//! columns, the four quants of token 0, then of token 1, and so on. Built once per product
//! and shared by every block of rows, so the rearrangement is paid once per token, not once
//! per row.

use crate::q8::{Q8KSlice, Q8K_BLOCK};

/// A rows kernel on Q8_K activations: `n_rows` weight rows (contiguous, `rows.len() /
/// n_rows` bytes each) against every token of `xs` at once, for a matrix unit that
/// multiplies blocks of rows by blocks of tokens. `out[r * xs.tokens() + t]` is bit for bit
/// what the same level's [`crate::q8::Q8Dot`] gives for row `r` and token `t`.
pub type Q8KRows = fn(rows: &[u8], n_rows: usize, xs: &Q8KTiles, out: &mut [f32]);

/// Most tokens one [`Q8KTiles`] holds (a tile row is 64 bytes: sixteen tokens' four
/// quants).
pub const TILE_TOKENS: usize = 16;
/// Columns of a Q4_K sub-block: the stretch of a row one integer scale covers.
pub const SUB_COLS: usize = 32;
/// Sub-blocks of [`SUB_COLS`] per Q8_K super-block.
pub const SUBS: usize = Q8K_BLOCK / SUB_COLS;

/// The activations of 1 to [`TILE_TOKENS`] tokens, rearranged (see the module docs).
///
/// For super-block `i` and 32-column sub-block `s`, [`Q8KTiles::quants`] is 8 rows of
/// `4 * tokens` bytes, row `k` holding every token's quants `4k .. 4k + 4` of the
/// sub-block (a 16-column sub-block is the first or last 4 of those rows). Per super-block,
/// [`Q8KTiles::scales`] has the tokens' scales, [`Q8KTiles::sum_pairs`] their 32-column
/// sums two sub-blocks to a 32-bit lane (sub-block `2p` in the low half, `2p + 1` in the
/// high half) and [`Q8KTiles::sum16_pairs`] their 16-column sums the same way, all sixteen
/// lanes wide (zero past the last token).
#[derive(Clone, Debug, Default)]
pub struct Q8KTiles {
    tokens: usize,
    blocks: usize,
    qs: Vec<i8>,
    d: Vec<f32>,
    sum_pairs: Vec<i32>,
    sum16_pairs: Vec<i32>,
}

impl Q8KTiles {
    /// The tokens `xs` rearranged, over the super-blocks all of them have.
    ///
    /// # Panics
    /// If `xs` is empty or holds more than [`TILE_TOKENS`] tokens.
    pub fn new(xs: &[Q8KSlice<'_>]) -> Self {
        let m = xs.len();
        assert!(
            (1..=TILE_TOKENS).contains(&m),
            "1 to {TILE_TOKENS} tokens per tile set, got {m}"
        );
        let blocks = xs
            .iter()
            .map(|x| {
                x.d.len()
                    .min(x.qs.len() / Q8K_BLOCK)
                    .min(x.bsums.len() / 16)
            })
            .min()
            .unwrap_or(0);
        let mut qs = vec![0i8; blocks * Q8K_BLOCK * m];
        let mut d = vec![0f32; blocks * TILE_TOKENS];
        let mut sum_pairs = vec![0i32; blocks * SUBS / 2 * TILE_TOKENS];
        let mut sum16_pairs = vec![0i32; blocks * 8 * TILE_TOKENS];
        for (t, x) in xs.iter().enumerate() {
            for i in 0..blocks {
                let block = &x.qs[i * Q8K_BLOCK..][..Q8K_BLOCK];
                for (s, sub) in block.chunks_exact(SUB_COLS).enumerate() {
                    let dst = &mut qs[(i * SUBS + s) * SUB_COLS * m..][..SUB_COLS * m];
                    for (k, four) in sub.chunks_exact(4).enumerate() {
                        dst[(k * m + t) * 4..][..4].copy_from_slice(four);
                    }
                }
                d[i * TILE_TOKENS + t] = x.d[i];
                let bs = &x.bsums[i * 16..][..16];
                let pair = |a: i16, b: i16| (a as u16 as u32 | (b as u16 as u32) << 16) as i32;
                for p in 0..SUBS / 2 {
                    let sum = |s: usize| (bs[2 * s] as i32 + bs[2 * s + 1] as i32) as i16;
                    sum_pairs[(i * SUBS / 2 + p) * TILE_TOKENS + t] =
                        pair(sum(2 * p), sum(2 * p + 1));
                }
                for p in 0..8 {
                    sum16_pairs[(i * 8 + p) * TILE_TOKENS + t] = pair(bs[2 * p], bs[2 * p + 1]);
                }
            }
        }
        Q8KTiles {
            tokens: m,
            blocks,
            qs,
            d,
            sum_pairs,
            sum16_pairs,
        }
    }

    /// How many tokens these are.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Super-blocks (of 256 columns) every token has.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Sub-block `s` of super-block `i`: 8 rows of `4 * tokens` bytes (see the type docs).
    pub fn quants(&self, i: usize, s: usize) -> &[i8] {
        let n = SUB_COLS * self.tokens;
        &self.qs[(i * SUBS + s) * n..][..n]
    }

    /// The tokens' scales of super-block `i`, sixteen lanes.
    pub fn scales(&self, i: usize) -> &[f32; TILE_TOKENS] {
        self.d[i * TILE_TOKENS..][..TILE_TOKENS]
            .try_into()
            .expect("sixteen lanes")
    }

    /// The tokens' 16-column sums (Q8_K's `bsums`) `2p` and `2p + 1` of super-block `i`
    /// (`p < 8`), as 16-bit halves of sixteen 32-bit lanes.
    pub fn sum16_pairs(&self, i: usize, p: usize) -> &[i32; TILE_TOKENS] {
        self.sum16_pairs[(i * 8 + p) * TILE_TOKENS..][..TILE_TOKENS]
            .try_into()
            .expect("sixteen lanes")
    }

    /// The tokens' 32-column sums of sub-blocks `2p` and `2p + 1` of super-block `i`, as
    /// 16-bit halves of sixteen 32-bit lanes.
    pub fn sum_pairs(&self, i: usize, p: usize) -> &[i32; TILE_TOKENS] {
        self.sum_pairs[(i * SUBS / 2 + p) * TILE_TOKENS..][..TILE_TOKENS]
            .try_into()
            .expect("sixteen lanes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8::Q8KActs;

    /// Each token's quants land where the layout says, its sums are the sub-blocks' sums
    /// and its scale is its own; lanes past the last token stay zero.
    #[test]
    fn tiles_hold_each_token_where_the_layout_says() {
        let acts: Vec<Q8KActs> = (0..3)
            .map(|t| {
                let x: Vec<f32> = (0..512)
                    .map(|i| ((i * 7 + t * 13) % 29) as f32 - 14.0 + t as f32 * 0.25)
                    .collect();
                Q8KActs::new(&x)
            })
            .collect();
        let xs: Vec<Q8KSlice<'_>> = acts.iter().map(|a| a.as_slice()).collect();
        let tiles = Q8KTiles::new(&xs);
        assert_eq!((tiles.tokens(), tiles.blocks()), (3, 2));
        for i in 0..2 {
            for s in 0..SUBS {
                let q = tiles.quants(i, s);
                for (t, x) in xs.iter().enumerate() {
                    for c in 0..SUB_COLS {
                        let want = x.qs[i * Q8K_BLOCK + s * SUB_COLS + c];
                        assert_eq!(q[(c / 4 * 3 + t) * 4 + c % 4], want, "i{i} s{s} t{t} c{c}");
                    }
                }
            }
            for (t, x) in xs.iter().enumerate() {
                assert_eq!(tiles.scales(i)[t], x.d[i]);
                for p in 0..SUBS / 2 {
                    let sum = |s: usize| -> i32 {
                        x.qs[i * Q8K_BLOCK + s * SUB_COLS..][..SUB_COLS]
                            .iter()
                            .map(|&v| v as i32)
                            .sum()
                    };
                    let v = tiles.sum_pairs(i, p)[t];
                    assert_eq!((v as i16 as i32, v >> 16), (sum(2 * p), sum(2 * p + 1)));
                }
                for p in 0..8 {
                    let sum = |g: usize| -> i32 {
                        x.qs[i * Q8K_BLOCK + g * 16..][..16]
                            .iter()
                            .map(|&v| v as i32)
                            .sum()
                    };
                    let v = tiles.sum16_pairs(i, p)[t];
                    assert_eq!((v as i16 as i32, v >> 16), (sum(2 * p), sum(2 * p + 1)));
                }
            }
            assert!(tiles.scales(i)[3..].iter().all(|&v| v == 0.0));
            assert!((0..SUBS / 2).all(|p| tiles.sum_pairs(i, p)[3..].iter().all(|&v| v == 0)));
        }
    }
}
