//! Saap's inverted lists: per sparse layer and KV head, the positions each bucket holds
//! (ascending), and the cells' statistics ([`CellStats`], the `cells` router) kept up to
//! date from the store.

use super::cells::CellStats;
use super::settings::SINKS;
use sparrow_attn::kernel::{read_f32, KvSource};

/// The inverted lists of one (layer, KV head): per bucket, the positions whose key it
/// holds, ascending (a store that keeps the layer by bucket holds the same entries, in the
/// same order, in its bins).
#[derive(Clone, Default)]
pub(super) struct Lists {
    pub(super) buckets: Vec<Vec<u32>>,
    /// With [`Router::Cells`]: the bucket of every assigned position, and the cells'
    /// statistics (folded from the store at plan time).
    pub(super) bucket_of: Vec<u32>,
    pub(super) cells: Option<CellStats>,
}

/// One layer's lists and how far its keys are assigned.
#[derive(Clone, Default)]
pub(super) struct LayerLists {
    pub(super) heads: Vec<Lists>,
    /// Positions `0..assigned` are in the lists.
    pub(super) assigned: usize,
}

impl LayerLists {
    /// Fold the RoPE'd keys of the positions each head's cells lack (`upto..assigned`) from
    /// `store` into them (the sink's left out); `buf` is scratch.
    pub(super) fn fold_cells(&mut self, store: &dyn KvSource, head_dim: usize, buf: &mut Vec<f32>) {
        let (kv_dim, end) = (store.kv_dim(), self.assigned);
        let Some(from) = self
            .heads
            .iter()
            .filter_map(|h| h.cells.as_ref().map(CellStats::upto))
            .min()
        else {
            return;
        };
        if from >= end {
            return;
        }
        buf.resize((end - from) * kv_dim, 0.0);
        read_f32(store, false, head_dim, from, buf);
        for (h, head) in self.heads.iter_mut().enumerate() {
            let off = h * head_dim;
            let Some(cells) = head.cells.as_mut() else {
                continue;
            };
            for p in cells.upto()..end {
                let row = &buf[(p - from) * kv_dim + off..][..head_dim];
                cells.add(p, head.bucket_of[p], (p >= SINKS).then_some(row));
            }
        }
    }
}
