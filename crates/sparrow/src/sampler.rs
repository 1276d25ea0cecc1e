//! Token sampling: greedy, or a chain of repetition penalty → top-k → top-p → min-p →
//! temperature → a draw from a seeded RNG (same seed, same tokens), in llama.cpp's order so
//! its users' settings mean the same thing here.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sampling settings (defaults follow llama.cpp's CLI).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 or below means greedy (argmax).
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p; 1.0 disables.
    pub top_p: f32,
    /// Drop tokens below `min_p × p(most likely)`; 0 disables.
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens; 1.0 disables.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repeat_last_n: usize,
    /// RNG seed.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0x5eed,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Check ranges, naming the bad setting.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() {
            return Err(format!("temperature {} is not finite", self.temperature));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(format!("top-p {} is outside [0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min-p {} is outside [0, 1]", self.min_p));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(format!(
                "repeat penalty {} must be > 0",
                self.repeat_penalty
            ));
        }
        Ok(())
    }
}

/// A sampler with its RNG state and the recent-token history for the penalty.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    history: Vec<u32>,
    candidates: Vec<(u32, f32)>,
}

/// Index of the largest value (first one on ties), as llama.cpp's greedy sampler does.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// The model's log-probabilities at one step, for reporting (OpenAI's `logprobs`): taken
/// from the raw logits — before temperature, penalties or a grammar mask — so they describe
/// the model, not the sampler's settings.
pub struct LogProbs {
    /// `log Σ exp(logit)`, in f64.
    log_norm: f64,
    /// The `k` most likely tokens, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

impl LogProbs {
    /// Normaliser and the `k` most likely tokens of `logits`.
    pub fn of(logits: &[f32], k: usize) -> LogProbs {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        let log_norm = max + sum.ln();
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
        for (i, &l) in logits.iter().enumerate() {
            if top.len() == k && top.last().is_none_or(|&(_, m)| l <= m) {
                continue;
            }
            let at = top.partition_point(|&(_, m)| m >= l);
            top.insert(at, (i as u32, l));
            top.truncate(k);
        }
        let top = top
            .into_iter()
            .map(|(i, l)| (i, (l as f64 - log_norm) as f32))
            .collect();
        LogProbs { log_norm, top }
    }

    /// The log-probability of a token whose raw logit was `logit`.
    pub fn of_logit(&self, logit: f32) -> f32 {
        (logit as f64 - self.log_norm) as f32
    }
}

impl Sampler {
    /// A sampler seeded from `cfg.seed`.
    pub fn new(cfg: SamplerConfig) -> Self {
        Sampler {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            history: Vec::new(),
            candidates: Vec::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Record tokens (e.g. the prompt) for the repetition penalty without sampling.
    pub fn accept(&mut self, tokens: &[u32]) {
        self.history.extend_from_slice(tokens);
        let keep = self.cfg.repeat_last_n.max(1);
        if self.history.len() > 4 * keep {
            self.history.drain(..self.history.len() - keep);
        }
    }

    /// Apply the repetition penalty to `logits` in place.
    fn penalize(&self, logits: &mut [f32]) {
        if self.cfg.repeat_penalty == 1.0 || self.cfg.repeat_last_n == 0 {
            return;
        }
        let start = self.history.len().saturating_sub(self.cfg.repeat_last_n);
        let mut seen = self.history[start..].to_vec();
        seen.sort_unstable();
        seen.dedup();
        for t in seen {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 {
                    *l / self.cfg.repeat_penalty
                } else {
                    *l * self.cfg.repeat_penalty
                };
            }
        }
    }

    /// Choose the next token from `logits` (modified in place by the penalty) and record it.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.sample_masked(logits, |_| true)
    }

    /// Like [`Sampler::sample`], but only tokens for which `allowed` is true may be chosen
    /// (grammar constraints). Falls back to the best allowed token when filtering empties
    /// the set.
    pub fn sample_masked(&mut self, logits: &mut [f32], allowed: impl Fn(u32) -> bool) -> u32 {
        self.penalize(logits);
        let c = &self.cfg;
        let id = if c.temperature <= 0.0 {
            let mut best = None::<(u32, f32)>;
            for (i, &v) in logits.iter().enumerate() {
                if allowed(i as u32) && best.is_none_or(|(_, bv)| v > bv) {
                    best = Some((i as u32, v));
                }
            }
            best.map(|b| b.0).unwrap_or(0)
        } else {
            self.candidates.clear();
            self.candidates.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|(i, v)| v.is_finite() && allowed(*i as u32))
                    .map(|(i, &v)| (i as u32, v)),
            );
            if self.candidates.is_empty() {
                0
            } else {
                self.draw()
            }
        };
        self.accept(&[id]);
        id
    }

    fn draw(&mut self) -> u32 {
        let c = &self.cfg;
        let cands = &mut self.candidates;
        // Sort descending by logit; top-k only needs a partial sort first.
        if c.top_k > 0 && c.top_k < cands.len() {
            cands.select_nth_unstable_by(c.top_k - 1, |a, b| b.1.total_cmp(&a.1));
            cands.truncate(c.top_k);
        }
        cands.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));

        // Probabilities at temperature 1 for top-p / min-p, as llama.cpp does.
        let max = cands[0].1;
        let mut probs: Vec<f32> = cands.iter().map(|&(_, l)| (l - max).exp()).collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);

        let mut keep = cands.len();
        if c.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= c.top_p {
                    keep = keep.min(i + 1);
                    break;
                }
            }
        }
        if c.min_p > 0.0 {
            let threshold = c.min_p * probs[0];
            let n = probs[..keep]
                .iter()
                .take_while(|&&p| p >= threshold)
                .count();
            keep = n.max(1);
        }
        cands.truncate(keep.max(1));

        // Temperature, then a draw.
        let weights: Vec<f64> = cands
            .iter()
            .map(|&(_, l)| (((l - max) / c.temperature) as f64).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return cands[i].0;
            }
            r -= w;
        }
        cands[cands.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a direct f64 log-softmax: every top entry, their order, and a token outside.
    #[test]
    fn logprobs_match_an_f64_log_softmax() {
        let logits: Vec<f32> = (0..1000u32)
            .map(|i| ((i.wrapping_mul(2654435761) >> 12) % 4000) as f32 / 300.0 - 6.0)
            .collect();
        let norm = logits.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
        let lp = LogProbs::of(&logits, 5);
        let mut want: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l as f64 - norm))
            .collect();
        want.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        assert_eq!(lp.top.len(), 5);
        for (got, want) in lp.top.iter().zip(&want) {
            assert_eq!(got.0, want.0);
            assert!((got.1 as f64 - want.1).abs() < 1e-5, "{got:?} vs {want:?}");
        }
        let some = 777;
        assert!((lp.of_logit(logits[some]) as f64 - (logits[some] as f64 - norm)).abs() < 1e-5);
        assert!(LogProbs::of(&logits, 0).top.is_empty());
        assert_eq!(LogProbs::of(&logits[..3], 10).top.len(), 3);
    }

    fn logits() -> Vec<f32> {
        (0..100).map(|i| ((i * 37) % 100) as f32 / 10.0).collect()
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplerConfig::greedy());
        let mut l = logits();
        assert_eq!(s.sample(&mut l), argmax(&logits()));
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let run = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                temperature: 1.5,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..Default::default()
            });
            (0..50).map(|_| s.sample(&mut logits())).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(SamplerConfig {
            top_k: 1,
            temperature: 5.0,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits()), argmax(&logits()));
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // Two dominant tokens; the tail must never be drawn.
        let mut l = vec![-10.0f32; 50];
        l[3] = 10.0;
        l[9] = 9.5;
        for cfg in [
            SamplerConfig {
                top_p: 0.9,
                min_p: 0.0,
                top_k: 0,
                temperature: 1.0,
                ..Default::default()
            },
            SamplerConfig {
                top_p: 1.0,
                min_p: 0.1,
                top_k: 0,
                temperature: 1.0,
                ..Default::default()
            },
        ] {
            let mut s = Sampler::new(cfg);
            for _ in 0..200 {
                let t = s.sample(&mut l.clone());
                assert!(t == 3 || t == 9, "{t}");
            }
        }
    }

    #[test]
    fn repetition_penalty_changes_the_choice() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..SamplerConfig::greedy()
        });
        s.accept(&[5]);
        let mut l = vec![0.0f32; 10];
        l[5] = 4.0;
        l[6] = 3.0;
        assert_eq!(s.sample(&mut l), 6);
    }

    #[test]
    fn mask_is_respected() {
        let mut s = Sampler::new(SamplerConfig::default());
        for _ in 0..50 {
            let t = s.sample_masked(&mut logits(), |t| t % 7 == 0);
            assert_eq!(t % 7, 0);
        }
    }

    #[test]
    fn validate_names_bad_settings() {
        let c = SamplerConfig {
            top_p: 1.5,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("top-p"));
    }
}
