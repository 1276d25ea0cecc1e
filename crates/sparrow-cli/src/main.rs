//! `sparrow`: run GGUF language models on the CPU. Flags follow llama.cpp's where the meaning
//! is the same, so users' habits carry over.

mod bench;
mod bench_speculative;
mod chat;
mod eval;
mod memory;
mod models;
mod perplexity;
mod progress;
mod prompt_cache;
mod run;
mod saap;
mod serve;
mod speculative;
mod tokenize;

use clap::{Parser, Subcommand};
use sparrow::{KvType, KvTypes};
use std::process::ExitCode;

/// The system allocator plus the heap cap a model file's chat template renders under: a
/// template that would grow past it is an error naming the limit, not an abort.
#[global_allocator]
static ALLOCATOR: sparrow::TemplateAllocator = sparrow::TemplateAllocator;

#[derive(Parser)]
#[command(
    name = "sparrow",
    version,
    about = "Run GGUF language models on the CPU, with long context"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Run(run::RunArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(tokenize::TokenizeArgs),
    /// Measure prompt and generation speed like llama-bench.
    Bench(bench::BenchArgs),
    /// Quality evaluations on a real model.
    #[command(subcommand)]
    Eval(eval::EvalCommand),
    /// Chunked perplexity of a text file, as llama-perplexity computes it.
    Perplexity(perplexity::PerplexityArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Chat with the model in the terminal.
    Chat(chat::ChatArgs),
    /// Saap sparse attention's offline steps: record training activations, train an index.
    #[command(subcommand)]
    Saap(saap::SaapCommand),
}

/// llama.cpp's multi-letter single-dash spellings, which clap cannot declare as short flags:
/// `-ctk q8_0` is read as `--ctk q8_0` (otherwise it would be `-c tk`, never valid), and
/// `-md FILE` as `--md FILE` (the draft model; otherwise `-m d`).
const LLAMA_DASH_ALIASES: &[&str] = &["ctk", "ctv", "md"];

/// The command line with llama.cpp's single-dash aliases (`-ctk`, `-ctv`, also as
/// `-ctk=q8_0`) spelled with two dashes; everything after a `--` is left as it is.
fn llama_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut past_separator = false;
    args.into_iter()
        .map(|arg| {
            if past_separator {
                return arg;
            }
            if arg == "--" {
                past_separator = true;
                return arg;
            }
            let Some(rest) = arg.to_str().and_then(|s| s.strip_prefix('-')) else {
                return arg;
            };
            let name = rest.split_once('=').map_or(rest, |(n, _)| n);
            if LLAMA_DASH_ALIASES.contains(&name) {
                format!("--{rest}").into()
            } else {
                arg
            }
        })
        .collect()
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(llama_args(std::env::args_os()));
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Tokenize(a) => tokenize::tokenize(a),
        Command::Bench(a) => bench::bench(a),
        Command::Eval(c) => eval::eval(c),
        Command::Perplexity(a) => perplexity::perplexity(a),
        Command::Serve(a) => serve::serve(a),
        Command::Chat(a) => chat::chat(a),
        Command::Saap(c) => saap::saap(c),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Flags shared by commands that load a model.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model file (GGUF). Without it, the default Qwen2.5-Coder-0.5B model is used (and
    /// fetched on first use).
    #[arg(short = 'm', long = "model")]
    pub model: Option<std::path::PathBuf>,
    /// Keep every weight in ggml's layout in the file mapping, rather than repacking the
    /// Q5_0 matrices into RAM in sparrow's faster-to-decode layout (as llama.cpp's
    /// `--no-repack`). Same results; slower decode; for comparisons.
    #[arg(long = "no-repack", alias = "nr")]
    pub no_repack: bool,
    /// The memory-lean mode: weights stay in the file mapping (no repack) and prompts are
    /// processed 64 tokens at a time, so the process's own memory is little more than the
    /// KV cache. The default picks it by itself (and says so) when the memory available is
    /// less than the repack would copy.
    #[arg(long = "lean", conflicts_with = "repack")]
    pub lean: bool,
    /// Never pick the memory-lean mode by itself: repack even when memory looks short.
    #[arg(long = "repack", conflicts_with = "no_repack")]
    pub repack: bool,
    /// Read the model file into memory rather than mapping it (llama.cpp's `--no-mmap`).
    /// The weights are then the process's own memory, and are not repacked.
    #[arg(long = "no-mmap")]
    pub no_mmap: bool,
    /// Lock the weights decode reads in RAM so the OS never pages them out (llama.cpp's
    /// `--mlock`; limited by `ulimit -l`: a refusal is reported and the run goes on).
    #[arg(long = "mlock")]
    pub mlock: bool,
    /// Store the weights 16 rows at a time (AVX-512 hosts; Q5_0, Q4_K and Q6_K): passes of a
    /// few tokens cost about half as much, one-token decode gains for Q5_0 and loses a few
    /// percent for Q4_K/Q6_K. `auto` (default): Q5_0 always, every format for speculative
    /// decoding and for serving several slots; `off`: none (the row kernels throughout).
    #[arg(long = "row-groups", value_name = "on|off|auto", default_value = "auto", value_parser = ["on", "off", "auto"])]
    pub row_groups: String,
}

impl ModelArgs {
    /// How to load the model: the defaults, with `--no-repack`, `--lean` / `--repack`,
    /// `--no-mmap` and `--mlock` applied.
    pub fn load_options(&self) -> sparrow::LoadOptions {
        self.load_options_for(false)
    }

    /// [`ModelArgs::load_options`] for a command whose passes check or batch a few tokens
    /// (`few_token_passes`: speculative decoding, several serving slots), which
    /// `--row-groups auto` stores in row groups for.
    pub fn load_options_for(&self, few_token_passes: bool) -> sparrow::LoadOptions {
        let mut o = sparrow::LoadOptions {
            row_groups: match (self.row_groups.as_str(), few_token_passes) {
                ("on", _) | ("auto", true) => sparrow::RowGroups::Batched,
                ("off", _) => sparrow::RowGroups::Off,
                _ => sparrow::RowGroups::Decode,
            },
            ..Default::default()
        };
        o.repack &= !self.no_repack;
        o.lean = match (self.lean, self.repack) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        };
        o.mmap = !self.no_mmap;
        o.mlock = self.mlock;
        o
    }

    /// Resolves the model path and loads model, tokenizer and template.
    pub fn load_engine(&self) -> Result<sparrow::Engine, String> {
        sparrow::Engine::load_with(self.resolve()?, self.load_options()).map_err(|e| e.to_string())
    }

    /// The model path, fetching the default model if needed.
    pub fn resolve(&self) -> Result<std::path::PathBuf, String> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => models::default_model(),
        }
    }
}

/// Where `--help` lists the [`KvArgs`] flags (set per flag: a struct-level
/// `next_help_heading` would also claim the flags a command declares after the group).
const KV_HEADING: &str = "KV cache and attention";

/// The KV cache and the attention that reads it: `--cache-type-k/-v` and every attention
/// flag. One group, flattened into every command that runs the model (`run`, `chat`,
/// `serve`, `bench`, `perplexity`, `eval needle`, `eval attention`), so each takes the same
/// flags with the same defaults.
#[derive(clap::Args, Clone, Debug)]
pub struct KvArgs {
    /// KV cache type for keys: f16, f32 or q8_0 (llama.cpp's -ctk).
    #[arg(
        long = "cache-type-k",
        short = 'k',
        alias = "ctk",
        default_value = "f16",
        help_heading = KV_HEADING
    )]
    pub cache_type_k: KvType,
    /// KV cache type for values: f16, f32 or q8_0 (llama.cpp's -ctv).
    #[arg(long = "cache-type-v", alias = "ctv", default_value = "f16", help_heading = KV_HEADING)]
    pub cache_type_v: KvType,
    /// Keep at most SIZE of keys and values in RAM (e.g. 64M; with the policy's summaries);
    /// the rest goes to a file in --kv-dir, read back as the policy selects it.
    #[arg(long = "kv-ram-budget", value_name = "SIZE", value_parser = sparrow::memory::parse_size, help_heading = KV_HEADING)]
    pub kv_ram_budget: Option<usize>,
    /// Directory of the cold KV file under --kv-ram-budget (default: the system temp dir;
    /// the file is never named there, so nothing is left behind).
    #[arg(long = "kv-dir", value_name = "DIR", requires = "kv_ram_budget", help_heading = KV_HEADING)]
    pub kv_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub attn: AttnArgs,
}

impl KvArgs {
    /// The key and value cache types.
    pub fn types(&self) -> KvTypes {
        KvTypes::new(self.cache_type_k, self.cache_type_v)
    }

    /// How states are made: the types, and the cold tier when a RAM budget is set.
    pub fn options(&self) -> sparrow::KvOptions {
        sparrow::KvOptions {
            types: self.types(),
            cold: self.kv_ram_budget.map(|ram_budget| sparrow::ColdTier {
                ram_budget,
                dir: self.kv_dir.clone(),
            }),
            reserved: 0,
        }
    }

    /// The attention choice (`--attn` with its settings), checked; see [`AttnArgs::choice`].
    pub fn choice(&self) -> Result<sparrow::attention::AttentionChoice, String> {
        self.attn.choice()
    }

    /// One checked choice per comma-separated `--attn` name; see [`AttnArgs::choices`].
    pub fn choices(&self) -> Result<Vec<sparrow::attention::AttentionChoice>, String> {
        self.attn.choices()
    }
}

/// Which attention policy to run (`--attn`) and every policy's settings — the engine's
/// [`sparrow::attention::AttentionChoice`], whose policies declare their own flags; part of
/// [`KvArgs`].
#[derive(clap::Args, Clone, Debug)]
pub struct AttnArgs {
    #[command(flatten)]
    pub choice: sparrow::attention::AttentionChoice,
}

impl AttnArgs {
    /// The choice as the engine takes it; unknown names and bad settings are refused here,
    /// before any work.
    pub fn choice(&self) -> Result<sparrow::attention::AttentionChoice, String> {
        self.choice_named(&self.choice.name)
    }

    /// One choice per comma-separated name of `--attn` (for `sparrow bench` and `eval`).
    pub fn choices(&self) -> Result<Vec<sparrow::attention::AttentionChoice>, String> {
        self.choice
            .name
            .split(',')
            .map(|n| self.choice_named(n.trim()))
            .collect()
    }

    /// The choice of policy `name` with this command's settings.
    pub fn choice_for(&self, name: &str) -> Result<sparrow::attention::AttentionChoice, String> {
        self.choice_named(name)
    }

    /// `PREFILL+DECODE` names one policy per phase (`xattention+quest`).
    fn choice_named(&self, name: &str) -> Result<sparrow::attention::AttentionChoice, String> {
        let c = match name.split_once('+') {
            Some((prefill, decode)) => {
                let mut c = self.choice.with_name("full");
                c.prefill = Some(prefill.trim().to_string());
                c.decode = Some(decode.trim().to_string());
                c
            }
            None => self.choice.with_name(name),
        };
        c.check()?;
        Ok(c)
    }
}

/// Sampling flags (llama.cpp's names and defaults), shared by `run` and `chat`.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature (0: greedy).
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k sampling (0: off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (nucleus) sampling (1.0: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p sampling (0.0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1.0: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed (-1: random).
    #[arg(short = 's', long = "seed", default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
}

impl SamplingArgs {
    /// The sampler settings, checked; a negative seed draws one from the clock.
    pub fn config(&self) -> Result<sparrow::SamplerConfig, String> {
        let cfg = sparrow::SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: if self.seed < 0 {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0)
            } else {
                self.seed as u64
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// The prompt: `-p TEXT` or `-f FILE` (exactly one), shared by every command that reads text.
#[derive(clap::Args, Clone, Debug)]
pub struct PromptArgs {
    /// Prompt text (special-token text such as <|im_start|> is parsed as the token unless
    /// the command says otherwise).
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<std::path::PathBuf>,
}

impl PromptArgs {
    /// The text from `-p` or `-f`.
    pub fn text(&self) -> Result<String, String> {
        match (&self.prompt, &self.file) {
            (Some(_), Some(_)) => Err("give either -p/--prompt or -f/--file, not both".into()),
            (Some(p), None) => Ok(p.clone()),
            (None, Some(f)) => std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read prompt file {}: {e}", f.display())),
            (None, None) => Err("no prompt: pass -p TEXT or -f FILE".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::llama_args;
    use std::ffi::OsString;

    /// clap's own consistency checks over every command (unique argument ids across the
    /// flattened policy settings, valid defaults), which otherwise fire only when a command
    /// is parsed.
    #[test]
    fn every_command_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }

    fn rewrite(args: &[&str]) -> Vec<String> {
        llama_args(args.iter().map(OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn llama_single_dash_aliases_become_long_flags() {
        assert_eq!(
            rewrite(&["sparrow", "serve", "-ctk", "q8_0", "-ctv=f32", "-c", "64"]),
            ["sparrow", "serve", "--ctk", "q8_0", "--ctv=f32", "-c", "64"]
        );
        // Other flags, long spellings and anything after `--` are left alone.
        assert_eq!(
            rewrite(&["sparrow", "run", "--ctk", "f16", "-ct", "-k", "f32", "--", "-ctk"]),
            ["sparrow", "run", "--ctk", "f16", "-ct", "-k", "f32", "--", "-ctk"]
        );
    }
}
