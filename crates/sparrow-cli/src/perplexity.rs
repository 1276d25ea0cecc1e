//! `sparrow perplexity`: llama-perplexity's chunked perplexity over a text file.

use crate::run::init_threads;
use crate::{KvArgs, ModelArgs};
use sparrow_eval::perplexity::{score_chunk, ChunkScoring, Perplexity};
use std::io::Write;
use std::time::Instant;

/// Arguments of `sparrow perplexity`.
#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    kv: KvArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    file: std::path::PathBuf,
    /// Tokens per chunk (the second half of each chunk is scored).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Score at most this many chunks (default: all the text holds).
    #[arg(long = "chunks")]
    chunks: Option<usize>,
    /// Tokens per forward pass (bounds the logits held in memory).
    #[arg(short = 'b', long = "batch-size", default_value_t = 128)]
    batch_size: usize,
    /// Score only the last N tokens of each chunk, feeding them one at a time, so decode-phase
    /// policies (quest, h2o) are what is measured (default: llama.cpp's second half, batched).
    #[arg(long = "decode")]
    decode: Option<usize>,
    /// Threads (default: all available cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
}

pub fn perplexity(a: PerplexityArgs) -> Result<(), String> {
    if a.ctx_size < 4 {
        return Err("-c/--ctx-size must be at least 4".into());
    }
    let text = std::fs::read_to_string(&a.file)
        .map_err(|e| format!("cannot read {}: {e}", a.file.display()))?;
    let attention = a.kv.choice()?;
    init_threads(a.threads)?;
    let engine = a.model.load_engine()?;
    let tok = &engine.tokenizer;
    let ids = tok.encode(&text, true, false);
    let available = ids.len() / a.ctx_size;
    let n_chunks = a.chunks.map_or(available, |c| c.min(available));
    if n_chunks == 0 {
        return Err(format!(
            "{} holds {} tokens: not enough for one chunk of {} (lower -c)",
            a.file.display(),
            ids.len(),
            a.ctx_size
        ));
    }
    let bos = if tok.adds_bos() { tok.bos() } else { None };
    let scored = match a.decode {
        Some(k) => format!("the last {k} tokens of each, one at a time (decode)"),
        None => "the second half of each".to_string(),
    };
    eprintln!(
        "perplexity: {} tokens, {n_chunks} chunks of {}, scoring {scored} with attention '{}'",
        ids.len(),
        a.ctx_size,
        attention.label()
    );
    let start = Instant::now();
    let mut ppl = Perplexity::default();
    let mut out = std::io::stdout().lock();
    let how = ChunkScoring {
        bos,
        batch: a.batch_size,
        kv: a.kv.options(),
        attention,
        decode: a.decode,
    };
    for (i, chunk) in ids.chunks_exact(a.ctx_size).take(n_chunks).enumerate() {
        let s = score_chunk(&engine.model, chunk, &how).map_err(|e| e.to_string())?;
        ppl.add(s);
        let _ = write!(out, "[{}]{:.4},", i + 1, ppl.value());
        let _ = out.flush();
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Final estimate: PPL = {:.4} +/- {:.5}",
        ppl.value(),
        ppl.std_error()
    );
    eprintln!(
        "scored {} tokens in {:.1} s",
        ppl.count,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
