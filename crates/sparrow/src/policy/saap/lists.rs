//! Saap's inverted lists: per sparse layer and KV head, the positions each bucket holds
//! (ascending), with the bucket rows ([`BucketRows`], the `buckets` layout) and the cells'
//! statistics ([`CellStats`], the `cells` router) kept up to date from the store.

use super::buckets::{BucketRows, SourceRow};
use super::cells::CellStats;
use super::settings::SINKS;
use sparrow_attn::kernel::{read_f32, KvSource};

/// The inverted lists of one (layer, KV head): per bucket, the positions whose key it
/// holds, ascending; with [`Layout::Buckets`], their rows too.
#[derive(Clone, Default)]
pub(super) struct Lists {
    pub(super) buckets: Vec<Vec<u32>>,
    /// The rows of `buckets`' positions `0..filed`, grouped by bucket.
    pub(super) rows: Option<BucketRows>,
    /// The buckets of positions `filed..assigned`, whose rows are not copied yet (a sealed
    /// block's keys come without its values: rows are copied from the store at the next
    /// plan).
    pub(super) unfiled: Vec<u32>,
    /// With [`Router::Cells`]: the bucket of every assigned position, and the cells'
    /// statistics (folded from the store at plan time, like the rows).
    pub(super) bucket_of: Vec<u32>,
    pub(super) cells: Option<CellStats>,
}

/// One layer's lists and how far its keys are assigned.
#[derive(Clone, Default)]
pub(super) struct LayerLists {
    pub(super) heads: Vec<Lists>,
    /// Positions `0..assigned` are in the lists.
    pub(super) assigned: usize,
    /// Positions `0..filed` have their rows in [`Lists::rows`].
    pub(super) filed: usize,
}

impl LayerLists {
    /// Copy the rows of positions `filed..assigned` from `store` into each head's bucket
    /// rows.
    pub(super) fn file_rows(&mut self, store: &dyn KvSource, head_dim: usize) {
        let (kv_dim, end) = (store.kv_dim(), self.assigned);
        let mut at = self.filed;
        while at < end {
            let run = store.run_len(at, end - at).max(1);
            let (k, v) = (store.key_rows(at, run), store.value_rows(at, run));
            for (h, head) in self.heads.iter_mut().enumerate() {
                let off = store.head_offset(h, head_dim);
                let Some(rows) = head.rows.as_mut() else {
                    continue;
                };
                for t in 0..run {
                    let bucket = head.unfiled[at - self.filed + t] as usize;
                    let src = SourceRow {
                        keys: &k,
                        values: &v,
                        row: t,
                        head_offset: off,
                        kv_dim,
                    };
                    rows.file(bucket, at + t, &src);
                }
            }
            at += run;
        }
        self.heads.iter_mut().for_each(|h| h.unfiled.clear());
        self.filed = end;
    }

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
        read_f32(store, false, from, buf);
        for (h, head) in self.heads.iter_mut().enumerate() {
            let off = store.head_offset(h, head_dim);
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
