//! What the fuzz targets share: the tokenizer they run against and a small model.
//!
//! The tokenizer is the real one of the model named by `SPARROW_FUZZ_MODEL` (default: the
//! Qwen2.5 GGUF in the sparrow model cache, which `scripts/fetch_models.py` puts there), so
//! encode/decode and the JSON grammar are fuzzed over a real 151K vocabulary with its
//! merges; without that file they fall back to the synthetic model's byte-level vocabulary
//! and say so once.

use sparrow::synthetic::{synthetic_gguf, synthetic_model, SyntheticSpec};
use sparrow::tokenizer::{Tokenizer, TokenizerSpec};
use sparrow::Model;
use sparrow_gguf::GgufFile;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The GGUF whose tokenizer the targets use, if it exists.
pub fn model_path() -> Option<PathBuf> {
    let path = match std::env::var_os("SPARROW_FUZZ_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME")?)
            .join(".cache/sparrow/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    };
    path.exists().then_some(path)
}

/// The tokenizer under test (built once per process).
pub fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let file = match model_path() {
            Some(p) => GgufFile::open(&p).expect("SPARROW_FUZZ_MODEL is a readable GGUF"),
            None => {
                eprintln!("sparrow-fuzz: no model file, using the synthetic byte-level tokenizer");
                GgufFile::from_bytes(synthetic_gguf(&SyntheticSpec::default())).unwrap()
            }
        };
        let spec = TokenizerSpec::from_gguf(&file).expect("the model's tokenizer metadata");
        Tokenizer::from_spec(spec).expect("the model's tokenizer")
    })
}

/// The synthetic model (two layers, f32, head size 32 so every KV cache type fits) prompt
/// caches are restored into.
pub fn small_model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let spec = SyntheticSpec {
            n_head: 2,
            n_head_kv: 1,
            ..Default::default()
        };
        synthetic_model(&spec).unwrap()
    })
}

/// Reads little-endian `u32`s from `bytes` (a trailing partial word is dropped).
pub fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

pub mod saap_files;
pub mod schema_check;
