//! Hostile model files: each crafted GGUF must end `sparrow run --chat` and `sparrow serve`
//! with one `error:` line naming what is wrong and a non-zero exit, within a few seconds,
//! under an address-space limit the test sets — never an abort, a hang or the OOM killer.
//!
//! The chat-template bombs grow one value past any memory (doubling through `~`, `+` on
//! lists, `join`, `replace`, repetition); the metadata ones claim absurd sizes; the
//! truncated one ends inside its tensor data.

mod common;

use common::{one_failure_line, test_file};
use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use sparrow_gguf::Value;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The address space each child may use: a few hundred MiB of threads' stacks and malloc
/// arenas plus the 64 MiB template cap, far below what any bomb here would need (4 GiB and
/// up).
const ADDRESS_SPACE: u64 = 1 << 30;

/// Every command must be done within this.
const DEADLINE: Duration = Duration::from_secs(5);

/// `sparrow ARGS` under [`ADDRESS_SPACE`], killed past a generous timeout.
fn limited(args: &[&str]) -> (Output, Duration) {
    // The shell sets the limit and becomes `sparrow` (`exec`), so the limit is the child's.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -v {} && exec \"$0\" \"$@\"",
            ADDRESS_SPACE >> 10
        ))
        .arg(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .env("SPARROW_MODELS", "/nonexistent-models-dir")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    (out, start.elapsed())
}

/// A synthetic model whose metadata has `overrides`.
fn model_with(tag: &str, overrides: Vec<(String, Value)>) -> std::path::PathBuf {
    let spec = SyntheticSpec {
        overrides,
        ..Default::default()
    };
    test_file("hostile", &format!("{tag}.gguf"), &synthetic_gguf(&spec))
}

/// A synthetic model carrying `template` as its chat template.
fn with_template(tag: &str, template: &str) -> std::path::PathBuf {
    model_with(
        tag,
        vec![(
            "tokenizer.chat_template".into(),
            Value::String(template.into()),
        )],
    )
}

/// `run --chat` and `serve` on `model`: each fails with one error line containing every
/// one of `wants`, in time, without a signal.
fn refused_everywhere(what: &str, model: &std::path::Path, wants: &[&str]) {
    let m = model.to_str().unwrap();
    let commands: [&[&str]; 2] = [
        &["run", "-m", m, "--chat", "-p", "hi", "-n", "2", "-t", "1"],
        &["serve", "-m", m, "--port", "0", "-t", "1"],
    ];
    for args in commands {
        let (out, took) = limited(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code().is_some(),
            "{what}: {} ended by a signal: {stderr}",
            args[0]
        );
        let line = one_failure_line(&out);
        for want in wants {
            assert!(line.contains(want), "{what}: {}: {line}", args[0]);
        }
        assert!(took < DEADLINE, "{what}: {} took {took:?}", args[0]);
    }
}

/// The issue's template (a string doubled 40 times) and its variants.
#[test]
fn template_bombs_are_refused_with_the_memory_limit() {
    let bombs = [
        (
            "doubled",
            r#"{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"#,
        ),
        (
            "list",
            r#"{% set ns = namespace(l=["xxxxxxxx"]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|join }}"#,
        ),
        (
            "join",
            r#"{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}{% set ns.s = [ns.s, ns.s]|join %}{% endfor %}{{ ns.s }}"#,
        ),
        (
            "replace",
            r#"{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}{% set ns.s = ns.s|replace("x", "xxxx") %}{% endfor %}{{ ns.s }}"#,
        ),
        ("repeat", r#"{% set s = "x" * 99999999 %}{{ s|length }}"#),
        (
            "folded",
            r#"{{ ("x" * 99999999 ~ "x" * 99999999)|length }}"#,
        ),
        (
            "macro",
            r#"{% macro twice(s) %}{{ s }}{{ s }}{% endmacro %}{% set ns = namespace(s="xxxxxxxx") %}{% for i in range(40) %}{% set ns.s = twice(ns.s) %}{% endfor %}{{ ns.s|length }}"#,
        ),
    ];
    for (tag, template) in bombs {
        let m = with_template(&format!("bomb-{tag}"), template);
        refused_everywhere(tag, &m, &["chat template", "memory limit of", "bytes"]);
    }
    // Past minijinja's own cap on repetition: its limit is named.
    let m = with_template("bomb-repeat-1e9", r#"{{ "x" * 10**9 }}"#);
    refused_everywhere("x * 10**9", &m, &["limit of 100000000 bytes"]);
}

#[test]
fn absurd_metadata_is_refused_with_the_number() {
    let cases: [(&str, &str, Value, &str); 4] = [
        (
            "vocab",
            "qwen2.vocab_size",
            Value::U32(1 << 30),
            "1073741824",
        ),
        (
            "layers",
            "qwen2.block_count",
            Value::U32(1_000_000),
            "1000000",
        ),
        (
            "width",
            "qwen2.embedding_length",
            Value::U64(1 << 40),
            "1099511627776",
        ),
        (
            "heads",
            "qwen2.attention.head_count",
            Value::U32(u32::MAX),
            "4294967295",
        ),
    ];
    for (tag, key, value, want) in cases {
        let m = model_with(&format!("meta-{tag}"), vec![(key.into(), value)]);
        refused_everywhere(tag, &m, &[want]);
    }
}

/// A token array that claims 2^40 entries in a file of a few hundred KiB.
#[test]
fn huge_array_length_is_refused_before_allocating() {
    let mut bytes = synthetic_gguf(&SyntheticSpec::default());
    let key = b"tokenizer.ggml.tokens";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // The value type (array = 9), the element type (string = 8), then the count.
    assert_eq!(&bytes[at..at + 8], &[9, 0, 0, 0, 8, 0, 0, 0]);
    bytes[at + 8..at + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let m = test_file("hostile", "array-length.gguf", &bytes);
    refused_everywhere("array length", &m, &["1099511627776"]);
}

/// A file cut inside its tensor data, and one cut inside its header.
#[test]
fn truncated_files_are_refused() {
    let bytes = synthetic_gguf(&SyntheticSpec::default());
    for (tag, len) in [("tensors", bytes.len() - 1000), ("header", 200)] {
        let m = test_file("hostile", &format!("truncated-{tag}.gguf"), &bytes[..len]);
        refused_everywhere(tag, &m, &[]);
    }
}
