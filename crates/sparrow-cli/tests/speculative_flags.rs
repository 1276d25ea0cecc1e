//! The speculative-decoding flags of `sparrow run` on synthetic models: `--lookup` and
//! `--draft-model`/`-md` print what plain decoding prints and report their counts; a draft
//! with another vocabulary, bad settings and a policy that cannot rewind are refused with
//! one `error:` line naming the problem.

use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use sparrow_gguf::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparrow-spec-flags-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn model(name: &str, spec: SyntheticSpec) -> PathBuf {
    let p = dir().join(name);
    std::fs::write(&p, synthetic_gguf(&spec)).unwrap();
    p
}

fn seeded(seed: u64) -> SyntheticSpec {
    SyntheticSpec {
        seed,
        ..Default::default()
    }
}

fn run(model: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(["run", "-m", model.to_str().unwrap()])
        .args([
            "-p",
            "abcabcabcabc the same words, the same words, the same",
        ])
        .args(["-n", "24", "-t", "1", "--no-display-prompt", "--ignore-eos"])
        .args(extra)
        .output()
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{e}");
    (String::from_utf8_lossy(&o.stdout).into_owned(), e)
}

/// The one `error:` line of a failed run.
fn error(o: &Output) -> String {
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    let lines: Vec<&str> = e.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{e}");
    lines[0].to_string()
}

#[test]
fn drafts_change_nothing_but_the_speed() {
    let m = model("target.gguf", seeded(1));
    let d = model("draft.gguf", seeded(2));
    for sampling in [&["--temp", "0"][..], &["--temp", "0.9", "-s", "5"][..]] {
        let (plain, _) = text(&run(&m, sampling));
        let d_arg = d.to_str().unwrap();
        for flags in [
            vec!["--lookup", "2"],
            vec!["--draft-model", d_arg, "--draft-max", "4"],
            vec!["-md", d_arg, "--draft-p-min", "0"],
            vec!["--lookup", "3", "--attn", "quest", "--quest-budget", "16"],
        ] {
            let mut args = sampling.to_vec();
            args.extend(&flags);
            let (out, err) = text(&run(&m, &args));
            if flags.contains(&"quest") {
                // Quest plainly, for the comparison.
                let mut plain_args = sampling.to_vec();
                plain_args.extend(["--attn", "quest", "--quest-budget", "16"]);
                assert_eq!(out, text(&run(&m, &plain_args)).0, "{flags:?}");
            } else {
                assert_eq!(out, plain, "{flags:?}");
            }
            assert!(
                err.contains("speculation:") && err.contains("tokens per pass"),
                "{err}"
            );
        }
    }
}

#[test]
fn bad_drafts_are_refused_by_name() {
    let m = model("target2.gguf", seeded(1));
    let mut other = seeded(2);
    let tokens: Vec<Value> = (0..257u32)
        .map(|i| {
            let s = if i == 100 {
                "<other>".to_string()
            } else if i < 256 {
                // The byte tokenizer's spelling of byte i, as the synthetic model has it.
                sparrow::synthetic::byte_tokenizer(&[])
                    .token_text(i)
                    .unwrap()
                    .to_string()
            } else {
                "<|endoftext|>".to_string()
            };
            Value::String(s)
        })
        .collect();
    other
        .overrides
        .push(("tokenizer.ggml.tokens".into(), Value::Array(tokens)));
    let d = model("other-vocab.gguf", other);
    let e = error(&run(&m, &["--draft-model", d.to_str().unwrap()]));
    assert!(e.contains("token 100") && e.contains("<other>"), "{e}");
    let e = error(&run(&m, &["--lookup", "2", "--draft-max", "0"]));
    assert!(e.contains("--draft-max"), "{e}");
    let e = error(&run(
        &m,
        &["--lookup", "2", "--draft-min", "9", "--draft-max", "4"],
    ));
    assert!(e.contains("--draft-min 9"), "{e}");
    let e = error(&run(&m, &["--lookup", "0"]));
    assert!(e.contains("--lookup"), "{e}");
    let e = error(&run(&m, &["--lookup", "2", "--attn", "h2o"]));
    assert!(e.contains("'h2o'") && e.contains("rewind"), "{e}");
    let e = error(&run(&m, &["--draft-model", "/nonexistent/draft.gguf"]));
    assert!(e.contains("draft model /nonexistent/draft.gguf"), "{e}");
}
