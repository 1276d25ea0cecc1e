//! `sparrow saap collect`: record a model's de-roped keys and sampled queries over training
//! text. `sparrow saap train`: train an index from such records (or from text directly),
//! saved where `--attn saap` finds it. `sparrow saap eval`: how much attention mass an
//! index's routers capture on recorded queries.

use crate::progress::PrefillProgress;
use crate::run::init_threads;
use crate::ModelArgs;
use sparrow::saap::ContextRecord;
use sparrow_eval::{collect_context, text_contexts, CollectSettings};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[cfg(feature = "train")]
#[path = "saap_train.rs"]
mod train;

/// Saap's offline steps.
#[derive(clap::Subcommand, Debug)]
pub enum SaapCommand {
    /// Record the model's de-roped keys and sampled queries over long training text (one
    /// `.saapc` file per context), for `sparrow saap train --records`.
    Collect(CollectArgs),
    /// Train an index (k-means of de-roped keys + the query classifier) from records or
    /// straight from a text folder, and report its held-out routing quality.
    #[cfg(feature = "train")]
    Train(train::TrainArgs),
    /// Attention mass captured by an index's routers (Q-model, centroids, oracle) and the
    /// keys they read, per probe count, on recorded queries.
    #[cfg(feature = "train")]
    Eval(train::EvalArgs),
}

/// What text to record and how.
#[derive(clap::Args, Debug, Clone)]
pub struct TextArgs {
    /// Folder of .txt training files (never the texts you evaluate on).
    #[arg(long = "text")]
    pub text: Option<PathBuf>,
    /// Tokens per training context.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 8192)]
    pub ctx: usize,
    /// Training contexts to record (cut from the text files in turn).
    #[arg(long = "contexts", default_value_t = 6)]
    pub contexts: usize,
    /// First position whose query is recorded (a long-range query needs a long past).
    #[arg(long = "first-query", default_value_t = CollectSettings::default().first_query)]
    pub first_query: usize,
    /// Record the query of every N-th position from --first-query on.
    #[arg(long = "query-stride", default_value_t = CollectSettings::default().query_stride)]
    pub query_stride: usize,
    /// Prefill batch size.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
}

/// Arguments of `sparrow saap collect`.
#[derive(clap::Args, Debug)]
pub struct CollectArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    text: TextArgs,
    /// Folder the records are written to (created if needed).
    #[arg(long = "out")]
    out: PathBuf,
    /// Threads.
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
}

pub fn saap(c: SaapCommand) -> Result<(), String> {
    match c {
        SaapCommand::Collect(a) => collect(a),
        #[cfg(feature = "train")]
        SaapCommand::Train(a) => train::train(a),
        #[cfg(feature = "train")]
        SaapCommand::Eval(a) => train::eval(a),
    }
}

fn collect(a: CollectArgs) -> Result<(), String> {
    init_threads(a.threads)?;
    let engine = a.model.load_engine()?;
    std::fs::create_dir_all(&a.out)
        .map_err(|e| format!("cannot create {}: {e}", a.out.display()))?;
    let t0 = Instant::now();
    let mut bytes = 0usize;
    let mut n = 0;
    record_contexts(&engine, &a.text, |i, rec| {
        let path = a.out.join(format!("ctx-{i:04}.saapc"));
        rec.save(&path).map_err(|e| e.to_string())?;
        bytes += std::fs::metadata(&path).map_or(0, |m| m.len() as usize);
        n += 1;
        Ok(())
    })?;
    eprintln!(
        "recorded {n} contexts ({:.1} MiB) in {} in {:.0} s",
        bytes as f64 / (1 << 20) as f64,
        a.out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Record the training contexts `t` describes, handing each to `sink` as it is made
/// (records are large: they are not all kept).
pub fn record_contexts(
    engine: &sparrow::Engine,
    t: &TextArgs,
    mut sink: impl FnMut(usize, ContextRecord) -> Result<(), String>,
) -> Result<(), String> {
    let dir: &Path = t
        .text
        .as_deref()
        .ok_or("no training text: pass --text DIR (a folder of .txt files)")?;
    if t.ctx <= t.first_query {
        return Err(format!(
            "-c {} leaves no query past --first-query {}",
            t.ctx, t.first_query
        ));
    }
    if t.ctx > engine.model.config.n_ctx_train {
        return Err(format!(
            "-c {} is longer than the model's trained context ({})",
            t.ctx, engine.model.config.n_ctx_train
        ));
    }
    let contexts =
        text_contexts(&engine.tokenizer, dir, t.ctx, t.contexts).map_err(|e| e.to_string())?;
    if contexts.len() < t.contexts {
        eprintln!(
            "note: the texts hold only {} contexts of {} tokens",
            contexts.len(),
            t.ctx
        );
    }
    let settings = CollectSettings {
        first_query: t.first_query,
        query_stride: t.query_stride,
        batch: t.batch_size,
    };
    // One report over every context's tokens: its estimate is the whole recording's.
    let total: usize = contexts.iter().map(|(_, t)| t.len()).sum();
    let mut progress = PrefillProgress::new(&format!("recording {} contexts", contexts.len()));
    let mut before = 0;
    for (i, (source, tokens)) in contexts.into_iter().enumerate() {
        let n = tokens.len();
        let rec = collect_context(&engine.model, &tokens, &settings, source, |d, _| {
            progress.update(before + d, total)
        })
        .map_err(|e| e.to_string())?;
        before += n;
        sink(i, rec)?;
    }
    progress.finish();
    Ok(())
}
