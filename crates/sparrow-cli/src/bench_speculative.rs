//! `sparrow bench --draft-model FILE` / `--lookup N`: speculative decoding measured beside
//! plain decoding, same sitting. Drafts depend on the text, so this runs real prompts (a
//! set of code edits, code to write and chat, `bench/speculative-prompts.json`, or
//! `--spec-prompts FILE`) through the chat template and times greedy generation of `-n`
//! tokens, plain and speculative in turn for each prompt and repetition. The outputs are
//! checked to be the same (they must be: see `sparrow::speculative`).

use crate::speculative::SpeculativeArgs;
use serde::{Deserialize, Serialize};
use sparrow::{ChatMessage, Engine, Generation, Sampler, SamplerConfig, Session};
use std::collections::BTreeMap;
use std::path::Path;

/// The default prompt set.
const PROMPTS: &str = include_str!("../../../bench/speculative-prompts.json");

/// One prompt of a set: its kind (`edit`, `code`, `chat`: rows are grouped by it) and text
/// (a user message).
#[derive(Deserialize, Debug, Clone)]
pub struct SpecPrompt {
    pub kind: String,
    pub prompt: String,
}

/// One row of results: a kind of prompt, decoded one way.
#[derive(Serialize, Debug)]
pub struct SpecRow {
    pub kind: String,
    pub decoding: String,
    pub n_prompts: usize,
    pub tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    /// Plain decoding's seconds over the same prompts divided by these.
    pub speedup: f64,
    pub drafted: usize,
    pub accepted: usize,
    pub target_passes: usize,
}

/// The prompts of `path`, or the default set.
pub fn load_prompts(path: Option<&Path>) -> Result<Vec<SpecPrompt>, String> {
    let text = match path {
        Some(p) => std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
        None => PROMPTS.to_string(),
    };
    let prompts: Vec<SpecPrompt> =
        serde_json::from_str(&text).map_err(|e| format!("prompt set: {e}"))?;
    if prompts.is_empty() {
        return Err("the prompt set is empty".into());
    }
    Ok(prompts)
}

/// Greedy generation of up to `n` tokens of `ids` on a fresh session: the ids, seconds
/// of generation and the speculation counts.
fn generate(
    engine: &Engine,
    session: &mut Session,
    ids: &[u32],
    n: usize,
) -> Result<(Vec<u32>, f64, Option<sparrow::SpeculationStats>), String> {
    session.reset();
    let mut out = Vec::new();
    let stats = session
        .generate(
            engine,
            ids,
            &mut Sampler::new(SamplerConfig::greedy()),
            &mut Generation::new(n, false),
            &mut sparrow::collect_ids(&mut out),
        )
        .map_err(|e| e.to_string())?;
    Ok((out, stats.gen_time.as_secs_f64(), stats.speculation))
}

/// Run the prompt set plain and speculatively, `reps` times each in turn; one row per kind
/// of prompt and way of decoding, plain first.
pub fn run(
    engine: &Engine,
    spec: &SpeculativeArgs,
    kv: &sparrow::KvOptions,
    attention: &sparrow::attention::AttentionChoice,
    prompts: &[SpecPrompt],
    n_gen: usize,
    reps: usize,
) -> Result<Vec<SpecRow>, String> {
    let tmpl = engine
        .chat_template
        .as_ref()
        .ok_or("the speculative bench renders its prompts as chats: this model has no template")?;
    let encoded: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let text = tmpl
                .render(&[ChatMessage::new("user", &p.prompt)], true)
                .map_err(|e| e.to_string())?;
            Ok(engine.tokenizer.encode(&text, true, true))
        })
        .collect::<Result<_, String>>()?;
    let n_ctx = encoded.iter().map(Vec::len).max().unwrap_or(0) + n_gen + 1;
    let state = || {
        engine
            .model
            .new_sequence(n_ctx, kv.clone(), attention)
            .map_err(|e| e.to_string())
    };
    let mut plain = Session::new(state()?);
    let speculation = spec
        .speculation(engine, n_ctx, kv, 512)?
        .ok_or("no --draft-model or --lookup")?;
    let label = match (&spec.draft_model, spec.lookup) {
        (Some(p), _) => format!(
            "draft {}",
            p.file_name()
                .map_or(String::new(), |f| f.to_string_lossy().into_owned())
        ),
        (None, Some(n)) => format!("lookup {n}"),
        (None, None) => unreachable!("speculation needs one"),
    };
    let mut fast = Session::new(state()?).with_speculation(speculation);
    // Warm-up: pages the weights in.
    generate(engine, &mut plain, &encoded[0], 4)?;
    generate(engine, &mut fast, &encoded[0], 4)?;
    #[derive(Default)]
    struct Sums {
        prompts: usize,
        tokens: usize,
        plain: f64,
        fast: f64,
        stats: sparrow::SpeculationStats,
    }
    let mut by_kind: BTreeMap<String, Sums> = BTreeMap::new();
    for (i, (p, ids)) in prompts.iter().zip(&encoded).enumerate() {
        let s = by_kind.entry(p.kind.clone()).or_default();
        s.prompts += 1;
        for r in 0..reps {
            eprintln!(
                "bench: prompt {}/{} ({}), repetition {}",
                i + 1,
                prompts.len(),
                p.kind,
                r + 1
            );
            let (want, t_plain, _) = generate(engine, &mut plain, ids, n_gen)?;
            let (got, t_fast, stats) = generate(engine, &mut fast, ids, n_gen)?;
            if got != want {
                return Err(format!(
                    "prompt {}: speculative decoding gave other tokens than plain decoding (a bug: please report it)",
                    i + 1
                ));
            }
            s.tokens += want.len();
            s.plain += t_plain;
            s.fast += t_fast;
            if let Some(st) = stats {
                s.stats.drafted += st.drafted;
                s.stats.accepted += st.accepted;
                s.stats.target_passes += st.target_passes;
            }
        }
    }
    let mut rows = Vec::new();
    for (kind, s) in by_kind {
        rows.push(SpecRow {
            kind: kind.clone(),
            decoding: "plain".into(),
            n_prompts: s.prompts,
            tokens: s.tokens,
            seconds: s.plain,
            tokens_per_second: s.tokens as f64 / s.plain,
            speedup: 1.0,
            drafted: 0,
            accepted: 0,
            target_passes: s.tokens,
        });
        rows.push(SpecRow {
            kind,
            decoding: label.clone(),
            n_prompts: s.prompts,
            tokens: s.tokens,
            seconds: s.fast,
            tokens_per_second: s.tokens as f64 / s.fast,
            speedup: s.plain / s.fast,
            drafted: s.stats.drafted,
            accepted: s.stats.accepted,
            target_passes: s.stats.target_passes,
        });
    }
    Ok(rows)
}

/// The rows as a markdown table.
pub fn print_table(rows: &[SpecRow]) {
    println!("| prompts | decoding | tokens | t/s | vs plain | drafts kept | tokens per pass |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        let kept = if r.drafted > 0 {
            format!("{} of {}", r.accepted, r.drafted)
        } else {
            "–".into()
        };
        println!(
            "| {} ×{} | {} | {} | {:.2} | {:.2}× | {} | {:.2} |",
            r.kind,
            r.n_prompts,
            r.decoding,
            r.tokens,
            r.tokens_per_second,
            r.speedup,
            kept,
            r.tokens as f64 / r.target_passes.max(1) as f64
        );
    }
}
