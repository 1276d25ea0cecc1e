//! Perplexity the way llama.cpp's `llama-perplexity` computes it, so figures compare: the
//! text is cut into chunks of `n_ctx` tokens, each chunk is evaluated from an empty cache
//! (its first token replaced by BOS when the model adds one), and only the second half of
//! each chunk is scored, so every scored token has at least `n_ctx / 2` tokens of context.

use sparrow::attention::AttentionChoice;
use sparrow::model::{Logits, Model};
use sparrow::{Error, KvOptions, Result};

/// Natural-log probability of `target` under `logits` (a stable log-softmax in f64).
pub fn log_prob(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[target as usize] as f64 - max - sum.ln()
}

/// Result of one chunk.
#[derive(Clone, Copy, Debug)]
pub struct ChunkScore {
    /// Sum of negative log-likelihoods of the scored tokens.
    pub nll: f64,
    /// Sum of squared NLLs (for the error estimate).
    pub nll2: f64,
    /// Number of scored tokens.
    pub count: usize,
}

/// Running perplexity over chunks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Perplexity {
    pub nll: f64,
    pub nll2: f64,
    pub count: usize,
}

impl Perplexity {
    /// Add a chunk's scores.
    pub fn add(&mut self, c: ChunkScore) {
        self.nll += c.nll;
        self.nll2 += c.nll2;
        self.count += c.count;
    }

    /// exp(mean NLL).
    pub fn value(&self) -> f64 {
        (self.nll / self.count.max(1) as f64).exp()
    }

    /// One standard error of the perplexity estimate (delta method, as llama.cpp reports).
    pub fn std_error(&self) -> f64 {
        let n = self.count as f64;
        if n < 2.0 {
            return 0.0;
        }
        let mean = self.nll / n;
        let var = (self.nll2 / n - mean * mean).max(0.0) * n / (n - 1.0);
        (var / n).sqrt() * self.value()
    }
}

/// How a chunk is scored (llama-perplexity's settings, and which phase is measured).
#[derive(Clone, Debug, Default)]
pub struct ChunkScoring {
    /// Replaces the chunk's first token when given (llama-perplexity's BOS substitution).
    pub bos: Option<u32>,
    /// Tokens (and rows of logits) one forward pass holds at most.
    pub batch: usize,
    /// The KV store's types and tier.
    pub kv: KvOptions,
    /// The attention policy.
    pub attention: AttentionChoice,
    /// `None`: the second half is scored from batched passes (prefill attention). `Some(k)`:
    /// the first `n_ctx - 1 - k` tokens are processed as a prompt and only the last `k` are
    /// scored, fed one token at a time, so the figure measures the *decode* phase's policy
    /// (Quest and H2O act only there; batched scoring would run their exact prefill).
    pub decode: Option<usize>,
}

/// Score one chunk of exactly `n_ctx` tokens as `how` says.
pub fn score_chunk(model: &Model, chunk: &[u32], how: &ChunkScoring) -> Result<ChunkScore> {
    let ChunkScoring {
        bos,
        batch,
        ref kv,
        ref attention,
        decode,
    } = *how;
    let n_ctx = chunk.len();
    if n_ctx < 4 {
        return Err(Error::Other(format!(
            "perplexity chunks need at least 4 tokens, got {n_ctx}"
        )));
    }
    let mut tokens = chunk.to_vec();
    if let Some(b) = bos {
        tokens[0] = b;
    }
    let first = match decode {
        Some(k) if k == 0 || k >= n_ctx => {
            return Err(Error::Other(format!(
                "decode scoring of {k} tokens needs 1..{n_ctx} (the chunk size)"
            )))
        }
        Some(k) => n_ctx - 1 - k,
        None => n_ctx / 2,
    };
    let vocab = model.config.vocab_size;
    let mut state = model.new_state(n_ctx, kv.clone())?;
    state.set_attention(attention.build(&model.config).map_err(Error::Other)?);
    let mut score = ChunkScore {
        nll: 0.0,
        nll2: 0.0,
        count: 0,
    };
    let batch = batch.max(1);
    let mut start = 0;
    while start < n_ctx - 1 {
        // In decode scoring, every token from `first` on is its own forward pass.
        let step = if decode.is_some() && start >= first {
            1
        } else if decode.is_some() {
            batch.min(first - start).max(1)
        } else {
            batch
        };
        let end = (start + step).min(n_ctx - 1);
        // Logits of position j predict token j + 1; we need them for j in first..n_ctx-1.
        let want_from = first.max(start);
        let want = if want_from < end {
            Logits::Tail(end - want_from)
        } else {
            Logits::None
        };
        let logits = model.forward(&mut state, &tokens[start..end], want)?;
        for (row, j) in (want_from..end).enumerate() {
            let lp = log_prob(&logits[row * vocab..(row + 1) * vocab], chunk[j + 1]);
            score.nll -= lp;
            score.nll2 += lp * lp;
            score.count += 1;
        }
        start = end;
    }
    Ok(score)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_prob_matches_f64_softmax() {
        let logits = [1.0f32, 3.0, -2.0, 0.5];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        for (i, &l) in logits.iter().enumerate() {
            let want = ((l as f64).exp() / z).ln();
            assert!((log_prob(&logits, i as u32) - want).abs() < 1e-12);
        }
        // Large logits stay finite.
        assert!(log_prob(&[1e4, 0.0], 1).is_finite());
    }

    #[test]
    fn uniform_model_has_perplexity_equal_to_vocab() {
        let mut p = Perplexity::default();
        let lp = log_prob(&[0.0; 50], 3);
        p.add(ChunkScore {
            nll: -lp * 10.0,
            nll2: lp * lp * 10.0,
            count: 10,
        });
        assert!((p.value() - 50.0).abs() < 1e-9);
        assert!(p.std_error() < 1e-5, "{}", p.std_error());
    }
}
