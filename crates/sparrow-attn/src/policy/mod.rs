//! Sparse policies as read plans (after nano-vllm's `SparsePolicy`). A policy never computes
//! attention: per layer and batch it *plans* what to read ([`SparsePolicy::plan`] →
//! [`ReadPlan`]) — key ranges per KV head and token, plus small side tables of its own —
//! and one executor ([`execute`]) runs every plan through the kernel and merges by
//! log-sum-exp. Between the two, a store can fetch what the plan names
//! ([`SparsePolicy::requires_block_selection`]).
//!
//! Summaries are built when a KV block is sealed ([`SparsePolicy::on_block_sealed`], keys
//! at hand) and dropped on a rewind ([`SparsePolicy::forget_from`]). Policies are
//! per-sequence and take `&mut self`: no locks.

mod bins;
mod int8_rows;
mod int8_tiles;
mod plan;
mod quest;
mod ranking;

pub use bins::sort_by_bin;
pub use int8_rows::{quantize_row, scaled_row_dots};
pub use int8_tiles::{tile_scores, Int8Queries, Int8Tiles, TILE_ROWS};
pub use plan::{execute, Batch, PlanEntry, ReadPlan, SideRows, SideTable, Source};
pub use quest::{
    add_softmax, center_radius, group_block_mass, group_query, group_row_mass, group_upper_bounds,
    key_bounds, softmax_sum_over_heads, upper_bound_score,
};
pub use ranking::{log_masses, rank_key, rank_keys};

use crate::error::{AttnError, Result};
use crate::kernel::{AttnShape, KvSource};

/// Index of a sealed KV block within one layer (block `b` holds positions
/// `b * block_size .. (b + 1) * block_size`).
pub type BlockId = usize;

/// Which phase a batch belongs to; policies may act in one and not the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Processing the prompt (a batch of several tokens).
    Prefill,
    /// Generating one token at a time.
    Decode,
}

/// What a policy sees when it plans one layer's reads for one batch.
#[derive(Clone, Copy)]
pub struct PlanContext<'a> {
    /// Layer index.
    pub layer: usize,
    /// Head counts and size.
    pub shape: AttnShape,
    /// Position of the batch's first token; token `i` is at `pos0 + i` and may read
    /// positions `0..=pos0 + i`, which are written.
    pub pos0: usize,
    /// The batch's query rows, `n × n_head × head_dim`, already rotated.
    pub q: &'a [f32],
    /// The layer's keys and values (positions `0..pos0 + n` are valid). Reading it costs a
    /// policy what reading it costs the kernel; most plan from their summaries instead.
    pub store: &'a dyn KvSource,
}

impl PlanContext<'_> {
    /// Tokens in the batch.
    pub fn n_tokens(&self) -> usize {
        self.q.len() / self.shape.q_dim().max(1)
    }

    /// Decode for a single token, prefill otherwise.
    pub fn phase(&self) -> Phase {
        if self.n_tokens() == 1 {
            Phase::Decode
        } else {
            Phase::Prefill
        }
    }

    /// The query rows of batch token `token` for the heads sharing `kv_head`
    /// (`group × head_dim`).
    pub fn group_queries(&self, token: usize, kv_head: usize) -> &[f32] {
        let width = self.shape.group() * self.shape.head_dim;
        &self.q[token * self.shape.q_dim() + kv_head * width..][..width]
    }
}

/// A sparse attention policy: plans what each layer reads.
pub trait SparsePolicy: Send {
    /// Short name (`quest`, `streaming`, …).
    fn name(&self) -> &str;

    /// Whether the policy may run prompt processing (batches of several tokens).
    fn supports_prefill(&self) -> bool {
        true
    }

    /// Whether the policy may run generation (one token at a time).
    fn supports_decode(&self) -> bool {
        true
    }

    /// True when the policy chooses which KV blocks are read from its summaries, so a tiered
    /// store need only bring those blocks in (its plans name them before they are read).
    fn requires_block_selection(&self) -> bool {
        false
    }

    /// Positions per KV block the policy summarises, if any: the store is paged and blocks
    /// sealed at this size.
    fn block_size(&self) -> Option<usize> {
        None
    }

    /// Block `block` of `layer` has been completely written: `keys` holds its keys (f32).
    /// Blocks are sealed in order; after a rewind ([`Self::forget_from`]) a block may be
    /// sealed again.
    fn on_block_sealed(&mut self, _layer: usize, _block: BlockId, _keys: KeysView<'_>) {}

    /// How the policy partitions `layer`'s keys, per KV head, if it does (Saap's buckets):
    /// a store may then keep the layer's rows grouped by bin, segment by segment — one copy
    /// in the order the policy reads them ([`Self::placement`] says where each goes).
    fn partition(&self, _layer: usize) -> Option<Partition> {
        None
    }

    /// The bin of each row of the block [`Self::on_block_sealed`] was last given, per KV head
    /// (`bins[h * rows + r]`), when the policy partitions that layer: what the store is told
    /// right after sealing.
    fn placement(&self) -> Option<&[u32]> {
        None
    }

    /// Positions from `pos` on are about to be rewritten (a rewind, a restored prefix):
    /// forget what is known about them.
    fn forget_from(&mut self, _pos: usize) {}

    /// The prompt about to be prefilled ends at position `end` (exclusive). Called before
    /// its first batch by callers that know it, so a prefill policy may spend more on the
    /// prompt's last tokens — the question, whose states the answer reads first — than on
    /// the body. A policy must stay correct without it (a caller feeding batches itself).
    fn prompt_ends_at(&mut self, _end: usize) {}

    /// Whether [`Self::forget_from`] brings the policy back to exactly the state it had
    /// when `pos` positions were cached. True unless the policy accumulates what later
    /// queries attended to (H2O's scores): a rewind cannot take their share back out.
    /// Speculative decoding, which rewinds rejected drafts, needs it.
    fn rewinds_exactly(&self) -> bool {
        true
    }

    /// Whether a one-token (decode) plan at position `p` is every key up to `p`, in order —
    /// nothing chosen from what the policy learned of the rows — so a step run out of order
    /// (a layer's rows past `p` written, then `p` written again and attended, then the
    /// later rows restored) reads exactly what a step run in order would. Speculative
    /// checks run a draft's alternative ("sibling") that way; policies that select keys say
    /// no, and their checks stay chains.
    fn decodes_every_key(&self) -> bool {
        false
    }

    /// What layer `ctx.layer` reads for the batch in `ctx`. Side tables may borrow from the
    /// policy.
    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p>;

    /// Called after the plan ran, with each row's log-sum-exp of its scores (`n × n_head`),
    /// when [`Self::wants_lse`] is true: for policies that track attention probabilities.
    fn after_attend(&mut self, _ctx: &PlanContext<'_>, _lse: &[f32]) {}

    /// Whether [`Self::after_attend`] should be called (the executor then computes the
    /// log-sum-exp of every row).
    fn wants_lse(&self) -> bool {
        false
    }

    /// Fraction of `n_ctx` cached positions one decode query reads (1.0 when exact).
    fn fraction_read(&self, _n_ctx: usize) -> f64 {
        1.0
    }

    /// Bytes of RAM the policy's per-sequence summaries (page bounds, bucket lists) take at
    /// `n_ctx` positions of rows `kv_dim` wide: what a store under a RAM budget must leave
    /// it. Summaries only; a policy whose state does not grow with the context says 0.
    fn summary_bytes(&self, _n_ctx: usize, _kv_dim: usize) -> usize {
        0
    }
}

/// A policy's partition of a layer's keys ([`SparsePolicy::partition`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Bins per KV head.
    pub bins: usize,
    /// Positions per segment: a store sorts each complete segment's rows by bin, so a bin's
    /// rows within one segment are one run (Saap's cells are bins within segments).
    pub segment: usize,
}

/// Keys of one sealed block: `rows × kv_heads × head_dim`, row-major.
#[derive(Clone, Copy, Debug)]
pub struct KeysView<'a> {
    keys: &'a [f32],
    rows: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl<'a> KeysView<'a> {
    /// A view over `keys`, checked to hold `rows × kv_heads × head_dim` values.
    pub fn new(keys: &'a [f32], rows: usize, kv_heads: usize, head_dim: usize) -> Result<Self> {
        let n = rows
            .checked_mul(kv_heads)
            .and_then(|x| x.checked_mul(head_dim))
            .ok_or(AttnError::ShapeOverflow { what: "block keys" })?;
        if rows == 0 || kv_heads == 0 || head_dim == 0 {
            return Err(AttnError::ZeroDim { what: "keys view" });
        }
        if keys.len() != n {
            return Err(AttnError::DataLength {
                what: "block keys",
                expected: n,
                got: keys.len(),
            });
        }
        Ok(KeysView {
            keys,
            rows,
            kv_heads,
            head_dim,
        })
    }

    /// Rows (positions) in the block.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// KV heads per row.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Size of one head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// All keys, `rows × kv_heads × head_dim`, row-major.
    pub fn as_slice(&self) -> &'a [f32] {
        self.keys
    }

    /// Key of `row` for `kv_head`.
    pub fn key(&self, row: usize, kv_head: usize) -> &'a [f32] {
        let at = (row * self.kv_heads + kv_head) * self.head_dim;
        &self.keys[at..at + self.head_dim]
    }
}
