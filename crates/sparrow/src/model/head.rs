//! Logits over part of the vocabulary: what a draft model needs to propose tokens cheaply.
//!
//! A small model's output matrix is a large share of what its decode step reads (the
//! 0.5B Qwen's, 151,936 × 896 in Q8_0, is 37% of it), yet a draft only needs its best
//! token, and the model it drafts for checks every token anyway — so a draft whose head
//! covers the tokens it is likely to propose loses nothing but the rare proposal outside
//! them (after FR-Spec, Zhao et al. 2025, which ranks tokens by corpus frequency). Here
//! the part is the first ids of the vocabulary — byte-level BPE vocabularies number
//! tokens in merge order and SentencePiece ones by score, both roughly by frequency, so
//! no table is needed — and the ids the context itself holds (the names and rare words an
//! answer copies from its prompt).
//! Each logit in the part has the bits the whole head gives it
//! ([`sparrow_quant::QMatrix::first_rows`], [`sparrow_quant::matvec_rows`]).

use super::forward::{rms_norm, soft_cap};
use super::{Model, State};
use crate::error::{Error, Result};
use crate::model::Logits;
use sparrow_quant::{matvec, matvec_rows};

/// The ids a [`Model::forward_head`] computes logits for: `0..first`, then `extra` (ids at
/// or past `first`, ascending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VocabHead {
    first: usize,
    extra: Vec<u32>,
    vocab: usize,
}

/// The frequent part is kept a multiple of this many rows, so a head in row groups (16
/// rows each) is viewed in whole groups.
const FIRST_MULTIPLE: usize = 64;

impl VocabHead {
    /// The first `first` ids of a `vocab`-token vocabulary (rounded up to a multiple of 64,
    /// at most the vocabulary). `first == 0` or `first >= vocab`: the whole vocabulary.
    pub fn new(first: usize, vocab: usize) -> Self {
        let first = match first {
            0 => vocab,
            n => n.next_multiple_of(FIRST_MULTIPLE).min(vocab),
        };
        VocabHead {
            first,
            extra: Vec::new(),
            vocab,
        }
    }

    /// Also score `ids` (those past the first part; ids outside the vocabulary are left
    /// out — the model refuses them as input anyway).
    pub fn include(&mut self, ids: &[u32]) {
        for &id in ids {
            if (id as usize) < self.first || id as usize >= self.vocab {
                continue;
            }
            if let Err(at) = self.extra.binary_search(&id) {
                self.extra.insert(at, id);
            }
        }
    }

    /// Forget the ids included so far (a new context).
    pub fn clear_included(&mut self) {
        self.extra.clear();
    }

    /// How many logits a pass gives.
    pub fn len(&self) -> usize {
        self.first + self.extra.len()
    }

    /// Whether it scores no token (never: a vocabulary has tokens; for clippy's sake).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The token id of logit `i`.
    pub fn id(&self, i: usize) -> u32 {
        match i.checked_sub(self.first) {
            None => i as u32,
            Some(j) => self.extra[j],
        }
    }

    /// The size of the first part.
    pub fn first(&self) -> usize {
        self.first
    }
}

impl Model {
    /// [`Model::forward`] of `tokens`, with logits for the last one over `head`'s ids only
    /// (logit `i` is token [`VocabHead::id`]`(i)`, with the bits a whole-vocabulary pass
    /// gives it).
    pub fn forward_head<'s>(
        &self,
        state: &'s mut State,
        tokens: &[u32],
        head: &VocabHead,
    ) -> Result<&'s [f32]> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(Error::Other(
                "a pass over part of the vocabulary needs a token".into(),
            ));
        }
        if head.vocab != c.vocab_size {
            return Err(Error::Other(format!(
                "a head over a vocabulary of {} tokens asked of a model of {}",
                head.vocab, c.vocab_size
            )));
        }
        self.forward(state, tokens, Logits::None)?;
        let d = c.n_embd;
        let ws = &mut state.scratch;
        // The pass left its last rows' residual stream in the workspace.
        let last = &ws.x[ws.x.len() - d..];
        ws.xb.resize(d, 0.0);
        rms_norm(last, &self.weights.output_norm, c.rms_eps, &mut ws.xb[..d]);
        ws.logits.resize(head.len(), 0.0);
        let (frequent, included) = ws.logits.split_at_mut(head.first);
        let out = self.weights.output.matrix(self.file.bytes());
        matvec(&out.first_rows(head.first)?, &ws.xb[..d], frequent)?;
        matvec_rows(&out, &head.extra, &ws.xb[..d], included)?;
        soft_cap(&mut ws.logits, c.final_logit_softcap);
        Ok(&state.scratch.logits)
    }
}

#[cfg(test)]
mod tests {
    use super::VocabHead;

    #[test]
    fn a_head_numbers_its_first_part_then_the_included_ids() {
        let mut h = VocabHead::new(100, 1000);
        assert_eq!(h.first(), 128, "rounded up to whole 64-row runs");
        h.include(&[500, 5, 130, 999, 500, 1000, 128]);
        assert_eq!(h.len(), 128 + 4);
        let ids: Vec<u32> = (0..h.len()).map(|i| h.id(i)).collect();
        assert_eq!(&ids[..128], &(0..128).collect::<Vec<u32>>()[..]);
        assert_eq!(&ids[128..], &[128, 130, 500, 999]);
        h.clear_included();
        assert_eq!(h.len(), 128);
        assert_eq!(VocabHead::new(0, 1000).len(), 1000);
        assert_eq!(VocabHead::new(990, 1000).len(), 1000);
    }
}
