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
    /// With [`Router::Cells`]: the bucket of each assigned position from `bucket_of_from`
    /// on (what the cells have still to fold, and the segment they fold into, which a
    /// rewind refolds), and the cells' statistics (folded from the store at plan time).
    pub(super) bucket_of: Vec<u32>,
    pub(super) bucket_of_from: usize,
    pub(super) cells: Option<CellStats>,
}

impl Lists {
    /// Forget positions from `from` (a block start), and have the buckets of the positions
    /// the cells will fold again (their segment's, from `refold`) at hand: kept, or found
    /// again in the lists when they had been dropped.
    pub(super) fn forget_from(&mut self, from: usize, refold: usize) {
        for list in self.buckets.iter_mut() {
            let keep = list.partition_point(|&p| (p as usize) < from);
            list.truncate(keep);
        }
        self.bucket_of
            .truncate(from.saturating_sub(self.bucket_of_from));
        if refold < self.bucket_of_from {
            let mut again = vec![0u32; from.max(refold) - refold];
            for (b, list) in self.buckets.iter().enumerate() {
                let first = list.partition_point(|&p| (p as usize) < refold);
                for &p in &list[first..] {
                    again[p as usize - refold] = b as u32;
                }
            }
            self.bucket_of = again;
            self.bucket_of_from = refold;
        }
    }
}

/// Positions folded into the cells per read of the store.
const FOLD_CHUNK: usize = 1024;

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
        // A chunk at a time: the first decode step after a long prefill folds the whole
        // prompt, and its keys in f32 at once would be a transient as large as the layer.
        let mut at = from;
        while at < end {
            let to = (at + FOLD_CHUNK).min(end);
            buf.resize((to - at) * kv_dim, 0.0);
            read_f32(store, false, head_dim, at, buf);
            for (h, head) in self.heads.iter_mut().enumerate() {
                let off = h * head_dim;
                let Some(cells) = head.cells.as_mut() else {
                    continue;
                };
                for p in cells.upto().max(at)..to {
                    let row = &buf[(p - at) * kv_dim + off..][..head_dim];
                    let bucket = head.bucket_of[p - head.bucket_of_from];
                    cells.add(p, bucket, (p >= SINKS).then_some(row));
                }
            }
            at = to;
        }
        // Only the open segment's buckets stay (a rewind refolds it).
        for head in &mut self.heads {
            if let Some(cells) = &head.cells {
                let keep_from = cells.open_start().max(head.bucket_of_from);
                head.bucket_of.drain(..keep_from - head.bucket_of_from);
                head.bucket_of_from = keep_from;
            }
        }
        buf.clear();
        buf.shrink_to(FOLD_CHUNK * kv_dim);
    }
}
