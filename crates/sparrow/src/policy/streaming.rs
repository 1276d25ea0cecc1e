//! `streaming`: StreamingLLM's pattern. Every query reads the first `sinks` positions
//! (attention sinks) and the `window` most recent ones, whatever the context length.
//! Positions keep their original RoPE angles; nothing is evicted, the middle is not read.

use super::{AttentionChoice, PolicyEntry, SettingsType};
use sparrow_attn::policy::{PlanContext, ReadPlan, SparsePolicy};
use std::ops::Range;

/// Sinks + recent window; also the policy's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct StreamingAttention {
    /// Streaming: number of sink tokens kept.
    #[cfg_attr(feature = "cli", arg(id = "ATTN_SINKS", long = "attn-sinks", default_value_t = 4, help_heading = crate::policy::HELP_HEADING))]
    pub sinks: usize,
    /// Streaming: number of recent tokens kept.
    #[cfg_attr(feature = "cli", arg(id = "ATTN_WINDOW", long = "attn-window", default_value_t = 2000, help_heading = crate::policy::HELP_HEADING))]
    pub window: usize,
}

impl Default for StreamingAttention {
    /// StreamingLLM's defaults: 4 sinks and a 2000-token recent window.
    fn default() -> Self {
        StreamingAttention {
            sinks: 4,
            window: 2000,
        }
    }
}

/// The registry's entry.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "streaming",
    summary: "sinks + recent window",
    prefill: true,
    decode: true,
    build: |b| Ok(Box::new(settings(b.choice)?)),
    check: |c| settings(c).map(|s| format!("{s:?}")),
    settings: SettingsType::of::<StreamingAttention>(),
};

/// The settings, checked.
fn settings(c: &AttentionChoice) -> Result<StreamingAttention, String> {
    let s = c.settings::<StreamingAttention>();
    if s.window == 0 {
        return Err("streaming attention needs a window of at least 1 token".into());
    }
    Ok(s)
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

impl SparsePolicy for StreamingAttention {
    fn name(&self) -> &str {
        "streaming"
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let visible = (0..ctx.n_tokens())
            .map(|i| self.ranges(ctx.pos0 + i))
            .collect();
        ReadPlan::same_for_all_heads(ctx.shape, visible)
    }

    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        let read: usize = self.ranges(n_ctx - 1).iter().map(|r| r.len()).sum();
        read as f64 / n_ctx as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend, AttnShape, DenseAttention};
    use crate::kv::{KvType, RamStore};

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

    /// The f64 oracle over the listed key positions, for every KV head.
    fn reference_over(
        shape: AttnShape,
        keys: &[Vec<f32>],
        vals: &[Vec<f32>],
        q: &[f32],
        visible: &[usize],
    ) -> Vec<f32> {
        let per_head = vec![visible.to_vec(); shape.n_head_kv];
        sparrow_attn::kernel::reference::attention_f64(shape, keys, vals, q, &per_head)
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
        let mut rnd = sparrow_attn::kernel::reference::uniform(12345);
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..kv_dim).map(|_| rnd() * 3.0).collect())
            .collect();
        let vals: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..kv_dim).map(|_| rnd()).collect())
            .collect();
        let mut cache = RamStore::new(KvType::F32, 1, n, kv_dim);
        for t in 0..n {
            cache.write(0, t, &keys[t], &vals[t]);
        }
        let n_q = 3;
        let pos0 = n - n_q;
        let q: Vec<f32> = (0..n_q * 96).map(|_| rnd()).collect();
        let mut out = vec![0.0; n_q * 96];
        attend(&mut DenseAttention, shape, &cache, 0, &q, pos0, &mut out);
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
        attend(&mut { streaming }, shape, &cache, 0, &q, pos0, &mut sout);
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
}
