//! A checked request as a job for the library's scheduler, and the channel its events come
//! back on to the async side.

use super::api::Request;
use sparrow::grammar::{JsonConstraint, JsonVocab, Root};
use sparrow::scheduler::{Event, Job, Reply};
use sparrow::{Generation, Sampler, StopReason};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// The scheduler's events for one request, into the handler's tokio channel. A handler
/// that is dropped (the client disconnected) closes the channel, which cancels the job.
struct ToHandler(UnboundedSender<Event>);

impl Reply for ToHandler {
    fn send(&mut self, event: Event) {
        let _ = self.0.send(event);
    }
    fn is_cancelled(&self) -> bool {
        self.0.is_closed()
    }
}

/// The job for `req` over `prompt`, generating at most `max_tokens`, and the receiver of
/// its events. `json_object` and `json_schema` responses sample under a grammar built on
/// `vocab` (which then ends at the end-of-generation token it allows once the value is
/// complete, whatever `ignore_eos` says).
pub fn job(
    req: &Request,
    prompt: Vec<u32>,
    max_tokens: usize,
    vocab: &Arc<JsonVocab>,
) -> (Job, UnboundedReceiver<Event>) {
    let mut generation = Generation::new(max_tokens, req.ignore_eos).with_stops(req.stop.clone());
    if let Some(schema) = &req.schema {
        generation =
            generation.with_constraint(JsonConstraint::with_schema(vocab.clone(), schema.clone()));
    } else if req.json {
        generation = generation.with_constraint(JsonConstraint::new(vocab.clone(), Root::Object));
    }
    if let Some(k) = req.logprobs {
        generation = generation.with_logprobs(k);
    }
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt,
        generation,
        sampler: Sampler::new(req.sampler.clone()),
        reply: Box::new(ToHandler(tx)),
    };
    (job, rx)
}

/// OpenAI's `finish_reason` for how a completion ended.
pub fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::EndOfGeneration | StopReason::StopString | StopReason::Cancelled => "stop",
        StopReason::Length | StopReason::ContextFull => "length",
    }
}
