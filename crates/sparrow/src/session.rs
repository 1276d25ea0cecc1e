//! A [`Session`]: one sequence's [`State`] together with the tokens its cache holds, so a
//! new prompt that starts like the previous one (the next turn of a chat, a server slot's
//! next request) only runs what differs. Prefix reuse lives here and nowhere else.
//!
//! [`Session::generate`] is the one way to generate a completion of one sequence: a
//! [`Generation`] says what to generate, the session prefills what its cache does not
//! already hold and steps the generation one forward pass per token. The
//! [`crate::scheduler`] steps many sessions' generations in shared forward passes.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::generate::{prefill, Generation, GenerationStats, Next, SpeculationStats, TokenSink};
use crate::model::{Logits, Model, SeqStep, State, Workspace};
use crate::prefix_cache::PrefixCache;
use crate::sampler::Sampler;
use crate::speculative::{check_batch, judge_drafts, Check, Sibling, Speculation};
use std::time::Instant;

/// Prompt tokens per forward pass of a [`Session`]'s prefill, unless set otherwise.
pub const DEFAULT_BATCH_SIZE: usize = 512;

/// Length of the common prefix of two token lists.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How much of `prompt` a cache holding `cached` can keep: their common prefix, but never
/// the prompt's last token, which must run again because its logits start the generation.
pub fn reusable_prefix(cached: &[u32], prompt: &[u32]) -> usize {
    common_prefix(cached, prompt).min(prompt.len().saturating_sub(1))
}

/// A sequence and the tokens in its cache (`tokens.len() == state.n_past()` always).
pub struct Session {
    state: State,
    tokens: Vec<u32>,
    /// Prompt tokens per forward pass of the prefill. A setting of the session, not of a
    /// [`Generation`]: it bounds the activations one pass of this sequence allocates (a
    /// matter of the machine, the same for every prompt the session runs), while a
    /// `Generation` describes what to generate, which the batch size does not change
    /// (it splits the prefill's arithmetic differently: at most its rounding).
    batch_size: usize,
    /// Drafts to check several tokens per pass ([`crate::speculative`]): how this session
    /// decodes, not what it generates (the output is the same with or without).
    speculation: Option<Speculation>,
}

/// One session's share of a batched forward pass ([`Session::forward_many`]).
pub struct SessionStep<'a> {
    pub session: &'a mut Session,
    pub tokens: &'a [u32],
    pub want: Logits,
    /// The tokens are decode steps (a speculative check: [`Model::forward_steps`]).
    pub as_steps: bool,
    /// The rows the last `siblings.len()` tokens stand in for
    /// ([`Model::forward_steps_with_siblings`]; decode steps only).
    pub siblings: &'a [usize],
}

impl Session {
    /// A session over `state`, whose cache is taken as empty.
    pub fn new(mut state: State) -> Self {
        state.reset();
        Session {
            state,
            tokens: Vec::new(),
            batch_size: DEFAULT_BATCH_SIZE,
            speculation: None,
        }
    }

    /// A session over `state`, whose cache already holds `tokens` (restored from a prompt
    /// cache file, or prefilled once and shared); refused unless there is one token per
    /// position the state holds.
    pub fn holding(state: State, tokens: Vec<u32>) -> Result<Self> {
        if tokens.len() != state.n_past() {
            return Err(Error::Other(format!(
                "a session over a state of {} positions cannot hold {} tokens",
                state.n_past(),
                tokens.len()
            )));
        }
        Ok(Session {
            state,
            tokens,
            batch_size: DEFAULT_BATCH_SIZE,
            speculation: None,
        })
    }

    /// Prefill `batch_size` prompt tokens per forward pass (at least 1; default
    /// [`DEFAULT_BATCH_SIZE`]).
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    /// Decode speculatively with `speculation`'s drafts (the output does not change).
    pub fn with_speculation(mut self, speculation: Speculation) -> Self {
        self.speculation = Some(speculation);
        self
    }

    /// The speculation this session decodes with, if any.
    pub fn speculation(&self) -> Option<&Speculation> {
        self.speculation.as_ref()
    }

    /// Drafts to follow the cache's tokens, `lead` and `next` (about to be fed after
    /// `lead`), at most `room`, into `out` — empty without speculation or when drafting
    /// does not pay (a driver that steps generations itself, as the scheduler does) — and
    /// with `siblings`, the draft model's second choices where it is unsure
    /// ([`crate::speculative::SIBLING_BELOW`]; for a state that takes them).
    pub fn propose_drafts(
        &mut self,
        lead: &[u32],
        next: u32,
        room: usize,
        out: &mut Vec<u32>,
        siblings: Option<&mut Vec<Sibling>>,
    ) -> Result<()> {
        out.clear();
        match &mut self.speculation {
            Some(spec) => spec.propose(&self.tokens, lead, next, room, out, siblings),
            None => {
                if let Some(s) = siblings {
                    s.clear();
                }
                Ok(())
            }
        }
    }

    /// A check carried `checked` siblings, and the generation took one of them or not:
    /// count it ([`crate::SpeculationStats::siblings`]).
    pub fn record_siblings(&mut self, checked: usize, taken: bool) {
        if let Some(spec) = &mut self.speculation {
            spec.record_siblings(checked, taken);
        }
    }

    /// After a check of `drafted` drafts in a pass of `seconds` (`None` when the pass
    /// carried other sequences too), `kept` of them kept: count it, and rewind the cache to
    /// `n` positions (dropping the rest of the drafts).
    pub fn settle_drafts(
        &mut self,
        model: &Model,
        drafted: usize,
        kept: usize,
        seconds: Option<f64>,
        n: usize,
    ) -> Result<()> {
        if let Some(spec) = &mut self.speculation {
            spec.record(drafted, kept, seconds);
        }
        self.rewind_to(model, n)
    }

    /// Prompt tokens per forward pass of the prefill.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The state back, with the tokens its cache holds.
    pub fn into_parts(self) -> (State, Vec<u32>) {
        (self.state, self.tokens)
    }

    /// The sequence's state (its cache, policy, logits of the last pass).
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The tokens the cache holds, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// How many of `prompt`'s tokens [`Session::reuse_prefix`] would keep (for choosing
    /// among sessions before touching any).
    pub fn shared_prefix(&self, prompt: &[u32]) -> usize {
        reusable_prefix(&self.tokens, prompt)
    }

    /// Keep the part of the cache `prompt` starts with and forget the rest (the policy's
    /// state past it too); returns how many prompt tokens are kept, so the caller runs
    /// `prompt[n..]`. A sliding-window layer whose ring has already overwritten what the
    /// prefix needs makes that 0.
    pub fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let n = self.state.truncate(self.shared_prefix(prompt));
        self.tokens.truncate(n);
        n
    }

    /// Start `prompt` from the longer of what this session holds and what `cache` holds
    /// ([`PrefixCache::restore`] replaces the cache's rows when it has more); returns how
    /// many prompt tokens are kept, so the caller runs `prompt[n..]`.
    pub fn reuse_prefix_from(&mut self, cache: &mut PrefixCache, prompt: &[u32]) -> usize {
        let own = self.shared_prefix(prompt);
        let restored = cache.restore(prompt, &mut self.state, own);
        if restored > 0 {
            self.tokens.clear();
            self.tokens.extend_from_slice(&prompt[..restored]);
            return restored;
        }
        if self.state.n_past() != self.tokens.len() {
            // A failed import left the state empty.
            self.tokens.clear();
        }
        self.reuse_prefix(prompt)
    }

    /// The prompt about to be fed ends at position `end` ([`State::expect_prompt_end`]).
    pub fn expect_prompt_end(&mut self, end: usize) {
        self.state.expect_prompt_end(end);
    }

    /// Empty the cache.
    pub fn reset(&mut self) {
        self.state.reset();
        self.tokens.clear();
    }

    /// Run `tokens` at the next positions ([`Model::forward`]) and remember them.
    pub fn feed(&mut self, model: &Model, tokens: &[u32], want: Logits) -> Result<&[f32]> {
        let done = model.forward(&mut self.state, tokens, want).map(|_| ());
        self.settle(tokens, done.is_ok());
        done?;
        Ok(self.state.logits())
    }

    /// Run `tokens` as decode steps ([`Model::forward_steps`]) and remember them.
    pub fn feed_steps(&mut self, model: &Model, tokens: &[u32], want: Logits) -> Result<&[f32]> {
        self.feed_steps_with_siblings(model, tokens, &[], want)
    }

    /// [`Session::feed_steps`] where the last `siblings.len()` tokens are siblings
    /// ([`Model::forward_steps_with_siblings`]): the others are remembered.
    pub fn feed_steps_with_siblings(
        &mut self,
        model: &Model,
        tokens: &[u32],
        siblings: &[usize],
        want: Logits,
    ) -> Result<&[f32]> {
        let done = model
            .forward_steps_with_siblings(&mut self.state, tokens, siblings, want)
            .map(|_| ());
        self.settle(
            &tokens[..tokens.len() - siblings.len().min(tokens.len())],
            done.is_ok(),
        );
        done?;
        Ok(self.state.logits())
    }

    /// One forward pass over several sessions ([`Model::forward_many`]); each session's
    /// logits are then in its state ([`State::logits`]).
    pub fn forward_many(
        model: &Model,
        ws: &mut Workspace,
        steps: &mut [SessionStep<'_>],
    ) -> Result<()> {
        let done = {
            let mut seqs: Vec<SeqStep<'_>> = steps
                .iter_mut()
                .map(|s| SeqStep {
                    state: &mut s.session.state,
                    tokens: s.tokens,
                    want: s.want,
                    as_steps: s.as_steps,
                    siblings: s.siblings,
                })
                .collect();
            model.forward_many(ws, &mut seqs)
        };
        for s in steps.iter_mut() {
            let fed = s.tokens.len() - s.siblings.len().min(s.tokens.len());
            s.session.settle(&s.tokens[..fed], done.is_ok());
        }
        done
    }

    /// After a pass over `fed` that `ran` (or failed): the tokens follow the state's
    /// position.
    fn settle(&mut self, fed: &[u32], ran: bool) {
        if ran {
            self.tokens.extend_from_slice(fed);
        }
        // A failed pass leaves the position where it was; positions past it are garbage.
        self.tokens.truncate(self.state.n_past());
        debug_assert_eq!(self.tokens.len(), self.state.n_past());
    }

    /// Generate a completion of `prompt` (the whole prompt: the part the cache already
    /// holds is kept, see [`Session::reuse_prefix`]) as `gen` describes: prefill the rest
    /// in batches of [`Session::batch_size`], then step `gen` one forward pass per token,
    /// handing its output to `sink` as it becomes final. The sampler's penalty history
    /// receives the prompt tokens that run (keep one sampler across a conversation's
    /// turns, and the kept prefix was seen when it ran). The stats count only the prompt
    /// tokens that ran; [`GenerationStats::n_reused`] the ones kept. After it, the cache
    /// holds the prompt and every generated token but the last. On an error the session
    /// is emptied.
    ///
    /// ```no_run
    /// use sparrow::{Engine, Generation, KvType, Sampler, SamplerConfig, Session};
    /// use std::ops::ControlFlow;
    ///
    /// let engine = Engine::load("model.gguf")?;
    /// let mut session = Session::new(engine.model.new_state(4096, KvType::F16)?);
    /// let prompt = engine.tokenizer.encode("The sparrow is", true, true);
    /// let mut sampler = Sampler::new(SamplerConfig::greedy());
    /// // What to generate: at most 32 tokens, ending at a full stop (JSON: add
    /// // `.with_constraint(..)`, log-probabilities: `.with_logprobs(k)`).
    /// let mut gen = Generation::new(32, false).with_stops(vec![".".into()]);
    /// let stats = session.generate(&engine, &prompt, &mut sampler, &mut gen, &mut |_, text: &str| {
    ///     print!("{text}");
    ///     ControlFlow::Continue(())
    /// })?;
    /// eprintln!("{} tokens ({:?})", stats.n_generated, stats.stop);
    /// # Ok::<(), sparrow::Error>(())
    /// ```
    pub fn generate(
        &mut self,
        engine: &Engine,
        prompt: &[u32],
        sampler: &mut Sampler,
        gen: &mut Generation,
        sink: &mut impl TokenSink,
    ) -> Result<GenerationStats> {
        if prompt.is_empty() {
            return Err(Error::Other("the prompt is empty".into()));
        }
        if self.speculation.is_some() {
            crate::speculative::check_rewinds(&self.state)?;
        }
        let keep = self.reuse_prefix(prompt);
        let result = self.complete(engine, &prompt[keep..], sampler, gen, sink);
        match result {
            Ok(mut stats) => {
                stats.n_reused = keep;
                Ok(stats)
            }
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }

    /// Prefill `rest` (timed), then step `gen` until it ends.
    fn complete(
        &mut self,
        engine: &Engine,
        rest: &[u32],
        sampler: &mut Sampler,
        gen: &mut Generation,
        sink: &mut impl TokenSink,
    ) -> Result<GenerationStats> {
        let mut stats = GenerationStats {
            n_prompt: rest.len(),
            ..Default::default()
        };
        let t0 = Instant::now();
        let ran = prefill(
            &engine.model,
            &mut self.state,
            rest,
            self.batch_size,
            |d, t| sink.on_prefill(d, t),
        )
        .map(<[f32]>::to_vec);
        self.settle(rest, ran.is_ok());
        let mut logits = ran?;
        let mut speculation = self.speculation.take();
        if let Some(spec) = &mut speculation {
            // A draft model reads the prompt now, in the prompt's time.
            if let Err(e) = spec.prefill(&self.tokens) {
                self.speculation = speculation;
                return Err(e);
            }
        }
        stats.prompt_time = t0.elapsed();
        sampler.accept(rest);
        let t1 = Instant::now();
        match speculation {
            Some(mut spec) => {
                let before = spec.stats();
                let done = self.decode_speculatively(engine, sampler, gen, sink, &mut spec, logits);
                let after = spec.stats();
                self.speculation = Some(spec);
                done?;
                stats.speculation = Some(SpeculationStats {
                    drafted: after.drafted - before.drafted,
                    accepted: after.accepted - before.accepted,
                    target_passes: after.target_passes - before.target_passes,
                    siblings: after.siblings - before.siblings,
                    siblings_kept: after.siblings_kept - before.siblings_kept,
                });
            }
            None => loop {
                let room = self.state.n_ctx() - self.state.n_past();
                match gen.step(&engine.tokenizer, sampler, &mut logits, room, sink) {
                    Next::Feed(id) => {
                        self.feed(&engine.model, &[id], Logits::Last)?;
                        logits.copy_from_slice(self.state.last_logits());
                    }
                    Next::Done { .. } => break,
                }
            },
        }
        stats.n_generated = gen.n_generated();
        stats.stop = gen.stop_reason().unwrap_or_default();
        stats.gen_time = t1.elapsed();
        Ok(stats)
    }

    /// The token loop with drafts: each token to feed goes into one pass together with
    /// the drafts that follow it ([`Model::forward_steps`]); the generation then steps
    /// through the pass's rows as it would through one-token passes, and the drafts after
    /// the first one it does not sample are rewound. Where the state takes them
    /// ([`State::takes_siblings`]), the draft's second choices ride along as siblings: when
    /// the generation samples one in place of its draft, the token after it is known too,
    /// and the sibling is fed with the next pass. The output is the plain loop's (see
    /// [`crate::speculative`]).
    fn decode_speculatively(
        &mut self,
        engine: &Engine,
        sampler: &mut Sampler,
        gen: &mut Generation,
        sink: &mut impl TokenSink,
        spec: &mut Speculation,
        mut logits: Vec<f32>,
    ) -> Result<()> {
        let model = &engine.model;
        let vocab = model.config.vocab_size;
        let n_ctx = self.state.n_ctx();
        let takes_siblings = self.state.takes_siblings();
        let (mut drafts, mut siblings) = (Vec::new(), Vec::new());
        let (mut batch, mut sibling_rows) = (Vec::new(), Vec::new());
        // Tokens sampled but not yet in the cache before the one to feed: a sibling taken.
        let mut lead: Vec<u32> = Vec::new();
        let mut next = gen.step(
            &engine.tokenizer,
            sampler,
            &mut logits,
            n_ctx - self.state.n_past(),
            sink,
        );
        while let Next::Feed(id) = next {
            let n0 = self.state.n_past();
            let fed = lead.len() + 1;
            // Room for the fed tokens and the drafts in the cache, and no more drafts than
            // tokens the generation may still make after `id`.
            let room = (n_ctx - n0 - fed).min(gen.remaining().saturating_sub(1));
            let wants_siblings = takes_siblings.then_some(&mut siblings);
            spec.propose(&self.tokens, &lead, id, room, &mut drafts, wants_siblings)?;
            check_batch(&lead, id, &drafts, &siblings, &mut batch, &mut sibling_rows);
            let pass = Instant::now();
            self.feed_steps_with_siblings(model, &batch, &sibling_rows, Logits::All)?;
            let seconds = pass.elapsed().as_secs_f64();
            let rows = self.state.logits();
            let check = Check {
                unchecked: spec.takes_drafts_unchecked(),
                ..Check::of_pass(rows, vocab, fed, &drafts, &siblings, n_ctx - n0 - fed)
            };
            let judged = judge_drafts(check, gen, &engine.tokenizer, sampler, &mut logits, sink);
            let kept = judged.kept;
            next = judged.next;
            spec.record(drafts.len(), kept, Some(seconds));
            spec.record_siblings(siblings.len(), judged.sibling.is_some());
            lead.clear();
            lead.extend(judged.sibling);
            self.rewind_to(model, n0 + fed + kept)?;
        }
        Ok(())
    }

    /// Keep the first `n` positions of the cache. Where a sliding-window layer can no
    /// longer go back that far, the cache keeps less and the rest is run again, as the
    /// decode steps they were.
    fn rewind_to(&mut self, model: &Model, n: usize) -> Result<()> {
        if n >= self.state.n_past() {
            return Ok(());
        }
        let kept = self.state.truncate(n);
        let redo = self.tokens[kept..n].to_vec();
        self.tokens.truncate(kept);
        if !redo.is_empty() {
            self.feed_steps(model, &redo, Logits::None)?;
        }
        Ok(())
    }
}
