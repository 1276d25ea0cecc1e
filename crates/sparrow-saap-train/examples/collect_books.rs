//! Record Saap training contexts from the books in a directory (a stand-in for `sparrow
//! saap collect`, for measuring the trainer on real activations).
//!
//! `cargo run --release -p sparrow-saap-train --example collect_books -- OUT_DIR [CONTEXTS]
//! [TOKENS]`; `SAAP_MODEL` (default: the default model in the sparrow cache) and
//! `SAAP_BOOKS` (default `/work/shared/data/training/books`) choose the inputs. Contexts
//! are taken round-robin from the books, the k-th from a book starting a third further
//! in (past the front matter), every 8th position from 1024 recorded.

use sparrow::Engine;
use sparrow_eval::attention::text_tokens;
use sparrow_eval::{collect_context, CollectSettings};
use std::path::PathBuf;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(
        args.next()
            .ok_or("usage: collect_books OUT_DIR [CONTEXTS] [TOKENS]")?,
    );
    let contexts: usize = args.next().map_or(Ok(6), |a| a.parse())?;
    let tokens: usize = args.next().map_or(Ok(8192), |a| a.parse())?;
    let model = std::env::var_os("SAAP_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/sparrow/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
        });
    let books = std::env::var_os("SAAP_BOOKS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/shared/data/training/books"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&books)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("no .txt books in {}", books.display()).into());
    }
    std::fs::create_dir_all(&out)?;
    let engine = Engine::load(&model)?;
    for k in 0..contexts {
        let file = &files[k % files.len()];
        let text = std::fs::read_to_string(file)?;
        let round = k / files.len();
        let mut at = text.len() / 10 + round * text.len() / 3;
        while !text.is_char_boundary(at) {
            at += 1;
        }
        let ids = text_tokens(&engine.tokenizer, &text[at..], tokens)?;
        let name = file
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let source = format!("{}@{at}", file.display());
        let start = Instant::now();
        let rec = collect_context(
            &engine.model,
            &ids,
            &CollectSettings::default(),
            source,
            |_, _| {},
        )?;
        let path = out.join(format!("{k:02}-{name}.saapc"));
        rec.save(&path)?;
        eprintln!(
            "{}: {} tokens, {} queries, {:.0} s",
            path.display(),
            ids.len(),
            rec.meta.query_positions.len(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
