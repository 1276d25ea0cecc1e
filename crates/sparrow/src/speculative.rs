//! Speculative decoding: something cheap proposes the next few tokens, and the model checks
//! them all in one forward pass ([`Model::forward_steps`]), which reads its weights once —
//! decode is bound by reading the weights, so each accepted draft is a token for (almost)
//! free. Two proposers: a smaller model sharing the tokenizer ([`DraftModel`], llama.cpp's
//! `--draft-model`) and n-gram lookup in the context itself ([`PromptLookup`], `--lookup`).
//!
//! Why the output is the plain output. Drafts are proposed deterministically (the draft
//! model's most likely token; the lookup's continuation), and [`crate::Session`] checks
//! them by *sampling from the model's own logits* at each drafted position, exactly as
//! plain decoding would, keeping a draft only while the sampled token equals it. For a
//! deterministic draft this is the standard speculative-sampling rule (accept draft `x`
//! with probability min(1, p(x)/q(x)) = p(x), else draw from the normalised
//! max(0, p − q) = p without `x`) — and more: each output token costs one draw of the same
//! sampler with the same RNG, so the output is the plain output token for token, at
//! temperature 0 and with sampling, with penalties, grammars and stop strings alike.
//! Checked drafts see the bits a one-token pass gives (`forward_steps` attends token by
//! token with the decode policy and keeps the one-token products), and rejected ones are
//! rewound from the KV store and the policy ([`State::truncate`]).

use crate::error::{Error, Result};
use crate::generate::{prefill, SpeculationStats};
use crate::model::{Model, State};
use crate::sampler::argmax;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

/// Most draft tokens per check unless set (llama.cpp's `--draft-max` default).
pub const DEFAULT_DRAFT_MAX: usize = 16;

/// The draft model stops proposing below this probability of its own best token unless
/// set (llama.cpp's `--draft-p-min` default).
pub const DEFAULT_DRAFT_P_MIN: f32 = 0.75;

/// How drafts are made, and how many per check.
pub struct Speculation {
    drafter: Drafter,
    /// Most drafts per check (`--draft-max`).
    draft_max: usize,
    /// Fewer drafts than this are not checked: the step runs plainly (`--draft-min`).
    draft_min: usize,
    /// Drafts to ask for next: grows by 2 after a check that kept every draft, shrinks by
    /// 1 after one that did not (within 1..=draft_max), so a run of easy text drafts far
    /// and a hard one wastes little.
    window: usize,
    stats: SpeculationStats,
}

/// What proposes drafts.
pub enum Drafter {
    Model(Box<DraftModel>),
    Lookup(PromptLookup),
}

impl Speculation {
    /// Speculation with `drafter`, at most `draft_max` drafts per check (≥ 1) and none
    /// checked when fewer than `draft_min` come.
    pub fn new(drafter: Drafter, draft_max: usize, draft_min: usize) -> Result<Self> {
        if draft_max == 0 {
            return Err(Error::Other("--draft-max must be at least 1".into()));
        }
        if draft_min > draft_max {
            return Err(Error::Other(format!(
                "--draft-min {draft_min} is above --draft-max {draft_max}"
            )));
        }
        Ok(Speculation {
            drafter,
            draft_max,
            draft_min,
            window: draft_max,
            stats: SpeculationStats::default(),
        })
    }

    /// Counts since the last [`Speculation::take_stats`].
    pub fn stats(&self) -> SpeculationStats {
        self.stats
    }

    /// The counts so far, restarting them.
    pub fn take_stats(&mut self) -> SpeculationStats {
        std::mem::take(&mut self.stats)
    }

    /// Drafts to follow `context` then `next` (the token about to be fed), at most
    /// `room` of them, into `out` (emptied first). Too few to check leaves `out` empty.
    pub(crate) fn propose(
        &mut self,
        context: &[u32],
        next: u32,
        room: usize,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        out.clear();
        let want = self.window.min(room);
        if want == 0 || want < self.draft_min {
            return Ok(());
        }
        match &mut self.drafter {
            Drafter::Model(m) => m.propose(context, next, want, out)?,
            Drafter::Lookup(l) => l.propose(context, next, want, out),
        }
        if out.len() < self.draft_min.max(1) {
            out.clear();
        }
        Ok(())
    }

    /// After a check of `drafted` tokens of which the first `accepted` were kept.
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize) {
        self.stats.target_passes += 1;
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        if drafted == 0 {
            return;
        }
        self.window = if accepted == drafted {
            (self.window + 2).min(self.draft_max)
        } else {
            self.window.saturating_sub(1).max(1)
        };
    }
}

/// A smaller model with the same vocabulary, run greedily on its own state (its own KV
/// cache and attention policy) to propose drafts.
pub struct DraftModel {
    model: Arc<Model>,
    state: State,
    /// The tokens the draft's cache holds (`tokens.len() == state.n_past()`).
    tokens: Vec<u32>,
    p_min: f32,
    batch_size: usize,
}

impl DraftModel {
    /// A draft model over `state` (a state of `model`), proposing while its best token's
    /// probability is at least `p_min`. `batch_size`: prompt tokens per pass when it
    /// catches up with a long context.
    pub fn new(model: Arc<Model>, state: State, p_min: f32, batch_size: usize) -> Result<Self> {
        if !(0.0..=1.0).contains(&p_min) {
            return Err(Error::Other(format!(
                "--draft-p-min {p_min} is outside [0, 1]"
            )));
        }
        Ok(DraftModel {
            model,
            state,
            tokens: Vec::new(),
            p_min,
            batch_size: batch_size.max(1),
        })
    }

    /// Greedy drafts after `context` + `next`: catch the draft's cache up (keeping the
    /// prefix it shares), then one token per pass until `want`, an unsure step or the
    /// end of its context.
    fn propose(
        &mut self,
        context: &[u32],
        next: u32,
        want: usize,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let total = context.len() + 1;
        if total >= self.state.n_ctx() {
            // Past the draft's context: no drafts, the model decodes plainly.
            return Ok(());
        }
        let token_at = |i: usize| if i < context.len() { context[i] } else { next };
        let shared = self
            .tokens
            .iter()
            .enumerate()
            .take_while(|&(i, &t)| i < total && t == token_at(i))
            .count()
            .min(total - 1);
        let kept = self.state.truncate(shared);
        self.tokens.truncate(kept);
        let rest: Vec<u32> = (kept..total).map(token_at).collect();
        let room = self.state.n_ctx().saturating_sub(total);
        let want = want.min(room);
        if want == 0 {
            return Ok(());
        }
        let logits = prefill(
            &self.model,
            &mut self.state,
            &rest,
            self.batch_size,
            |_, _| {},
        );
        let mut logits = match logits {
            Ok(l) => l.to_vec(),
            Err(e) => {
                self.reset();
                return Err(e);
            }
        };
        self.tokens.extend_from_slice(&rest);
        while out.len() < want {
            let (id, p) = best_with_probability(&logits);
            if p < self.p_min {
                break;
            }
            out.push(id);
            if out.len() == want {
                break;
            }
            match self
                .model
                .forward(&mut self.state, &[id], crate::model::Logits::Last)
            {
                Ok(l) => logits.copy_from_slice(l),
                Err(e) => {
                    self.reset();
                    return Err(e);
                }
            }
            self.tokens.push(id);
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.state.reset();
        self.tokens.clear();
    }
}

/// The most likely token and its probability under softmax(`logits`).
fn best_with_probability(logits: &[f32]) -> (u32, f32) {
    let id = argmax(logits);
    let max = logits[id as usize];
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (id, 1.0 / sum)
}

/// Prompt lookup: the drafts are what followed the most recent earlier occurrence of the
/// context's last n-gram (longest first, from `ngram_max` tokens down to one), in the
/// prompt and the text generated so far — no second model. Code edits and summaries
/// repeat long runs of their input, which this finds for free.
pub struct PromptLookup {
    ngram_max: usize,
}

impl PromptLookup {
    /// Lookup matching up to `ngram_max` (≥ 1) tokens.
    pub fn new(ngram_max: usize) -> Result<Self> {
        if ngram_max == 0 {
            return Err(Error::Other(
                "--lookup needs an n-gram of at least 1 token".into(),
            ));
        }
        Ok(PromptLookup { ngram_max })
    }

    fn propose(&self, context: &[u32], next: u32, want: usize, out: &mut Vec<u32>) {
        let mut seq = Vec::with_capacity(context.len() + 1);
        seq.extend_from_slice(context);
        seq.push(next);
        out.extend_from_slice(lookup(&seq, self.ngram_max, want));
    }
}

/// Up to `want` tokens that followed the latest earlier occurrence of `seq`'s last n-gram,
/// trying n = `ngram_max` down to 1; empty when none occurs earlier.
pub fn lookup(seq: &[u32], ngram_max: usize, want: usize) -> &[u32] {
    let len = seq.len();
    for n in (1..=ngram_max.min(len.saturating_sub(1))).rev() {
        let tail = &seq[len - n..];
        // The latest start before the tail itself whose n tokens equal it.
        if let Some(start) = (0..len - n).rev().find(|&s| &seq[s..s + n] == tail) {
            let from = start + n;
            return &seq[from..(from + want).min(len)];
        }
    }
    &[]
}

/// Whether `draft` can propose tokens for `target`: the same tokens under the same ids. The
/// error names the first id where they differ.
pub fn check_vocabularies(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    let (nt, nd) = (target.vocab_size(), draft.vocab_size());
    for id in 0..nt.min(nd) as u32 {
        if target.piece(id) != draft.piece(id) || target.token_text(id) != draft.token_text(id) {
            return Err(Error::Other(format!(
                "the draft model's vocabulary differs from the model's at token {id}: {:?} in the draft, {:?} in the model",
                draft.token_text(id).unwrap_or(""),
                target.token_text(id).unwrap_or("")
            )));
        }
    }
    if nt != nd {
        return Err(Error::Other(format!(
            "the draft model's vocabulary has {nd} tokens, the model's {nt} (the first {} agree)",
            nt.min(nd)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_longest_latest_match() {
        // "1 2 3 4 | 9 2 3 5 | 2 3": the 2-gram "2 3" last occurred before "5".
        let seq = [1, 2, 3, 4, 9, 2, 3, 5, 2, 3];
        assert_eq!(lookup(&seq, 2, 3), &[5, 2, 3]);
        // With 3-grams allowed, "5 2 3" never occurred before: falls back to "2 3".
        assert_eq!(lookup(&seq, 3, 1), &[5]);
        let seq = [7, 1, 2, 3, 8, 0, 1, 2, 3];
        // 3-gram "1 2 3" occurred at 1; what followed: 8, 0.
        assert_eq!(lookup(&seq, 3, 2), &[8, 0]);
        // Nothing repeats: no draft.
        assert!(lookup(&[1, 2, 3, 4], 3, 4).is_empty());
        assert!(lookup(&[5], 3, 4).is_empty());
        // The continuation stops at the end of the sequence.
        assert_eq!(lookup(&[4, 4], 1, 5), &[4]);
    }

    #[test]
    fn window_adapts_to_acceptance() {
        let mut s = Speculation::new(Drafter::Lookup(PromptLookup::new(2).unwrap()), 8, 0).unwrap();
        assert_eq!(s.window, 8);
        s.record(8, 3);
        assert_eq!(s.window, 7);
        s.record(7, 7);
        assert_eq!(s.window, 8);
        for _ in 0..20 {
            s.record(1, 0);
        }
        assert_eq!(s.window, 1);
        assert_eq!(s.stats().drafted, 8 + 7 + 20);
        assert_eq!(s.stats().accepted, 10);
        assert!(Speculation::new(Drafter::Lookup(PromptLookup::new(2).unwrap()), 0, 0).is_err());
        assert!(Speculation::new(Drafter::Lookup(PromptLookup::new(2).unwrap()), 4, 5).is_err());
    }

    #[test]
    fn best_probability_is_the_softmax_of_the_best() {
        let (id, p) = best_with_probability(&[0.0, 2.0_f32.ln(), 0.0]);
        assert_eq!(id, 1);
        assert!((p - 0.5).abs() < 1e-6, "{p}");
    }
}
