//! What a caller hands the scheduler ([`Job`]) and how it hears back ([`Reply`], [`Event`]).

use crate::generate::{Generation, StopReason, TokenLogprob};
use crate::sampler::Sampler;
use std::sync::mpsc::{channel, Receiver, Sender};

/// One completion to generate: the prompt, what to generate, how to sample, and where its
/// events go.
pub struct Job {
    /// The prompt's token ids (not empty; it and the completion must fit a slot's context).
    pub prompt: Vec<u32>,
    /// What to generate: the token limit, stop strings, a grammar, log-probabilities.
    pub generation: Generation,
    /// The sampler; its penalty history receives the whole prompt first.
    pub sampler: Sampler,
    /// Where the job's events go, and how the scheduler learns the caller gave up.
    pub reply: Box<dyn Reply>,
}

/// What the scheduler reports about a job, in order: text (each `Text` preceded by the
/// log-probabilities of the tokens that start in it, when asked for), then `Done` or
/// `Error`. A cancelled job ends with neither.
#[derive(Debug)]
pub enum Event {
    /// More of the completion's text.
    Text(String),
    /// The log-probabilities of the tokens whose text starts in the next `Text` (or, before
    /// `Done`, anywhere in the completion): sent only under [`Generation::with_logprobs`].
    Logprobs(Vec<TokenLogprob>),
    /// The end, with why and the counts.
    Done(Usage),
    /// The model failed (e.g. a cold KV file could not be written).
    Error(String),
}

/// How a completed job ended and what it cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Why generation ended (never [`StopReason::Cancelled`]: a cancelled job has no `Done`).
    pub stop: StopReason,
    /// The prompt's tokens, reused ones included.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Prompt tokens found already in the slot's cache (not run again).
    pub cached_tokens: usize,
}

/// Where a job's events go. It is called on the scheduler's thread, between forward passes,
/// so it should not block.
pub trait Reply: Send {
    /// Deliver `event`.
    fn send(&mut self, event: Event);
    /// True once nobody waits for the events any more (a client went away): the job then
    /// stops at the next turn, counted as cancelled.
    fn is_cancelled(&self) -> bool;
}

/// A [`Reply`] over a std channel; the job counts as cancelled once a send finds the
/// receiver dropped.
pub struct ChannelReply {
    tx: Sender<Event>,
    gone: bool,
}

/// A [`ChannelReply`] and the receiver of its events.
pub fn reply_channel() -> (ChannelReply, Receiver<Event>) {
    let (tx, rx) = channel();
    (ChannelReply { tx, gone: false }, rx)
}

impl Reply for ChannelReply {
    fn send(&mut self, event: Event) {
        self.gone |= self.tx.send(event).is_err();
    }
    fn is_cancelled(&self) -> bool {
        self.gone
    }
}
