//! Helpers shared by the CLI's test files.

use std::process::Output;

/// Exit code 1 and exactly one `error:` line, which is returned.
pub fn one_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "want exit 1: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "want one error line, got: {stderr}");
    errors[0].to_string()
}
