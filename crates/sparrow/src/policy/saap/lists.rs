//! Saap's record of where each key went: per sparse layer and KV head, the bucket
//! routers' inverted lists (the positions each bucket holds, ascending), or the cells
//! router's bucket of every position with the cells' statistics ([`CellStats`]) kept up to
//! date from the store.
//!
//! The cells router keeps no lists: a cell's place among its bucket's entries comes from
//! the cells' counts ([`CellStats::entries`]), a store that keeps the layer by bucket serves
//! a complete segment's entries itself, and only the segment the window starts in is
//! sorted by bucket at each step ([`CellPositions`]). Where the store keeps the layer by
//! position (`--saap-layout positions`, or a replay over a store shared by several
//! policies) each complete segment's positions are sorted by bucket once, as it completes
//! ([`CellLists::sort_segments`]): two bytes a position, where lists took four and more.

use super::cells::CellStats;
use super::settings::SINKS;
use sparrow_attn::kernel::{read_f32, KvSource};
use sparrow_attn::policy::sort_by_bin;

/// What one (layer, KV head) knows of its keys' buckets.
#[derive(Clone, Default)]
pub(super) struct Lists {
    /// Bucket routers: per bucket, the positions whose key it holds, ascending (a store
    /// that keeps the layer by bucket holds the same entries, in the same order, in its
    /// bins). Empty with [`Router::Cells`](super::Router::Cells).
    pub(super) buckets: Vec<Vec<u32>>,
    /// With [`Router::Cells`](super::Router::Cells).
    pub(super) cells: Option<CellLists>,
}

/// The cells router's state of one (layer, KV head).
#[derive(Clone)]
pub(super) struct CellLists {
    /// The cells' statistics, folded from the store at plan time.
    pub(super) stats: CellStats,
    /// The bucket of every assigned position (what the cells fold, what a rewind refolds,
    /// what a segment is sorted by).
    pub(super) bucket_of: Vec<u16>,
    /// Only where the store keeps the layer by position: each complete segment's
    /// positions but the sinks, as offsets in the segment, by bucket then position
    /// (`segment` per segment), and where each bucket starts (`C + 1` per segment).
    sorted: Vec<u16>,
    sorted_starts: Vec<u32>,
}

impl CellLists {
    pub(super) fn new(stats: CellStats) -> CellLists {
        CellLists {
            stats,
            bucket_of: Vec::new(),
            sorted: Vec::new(),
            sorted_starts: Vec::new(),
        }
    }

    fn clusters(&self) -> usize {
        self.stats.clusters()
    }

    /// Segments sorted by [`Self::sort_segments`].
    fn sorted_segments(&self) -> usize {
        self.sorted_starts.len() / (self.clusters() + 1)
    }

    /// Sort every complete segment not sorted yet (a store that keeps the layer by position
    /// cannot serve a cell's entries; these can).
    pub(super) fn sort_segments(&mut self) {
        let (seg, c) = (self.stats.segment(), self.clusters());
        let complete = self.bucket_of.len() / seg;
        for s in self.sorted_segments()..complete {
            let from = (s * seg).max(SINKS);
            let buckets = &self.bucket_of[from..(s + 1) * seg];
            let starts_at = self.sorted_starts.len();
            self.sorted_starts.resize(starts_at + c + 1, 0);
            let at = self.sorted.len();
            self.sorted.resize(at + seg, 0);
            let sorted = &mut self.sorted[at..];
            let mut next = Vec::new();
            sort_by_bin(
                buckets,
                &mut self.sorted_starts[starts_at..],
                &mut next,
                |slot, i| {
                    sorted[slot] = (from + i - s * seg) as u16;
                },
            );
        }
    }

    /// The positions of cell (`s`, `b`) of a sorted segment, ascending.
    pub(super) fn sorted_cell(&self, s: usize, b: usize) -> impl Iterator<Item = usize> + '_ {
        let (seg, c) = (self.stats.segment(), self.clusters());
        assert!(
            s < self.sorted_segments(),
            "segment {s} is neither kept by bucket in the store nor sorted here"
        );
        let starts = &self.sorted_starts[s * (c + 1)..][..c + 1];
        let range = starts[b] as usize..starts[b + 1] as usize;
        self.sorted[s * seg..][range]
            .iter()
            .map(move |&o| s * seg + o as usize)
    }

    /// Forget positions from `from` on (the statistics refold `from`'s segment).
    fn forget_from(&mut self, from: usize) {
        self.stats.forget_from(from);
        self.bucket_of.truncate(from);
        let (seg, c) = (self.stats.segment(), self.clusters());
        let keep = (from / seg).min(self.sorted_segments());
        self.sorted.truncate(keep * seg);
        self.sorted_starts.truncate(keep * (c + 1));
    }
}

/// The positions of one segment's cells, sorted by bucket at a step: the segment the
/// window starts in, whose entries below the window a step may read (the store has not
/// sorted it, or has but the window cuts it).
#[derive(Clone, Default)]
pub(super) struct CellPositions {
    /// The segment, and the positions sorted (those below the window, but the sinks).
    pub(super) segment: Option<usize>,
    positions: Vec<u32>,
    /// Where each bucket starts in `positions` (`C + 1`).
    starts: Vec<u32>,
    /// Scratch: where each bucket's next position goes.
    next: Vec<u32>,
}

impl CellPositions {
    /// Sort segment `s`'s positions `from..to` by bucket (`bucket_of` every position's,
    /// `c` buckets).
    pub(super) fn sort(&mut self, s: usize, from: usize, to: usize, bucket_of: &[u16], c: usize) {
        self.segment = Some(s);
        self.starts.clear();
        self.starts.resize(c + 1, 0);
        self.positions.clear();
        self.positions.resize(to - from, 0);
        let positions = &mut self.positions;
        sort_by_bin(
            &bucket_of[from..to],
            &mut self.starts,
            &mut self.next,
            |slot, i| {
                positions[slot] = (from + i) as u32;
            },
        );
    }

    /// How many positions bucket `b` has here.
    pub(super) fn count(&self, b: usize) -> usize {
        (self.starts[b + 1] - self.starts[b]) as usize
    }

    /// Bucket `b`'s positions here, ascending.
    pub(super) fn of(&self, b: usize) -> &[u32] {
        &self.positions[self.starts[b] as usize..self.starts[b + 1] as usize]
    }
}

impl Lists {
    /// Forget positions from `from` (a block start) on.
    pub(super) fn forget_from(&mut self, from: usize) {
        for list in self.buckets.iter_mut() {
            let keep = list.partition_point(|&p| (p as usize) < from);
            list.truncate(keep);
        }
        if let Some(cells) = &mut self.cells {
            cells.forget_from(from);
        }
    }

    /// Every bucket's positions below `upto`, ascending (what the lists hold; derived from
    /// the buckets of positions with the cells router).
    #[cfg(test)]
    pub(super) fn bucket_lists(&self, clusters: usize) -> Vec<Vec<u32>> {
        match &self.cells {
            None => self.buckets.clone(),
            Some(cells) => {
                let mut lists = vec![Vec::new(); clusters];
                for (p, &b) in cells.bucket_of.iter().enumerate() {
                    lists[b as usize].push(p as u32);
                }
                lists
            }
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
            .filter_map(|h| h.cells.as_ref().map(|c| c.stats.upto()))
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
                for p in cells.stats.upto().max(at)..to {
                    let row = &buf[(p - at) * kv_dim + off..][..head_dim];
                    let bucket = u32::from(cells.bucket_of[p]);
                    cells.stats.add(p, bucket, (p >= SINKS).then_some(row));
                }
            }
            at = to;
        }
        buf.clear();
        buf.shrink_to(FOLD_CHUNK * kv_dim);
    }

    /// With the cells router over a store that keeps the layer by position: sort the
    /// segments completed since the last call.
    pub(super) fn sort_segments(&mut self) {
        for cells in self.heads.iter_mut().filter_map(|h| h.cells.as_mut()) {
            cells.sort_segments();
        }
    }
}
