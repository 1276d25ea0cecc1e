//! `sparrow saap train` and `sparrow saap eval` (feature `train`: the candle-based trainer).

use super::{record_contexts, TextArgs};
use crate::run::init_threads;
use crate::ModelArgs;
use indicatif::{ProgressBar, ProgressStyle};
use sparrow::saap::{default_index_path, SaapIndex};
use sparrow_saap_train::{
    evaluate, load_records, EvalRows, EvalSettings, Progress, Report, TrainSettings,
};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `sparrow saap train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Folder of records from `sparrow saap collect`. Without it, contexts are recorded
    /// from --text first (kept in memory).
    #[arg(long = "records", conflicts_with = "text")]
    records: Option<PathBuf>,
    #[command(flatten)]
    text: TextArgs,
    /// Where to write the index [default: the model's index in the sparrow cache
    /// ($SPARROW_SAAP_DIR, else ~/.cache/sparrow/saap), where `--attn saap` looks].
    #[arg(long = "out")]
    out: Option<PathBuf>,
    /// Buckets per layer and KV head (C).
    #[arg(long = "clusters", default_value_t = TrainSettings::default().clusters)]
    clusters: usize,
    /// Q-model hidden width.
    #[arg(long = "hidden", default_value_t = TrainSettings::default().hidden)]
    hidden: usize,
    /// The paper's plain Q-model: an MLP alone, instead of an MLP learning a correction
    /// to the centroid router (logits starting from the query's scaled similarity to the
    /// centroids, the default).
    #[arg(long = "plain-qmodel")]
    plain_qmodel: bool,
    /// k-means iterations.
    #[arg(long = "kmeans-iterations", default_value_t = TrainSettings::default().kmeans_iterations)]
    kmeans_iterations: usize,
    /// Spherical k-means (unit centroids, cosine) instead of standard.
    #[arg(long = "spherical")]
    spherical: bool,
    /// Q-model optimisation steps (Adam).
    #[arg(long = "steps", default_value_t = TrainSettings::default().steps)]
    steps: usize,
    /// Examples per step.
    #[arg(long = "batch", default_value_t = TrainSettings::default().batch)]
    batch: usize,
    /// Adam's learning rate.
    #[arg(long = "lr", default_value_t = TrainSettings::default().learning_rate)]
    lr: f64,
    /// Train on queries whose best key is at least this many tokens back.
    #[arg(long = "min-distance", default_value_t = TrainSettings::default().min_distance)]
    min_distance: usize,
    /// Targets over the keys at least this many positions back only (those the decode
    /// window does not read; 0: all keys past the sink).
    #[arg(long = "target-window", default_value_t = TrainSettings::default().target_window)]
    target_window: usize,
    /// Seed (k-means initialisation, sampling, MLP initialisation).
    #[arg(long = "seed", default_value_t = TrainSettings::default().seed)]
    seed: u64,
    /// Probe counts the held-out evaluation reports.
    #[arg(
        long = "probes",
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32"
    )]
    probes: Vec<usize>,
    /// Threads.
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
}

/// Arguments of `sparrow saap eval`.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The index [default: the model's index in the sparrow cache].
    #[arg(long = "index")]
    index: Option<PathBuf>,
    /// Folder of records (`sparrow saap collect`) to evaluate on — not those trained on.
    #[arg(long = "records")]
    records: PathBuf,
    /// Probe counts.
    #[arg(
        long = "probes",
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32"
    )]
    probes: Vec<usize>,
    /// Only queries whose best key is at least this many tokens back count.
    #[arg(long = "min-distance", default_value_t = TrainSettings::default().min_distance)]
    min_distance: usize,
    /// Print the report as JSON.
    #[arg(long = "json")]
    json: bool,
    /// Threads.
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
}

/// A bar over the (layer, KV head) pairs on a terminal, a line per finished head otherwise.
struct HeadProgress {
    bar: Option<ProgressBar>,
}

impl HeadProgress {
    fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(0);
            b.set_style(
                ProgressStyle::with_template(
                    "training {bar:40} {pos}/{len} heads (eta {eta}) {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        });
        HeadProgress { bar }
    }

    fn report(&self, p: &Progress) {
        match (p, &self.bar) {
            (Progress::Phase { head, phase }, Some(b)) => {
                b.set_length(head.total as u64);
                b.set_message(format!("layer {} KV head {}: {phase:?}", head.layer, head.kv_head));
            }
            (Progress::Done { .. }, Some(b)) => b.inc(1),
            (Progress::Done { head, summary: m }, None) => eprintln!(
                "head {}/{} (layer {}, KV head {}): {} of {} queries long-range, KL {:.3} (held out {}), {:.1} s",
                head.index + 1,
                head.total,
                head.layer,
                head.kv_head,
                m.examples,
                m.candidates,
                m.train_kl,
                m.held_out_kl.map_or("-".into(), |k| format!("{k:.3}")),
                m.kmeans_seconds + m.targets_seconds + m.qmodel_seconds
            ),
            _ => {}
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

pub fn train(a: TrainArgs) -> Result<(), String> {
    // The heads train on threads of their own that use the pool while this one reports.
    let threads = crate::run::init_pool_threads(a.threads)?;
    let settings = TrainSettings {
        clusters: a.clusters,
        hidden: a.hidden,
        centroid_prior: !a.plain_qmodel,
        kmeans_iterations: a.kmeans_iterations,
        spherical: a.spherical,
        steps: a.steps,
        batch: a.batch,
        learning_rate: a.lr,
        min_distance: a.min_distance,
        target_window: a.target_window,
        seed: a.seed,
        threads,
        ..TrainSettings::default()
    };
    settings.validate().map_err(|e| e.to_string())?;
    let engine = a.model.load_engine()?;
    let config = engine.model.config.clone();
    let out = match &a.out {
        Some(p) => p.clone(),
        None => default_index_path(&config.fingerprint)
            .ok_or("no cache directory for the index (HOME unset): pass --out FILE")?,
    };
    let t0 = Instant::now();
    let records = match &a.records {
        Some(dir) => load_records(dir).map_err(|e| e.to_string())?,
        None => {
            let mut recs = Vec::new();
            // The recording's passes start from a pool thread (this one is not).
            sparrow::threads::on_pool(|| {
                record_contexts(&engine, &a.text, |_, r| {
                    recs.push(r);
                    Ok(())
                })
            })?;
            recs
        }
    };
    let got = format!(
        "{} {} contexts in {:.0} s",
        if a.records.is_some() {
            "loaded"
        } else {
            "recorded"
        },
        records.len(),
        t0.elapsed().as_secs_f64()
    );
    drop(engine);
    let progress = HeadProgress::new();
    let t1 = Instant::now();
    let index =
        sparrow_saap_train::train(&records, &config, &settings, &mut |p| progress.report(&p))
            .map_err(|e| e.to_string())?;
    progress.finish();
    let trained = t1.elapsed().as_secs_f64();
    index.save(&out).map_err(|e| e.to_string())?;
    let size = std::fs::metadata(&out).map_or(0, |m| m.len());
    eprintln!(
        "index: {} ({:.1} MiB; C = {}, hidden {}) — {got}, trained in {trained:.0} s",
        out.display(),
        size as f64 / (1 << 20) as f64,
        settings.clusters,
        settings.hidden,
    );
    let report = evaluate(
        &index,
        &records,
        &a.probes,
        &EvalSettings::held_out(&settings),
    )
    .map_err(|e| e.to_string())?;
    println!("{report}");
    Ok(())
}

pub fn eval(a: EvalArgs) -> Result<(), String> {
    init_threads(a.threads)?;
    let model = sparrow::Model::load_with(
        a.model.resolve()?,
        sparrow::LoadOptions {
            repack: false,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let path = match &a.index {
        Some(p) => p.clone(),
        None => default_index_path(&model.config.fingerprint)
            .ok_or("no cache directory: pass --index FILE")?,
    };
    let index =
        SaapIndex::load(&path, &model.config).map_err(|e| format!("{e} ({})", path.display()))?;
    let records = load_records(&a.records).map_err(|e| e.to_string())?;
    let report: Report = evaluate(
        &index,
        &records,
        &a.probes,
        &EvalSettings {
            rows: EvalRows::All,
            min_distance: a.min_distance,
            dense_layers: vec![0],
        },
    )
    .map_err(|e| e.to_string())?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
    } else {
        println!("{report}");
    }
    Ok(())
}
