//! Helpers shared by the CLI's test files.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the `sparrow` binary with `args`, with no models folder (so nothing is fetched).
pub fn sparrow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .env("SPARROW_MODELS", "/nonexistent-models-dir")
        .output()
        .unwrap()
}

/// A folder of this test process's own, named by `tag`.
pub fn test_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparrow-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `bytes` written to `name` in `test_dir(tag)`.
pub fn test_file(tag: &str, name: &str, bytes: &[u8]) -> PathBuf {
    let p = test_dir(tag).join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Exit code 1 and exactly one `error:` line, which is returned.
pub fn one_error(out: &Output) -> String {
    let line = one_failure_line(out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "want exit 1: {stderr}");
    line
}

/// A failure (any non-zero exit: clap's usage errors exit 2) with exactly one `error:` line
/// and no panic; the line is returned.
pub fn one_failure_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "want one error line, got: {stderr}");
    errors[0].to_string()
}
