//! What to generate and where it goes: [`Generation`] is the token loop's body as a value
//! that is stepped — sample under the grammar, check the ends, cut at stop strings, keep the
//! text and log-probabilities that are final — and [`TokenSink`] receives that output.
//! Drivers run the model and hand the logits to [`Generation::next`]: a [`crate::Session`]
//! for one sequence ([`crate::Session::generate`], what `run` and `chat` use) and the
//! [`crate::scheduler`] for many sequences in one forward pass (what the server uses), so
//! every way of generating shares this one loop. [`prefill`] is the state-level utility
//! that feeds a prompt in batches.

use crate::error::{Error, Result};
use crate::grammar::JsonConstraint;
use crate::model::{Logits, Model, State, VocabHead};
use crate::sampler::{LogProbs, Sampler};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::ops::ControlFlow;
use std::time::Duration;

/// Timings and counts of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenerationStats {
    /// Prompt tokens run (not counting those a session kept in its cache).
    pub n_prompt: usize,
    /// Prompt tokens a [`crate::Session`] found already in its cache.
    pub n_reused: usize,
    pub prompt_time: Duration,
    pub n_generated: usize,
    pub gen_time: Duration,
    /// Why generation stopped.
    pub stop: StopReason,
    /// Drafts checked and kept, when the session speculates ([`crate::speculative`]).
    pub speculation: Option<SpeculationStats>,
}

/// Counts of a speculative generation (summed over its checks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Tokens proposed and checked.
    pub drafted: usize,
    /// Drafted tokens the model kept.
    pub accepted: usize,
    /// Forward passes of the model while generating (checks and plain steps).
    pub target_passes: usize,
    /// Sibling drafts checked (a draft's second choice beside it,
    /// [`crate::Model::forward_steps_with_siblings`]) and those the model took: each a
    /// token more for its check.
    pub siblings: usize,
    pub siblings_kept: usize,
}

impl SpeculationStats {
    /// Share of checked drafts kept.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopReason {
    /// The token limit.
    #[default]
    Length,
    /// An end-of-generation token (not part of the output).
    EndOfGeneration,
    /// A stop string (cut from the output with everything after it).
    StopString,
    /// The context has no room for another token.
    ContextFull,
    /// The caller stopped it.
    Cancelled,
}

impl GenerationStats {
    /// Prompt tokens per second.
    pub fn prompt_tps(&self) -> f64 {
        self.n_prompt as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }
    /// Generated tokens per second.
    pub fn gen_tps(&self) -> f64 {
        self.n_generated as f64 / self.gen_time.as_secs_f64().max(1e-9)
    }
}

/// A generated token's log-probability under the model (raw logits: before penalties,
/// temperature or a grammar) and the most likely alternatives at its step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The most likely tokens at that step, most likely first.
    pub top: Vec<(u32, f32)>,
    /// Where the token's text starts in the completion's text (bytes).
    pub offset: usize,
}

/// What to do after [`Generation::next`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// `id` was generated: feed it to the model, then call `next` with the logits after it.
    Feed(u32),
    /// Generation ended. `token`, when there is one, was generated (its text is part of
    /// the output) and is not to be fed.
    Done {
        token: Option<u32>,
        reason: StopReason,
    },
}

impl Next {
    /// The token generated at this step, if any.
    pub fn token(self) -> Option<u32> {
        match self {
            Next::Feed(id) => Some(id),
            Next::Done { token, .. } => token,
        }
    }
}

/// What became final since the last [`Generation::take_output`]: the log-probabilities of
/// the tokens whose text starts in `text` (or anywhere, once generation is done), then the
/// text.
#[derive(Debug, Default)]
pub struct Output {
    pub logprobs: Vec<TokenLogprob>,
    pub text: String,
}

/// One completion's token loop, stepped by its driver: the driver runs the model (alone,
/// or with other sequences in one pass) and hands [`Generation::next`] the logits.
pub struct Generation {
    limit: usize,
    stop_at_eog: bool,
    constraint: Option<JsonConstraint>,
    stops: Vec<String>,
    logprobs: Option<usize>,
    decoder: StreamDecoder,
    /// The completion's text so far (cut at a stop string once one is found).
    text: String,
    /// Bytes of `text` handed out.
    sent: usize,
    n_generated: usize,
    done: Option<StopReason>,
    /// Log-probabilities not yet handed out.
    pending: Vec<TokenLogprob>,
}

impl Generation {
    /// A generation of at most `limit` tokens that ends at an end-of-generation token
    /// unless `ignore_eos`.
    pub fn new(limit: usize, ignore_eos: bool) -> Self {
        Generation {
            limit,
            stop_at_eog: !ignore_eos,
            constraint: None,
            stops: Vec::new(),
            logprobs: None,
            decoder: StreamDecoder::new(),
            text: String::new(),
            sent: 0,
            n_generated: 0,
            done: None,
            pending: Vec::new(),
        }
    }

    /// Sample under a JSON grammar: end of generation only once the value is complete
    /// (and then always, whatever `ignore_eos` said), and never a token after which the
    /// value could not be closed in the tokens left.
    pub fn with_constraint(mut self, c: JsonConstraint) -> Self {
        self.constraint = Some(c);
        self
    }

    /// End at the first of these strings (cut from the output with what follows it); text
    /// that may be the start of one is held back until it is not.
    pub fn with_stops(mut self, stops: Vec<String>) -> Self {
        self.stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        self
    }

    /// Report each generated token's log-probability and its `k` most likely alternatives.
    pub fn with_logprobs(mut self, k: usize) -> Self {
        self.logprobs = Some(k);
        self
    }

    /// Tokens generated so far.
    pub fn n_generated(&self) -> usize {
        self.n_generated
    }

    /// Tokens it may still generate.
    pub fn remaining(&self) -> usize {
        self.limit.saturating_sub(self.n_generated)
    }

    /// Why it ended, once it has.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.done
    }

    /// The grammar's state, if there is one.
    pub fn constraint(&self) -> Option<&JsonConstraint> {
        self.constraint.as_ref()
    }

    /// Choose the next token from `logits` (the model's output after the last token fed;
    /// sampling may change them in place). `room` is how many more tokens the sequence's
    /// cache can take: a token generated when it is 0 cannot be fed and ends the
    /// generation.
    pub fn next(
        &mut self,
        tokenizer: &Tokenizer,
        sampler: &mut Sampler,
        logits: &mut [f32],
        room: usize,
    ) -> Next {
        if let Some(reason) = self.done {
            return Next::Done {
                token: None,
                reason,
            };
        }
        let left = self.limit - self.n_generated;
        if left == 0 {
            return self.end(None, StopReason::Length);
        }
        // Log-probabilities come from the raw logits, which sampling may change in place.
        let raw = self
            .logprobs
            .map(|k| (LogProbs::of(logits, k), logits.to_vec()));
        let id = match &mut self.constraint {
            // The value must close within the tokens this generation may still make.
            Some(c) => c.sample(sampler, logits, Some(left.min(room.saturating_add(1)))),
            None => sampler.sample(logits),
        };
        if tokenizer.is_eog(id) && (self.constraint.is_some() || self.stop_at_eog) {
            return self.end(None, StopReason::EndOfGeneration);
        }
        self.n_generated += 1;
        if let Some((lp, raw)) = raw {
            self.pending.push(TokenLogprob {
                id,
                logprob: lp.of_logit(raw[id as usize]),
                top: lp.top,
                offset: self.text.len(),
            });
        }
        let piece = self.decoder.push(tokenizer, id);
        self.text.push_str(&piece);
        if let Some(at) = find_stop(&self.text, self.sent, &self.stops) {
            self.text.truncate(at);
            return self.end(Some(id), StopReason::StopString);
        }
        if self.n_generated == self.limit {
            return self.end(Some(id), StopReason::Length);
        }
        if room == 0 {
            return self.end(Some(id), StopReason::ContextFull);
        }
        Next::Feed(id)
    }

    /// One step of the loop with its output delivered: [`Generation::next`], then what
    /// became final goes to `sink` (log-probabilities first, then the token with its
    /// text). A `Break` from the sink cancels a generation that was to go on (what it
    /// still held is flushed to the sink with `None`) and turns `Feed(id)` into
    /// `Done { token: Some(id), reason: Cancelled }`. Both drivers, [`crate::Session`] and
    /// the [`crate::scheduler`], step this.
    pub fn step(
        &mut self,
        tokenizer: &Tokenizer,
        sampler: &mut Sampler,
        logits: &mut [f32],
        room: usize,
        sink: &mut impl TokenSink,
    ) -> Next {
        let next = self.next(tokenizer, sampler, logits, room);
        let stop = deliver(self.take_output(), next.token(), sink).is_break();
        match next {
            Next::Feed(id) if stop => {
                self.cancel();
                let _ = deliver(self.take_output(), None, sink);
                Next::Done {
                    token: Some(id),
                    reason: StopReason::Cancelled,
                }
            }
            next => next,
        }
    }

    /// Stop here (the caller's reason, e.g. a client gone or Ctrl-C).
    pub fn cancel(&mut self) {
        if self.done.is_none() {
            self.end(None, StopReason::Cancelled);
        }
    }

    fn end(&mut self, token: Option<u32>, reason: StopReason) -> Next {
        if reason != StopReason::StopString {
            // Bytes of an unfinished character, as replacement characters.
            let rest = self.decoder.flush();
            self.text.push_str(&rest);
        }
        self.done = Some(reason);
        Next::Done { token, reason }
    }

    /// The text that is final now, and the log-probabilities of its tokens. While
    /// generating, text that could begin a stop string is held back; once done, all of
    /// it (the tokens a stop string cut off entirely have no log-probabilities here).
    pub fn take_output(&mut self) -> Output {
        let safe = if self.done.is_some() {
            self.text.len()
        } else {
            self.text.len() - held_back(&self.text[self.sent..], &self.stops)
        };
        let mut out = Output::default();
        if safe > self.sent || self.done.is_some() {
            // Once done, every token's text is out, except after a stop string: the
            // tokens it cut off entirely start at or past the end.
            let all = self.done.is_some_and(|r| r != StopReason::StopString);
            let n = self
                .pending
                .iter()
                .take_while(|t| all || t.offset < safe)
                .count();
            out.logprobs = self.pending.drain(..n).collect();
            if self.done.is_some() {
                self.pending.clear();
            }
            out.text = self.text[self.sent..safe].to_string();
            self.sent = safe;
        }
        out
    }
}

/// Where a generation's output goes as it becomes final (see [`crate::Session::generate`]).
///
/// A closure `FnMut(Option<u32>, &str) -> ControlFlow<()>` is a sink that only takes
/// tokens; [`WithProgress`] adds a prefill progress callback to one.
pub trait TokenSink {
    /// Token `id` was generated and `text` is the output it made final (possibly empty:
    /// text that may begin a stop string is held back, and a character may span tokens).
    /// A last call with `None` brings the text still held when generation ends. Return
    /// `ControlFlow::Break(())` to stop (the generation then ends as
    /// [`StopReason::Cancelled`]).
    fn on_token(&mut self, id: Option<u32>, text: &str) -> ControlFlow<()>;

    /// The log-probabilities of the tokens whose text starts in the text of the next
    /// [`TokenSink::on_token`] call (only under [`Generation::with_logprobs`]).
    fn on_logprobs(&mut self, _logprobs: Vec<TokenLogprob>) {}

    /// `done` of the `total` prompt tokens that run have run (after each prefill batch).
    fn on_prefill(&mut self, _done: usize, _total: usize) {}
}

impl<F: FnMut(Option<u32>, &str) -> ControlFlow<()>> TokenSink for F {
    fn on_token(&mut self, id: Option<u32>, text: &str) -> ControlFlow<()> {
        self(id, text)
    }
}

/// A sink that appends every piece of output text to `out` and never stops the generation:
/// `session.generate(.., &mut collect_text(&mut text))`.
pub fn collect_text(out: &mut String) -> impl FnMut(Option<u32>, &str) -> ControlFlow<()> + '_ {
    |_, text| {
        out.push_str(text);
        ControlFlow::Continue(())
    }
}

/// A sink that appends the id of every generated token to `out` and never stops the
/// generation: `session.generate(.., &mut collect_ids(&mut ids))`.
pub fn collect_ids(out: &mut Vec<u32>) -> impl FnMut(Option<u32>, &str) -> ControlFlow<()> + '_ {
    |id, _| {
        out.extend(id);
        ControlFlow::Continue(())
    }
}

/// A token callback and a prefill progress callback, as one [`TokenSink`].
pub struct WithProgress<T, P> {
    /// Receives what [`TokenSink::on_token`] receives.
    pub on_token: T,
    /// Receives what [`TokenSink::on_prefill`] receives.
    pub on_prefill: P,
}

impl<T, P> TokenSink for WithProgress<T, P>
where
    T: FnMut(Option<u32>, &str) -> ControlFlow<()>,
    P: FnMut(usize, usize),
{
    fn on_token(&mut self, id: Option<u32>, text: &str) -> ControlFlow<()> {
        (self.on_token)(id, text)
    }
    fn on_prefill(&mut self, done: usize, total: usize) {
        (self.on_prefill)(done, total)
    }
}

/// Hands `out` to `sink`: its log-probabilities first (they describe the text that
/// follows), then `token` with the text, when there is either; the sink's answer.
fn deliver(out: Output, token: Option<u32>, sink: &mut impl TokenSink) -> ControlFlow<()> {
    if !out.logprobs.is_empty() {
        sink.on_logprobs(out.logprobs);
    }
    if token.is_some() || !out.text.is_empty() {
        sink.on_token(token, &out.text)
    } else {
        ControlFlow::Continue(())
    }
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

/// Feed `tokens` into `state` in batches of `batch_size`, calling `progress(done, total)`
/// after each batch, and return the logits of the last token.
pub fn prefill<'s>(
    model: &Model,
    state: &'s mut State,
    tokens: &[u32],
    batch_size: usize,
    progress: impl FnMut(usize, usize),
) -> Result<&'s [f32]> {
    prefill_into(model, state, tokens, batch_size, None, progress)
}

/// [`prefill`] whose logits for the last token cover only `head`'s ids (a draft model
/// catching up: [`Model::forward_head`]).
pub fn prefill_head<'s>(
    model: &Model,
    state: &'s mut State,
    tokens: &[u32],
    batch_size: usize,
    head: &VocabHead,
) -> Result<&'s [f32]> {
    prefill_into(model, state, tokens, batch_size, Some(head), |_, _| {})
}

fn prefill_into<'s>(
    model: &Model,
    state: &'s mut State,
    tokens: &[u32],
    batch_size: usize,
    head: Option<&VocabHead>,
    mut progress: impl FnMut(usize, usize),
) -> Result<&'s [f32]> {
    if state.n_past() + tokens.len() > state.n_ctx() {
        return Err(Error::PromptTooLong {
            n_prompt: state.n_past() + tokens.len(),
            n_ctx: state.n_ctx(),
        });
    }
    state.expect_prompt_end(state.n_past() + tokens.len());
    let batch = batch_size.max(1);
    let n_chunks = tokens.len().div_ceil(batch);
    for (i, chunk) in tokens.chunks(batch).enumerate() {
        let last = i + 1 == n_chunks;
        match (last, head) {
            (true, Some(head)) => {
                model.forward_head(state, chunk, head)?;
            }
            (true, None) => {
                model.forward(state, chunk, Logits::Last)?;
            }
            (false, _) => {
                model.forward(state, chunk, Logits::None)?;
            }
        }
        progress((i * batch + chunk.len()).min(tokens.len()), tokens.len());
    }
    // Borrow dance: the last forward's logits live in the state's scratch.
    Ok(match head {
        Some(_) => state.logits(),
        None => state.last_logits(),
    })
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
