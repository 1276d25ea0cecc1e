//! The sparse pattern: which keys (and which block landmarks) one query visits.
//!
//! For query `i` of a sequence of `seq` tokens the pattern is the union of four families,
//! built so that they are disjoint by construction (no hash set, no per-call stamp array):
//!
//! * **window** — the `window` most recent keys `i+1-window ..= i` (non-causal: every key
//!   with `|i - j| < window`);
//! * **sinks** — the first `sinks` tokens, minus those already in the window;
//! * **ladder** — keys at distance `1, 2, 4, 8, …` from `i` that fall outside the window
//!   and the sinks (non-causal: both directions);
//! * **landmarks** — for each block of `block_size` keys lying *entirely* outside the
//!   window (before it; non-causal also after it), a pseudo-key whose key and value are
//!   the block means. The block holding `i` is never a landmark. [`LandmarkMode::All`]
//!   uses every such block (cost `O(seq / block_size)` per query);
//!   [`LandmarkMode::Ladder`] only the nearest one and then those at block distances
//!   `1, 2, 4, …` beyond it (`O(log)`).
//!
//! When the window covers the whole sequence the pattern is exactly dense attention.

use core::ops::Range;

use crate::error::{AttnError, Result};
use crate::simd::Rows;

/// Which blocks outside the window are represented by their mean key/value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LandmarkMode {
    /// No landmarks.
    Off,
    /// The nearest outside block, then blocks at distances 1, 2, 4, … beyond it.
    Ladder,
    /// Every block entirely outside the window (the default).
    #[default]
    All,
}

/// Configuration of the sparse pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SparseConfig {
    /// Number of most recent keys every query sees (its own position included). Must be ≥ 1.
    pub window: usize,
    /// Tokens per landmark block. Must be ≥ 1.
    pub block_size: usize,
    /// The first `sinks` tokens are visible to every query (attention sinks / BOS).
    pub sinks: usize,
    /// Causal (a query sees no later key) or bidirectional.
    pub causal: bool,
    /// Add the log-stride ladder beyond the window.
    pub log_stride: bool,
    /// Which outside blocks are represented by landmarks.
    pub landmarks: LandmarkMode,
    /// Visit candidates in ascending key order (the default). When false the window is
    /// visited first, then sinks, then the ladder. Results agree up to float rounding.
    pub sort_candidates: bool,
}

impl Default for SparseConfig {
    fn default() -> Self {
        Self {
            window: 128,
            block_size: 64,
            sinks: 1,
            causal: true,
            log_stride: true,
            landmarks: LandmarkMode::All,
            sort_candidates: true,
        }
    }
}

impl SparseConfig {
    /// A configuration whose pattern is dense attention (window covering everything).
    pub fn dense(causal: bool) -> Self {
        Self {
            window: usize::MAX,
            block_size: 1,
            sinks: 0,
            causal,
            log_stride: false,
            landmarks: LandmarkMode::Off,
            sort_candidates: true,
        }
    }

    /// Check every field; the constructors of this crate call this for you.
    pub fn validate(&self) -> Result<()> {
        if self.window == 0 {
            return Err(AttnError::InvalidConfig {
                field: "window",
                reason: "must be at least 1",
            });
        }
        if self.block_size == 0 {
            return Err(AttnError::InvalidConfig {
                field: "block_size",
                reason: "must be at least 1",
            });
        }
        Ok(())
    }

    /// The window `lo..hi` of query `i` in a sequence of `seq` tokens.
    #[inline]
    pub(crate) fn window_of(&self, seq: usize, i: usize) -> (usize, usize) {
        let lo = (i + 1).saturating_sub(self.window);
        let hi = if self.causal {
            i + 1
        } else {
            i.saturating_add(self.window).min(seq)
        };
        (lo, hi)
    }
}

/// The candidates of one query, families kept apart and each ascending.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    pub(crate) window: Range<usize>,
    pub(crate) sinks: [Range<usize>; 2],
    pub(crate) ladder_back: Vec<usize>,
    pub(crate) ladder_fwd: Vec<usize>,
    pub(crate) blocks: [Range<usize>; 2],
    pub(crate) block_list: Vec<usize>,
}

/// Up to five row selections, in visiting order.
pub(crate) struct PieceList<'a> {
    items: [Rows<'a>; 5],
    n: usize,
}

impl<'a> PieceList<'a> {
    pub(crate) fn new() -> Self {
        Self {
            items: [Rows::Range { start: 0, end: 0 }; 5],
            n: 0,
        }
    }
    pub(crate) fn push(&mut self, r: Rows<'a>) {
        if r.len() > 0 {
            self.items[self.n] = r;
            self.n += 1;
        }
    }
    pub(crate) fn as_slice(&self) -> &[Rows<'a>] {
        &self.items[..self.n]
    }
    pub(crate) fn total(&self) -> usize {
        self.as_slice().iter().map(|r| r.len()).sum()
    }
}

fn range_rows(r: &Range<usize>) -> Rows<'static> {
    Rows::Range {
        start: r.start,
        end: r.end,
    }
}

impl Plan {
    /// Fill the plan of query `i` (`i < seq`).
    pub(crate) fn build(&mut self, cfg: &SparseConfig, seq: usize, i: usize) {
        let (lo, hi) = cfg.window_of(seq, i);
        self.window = lo..hi;
        let visible = if cfg.causal { i + 1 } else { seq };
        let s = cfg.sinks.min(visible);
        self.sinks = [0..s.min(lo), if s > hi { hi..s } else { 0..0 }];
        self.ladder_back.clear();
        self.ladder_fwd.clear();
        if cfg.log_stride {
            let mut d = 1usize;
            while d <= i {
                let j = i - d;
                if j < lo && j >= s {
                    self.ladder_back.push(j);
                }
                d = match d.checked_mul(2) {
                    Some(x) => x,
                    None => break,
                };
            }
            self.ladder_back.reverse();
            if !cfg.causal {
                let mut d = 1usize;
                while let Some(j) = i.checked_add(d).filter(|&j| j < seq) {
                    if j >= hi && j >= s {
                        self.ladder_fwd.push(j);
                    }
                    d = match d.checked_mul(2) {
                        Some(x) => x,
                        None => break,
                    };
                }
            }
        }
        self.blocks = [0..0, 0..0];
        self.block_list.clear();
        let bs = cfg.block_size;
        let before = lo / bs;
        let nblocks = seq.div_ceil(bs);
        let after = if cfg.causal {
            nblocks
        } else {
            hi.div_ceil(bs).min(nblocks)
        };
        match cfg.landmarks {
            LandmarkMode::Off => {}
            LandmarkMode::All => self.blocks = [0..before, after..nblocks],
            LandmarkMode::Ladder => {
                if before > 0 {
                    let p = before - 1;
                    self.block_list.push(p);
                    let mut d = 1usize;
                    while d <= p {
                        self.block_list.push(p - d);
                        d *= 2;
                    }
                    self.block_list.reverse();
                }
                let mut d = 0usize;
                while after + d < nblocks {
                    self.block_list.push(after + d);
                    d = if d == 0 { 1 } else { d * 2 };
                }
            }
        }
    }

    /// Token pieces in visiting order.
    pub(crate) fn token_pieces(&self, sorted: bool) -> PieceList<'_> {
        let mut p = PieceList::new();
        if sorted {
            p.push(range_rows(&self.sinks[0]));
            p.push(Rows::List(&self.ladder_back));
            p.push(range_rows(&self.window));
            p.push(range_rows(&self.sinks[1]));
            p.push(Rows::List(&self.ladder_fwd));
        } else {
            p.push(range_rows(&self.window));
            p.push(range_rows(&self.sinks[0]));
            p.push(range_rows(&self.sinks[1]));
            p.push(Rows::List(&self.ladder_back));
            p.push(Rows::List(&self.ladder_fwd));
        }
        p
    }

    /// Token pieces outside the window (sinks and ladder), ascending.
    pub(crate) fn extra_pieces(&self) -> PieceList<'_> {
        let mut p = PieceList::new();
        p.push(range_rows(&self.sinks[0]));
        p.push(Rows::List(&self.ladder_back));
        p.push(range_rows(&self.sinks[1]));
        p.push(Rows::List(&self.ladder_fwd));
        p
    }

    /// Landmark block pieces, ascending.
    pub(crate) fn block_pieces(&self) -> PieceList<'_> {
        let mut p = PieceList::new();
        p.push(range_rows(&self.blocks[0]));
        p.push(Rows::List(&self.block_list));
        p.push(range_rows(&self.blocks[1]));
        p
    }

    fn token_count(&self) -> usize {
        self.window.len()
            + self.sinks[0].len()
            + self.sinks[1].len()
            + self.ladder_back.len()
            + self.ladder_fwd.len()
    }

    fn block_count(&self) -> usize {
        self.blocks[0].len() + self.blocks[1].len() + self.block_list.len()
    }
}

/// How many (query, key) and (query, landmark) pairs a pattern visits for one head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CandidateCount {
    /// Sequence length.
    pub seq: usize,
    /// (query, real key) pairs: window + sinks + ladder.
    pub token_pairs: u64,
    /// (query, landmark) pairs.
    pub landmark_pairs: u64,
    /// Pairs dense attention visits: `seq (seq + 1) / 2` causal, `seq²` otherwise.
    pub dense_pairs: u64,
}

impl CandidateCount {
    /// `token_pairs + landmark_pairs`.
    pub fn total(&self) -> u64 {
        self.token_pairs + self.landmark_pairs
    }

    /// `dense_pairs / total` (how many times fewer pairs than dense; 1 when empty).
    pub fn reduction(&self) -> f64 {
        if self.total() == 0 {
            1.0
        } else {
            self.dense_pairs as f64 / self.total() as f64
        }
    }
}

/// Count the pairs the pattern of `config` visits for one head at sequence length `seq`.
pub fn candidates(config: &SparseConfig, seq: usize) -> Result<CandidateCount> {
    config.validate()?;
    let mut plan = Plan::default();
    let (mut tok, mut lm) = (0u64, 0u64);
    for i in 0..seq {
        plan.build(config, seq, i);
        tok += plan.token_count() as u64;
        lm += plan.block_count() as u64;
    }
    let n = seq as u64;
    let dense = if config.causal {
        n * (n + 1) / 2
    } else {
        n * n
    };
    Ok(CandidateCount {
        seq,
        token_pairs: tok,
        landmark_pairs: lm,
        dense_pairs: dense,
    })
}

/// The keys and landmark blocks query `i` visits, each list ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryCandidates {
    /// Real key positions (window, sinks, ladder).
    pub tokens: Vec<usize>,
    /// Landmark block indices (block `b` covers keys `b*block_size .. (b+1)*block_size`).
    pub blocks: Vec<usize>,
}

/// List the candidates of query `i` in a sequence of `seq` tokens.
pub fn candidates_for(config: &SparseConfig, seq: usize, i: usize) -> Result<QueryCandidates> {
    config.validate()?;
    if i >= seq {
        return Err(AttnError::IndexOutOfRange {
            what: "query",
            index: i,
            len: seq,
        });
    }
    let mut plan = Plan::default();
    plan.build(config, seq, i);
    let collect = |pieces: PieceList<'_>| {
        let mut v: Vec<usize> = Vec::new();
        for r in pieces.as_slice() {
            v.extend((0..r.len()).map(|k| r.get(k)));
        }
        v
    };
    Ok(QueryCandidates {
        tokens: collect(plan.token_pieces(true)),
        blocks: collect(plan.block_pieces()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_disjoint_ascending_and_causal() {
        for causal in [true, false] {
            for mode in [LandmarkMode::Off, LandmarkMode::Ladder, LandmarkMode::All] {
                let cfg = SparseConfig {
                    window: 5,
                    block_size: 4,
                    sinks: 3,
                    causal,
                    landmarks: mode,
                    ..Default::default()
                };
                let seq = 70;
                for i in 0..seq {
                    let c = candidates_for(&cfg, seq, i).unwrap();
                    assert!(c.tokens.windows(2).all(|w| w[0] < w[1]), "{:?}", c.tokens);
                    assert!(c.blocks.windows(2).all(|w| w[0] < w[1]));
                    if causal {
                        assert!(c.tokens.iter().all(|&j| j <= i));
                        assert!(c
                            .blocks
                            .iter()
                            .all(|&b| (b + 1) * 4 <= (i + 1).saturating_sub(5)));
                    }
                    assert!(
                        !c.blocks.contains(&(i / 4)),
                        "own block is never a landmark"
                    );
                    assert!(c.tokens.contains(&i));
                    for j in 0..3.min(seq) {
                        if !causal || j <= i {
                            assert!(c.tokens.contains(&j), "sink {j} missing for {i}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn full_window_is_dense() {
        let cfg = SparseConfig {
            window: 50,
            ..Default::default()
        };
        let c = candidates(&cfg, 50).unwrap();
        assert_eq!(c.token_pairs, c.dense_pairs);
        assert_eq!(c.landmark_pairs, 0);
        let cfg = SparseConfig {
            window: 50,
            causal: false,
            ..Default::default()
        };
        let c = candidates(&cfg, 50).unwrap();
        assert_eq!(c.token_pairs, 2500);
    }

    #[test]
    fn counts_are_sub_quadratic() {
        let cfg = SparseConfig::default();
        let c = candidates(&cfg, 8192).unwrap();
        assert!(c.reduction() > 20.0, "{c:?}");
        assert!(candidates(
            &SparseConfig {
                window: 0,
                ..cfg.clone()
            },
            10
        )
        .is_err());
        assert!(candidates(
            &SparseConfig {
                block_size: 0,
                ..cfg.clone()
            },
            10
        )
        .is_err());
        assert!(candidates_for(&cfg, 10, 10).is_err());
    }
}
