//! Sparse policies: the seam through which a model's attention chooses which KV blocks each
//! query reads. A policy sees block summaries collected when blocks are sealed and, per
//! query group, picks blocks; the attention itself is then computed exactly over the chosen
//! blocks with [`crate::partial_attention`] and merged with [`crate::merge`].
//!
//! This module holds the contract and the block-selecting policies' arithmetic; wiring into
//! the engine's paged KV store lives in the engine.

mod quest;

pub use quest::{key_bounds, upper_bound_score, BlockBounds, Quest, QuestConfig};

use crate::error::{AttnError, Result};

/// Index of a sealed KV block within one layer (block `b` holds positions
/// `b * block_size .. (b + 1) * block_size`).
pub type BlockId = usize;

/// Which phase a query belongs to; policies may act in one and not the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Processing the prompt.
    Prefill,
    /// Generating one token at a time.
    Decode,
}

/// What a policy sees when it chooses blocks for one query group.
#[derive(Clone, Copy, Debug)]
pub struct PolicyContext<'a> {
    /// Layer index.
    pub layer: usize,
    /// Prefill or decode.
    pub phase: Phase,
    /// The KV head whose blocks are chosen.
    pub kv_head: usize,
    /// The query heads sharing that KV head, `group × head_dim`, already rotated.
    pub queries: &'a [f32],
    /// Size of one head.
    pub head_dim: usize,
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

/// A sparse attention policy (after nano-vllm's `SparsePolicy`).
pub trait SparsePolicy: Send + Sync {
    /// Short name (`quest`, `streaming`, …).
    fn name(&self) -> &'static str;
    /// Whether the policy changes prefill attention.
    fn supports_prefill(&self) -> bool;
    /// Whether the policy changes decode attention.
    fn supports_decode(&self) -> bool;
    /// True when the policy decides which KV blocks are read, so a tiered store need only
    /// load the selected blocks from its cold tier.
    fn requires_block_selection(&self) -> bool;
    /// Choose among the sealed blocks `available` (ascending) for the query group in `ctx`;
    /// append the chosen ids to `out` in ascending order. The unsealed tail block is always
    /// read by the caller and is not offered.
    fn select_blocks(&self, ctx: &PolicyContext<'_>, available: &[BlockId], out: &mut Vec<BlockId>);
    /// A block of `layer` was filled and sealed: collect its summary while it is hot.
    fn on_block_sealed(&mut self, _layer: usize, _block: BlockId, _keys: KeysView<'_>) {}
    /// Forget all per-sequence state.
    fn reset(&mut self) {}
}
