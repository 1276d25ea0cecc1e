//! `sparrow bench`: llama-bench's measurements, so results line up with llama.cpp's.
//!
//! Test `ppN` times one forward pass over N prompt tokens (in `-b` batches); `tgN` times N
//! single-token decode steps. With `-d D` the context first holds D tokens (not timed).
//! Each test is repeated `-r` times on a fresh context; tok/s is averaged over repetitions
//! with its standard deviation, as llama-bench reports it. Tokens are pseudo-random ids, as
//! in llama-bench: the content does not change the cost. `--attn full,quest` measures
//! several policies in one run, side by side on the same context. `--sequences 1,4` runs
//! each test on that many sequences at once, their tokens sharing each forward pass as the
//! server's continuous batching does (llama-batched-bench's `-npl`): tok/s then counts the
//! tokens of all sequences.

use crate::{KvArgs, ModelArgs};
use serde::Serialize;
use sparrow::attention::AttentionChoice;
use sparrow::{Logits, Model, SeqStep, State, Workspace};
use std::time::Instant;

/// Arguments of `sparrow bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    kv: KvArgs,
    /// Prompt lengths to test (comma-separated; 0 skips).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0 skips).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,
    /// Context depths to test at (comma-separated).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    n_depth: Vec<usize>,
    /// Sequences run together, their tokens in the same forward passes (comma-separated).
    #[arg(
        long = "sequences",
        alias = "npl",
        value_delimiter = ',',
        default_value = "1"
    )]
    sequences: Vec<usize>,
    /// Thread counts to test (comma-separated).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Repetitions per test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    repetitions: usize,
    /// Prompt tokens per forward pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    /// Attention used to fill the `-d` context (untimed). Decode cost does not depend on the
    /// cached values, so a cheap fill (`streaming`) makes 32K rows take minutes, not a
    /// quarter of an hour; rows timing prefill at depth are unaffected too.
    #[arg(long = "fill-attn", default_value = "full")]
    fill_attn: String,
    /// With --kv-ram-budget: before each timed test, drop the cold KV file's pages from
    /// memory (the OS's page cache too), so its reads start from the disk.
    #[arg(long = "kv-cold-start", requires = "kv_ram_budget")]
    kv_cold_start: bool,
    /// Print llama-bench-compatible JSON instead of a markdown table.
    #[arg(long = "json")]
    json: bool,
    /// Output format: md or json (llama-bench's `-o`).
    #[arg(short = 'o', long = "output", default_value = "md")]
    output: String,
    /// With --draft-model or --lookup: speculative decoding beside plain decoding, greedy,
    /// on real prompts (this set: a JSON list of {"kind", "prompt"}; default: the code
    /// edits, code and chat prompts of bench/speculative-prompts.json), `-n` tokens each.
    #[arg(long = "spec-prompts", value_name = "FILE")]
    spec_prompts: Option<std::path::PathBuf>,
    #[command(flatten)]
    speculative: crate::speculative::SpeculativeArgs,
}

/// One result row; field names follow llama-bench's JSON.
#[derive(Serialize, Debug)]
struct BenchRow {
    model_filename: String,
    model_type: String,
    model_size: u64,
    n_threads: usize,
    n_batch: usize,
    type_k: String,
    type_v: String,
    attention: String,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    /// Sequences sharing each forward pass (tok/s counts all of their tokens).
    n_seq: usize,
    build_simd: String,
    /// Whether Q5_0 matrices were repacked for decode (`--no-repack` turns it off).
    repack: bool,
    /// Whether Q4_K/Q6_K matrices are in row groups (`--row-groups`).
    row_groups: bool,
    /// Layers whose KV rows the policy's store kept grouped by bin (Saap's buckets: the
    /// store a run with the policy makes); 0 where the store keeps positions in order.
    kv_layers_in_bins: usize,
    avg_ns: u64,
    stddev_ns: u64,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ns: Vec<u64>,
    samples_ts: Vec<f64>,
}

/// Deterministic pseudo-random token ids below `vocab`.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

fn fill(model: &Model, state: &mut State, toks: &[u32], batch: usize) -> Result<(), String> {
    for chunk in toks.chunks(batch.max(1)) {
        model
            .forward(state, chunk, Logits::Last)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One forward pass over every state, state `i` running `toks(i)`.
fn pass<'t>(
    model: &Model,
    ws: &mut Workspace,
    states: &mut [State],
    toks: impl Fn(usize) -> &'t [u32],
) -> Result<(), String> {
    let mut steps: Vec<SeqStep<'_>> = states
        .iter_mut()
        .enumerate()
        .map(|(i, state)| SeqStep {
            state,
            tokens: toks(i),
            want: Logits::Last,
            as_steps: false,
            siblings: &[],
        })
        .collect();
    model
        .forward_many(ws, &mut steps)
        .map_err(|e| e.to_string())
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Time one test (on `n_seq` sequences together) for every policy in `policies`: returns,
/// per policy, nanoseconds per repetition. The `depth` context is filled once per repetition
/// (untimed) and shared by the policies that read the store by position: each starts from
/// the same cache, with its block summaries built by an untimed warm-up step, so rows at
/// depth differ only in attention. A policy that partitions the cache (Saap) reads its own
/// store, kept in its bins as a run with it would be ([`partitions_cache`]): it gets states
/// of its own, filled with the same tokens, its placements made as the fill seals blocks,
/// and the policy that filled them is the one timed.
/// The fill runs `--fill-attn` (default exact) for prefill. Also returns, per policy, how
/// many layers its store kept in bins.
fn run_test(
    model: &Model,
    a: &BenchArgs,
    policies: &[AttentionChoice],
    n_prompt: usize,
    n_gen: usize,
    depth: usize,
    n_seq: usize,
) -> Result<Vec<(Vec<u64>, usize)>, String> {
    let vocab = model.config.vocab_size;
    let n_ctx = depth + n_prompt + n_gen + 1;
    let own: Vec<bool> = policies
        .iter()
        .map(|c| partitions_cache(model, c))
        .collect::<Result<_, _>>()?;
    // The policies sharing states kept by position, then one group per policy with a store
    // of its own; each group's states are dropped before the next group's are made.
    let shared: Vec<usize> = (0..policies.len()).filter(|&p| !own[p]).collect();
    let groups: Vec<Vec<usize>> = std::iter::once(shared)
        .filter(|g| !g.is_empty())
        .chain((0..policies.len()).filter(|&p| own[p]).map(|p| vec![p]))
        .collect();
    let fill_choice = a.kv.attn.choice_for(&a.fill_attn)?;
    let mut samples = vec![(Vec::with_capacity(a.repetitions), 0); policies.len()];
    let progress = depth >= 8192;
    let mut ws = Workspace::default();
    let mut warmed = false;
    for rep in 0..a.repetitions {
        for group in &groups {
            let holder = own[group[0]].then(|| &policies[group[0]]);
            let (mut states, fill_with) = match holder {
                None => (
                    shared_states(model, a, policies, n_ctx, n_seq)?,
                    fill_choice.clone(),
                ),
                // The policy that fills its own store stays for the timed run: a new one
                // would seal every block again, taking each sorted segment back out of its
                // bins (and, under a RAM budget, out of the cold file) to sort it anew. So a
                // test with a prompt fills with the policy itself; a decode-only one with the
                // fill's prefill paired with its decode.
                Some(choice) => (
                    (0..n_seq)
                        .map(|_| model.new_sequence(n_ctx, a.kv.options(), choice))
                        .collect::<Result<Vec<State>, _>>()
                        .map_err(|e| e.to_string())?,
                    if n_prompt > 0 {
                        choice.clone()
                    } else {
                        with_prefill(choice, &fill_choice)?
                    },
                ),
            };
            if !warmed {
                // One untimed warm-up pass pages the weights in and spins up the threads.
                fill(
                    model,
                    &mut states[0],
                    &tokens(n_prompt.clamp(1, 16), vocab, 7),
                    a.batch_size,
                )?;
                warmed = true;
            }
            for (i, state) in states.iter_mut().enumerate() {
                state.set_attention(fill_with.build(&model.config)?);
                state.reset();
                if progress {
                    let whose = holder.map_or(String::new(), |c| format!(", for {}", c.label()));
                    eprintln!(
                        "bench: filling {depth} tokens of context (repetition {}, sequence {}{whose})",
                        rep + 1,
                        i + 1
                    );
                }
                fill(
                    model,
                    state,
                    &tokens(depth, vocab, 11 + i as u64),
                    a.batch_size,
                )?;
            }
            for &p in group {
                let sample = time_policy(
                    model,
                    a,
                    holder.is_none().then_some(&policies[p]),
                    &mut states,
                    &mut ws,
                    (n_prompt, n_gen, depth),
                    rep,
                )?;
                samples[p].0.push(sample);
                let kv = states[0].kv();
                samples[p].1 = (0..kv.n_layer()).filter(|&l| kv.keeps_bins(l, 0)).count();
            }
        }
    }
    Ok(samples)
}

/// Whether `choice`'s policy partitions the cache (Saap's buckets): a store made for it
/// keeps those layers' rows in its bins, which the policy reads as runs.
fn partitions_cache(model: &Model, choice: &AttentionChoice) -> Result<bool, String> {
    let policy = choice.build(&model.config)?;
    Ok((0..model.config.n_layer).any(|l| policy.partition(l).is_some()))
}

/// `choice` with the fill's prefill policy, so a fill into its own store runs the fill's
/// prefill while `choice`'s decode policy places the sealed rows in its bins.
fn with_prefill(
    choice: &AttentionChoice,
    fill: &AttentionChoice,
) -> Result<AttentionChoice, String> {
    let mut c = choice.clone();
    c.decode = Some(choice.phase_names()?.1);
    c.prefill = Some(fill.phase_names()?.0);
    Ok(c)
}

/// `n_seq` states kept by position for the policies that share them; under a RAM budget the
/// store leaves room for the hungriest one's summaries.
fn shared_states(
    model: &Model,
    a: &BenchArgs,
    policies: &[AttentionChoice],
    n_ctx: usize,
    n_seq: usize,
) -> Result<Vec<State>, String> {
    let mut kv = a.kv.options();
    if kv.cold.is_some() {
        for choice in policies {
            let p = choice.build(&model.config)?;
            kv.reserved = kv
                .reserved
                .max(p.summary_bytes(n_ctx, model.config.kv_dim()));
        }
    }
    (0..n_seq)
        .map(|_| model.new_state(n_ctx, kv.clone()))
        .collect::<Result<Vec<State>, _>>()
        .map_err(|e| e.to_string())
}

/// One timed run on the filled `states`, of `choice` if given, else of the policy that
/// filled them: `n_prompt` prompt tokens then `n_gen` generated ones per sequence (`shape`
/// is those and the filled depth, which the states are rewound to afterwards); returns
/// nanoseconds.
fn time_policy(
    model: &Model,
    a: &BenchArgs,
    choice: Option<&AttentionChoice>,
    states: &mut [State],
    ws: &mut Workspace,
    (n_prompt, n_gen, depth): (usize, usize, usize),
    rep: usize,
) -> Result<u64, String> {
    let (vocab, n_seq) = (model.config.vocab_size, states.len());
    for state in states.iter_mut() {
        if let Some(choice) = choice {
            state.set_attention(choice.build(&model.config)?);
        }
        // Untimed: one decode step seals the context's blocks for this policy.
        if depth > 0 {
            model
                .forward(state, &tokens(1, vocab, 5), Logits::Last)
                .map_err(|e| e.to_string())?;
            rewind(state, depth)?;
        }
        if a.kv_cold_start {
            state.kv().drop_cold_pages()?;
        }
    }
    let prompts: Vec<Vec<u32>> = (0..n_seq)
        .map(|i| tokens(n_prompt, vocab, 100 + (rep * n_seq + i) as u64))
        .collect();
    let gens: Vec<Vec<u32>> = (0..n_seq)
        .map(|i| tokens(n_gen, vocab, 200 + (rep * n_seq + i) as u64))
        .collect();
    for state in states.iter_mut() {
        state.expect_prompt_end(depth + n_prompt);
    }
    let batch = a.batch_size.max(1);
    let start = Instant::now();
    for c in (0..n_prompt).step_by(batch) {
        let end = (c + batch).min(n_prompt);
        pass(model, ws, states, |i| &prompts[i][c..end])?;
    }
    for t in 0..n_gen {
        pass(model, ws, states, |i| &gens[i][t..t + 1])?;
    }
    let elapsed = start.elapsed().as_nanos() as u64;
    for state in states.iter_mut() {
        rewind(state, depth)?;
    }
    Ok(elapsed)
}

/// Rewind to the filled depth for the next measurement.
fn rewind(state: &mut State, depth: usize) -> Result<(), String> {
    match state.truncate(depth) {
        kept if kept == depth => Ok(()),
        _ => Err(format!(
            "cannot rewind to depth {depth}: the model's sliding-window layers have overwritten \
             it (use fewer -p/-n tokens per run)"
        )),
    }
}

pub fn bench(a: BenchArgs) -> Result<(), String> {
    if a.repetitions == 0 {
        return Err("-r/--repetitions must be at least 1".into());
    }
    let json = a.json || a.output == "json";
    if !json && a.output != "md" {
        return Err(format!("unknown output format '{}' (md or json)", a.output));
    }
    let policies = a.kv.choices()?;
    if a.speculative.is_on() {
        return bench_speculative(&a, json);
    }
    let path = a.model.resolve()?;
    let model = Model::load_with(&path, a.model.load_options()).map_err(|e| e.to_string())?;
    let threads = if a.threads.is_empty() {
        vec![std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)]
    } else {
        a.threads.clone()
    };
    let file_name = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let model_type = format!(
        "{} {}L {}d",
        model.config.arch.name(),
        model.config.n_layer,
        model.config.n_embd
    );
    let simd = sparrow_quant::SimdLevel::active().name().to_string();

    if a.sequences.contains(&0) {
        return Err("--sequences: each count must be at least 1".into());
    }
    let mut tests = Vec::new();
    for &d in &a.n_depth {
        for &s in &a.sequences {
            for &p in a.n_prompt.iter().filter(|&&p| p > 0) {
                tests.push((p, 0, d, s));
            }
            for &g in a.n_gen.iter().filter(|&&g| g > 0) {
                tests.push((0, g, d, s));
            }
        }
    }
    let mut rows = Vec::new();
    if !json {
        println!("| model | size | threads | simd | repack | type_k | attn | test | t/s |");
        println!("| --- | ---: | ---: | --- | --- | --- | --- | --- | ---: |");
    }
    for &t in &threads {
        if t == 0 {
            return Err("-t/--threads must be at least 1".into());
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .map_err(|e| format!("cannot start {t} threads: {e}"))?;
        for &(p, g, d, s) in &tests {
            let per_policy = pool.install(|| run_test(&model, &a, &policies, p, g, d, s))?;
            for (choice, (samples, kv_layers_in_bins)) in policies.iter().zip(per_policy) {
                let n = ((p + g) * s) as f64;
                let ts: Vec<f64> = samples.iter().map(|&ns| n / (ns as f64 * 1e-9)).collect();
                let ns: Vec<f64> = samples.iter().map(|&s| s as f64).collect();
                let (avg_ts, stddev_ts) = mean_std(&ts);
                let (avg_ns, stddev_ns) = mean_std(&ns);
                let row = BenchRow {
                    model_filename: file_name.clone(),
                    model_type: model_type.clone(),
                    model_size: model.file().file_len(),
                    n_threads: t,
                    n_batch: a.batch_size,
                    type_k: a.kv.cache_type_k.name().into(),
                    type_v: a.kv.cache_type_v.name().into(),
                    attention: choice.label(),
                    n_prompt: p,
                    n_gen: g,
                    n_depth: d,
                    n_seq: s,
                    build_simd: simd.clone(),
                    repack: model.is_repacked(),
                    row_groups: model.has_row_groups(),
                    kv_layers_in_bins,
                    avg_ns: avg_ns as u64,
                    stddev_ns: stddev_ns as u64,
                    avg_ts,
                    stddev_ts,
                    samples_ns: samples,
                    samples_ts: ts,
                };
                if !json {
                    let test = if p > 0 {
                        format!("pp{p}")
                    } else {
                        format!("tg{g}")
                    };
                    let test = if s > 1 { format!("{test} ×{s}") } else { test };
                    let test = if d > 0 {
                        format!("{test} @ d{d}")
                    } else {
                        test
                    };
                    println!(
                        "| {} | {:.0} MiB | {} | {} | {} | {} | {} | {} | {:.2} ± {:.2} |",
                        row.model_type,
                        row.model_size as f64 / (1024.0 * 1024.0),
                        t,
                        row.build_simd,
                        match (row.repack, row.row_groups) {
                            (_, true) => "groups",
                            (true, false) => "yes",
                            (false, false) => "no",
                        },
                        row.type_k,
                        row.attention,
                        test,
                        avg_ts,
                        stddev_ts
                    );
                }
                rows.push(row);
            }
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
    }
    Ok(())
}

/// The speculative bench (`--draft-model` / `--lookup`): see [`crate::bench_speculative`].
fn bench_speculative(a: &BenchArgs, json: bool) -> Result<(), String> {
    let prompts = crate::bench_speculative::load_prompts(a.spec_prompts.as_deref())?;
    let threads = a.threads.first().copied();
    crate::run::init_threads(threads)?;
    let path = a.model.resolve()?;
    let options = a.model.load_options_for(true);
    let engine = sparrow::Engine::load_with(&path, options).map_err(|e| e.to_string())?;
    let n_gen = a.n_gen.iter().copied().find(|&g| g > 0).unwrap_or(128);
    let rows = crate::bench_speculative::run(
        &engine,
        &a.speculative,
        &a.kv.options(),
        &a.kv.choice()?,
        &prompts,
        n_gen,
        a.repetitions,
    )?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
    } else {
        crate::bench_speculative::print_table(&rows);
    }
    Ok(())
}
