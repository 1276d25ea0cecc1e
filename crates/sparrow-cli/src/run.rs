//! `sparrow run`: generate from a prompt, streaming to stdout, statistics to stderr.

use crate::{KvArgs, ModelArgs, PromptArgs, SamplingArgs};
use indicatif::{ProgressBar, ProgressStyle};
use sparrow::grammar::{JsonConstraint, JsonVocab, Root};
use sparrow::{ChatMessage, Engine, Generation, Sampler, Session, WithProgress};
use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;
use std::sync::Arc;

/// Arguments of `sparrow run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    kv: KvArgs,
    /// Number of tokens to generate (-1: until end of generation or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Context size in tokens (0: the model's training context).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    ctx_size: usize,
    /// Threads (default: all available cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Prompt tokens per forward pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    speculative: crate::speculative::SpeculativeArgs,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long = "chat", alias = "conversation")]
    chat: bool,
    /// System message when --chat is used.
    #[arg(long = "system-prompt", short = 'S')]
    system_prompt: Option<String>,
    /// Do not echo the prompt before the generated text.
    #[arg(long = "no-display-prompt")]
    no_display_prompt: bool,
    /// Keep generating past end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    ignore_eos: bool,
    /// Constrain the output to a JSON object.
    #[arg(long = "json")]
    json: bool,
    /// Restore the prompt's KV state from FILE when it holds a prefix of the prompt, and
    /// save it there after the run.
    #[arg(long = "prompt-cache")]
    prompt_cache: Option<std::path::PathBuf>,
}

/// Build the global thread pool that all kernels run on, with the calling thread as one of
/// its threads: the command's forward passes then start their products from inside the
/// pool rather than waking it from outside for each (`sparrow::threads`).
pub fn init_threads(threads: Option<usize>) -> Result<usize, String> {
    build_pool(threads, true)
}

/// [`init_threads`] for a command whose calling thread waits on other threads that use the
/// kernels (the server's HTTP loop beside its generation loop, `saap train`'s workers): the
/// pool's threads are all its own. A calling thread in the pool that blocks on anything but
/// the pool does not take the pool's work, so with one thread such a command would wait
/// forever. (The server's generation loop runs on a pool thread itself:
/// [`sparrow::threads::on_pool`].)
pub fn init_pool_threads(threads: Option<usize>) -> Result<usize, String> {
    build_pool(threads, false)
}

fn build_pool(threads: Option<usize>, join: bool) -> Result<usize, String> {
    let n = match threads {
        Some(0) => return Err("-t/--threads must be at least 1".into()),
        Some(n) => n,
        None => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    };
    let builder = rayon::ThreadPoolBuilder::new().num_threads(n);
    match join {
        true => builder.use_current_thread(),
        false => builder,
    }
    .build_global()
    .map_err(|e| format!("cannot start {n} threads: {e}"))?;
    Ok(n)
}

pub fn run(a: RunArgs) -> Result<(), String> {
    let kv_types = a.kv.types();
    let sampler_cfg = a.sampling.config()?;
    let attention = a.kv.choice()?;
    let text = a.prompt.text()?;
    let threads = init_threads(a.threads)?;
    let path = a.model.resolve()?;

    let options = a.model.load_options_for(a.speculative.is_on());
    let engine = Engine::load_with(&path, options).map_err(|e| e.to_string())?;
    for w in engine.tokenizer.warnings() {
        eprintln!("warning: {w}");
    }
    let cfg = &engine.model.config;
    let n_ctx = if a.ctx_size == 0 {
        cfg.n_ctx_train
    } else {
        a.ctx_size
    };
    if n_ctx > cfg.n_ctx_train {
        eprintln!(
            "warning: context size {n_ctx} exceeds the model's training context {}",
            cfg.n_ctx_train
        );
    }

    let prompt = if a.chat {
        let tmpl = engine
            .chat_template
            .as_ref()
            .ok_or("--chat: this model has no chat template")?;
        let mut msgs = Vec::new();
        if let Some(s) = &a.system_prompt {
            msgs.push(ChatMessage::new("system", s));
        }
        msgs.push(ChatMessage::new("user", &text));
        tmpl.render(&msgs, true).map_err(|e| e.to_string())?
    } else {
        text
    };
    let ids = engine.tokenizer.encode(&prompt, true, true);
    if ids.is_empty() {
        return Err("the prompt is empty after tokenization".into());
    }
    if ids.len() >= n_ctx {
        return Err(sparrow::Error::PromptTooLong {
            n_prompt: ids.len(),
            n_ctx,
        }
        .to_string());
    }
    eprintln!(
        "sparrow: {} ({}, {} layers, {} threads), context {n_ctx}, KV cache {}, attention {}",
        path.display(),
        cfg.arch.name(),
        cfg.n_layer,
        threads,
        kv_types,
        attention.name
    );
    let mut state = engine
        .model
        .new_sequence(n_ctx, a.kv.options(), &attention)
        .map_err(|e| e.to_string())?;
    let mut sampler = Sampler::new(sampler_cfg);
    let limit = usize::try_from(a.n_predict).unwrap_or(usize::MAX);
    let mut gen = Generation::new(limit, a.ignore_eos);
    if a.json {
        let vocab = Arc::new(JsonVocab::new(&engine.tokenizer));
        gen = gen.with_constraint(JsonConstraint::new(vocab, Root::Object));
    }

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if !a.no_display_prompt {
        let _ = write!(out, "{prompt}");
        let _ = out.flush();
    }
    let mut progress = PromptProgress::new(ids.len(), a.batch_size);
    let restored = match &a.prompt_cache {
        Some(p) => crate::prompt_cache::restore(p, &engine, &mut state, &ids),
        None => 0,
    };
    let mut session = Session::holding(state, ids[..restored].to_vec())
        .map_err(|e| e.to_string())?
        .with_batch_size(a.batch_size);
    if let Some(spec) = a
        .speculative
        .speculation(&engine, n_ctx, &a.kv.options(), a.batch_size)?
    {
        session = session.with_speculation(spec);
    }
    let stats = session
        .generate(
            &engine,
            &ids,
            &mut sampler,
            &mut gen,
            &mut WithProgress {
                on_prefill: |done, total| progress.update(done, total),
                on_token: |_: Option<u32>, piece: &str| {
                    let _ = out.write_all(piece.as_bytes());
                    let _ = out.flush();
                    ControlFlow::Continue(())
                },
            },
        )
        .map_err(|e| e.to_string())?;
    if let Some(p) = &a.prompt_cache {
        crate::prompt_cache::save(p, &engine, session.state(), &ids, restored);
    }
    let _ = writeln!(out);
    eprintln!();
    eprintln!(
        "load time:   {:8.1} ms",
        engine.load_time.as_secs_f64() * 1e3
    );
    eprintln!(
        "prompt:      {:8} tokens in {:8.1} ms ({:.2} tok/s)",
        stats.n_prompt,
        stats.prompt_time.as_secs_f64() * 1e3,
        stats.prompt_tps()
    );
    eprintln!(
        "generation:  {:8} tokens in {:8.1} ms ({:.2} tok/s)",
        stats.n_generated,
        stats.gen_time.as_secs_f64() * 1e3,
        stats.gen_tps()
    );
    if let Some(s) = &stats.speculation {
        eprintln!("{}", crate::speculative::summary(s, stats.n_generated));
    }
    eprintln!("{}", kv_summary(session.state().kv()));
    if let Some(m) = crate::memory::memory_report() {
        eprintln!(
            "memory:      peak RSS {:.1} MiB (now: {:.1} MiB heap, {:.1} MiB mapped file pages: model, cold KV)",
            m.peak_rss_kib as f64 / 1024.0,
            m.anon_kib as f64 / 1024.0,
            m.file_kib as f64 / 1024.0
        );
    }
    Ok(())
}

/// What the KV cache holds: bytes each new position adds (in the layers that keep every
/// position), the sliding-window layers' rings (a fixed size), and what is resident.
fn kv_summary(kv: &dyn sparrow::kv::KvStore) -> String {
    let types = kv.types();
    let row = types.k.row_bytes(kv.kv_dim()) + types.v.row_bytes(kv.kv_dim());
    let rings: Vec<usize> = (0..kv.n_layer())
        .map(|l| kv.layer_rows(l))
        .filter(|&r| r < kv.n_ctx())
        .collect();
    let mut out = format!(
        "KV cache: {types}, {} bytes per token",
        thousands(kv.bytes_per_token())
    );
    if !rings.is_empty() {
        out += &format!(
            " ({} of {} layers); {} sliding-window layers in rings of {} positions \
             ({} bytes per token each, {:.1} MiB in all at most)",
            kv.n_layer() - rings.len(),
            kv.n_layer(),
            rings.len(),
            thousands(rings[0]),
            thousands(row),
            (rings.iter().sum::<usize>() * row) as f64 / (1 << 20) as f64
        );
    }
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    out += &format!("; {:.1} MiB resident", mib(kv.bytes_resident()));
    if kv.bytes_cold() > 0 {
        out += &format!(" (hot), {:.1} MiB in the cold file", mib(kv.bytes_cold()));
    }
    out
}

/// `n` with commas between groups of three digits (`9,408`).
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Progress of a long prompt's prefill on stderr: a bar on a terminal, a line per batch
/// otherwise (logs, CI). Short prompts (one batch) show nothing.
struct PromptProgress {
    bar: Option<ProgressBar>,
    plain: bool,
}

impl PromptProgress {
    fn new(n_prompt: usize, batch_size: usize) -> Self {
        let long = n_prompt > batch_size;
        let tty = std::io::stderr().is_terminal();
        let bar = (long && tty).then(|| {
            let b = ProgressBar::new(n_prompt as u64);
            b.set_style(
                ProgressStyle::with_template(
                    "prompt {bar:40} {pos}/{len} tokens ({per_sec}, eta {eta})",
                )
                .expect("valid template"),
            );
            b
        });
        PromptProgress {
            bar,
            plain: long && !tty,
        }
    }

    fn update(&mut self, done: usize, total: usize) {
        if let Some(b) = &self.bar {
            b.set_position(done as u64);
            if done == total {
                b.finish_and_clear();
            }
        } else if self.plain {
            eprintln!("prompt: {done}/{total} tokens");
        }
    }
}
