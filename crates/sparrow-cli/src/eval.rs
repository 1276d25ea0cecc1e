//! `sparrow eval needle`: needle-in-a-haystack accuracy over a grid of lengths × depths
//! (optionally drawn as a heatmap PNG). `sparrow eval attention`: how closely each
//! attention policy follows exact attention on the real activations of a prompt.
//! `sparrow eval ruler`: RULER's synthetic tasks per policy (`ruler.rs`).

use crate::progress::{PrefillProgress, PrefillsProgress};
use crate::run::init_threads;
use crate::{KvArgs, ModelArgs};
use sparrow::attention::AttentionChoice;
use sparrow::policy::SaapSettings;
use sparrow::Engine;
use sparrow_eval::attention::{
    capture, evaluate_queries, evaluate_steps, text_tokens, Capture, Phase, PolicyReport, Summary,
};
use sparrow_eval::needle::{
    needle_prompt, run_cell_policies, Cell, CellSettings, NeedleFormat, NeedleResult,
};
use sparrow_eval::text::load_haystack;

// The heatmap writer lives beside this file; only `eval needle` uses it.
#[path = "heatmap.rs"]
mod heatmap;
// `eval ruler` and its score plot live beside this file.
#[path = "ruler.rs"]
mod ruler;
#[path = "score_plot.rs"]
mod score_plot;

/// Evaluations.
#[derive(clap::Subcommand, Debug)]
pub enum EvalCommand {
    /// Needle in a haystack over context lengths × needle depths.
    Needle(NeedleArgs),
    /// Each attention policy against exact attention on a real prompt's activations:
    /// selectivity, relative L2 error of the output, attention mass captured.
    Attention(AttentionArgs),
    /// RULER's synthetic long-context tasks (needle variants, variable tracking, common-
    /// and frequent-word extraction) over lengths, per attention policy.
    Ruler(ruler::RulerArgs),
}

/// Arguments of `sparrow eval needle`.
#[derive(clap::Args, Debug)]
pub struct NeedleArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    kv: KvArgs,
    /// Folder of .txt files used as filler (read in file-name order).
    #[arg(long = "haystack")]
    haystack: std::path::PathBuf,
    /// Document lengths in tokens (comma-separated).
    #[arg(
        long = "lengths",
        value_delimiter = ',',
        default_value = "1024,2048,4096"
    )]
    lengths: Vec<usize>,
    /// Needle depths, 0 (start) to 1 (end) (comma-separated).
    #[arg(
        long = "depths",
        value_delimiter = ',',
        default_value = "0,0.25,0.5,0.75,1"
    )]
    depths: Vec<f64>,
    /// Seed for the needles (each cell gets its own needle derived from it).
    #[arg(long = "seed", default_value_t = 1)]
    seed: u64,
    /// Needles per cell (each with its own number and key); a cell's accuracy is the
    /// fraction found.
    #[arg(long = "repeats", default_value_t = 1)]
    repeats: usize,
    /// Other needles (other keys, other numbers) hidden in each document besides the one
    /// asked for, spread evenly over its depth: RULER's multi-key needle (0: a single
    /// needle; at most 15).
    #[arg(long = "distractors", default_value_t = 0)]
    distractors: usize,
    /// Write every cell's result as JSON to this file.
    #[arg(long = "json")]
    json: Option<std::path::PathBuf>,
    /// Draw the accuracy grid (length × depth) as a PNG heatmap to this file.
    #[arg(long = "heatmap")]
    heatmap: Option<std::path::PathBuf>,
    /// Threads (default: all available cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Prompt tokens per forward pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    /// How the question is asked: `chat` (one user message in the chat template; the model
    /// writes the reply) or `primed` (the reply begun with "The special magic number for
    /// KEY is", for small models that restate the document instead of answering).
    #[arg(long = "format", default_value = "chat")]
    format: String,
    #[command(flatten)]
    prefill_cache: PrefillCacheArgs,
}

/// `--prefill-cache`, shared by `eval needle` and `eval ruler`.
#[derive(clap::Args, Debug)]
pub struct PrefillCacheArgs {
    /// Keep every prefilled state in this folder and read it back when the same prompt is
    /// prefilled the same way again (model, prompt, prefill policy and settings, batch size,
    /// cache types, SIMD level), so a grid that adds a decode policy to cases already run
    /// skips their prefills. One prompt-cache file per prompt: about 0.9 GiB for a 32K
    /// prompt on the 1.5B model (28 KiB a token at f16).
    #[arg(long = "prefill-cache")]
    prefill_cache: Option<std::path::PathBuf>,
}

impl PrefillCacheArgs {
    /// The cache the flag names (its folder created), if any.
    pub fn open(&self) -> Result<Option<sparrow_eval::prefill_cache::PrefillCache>, String> {
        self.prefill_cache
            .as_ref()
            .map(sparrow_eval::prefill_cache::PrefillCache::new)
            .transpose()
    }
}

/// Arguments of `sparrow eval attention`.
#[derive(clap::Args, Debug)]
pub struct AttentionArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Policies to measure: `--attn full,streaming,quest` (with their settings flags).
    #[command(flatten)]
    kv: KvArgs,
    /// Text file whose first tokens form the prompt.
    #[arg(short = 'f', long = "file")]
    file: Option<std::path::PathBuf>,
    /// Folder of .txt files (read in file-name order, as `eval needle` does) instead of -f.
    #[arg(long = "haystack")]
    haystack: Option<std::path::PathBuf>,
    /// Prompt length N in tokens: N - 1 are prefilled, the last is the decode query.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 2048)]
    n_tokens: usize,
    /// Query rows of the last prefill batch measured for policies that do not decode
    /// (xattention); the rows `--decode-queries` are drawn from.
    #[arg(long = "prefill-rows", default_value_t = sparrow_eval::attention::DEFAULT_TAIL)]
    prefill_rows: usize,
    /// Decode queries measured per decode policy: this many of the last --prefill-rows
    /// positions, evenly spaced back from N - 1, each a decode step at its own position
    /// (one query is one sample of a policy's routing).
    #[arg(
        long = "decode-queries",
        default_value_t = 1,
        conflicts_with = "needle_depth"
    )]
    decode_queries: usize,
    /// Instead of plain text: a needle prompt of about -c tokens from --haystack with the
    /// needle at this depth (as `eval needle` builds it), followed by the needle's number;
    /// each decode policy is measured at every step of that answer (teacher-forced), with
    /// the share of full attention's mass on the needle's sentence it reads.
    #[arg(long = "needle-depth", requires = "haystack")]
    needle_depth: Option<f64>,
    /// The needle's seed (`eval needle` gives cell i of its grid seed + i).
    #[arg(long = "seed", default_value_t = 1)]
    seed: u64,
    /// How the needle question is asked: `chat` or `primed` (as `eval needle --format`).
    #[arg(long = "format", default_value = "chat")]
    format: String,
    /// Also print one row per layer.
    #[arg(long = "per-layer")]
    per_layer: bool,
    /// Measure `saap` and `kmeans` once per count of buckets (ℓ) in this list
    /// (`--saap-probes-sweep 4,8,16,32`), on the one prompt's activations: selectivity
    /// against ℓ, the Saap paper's Table 5.
    #[arg(
        long = "saap-probes-sweep",
        value_delimiter = ',',
        conflicts_with = "needle_depth"
    )]
    saap_probes_sweep: Vec<usize>,
    /// Write every policy's per-layer, per-head results as JSON to this file.
    #[arg(long = "json")]
    json: Option<std::path::PathBuf>,
    /// Threads (default: all available cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Prompt tokens per forward pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
}

/// `choices` with each `saap` or `kmeans` entry replaced by one per count of buckets in
/// `probes` (unchanged if `probes` is empty), each with its label (`saap (ℓ 8)`).
fn sweep_probes(
    choices: Vec<AttentionChoice>,
    probes: &[usize],
) -> Result<Vec<(AttentionChoice, Option<String>)>, String> {
    if probes.contains(&0) {
        return Err("--saap-probes-sweep: every count must be at least 1 bucket".into());
    }
    if !probes.is_empty() && !choices.iter().any(|c| is_bucket_policy(&c.name)) {
        return Err("--saap-probes-sweep measures saap or kmeans: add one to --attn".into());
    }
    Ok(choices
        .into_iter()
        .flat_map(|c| {
            if probes.is_empty() || !is_bucket_policy(&c.name) {
                return vec![(c, None)];
            }
            probes
                .iter()
                .map(|&l| {
                    let mut c = c.clone();
                    c.settings_mut::<SaapSettings>().probes = Some(l);
                    let label = format!("{} (ℓ {l})", c.name);
                    (c, Some(label))
                })
                .collect()
        })
        .collect())
}

/// Whether policy `name` reads Saap's buckets (and so takes `--saap-probes`).
fn is_bucket_policy(name: &str) -> bool {
    matches!(name, "saap" | "kmeans")
}

pub fn eval(cmd: EvalCommand) -> Result<(), String> {
    match cmd {
        EvalCommand::Needle(a) => needle(a),
        EvalCommand::Attention(a) => attention(a),
        EvalCommand::Ruler(a) => ruler::ruler(a),
    }
}

fn needle(a: NeedleArgs) -> Result<(), String> {
    if let Some(d) = a.depths.iter().find(|d| !(0.0..=1.0).contains(*d)) {
        return Err(format!("--depths: {d} is outside [0, 1]"));
    }
    if a.lengths.iter().any(|&l| l < 64) {
        return Err("--lengths: each length must be at least 64 tokens".into());
    }
    if a.repeats == 0 {
        return Err("--repeats must be at least 1".into());
    }
    let format = NeedleFormat::named(&a.format)?;
    let choices = a.kv.choices()?;
    let settings = CellSettings {
        kv: a.kv.options(),
        batch_size: a.batch_size,
        format,
        distractors: a.distractors,
        prefill_cache: a.prefill_cache.open()?,
    };
    init_threads(a.threads)?;
    let haystack = load_haystack(&a.haystack).map_err(|e| e.to_string())?;
    let engine = a.model.load_engine()?;
    // results[policy] in length-major, then depth, then repeat order.
    let mut results: Vec<Vec<NeedleResult>> = vec![Vec::new(); choices.len()];
    let cells = a.lengths.len() * a.depths.len();
    let total = cells * a.repeats;
    let mut done = 0;
    let mut progress = PrefillsProgress::default();
    for (li, &length) in a.lengths.iter().enumerate() {
        for (di, &depth) in a.depths.iter().enumerate() {
            let cell = li * a.depths.len() + di;
            for r in 0..a.repeats {
                // Repeat 0 keeps the seeds of a single-needle run.
                let seed = a.seed.wrapping_add((cell + r * cells) as u64);
                let cell = Cell {
                    length,
                    depth,
                    seed,
                };
                let cell_results = run_cell_policies(
                    &engine,
                    &haystack,
                    &cell,
                    &settings,
                    &choices,
                    &mut |label: &str, done, total| progress.update(label, done, total),
                )
                .map_err(|e| e.to_string())?;
                done += 1;
                if let Some(note) = cell_results.iter().find_map(|r| r.prefill_note.as_deref()) {
                    eprintln!("warning: {note}");
                }
                for (p, res) in cell_results.into_iter().enumerate() {
                    eprintln!(
                        "[{done}/{total}] length {length} depth {depth:.2} {}: {} (expected {}, got {:?})",
                        res.attention,
                        if res.found { "found" } else { "MISSED" },
                        res.needle.value,
                        res.answer.trim()
                    );
                    results[p].push(res);
                }
            }
        }
    }
    for (choice, res) in choices.iter().zip(&results) {
        let acc = accuracy_grid(a.lengths.len(), a.depths.len(), a.repeats, res);
        let title = format!("needle accuracy: {}", describe_choice(choice));
        if choices.len() > 1 {
            println!("\n{title}\n");
        }
        print_table(&a.lengths, &a.depths, a.repeats, &acc, res);
        if let Some(path) = &a.heatmap {
            let path = if choices.len() > 1 {
                policy_path(path, &choice.label())
            } else {
                path.clone()
            };
            heatmap::write(&path, &title, &a.lengths, &a.depths, &acc)?;
            eprintln!("heatmap written to {}", path.display());
        }
    }
    if let Some(path) = &a.json {
        let all: Vec<&NeedleResult> = results.iter().flatten().collect();
        let json = serde_json::to_string_pretty(&all).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// `heat.png` → `heat-quest.png`: one file per policy when several are measured.
fn policy_path(path: &std::path::Path, label: &str) -> std::path::PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{label}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{label}"),
    };
    path.with_file_name(name)
}

/// `acc[d][l]`: fraction of the needles found at depth `d`, length `l` (results are in
/// length-major, then depth, then repeat order).
fn accuracy_grid(
    n_lengths: usize,
    n_depths: usize,
    repeats: usize,
    results: &[NeedleResult],
) -> Vec<Vec<f64>> {
    (0..n_depths)
        .map(|d| {
            (0..n_lengths)
                .map(|l| {
                    let at = (l * n_depths + d) * repeats;
                    let cell = &results[at..at + repeats];
                    cell.iter().filter(|r| r.found).count() as f64 / repeats as f64
                })
                .collect()
        })
        .collect()
}

/// A policy and the settings that matter for it, e.g. `quest (page 16, budget 1024,
/// dense_layers [0, 1])`, for titles.
fn describe_choice(c: &AttentionChoice) -> String {
    // Settings structs print as `Name { a: 1, b: 2 }`: keep the fields.
    let fields = |debug: String| {
        let inner = debug
            .split_once(" { ")
            .map(|(_, rest)| rest.trim_end_matches(" }").to_string())
            .unwrap_or(debug);
        inner.replace(": ", " ")
    };
    let Ok((prefill, decode)) = c.phase_names() else {
        return c.name.clone();
    };
    let mut names = vec![prefill.clone()];
    if decode != prefill {
        names.push(decode.clone());
    }
    let parts: Vec<String> = names
        .iter()
        .filter(|n| n.as_str() != "full")
        .map(|n| {
            let settings = fields(c.describe(n));
            let phase = match (n == &prefill, n == &decode) {
                (true, false) => " prefill",
                (false, true) => " decode",
                _ => "",
            };
            format!("{n}{phase} ({settings})")
        })
        .collect();
    if parts.is_empty() {
        "full".into()
    } else {
        parts.join(" + ")
    }
}

fn print_table(
    lengths: &[usize],
    depths: &[f64],
    repeats: usize,
    acc: &[Vec<f64>],
    results: &[NeedleResult],
) {
    let header: Vec<String> = depths.iter().map(|d| format!("{d:.2}")).collect();
    println!("| length \\ depth | {} | accuracy |", header.join(" | "));
    println!("| ---: |{} ---: |", " :---: |".repeat(depths.len()));
    for (li, length) in lengths.iter().enumerate() {
        let marks: Vec<String> = (0..depths.len())
            .map(|d| {
                let a = acc[d][li];
                if repeats > 1 {
                    format!("{a:.2}")
                } else if a >= 1.0 {
                    "✓".to_string()
                } else {
                    "✗".to_string()
                }
            })
            .collect();
        let row = (0..depths.len()).map(|d| acc[d][li]).sum::<f64>() / depths.len() as f64;
        println!("| {length} | {} | {:.0}% |", marks.join(" | "), row * 100.0);
    }
    let all = results.iter().filter(|r| r.found).count() as f64 / results.len().max(1) as f64;
    println!(
        "\noverall accuracy: {:.1}% of {} needles",
        all * 100.0,
        results.len()
    );
}

fn attention(a: AttentionArgs) -> Result<(), String> {
    let (choices, labels): (Vec<_>, Vec<_>) = sweep_probes(a.kv.choices()?, &a.saap_probes_sweep)?
        .into_iter()
        .unzip();
    if a.n_tokens < 2 {
        return Err("-c/--ctx-size: the prompt needs at least 2 tokens".into());
    }
    if a.prefill_rows == 0 {
        return Err("--prefill-rows must be at least 1".into());
    }
    if a.decode_queries == 0 || a.decode_queries > a.prefill_rows.min(a.n_tokens) {
        return Err(format!(
            "--decode-queries {} is out of range: 1 to the recorded rows (--prefill-rows {}, at most -c)",
            a.decode_queries, a.prefill_rows
        ));
    }
    let (text, source) = match (&a.file, &a.haystack) {
        (Some(_), Some(_)) => return Err("give either -f/--file or --haystack, not both".into()),
        (None, None) => return Err("no text: pass -f FILE or --haystack DIR".into()),
        (Some(f), None) => (
            std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read text file {}: {e}", f.display()))?,
            f.display().to_string(),
        ),
        (None, Some(d)) => (
            load_haystack(d).map_err(|e| e.to_string())?,
            d.display().to_string(),
        ),
    };
    init_threads(a.threads)?;
    let model_path = a.model.resolve()?;
    let engine =
        Engine::load_with(&model_path, a.model.load_options()).map_err(|e| e.to_string())?;
    if let Some(depth) = a.needle_depth {
        return needle_steps(&a, &engine, &text, depth, &choices);
    }
    let n = a.n_tokens;
    let max_ctx = engine.model.config.n_ctx_train;
    if n > max_ctx {
        eprintln!("warning: {n} tokens is beyond the model's trained context of {max_ctx}");
    }
    let tokens = text_tokens(&engine.tokenizer, &text, n).map_err(|e| e.to_string())?;
    let tail = a.prefill_rows.min(n);

    let cap = capture_with_progress(&a, &engine, &tokens, tail)?;

    let mut reports = Vec::new();
    for (c, label) in choices.iter().zip(labels) {
        let mut report = evaluate_queries(&cap, c, a.decode_queries).map_err(|e| e.to_string())?;
        if let Some(label) = label {
            report.policy = label;
        }
        reports.push(report);
    }
    let cfg = &engine.model.config;
    let queries = if a.decode_queries == 1 {
        format!("decode query at position {}", n - 1)
    } else {
        let stride = tail / a.decode_queries;
        format!(
            "{} decode queries at positions {}..={} every {stride}",
            a.decode_queries,
            n - 1 - (a.decode_queries - 1) * stride,
            n - 1
        )
    };
    println!(
        "attention policies against exact attention: N = {n} tokens of {source}, \
         {} layers × {} query heads ({} KV heads), {queries}",
        cfg.n_layer, cfg.n_head, cfg.n_head_kv,
    );
    println!();
    print_attention_summary(&reports);
    if a.per_layer {
        for r in &reports {
            print_per_layer(r);
        }
    }
    if let Some(path) = &a.json {
        let json = serde_json::json!({
            "model": model_path.display().to_string(),
            "text": source,
            "n_ctx": n,
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_head_kv": cfg.n_head_kv,
            "head_dim": cfg.head_dim,
            "kv_type": format!("{:?}", a.kv.cache_type_k),
            "prefill_rows": tail,
            "policies": reports
                .iter()
                .zip(&choices)
                .map(|(r, c)| {
                    let mut v = serde_json::to_value(r).expect("reports serialize");
                    v["settings"] = serde_json::Value::String(describe_choice(c));
                    v
                })
                .collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("results written to {}", path.display());
    }
    Ok(())
}

/// [`capture`] of `tokens` (the last `tail` query rows recorded) with a prefill bar and
/// the time taken.
fn capture_with_progress(
    a: &AttentionArgs,
    engine: &Engine,
    tokens: &[u32],
    tail: usize,
) -> Result<Capture, String> {
    let started = std::time::Instant::now();
    let mut progress = PrefillProgress::new("prefill");
    let cap = capture(
        &engine.model,
        tokens,
        a.kv.types(),
        a.batch_size,
        tail,
        |done, total| progress.update(done, total),
    )
    .map_err(|e| e.to_string())?;
    progress.finish();
    eprintln!(
        "prefilled {} tokens in {:.1} s",
        tokens.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(cap)
}

/// `eval attention --needle-depth`: each decode policy at every step of the needle's
/// answer, teacher-forced.
fn needle_steps(
    a: &AttentionArgs,
    engine: &Engine,
    haystack: &str,
    depth: f64,
    choices: &[AttentionChoice],
) -> Result<(), String> {
    if !(0.0..=1.0).contains(&depth) {
        return Err(format!("--needle-depth: {depth} is outside [0, 1]"));
    }
    let format = NeedleFormat::named(&a.format)?;
    let cell = Cell {
        length: a.n_tokens,
        depth,
        seed: a.seed,
    };
    let settings = CellSettings {
        kv: a.kv.options(),
        batch_size: a.batch_size,
        format,
        distractors: 0,
        prefill_cache: None,
    };
    let prompt = needle_prompt(engine, haystack, &cell, &settings).map_err(|e| e.to_string())?;
    let answer = engine.tokenizer.encode(&prompt.needle.value, false, false);
    // The last prompt token's query writes the answer's first token; each answer token's
    // query but the last writes the next one.
    let mut tokens = prompt.ids.clone();
    tokens.extend_from_slice(&answer[..answer.len() - 1]);
    let cap = capture_with_progress(a, engine, &tokens, answer.len())?;
    println!(
        "needle {:?} (\"{}\") at positions {}..{} of a {}-token prompt; each answer step's query \
         against exact attention (needle recall: the share of full attention's mass on the \
         needle's sentence that the policy reads, over all layers and heads; worst layer: \
         lowest share among layers giving the sentence ≥ 1% of their mass)",
        prompt.needle.value,
        prompt.needle.key,
        prompt.span.start,
        prompt.span.end,
        prompt.ids.len()
    );
    let mut all = Vec::new();
    for c in choices {
        let steps = match evaluate_steps(&cap, c, prompt.span.clone()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{}: {e}", c.label());
                continue;
            }
        };
        println!("\n{}\n", describe_choice(c));
        println!("| step | writes | selectivity | mass | needle mass (full) | needle recall | worst layer |");
        println!("| ---: | :--- | ---: | ---: | ---: | ---: | :--- |");
        for (i, st) in steps.iter().enumerate() {
            let (sel, mass) = st.means();
            let full =
                st.layers.iter().map(|l| l.focus_full).sum::<f64>() / st.layers.len().max(1) as f64;
            let worst = st
                .worst_layer(0.01)
                .map_or("-".into(), |(l, share)| format!("{l} ({share:.2})"));
            println!(
                "| {i} | {:?} | {sel:.4} | {mass:.4} | {full:.4} | {:.4} | {worst} |",
                engine.tokenizer.decode(&answer[i..i + 1]),
                st.focus_recall()
            );
            if a.per_layer {
                for l in &st.layers {
                    println!(
                        "|   | layer {} | {:.4} | {:.4} | {:.4} | {:.4} | |",
                        l.layer,
                        l.selectivity,
                        l.mass,
                        l.focus_full,
                        if l.focus_full > 0.0 {
                            l.focus_read / l.focus_full
                        } else {
                            1.0
                        }
                    );
                }
            }
        }
        all.push(serde_json::json!({"policy": describe_choice(c), "steps": steps}));
    }
    if let Some(path) = &a.json {
        let json = serde_json::json!({
            "needle": prompt.needle,
            "span": [prompt.span.start, prompt.span.end],
            "prompt_tokens": prompt.ids.len(),
            "policies": all,
        });
        let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".into(), |x| format!("{x:.digits$}"))
}

fn summary_cells(s: &Summary) -> String {
    format!(
        "{} | {:.2e} | {:.2e} | {} | {}",
        opt(s.mean_selectivity, 4),
        s.mean_rel_l2,
        s.max_rel_l2,
        opt(s.mean_mass, 6),
        opt(s.min_mass, 6)
    )
}

fn print_attention_summary(reports: &[PolicyReport]) {
    println!(
        "| policy | measured on | fraction_read | selectivity (mean) | rel-L2 (mean) | rel-L2 (max) | mass (mean) | mass (min) |"
    );
    println!("| :--- | :--- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in reports {
        let on = match r.phase {
            Phase::Decode if r.rows == 1 => "decode (1 query)".to_string(),
            Phase::Decode => format!("decode ({} queries)", r.rows),
            Phase::Prefill => format!("prefill (last {} rows)", r.rows),
        };
        println!(
            "| {} | {on} | {:.4} | {} |",
            r.policy,
            r.fraction_read,
            summary_cells(&r.summary)
        );
    }
}

fn print_per_layer(r: &PolicyReport) {
    println!("\n{} per layer:", r.policy);
    println!(
        "| layer | selectivity (mean) | rel-L2 (mean) | rel-L2 (max) | mass (mean) | mass (min) |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for l in &r.layers {
        println!("| {} | {} |", l.layer, summary_cells(&l.summary));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each bucket policy becomes one choice per count, in order, with only `probes`
    /// changed; other policies pass through; bad sweeps are refused by name.
    #[test]
    fn a_probes_sweep_expands_the_bucket_policies_only() {
        let named = |n: &str| {
            AttentionChoice::named(n).with(SaapSettings {
                budget: 0.2,
                ..Default::default()
            })
        };
        let choices = vec![named("quest"), named("saap"), named("kmeans")];
        let swept = sweep_probes(choices.clone(), &[3, 9]).unwrap();
        let got: Vec<_> = swept
            .iter()
            .map(|(c, label)| {
                let s = c.settings::<SaapSettings>();
                assert_eq!(s.budget, 0.2, "the other settings are kept");
                (c.name.as_str(), s.probes, label.as_deref())
            })
            .collect();
        assert_eq!(
            got,
            [
                ("quest", None, None),
                ("saap", Some(3), Some("saap (ℓ 3)")),
                ("saap", Some(9), Some("saap (ℓ 9)")),
                ("kmeans", Some(3), Some("kmeans (ℓ 3)")),
                ("kmeans", Some(9), Some("kmeans (ℓ 9)")),
            ]
        );
        let unchanged = sweep_probes(choices.clone(), &[]).unwrap();
        assert!(unchanged.iter().all(|(_, label)| label.is_none()));
        assert_eq!(unchanged.len(), 3);
        let zero = sweep_probes(choices, &[4, 0]).unwrap_err();
        assert!(zero.contains("at least 1"), "{zero}");
        let none = sweep_probes(vec![named("quest")], &[4]).unwrap_err();
        assert!(none.contains("saap or kmeans"), "{none}");
    }
}
