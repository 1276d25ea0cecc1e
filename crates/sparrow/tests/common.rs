//! Shared helpers for tests that need the real models (fetched by scripts/fetch_models.py).
#![allow(dead_code)]

use std::path::PathBuf;

pub fn models_dir() -> PathBuf {
    if let Ok(d) = std::env::var("SPARROW_MODELS") {
        return d.into();
    }
    let home = std::env::var("HOME").expect("HOME is set");
    PathBuf::from(home).join(".cache/sparrow/models")
}

/// The Qwen2.5 GGUF; a missing model is a failure (CI must fetch it), not a skip.
pub fn qwen_path() -> PathBuf {
    let p = models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        p.exists(),
        "{} is missing: run `python3 scripts/fetch_models.py qwen`",
        p.display()
    );
    p
}

pub fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}
