//! The attention seam. Every layer's attention is one call to [`attend`]: the sequence's
//! policy plans what the layer reads ([`SparsePolicy::plan`] → [`ReadPlan`]), and
//! `sparrow_attn`'s executor runs the plan through the block kernel over the layer's rows
//! of the cache, merging partial results by log-sum-exp. Policies never compute attention,
//! so a new policy is a plan, and a store that keeps blocks elsewhere only has to serve
//! what plans name.

use crate::kv::{KvStore, StoreLayer};
pub use crate::policy::full::DenseAttention;
pub use crate::policy::streaming::StreamingAttention;
pub use crate::policy::{policy_names, AttentionChoice};
pub use sparrow_attn::kernel::AttnShape;
use sparrow_attn::kernel::Level;
pub use sparrow_attn::policy::{
    execute, Batch, KeysView, Phase, PlanContext, PlanEntry, ReadPlan, SideTable, Source,
    SparsePolicy,
};

/// Attention of layer `layer` for a batch: `q` holds `n` rows of `n_head * head_dim`
/// (rotated), row `i` at position `pos0 + i`, whose keys and values the caller has written
/// to `cache`. `policy` plans the reads, the store is told what they are
/// ([`KvStore::prefetch`]), and the executor writes `n` rows of `n_head * head_dim` to
/// `out`.
pub fn attend(
    policy: &mut dyn SparsePolicy,
    shape: AttnShape,
    cache: &dyn KvStore,
    layer: usize,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
) {
    let store = StoreLayer {
        store: cache,
        layer,
    };
    let ctx = PlanContext {
        layer,
        shape,
        pos0,
        q,
        store: &store,
    };
    let wants_lse = policy.wants_lse();
    let mut lse = if wants_lse {
        vec![0.0f32; ctx.n_tokens() * shape.n_head]
    } else {
        Vec::new()
    };
    {
        let plan = policy.plan(&ctx);
        run_plan(
            &store,
            shape,
            &plan,
            Batch {
                q,
                out,
                lse: wants_lse.then_some(&mut lse[..]),
            },
        );
    }
    if wants_lse {
        policy.after_attend(&ctx, &lse);
    }
}

/// Attention of a sliding-window layer (the model's own mask, not a policy): row `i` of `q`
/// (position `pos0 + i`) reads the last `window` positions up to its own, which the caller
/// has written to `cache`.
pub fn attend_sliding(
    shape: AttnShape,
    cache: &dyn KvStore,
    layer: usize,
    q: &[f32],
    pos0: usize,
    window: usize,
    out: &mut [f32],
) {
    let store = StoreLayer {
        store: cache,
        layer,
    };
    let plan = ReadPlan::sliding(shape, pos0, q.len() / shape.q_dim(), window);
    run_plan(&store, shape, &plan, Batch { q, out, lse: None });
}

/// Tell the store what `plan` reads of `layer` ([`KvStore::prefetch`]), then run it for
/// `batch` through the executor at the active SIMD level on the current thread pool.
fn run_plan(
    layer: &StoreLayer<'_, dyn KvStore + '_>,
    shape: AttnShape,
    plan: &ReadPlan<'_>,
    batch: Batch<'_>,
) {
    layer.store.prefetch(layer.layer, plan);
    let threads = rayon::current_num_threads();
    execute(Level::active(), threads, shape, layer, plan, batch);
}

/// The store positions each KV head's query group reads when the single query row `q` at
/// position `pos` of `layer` attends (one list of ascending ranges per KV head): the read
/// set a policy is evaluated by (`sparrow eval attention`). Plans the query as [`attend`]
/// would, so it may update the policy's state the same way.
pub fn read_set(
    policy: &mut dyn SparsePolicy,
    shape: AttnShape,
    cache: &dyn KvStore,
    layer: usize,
    q: &[f32],
    pos: usize,
) -> Vec<Vec<std::ops::Range<usize>>> {
    let store = StoreLayer {
        store: cache,
        layer,
    };
    let ctx = PlanContext {
        layer,
        shape,
        pos0: pos,
        q: &q[..shape.q_dim()],
        store: &store,
    };
    policy.plan(&ctx).store_reads(&store, shape.n_head_kv, 0)
}

/// A test policy: every token reads the given key ranges of each KV head.
#[cfg(test)]
pub(crate) struct FixedReads(pub Vec<Vec<std::ops::Range<usize>>>);

#[cfg(test)]
impl SparsePolicy for FixedReads {
    fn name(&self) -> &str {
        "fixed"
    }
    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        ReadPlan {
            entries: self
                .0
                .iter()
                .enumerate()
                .map(|(h, r)| PlanEntry {
                    kv_heads: h..h + 1,
                    source: Source::Store,
                    weight: 1.0,
                    visible: vec![r.clone(); ctx.n_tokens()],
                })
                .collect(),
            side: Vec::new(),
        }
    }
}
