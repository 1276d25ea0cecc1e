//! The KV cache and attention flag group (`KvArgs`) on every command: `sparrow chat` runs
//! the chosen policy (its replies equal `sparrow run`'s with the same flags, also on a later
//! turn that reuses the cached prefix), every command refuses a bad policy name or setting
//! with one `error:` line, and llama.cpp's `-ctk`/`-ctv` spellings work.

mod common;

use common::one_error;
use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use sparrow_gguf::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// ChatML, the template the synthetic models are given (they have none of their own).
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparrow-attn-flags-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A synthetic model with a chat template, so `sparrow chat` takes it.
fn chat_model(name: &str, spec: SyntheticSpec) -> PathBuf {
    let p = dir().join(name);
    let mut spec = spec;
    spec.overrides.push((
        "tokenizer.chat_template".into(),
        Value::String(CHATML.into()),
    ));
    std::fs::write(&p, synthetic_gguf(&spec)).unwrap();
    p
}

/// The model most tests share, written once (rewriting a file other tests have mapped
/// would pull it from under them).
fn long_context_model() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        chat_model(
            "chat.gguf",
            SyntheticSpec {
                context_length: 4096,
                ..Default::default()
            },
        )
    })
    .clone()
}

fn sparrow(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .env("SPARROW_MODELS", "/nonexistent-models-dir")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that fails at startup never reads its input: a broken pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn ok(out: &Output) -> (String, String) {
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "failed: {e}");
    assert!(!e.contains("panicked"), "{e}");
    (o, e)
}

/// A user message of about 650 tokens (the synthetic tokenizer is byte-level), so a Quest
/// budget of 32 tokens reads a small part of the context. No surrounding whitespace:
/// `sparrow chat` trims its input lines.
fn long_message() -> String {
    let s: String = (0..40)
        .map(|i| format!("line {i} of the long message; "))
        .collect();
    s.trim_end().to_string()
}

const GREEDY: &[&str] = &["-n", "12", "-t", "1", "--temp", "0"];

/// The replies of a `sparrow chat` session fed `messages` (one per line), in order.
fn chat(model: &Path, messages: &[&str], extra: &[&str]) -> (Vec<String>, String) {
    let mut args = vec!["chat", "-m", model.to_str().unwrap()];
    args.extend_from_slice(GREEDY);
    args.extend_from_slice(extra);
    let input: String = messages.iter().map(|m| format!("{m}\n")).collect();
    let (out, err) = ok(&sparrow(&args, &format!("{input}/exit\n")));
    // Each turn prints "> ", the reply and a newline; the last "> " meets /exit.
    let replies: Vec<String> = out
        .strip_prefix("> ")
        .and_then(|o| o.strip_suffix("\n> "))
        .unwrap_or_else(|| panic!("{out:?}"))
        .split("\n> ")
        .map(str::to_string)
        .collect();
    assert_eq!(replies.len(), messages.len(), "{out:?}");
    (replies, err)
}

/// `sparrow run` on the raw prompt text in `file` (the chat template already applied).
fn run_file(model: &Path, file: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "run",
        "-m",
        model.to_str().unwrap(),
        "-f",
        file.to_str().unwrap(),
        "-b",
        "256",
        "--no-display-prompt",
    ];
    args.extend_from_slice(GREEDY);
    args.extend_from_slice(extra);
    let (out, _) = ok(&sparrow(&args, ""));
    out.strip_suffix('\n').unwrap().to_string()
}

fn chatml(turns: &[(&str, &str)]) -> String {
    let mut s: String = turns
        .iter()
        .map(|(role, content)| format!("<|im_start|>{role}\n{content}<|im_end|>\n"))
        .collect();
    s.push_str("<|im_start|>assistant\n");
    s
}

#[test]
fn chat_runs_the_chosen_policy_on_every_turn() {
    let m = long_context_model();
    let first = long_message();
    let second = "and one more question about line 7";
    let quest: &[&str] = &[
        "--attn",
        "quest",
        "--quest-budget",
        "32",
        "--kv-block",
        "16",
        "--dense-layers",
        "",
    ];
    let streaming: &[&str] = &[
        "--attn",
        "streaming",
        "--attn-sinks",
        "4",
        "--attn-window",
        "48",
    ];
    let quest_covering: &[&str] = &["--attn", "quest", "--quest-budget", "4096"];
    let full: &[&str] = &["--attn", "full"];

    let prompt1 = dir().join("turn1.txt");
    std::fs::write(&prompt1, chatml(&[("user", &first)])).unwrap();
    let run_full = run_file(&m, &prompt1, full);
    for policy in [quest, streaming, quest_covering] {
        let (replies, err) = chat(&m, &[&first, second], policy);
        assert!(
            err.contains(&format!("attention {}", policy[1])),
            "the startup line names the policy: {err}"
        );
        // Turn 1 equals `sparrow run` with the same flags on the same prompt.
        assert_eq!(replies[0], run_file(&m, &prompt1, policy), "{policy:?}");
        // Turn 2 keeps the first turn's cache and rewinds the policy to the shared prefix
        // (`State::truncate`): it equals a fresh run over the whole conversation.
        let prompt2 = dir().join(format!("turn2-{}.txt", policy[1..].join("_")));
        std::fs::write(
            &prompt2,
            chatml(&[
                ("user", &first),
                ("assistant", &replies[0]),
                ("user", second),
            ]),
        )
        .unwrap();
        assert_eq!(replies[1], run_file(&m, &prompt2, policy), "{policy:?}");
        if policy == quest_covering {
            // A budget covering the context is exact attention.
            assert_eq!(replies[0], run_full, "{policy:?}");
        } else {
            // The policy is really in use: reading 32 or 52 of ~700 positions changes the
            // greedy reply of this model.
            assert_ne!(
                replies[0], run_full,
                "{policy:?} answered as full attention"
            );
        }
    }
}

#[test]
fn chat_refuses_bad_policies_with_one_error_line() {
    let m = long_context_model();
    let m = m.to_str().unwrap();
    for (flags, needle) in [
        (&["--attn", "nope"][..], "unknown attention policy 'nope'"),
        (
            &["--attn-decode", "xattention"][..],
            "does not support decode",
        ),
        (
            &["--attn", "quest", "--quest-budget", "8"][..],
            "quest budget 8",
        ),
        (&["--attn", "h2o", "--h2o-heavy", "1.5"][..], "h2o heavy"),
        (&["--dense-layers", "x"][..], "--dense-layers"),
    ] {
        let mut args = vec!["chat", "-m", m, "-t", "1"];
        args.extend_from_slice(flags);
        // The session would answer this line if the flags were accepted.
        let e = one_error(&sparrow(&args, "hello\n/exit\n"));
        assert!(e.contains(needle), "{flags:?}: {e}");
    }
}

#[test]
fn every_command_refuses_a_bad_policy() {
    let m = long_context_model();
    let m = m.to_str().unwrap();
    let text = dir().join("text.txt");
    std::fs::write(&text, long_message()).unwrap();
    let text = text.to_str().unwrap();
    let haystack = dir().to_str().unwrap().to_string();
    let commands: [&[&str]; 8] = [
        &["run", "-p", "hi"],
        &["chat"],
        &["serve", "--port", "0"],
        &["bench"],
        &["perplexity", "-f", text],
        &["eval", "needle", "--haystack", &haystack],
        &["eval", "ruler", "--haystack", &haystack],
        &["eval", "attention", "-f", text],
    ];
    for cmd in commands {
        for (flags, needle) in [
            (&["--attn", "sparse-magic"][..], "'sparse-magic'"),
            (&["--attn", "streaming", "--attn-window", "0"][..], "window"),
            (&["--attn", "quest", "--kv-block", "0"][..], "block size 0"),
        ] {
            let mut args = cmd.to_vec();
            args.extend(["-m", m, "-t", "1"]);
            args.extend_from_slice(flags);
            let e = one_error(&sparrow(&args, ""));
            assert!(e.contains(needle), "{cmd:?} {flags:?}: {e}");
        }
    }
}

#[test]
fn llama_cpp_single_dash_cache_type_flags() {
    // Heads of 32 values, so q8_0 caches are possible.
    let m = chat_model(
        "heads32.gguf",
        SyntheticSpec {
            n_embd: 128,
            n_ff: 160,
            ..Default::default()
        },
    );
    let m = m.to_str().unwrap();
    let (_, err) = ok(&sparrow(
        &[
            "run", "-m", m, "-p", "hello", "-n", "2", "-t", "1", "-ctk", "q8_0", "-ctv", "f32",
        ],
        "",
    ));
    assert!(err.contains("KV cache: q8_0/f32"), "{err}");
    let (replies, err) = chat(
        Path::new(m),
        &["hello"],
        &[
            "-c",
            "256",
            "-ctk=q8_0",
            "--cache-type-v",
            "q8_0",
            "--attn",
            "streaming",
        ],
    );
    assert!(
        err.contains("KV cache q8_0/q8_0, attention streaming"),
        "{err}"
    );
    assert_eq!(replies.len(), 1);
}
