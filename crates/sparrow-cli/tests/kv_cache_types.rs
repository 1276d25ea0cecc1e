//! `--cache-type-k` / `--cache-type-v` on every command that has them: unknown types are
//! refused with one error line listing the valid ones; q8_0 on a model whose heads are not
//! whole 32-value blocks is a clear error (not a panic); mixed f16/q8_0 runs and `sparrow
//! run` reports the cache's bytes per token.

mod common;

use common::{one_failure_line as one_error, sparrow};
use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use std::path::PathBuf;

fn model(name: &str, spec: SyntheticSpec) -> PathBuf {
    common::test_file("kv-types", name, &synthetic_gguf(&spec))
}

#[test]
fn unknown_cache_types_are_refused_on_every_command() {
    let m = model("plain.gguf", SyntheticSpec::default());
    let m = m.to_str().unwrap();
    let commands: [&[&str]; 8] = [
        &["run", "-p", "hi"],
        &["bench"],
        &["perplexity", "-f", "/nonexistent.txt"],
        &["eval", "needle"],
        &["eval", "ruler"],
        &["eval", "attention"],
        &["chat"],
        &["serve"],
    ];
    for cmd in commands {
        for flag in ["--cache-type-k", "--cache-type-v", "--ctk", "--ctv"] {
            let mut args = cmd.to_vec();
            args.extend(["-m", m, flag, "q4_0"]);
            let e = one_error(&sparrow(&args));
            assert!(
                e.contains("q4_0") && e.contains("f16, f32, q8_0"),
                "{cmd:?} {flag}: {e}"
            );
        }
    }
}

#[test]
fn q8_0_needs_heads_of_whole_blocks() {
    // The default synthetic model has heads of 16.
    let m = model("small-heads.gguf", SyntheticSpec::default());
    for flag in ["--cache-type-k", "--cache-type-v"] {
        let out = sparrow(&[
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "hi",
            "-n",
            "2",
            "-t",
            "1",
            flag,
            "q8_0",
        ]);
        let e = one_error(&out);
        assert!(e.contains("q8_0") && e.contains("16"), "{e}");
    }
}

#[test]
fn mixed_cache_types_run_and_report_bytes_per_token() {
    // Heads of 32: n_embd 128, 4 heads, 2 kv heads → kv_dim 64, 2 layers.
    let m = model(
        "heads32.gguf",
        SyntheticSpec {
            n_embd: 128,
            n_ff: 160,
            ..Default::default()
        },
    );
    // Per layer: keys f16 64 × 2 = 128 bytes, values q8_0 2 blocks × 34 = 68 bytes.
    for (k, v, want) in [
        ("f16", "q8_0", "KV cache: f16/q8_0, 392 bytes per token"),
        ("q8_0", "q8_0", "KV cache: q8_0/q8_0, 272 bytes per token"),
        ("f32", "f16", "KV cache: f32/f16, 768 bytes per token"),
    ] {
        let out = sparrow(&[
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "hello there",
            "-n",
            "4",
            "-t",
            "1",
            "--temp",
            "0",
            "--ignore-eos",
            "--ctk",
            k,
            "--cache-type-v",
            v,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{k}/{v}: {stderr}");
        assert!(stderr.contains(want), "{k}/{v}: {stderr}");
    }
}
