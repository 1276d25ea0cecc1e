//! Continuous batching: many completions generated at once over a fixed set of slots (a
//! [`Session`] each: a sequence's cache and the tokens in it), their tokens sharing each
//! forward pass. No HTTP or async runtime here: `sparrow serve` is a thin layer over it,
//! and a library user can drive it from any thread.
//!
//! Each turn is one forward pass: every job that is generating contributes the token it
//! just sampled, and jobs still reading their prompt share what is left of the turn's token
//! budget ([`Config::batch`]), oldest first. The pass multiplies all those rows by each
//! weight matrix at once — decode is bound by reading the weights, so a turn with eight
//! sequences costs little more than one with one — while attention runs per sequence over
//! its own cache and policy. Jobs join between turns and leave when they end. New jobs wait
//! in a bounded queue; a job gets the free slot whose cached tokens share the longest prefix
//! with its prompt, and only the rest of the prompt is run (in-memory prompt reuse across
//! jobs). Sampling, end checks, stop strings and the grammar are [`Generation`]'s, the same
//! loop [`Session::generate`] steps for one sequence.
//!
//! ```no_run
//! use sparrow::scheduler::{reply_channel, Config, Event, Job, Scheduler};
//! use sparrow::{Engine, Generation, Sampler, SamplerConfig};
//!
//! let engine = Engine::load("model.gguf")?;
//! let scheduler = Scheduler::start(&engine, Config::default())?;
//! let (reply, events) = reply_channel();
//! let job = Job {
//!     prompt: engine.tokenizer.encode("The sparrow is", true, true),
//!     generation: Generation::new(32, false),
//!     sampler: Sampler::new(SamplerConfig::greedy()),
//!     reply: Box::new(reply),
//! };
//! scheduler.submit(job).expect("the queue has room");
//! for event in events {
//!     match event {
//!         Event::Text(t) => print!("{t}"),
//!         Event::Done(_) | Event::Error(_) => break,
//!         Event::Logprobs(_) => {}
//!     }
//! }
//! # Ok::<(), sparrow::Error>(())
//! ```

mod job;
mod stats;
mod worker;

pub use job::{reply_channel, ChannelReply, Event, Job, Reply, Usage};
pub use stats::SchedulerStats;

use crate::attention::AttentionChoice;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::kv::KvOptions;
use crate::prefix_cache::{PrefixCacheConfig, ScanReport};
use crate::speculative::Speculation;
#[cfg(doc)]
use crate::{Generation, Session};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

/// Settings of a scheduler.
#[derive(Clone, Debug)]
pub struct Config {
    /// Jobs generated at once, each in a slot with its own KV cache.
    pub slots: usize,
    /// Context size of each slot, in tokens.
    pub n_ctx: usize,
    /// The slots' KV stores.
    pub kv: KvOptions,
    /// The attention policy; each slot gets its own backend built from it (policies keep
    /// per-sequence state, rewound with the slot's cache by `State::truncate`).
    pub attention: AttentionChoice,
    /// Jobs that may wait for a slot; [`Scheduler::submit`] refuses more.
    pub queue: usize,
    /// Tokens one forward pass may carry: a token per generating job (with its drafts),
    /// the rest for prompts.
    pub batch: usize,
    /// Makes each slot's drafter for speculative decoding (a draft model's own state, or
    /// lookup); `None`: none. The output does not change with it.
    pub speculation: Option<SpeculationFactory>,
    /// A prefix cache shared by the slots (RAM, and a directory that outlives the
    /// process); `None`: prompts reuse only what their own slot holds.
    pub prefix_cache: Option<PrefixCacheConfig>,
}

/// Makes one slot's [`Speculation`].
#[derive(Clone)]
pub struct SpeculationFactory(pub Arc<dyn Fn() -> Result<Speculation> + Send + Sync>);

impl std::fmt::Debug for SpeculationFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpeculationFactory")
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            slots: 4,
            n_ctx: 4096,
            kv: KvOptions::default(),
            attention: AttentionChoice::default(),
            queue: 16,
            batch: 512,
            speculation: None,
            prefix_cache: None,
        }
    }
}

/// The handle to a running scheduler: clone it to submit from several threads. The
/// scheduler's thread ends once every handle is dropped and no job is left.
#[derive(Clone)]
pub struct Scheduler {
    tx: SyncSender<Job>,
    stats: Arc<SchedulerStats>,
    /// What the prefix cache found in its directory at start.
    cache_scan: Option<Arc<ScanReport>>,
}

/// The queue is full: the job comes back.
pub struct Busy(pub Box<Job>);

impl std::fmt::Debug for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Busy: the scheduler's queue is full")
    }
}

impl Scheduler {
    /// Allocate the slots' sequences and start the scheduler's thread.
    pub fn start(engine: &Engine, cfg: Config) -> Result<Scheduler> {
        let stats = Arc::new(SchedulerStats::default());
        stats.slots.store(cfg.slots, Ordering::Relaxed);
        let (worker, scan) = worker::Worker::new(engine, &cfg, stats.clone())?;
        let (tx, rx) = sync_channel(cfg.queue);
        std::thread::Builder::new()
            .name("sparrow-generate".into())
            // The loop runs on a thread of the kernels' pool (`on_pool`), so its passes'
            // products do not each wake the pool from outside.
            .spawn(move || crate::threads::on_pool(|| worker.run(rx)))
            .map_err(|e| Error::Other(format!("cannot start the generation thread: {e}")))?;
        Ok(Scheduler {
            tx,
            stats,
            cache_scan: scan.map(Arc::new),
        })
    }

    /// Queue `job`; [`Busy`] when [`Config::queue`] jobs are already waiting.
    pub fn submit(&self, job: Job) -> std::result::Result<(), Busy> {
        match self.tx.try_send(job) {
            Ok(()) => {
                self.stats.queue_depth.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => {
                Err(Busy(Box::new(job)))
            }
        }
    }

    /// What the prefix cache found in its directory when the scheduler started (blocks
    /// indexed, files of other models left alone, broken ones removed), for the caller to
    /// report.
    pub fn cache_scan(&self) -> Option<&ScanReport> {
        self.cache_scan.as_deref()
    }

    /// The scheduler's counters and gauges.
    pub fn stats(&self) -> &Arc<SchedulerStats> {
        &self.stats
    }
}
