//! The scheduler's thread: admit jobs into slots, run turns, report.

use super::job::{Event, Job, Reply, Usage};
use super::stats::SchedulerStats;
use super::Config;
use crate::engine::Engine;
use crate::error::Result;
use crate::generate::{Generation, Next, StopReason, TokenLogprob, TokenSink};
use crate::model::{Logits, Model, Workspace};
use crate::prefix_cache::{BlockKey, PrefixCache, ScanReport};
use crate::sampler::Sampler;
use crate::session::{common_prefix, Session, SessionStep};
use crate::speculative::{check_batch, judge_drafts, Check, Sibling};
use crate::tokenizer::Tokenizer;
use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

struct Slot {
    session: Session,
    /// When the slot's last job left (the scheduler's clock): of slots sharing as much
    /// with a prompt, the least recently used is taken.
    last_used: u64,
}

/// A job being served.
struct Active {
    slot: usize,
    prompt: Vec<u32>,
    /// Prompt tokens in the slot's cache (reused or run so far).
    pos: usize,
    /// Prompt tokens found already cached.
    cached: usize,
    sampler: Sampler,
    gen: Generation,
    reply: Box<dyn Reply>,
    /// The logits to sample from (a copy: sampling changes them).
    logits: Vec<f32>,
    /// A token already sampled (while checking drafts) and still to be fed.
    pending: Option<u32>,
    /// A sibling the generation took in place of a draft (its next token is `pending`):
    /// fed first, with the next pass.
    lead: Option<u32>,
    /// The names of the prompt's whole blocks in the prefix cache (empty without one),
    /// hashed once for the prompt's every publication.
    chain: Vec<BlockKey>,
    t_prompt: Instant,
    t_gen: Instant,
}

impl Active {
    fn reading_prompt(&self) -> bool {
        self.pos < self.prompt.len()
    }
}

/// A job's output as its events (and the count of tokens generated).
struct ToReply<'a> {
    reply: &'a mut dyn Reply,
    stats: &'a SchedulerStats,
}

impl TokenSink for ToReply<'_> {
    fn on_token(&mut self, id: Option<u32>, text: &str) -> ControlFlow<()> {
        if id.is_some() {
            self.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
        }
        if !text.is_empty() {
            self.reply.send(Event::Text(text.to_string()));
        }
        // A caller that gave up is noticed at the start of the next turn.
        ControlFlow::Continue(())
    }
    fn on_logprobs(&mut self, logprobs: Vec<TokenLogprob>) {
        self.reply.send(Event::Logprobs(logprobs));
    }
}

/// What one job puts into a turn's forward pass.
struct Work {
    /// Index into the active list.
    active: usize,
    tokens: Vec<u32>,
    want: Logits,
    /// A speculative check: the tokens run as decode steps — a sibling taken last turn
    /// (`lead`: 0 or 1), the token sampled, `drafts` drafts after it, then the siblings.
    as_steps: bool,
    lead: usize,
    drafts: usize,
    siblings: Vec<Sibling>,
    /// The rows the siblings stand in for (`lead + 1 + ` their draft's index).
    sibling_rows: Vec<usize>,
}

pub(super) struct Worker {
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    slots: Vec<Slot>,
    batch: usize,
    stats: Arc<SchedulerStats>,
    clock: u64,
    /// The stacked activations of a turn's forward pass.
    ws: Workspace,
    /// Prompt prefixes shared by every slot.
    cache: Option<PrefixCache>,
    /// Jobs held back while another job computes a prefix they share (they take it from
    /// the cache once it is there instead of computing it too), oldest first.
    deferred: VecDeque<Job>,
}

impl Worker {
    /// The slots' sequences allocated (at least one), and the prefix cache opened (with
    /// what its directory held).
    pub(super) fn new(
        engine: &Engine,
        cfg: &Config,
        stats: Arc<SchedulerStats>,
    ) -> Result<(Self, Option<ScanReport>)> {
        let mut slots = Vec::new();
        for _ in 0..cfg.slots.max(1) {
            let state = engine
                .model
                .new_sequence(cfg.n_ctx, cfg.kv.clone(), &cfg.attention)?;
            if cfg.speculation.is_some() {
                crate::speculative::check_rewinds(&state)?;
            }
            let mut session = Session::new(state);
            if let Some(make) = &cfg.speculation {
                session = session.with_speculation((make.0)()?);
            }
            slots.push(Slot {
                session,
                last_used: 0,
            });
        }
        let (cache, scan) = match &cfg.prefix_cache {
            Some(pc) => {
                let (cache, scan) = PrefixCache::open(
                    pc,
                    &engine.model.config.fingerprint,
                    slots[0].session.state(),
                    &cfg.attention,
                    stats.prefix_cache.clone(),
                )
                .map_err(crate::Error::Other)?;
                (Some(cache), scan)
            }
            None => (None, None),
        };
        let worker = Worker {
            model: engine.model.clone(),
            tokenizer: engine.tokenizer.clone(),
            slots,
            batch: cfg.batch.max(1),
            stats,
            clock: 0,
            ws: Workspace::default(),
            cache,
            deferred: VecDeque::new(),
        };
        Ok((worker, scan))
    }

    /// Serve jobs from `rx` until every sender is gone and no job is left.
    pub(super) fn run(mut self, rx: Receiver<Job>) {
        // Oldest first: prompts are read in arrival order.
        let mut active: Vec<Active> = Vec::new();
        loop {
            // Admit jobs into free slots: those held back first, once what they waited
            // for is cached, then new ones (held back in turn if they should wait).
            let mut i = 0;
            while active.len() < self.slots.len() && i < self.deferred.len() {
                if self.deferred[i].reply.is_cancelled() {
                    self.deferred.remove(i);
                    self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
                    self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                } else if self.waits_for_prefix(&self.deferred[i], &active) {
                    i += 1;
                } else {
                    let job = self.deferred.remove(i).expect("in range");
                    self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
                    let a = self.admit(job, &active);
                    active.push(a);
                }
            }
            while active.len() < self.slots.len() && self.deferred.len() < self.slots.len() {
                // Every held-back job waits for an active one, so with none active none
                // is held back and the thread may sleep until a job comes.
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
                if job.reply.is_cancelled() {
                    self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
                    self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if self.waits_for_prefix(&job, &active) {
                    self.deferred.push_back(job);
                    continue;
                }
                self.stats.queue_depth.fetch_sub(1, Ordering::Relaxed);
                let a = self.admit(job, &active);
                active.push(a);
            }
            self.stats.active.store(active.len(), Ordering::Relaxed);
            self.turn(&mut active);
            self.stats.active.store(active.len(), Ordering::Relaxed);
            self.report_kv();
        }
    }

    /// One turn: sample a token for every generating job (those that end leave), then one
    /// forward pass over their tokens and as much prompt as the budget allows.
    fn turn(&mut self, active: &mut Vec<Active>) {
        let mut ended = vec![false; active.len()];
        let mut work: Vec<Work> = Vec::new();
        let (mut drafts, mut siblings) = (Vec::new(), Vec::new());
        // Drafts only for a job generating alone: with two or more, each pass already has
        // a row per job, and past one row a pass is bound by arithmetic, so a draft row
        // costs as much as another job's token, which is sure to be kept.
        let generating = active
            .iter()
            .filter(|a| !a.reading_prompt() && !a.reply.is_cancelled())
            .count();
        for (i, a) in active.iter_mut().enumerate() {
            if a.reply.is_cancelled() {
                self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                ended[i] = true;
            } else if !a.reading_prompt() {
                let Some(id) = self.sample(a) else {
                    ended[i] = true;
                    continue;
                };
                let lead: Vec<u32> = a.lead.take().into_iter().collect();
                let fed = lead.len() + 1;
                let session = &mut self.slots[a.slot].session;
                let state = session.state();
                let room = if generating == 1 {
                    (state.n_ctx() - state.n_past() - fed).min(a.gen.remaining().saturating_sub(1))
                } else {
                    0
                };
                let wants_siblings = state.takes_siblings().then_some(&mut siblings);
                if let Err(e) = session.propose_drafts(&lead, id, room, &mut drafts, wants_siblings)
                {
                    a.reply.send(Event::Error(e.to_string()));
                    ended[i] = true;
                    continue;
                }
                let (mut tokens, mut sibling_rows) = (Vec::new(), Vec::new());
                check_batch(
                    &lead,
                    id,
                    &drafts,
                    &siblings,
                    &mut tokens,
                    &mut sibling_rows,
                );
                let as_steps = tokens.len() > 1;
                work.push(Work {
                    active: i,
                    tokens,
                    want: if as_steps { Logits::All } else { Logits::Last },
                    as_steps,
                    lead: fed - 1,
                    drafts: drafts.len(),
                    sibling_rows,
                    siblings: std::mem::take(&mut siblings),
                });
            }
        }
        let decoding: usize = work.iter().map(|w| w.tokens.len()).sum();
        let mut budget = self.batch.saturating_sub(decoding).max(1);
        for (i, a) in active.iter().enumerate() {
            if budget == 0 {
                break;
            }
            if ended[i] || !a.reading_prompt() {
                continue;
            }
            let end = (a.pos + budget).min(a.prompt.len());
            let want = if end == a.prompt.len() {
                Logits::Last
            } else {
                Logits::None
            };
            budget -= end - a.pos;
            work.push(Work {
                active: i,
                tokens: a.prompt[a.pos..end].to_vec(),
                want,
                as_steps: false,
                lead: 0,
                drafts: 0,
                siblings: Vec::new(),
                sibling_rows: Vec::new(),
            });
        }
        if !work.is_empty() {
            let s = &self.stats;
            s.passes.fetch_add(1, Ordering::Relaxed);
            s.pass_sequences
                .fetch_add(work.len() as u64, Ordering::Relaxed);
            let rows: usize = work.iter().map(|w| w.tokens.len()).sum();
            s.pass_tokens.fetch_add(rows as u64, Ordering::Relaxed);
            let started = Instant::now();
            let failed = self.forward(active, &work);
            // A pass's time is a check's cost only when it carried nothing else.
            let seconds = (work.len() == 1).then(|| started.elapsed().as_secs_f64());
            for (i, err) in failed {
                active[i].reply.send(Event::Error(err));
                ended[i] = true;
            }
            for w in &work {
                if !ended[w.active] && !self.after_pass(&mut active[w.active], w, seconds) {
                    ended[w.active] = true;
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

    /// Run `work` in one forward pass. If it fails, each job's part is run alone, so one
    /// job's error (e.g. its cold KV store) does not end the others; returns the jobs that
    /// failed.
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
                as_steps: w.as_steps,
                siblings: &w.sibling_rows,
            })
            .collect();
        if Session::forward_many(&self.model, &mut self.ws, &mut steps).is_ok() {
            return Vec::new();
        }
        let mut failed = Vec::new();
        for (s, w) in steps.iter_mut().zip(work) {
            let ran = if s.as_steps {
                s.session
                    .feed_steps_with_siblings(&self.model, s.tokens, s.siblings, s.want)
                    .map(|_| ())
            } else {
                s.session.feed(&self.model, s.tokens, s.want).map(|_| ())
            };
            if let Err(e) = ran {
                failed.push((w.active, e.to_string()));
            }
        }
        failed
    }

    /// Book-keeping after `a`'s part of a pass (which took `seconds`): the prompt position,
    /// the logits to sample — or, for a check of drafts, the generation stepped through
    /// the rows while it samples the drafts, the rest rewound. False when the job ended.
    fn after_pass(&mut self, a: &mut Active, w: &Work, seconds: Option<f64>) -> bool {
        if w.as_steps {
            return self.check_drafts(a, w, seconds);
        }
        let session = &mut self.slots[a.slot].session;
        if !a.reading_prompt() {
            // A plain step (of a speculating session: its cost, for the draft length).
            let n = session.state().n_past();
            if let Err(e) = session.settle_drafts(&self.model, 0, 0, seconds, n) {
                a.reply.send(Event::Error(e.to_string()));
                return false;
            }
        }
        if w.want != Logits::None {
            a.logits.clear();
            a.logits.extend_from_slice(session.state().last_logits());
        }
        if a.reading_prompt() {
            a.pos += w.tokens.len();
            if let Some(cache) = &mut self.cache {
                cache.publish_chain(&a.chain, a.pos, session.state());
            }
            if !a.reading_prompt() {
                self.stats
                    .add_prompt(a.prompt.len() - a.cached, a.t_prompt.elapsed());
                a.t_gen = Instant::now();
            }
        }
        true
    }

    /// Step `a`'s generation through the rows of its check of `w.drafts` drafts: each row
    /// is sampled as a one-token pass's logits would be, and the drafts after the first
    /// one the generation does not sample are rewound; the token it sampled instead is
    /// fed next turn. False when the job ended.
    fn check_drafts(&mut self, a: &mut Active, w: &Work, seconds: Option<f64>) -> bool {
        let state = self.slots[a.slot].session.state();
        let fed = w.lead + 1;
        let n0 = state.n_past() - (fed + w.drafts);
        let mut sink = ToReply {
            reply: a.reply.as_mut(),
            stats: &self.stats,
        };
        let check = Check::of_pass(
            state.logits(),
            self.model.config.vocab_size,
            fed,
            &w.tokens[fed..fed + w.drafts],
            &w.siblings,
            state.n_ctx() - n0 - fed,
        );
        let judged = judge_drafts(
            check,
            &mut a.gen,
            &self.tokenizer,
            &mut a.sampler,
            &mut a.logits,
            &mut sink,
        );
        let kept = judged.kept;
        let ended = match judged.next {
            Next::Feed(t) => {
                a.pending = Some(t);
                a.lead = judged.sibling;
                None
            }
            Next::Done { reason, .. } => Some(reason),
        };
        let taken = judged.sibling.is_some();
        self.stats
            .add_speculation(w.drafts, kept, w.siblings.len(), taken);
        let session = &mut self.slots[a.slot].session;
        session.record_siblings(w.siblings.len(), taken);
        let settled = session.settle_drafts(&self.model, w.drafts, kept, seconds, n0 + fed + kept);
        if let Some(reason) = ended {
            self.finish(a, reason);
            return false;
        }
        if let Err(e) = settled {
            a.reply.send(Event::Error(e.to_string()));
            return false;
        }
        true
    }

    /// Sample `a`'s next token and send what became final; the token to feed, or `None`
    /// when the job has ended (its last events sent).
    fn sample(&mut self, a: &mut Active) -> Option<u32> {
        if let Some(id) = a.pending.take() {
            return Some(id);
        }
        let state = self.slots[a.slot].session.state();
        let room = state.n_ctx() - state.n_past();
        let mut sink = ToReply {
            reply: a.reply.as_mut(),
            stats: &self.stats,
        };
        let next = a.gen.step(
            &self.tokenizer,
            &mut a.sampler,
            &mut a.logits,
            room,
            &mut sink,
        );
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
        self.stats.kv_hot_bytes.store(hot, Ordering::Relaxed);
        self.stats.kv_cold_bytes.store(cold, Ordering::Relaxed);
    }

    /// The free slots, each with how much of `prompt` it holds.
    fn free_slots(&self, prompt: &[u32], active: &[Active]) -> Vec<(usize, usize)> {
        (0..self.slots.len())
            .filter(|&s| active.iter().all(|a| a.slot != s))
            .map(|s| (s, self.slots[s].session.shared_prefix(prompt)))
            .collect()
    }

    /// Whether `job` should wait: a job reading its prompt is computing at least one
    /// whole block of `job`'s prompt more than `job` could start from now (a free slot's
    /// prefix or the prefix cache), which it will find in the cache once that job is done.
    fn waits_for_prefix(&self, job: &Job, active: &[Active]) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        let block = cache.block();
        let most = job.prompt.len().saturating_sub(1);
        let now = self
            .free_slots(&job.prompt, active)
            .iter()
            .map(|&(_, n)| n)
            .max()
            .unwrap_or(0)
            .max(cache.cached_len(&job.prompt));
        active.iter().filter(|a| a.reading_prompt()).any(|a| {
            let coming = common_prefix(&a.prompt, &job.prompt).min(most) / block * block;
            coming >= now + block
        })
    }

    /// Put `job` in the free slot that shares the longest prefix with its prompt (the least
    /// recently used of those that share as much), keeping that prefix — or, when the
    /// prefix cache holds more, in the least useful free slot, restoring it from there.
    fn admit(&mut self, job: Job, active: &[Active]) -> Active {
        self.clock += 1;
        let free = self.free_slots(&job.prompt, active);
        let lru = |s: usize| u64::MAX - self.slots[s].last_used;
        let (mut slot, own) = *free
            .iter()
            .max_by_key(|&&(s, n)| (n, lru(s)))
            .expect("a free slot exists");
        if let Some(cache) = &self.cache {
            if cache.cached_len(&job.prompt) > own {
                slot = free
                    .iter()
                    .min_by_key(|&&(s, n)| (n, u64::MAX - lru(s)))
                    .expect("a free slot exists")
                    .0;
            }
        }
        // Rewinds the attention policy's per-position state too, so a sparse policy's
        // summaries of the previous job's tail never leak into this one. A sliding-window
        // layer may have lost the prefix (then nothing is kept).
        let session = &mut self.slots[slot].session;
        let shared = match &mut self.cache {
            Some(cache) => session.reuse_prefix_from(cache, &job.prompt),
            None => session.reuse_prefix(&job.prompt),
        };
        session.expect_prompt_end(job.prompt.len());
        let Job {
            prompt,
            generation,
            mut sampler,
            reply,
        } = job;
        sampler.accept(&prompt);
        let chain = self.cache.as_ref().map_or(Vec::new(), |c| c.chain(&prompt));
        self.stats
            .prompt_tokens_cached
            .fetch_add(shared as u64, Ordering::Relaxed);
        Active {
            slot,
            prompt,
            pos: shared,
            cached: shared,
            sampler,
            gen: generation,
            reply,
            logits: Vec::new(),
            pending: None,
            lead: None,
            chain,
            t_prompt: Instant::now(),
            t_gen: Instant::now(),
        }
    }

    fn finish(&mut self, a: &mut Active, stop: StopReason) {
        if stop == StopReason::Cancelled {
            self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.stats.add_generation(a.t_gen.elapsed());
        self.stats.completed.fetch_add(1, Ordering::Relaxed);
        a.reply.send(Event::Done(Usage {
            stop,
            prompt_tokens: a.prompt.len(),
            completion_tokens: a.gen.n_generated(),
            cached_tokens: a.cached,
        }));
    }
}
