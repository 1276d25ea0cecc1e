//! A read plan: what one layer's attention reads for one batch of queries, as a policy
//! states it *before* anything is read — so a store can fetch exactly those blocks
//! (a tiered store's prefetch) and one executor ([`execute`]) can run every policy through
//! the same kernel.
//!
//! A plan is a list of [`PlanEntry`]s. Each names a set of KV heads, a source (the layer's
//! store, or a small side table the policy owns, such as landmarks) and, per batch token,
//! the ascending disjoint key ranges that token's query heads read from that source. For
//! one (token, KV head), the entries' key sets must be disjoint within a source: the
//! executor merges all their partial softmaxes by log-sum-exp, so a key listed twice would
//! count twice. Causality is the policy's business: it lists only keys at or before each
//! token's position.

use crate::kernel::{
    split_keys, union, write_merged, AttnShape, BlockPartial, F32Rows, KvSource, Level, SlotView,
    Unit, BLOCK_ROWS, MIN_PIECE,
};
use std::ops::Range;

/// Where an entry's keys live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The layer's KV store (positions).
    Store,
    /// The layer's KV store read through its slots ([`KvSource::slot_keys`]): the ranges
    /// are slots of each entry KV head's arrangement (a store that keeps a head's rows by
    /// bucket serves a bucket as a few runs of slots).
    Slots,
    /// Side table `i` of the plan ([`ReadPlan::side`]; rows, not positions).
    Side(usize),
}

/// One part of a plan: for the KV heads `kv_heads`, batch token `i` reads the keys
/// `visible[i]` of `source`, each counting `weight` times in the softmax.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanEntry {
    /// KV heads the entry applies to.
    pub kv_heads: Range<usize>,
    /// Where the keys are read from.
    pub source: Source,
    /// Per batch token: ascending, disjoint key ranges (rows of the source).
    pub visible: Vec<Vec<Range<usize>>>,
    /// How many keys each key read stands for: 1 for exact attention over the keys listed;
    /// `N / m` for a uniform sample of `m` keys drawn from `N` left out of the other entries,
    /// which then estimates those keys' part of the softmax numerator and denominator
    /// (top-k alone drops that part and renormalises over the few keys kept: what loses the
    /// tasks that aggregate over the whole context). Finite and positive.
    pub weight: f32,
}

impl PlanEntry {
    /// An exact entry: for the KV heads `kv_heads`, batch token `i` reads `visible[i]` of
    /// `source`, each key once.
    pub fn exact(kv_heads: Range<usize>, source: Source, visible: Vec<Vec<Range<usize>>>) -> Self {
        PlanEntry {
            kv_heads,
            source,
            visible,
            weight: 1.0,
        }
    }
}

/// A key/value table a policy owns and a plan reads: summaries (landmarks, centroids), or
/// copies of store rows (H2O's kept rows, Saap's rows grouped by bucket), whose store
/// positions `positions` then lists row by row — so evaluation counts them as positions
/// read, and a tiered store knows it need not fetch them.
#[derive(Clone, Copy, Debug)]
pub struct SideTable<'p> {
    /// The rows.
    pub rows: SideRows<'p>,
    /// For a copy of store rows: the store position of each row.
    pub positions: Option<&'p [usize]>,
}

/// A side table's rows: small f32 tables, or any source the policy keeps (rows in the
/// store's own element type, read as the store's are).
#[derive(Clone, Copy)]
pub enum SideRows<'p> {
    /// f32 rows.
    F32(F32Rows<'p>),
    /// A source of the policy's.
    Source(&'p dyn KvSource),
}

impl<'p> From<F32Rows<'p>> for SideRows<'p> {
    fn from(rows: F32Rows<'p>) -> Self {
        SideRows::F32(rows)
    }
}

impl std::fmt::Debug for SideRows<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SideRows::F32(r) => r.fmt(f),
            SideRows::Source(s) => write!(f, "Source(kv_dim {})", s.kv_dim()),
        }
    }
}

impl SideRows<'_> {
    /// The rows as a source the kernel reads.
    pub fn source(&self) -> &dyn KvSource {
        match self {
            SideRows::F32(r) => r,
            SideRows::Source(s) => *s,
        }
    }
}

/// What one layer reads for one batch. Side tables are borrowed from the policy (`'p`).
#[derive(Clone, Debug, Default)]
pub struct ReadPlan<'p> {
    /// The entries; every (token, KV head) should be covered by at least one (a row no entry
    /// covers is written as zeros).
    pub entries: Vec<PlanEntry>,
    /// Small f32 key/value tables the policy owns.
    pub side: Vec<SideTable<'p>>,
}

impl<'p> ReadPlan<'p> {
    /// Exact causal attention: token `i` (position `pos0 + i`) reads `0..=pos0 + i` of the
    /// store, for every KV head.
    pub fn causal(shape: AttnShape, pos0: usize, n: usize) -> ReadPlan<'p> {
        let visible = (0..n)
            .map(|i| std::iter::once(0..pos0 + i + 1).collect())
            .collect();
        ReadPlan::same_for_all_heads(shape, visible)
    }

    /// A sliding window (a model's architectural mask, as Gemma's local layers): token `i`
    /// (position `pos0 + i`) reads the last `window` positions up to its own, for every KV
    /// head.
    pub fn sliding(shape: AttnShape, pos0: usize, n: usize, window: usize) -> ReadPlan<'p> {
        let visible = (0..n)
            .map(|i| {
                let end = pos0 + i + 1;
                std::iter::once(end.saturating_sub(window.max(1))..end).collect()
            })
            .collect();
        ReadPlan::same_for_all_heads(shape, visible)
    }

    /// One store entry covering every KV head, token `i` reading `visible[i]`.
    pub fn same_for_all_heads(shape: AttnShape, visible: Vec<Vec<Range<usize>>>) -> ReadPlan<'p> {
        ReadPlan {
            entries: vec![PlanEntry::exact(0..shape.n_head_kv, Source::Store, visible)],
            side: Vec::new(),
        }
    }

    /// Store positions the plan reads for batch token `token`, per KV head (sorted union of
    /// the store entries and of side rows that copy store positions): the read set a policy
    /// is evaluated by. Summaries (landmarks) are not positions and are not listed.
    pub fn store_reads(
        &self,
        store: &dyn KvSource,
        n_head_kv: usize,
        token: usize,
    ) -> Vec<Vec<Range<usize>>> {
        (0..n_head_kv)
            .map(|h| {
                let mut all = Vec::new();
                for e in self.entries.iter().filter(|e| e.kv_heads.contains(&h)) {
                    let Some(vis) = e.visible.get(token) else {
                        continue;
                    };
                    match e.source {
                        Source::Store => all.extend(vis.iter().cloned()),
                        Source::Slots => all.extend(vis.iter().flat_map(|r| {
                            r.clone().map(|s| {
                                let p = store.slot_position(h, s);
                                p..p + 1
                            })
                        })),
                        Source::Side(i) => {
                            if let Some(pos) = self.side.get(i).and_then(|t| t.positions) {
                                all.extend(
                                    vis.iter()
                                        .flat_map(|r| pos[r.clone()].iter().map(|&p| p..p + 1)),
                                );
                            }
                        }
                    }
                }
                union(all)
            })
            .collect()
    }

    /// Store keys read over the whole batch and all KV heads (each (token, head, key) once).
    pub fn store_keys_read(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e.source, Source::Store | Source::Slots))
            .map(|e| {
                let per: usize = e.visible.iter().flatten().map(|r| r.len()).sum();
                per * e.kv_heads.len()
            })
            .sum()
    }
}

/// The batch a plan runs for: its queries, and where the results go.
#[derive(Debug)]
pub struct Batch<'a> {
    /// `n × n_head × head_dim` queries, already rotated.
    pub q: &'a [f32],
    /// `n × n_head × head_dim` outputs.
    pub out: &'a mut [f32],
    /// When given, each row's log-sum-exp of its scores (`n × n_head`, `-inf` for a row
    /// that read nothing) — what a policy that tracks probabilities (H2O) needs afterwards.
    pub lse: Option<&'a mut [f32]>,
}

/// Run `plan` for `batch` over `store`: writes the batch's outputs (and log-sum-exps, when
/// asked for).
///
/// The work is cut as the dense executor cuts it ([`crate::kernel::plan_units`]): blocks of
/// [`BLOCK_ROWS`] query rows × KV head × entry, long key lists split into pieces of at
/// least [`MIN_PIECE`] keys when there are fewer than four blocks per thread; the pieces of
/// one (block, KV head) — from every entry and source — merge by log-sum-exp. A plan of one
/// store entry over all heads is therefore exactly [`crate::kernel::attend_batch`].
pub fn execute<S: KvSource + ?Sized>(
    level: Level,
    threads: usize,
    shape: AttnShape,
    store: &S,
    plan: &ReadPlan<'_>,
    batch: Batch<'_>,
) {
    let Batch { q, out, lse } = batch;
    let n = q.len() / shape.q_dim().max(1);
    if n == 0 {
        return;
    }
    let block = (BLOCK_ROWS / shape.group()).max(1);
    let n_blocks = n.div_ceil(block);
    let base = n_blocks * shape.n_head_kv;
    let target = 4 * threads.max(1);
    // (entry, unit), ordered by (block, kv head, entry, piece) so one owner's parts are
    // consecutive.
    let mut units: Vec<(usize, Unit)> = Vec::new();
    for b in 0..n_blocks {
        let tokens = b * block..((b + 1) * block).min(n);
        for kv_head in 0..shape.n_head_kv {
            for (ei, e) in plan.entries.iter().enumerate() {
                if !e.kv_heads.contains(&kv_head) {
                    continue;
                }
                let keys = union(e.visible[tokens.clone()].concat());
                let total: usize = keys.iter().map(|r| r.len()).sum();
                if total == 0 {
                    continue;
                }
                let pieces = if base >= target {
                    1
                } else {
                    target.div_ceil(base).min(total / MIN_PIECE).max(1)
                };
                for piece in split_keys(&keys, pieces) {
                    units.push((
                        ei,
                        Unit {
                            tokens: tokens.clone(),
                            kv_head,
                            keys: piece,
                        },
                    ));
                }
            }
        }
    }
    let run = |(ei, u): &(usize, Unit)| -> BlockPartial {
        let e = &plan.entries[*ei];
        let mut part = match e.source {
            Source::Store => crate::kernel::attend_block(level, shape, store, q, u, &e.visible),
            Source::Slots => {
                crate::kernel::attend_block(level, shape, &SlotView(store), q, u, &e.visible)
            }
            Source::Side(i) => crate::kernel::attend_block(
                level,
                shape,
                plan.side[i].rows.source(),
                q,
                u,
                &e.visible,
            ),
        };
        // A weight multiplies every exp-score of the entry: it shifts the partial's maxima
        // by its log, and the log-sum-exp merge carries it into numerator and denominator.
        assert!(
            e.weight.is_finite() && e.weight > 0.0,
            "a plan entry's weight must be finite and positive, not {}",
            e.weight
        );
        if e.weight != 1.0 {
            let shift = e.weight.ln();
            part.m
                .iter_mut()
                .filter(|m| m.is_finite())
                .for_each(|m| *m += shift);
        }
        part
    };
    #[cfg(feature = "parallel")]
    let parts: Vec<BlockPartial> = {
        use rayon::prelude::*;
        units.par_iter().map(run).collect()
    };
    #[cfg(not(feature = "parallel"))]
    let parts: Vec<BlockPartial> = units.iter().map(run).collect();
    let owners: Vec<(Range<usize>, usize)> = units
        .iter()
        .map(|(_, u)| (u.tokens.clone(), u.kv_head))
        .collect();
    // Rows no entry covered stay zero (and their lse -inf).
    out[..n * shape.q_dim()].fill(0.0);
    let mut lse = lse;
    if let Some(l) = lse.as_deref_mut() {
        l[..n * shape.n_head].fill(f32::NEG_INFINITY);
    }
    write_merged(shape, &owners, &parts, out, lse);
}
