//! The generation loop: prefill the prompt in batches (reporting progress), then sample one
//! token at a time, streaming text that never splits a UTF-8 character.

use crate::error::{Error, Result};
use crate::model::{Logits, Model, State};
use crate::sampler::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// How to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Maximum tokens to generate; `None` runs until end of generation or a full context.
    pub n_predict: Option<usize>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Prompt tokens per forward pass during prefill.
    pub batch_size: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            n_predict: Some(128),
            ignore_eos: false,
            batch_size: 512,
        }
    }
}

/// Timings and counts of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenerationStats {
    pub n_prompt: usize,
    pub prompt_time: Duration,
    pub n_generated: usize,
    pub gen_time: Duration,
    /// Why generation stopped.
    pub stop: StopReason,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopReason {
    #[default]
    Length,
    EndOfGeneration,
    ContextFull,
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

/// Feed `tokens` into `state` in batches of `batch_size`, calling `progress(done, total)`
/// after each batch, and return the logits of the last token.
pub fn prefill<'s>(
    model: &Model,
    state: &'s mut State,
    tokens: &[u32],
    batch_size: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<&'s [f32]> {
    if state.n_past() + tokens.len() > state.n_ctx() {
        return Err(Error::PromptTooLong {
            n_prompt: state.n_past() + tokens.len(),
            n_ctx: state.n_ctx(),
        });
    }
    let batch = batch_size.max(1);
    let n_chunks = tokens.len().div_ceil(batch);
    for (i, chunk) in tokens.chunks(batch).enumerate() {
        let last = i + 1 == n_chunks;
        let want = if last { Logits::Last } else { Logits::None };
        model.forward(state, chunk, want)?;
        progress((i * batch + chunk.len()).min(tokens.len()), tokens.len());
    }
    // Borrow dance: the last forward's logits live in the state's scratch.
    Ok(state.last_logits())
}

/// Generate from `prompt` (token ids) into `state`. `on_token` receives each generated id
/// with the complete UTF-8 text it finished (possibly empty), and a final `None` with any
/// leftover bytes as replacement characters; it may return `ControlFlow::Break(())` to stop.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    state: &mut State,
    prompt: &[u32],
    sampler: &mut Sampler,
    opts: &GenerateOptions,
    progress: impl FnMut(usize, usize),
    on_token: impl FnMut(Option<u32>, &str) -> ControlFlow<()>,
) -> Result<GenerationStats> {
    let (mut stats, logits) = start(model, state, prompt, sampler, opts, progress)?;
    let limit = opts.n_predict.unwrap_or(usize::MAX);
    let pick = |sampler: &mut Sampler, logits: &mut Vec<f32>, _left: usize| sampler.sample(logits);
    let ends = TokenLoop {
        limit,
        stop_at_eog: !opts.ignore_eos,
    };
    ends.run(
        model, tokenizer, state, sampler, logits, &mut stats, pick, on_token,
    )?;
    Ok(stats)
}

/// Checks the prompt, prefills it (timed) and lets the sampler see it: the start that plain
/// and constrained generation share. Returns the stats so far and the last logits.
pub(crate) fn start(
    model: &Model,
    state: &mut State,
    prompt: &[u32],
    sampler: &mut Sampler,
    opts: &GenerateOptions,
    progress: impl FnMut(usize, usize),
) -> Result<(GenerationStats, Vec<f32>)> {
    if prompt.is_empty() {
        return Err(Error::Other("the prompt is empty".into()));
    }
    let mut stats = GenerationStats {
        n_prompt: prompt.len(),
        ..Default::default()
    };
    let t0 = Instant::now();
    let logits = prefill(model, state, prompt, opts.batch_size, progress)?.to_vec();
    stats.prompt_time = t0.elapsed();
    sampler.accept(prompt);
    Ok((stats, logits))
}

/// When the token loop ends (besides a cancelled stream or a full context).
pub(crate) struct TokenLoop {
    /// Most tokens to generate.
    pub(crate) limit: usize,
    /// Whether an end-of-generation token ends the loop (it is then not emitted).
    pub(crate) stop_at_eog: bool,
}

impl TokenLoop {
    /// Sample with `pick(sampler, logits, tokens_left)`, stream text through `on_token`,
    /// feed each token back, until a stop condition; records counts, time and the reason
    /// in `stats`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        model: &Model,
        tokenizer: &Tokenizer,
        state: &mut State,
        sampler: &mut Sampler,
        mut logits: Vec<f32>,
        stats: &mut GenerationStats,
        mut pick: impl FnMut(&mut Sampler, &mut Vec<f32>, usize) -> u32,
        mut on_token: impl FnMut(Option<u32>, &str) -> ControlFlow<()>,
    ) -> Result<()> {
        let t1 = Instant::now();
        let mut decoder = StreamDecoder::new();
        stats.stop = StopReason::Length;
        while stats.n_generated < self.limit {
            let id = pick(sampler, &mut logits, self.limit - stats.n_generated);
            if self.stop_at_eog && tokenizer.is_eog(id) {
                stats.stop = StopReason::EndOfGeneration;
                break;
            }
            stats.n_generated += 1;
            let text = decoder.push(tokenizer, id);
            if on_token(Some(id), &text).is_break() {
                stats.stop = StopReason::Cancelled;
                break;
            }
            if stats.n_generated == self.limit {
                break;
            }
            if state.n_past() >= state.n_ctx() {
                stats.stop = StopReason::ContextFull;
                break;
            }
            logits.copy_from_slice(model.forward(state, &[id], Logits::Last)?);
        }
        let rest = decoder.flush();
        if !rest.is_empty() {
            let _ = on_token(None, &rest);
        }
        stats.gen_time = t1.elapsed();
        Ok(())
    }
}
