//! `sparrow eval needle`: needle-in-a-haystack accuracy over a grid of lengths × depths.

use crate::run::init_threads;
use crate::{AttnArgs, ModelArgs};
use sparrow::eval::needle::{load_haystack, run_cell, CellSettings, NeedleResult};
use sparrow::{Engine, KvType};

/// Evaluations.
#[derive(clap::Subcommand, Debug)]
pub enum EvalCommand {
    /// Needle in a haystack over context lengths × needle depths.
    Needle(NeedleArgs),
}

/// Arguments of `sparrow eval needle`.
#[derive(clap::Args, Debug)]
pub struct NeedleArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    attn: AttnArgs,
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
    /// Write every cell's result as JSON to this file.
    #[arg(long = "json")]
    json: Option<std::path::PathBuf>,
    /// Threads (default: all available cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Prompt tokens per forward pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    /// KV cache type (f16 or f32).
    #[arg(
        long = "cache-type-k",
        short = 'k',
        alias = "ctk",
        default_value = "f16"
    )]
    cache_type: KvType,
}

pub fn eval(cmd: EvalCommand) -> Result<(), String> {
    match cmd {
        EvalCommand::Needle(a) => needle(a),
    }
}

fn needle(a: NeedleArgs) -> Result<(), String> {
    if let Some(d) = a.depths.iter().find(|d| !(0.0..=1.0).contains(*d)) {
        return Err(format!("--depths: {d} is outside [0, 1]"));
    }
    if a.lengths.iter().any(|&l| l < 64) {
        return Err("--lengths: each length must be at least 64 tokens".into());
    }
    let settings = CellSettings {
        kv: a.cache_type,
        batch_size: a.batch_size,
        attention: a.attn.choice()?,
    };
    init_threads(a.threads)?;
    let haystack = load_haystack(&a.haystack).map_err(|e| e.to_string())?;
    let engine = Engine::load(a.model.resolve()?).map_err(|e| e.to_string())?;
    let mut results: Vec<NeedleResult> = Vec::new();
    let total = a.lengths.len() * a.depths.len();
    for (li, &length) in a.lengths.iter().enumerate() {
        for (di, &depth) in a.depths.iter().enumerate() {
            let cell = li * a.depths.len() + di;
            let r = run_cell(
                &engine,
                &haystack,
                length,
                depth,
                a.seed.wrapping_add(cell as u64),
                &settings,
            )
            .map_err(|e| e.to_string())?;
            eprintln!(
                "[{}/{total}] length {length} depth {depth:.2}: {} (expected {}, got {:?})",
                cell + 1,
                if r.found { "found" } else { "MISSED" },
                r.needle.value,
                r.answer.trim()
            );
            results.push(r);
        }
    }
    print_table(&a.lengths, &a.depths, &results);
    if let Some(path) = &a.json {
        let json = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

fn print_table(lengths: &[usize], depths: &[f64], results: &[NeedleResult]) {
    let header: Vec<String> = depths.iter().map(|d| format!("{d:.2}")).collect();
    println!("| length \\ depth | {} | accuracy |", header.join(" | "));
    println!("| ---: |{} ---: |", " :---: |".repeat(depths.len()));
    for (li, length) in lengths.iter().enumerate() {
        let row = &results[li * depths.len()..(li + 1) * depths.len()];
        let marks: Vec<&str> = row
            .iter()
            .map(|r| if r.found { "✓" } else { "✗" })
            .collect();
        let acc = row.iter().filter(|r| r.found).count() as f64 / row.len() as f64;
        println!("| {length} | {} | {:.0}% |", marks.join(" | "), acc * 100.0);
    }
    let all = results.iter().filter(|r| r.found).count() as f64 / results.len().max(1) as f64;
    println!(
        "\noverall accuracy: {:.1}% of {} cells",
        all * 100.0,
        results.len()
    );
}
