//! Saap's settings (`--saap-*`), their checks, and the index they name.

use super::super::AttentionChoice;
pub use crate::saap::index::Router;
use crate::saap::{default_index_path, SaapIndex};
use std::path::PathBuf;
use std::sync::Arc;

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
    /// The store keeps every sparse layer's sealed keys and values grouped by bucket (the
    /// paper's inverted file, as the only copy): a bucket is read as a few contiguous runs.
    /// Under `--kv-ram-budget` the sorted segments are in the cold file, in the same order.
    Buckets,
    /// The store keeps rows by position: a bucket is one scattered row per position.
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
    /// Saap: how the store keeps the sparse layers' rows: grouped by bucket (one copy,
    /// contiguous reads) or by position (scattered reads).
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
    /// Saap: with `--saap-router cells` (the bucket routers read whole buckets and ignore
    /// it), this many positions around a chosen cell's longest key are read too when that
    /// key holds at least half the cell's estimated mass (a quarter of them before it, the
    /// rest after; counted in the budget; 0 for none). A cell groups keys by direction, so
    /// a needle's tokens fall in different cells and one sharp match does not bring the
    /// digits beside it; a halo does, as Quest's pages of neighbours do: the 1.5B's 8K
    /// needle Saap stopped a digit short of is found (docs/long-context.md, "A halo around
    /// a sharp key").
    #[cfg_attr(feature = "cli", arg(id = "SAAP_HALO", long = "saap-halo", default_value_t = SaapSettings::default().halo, help_heading = crate::policy::HELP_HEADING))]
    pub halo: usize,
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
            halo: 16,
            window: 63,
            block: 16,
            dense_layers: vec![0],
        }
    }
}

/// Positions always read at the start (the attention sink).
pub const SINKS: usize = 1;

/// Keys per cell of the cells router's default segment (8 × C positions): `n/8` cells to
/// score per KV head at any length. Over 256 buckets, 8 route as well as 4 over 1,024 for
/// half the cells (docs/long-context.md, "256 buckets by default").
pub const KEYS_PER_CELL: usize = 8;

/// The widest `--saap-halo`: a halo is the neighbourhood of one key, not a window.
pub const MAX_HALO: usize = 256;

/// Buckets ranked before a budgeted step starts taking them (more only when all fit).
pub(super) const RANKED: usize = 128;

/// Cells ranked at least before a step starts taking them (more only when all fit).
pub(super) const MIN_RANKED_CELLS: usize = 64;

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
    pub(super) fn read_limit(&self, n: usize) -> usize {
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
        if self.halo > MAX_HALO {
            return Err(format!(
                "saap halo {} is out of range (0..={MAX_HALO} positions)",
                self.halo
            ));
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
pub(crate) fn settings(
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
pub(crate) fn load_index(
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
    let index = SaapIndex::load(&path, model).map_err(|e| format!("{e} ({})", path.display()))?;
    // A router that never reads the Q-model does not keep it in memory.
    Ok(Arc::new(if s.router.reads_qmodel() {
        index
    } else {
        index.partition_only()
    }))
}
