//! The generation thread: continuous batching over a fixed set of slots (a
//! [`Session`] each: a sequence's cache and the tokens in it).
//!
//! Each turn is one forward pass: every request that is generating contributes the token
//! it just sampled, and requests still reading their prompt share what is left of the
//! turn's token budget (`--batch-size`), oldest first. The pass multiplies all those rows
//! by each weight matrix at once — decode is bound by reading the weights, so a turn with
//! eight sequences costs little more than one with one — while attention runs per sequence
//! over its own cache and policy. Requests join between turns and leave when they end.
//! New requests wait in a bounded queue; a request gets the free slot whose cached tokens
//! share the longest prefix with its prompt, and only the rest of the prompt is run
//! (in-memory prompt reuse across requests). Sampling, end checks, stop strings and the
//! grammar are [`Generation`]'s, the same loop `run` and `chat` drive.

use super::metrics::Metrics;
use sparrow::attention::AttentionChoice;
use sparrow::grammar::{JsonConstraint, JsonVocab, Root, Schema};
use sparrow::tokenizer::Tokenizer;
use sparrow::{
    Generation, Logits, Model, Next, Sampler, SamplerConfig, Session, SessionStep, StopReason,
    TokenLogprob, Workspace,
};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// What a request asks the generation thread for.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampler: SamplerConfig,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// The output is a JSON object (`response_format: json_object`).
    pub json: bool,
    /// The output is a JSON value valid against this schema (`json_schema`).
    pub schema: Option<Arc<Schema>>,
    /// Keep going past end-of-generation tokens (not under a grammar).
    pub ignore_eos: bool,
    /// Report each generated token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    pub tx: UnboundedSender<Event>,
}

/// Why a completion ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What the generation thread sends back.
#[derive(Debug)]
pub enum Event {
    /// More text.
    Text(String),
    /// The log-probabilities of the tokens whose text starts in the next `Text` (or, before
    /// `Done`, anywhere in the completion): sent only when the job asks for them.
    Logprobs(Vec<TokenLogprob>),
    /// The end, with the counts for `usage`.
    Done {
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
    },
    /// The model failed (e.g. the context filled during prefill).
    Error(String),
}

/// The handle the HTTP side holds.
#[derive(Clone)]
pub struct Scheduler {
    tx: SyncSender<Job>,
    metrics: Arc<Metrics>,
}

/// The queue is full.
pub struct Busy;

impl Scheduler {
    /// Queue `job`; `Busy` when `queue` jobs are already waiting.
    pub fn submit(&self, job: Job) -> Result<(), Busy> {
        match self.tx.try_send(job) {
            Ok(()) => {
                self.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => Err(Busy),
        }
    }
}

/// Settings of the generation thread.
pub struct Config {
    pub slots: usize,
    pub n_ctx: usize,
    pub kv: sparrow::KvOptions,
    /// The attention policy; each slot gets its own backend built from it (policies keep
    /// per-sequence state, rewound with the slot's cache by `State::truncate`).
    pub attention: AttentionChoice,
    pub queue: usize,
    /// Tokens one forward pass may carry: a token per generating request, the rest for
    /// prompts.
    pub batch: usize,
}

struct Slot {
    session: Session,
    last_used: u64,
}

/// A request being served.
struct Active {
    slot: usize,
    job: Job,
    /// Prompt tokens in the slot's cache (reused or run so far).
    pos: usize,
    /// Prompt tokens found already cached.
    cached: usize,
    sampler: Sampler,
    gen: Generation,
    /// The logits to sample from (a copy: sampling changes them).
    logits: Vec<f32>,
    t_prompt: Instant,
    t_gen: Instant,
}

impl Active {
    fn reading_prompt(&self) -> bool {
        self.pos < self.job.prompt.len()
    }
}

/// Start the generation thread.
pub fn start(
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    json_vocab: Arc<JsonVocab>,
    cfg: Config,
    metrics: Arc<Metrics>,
) -> Result<Scheduler, String> {
    let mut slots = Vec::new();
    for _ in 0..cfg.slots.max(1) {
        let state = model
            .new_sequence(cfg.n_ctx, cfg.kv.clone(), &cfg.attention)
            .map_err(|e| e.to_string())?;
        slots.push(Slot {
            session: Session::new(state),
            last_used: 0,
        });
    }
    let (tx, rx) = sync_channel(cfg.queue);
    let m = metrics.clone();
    std::thread::Builder::new()
        .name("sparrow-generate".into())
        .spawn(move || {
            Worker {
                model,
                tokenizer,
                json_vocab,
                slots,
                batch: cfg.batch.max(1),
                metrics: m,
                clock: 0,
                ws: Workspace::default(),
            }
            .run(rx)
        })
        .map_err(|e| format!("cannot start the generation thread: {e}"))?;
    Ok(Scheduler { tx, metrics })
}

struct Worker {
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    json_vocab: Arc<JsonVocab>,
    slots: Vec<Slot>,
    batch: usize,
    metrics: Arc<Metrics>,
    clock: u64,
    /// The stacked activations of a turn's forward pass.
    ws: Workspace,
}

/// What one request puts into a turn's forward pass.
struct Work {
    /// Index into the active list.
    active: usize,
    tokens: Vec<u32>,
    want: Logits,
}

impl Worker {
    fn run(mut self, rx: Receiver<Job>) {
        // Oldest first: prompts are read in arrival order.
        let mut active: Vec<Active> = Vec::new();
        loop {
            // Admit waiting jobs into free slots.
            while active.len() < self.slots.len() {
                let job = if active.is_empty() {
                    match rx.recv() {
                        Ok(j) => j,
                        Err(_) => return,
                    }
                } else {
                    match rx.try_recv() {
                        Ok(j) => j,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => break,
                    }
                };
                self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                if job.tx.is_closed() {
                    self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let a = self.admit(job, &active);
                active.push(a);
            }
            self.metrics.active.store(active.len(), Ordering::Relaxed);
            self.turn(&mut active);
            self.metrics.active.store(active.len(), Ordering::Relaxed);
            self.report_kv();
        }
    }

    /// One turn: sample a token for every generating request (those that end leave), then
    /// one forward pass over their tokens and as much prompt as the budget allows.
    fn turn(&mut self, active: &mut Vec<Active>) {
        let mut ended = vec![false; active.len()];
        let mut work: Vec<Work> = Vec::new();
        for (i, a) in active.iter_mut().enumerate() {
            if a.job.tx.is_closed() {
                self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                ended[i] = true;
            } else if !a.reading_prompt() {
                match self.sample(a) {
                    Some(id) => work.push(Work {
                        active: i,
                        tokens: vec![id],
                        want: Logits::Last,
                    }),
                    None => ended[i] = true,
                }
            }
        }
        let mut budget = self.batch.saturating_sub(work.len()).max(1);
        for (i, a) in active.iter().enumerate() {
            if budget == 0 {
                break;
            }
            if ended[i] || !a.reading_prompt() {
                continue;
            }
            let end = (a.pos + budget).min(a.job.prompt.len());
            let want = if end == a.job.prompt.len() {
                Logits::Last
            } else {
                Logits::None
            };
            budget -= end - a.pos;
            work.push(Work {
                active: i,
                tokens: a.job.prompt[a.pos..end].to_vec(),
                want,
            });
        }
        if !work.is_empty() {
            let m = &self.metrics;
            m.passes.fetch_add(1, Ordering::Relaxed);
            m.pass_sequences
                .fetch_add(work.len() as u64, Ordering::Relaxed);
            let rows: usize = work.iter().map(|w| w.tokens.len()).sum();
            m.pass_tokens.fetch_add(rows as u64, Ordering::Relaxed);
            for (i, err) in self.forward(active, &work) {
                let _ = active[i].job.tx.send(Event::Error(err));
                ended[i] = true;
            }
            for w in &work {
                if !ended[w.active] {
                    self.after_pass(&mut active[w.active], w);
                }
            }
        }
        // Leave, keeping the others in arrival order.
        let mut i = 0;
        active.retain(|a| {
            let keep = !ended[i];
            i += 1;
            if !keep {
                self.slots[a.slot].last_used = self.clock;
            }
            keep
        });
    }

    /// Run `work` in one forward pass. If it fails, each request's part is run alone, so
    /// one request's error (e.g. its cold KV store) does not end the others; returns the
    /// requests that failed.
    fn forward(&mut self, active: &[Active], work: &[Work]) -> Vec<(usize, String)> {
        let mut slots: Vec<Option<&mut Slot>> = self.slots.iter_mut().map(Some).collect();
        let mut steps: Vec<SessionStep<'_>> = work
            .iter()
            .map(|w| SessionStep {
                session: &mut slots[active[w.active].slot]
                    .take()
                    .expect("one step per slot")
                    .session,
                tokens: &w.tokens,
                want: w.want,
            })
            .collect();
        if Session::forward_many(&self.model, &mut self.ws, &mut steps).is_ok() {
            return Vec::new();
        }
        let mut failed = Vec::new();
        for (s, w) in steps.iter_mut().zip(work) {
            if let Err(e) = s.session.feed(&self.model, s.tokens, s.want) {
                failed.push((w.active, e.to_string()));
            }
        }
        failed
    }

    /// Book-keeping after `a`'s part of a pass: the prompt position, the logits to sample.
    fn after_pass(&mut self, a: &mut Active, w: &Work) {
        let session = &self.slots[a.slot].session;
        if w.want != Logits::None {
            a.logits.clear();
            a.logits.extend_from_slice(session.state().last_logits());
        }
        if a.reading_prompt() {
            a.pos += w.tokens.len();
            if !a.reading_prompt() {
                self.metrics
                    .add_prompt(a.job.prompt.len() - a.cached, a.t_prompt.elapsed());
                a.t_gen = Instant::now();
            }
        }
    }

    /// Sample `a`'s next token and send what became final; the token to feed, or `None`
    /// when the request has ended (its last events sent).
    fn sample(&mut self, a: &mut Active) -> Option<u32> {
        let state = self.slots[a.slot].session.state();
        let room = state.n_ctx() - state.n_past();
        let next = a
            .gen
            .next(&self.tokenizer, &mut a.sampler, &mut a.logits, room);
        let token = match next {
            Next::Feed(id) => Some(id),
            Next::Done { token, .. } => token,
        };
        if token.is_some() {
            self.metrics
                .generated_tokens
                .fetch_add(1, Ordering::Relaxed);
        }
        let out = a.gen.take_output();
        if !out.logprobs.is_empty() {
            let _ = a.job.tx.send(Event::Logprobs(out.logprobs));
        }
        if !out.text.is_empty() {
            let _ = a.job.tx.send(Event::Text(out.text));
        }
        match next {
            Next::Feed(id) => Some(id),
            Next::Done { reason, .. } => {
                self.finish(a, reason);
                None
            }
        }
    }

    /// Publish what the slots' KV stores hold, in RAM and in cold files.
    fn report_kv(&self) {
        let (hot, cold) = self.slots.iter().fold((0, 0), |(h, c), s| {
            let kv = s.session.state().kv();
            (h + kv.bytes_resident(), c + kv.bytes_cold())
        });
        self.metrics.kv_hot_bytes.store(hot, Ordering::Relaxed);
        self.metrics.kv_cold_bytes.store(cold, Ordering::Relaxed);
    }

    fn admit(&mut self, job: Job, active: &[Active]) -> Active {
        self.clock += 1;
        let busy: Vec<usize> = active.iter().map(|a| a.slot).collect();
        let (slot, _) = (0..self.slots.len())
            .filter(|s| !busy.contains(s))
            .map(|s| (s, self.slots[s].session.shared_prefix(&job.prompt)))
            .max_by_key(|&(s, n)| (n, u64::MAX - self.slots[s].last_used))
            .expect("a free slot exists");
        // Rewinds the attention policy's per-position state too, so a sparse policy's
        // summaries of the previous request's tail never leak into this one. A
        // sliding-window layer may have lost the prefix (then nothing is kept).
        let shared = self.slots[slot].session.reuse_prefix(&job.prompt);
        let mut sampler = Sampler::new(job.sampler.clone());
        sampler.accept(&job.prompt);
        // A grammar ends at the end-of-generation token it allows once the value is
        // complete, whatever `ignore_eos` says.
        let mut gen = Generation::new(job.max_tokens, job.ignore_eos).with_stops(job.stop.clone());
        if let Some(schema) = &job.schema {
            gen = gen.with_constraint(JsonConstraint::with_schema(
                self.json_vocab.clone(),
                schema.clone(),
            ));
        } else if job.json {
            gen = gen.with_constraint(JsonConstraint::new(self.json_vocab.clone(), Root::Object));
        }
        if let Some(k) = job.logprobs {
            gen = gen.with_logprobs(k);
        }
        self.metrics
            .prompt_tokens_cached
            .fetch_add(shared as u64, Ordering::Relaxed);
        Active {
            slot,
            pos: shared,
            cached: shared,
            job,
            sampler,
            gen,
            logits: Vec::new(),
            t_prompt: Instant::now(),
            t_gen: Instant::now(),
        }
    }

    fn finish(&mut self, a: &mut Active, reason: StopReason) {
        let finish = match reason {
            StopReason::EndOfGeneration | StopReason::StopString => Finish::Stop,
            StopReason::Length | StopReason::ContextFull => Finish::Length,
            StopReason::Cancelled => {
                self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        self.metrics.add_generation(a.t_gen.elapsed());
        self.metrics.completed.fetch_add(1, Ordering::Relaxed);
        let _ = a.job.tx.send(Event::Done {
            finish,
            prompt_tokens: a.job.prompt.len(),
            completion_tokens: a.gen.n_generated(),
            cached_tokens: a.cached,
        });
    }
}
