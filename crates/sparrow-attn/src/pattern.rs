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
    /// Kept for compatibility; has no effect. Candidates are always visited in ascending
    /// key order (the kernel reads ascending key ranges), whatever this says.
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

/// What query `i` of a sequence of `seq` tokens reads, as the kernel takes it: ascending,
/// disjoint ranges of key positions (window, sinks, ladder singletons; adjacent pieces
/// joined) and of landmark rows (block `b` is row `b` of the block-mean table).
#[derive(Clone, Debug)]
pub(crate) struct Visible {
    pub(crate) tokens: Vec<Range<usize>>,
    pub(crate) blocks: Vec<Range<usize>>,
}

/// Append `r` to ascending disjoint `v`, joining it to the last range when adjacent.
fn push(v: &mut Vec<Range<usize>>, r: Range<usize>) {
    if r.is_empty() {
        return;
    }
    match v.last_mut() {
        Some(last) if last.end == r.start => last.end = r.end,
        _ => v.push(r),
    }
}

/// `from`, `from ∓ 1`, `from ∓ 2`, `from ∓ 4`, … (downwards while ≥ 0, or upwards while
/// `< end`), excluding `from` itself unless `with_first`.
fn ladder(from: usize, down: bool, end: usize, with_first: bool) -> Vec<usize> {
    let mut out = Vec::new();
    if with_first {
        out.push(from);
    }
    let mut d = 1usize;
    loop {
        let j = if down {
            from.checked_sub(d)
        } else {
            from.checked_add(d).filter(|&j| j < end)
        };
        let Some(j) = j else { break };
        out.push(j);
        let Some(next) = d.checked_mul(2) else { break };
        d = next;
    }
    out
}

impl Visible {
    /// The pattern of query `i` (`i < seq`).
    pub(crate) fn of(cfg: &SparseConfig, seq: usize, i: usize) -> Visible {
        let (lo, hi) = cfg.window_of(seq, i);
        let s = cfg.sinks.min(if cfg.causal { i + 1 } else { seq });
        let mut tokens = Vec::new();
        push(&mut tokens, 0..s.min(lo));
        if cfg.log_stride {
            for j in ladder(i, true, 0, false).into_iter().rev() {
                if j < lo && j >= s {
                    push(&mut tokens, j..j + 1);
                }
            }
        }
        push(&mut tokens, lo..hi);
        push(&mut tokens, hi..s.max(hi));
        if cfg.log_stride && !cfg.causal {
            for j in ladder(i, false, seq, false) {
                if j >= hi && j >= s {
                    push(&mut tokens, j..j + 1);
                }
            }
        }
        let bs = cfg.block_size;
        let (before, nblocks) = (lo / bs, seq.div_ceil(bs));
        let after = if cfg.causal {
            nblocks
        } else {
            hi.div_ceil(bs).min(nblocks)
        };
        let mut blocks = Vec::new();
        match cfg.landmarks {
            LandmarkMode::Off => {}
            LandmarkMode::All => {
                push(&mut blocks, 0..before);
                push(&mut blocks, after..nblocks);
            }
            LandmarkMode::Ladder => {
                if before > 0 {
                    for b in ladder(before - 1, true, 0, true).into_iter().rev() {
                        push(&mut blocks, b..b + 1);
                    }
                }
                if after < nblocks {
                    for b in ladder(after, false, nblocks, true) {
                        push(&mut blocks, b..b + 1);
                    }
                }
            }
        }
        Visible { tokens, blocks }
    }
}

fn count(v: &[Range<usize>]) -> usize {
    v.iter().map(|r| r.len()).sum()
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
    let (mut tok, mut lm) = (0u64, 0u64);
    for i in 0..seq {
        let v = Visible::of(config, seq, i);
        tok += count(&v.tokens) as u64;
        lm += count(&v.blocks) as u64;
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
    let v = Visible::of(config, seq, i);
    Ok(QueryCandidates {
        tokens: v.tokens.into_iter().flatten().collect(),
        blocks: v.blocks.into_iter().flatten().collect(),
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
