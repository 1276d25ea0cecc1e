//! The generation thread. It owns a fixed set of slots (a `State` each, with the tokens its
//! KV cache holds) and serves the active requests round-robin: one step each per turn — a
//! prefill chunk of at most `batch` tokens or one decoded token — so a long prompt cannot
//! starve the others. New requests wait in a bounded queue; a request gets the free slot
//! whose cached tokens share the longest prefix with its prompt, and only the rest of the
//! prompt is prefilled (in-memory prompt reuse across requests). The model math inside each
//! step runs on the rayon pool.

use super::api::TokenLogprob;
use super::metrics::Metrics;
use sparrow::attention::AttentionChoice;
use sparrow::grammar::{JsonConstraint, JsonVocab, Root};
use sparrow::prompt_cache::common_prefix;
use sparrow::tokenizer::StreamDecoder;
use sparrow::tokenizer::Tokenizer;
use sparrow::{LogProbs, Logits, Model, Sampler, SamplerConfig, State};
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
    pub json: bool,
    /// Keep going past end-of-generation tokens (not with `json`).
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
    pub batch: usize,
}

struct Slot {
    state: State,
    tokens: Vec<u32>,
    last_used: u64,
}

struct Active {
    slot: usize,
    job: Job,
    pos: usize,
    cached: usize,
    sampler: Sampler,
    json: Option<JsonConstraint>,
    decoder: StreamDecoder,
    text: String,
    sent: usize,
    n_gen: usize,
    logits: Vec<f32>,
    t_prompt: Instant,
    t_gen: Instant,
    truncated: bool,
    /// Generated tokens' log-probabilities not yet sent (when the job asks for them).
    logprobs: Vec<TokenLogprob>,
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
            state,
            tokens: Vec::new(),
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
}

/// Byte length of the longest suffix of `text` that is a proper prefix of a stop string
/// (text that must be held back in case the stop string completes).
fn held_back(text: &str, stops: &[String]) -> usize {
    let mut keep = 0;
    for s in stops {
        for k in (1..s.len().min(text.len() + 1)).rev() {
            if k > keep
                && text.is_char_boundary(text.len() - k)
                && s.as_bytes().starts_with(&text.as_bytes()[text.len() - k..])
            {
                keep = k;
                break;
            }
        }
    }
    keep
}

/// Byte offset of the first stop string in `text` that ends after `sent` (everything before
/// was already checked).
fn find_stop(text: &str, sent: usize, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter_map(|s| {
            let mut from = sent.saturating_sub(s.len());
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            text[from..].find(s.as_str()).map(|i| i + from)
        })
        .min()
}

impl Worker {
    fn run(mut self, rx: Receiver<Job>) {
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
            // One step for each active request, in turn.
            let mut i = 0;
            while i < active.len() {
                if self.step(&mut active[i]) {
                    let a = active.swap_remove(i);
                    self.metrics.active.store(active.len(), Ordering::Relaxed);
                    self.slots[a.slot].last_used = self.clock;
                    // swap_remove moved the last request here; keep round-robin order fair by
                    // not skipping it.
                } else {
                    i += 1;
                }
            }
            self.metrics.active.store(active.len(), Ordering::Relaxed);
            self.report_kv();
        }
    }

    /// Publish what the slots' KV stores hold, in RAM and in cold files.
    fn report_kv(&self) {
        let (hot, cold) = self.slots.iter().fold((0, 0), |(h, c), s| {
            (
                h + s.state.kv().bytes_resident(),
                c + s.state.kv().bytes_cold(),
            )
        });
        self.metrics.kv_hot_bytes.store(hot, Ordering::Relaxed);
        self.metrics.kv_cold_bytes.store(cold, Ordering::Relaxed);
    }

    fn admit(&mut self, job: Job, active: &[Active]) -> Active {
        self.clock += 1;
        let busy: Vec<usize> = active.iter().map(|a| a.slot).collect();
        let limit = job.prompt.len().saturating_sub(1);
        let (slot, shared) = (0..self.slots.len())
            .filter(|s| !busy.contains(s))
            .map(|s| {
                let n = common_prefix(&self.slots[s].tokens, &job.prompt).min(limit);
                (s, n)
            })
            .max_by_key(|&(s, n)| (n, u64::MAX - self.slots[s].last_used))
            .expect("a free slot exists");
        let sl = &mut self.slots[slot];
        // Rewinds the attention policy's per-position state too (`forget_from`), so a
        // sparse policy's summaries of the previous request's tail never leak into this one.
        // A sliding-window layer may have lost the prefix (then `shared` becomes 0).
        let shared = sl.state.truncate(shared);
        sl.tokens.truncate(shared);
        let mut sampler = Sampler::new(job.sampler.clone());
        sampler.accept(&job.prompt);
        let json = job
            .json
            .then(|| JsonConstraint::new(self.json_vocab.clone(), Root::Object));
        self.metrics
            .prompt_tokens_cached
            .fetch_add(shared as u64, Ordering::Relaxed);
        Active {
            slot,
            pos: shared,
            cached: shared,
            job,
            sampler,
            json,
            decoder: StreamDecoder::new(),
            text: String::new(),
            sent: 0,
            n_gen: 0,
            logits: Vec::new(),
            t_prompt: Instant::now(),
            t_gen: Instant::now(),
            truncated: false,
            logprobs: Vec::new(),
        }
    }

    /// One step of `a`; true when it is finished.
    fn step(&mut self, a: &mut Active) -> bool {
        if a.job.tx.is_closed() {
            self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let slot = &mut self.slots[a.slot];
        let n_prompt = a.job.prompt.len();
        if a.pos < n_prompt {
            let end = (a.pos + self.batch).min(n_prompt);
            let want = if end == n_prompt {
                Logits::Last
            } else {
                Logits::None
            };
            let chunk = &a.job.prompt[a.pos..end];
            if let Err(e) = self.model.forward(&mut slot.state, chunk, want) {
                let _ = a.job.tx.send(Event::Error(e.to_string()));
                slot.tokens
                    .truncate(slot.state.n_past().min(slot.tokens.len()));
                return true;
            }
            slot.tokens.extend_from_slice(chunk);
            a.pos = end;
            if end == n_prompt {
                a.logits = slot.state.last_logits().to_vec();
                let dt = a.t_prompt.elapsed();
                self.metrics.add_prompt(n_prompt - a.cached, dt);
                a.t_gen = Instant::now();
            }
            return false;
        }
        let remaining = a.job.max_tokens - a.n_gen;
        if remaining == 0 {
            return self.finish(a, Finish::Length);
        }
        // Log-probabilities come from the raw logits, which sampling may change in place.
        let model_view = a
            .job
            .logprobs
            .map(|k| (LogProbs::of(&a.logits, k), a.logits.clone()));
        let id = match &mut a.json {
            Some(c) => c.sample(&mut a.sampler, &mut a.logits, Some(remaining)),
            None => a.sampler.sample(&mut a.logits),
        };
        if self.tokenizer.is_eog(id) && (a.json.is_some() || !a.job.ignore_eos) {
            return self.finish(a, Finish::Stop);
        }
        a.n_gen += 1;
        self.metrics
            .generated_tokens
            .fetch_add(1, Ordering::Relaxed);
        if let Some((lp, raw)) = model_view {
            a.logprobs.push(TokenLogprob {
                id,
                logprob: lp.of_logit(raw[id as usize]),
                top: lp.top,
                offset: a.text.len(),
            });
        }
        let piece = a.decoder.push(&self.tokenizer, id);
        a.text.push_str(&piece);
        if let Some(at) = find_stop(&a.text, a.sent, &a.job.stop) {
            a.text.truncate(at);
            a.truncated = true;
            return self.finish(a, Finish::Stop);
        }
        let safe = a.text.len() - held_back(&a.text[a.sent..], &a.job.stop);
        if safe > a.sent {
            send_logprobs(a, |t| t.offset < safe);
            let _ = a.job.tx.send(Event::Text(a.text[a.sent..safe].to_string()));
            a.sent = safe;
        }
        let slot = &mut self.slots[a.slot];
        if a.n_gen == a.job.max_tokens || slot.state.n_past() >= slot.state.n_ctx() {
            return self.finish(a, Finish::Length);
        }
        match self.model.forward(&mut slot.state, &[id], Logits::Last) {
            Ok(l) => a.logits.copy_from_slice(l),
            Err(e) => {
                let _ = a.job.tx.send(Event::Error(e.to_string()));
                return true;
            }
        }
        slot.tokens.push(id);
        false
    }

    fn finish(&mut self, a: &mut Active, finish: Finish) -> bool {
        let rest = a.decoder.flush();
        if !a.truncated {
            a.text.push_str(&rest);
        }
        // Tokens a stop string cut off entirely are not part of the completion.
        let end = a.text.len();
        let truncated = a.truncated;
        send_logprobs(a, |t| !truncated || t.offset < end);
        if a.text.len() > a.sent {
            let _ = a.job.tx.send(Event::Text(a.text[a.sent..].to_string()));
            a.sent = a.text.len();
        }
        self.metrics.add_generation(a.t_gen.elapsed());
        self.metrics.completed.fetch_add(1, Ordering::Relaxed);
        let _ = a.job.tx.send(Event::Done {
            finish,
            prompt_tokens: a.job.prompt.len(),
            completion_tokens: a.n_gen,
            cached_tokens: a.cached,
        });
        true
    }
}

/// Send (and forget) the pending log-probabilities of the tokens `keep` accepts; the
/// others are dropped (a caller passes a prefix condition, so none is skipped twice).
fn send_logprobs(a: &mut Active, keep: impl Fn(&TokenLogprob) -> bool) {
    if a.logprobs.is_empty() {
        return;
    }
    let n = a.logprobs.iter().take_while(|t| keep(t)).count();
    let sent: Vec<_> = a.logprobs.drain(..n).collect();
    if !sent.is_empty() {
        let _ = a.job.tx.send(Event::Logprobs(sent));
    }
}

#[cfg(test)]
mod tests {
    use super::{find_stop, held_back};

    #[test]
    fn finds_stop_strings_across_chunks() {
        let stops = vec!["END".to_string()];
        assert_eq!(find_stop("abcEND", 4, &stops), Some(3));
        assert_eq!(find_stop("ééEND", 3, &stops), Some(4));
        assert_eq!(find_stop("abc", 0, &stops), None);
    }

    #[test]
    fn holds_back_partial_stop_strings() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(held_back("hello E", &stops), 1);
        assert_eq!(held_back("hello EN", &stops), 2);
        assert_eq!(held_back("hello\n", &stops), 1);
        assert_eq!(held_back("hello", &stops), 0);
        assert_eq!(held_back("é", &["éa".to_string()]), 2);
    }
}
