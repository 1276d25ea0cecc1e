//! Saap (asymmetric partitions with a trained query classifier) for decode.
//!
//! Keys and queries follow different distributions, so instead of searching the keys with
//! the query, the *de-roped* keys (RoPE undone: position no longer colours them) are
//! partitioned by k-means trained offline, and a small trained classifier (the Q-model)
//! maps a de-roped query to the buckets that hold its attention mass
//! ([`crate::saap::SaapIndex`], built by `sparrow saap train`).
//!
//! As each KV block is sealed its keys are de-roped and appended to their bucket's
//! inverted list (positions, ascending). A decode step runs the Q-model on every query
//! head of a GQA group, sums the group's distributions (the paper's batched queries), and
//! reads the positions of the top-`probes` buckets plus a dense sink (position 0) and the
//! recent `window` positions, merged by log-sum-exp in the executor. Layer 0 stays dense
//! (as the paper: its attention is spread out); `--dense-layers` changes that. A rewind
//! prunes the lists.
//!
//! The same index read without its Q-model — the query picking buckets by its own
//! similarity to the centroids, plain k-means as in the paper's baseline — is the `kmeans`
//! policy ([`super::kmeans`]).
//!
//! The default router (`--saap-router cells`) keeps the partition but not the bucket
//! ranking: each bucket is split by position segment (8 × C positions by default) into
//! cells ([`crate::saap::cells`]), and a step reads the cells whose live statistics (the
//! longest RoPE'd key, and the count and mean of the others) promise the most mass for the
//! group's summed query — direction from the partition, locality from the segments. The
//! Q-model routers above remain (`--saap-router hedged` or `qmodel`).

use super::oracle::group_key_mass;
use super::{AttentionChoice, PolicyEntry, SettingsType};
use crate::model::rope::Rope;
use crate::saap::buckets::BucketRows;
use crate::saap::cells::CellStats;
pub use crate::saap::index::Router;
use crate::saap::index::{prior_scale, HeadModel, RouterCopy, RouterWeights, Scratch};
use crate::saap::{default_index_path, SaapIndex};
use rayon::prelude::*;
use sparrow_attn::kernel::{read_f32, runs, union, KvSource, Level};
use sparrow_attn::policy::{
    KeysView, PlanContext, PlanEntry, ReadPlan, SideRows, SideTable, Source, SparsePolicy,
};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

/// The registry's entry: a decode policy.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "saap",
    summary: "decode: buckets of de-roped keys chosen by a trained query classifier",
    prefill: false,
    decode: true,
    build: |b| {
        let s = settings(b.choice, None)?;
        let index = load_index(&s, b.model)?;
        Ok(Box::new(SaapAttention::new(s, index, Rope::of(b.model))?))
    },
    check: |c| settings(c, None).map(|s| format!("{s:?}")),
    settings: SettingsType::of::<SaapSettings>(),
};

/// The precision of the router matrices a decode step reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum RouterPrecision {
    /// Q8_0 copies (ggml's 8-bit blocks) of the centroids and the Q-model's output layer,
    /// made when the policy is built: a quarter of the bytes per token
    /// ([`crate::saap::RouterCopy`]).
    Q8,
    /// The index's f32 matrices, as trained.
    F32,
}

/// Where a decode step reads the chosen buckets' rows from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Layout {
    /// A copy of every sparse layer's keys and values grouped by bucket (the paper's
    /// inverted file): a bucket is read as a few contiguous runs. Costs a second copy of the
    /// sparse layers' KV rows in RAM.
    Buckets,
    /// The store's rows where they lie, one scattered row per position: no extra memory.
    Positions,
}

/// Saap's settings.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct SaapSettings {
    /// Saap: the trained index (`sparrow saap train`) [default: the model's index in the
    /// sparrow cache, where `sparrow saap train` puts it].
    #[cfg_attr(feature = "cli", arg(id = "SAAP_INDEX", long = "saap-index", help_heading = crate::policy::HELP_HEADING))]
    pub index: Option<PathBuf>,
    /// Saap: a fixed number of buckets each decode query visits per KV head (ℓ), instead
    /// of `--saap-budget`.
    #[cfg_attr(feature = "cli", arg(id = "SAAP_PROBES", long = "saap-probes", help_heading = crate::policy::HELP_HEADING))]
    pub probes: Option<usize>,
    /// Saap: each decode query visits the top buckets, in rank order, that fit in this
    /// share of the context (⌈F·n⌉ positions of `n`, sink and window included; at least
    /// one bucket; 0 < F ≤ 1).
    /// A fixed count of buckets reads a share that varies with the prompt and the length
    /// (which buckets a query favours, and how full they are); a share keeps the read fixed.
    #[cfg_attr(feature = "cli", arg(id = "SAAP_BUDGET", long = "saap-budget", default_value_t = SaapSettings::default().budget, help_heading = crate::policy::HELP_HEADING))]
    pub budget: f64,
    /// Saap: at most this many positions per decode query (sink and window included), however
    /// long the context; 0 for none. What a query attends to does not grow with the context
    /// as a share does (5% is 1,600 positions at 32K, 6,400 at 128K); the default is Quest's
    /// default budget, so the two read alike at long contexts.
    #[cfg_attr(feature = "cli", arg(id = "SAAP_MAX_READ", long = "saap-max-read", default_value_t = SaapSettings::default().max_read, help_heading = crate::policy::HELP_HEADING))]
    pub max_read: usize,
    /// Saap: how a query ranks the buckets: the Q-model hedged by the centroid router, the
    /// Q-model alone (the paper), the centroids alone (as `--attn kmeans`), or no bucket
    /// ranking but the buckets' positional cells (`--saap-segment`) by their live keys.
    #[cfg_attr(feature = "cli", arg(id = "SAAP_ROUTER", long = "saap-router", value_enum, default_value_t = SaapSettings::default().router, help_heading = crate::policy::HELP_HEADING))]
    pub router: Router,
    /// Saap: the precision of the router's matrices at decode (the centroids and the
    /// Q-model's output layer; keys are assigned to buckets against the f32 centroids
    /// either way).
    #[cfg_attr(feature = "cli", arg(id = "SAAP_ROUTER_WEIGHTS", long = "saap-router-weights", value_enum, default_value_t = SaapSettings::default().router_weights, help_heading = crate::policy::HELP_HEADING))]
    pub router_weights: RouterPrecision,
    /// Saap: rank the buckets by the attention mass their keys really receive (every key
    /// scored exactly): how much any router could capture with this partition at this
    /// budget. A measurement (`eval attention`), not a policy: it reads every key.
    #[cfg_attr(feature = "cli", arg(id = "SAAP_ORACLE", long = "saap-oracle", help_heading = crate::policy::HELP_HEADING))]
    pub oracle: bool,
    /// Saap: where the chosen buckets' rows are read from: a copy grouped by bucket
    /// (contiguous reads, the sparse layers' KV held twice) or the store's scattered rows.
    #[cfg_attr(feature = "cli", arg(id = "SAAP_LAYOUT", long = "saap-layout", value_enum, default_value_t = SaapSettings::default().layout, help_heading = crate::policy::HELP_HEADING))]
    pub layout: Layout,
    /// Saap: positions per segment of `--saap-router cells` (each bucket is split into one
    /// cell per segment) [default: 8 × the index's buckets C, 2,048 at the default C =
    /// 256]. 8 × C leaves ~8 keys per cell at any length and any C: `n/8` cells to score
    /// per KV head (two rows each: the longest key and the others' mean). 1,024 buckets at
    /// 4 × C route about as well but score twice the cells; 128 buckets lost a 32K needle's
    /// last digit (docs/long-context.md, "Fewer buckets, shorter segments", "A cell's
    /// longest key" and "256 buckets by default").
    #[cfg_attr(feature = "cli", arg(id = "SAAP_SEGMENT", long = "saap-segment", help_heading = crate::policy::HELP_HEADING))]
    pub segment: Option<usize>,
    /// Saap: recent positions always read (the dense window beside the sink, position 0).
    #[cfg_attr(feature = "cli", arg(id = "SAAP_WINDOW", long = "saap-window", default_value_t = SaapSettings::default().window, help_heading = crate::policy::HELP_HEADING))]
    pub window: usize,
    /// Positions per sealed block (set by `--kv-block`).
    #[cfg_attr(feature = "cli", arg(skip = 16usize))]
    pub block: usize,
    /// Layers that always use exact attention (set by `--dense-layers`).
    #[cfg_attr(feature = "cli", arg(skip = vec![0usize]))]
    pub dense_layers: Vec<usize>,
}

impl Default for SaapSettings {
    /// 5% of the context per sparse layer, at most 1,024 positions (sink, 63 recent
    /// positions, and the top cells that fit), routed by positional cells of 8 keys over
    /// the default 256 buckets: every needle of the 8K/16K/32K grid full attention
    /// answers, and cells capture more attention mass than the trained router, plain
    /// k-means or Quest at equal reads, for less cost than the trained router (at 32K it
    /// decodes at 1.2× Quest's speed; docs/long-context.md, "Positional cells", "Fewer
    /// buckets, shorter segments", "A cell's longest key", "256 buckets by default"); a
    /// fixed 32 of 1,024 buckets read ~4% at 8K but ~2.2% at 32K and lost a needle. The
    /// paper's 1 + 2047 window would alone be 25% at 8K; it reports 1 + 63 performing about
    /// the same.
    fn default() -> Self {
        SaapSettings {
            index: None,
            probes: None,
            budget: 0.05,
            max_read: 1024,
            router: Router::Cells,
            router_weights: RouterPrecision::Q8,
            oracle: false,
            layout: Layout::Buckets,
            segment: None,
            window: 63,
            block: 16,
            dense_layers: vec![0],
        }
    }
}

/// Positions always read at the start (the attention sink).
const SINKS: usize = 1;

/// Keys per cell of the cells router's default segment (8 × C positions): `n/8` cells to
/// score per KV head at any length. Over 256 buckets, 8 route as well as 4 over 1,024 for
/// half the cells (docs/long-context.md, "256 buckets by default").
pub const KEYS_PER_CELL: usize = 8;

/// Buckets ranked before a budgeted step starts taking them (more only when all fit).
const RANKED: usize = 128;

/// Cells ranked at least before a step starts taking them (more only when all fit).
const MIN_RANKED_CELLS: usize = 64;

impl SaapSettings {
    /// Positions per segment of the cells router over an index of `clusters` buckets:
    /// `--saap-segment`, else [`KEYS_PER_CELL`] × `clusters`.
    pub fn segment_for(&self, clusters: usize) -> usize {
        self.segment
            .unwrap_or(KEYS_PER_CELL * clusters.max(1))
            .max(1)
    }

    /// Positions a budgeted query of a context of `n` may read, sink and window included:
    /// the budget's share of `n`, at most `max_read` (if set).
    fn read_limit(&self, n: usize) -> usize {
        let share = (self.budget * n as f64).ceil() as usize;
        match self.max_read {
            0 => share,
            cap => share.min(cap),
        }
    }

    /// Checks the settings, naming the bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.probes == Some(0) {
            return Err("saap probes 0 is out of range (at least 1 bucket)".into());
        }
        if !(self.budget > 0.0 && self.budget <= 1.0) {
            return Err(format!(
                "saap budget {} is out of range (a share of the context, 0 < F ≤ 1)",
                self.budget
            ));
        }
        if self.block == 0 || self.block > 4096 {
            return Err(format!(
                "saap block size {} is out of range (1..=4096 tokens)",
                self.block
            ));
        }
        if self.segment == Some(0) {
            return Err("saap segment 0 is out of range (at least 1 position)".into());
        }
        if self.router == Router::Cells && self.probes.is_some() {
            return Err(
                "saap probes count whole buckets, which the cells router (the default) does not rank: use --saap-budget, or a bucket router (--saap-router hedged, qmodel or centroids)"
                    .into(),
            );
        }
        if self.router == Router::Cells && self.oracle {
            return Err(
                "the bucket oracle ranks whole buckets, not the cells router's cells".into(),
            );
        }
        if self.window < self.block {
            return Err(format!(
                "saap window {} is out of range: it must hold at least one block ({} tokens), since keys join their buckets as blocks are sealed",
                self.window, self.block
            ));
        }
        Ok(())
    }
}

/// Saap's settings with the shared `--kv-block` and `--dense-layers` applied (and `router`,
/// for a policy that fixes its own), checked.
pub(super) fn settings(
    c: &AttentionChoice,
    router: Option<Router>,
) -> Result<SaapSettings, String> {
    let mut s = c.settings::<SaapSettings>();
    s.block = c.kv_block.unwrap_or(s.block);
    s.dense_layers = c.dense_layers()?.unwrap_or(s.dense_layers);
    s.router = router.unwrap_or(s.router);
    s.validate()?;
    Ok(s)
}

/// The index named by the settings, or the model's default one.
pub(super) fn load_index(
    s: &SaapSettings,
    model: &crate::ModelConfig,
) -> Result<Arc<SaapIndex>, String> {
    let path = match &s.index {
        Some(p) => p.clone(),
        None => default_index_path(&model.fingerprint).ok_or(
            "no Saap index given and no cache directory to look in: pass --saap-index FILE",
        )?,
    };
    if s.index.is_none() && !path.exists() {
        return Err(format!(
            "no Saap index for this model at {}: train one with `sparrow saap train -m MODEL` (it goes there), or pass --saap-index FILE",
            path.display()
        ));
    }
    SaapIndex::load(&path, model)
        .map(Arc::new)
        .map_err(|e| format!("{e} ({})", path.display()))
}

/// The inverted lists of one (layer, KV head): per bucket, the positions whose key it
/// holds, ascending; with [`Layout::Buckets`], their rows too.
#[derive(Clone, Default)]
struct Lists {
    buckets: Vec<Vec<u32>>,
    /// The rows of `buckets`' positions `0..filed`, grouped by bucket.
    rows: Option<BucketRows>,
    /// The buckets of positions `filed..assigned`, whose rows are not copied yet (a sealed
    /// block's keys come without its values: rows are copied from the store at the next
    /// plan).
    unfiled: Vec<u32>,
    /// With [`Router::Cells`]: the bucket of every assigned position, and the cells'
    /// statistics (folded from the store at plan time, like the rows).
    bucket_of: Vec<u32>,
    cells: Option<CellStats>,
}

/// One layer's lists and how far its keys are assigned.
#[derive(Clone, Default)]
struct LayerLists {
    heads: Vec<Lists>,
    /// Positions `0..assigned` are in the lists.
    assigned: usize,
    /// Positions `0..filed` have their rows in [`Lists::rows`].
    filed: usize,
}

impl LayerLists {
    /// Copy the rows of positions `filed..assigned` from `store` into each head's bucket
    /// rows.
    fn file_rows(&mut self, store: &dyn KvSource, head_dim: usize) {
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
                    rows.file(bucket, at + t, &k, &v, t, off, kv_dim);
                }
            }
            at += run;
        }
        self.heads.iter_mut().for_each(|h| h.unfiled.clear());
        self.filed = end;
    }

    /// Fold the RoPE'd keys of the positions each head's cells lack (`upto..assigned`) from
    /// `store` into them (the sink's left out); `buf` is scratch.
    fn fold_cells(&mut self, store: &dyn KvSource, head_dim: usize, buf: &mut Vec<f32>) {
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

/// The Saap policy (one per sequence; the index is shared).
pub struct SaapAttention {
    settings: SaapSettings,
    index: Arc<SaapIndex>,
    rope: Rope,
    /// Per (layer, KV head), layer-major: the router matrices in Q8_0
    /// ([`RouterPrecision::Q8`]; empty with f32).
    copies: Vec<RouterCopy>,
    layers: Vec<LayerLists>,
    // Scratch, kept between calls.
    keys: Vec<f32>,
    /// With [`SaapSettings::oracle`]: every key of the layer, f32.
    all_keys: Vec<f32>,
    head_keys: Vec<f32>,
    buckets: Vec<u32>,
    scratch: Scratch,
    /// One per KV head: a decode step routes the KV heads in parallel.
    work: Vec<HeadWork>,
    /// Keys read to fold into the cells.
    fold_buf: Vec<f32>,
}

/// Scratch of one KV head's routing, kept between calls.
#[derive(Clone, Default)]
struct HeadWork {
    /// The group's de-roped query rows.
    queries: Vec<f32>,
    scratch: Scratch,
    /// Router mass per bucket.
    mass: Vec<f32>,
    /// With [`SaapSettings::oracle`]: each position's exact attention mass for the group.
    key_mass: Vec<f64>,
    /// Bucket ids, most mass first once ranked.
    order: Vec<u32>,
    /// With [`Router::Cells`]: the group's RoPE'd query rows summed, and the cells' scores.
    query_sum: Vec<f32>,
    cell_scores: Vec<(u32, f32)>,
    /// Scratch of the cells' products.
    cell_dots: Vec<f32>,
    /// The cells' scores as [`rank_key`]s, ranked.
    cell_ranks: Vec<u64>,
    /// What the step reads beside the sink and window: per chosen bucket or cell, its
    /// bucket and the range of that bucket's list entries.
    picks: Vec<(u32, Range<usize>)>,
    /// One bit per position read: the chosen buckets' positions, the sink and the window,
    /// turned into ascending ranges without sorting positions.
    marks: Vec<u64>,
}

impl SaapAttention {
    /// A policy over `index` for a model rotating by `rope`, routing by `settings.router`.
    pub fn new(settings: SaapSettings, index: Arc<SaapIndex>, rope: Rope) -> Result<Self, String> {
        settings.validate()?;
        let m = &index.meta;
        let copy = settings.layout == Layout::Buckets;
        let cells = settings.router == Router::Cells;
        let layers = (0..m.n_layer)
            .map(|l| LayerLists {
                heads: vec![
                    Lists {
                        buckets: vec![Vec::new(); m.clusters],
                        rows: (copy && !settings.dense_layers.contains(&l))
                            .then(|| BucketRows::new(m.clusters, m.head_dim)),
                        unfiled: Vec::new(),
                        bucket_of: Vec::new(),
                        cells: (cells && !settings.dense_layers.contains(&l)).then(|| {
                            CellStats::new(settings.segment_for(m.clusters), m.clusters, m.head_dim)
                        }),
                    };
                    m.n_head_kv
                ],
                assigned: 0,
                filed: 0,
            })
            .collect();
        let work = vec![HeadWork::default(); m.n_head_kv];
        let copies = match settings.router_weights {
            RouterPrecision::Q8 => index.heads.iter().map(RouterCopy::of).collect(),
            RouterPrecision::F32 => Vec::new(),
        };
        Ok(SaapAttention {
            settings,
            index,
            rope,
            copies,
            layers,
            keys: Vec::new(),
            all_keys: Vec::new(),
            head_keys: Vec::new(),
            buckets: Vec::new(),
            scratch: Scratch::default(),
            work,
            fold_buf: Vec::new(),
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &SaapSettings {
        &self.settings
    }

    fn is_dense(&self, layer: usize) -> bool {
        self.settings.dense_layers.contains(&layer) || layer >= self.layers.len()
    }
}

/// What a KV head's group reads: ascending disjoint ranges of store positions, and of
/// rows of its [`BucketRows`] (empty with [`Layout::Positions`]).
struct HeadReads {
    store: Vec<Range<usize>>,
    rows: Vec<Range<usize>>,
}

impl HeadWork {
    /// What the group of a KV head reads for a step that sees `n` positions, the window
    /// starting at `end`: the sink, the buckets `model` ranks first for the de-roped query
    /// rows in `self.queries` (their positions from the sink on and below `end`, listed in
    /// `lists`) and the window. Where every bucket is chosen, everything is read from the
    /// store in order (exactly full attention).
    fn reads(
        &mut self,
        settings: &SaapSettings,
        model: &HeadModel,
        weights: RouterWeights<'_>,
        lists: &Lists,
        end: usize,
        n: usize,
    ) -> HeadReads {
        let chosen = self.choose(settings, model, weights, lists, end, n);
        let buckets = &lists.buckets;
        if chosen == end.saturating_sub(SINKS) {
            return HeadReads {
                store: std::iter::once(0..n).collect(),
                rows: Vec::new(),
            };
        }
        let dense = || (0..SINKS.min(n)).chain(end..n);
        match &lists.rows {
            Some(rows) => {
                let mut read = Vec::new();
                for (b, entries) in &self.picks {
                    rows.rows_of(*b as usize, entries.clone(), &mut read);
                }
                HeadReads {
                    store: runs(dense()),
                    rows: union(read),
                }
            }
            None => {
                self.marks.clear();
                self.marks.resize(n.div_ceil(64), 0);
                let mut mark = |p: usize| self.marks[p / 64] |= 1 << (p % 64);
                for (b, entries) in &self.picks {
                    buckets[*b as usize][entries.clone()]
                        .iter()
                        .for_each(|&p| mark(p as usize));
                }
                dense().for_each(&mut mark);
                HeadReads {
                    store: runs(set_bits(&self.marks)),
                    rows: Vec::new(),
                }
            }
        }
    }

    /// Leaves in `self.picks` what the step reads beside the sink and window (whole buckets,
    /// or cells with [`Router::Cells`]); returns how many positions that is.
    fn choose(
        &mut self,
        settings: &SaapSettings,
        model: &HeadModel,
        weights: RouterWeights<'_>,
        lists: &Lists,
        end: usize,
        n: usize,
    ) -> usize {
        self.picks.clear();
        if let Some(cells) = &lists.cells {
            // The group's mean logit: the summed query over the group size and √head_dim.
            let group = self.queries.len() / self.query_sum.len().max(1);
            let scale = prior_scale(model.head_dim()) / group.max(1) as f32;
            let target = budget_target(settings, end, n);
            return self.choose_cells(cells, &lists.buckets, scale, end, target);
        }
        let got = self.choose_buckets(settings, model, weights, lists, end, n);
        let buckets = &lists.buckets;
        self.picks.extend(
            self.order
                .iter()
                .map(|&b| (b, readable(&buckets[b as usize], end))),
        );
        got
    }

    /// Scores every cell of the segments below `end` for the group's summed query and picks
    /// the top ones that fit in `target` positions (at least one), each cell's list entries
    /// from the sink on and below `end`; returns how many positions they hold.
    fn choose_cells(
        &mut self,
        cells: &CellStats,
        buckets: &[Vec<u32>],
        scale: f32,
        end: usize,
        target: usize,
    ) -> usize {
        let (q, dots) = (&self.query_sum, &mut self.cell_dots);
        cells.score(q, scale, end, dots, &mut self.cell_scores);
        // Highest first (NaN, a broken activation, last), as integers: a step ranks
        // thousands of cells per layer and KV head.
        let ranks = &mut self.cell_ranks;
        ranks.clear();
        ranks.extend(self.cell_scores.iter().map(|&(c, s)| rank_key(s, c)));
        // Rank only as far as the budget usually reaches — twice the cells of an average
        // size it holds — and the rest only if all of those fit.
        let average = end.max(1) as f64 / ranks.len().max(1) as f64;
        let reach = (2.0 * target as f64 / average) as usize;
        let mut sorted = ranks.len().min(reach.max(MIN_RANKED_CELLS));
        if sorted < ranks.len() {
            ranks.select_nth_unstable(sorted - 1);
        }
        ranks[..sorted].sort_unstable();
        let mut got = 0;
        let mut take = 0;
        while take < ranks.len() {
            if take == sorted {
                ranks[sorted..].sort_unstable();
                sorted = ranks.len();
            }
            let cell = ranks[take] as u32;
            let (_, b) = cells.cell(cell);
            let span = cells.span(cell);
            let list = &buckets[b];
            let lo = list.partition_point(|&p| (p as usize) < span.start.max(SINKS));
            let hi = list.partition_point(|&p| (p as usize) < span.end.min(end));
            let len = hi.saturating_sub(lo);
            if take > 0 && got + len > target {
                break;
            }
            if len > 0 {
                self.picks.push((b as u32, lo..hi));
            }
            got += len;
            take += 1;
        }
        got
    }

    /// Ranks the buckets by `model`'s router (reading `weights`) for the query rows in
    /// `self.queries` and leaves in `self.order` those the step reads (a fixed count, or the
    /// top ones that fit the budget); returns how many positions they hold below `end`.
    fn choose_buckets(
        &mut self,
        settings: &SaapSettings,
        model: &HeadModel,
        weights: RouterWeights<'_>,
        lists: &Lists,
        end: usize,
        n: usize,
    ) -> usize {
        let c = model.clusters();
        self.mass.clear();
        self.mass.resize(c, 0.0);
        let (q, scratch, mass) = (&self.queries, &mut self.scratch, &mut self.mass);
        if settings.oracle {
            for (m, list) in mass.iter_mut().zip(&lists.buckets) {
                let keys = &list[readable(list, end)];
                *m = keys.iter().map(|&p| self.key_mass[p as usize]).sum::<f64>() as f32;
            }
        } else {
            model.add_mass(settings.router, weights, Level::active(), q, scratch, mass);
        }
        let size = |b: u32| readable(&lists.buckets[b as usize], end).len();
        let mass = &self.mass;
        // Most mass first; NaN (a broken activation) ranks last.
        let key = |b: u32| {
            let m = mass[b as usize];
            if m.is_nan() {
                f32::NEG_INFINITY
            } else {
                m
            }
        };
        self.order.clear();
        self.order.extend(0..c as u32);
        if let Some(probes) = settings.probes {
            let probes = probes.min(c);
            if probes < c {
                self.order
                    .select_nth_unstable_by(probes - 1, |&a, &b| key(b).total_cmp(&key(a)));
                self.order.truncate(probes);
            }
            return self.order.iter().map(|&b| size(b)).sum();
        }
        let target = budget_target(settings, end, n);
        // Rank only as far as a budget usually reaches: the top `RANKED` first, the rest
        // only if all of those fit.
        let by_mass = |a: &u32, b: &u32| key(*b).total_cmp(&key(*a));
        let mut sorted = c.min(RANKED);
        if sorted < c {
            self.order.select_nth_unstable_by(sorted - 1, by_mass);
        }
        self.order[..sorted].sort_unstable_by(by_mass);
        // The top buckets that fit (at least one).
        let (mut got, mut take) = (0, 0);
        while take < c {
            if take == sorted {
                self.order[sorted..].sort_unstable_by(by_mass);
                sorted = c;
            }
            let len = size(self.order[take]);
            if take > 0 && got + len > target {
                break;
            }
            got += len;
            take += 1;
        }
        self.order.truncate(take);
        got
    }
}

/// A key that sorts cell `cell` of score `score` ascending by score descending, then by
/// cell: the score's bits made order-preserving as an unsigned integer (NaN as −∞) and
/// inverted, above the cell id.
fn rank_key(score: f32, cell: u32) -> u64 {
    let score = if score.is_nan() {
        f32::NEG_INFINITY
    } else {
        score
    };
    let bits = score.to_bits();
    let ordered = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    };
    (u64::from(!ordered) << 32) | u64::from(cell)
}

/// Positions a step that sees `n` may read beyond the sink and the window (which starts at
/// `end`): its read limit less that dense part.
fn budget_target(settings: &SaapSettings, end: usize, n: usize) -> usize {
    let dense = SINKS + (n - end);
    settings.read_limit(n).saturating_sub(dense)
}

/// The router matrices of head `i` (layer-major), `model`: its Q8_0 copy if `copies` holds
/// one, else the index's f32 ones.
fn router_weights<'a>(
    copies: &'a [RouterCopy],
    model: &'a HeadModel,
    i: usize,
) -> RouterWeights<'a> {
    match copies.get(i) {
        Some(copy) => copy.weights(model),
        None => model.weights(),
    }
}

/// The entries of a bucket's `list` (ascending positions) from the sinks on and below
/// `end`.
fn readable(list: &[u32], end: usize) -> Range<usize> {
    let from = list.partition_point(|&p| (p as usize) < SINKS);
    from..list.partition_point(|&p| (p as usize) < end).max(from)
}

/// The positions of the set bits of `marks` (bit `p % 64` of word `p / 64`), ascending.
fn set_bits(marks: &[u64]) -> impl Iterator<Item = usize> + '_ {
    marks.iter().enumerate().flat_map(|(i, &word)| {
        let mut w = word;
        std::iter::from_fn(move || {
            (w != 0).then(|| {
                let bit = w.trailing_zeros() as usize;
                w &= w - 1;
                i * 64 + bit
            })
        })
    })
}

impl SparsePolicy for SaapAttention {
    fn name(&self) -> &str {
        if self.settings.oracle {
            return "bucket-oracle";
        }
        match self.settings.router {
            Router::Hedged | Router::Qmodel => "saap",
            Router::Centroids => "kmeans",
            Router::Cells => "saap-cells",
        }
    }

    fn supports_prefill(&self) -> bool {
        false
    }

    fn requires_block_selection(&self) -> bool {
        true
    }

    fn block_size(&self) -> Option<usize> {
        Some(self.settings.block)
    }

    fn on_block_sealed(&mut self, layer: usize, block: usize, keys: KeysView<'_>) {
        if self.is_dense(layer) {
            return;
        }
        let start = block * self.settings.block;
        let lists = &self.layers[layer];
        if start < lists.assigned {
            // Already in the lists (sealed again without a rewind in between).
            return;
        }
        if start > lists.assigned {
            // Blocks arrive in order from the last rewind; a gap is a bug upstream. Skipping
            // keeps the lists sorted (the missing positions stay readable in the window only).
            debug_assert_eq!(start, lists.assigned, "blocks are sealed in order");
            return;
        }
        let (hd, kv) = (keys.head_dim(), keys.kv_heads());
        // De-rope the block's keys, then assign each KV head's in one product.
        self.keys.clear();
        self.keys.extend_from_slice(keys.as_slice());
        for (row, k) in self.keys.chunks_exact_mut(kv * hd).enumerate() {
            self.rope.unrotate(k, hd, start + row);
        }
        for h in 0..kv {
            self.head_keys.clear();
            for k in self.keys.chunks_exact(kv * hd) {
                self.head_keys.extend_from_slice(&k[h * hd..(h + 1) * hd]);
            }
            self.index.head(layer, h).assign(
                Level::active(),
                &self.head_keys,
                &mut self.scratch,
                &mut self.buckets,
            );
            let head = &mut self.layers[layer].heads[h];
            for (row, &b) in self.buckets.iter().enumerate() {
                head.buckets[b as usize].push((start + row) as u32);
            }
            if head.cells.is_some() {
                head.bucket_of.extend_from_slice(&self.buckets);
            }
            if head.rows.is_some() {
                head.unfiled.extend_from_slice(&self.buckets);
            }
        }
        self.layers[layer].assigned = start + keys.rows();
    }

    fn forget_from(&mut self, pos: usize) {
        // Blocks are re-sealed whole, so forget from the start of the block `pos` is in.
        let from = pos / self.settings.block * self.settings.block;
        for layer in &mut self.layers {
            if layer.assigned <= from {
                continue;
            }
            for head in &mut layer.heads {
                for (b, list) in head.buckets.iter_mut().enumerate() {
                    let keep = list.partition_point(|&p| (p as usize) < from);
                    list.truncate(keep);
                    if let Some(rows) = head.rows.as_mut() {
                        rows.truncate(b, keep);
                    }
                }
                head.unfiled.truncate(from.saturating_sub(layer.filed));
                head.bucket_of.truncate(from);
                if let Some(cells) = head.cells.as_mut() {
                    cells.forget_from(from);
                }
            }
            layer.filed = layer.filed.min(from);
            layer.assigned = from;
        }
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let (shape, n) = (ctx.shape, ctx.pos0 + 1);
        if self.is_dense(ctx.layer) {
            return ReadPlan::causal(shape, ctx.pos0, ctx.n_tokens());
        }
        let hd = shape.head_dim;
        // Rows are copied while prefill plans too, so the first decode step does not copy
        // the whole prompt's.
        self.layers[ctx.layer].file_rows(ctx.store, hd);
        self.layers[ctx.layer].fold_cells(ctx.store, hd, &mut self.fold_buf);
        let window_start = n.saturating_sub(self.settings.window);
        if ctx.n_tokens() != 1 || window_start <= SINKS {
            return ReadPlan::causal(shape, ctx.pos0, ctx.n_tokens());
        }
        // Positions the lists do not hold yet (not sealed) must lie in the window.
        debug_assert!(self.layers[ctx.layer].assigned >= window_start);
        let SaapAttention {
            settings,
            index,
            rope,
            copies,
            layers,
            work,
            all_keys,
            ..
        } = self;
        if settings.oracle {
            all_keys.resize(n * shape.kv_dim(), 0.0);
            read_f32(ctx.store, false, 0, all_keys);
        }
        let all_keys: &[f32] = all_keys;
        let lists: &'p LayerLists = &layers[ctx.layer];
        work.resize(shape.n_head_kv, HeadWork::default());
        // Routing (the Q-model's weights, 0.5 MiB per KV head at 1,024 buckets) is most of
        // the plan's cost: the KV heads route in parallel.
        let reads: Vec<HeadReads> = work
            .par_iter_mut()
            .enumerate()
            .map(|(h, w)| {
                w.queries.clear();
                w.queries.extend_from_slice(ctx.group_queries(0, h));
                if lists.heads[h].cells.is_some() {
                    w.query_sum.clear();
                    w.query_sum.resize(hd, 0.0);
                    for q in w.queries.chunks_exact(hd) {
                        w.query_sum.iter_mut().zip(q).for_each(|(s, &x)| *s += x);
                    }
                }
                if settings.oracle {
                    let q = ctx.group_queries(0, h);
                    w.key_mass = group_key_mass(q, all_keys, shape.kv_dim(), hd, h);
                }
                if lists.heads[h].cells.is_none() {
                    // The Q-model and centroids route de-roped queries; cells the RoPE'd.
                    rope.unrotate(&mut w.queries, hd, ctx.pos0);
                }
                let model = index.head(ctx.layer, h);
                let weights = router_weights(copies, model, ctx.layer * shape.n_head_kv + h);
                w.reads(settings, model, weights, &lists.heads[h], window_start, n)
            })
            .collect();
        let mut plan = ReadPlan::default();
        for (h, r) in reads.into_iter().enumerate() {
            plan.entries.push(PlanEntry {
                kv_heads: h..h + 1,
                source: Source::Store,
                visible: vec![r.store],
            });
            if let (Some(rows), false) = (&lists.heads[h].rows, r.rows.is_empty()) {
                plan.entries.push(PlanEntry {
                    kv_heads: h..h + 1,
                    source: Source::Side(plan.side.len()),
                    visible: vec![r.rows],
                });
                plan.side.push(SideTable {
                    rows: SideRows::Source(rows),
                    positions: Some(rows.positions()),
                });
            }
        }
        plan
    }

    /// The bucket lists (4 bytes per position, KV head and sparse layer), with
    /// [`Layout::Buckets`] the copied rows (estimated at f16: keys and values, 2 bytes a
    /// value, and each row's 8-byte position), and with [`Router::Cells`] the cells.
    fn summary_bytes(&self, n_ctx: usize, kv_dim: usize) -> usize {
        let sparse = (0..self.layers.len())
            .filter(|&l| !self.is_dense(l))
            .count();
        let heads = self.index.meta.n_head_kv;
        let rows = match self.settings.layout {
            Layout::Buckets => kv_dim * 2 * 2 + 8 * heads,
            Layout::Positions => 0,
        };
        // Cells: per head, a bucket id per position; per segment, C cells of two 8-bit rows
        // (the longest key, the others' mean) with their scales, a count and a logarithm;
        // and the open segment's C f32 sums and lengths.
        let cells = match self.settings.router {
            Router::Cells => {
                let (c, d) = (self.index.meta.clusters, self.index.meta.head_dim);
                let segments = n_ctx.div_ceil(self.settings.segment_for(c));
                heads * (4 * n_ctx + segments * c * (2 * d + 16) + c * (4 * d + 4))
            }
            _ => 0,
        };
        sparse * (n_ctx * (4 * heads + rows) + cells)
    }

    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        let dense = (SINKS + self.settings.window).min(n_ctx);
        let c = self.index.meta.clusters.max(1);
        let Some(probes) = self.settings.probes else {
            let limit = self.settings.read_limit(n_ctx);
            return (limit.max(dense) as f64 / n_ctx as f64).min(1.0);
        };
        let share = probes.min(c) as f64 / c as f64;
        let probed = (n_ctx - dense) as f64 * share;
        (dense as f64 + probed) / n_ctx as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend, read_set, AttnShape, DenseAttention};
    use crate::kv::{KvType, RamStore};
    use crate::synthetic::synthetic_saap_index;
    use crate::synthetic::{synthetic_config, SyntheticSpec};

    fn model() -> crate::ModelConfig {
        synthetic_config(&SyntheticSpec::default()).unwrap()
    }

    fn shape(m: &crate::ModelConfig) -> AttnShape {
        AttnShape {
            n_head: m.n_head,
            n_head_kv: m.n_head_kv,
            head_dim: m.head_dim,
        }
    }

    /// A cache of `n` positions of pseudo-random keys for every layer.
    fn cache(m: &crate::ModelConfig, n: usize) -> RamStore {
        let kv_dim = m.kv_dim();
        let mut c = RamStore::new(KvType::F32, m.n_layer, n, kv_dim);
        for l in 0..m.n_layer {
            for t in 0..n {
                let k: Vec<f32> = (0..kv_dim)
                    .map(|d| (((t * 31 + d * 7 + l * 5) % 23) as f32 - 11.0) / 7.0)
                    .collect();
                c.write(l, t, &k, &k);
            }
        }
        c
    }

    /// Feed every complete block of `cache` (positions `0..n`) to `p`, as the engine does.
    fn seal(p: &mut SaapAttention, m: &crate::ModelConfig, c: &RamStore, n: usize) {
        let (bs, kv_dim) = (p.settings.block, m.kv_dim());
        let mut keys = vec![0f32; bs * kv_dim];
        for l in 0..m.n_layer {
            for b in 0..n / bs {
                c.read_keys(l, b * bs, &mut keys);
                p.on_block_sealed(
                    l,
                    b,
                    KeysView::new(&keys, bs, m.n_head_kv, m.head_dim).unwrap(),
                );
            }
        }
    }

    fn policy(m: &crate::ModelConfig, s: SaapSettings, c: usize) -> SaapAttention {
        SaapAttention::new(s, Arc::new(synthetic_saap_index(m, c, 8, 7)), Rope::of(m)).unwrap()
    }

    /// The inverted lists equal a brute-force assignment of the de-roped keys, and a rewind
    /// leaves them as if the forgotten blocks had never been sealed.
    #[test]
    fn lists_equal_brute_force_assignment_and_rewinds_prune_them() {
        let m = model();
        let n = 200;
        let c = cache(&m, n);
        let mut p = policy(&m, SaapSettings::default(), 5);
        seal(&mut p, &m, &c, n);
        let rope = Rope::of(&m);
        let hd = m.head_dim;
        let index = p.index.clone();
        let brute = |upto: usize, layer: usize, h: usize| -> Vec<Vec<u32>> {
            let mut lists = vec![Vec::new(); 5];
            let mut k = vec![0f32; m.kv_dim()];
            for t in 0..upto {
                c.read_keys(layer, t, &mut k);
                rope.unrotate(&mut k, hd, t);
                let key = &k[h * hd..(h + 1) * hd];
                let model = index.head(layer, h);
                // Nearest by the index's own rule, scored in f64.
                let best = (0..5)
                    .max_by(|&a, &b| {
                        let s = |x: usize| {
                            key.iter()
                                .zip(&model.centroids[x * hd..(x + 1) * hd])
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                                + model.centroid_bias[x] as f64
                        };
                        s(a).total_cmp(&s(b))
                    })
                    .unwrap();
                lists[best].push(t as u32);
            }
            lists
        };
        let sealed = n / 16 * 16;
        for l in 1..m.n_layer {
            for h in 0..m.n_head_kv {
                assert_eq!(
                    p.layers[l].heads[h].buckets,
                    brute(sealed, l, h),
                    "layer {l} head {h}"
                );
            }
        }
        assert!(
            p.layers[0]
                .heads
                .iter()
                .all(|h| h.buckets.iter().all(Vec::is_empty)),
            "layer 0 is dense"
        );
        p.forget_from(70);
        for l in 1..m.n_layer {
            assert_eq!(p.layers[l].assigned, 64);
            assert_eq!(p.layers[l].heads[0].buckets, brute(64, l, 0));
        }
        seal(&mut p, &m, &c, n);
        for l in 1..m.n_layer {
            assert_eq!(p.layers[l].heads[1].buckets, brute(sealed, l, 1));
        }
    }

    /// The synthetic model, its shape, a cache of `n` positions and one decode query whose
    /// `i`-th value is `value(i)`.
    fn decode_case(
        n: usize,
        value: impl Fn(usize) -> f32,
    ) -> (crate::ModelConfig, AttnShape, RamStore, Vec<f32>) {
        let m = model();
        let sh = shape(&m);
        let c = cache(&m, n);
        let q = (0..sh.q_dim()).map(value).collect();
        (m, sh, c, q)
    }

    /// The buckets of `p`'s KV head `h` in `layer`, most mass first under its router for
    /// the decode query `q` at position `n - 1` of `c`, recomputed here (the oracle's in f64
    /// from the keys of `c`).
    fn ranked_buckets(
        p: &SaapAttention,
        m: &crate::ModelConfig,
        c: &RamStore,
        q: &[f32],
        layer: usize,
        h: usize,
        n: usize,
    ) -> Vec<usize> {
        let model = p.index.head(layer, h);
        let (group, hd) = (m.n_head / m.n_head_kv, m.head_dim);
        let mut qg = q[h * group * hd..(h + 1) * group * hd].to_vec();
        if p.settings.oracle {
            let kv_dim = m.n_head_kv * hd;
            let mut keys = vec![0f32; n * kv_dim];
            c.read_keys(layer, 0, &mut keys);
            let mut key_mass = vec![0f64; n];
            for row in qg.chunks_exact(hd) {
                let s: Vec<f64> = keys
                    .chunks_exact(kv_dim)
                    .map(|k| {
                        let k = &k[h * hd..(h + 1) * hd];
                        let dot: f64 = k.iter().zip(row).map(|(a, b)| *a as f64 * *b as f64).sum();
                        dot / (hd as f64).sqrt()
                    })
                    .collect();
                let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                key_mass
                    .iter_mut()
                    .zip(&s)
                    .for_each(|(w, x)| *w += (x - mx).exp() / z);
            }
            let end = n - p.settings.window;
            let lists = &p.layers[layer].heads[h].buckets;
            let mass: Vec<f64> = lists
                .iter()
                .map(|l| {
                    l.iter()
                        .filter(|&&x| x >= 1 && (x as usize) < end)
                        .map(|&x| key_mass[x as usize])
                        .sum()
                })
                .collect();
            let mut order: Vec<usize> = (0..mass.len()).collect();
            order.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]));
            return order;
        }
        Rope::of(m).unrotate(&mut qg, hd, n - 1);
        let mut mass = vec![0f32; model.clusters()];
        let weights = router_weights(&p.copies, model, layer * m.n_head_kv + h);
        let (level, scratch) = (Level::active(), &mut Scratch::default());
        model.add_mass(p.settings.router, weights, level, &qg, scratch, &mut mass);
        let mut order: Vec<usize> = (0..mass.len()).collect();
        order.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]));
        order
    }

    /// Probing every bucket reads everything: exact attention, bit for bit. Fewer probes
    /// read the sink, the window and the chosen buckets' positions — and nothing else.
    #[test]
    fn all_probes_equal_full_and_fewer_read_the_chosen_buckets() {
        let n = 300;
        let (m, sh, c, q) = decode_case(n, |i| ((i * 13 % 7) as f32 - 3.0) / 2.0);
        let s = SaapSettings {
            window: 32,
            probes: Some(6),
            router: Router::Hedged,
            ..Default::default()
        };
        let mut all = policy(&m, s.clone(), 6);
        seal(&mut all, &m, &c, n);
        for layer in 0..m.n_layer {
            let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            attend(&mut all, sh, &c, layer, &q, n - 1, &mut a);
            attend(&mut DenseAttention, sh, &c, layer, &q, n - 1, &mut b);
            assert_eq!(a, b, "layer {layer}");
        }
        let routers = [Router::Hedged, Router::Qmodel, Router::Centroids].map(|r| (r, false));
        for (router, oracle) in routers.into_iter().chain([(Router::Hedged, true)]) {
            let s = SaapSettings {
                probes: Some(2),
                router,
                oracle,
                ..s.clone()
            };
            reads_the_chosen_buckets(&m, &c, n, &q, s);
        }
    }

    /// The positions `s` (2 of 6 buckets) reads in layer 1 for a decode query `q` at the
    /// end of `c` (`n` positions): the sink, the window and the two buckets with the most mass under
    /// its router, recomputed here.
    fn reads_the_chosen_buckets(
        m: &crate::ModelConfig,
        c: &RamStore,
        n: usize,
        q: &[f32],
        s: SaapSettings,
    ) {
        let (sh, router) = (shape(m), s.router);
        let mut few = policy(m, s, 6);
        seal(&mut few, m, c, n);
        let layer = 1;
        let read = read_set(&mut few, sh, c, layer, q, n - 1);
        for (h, ranges) in read.iter().enumerate() {
            let got: Vec<usize> = ranges.iter().cloned().flatten().collect();
            let order = ranked_buckets(&few, m, c, q, layer, h, n);
            let mut want: Vec<usize> = order[..2]
                .iter()
                .flat_map(|&b| {
                    few.layers[layer].heads[h].buckets[b]
                        .iter()
                        .map(|&p| p as usize)
                })
                .filter(|&p| p >= 1 && p < n - 32)
                .collect();
            want.push(0);
            want.extend(n - 32..n);
            want.sort_unstable();
            assert_eq!(
                got, want,
                "{router:?}, oracle {}, head {h}",
                few.settings.oracle
            );
            assert!(
                got.len() < n,
                "two of six buckets read less than everything"
            );
        }
    }

    /// With a budget, the step reads the top buckets in rank order that fit in that share
    /// of the context (sink and window included), at least one: no more, no fewer — with
    /// few buckets, and with more than are ranked up front ([`RANKED`]).
    #[test]
    fn a_budget_reads_the_top_buckets_that_fit() {
        let n = 300;
        let (m, sh, c, q) = decode_case(n, |i| ((i * 7 % 11) as f32 - 5.0) / 3.0);
        let cases = [0.05, 0.3, 0.7, 1.0].map(|b| (b, 6)).into_iter();
        for (budget, clusters) in cases.chain([(0.7, RANKED + 72), (1.0, RANKED + 72)]) {
            let s = SaapSettings {
                window: 32,
                budget,
                router: Router::Hedged,
                ..Default::default()
            };
            let mut p = policy(&m, s, clusters);
            seal(&mut p, &m, &c, n);
            let layer = 1;
            let read = read_set(&mut p, sh, &c, layer, &q, n - 1);
            let window_start = n - 32;
            let dense = 1 + (n - window_start);
            let target = ((budget * n as f64).ceil() as usize).saturating_sub(dense);
            for (h, ranges) in read.iter().enumerate() {
                let got: Vec<usize> = ranges
                    .iter()
                    .cloned()
                    .flatten()
                    .filter(|&p| p >= 1 && p < window_start)
                    .collect();
                let order = ranked_buckets(&p, &m, &c, &q, layer, h, n);
                let bucket = |b: usize| -> Vec<usize> {
                    p.layers[layer].heads[h].buckets[b]
                        .iter()
                        .map(|&x| x as usize)
                        .filter(|&x| x >= 1 && x < window_start)
                        .collect()
                };
                // The top buckets that fit in the target, at least one.
                let (mut want, mut k) = (Vec::new(), 0);
                while k < clusters && (k == 0 || want.len() + bucket(order[k]).len() <= target) {
                    want.extend(bucket(order[k]));
                    k += 1;
                }
                want.sort_unstable();
                assert_eq!(got, want, "budget {budget}, head {h}");
                assert!(k == 1 || got.len() <= target, "budget {budget}");
                if k < clusters {
                    let next = bucket(order[k]).len();
                    assert!(
                        k == 1 || got.len() + next > target,
                        "the next one would fit"
                    );
                }
                if budget == 1.0 {
                    assert_eq!(got.len(), window_start - 1, "everything before the window");
                }
            }
        }
    }

    /// Read from the bucket-grouped copy, a step reads the same positions as from the
    /// store's rows and gets the same attention (to rounding: the keys come in another
    /// order) — after a rewind too, which prunes the copy.
    #[test]
    fn bucket_rows_read_what_the_store_rows_do() {
        let n = 300;
        let (m, sh, c, q) = decode_case(n, |i| ((i * 5 % 9) as f32 - 4.0) / 3.0);
        let layouts = |probes, budget| {
            [Layout::Buckets, Layout::Positions].map(|layout| {
                let s = SaapSettings {
                    window: 32,
                    probes,
                    budget,
                    layout,
                    router: Router::Hedged,
                    ..Default::default()
                };
                let mut p = policy(&m, s, 6);
                seal(&mut p, &m, &c, n);
                p
            })
        };
        for (probes, budget) in [(Some(1), 0.05), (Some(3), 0.05), (None, 0.3)] {
            let [mut copy, mut store] = layouts(probes, budget);
            for rewind in [None, Some(150)] {
                if let Some(at) = rewind {
                    // Plan once so rows are copied, then rewind and seal again.
                    read_set(&mut copy, sh, &c, 1, &q, n - 1);
                    for p in [&mut copy, &mut store] {
                        p.forget_from(at);
                        seal(p, &m, &c, n);
                    }
                }
                for layer in 1..m.n_layer {
                    let a = read_set(&mut copy, sh, &c, layer, &q, n - 1);
                    let b = read_set(&mut store, sh, &c, layer, &q, n - 1);
                    assert_eq!(a, b, "{probes:?} {budget} layer {layer}");
                    assert!(a
                        .iter()
                        .all(|r| r.iter().map(|r| r.len()).sum::<usize>() < n));
                    let (mut x, mut y) = (vec![0f32; q.len()], vec![0f32; q.len()]);
                    attend(&mut copy, sh, &c, layer, &q, n - 1, &mut x);
                    attend(&mut store, sh, &c, layer, &q, n - 1, &mut y);
                    for (i, (x, y)) in x.iter().zip(&y).enumerate() {
                        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{i}: {x} vs {y}");
                    }
                }
            }
            assert!(copy.summary_bytes(n, m.kv_dim()) > store.summary_bytes(n, m.kv_dim()));
        }
    }

    /// A cache of `n` positions of keys without repeats (`cache`'s repeat every 23
    /// positions, which would tie cells).
    fn distinct_cache(m: &crate::ModelConfig, n: usize) -> RamStore {
        let kv_dim = m.kv_dim();
        let mut c = RamStore::new(KvType::F32, m.n_layer, n, kv_dim);
        let mut x = 0x2545_f491u32;
        for l in 0..m.n_layer {
            for t in 0..n {
                let k: Vec<f32> = (0..kv_dim)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        (x % 4001) as f32 / 1000.0 - 2.0
                    })
                    .collect();
                c.write(l, t, &k, &k);
            }
        }
        c
    }

    /// The cells router reads the sink, the window and the top cells that fit in the budget
    /// (at least one), ranked by an f64 reference of each cell's estimated log-mass (the
    /// exponent of its longest RoPE'd key's logit for the group's summed query, plus the
    /// other keys' count times the exponent of their mean logit, in log);
    /// at a full budget, exact attention. The same after a rewind (cells refolded), from
    /// either layout, at head sizes 16 and 32.
    #[test]
    fn cells_read_the_top_cells_that_fit() {
        let n = 300;
        // The case tells a count-and-mean ranking from a slightly different one.
        let mut sensitive = false;
        let wide = SyntheticSpec {
            n_embd: 128,
            ..Default::default()
        };
        for m in [model(), synthetic_config(&wide).unwrap()] {
            let sh = shape(&m);
            let c = distinct_cache(&m, n);
            // Small enough that a cell's count weighs against its mean logit in the ranking.
            let q: Vec<f32> = (0..sh.q_dim())
                .map(|i| ((i * 7 % 11) as f32 - 5.0) / 60.0)
                .collect();
            let (hd, group, window) = (m.head_dim, m.n_head / m.n_head_kv, 32);
            let end = n - window;
            // Segments of 4: more cells than are ranked up front (MIN_RANKED_CELLS).
            let cases = [Layout::Buckets, Layout::Positions]
                .map(|l| (l, 64))
                .into_iter();
            for (layout, segment) in cases.chain([(Layout::Buckets, 4)]) {
                for budget in [0.1, 0.3, 1.0] {
                    let s = SaapSettings {
                        window,
                        budget,
                        layout,
                        router: Router::Cells,
                        segment: Some(segment),
                        ..Default::default()
                    };
                    let mut p = policy(&m, s, 6);
                    seal(&mut p, &m, &c, n);
                    for rewind in [false, true] {
                        if rewind {
                            read_set(&mut p, sh, &c, 1, &q, n - 1);
                            p.forget_from(150);
                            seal(&mut p, &m, &c, n);
                        }
                        let layer = 1;
                        let read = read_set(&mut p, sh, &c, layer, &q, n - 1);
                        let target =
                            ((budget * n as f64).ceil() as usize).saturating_sub(1 + window);
                        let mut key = vec![0f32; m.kv_dim()];
                        for (h, ranges) in read.iter().enumerate() {
                            let got: Vec<usize> = ranges
                                .iter()
                                .cloned()
                                .flatten()
                                .filter(|&x| x >= 1 && x < end)
                                .collect();
                            let qsum: Vec<f64> = (0..hd)
                                .map(|i| {
                                    (0..group).map(|g| q[(h * group + g) * hd + i] as f64).sum()
                                })
                                .collect();
                            let lists = &p.layers[layer].heads[h].buckets;
                            // Every (segment, bucket) with keys, scored from the definition.
                            let sealed = n / 16 * 16;
                            let mut cells: Vec<(f64, Vec<usize>)> = Vec::new();
                            let mut mis_scored: Vec<(f64, Vec<usize>)> = Vec::new();
                            for seg in 0..end.div_ceil(segment) {
                                for list in lists {
                                    let in_cell =
                                        |x: usize| x >= 1 && x / segment == seg && x < sealed;
                                    let all: Vec<usize> = list
                                        .iter()
                                        .map(|&x| x as usize)
                                        .filter(|&x| in_cell(x))
                                        .collect();
                                    if all.is_empty() {
                                        continue;
                                    }
                                    // Per key: its logit for the group's summed query
                                    // (over the group size and √head_dim) and its length.
                                    let scale = 1.0 / (group as f64 * (hd as f64).sqrt());
                                    let per_key: Vec<(f64, f64)> = all
                                        .iter()
                                        .map(|&x| {
                                            c.read_keys(layer, x, &mut key);
                                            let k = &key[h * hd..(h + 1) * hd];
                                            let dot: f64 = k
                                                .iter()
                                                .zip(&qsum)
                                                .map(|(&k, &q)| k as f64 * q)
                                                .sum();
                                            let norm: f64 =
                                                k.iter().map(|&k| k as f64 * k as f64).sum();
                                            (dot * scale, norm)
                                        })
                                        .collect();
                                    // The first longest key alone, the rest by their mean.
                                    let longest = (0..per_key.len())
                                        .reduce(
                                            |b, i| if per_key[i].1 > per_key[b].1 { i } else { b },
                                        )
                                        .unwrap();
                                    let rest = per_key.len() - 1;
                                    let score = |times: f64| {
                                        let one = (per_key[longest].0 * times).exp();
                                        let others = if rest == 0 {
                                            0.0
                                        } else {
                                            let sum: f64 = per_key.iter().map(|k| k.0).sum();
                                            let mean = (sum - per_key[longest].0) / rest as f64;
                                            rest as f64 * (mean * times).exp()
                                        };
                                        (one + others).ln()
                                    };
                                    let readable: Vec<usize> =
                                        all.into_iter().filter(|&x| x < end).collect();
                                    cells.push((score(1.0), readable.clone()));
                                    // Scored as a sum over the group instead of its mean.
                                    mis_scored.push((score(group as f64), readable));
                                }
                            }
                            let fill = |mut cells: Vec<(f64, Vec<usize>)>| {
                                cells.sort_by(|a, b| b.0.total_cmp(&a.0));
                                let mut want: Vec<usize> = Vec::new();
                                for (k, (_, positions)) in cells.iter().enumerate() {
                                    if k > 0 && want.len() + positions.len() > target {
                                        break;
                                    }
                                    want.extend(positions);
                                }
                                want.sort_unstable();
                                want
                            };
                            let want = fill(cells);
                            sensitive |= want != fill(mis_scored);
                            assert_eq!(
                            got, want,
                            "{layout:?} segment {segment} budget {budget} rewind {rewind} head {h}"
                        );
                            if budget < 1.0 {
                                assert!(got.len() < end - 1, "a budget reads less than everything");
                            }
                        }
                        if budget == 1.0 {
                            for layer in 0..m.n_layer {
                                let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
                                attend(&mut p, sh, &c, layer, &q, n - 1, &mut a);
                                attend(&mut DenseAttention, sh, &c, layer, &q, n - 1, &mut b);
                                assert_eq!(a, b, "full budget, layer {layer}");
                            }
                        }
                    }
                }
            }
        }
        assert!(
            sensitive,
            "the case cannot tell the group's mean logit from its sum"
        );
    }

    /// Without `--saap-segment` the cells router cuts segments of 8 × C positions, whatever
    /// C the index has: a policy at the default reads what one told 8 × C reads.
    #[test]
    fn the_default_segment_is_eight_keys_per_bucket() {
        let d = SaapSettings::default();
        assert_eq!(d.segment_for(256), 2048);
        assert_eq!(d.segment_for(1024), 8192);
        let told = SaapSettings {
            segment: Some(40),
            ..d.clone()
        };
        assert_eq!(told.segment_for(128), 40);
        let (n, m) = (300, model());
        let sh = shape(&m);
        let c = distinct_cache(&m, n);
        let q: Vec<f32> = (0..sh.q_dim())
            .map(|i| ((i * 5 % 13) as f32 - 6.0) / 50.0)
            .collect();
        let read = |segment| {
            let s = SaapSettings {
                window: 32,
                budget: 0.3,
                segment,
                ..Default::default()
            };
            let mut p = policy(&m, s, 6);
            seal(&mut p, &m, &c, n);
            read_set(&mut p, sh, &c, 1, &q, n - 1)
        };
        assert_eq!(read(None), read(Some(48)), "8 × C = 48 at C = 6");
        assert_ne!(read(None), read(Some(300)), "a segment the default is not");
    }

    /// A read limit caps the budget: a full budget capped at 90 positions reads what a 30%
    /// budget does at 300 (⌈0.3 · 300⌉ = 90), for the bucket and the cell routers, and the
    /// policy reports that share.
    #[test]
    fn the_read_limit_caps_the_budget() {
        let n = 300;
        let m = model();
        let sh = shape(&m);
        let c = distinct_cache(&m, n);
        let q: Vec<f32> = (0..sh.q_dim())
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 60.0)
            .collect();
        for router in [Router::Hedged, Router::Cells] {
            let at = |budget, max_read| {
                let s = SaapSettings {
                    window: 32,
                    budget,
                    max_read,
                    router,
                    segment: Some(64),
                    ..Default::default()
                };
                let mut p = policy(&m, s, 6);
                seal(&mut p, &m, &c, n);
                let read = read_set(&mut p, sh, &c, 1, &q, n - 1);
                (read, p.fraction_read(n))
            };
            let (share, share_fraction) = at(0.3, 0);
            let (capped, capped_fraction) = at(1.0, 90);
            let (uncapped, _) = at(1.0, 0);
            assert_eq!(capped, share, "{router:?}");
            assert_ne!(capped, uncapped, "{router:?}: the cap changes the read");
            assert_eq!(capped_fraction, share_fraction);
            assert_eq!(capped_fraction, 90.0 / n as f64);
        }
    }

    /// Rank keys sort as scores descending (an f64-free reference: the scores' own order,
    /// NaN last), ties by cell.
    #[test]
    fn rank_keys_sort_by_score_descending_then_cell() {
        let scores = [
            0.5,
            -0.0,
            0.0,
            -3.25,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-30,
            -1e-30,
            0.5,
            7.0,
            -f32::NAN,
        ];
        let mut keys: Vec<u64> = (0..scores.len() as u32)
            .map(|c| rank_key(scores[c as usize], c))
            .collect();
        keys.sort_unstable();
        let got: Vec<u32> = keys.iter().map(|&k| k as u32).collect();
        let mut want: Vec<u32> = (0..scores.len() as u32).collect();
        let value = |c: u32| {
            let s = scores[c as usize];
            if s.is_nan() {
                f64::NEG_INFINITY
            } else {
                s as f64
            }
        };
        // -0.0 and 0.0 differ by bits, as `total_cmp` orders them.
        want.sort_by(|&a, &b| {
            let (x, y) = (scores[a as usize], scores[b as usize]);
            value(b)
                .total_cmp(&value(a))
                .then(if x == 0.0 && y == 0.0 {
                    y.total_cmp(&x)
                } else {
                    std::cmp::Ordering::Equal
                })
                .then(a.cmp(&b))
        });
        assert_eq!(got, want);
    }

    #[test]
    fn settings_are_checked() {
        let mut s = SaapSettings::default();
        assert!(s.validate().is_ok());
        s.probes = Some(0);
        assert!(s.validate().unwrap_err().contains("probes"));
        for budget in [0.0, -0.1, 1.5, f64::NAN] {
            let s = SaapSettings {
                budget,
                ..Default::default()
            };
            assert!(s.validate().unwrap_err().contains("budget"), "{budget}");
        }
        let s = SaapSettings {
            window: 8,
            ..Default::default()
        };
        assert!(s.validate().unwrap_err().contains("window"));
        let cells = SaapSettings {
            router: Router::Cells,
            ..Default::default()
        };
        assert!(cells.validate().is_ok());
        for bad in [
            SaapSettings {
                segment: Some(0),
                ..cells.clone()
            },
            SaapSettings {
                probes: Some(4),
                ..cells.clone()
            },
            SaapSettings {
                oracle: true,
                ..cells.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        // A missing index is refused at build with what to do about it.
        let choice = AttentionChoice::named("saap").with(SaapSettings {
            index: Some("/nonexistent/x.saap".into()),
            ..Default::default()
        });
        let e = choice.build(&model()).err().unwrap();
        assert!(e.contains("/nonexistent/x.saap"), "{e}");
    }
}
