//! A [`Session`]: one sequence's [`State`] together with the tokens its cache holds, so a
//! new prompt that starts like the previous one (the next turn of a chat, a server slot's
//! next request) only runs what differs. Prefix reuse lives here and nowhere else.

use crate::error::Result;
use crate::generate::{drive, GenerateOptions, Generation, GenerationStats};
use crate::model::{Logits, Model, SeqStep, State, Workspace};
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;
use std::ops::ControlFlow;

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
}

/// One session's share of a batched forward pass ([`Session::forward_many`]).
pub struct SessionStep<'a> {
    pub session: &'a mut Session,
    pub tokens: &'a [u32],
    pub want: Logits,
}

impl Session {
    /// A session over `state`, whose cache is taken as empty.
    pub fn new(mut state: State) -> Self {
        state.reset();
        Session {
            state,
            tokens: Vec::new(),
        }
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
                })
                .collect();
            model.forward_many(ws, &mut seqs)
        };
        for s in steps.iter_mut() {
            s.session.settle(s.tokens, done.is_ok());
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

    /// Generate from `prompt` (the whole prompt: the part the cache already holds is kept,
    /// see [`Session::reuse_prefix`]) with `gen`; see [`crate::generate`] for `on_token`.
    /// The stats count only the prompt tokens that ran; [`GenerationStats::n_reused`] the
    /// ones kept. On an error the session is emptied.
    #[allow(clippy::too_many_arguments)]
    pub fn generate(
        &mut self,
        model: &Model,
        tokenizer: &Tokenizer,
        prompt: &[u32],
        sampler: &mut Sampler,
        opts: &GenerateOptions,
        gen: &mut Generation,
        progress: impl FnMut(usize, usize),
        mut on_token: impl FnMut(Option<u32>, &str) -> ControlFlow<()>,
    ) -> Result<GenerationStats> {
        let keep = self.reuse_prefix(prompt);
        let mut generated = Vec::new();
        let result = drive(
            model,
            tokenizer,
            &mut self.state,
            &prompt[keep..],
            sampler,
            opts,
            gen,
            progress,
            |id, text| {
                generated.extend(id);
                on_token(id, text)
            },
        );
        match result {
            Ok(mut stats) => {
                // The cache holds the prompt and every generated token but the last.
                self.tokens.extend_from_slice(&prompt[keep..]);
                self.tokens.extend_from_slice(&generated);
                self.tokens.truncate(self.state.n_past());
                stats.n_reused = keep;
                Ok(stats)
            }
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }
}
