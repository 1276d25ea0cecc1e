//! One prompt answered under several attention policies for the price of one prefill per
//! prefill policy: the needle grid and the RULER benchmark both ask the same question of a
//! list of policies, and at 32K the prefill is minutes while the answer is seconds.
//!
//! Choices are grouped by the policy that runs their prefill (`full`, `xattention`, …).
//! Each group prefills the prompt (all but its last token) once; every choice of the group
//! then takes that state with its own policy installed, runs the last prompt token as its
//! first decode step and answers greedily; the state is rewound to the prompt's head for
//! the next choice. Sealed blocks are summarised for a newly installed policy at its first
//! forward pass, so a decode policy sees the same cache whether it prefilled it or not.
//! With a [`PrefillCache`], a group's prefilled state is read from disk when an earlier run
//! kept it, and kept when it had to be computed.

use crate::prefill_cache::{PrefillCache, PrefillRecipe};
use sparrow::attention::AttentionChoice;
use sparrow::engine::Engine;
use sparrow::generate::{collect_text, Generation, WithProgress};
use sparrow::kv::KvOptions;
use sparrow::sampler::{Sampler, SamplerConfig};
use sparrow::session::Session;
use sparrow::{Error, Result};

/// How the model runs every prompt of an evaluation.
#[derive(Clone, Debug)]
pub struct RunSettings {
    /// KV cache element types (keys, values), and a cold tier if any.
    pub kv: KvOptions,
    /// Prompt tokens per prefill batch.
    pub batch_size: usize,
    /// Where prefilled states are kept between runs (none: every prefill runs).
    pub prefill_cache: Option<PrefillCache>,
}

/// One policy's greedy answer to a prompt.
#[derive(Clone, Debug)]
pub struct PolicyAnswer {
    /// The choice's label (`quest`, `xattention+quest`, …).
    pub attention: String,
    /// The generated text (the prompt not included).
    pub answer: String,
    /// Seconds of the prefill this answer read (shared by its group: the same figure for
    /// each member; for a state read from the prefill cache, what its prefill took then).
    pub prefill_seconds: f64,
    /// Whether the prefilled state came from the prefill cache.
    pub prefill_cached: bool,
    /// What went wrong with the prefill cache, if anything (a file refused and prefilled
    /// again, a state that could not be saved): the answer stands either way.
    pub prefill_note: Option<String>,
    /// Seconds from the last prompt token to the end of the answer.
    pub decode_seconds: f64,
    /// Tokens generated.
    pub n_generated: usize,
}

/// Answer `ids` greedily (at most `max_new` tokens, stopping at end of generation) under
/// every policy of `choices`, with one prefill per prefill policy. Each prefill reports
/// `progress(label, tokens done, tokens in all)` after every batch. Answers come in the
/// order of `choices`.
pub fn answer_with_policies(
    engine: &Engine,
    ids: &[u32],
    max_new: usize,
    settings: &RunSettings,
    choices: &[AttentionChoice],
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Vec<PolicyAnswer>> {
    if ids.len() < 2 {
        return Err(Error::Other(
            "a prompt of at least 2 tokens is needed (a prefill and a first decode step)".into(),
        ));
    }
    let head = &ids[..ids.len() - 1];
    let n_ctx = ids.len() + max_new;
    let kv = options_for(engine, &settings.kv, choices, n_ctx)?;
    let prefills: Vec<String> = choices
        .iter()
        .map(|c| c.phase_names().map(|(p, _)| p).map_err(Error::Other))
        .collect::<Result<_>>()?;
    let mut out: Vec<Option<PolicyAnswer>> = vec![None; choices.len()];
    // Groups in order of first appearance, so the first choice's prefill runs first.
    let mut order: Vec<&str> = Vec::new();
    for p in &prefills {
        if !order.contains(&p.as_str()) {
            order.push(p);
        }
    }
    for prefill_name in order {
        let members: Vec<usize> = (0..choices.len())
            .filter(|&i| prefills[i] == prefill_name)
            .collect();
        let label = format!("prefill ({prefill_name})");
        let first = &choices[members[0]];
        let recipe = PrefillRecipe::new(first, head.len(), settings.batch_size, kv.types)
            .map_err(Error::Other)?;
        // A state holding the prompt's head, prefilled under `choice`'s policy (its prefill
        // phase is the group's).
        let mut prefilled = |choice: &AttentionChoice| -> Result<sparrow::model::State> {
            let mut s = engine.model.new_state(n_ctx, kv.clone())?;
            s.set_attention(choice.build(&engine.model.config).map_err(Error::Other)?);
            sparrow::generate::prefill(
                &engine.model,
                &mut s,
                head,
                settings.batch_size,
                |d, t| progress(&label, d, t),
            )?;
            Ok(s)
        };
        let mut note = None;
        let cached = match &settings.prefill_cache {
            Some(cache) => {
                let mut s = engine.model.new_state(n_ctx, kv.clone())?;
                s.set_attention(first.build(&engine.model.config).map_err(Error::Other)?);
                match cache.load(engine, &mut s, head, &recipe) {
                    Ok(Some(seconds)) => Some((s, seconds)),
                    Ok(None) => None,
                    Err(why) => {
                        note = Some(format!("{why}; prefilled again"));
                        None
                    }
                }
            }
            None => None,
        };
        let prefill_cached = cached.is_some();
        let (state, prefill_seconds) = match cached {
            Some(hit) => hit,
            None => {
                let started = std::time::Instant::now();
                let s = prefilled(first)?;
                let seconds = started.elapsed().as_secs_f64();
                if let Some(cache) = &settings.prefill_cache {
                    if let Err(why) = cache.save(engine, &s, head, &recipe, seconds) {
                        note = Some(format!("{why} (not kept)"));
                    }
                }
                (s, seconds)
            }
        };
        let mut shared = Some(state);
        for &i in &members {
            let choice = &choices[i];
            // A sliding layer's ring may have lost the head: then this one prefills again.
            let mut state = match shared.take() {
                Some(s) => s,
                None => prefilled(choice)?,
            };
            state.set_attention(choice.build(&engine.model.config).map_err(Error::Other)?);
            let mut session =
                Session::holding(state, head.to_vec())?.with_batch_size(settings.batch_size);
            let mut sampler = Sampler::new(SamplerConfig::greedy());
            let mut answer = String::new();
            let stats = session.generate(
                engine,
                ids,
                &mut sampler,
                &mut Generation::new(max_new, false),
                &mut WithProgress {
                    on_prefill: |_, _| {},
                    on_token: collect_text(&mut answer),
                },
            )?;
            let (mut state, _) = session.into_parts();
            if state.truncate(head.len()) == head.len() {
                shared = Some(state);
            }
            out[i] = Some(PolicyAnswer {
                attention: choice.label(),
                answer,
                prefill_seconds,
                prefill_cached,
                prefill_note: note.clone(),
                decode_seconds: (stats.prompt_time + stats.gen_time).as_secs_f64(),
                n_generated: stats.n_generated,
            });
        }
    }
    Ok(out
        .into_iter()
        .map(|a| a.expect("every choice belongs to one group"))
        .collect())
}

/// `kv` with room reserved, under a RAM budget, for the hungriest policy's summaries.
fn options_for(
    engine: &Engine,
    kv: &KvOptions,
    choices: &[AttentionChoice],
    n_ctx: usize,
) -> Result<KvOptions> {
    let mut kv = kv.clone();
    if kv.cold.is_some() {
        for choice in choices {
            let p = choice.build(&engine.model.config).map_err(Error::Other)?;
            kv.reserved = kv
                .reserved
                .max(p.summary_bytes(n_ctx, engine.model.config.kv_dim()));
        }
    }
    Ok(kv)
}
