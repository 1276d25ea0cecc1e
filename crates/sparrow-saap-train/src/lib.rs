//! Offline training of Saap indexes ([`sparrow::saap::SaapIndex`]) from the records
//! `sparrow saap collect` writes ([`sparrow::saap::ContextRecord`]).
//!
//! Per (layer, KV head), independently:
//! 1. [`kmeans`]: k-means of the de-roped keys (sink excluded) gives the `C` buckets;
//! 2. [`targets`]: each recorded query's exact attention mass per bucket, kept when the
//!    query is long-range (its best key at least `min_distance` back);
//! 3. [`qmodel`]: an MLP fitted to map the de-roped query to that distribution, exported
//!    with its batch normalisation folded into the first layer.
//!
//! [`evaluate()`] measures what the engine's routers would capture on held-out queries.
//! candle (the training library) is a dependency of this crate only, so the engine does
//! not carry it.

pub mod evaluate;
pub mod kmeans;
pub mod qmodel;
pub mod records;
pub mod split;
pub mod targets;
mod train;

pub use evaluate::{evaluate, EvalRows, EvalSettings, LayerReport, ProbeStats, Report};
pub use records::{check_records, load_records};
pub use train::train;

/// How an index is trained. The defaults train the default model (Qwen2.5-0.5B: 24
/// layers × 2 KV heads, head size 64) on a handful of 8192-token contexts in a few
/// minutes on two cores.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainSettings {
    /// Buckets per (layer, KV head): `C`. With the cells router (saap's default, segments
    /// of 8 × C positions) 256 buckets capture as much attention mass as 1,024 at 4 × C for
    /// half the cells to score, and find every needle of the grid; 128 lost a 32K needle's
    /// last digit (docs/long-context.md, "Fewer buckets, shorter segments" and "256 buckets
    /// by default"). The bucket routers (`kmeans`, `--saap-router hedged`) were tuned at
    /// 1,024: train with `--clusters 1024` for them.
    pub clusters: usize,
    /// Q-model hidden width.
    pub hidden: usize,
    /// The Q-model's logits start from the query's scaled similarity to the centroids
    /// (the `kmeans` router), the MLP learning a correction; false: the paper's plain MLP.
    pub centroid_prior: bool,
    /// Lloyd iterations.
    pub kmeans_iterations: usize,
    /// Spherical k-means (unit centroids, inner product) instead of standard (nearest).
    pub spherical: bool,
    /// Keys clustered at most per centroid; more are subsampled.
    pub points_per_centroid: usize,
    /// Q-model optimisation steps, examples per step, Adam's peak learning rate.
    pub steps: usize,
    pub batch: usize,
    pub learning_rate: f64,
    /// A query trains the Q-model only when its best key is at least this many tokens
    /// back (the paper's long-range queries).
    pub min_distance: usize,
    /// The Q-model's targets count only the keys at least this many positions back: those
    /// the decode policy's dense window (`--saap-window`) does not read, so the buckets
    /// must. 0: every key past the sink (the paper's targets).
    pub target_window: usize,
    /// A head with fewer long-range training queries than this trains on its
    /// `min_examples` longest-range ones instead (some heads almost never look far back;
    /// a model fitted to a handful of queries routes no better than chance).
    pub min_examples: usize,
    /// Fraction of query positions held out of training (for the held-out loss and
    /// [`EvalRows::HeldOut`]).
    pub holdout: f64,
    /// Seeds k-means' initialisation, sampling, the split and the MLP's initialisation.
    pub seed: u64,
    /// Heads trained at once (0: one per core).
    pub threads: usize,
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            clusters: 256,
            hidden: 64,
            centroid_prior: true,
            kmeans_iterations: 10,
            spherical: false,
            points_per_centroid: 128,
            steps: 300,
            batch: 256,
            learning_rate: 2e-3,
            min_distance: 1024,
            target_window: 0,
            min_examples: 256,
            holdout: 0.1,
            seed: 0,
            threads: 0,
        }
    }
}

impl TrainSettings {
    /// Checks the settings, naming the bad one.
    pub fn validate(&self) -> Result<(), TrainError> {
        use sparrow::saap::index::MAX_WIDTH;
        let bad = |m: String| Err(TrainError::Settings(m));
        if !(1..=MAX_WIDTH).contains(&self.clusters) {
            return bad(format!("clusters {} (1..={MAX_WIDTH})", self.clusters));
        }
        if !(1..=MAX_WIDTH).contains(&self.hidden) {
            return bad(format!("hidden width {} (1..={MAX_WIDTH})", self.hidden));
        }
        if self.points_per_centroid == 0 {
            return bad("points per centroid 0 (at least 1)".into());
        }
        if self.steps == 0 || self.batch < 2 {
            return bad(format!(
                "{} steps of batch {} (at least 1 step of 2 examples: batch normalisation needs 2)",
                self.steps, self.batch
            ));
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return bad(format!("learning rate {}", self.learning_rate));
        }
        if !(0.0..1.0).contains(&self.holdout) {
            return bad(format!("held-out fraction {} (0 to below 1)", self.holdout));
        }
        Ok(())
    }
}

/// Which (layer, KV head) of how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadId {
    /// `layer * n_head_kv + kv_head`, of `total`.
    pub index: usize,
    pub total: usize,
    pub layer: usize,
    pub kv_head: usize,
}

/// The phases of a head's training.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    KMeans,
    Targets,
    QModel,
}

/// How one head's training went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeadSummary {
    /// Keys clustered (after subsampling), clusters re-seeded when they ran empty.
    pub keys: usize,
    pub reseeded: usize,
    /// (query row, query head) pairs of the training split, and those long-range enough
    /// to train on.
    pub candidates: usize,
    pub examples: usize,
    /// The distance the examples' best keys are at least (`min_distance`, or less when the
    /// head had fewer than `min_examples` queries that far).
    pub min_distance: usize,
    /// Long-range examples of the held-out split.
    pub held_out: usize,
    /// Mean KL divergence (nats) of the final model on its training and held-out examples.
    pub train_kl: f64,
    pub held_out_kl: Option<f64>,
    /// Wall time of each phase.
    pub kmeans_seconds: f64,
    pub targets_seconds: f64,
    pub qmodel_seconds: f64,
}

/// What [`train`] reports as it goes (heads run concurrently, so reports of different
/// heads interleave).
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    /// A head entered a phase.
    Phase { head: HeadId, phase: Phase },
    /// Q-model optimisation: steps done, and the mean training loss since the last report.
    Step {
        head: HeadId,
        step: usize,
        steps: usize,
        loss: f64,
    },
    /// A head is done.
    Done { head: HeadId, summary: HeadSummary },
}

/// Why training or evaluation failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Record {
        path: String,
        source: sparrow::saap::RecordError,
    },
    #[error("no Saap training records (*.saapc) in {0}: record some with `sparrow saap collect`")]
    NoRecords(String),
    #[error("training records do not belong together: {first} and {other}: {what}")]
    Mixed {
        first: String,
        other: String,
        what: String,
    },
    #[error("{record} was recorded from another model (fingerprint mismatch): record contexts with the model being trained for")]
    OtherModel { record: String },
    #[error("{record} does not fit the model: {what}")]
    Shape { record: String, what: String },
    #[error("{record} holds a non-finite value in layer {layer}")]
    NotFinite { record: String, layer: usize },
    #[error("layer {layer}, KV head {kv_head}: {keys} keys cannot make {clusters} clusters: record more or longer contexts, or use fewer clusters")]
    TooFewKeys {
        layer: usize,
        kv_head: usize,
        keys: usize,
        clusters: usize,
    },
    #[error("layer {layer}, KV head {kv_head}: {examples} of {candidates} training queries have their best key at least {min_distance} tokens back (at least 2 needed): record longer contexts or lower the minimum distance")]
    NoExamples {
        layer: usize,
        kv_head: usize,
        examples: usize,
        candidates: usize,
        min_distance: usize,
    },
    #[error("invalid training settings: {0}")]
    Settings(String),
    #[error("the index does not fit the records: {0}")]
    IndexMismatch(String),
    #[error("tensor computation failed: {0}")]
    Candle(#[from] candle_core::Error),
}
