//! Saap end to end through the binary, on a small synthetic model: `saap collect` records
//! contexts from a text folder, `saap train` makes an index from them (and one straight
//! from the text into the cache folder, where `--attn saap` finds it), `run --attn saap`
//! uses it — equal to `full` when every bucket is probed — and foreign, truncated or
//! missing indexes are refused with one error line naming the reason.

#![cfg(feature = "train")]

mod common;

use common::one_error;
use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparrow-saap-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn model(name: &str, seed: u64) -> PathBuf {
    let p = dir().join(name);
    let spec = SyntheticSpec {
        context_length: 4096,
        seed,
        ..Default::default()
    };
    std::fs::write(&p, synthetic_gguf(&spec)).unwrap();
    p
}

fn sparrow(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .env("SPARROW_MODELS", "/nonexistent-models-dir")
        .env("SPARROW_SAAP_DIR", cache)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed: {e}");
    assert!(!e.contains("panicked"), "{e}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Text whose bytes (the synthetic model's tokens) vary.
fn text(seed: u32, n: usize) -> String {
    let words = [
        "alpha", "river", "stone", "lantern", "quiet", "north", "ember", "salt",
    ];
    (0..n)
        .map(|i| words[((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 7) as usize % 8])
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn collect_train_run_and_refusals() {
    let d = dir();
    let m = model("saap.gguf", 1);
    let m = m.to_str().unwrap();
    let texts = d.join("texts");
    std::fs::create_dir_all(&texts).unwrap();
    std::fs::write(texts.join("a.txt"), text(1, 400)).unwrap();
    std::fs::write(texts.join("b.txt"), text(2, 400)).unwrap();
    let cache = d.join("cache");
    let recs = d.join("recs");
    let text_flags = [
        "-c",
        "700",
        "--contexts",
        "3",
        "--first-query",
        "100",
        "--query-stride",
        "3",
    ];
    let mut collect = vec![
        "saap",
        "collect",
        "-m",
        m,
        "--text",
        texts.to_str().unwrap(),
    ];
    collect.extend(text_flags);
    collect.extend(["--out", recs.to_str().unwrap(), "-t", "1"]);
    ok(&sparrow(&collect, &cache));
    let files: Vec<_> = std::fs::read_dir(&recs).unwrap().collect();
    assert_eq!(files.len(), 3);

    let train_flags = [
        "--clusters",
        "8",
        "--hidden",
        "8",
        "--steps",
        "20",
        "--batch",
        "16",
        "--min-distance",
        "64",
        "--probes",
        "1,2",
        "-t",
        "1",
    ];
    let idx = d.join("idx.saap");
    let mut train = vec![
        "saap",
        "train",
        "-m",
        m,
        "--records",
        recs.to_str().unwrap(),
    ];
    train.extend(["--out", idx.to_str().unwrap()]);
    train.extend(train_flags);
    let report = ok(&sparrow(&train, &cache));
    assert!(
        report.contains("Q-model") && report.contains("oracle"),
        "{report}"
    );
    assert!(idx.exists());

    // Probing all 8 buckets reads everything: the same tokens as exact attention, past the
    // 1 + 63 dense part.
    let prompt = text(3, 60);
    let run = |attn: &[&str]| {
        let mut a = vec![
            "run",
            "-m",
            m,
            "-p",
            prompt.as_str(),
            "-n",
            "12",
            "--temp",
            "0",
        ];
        a.extend(["-c", "1024", "--no-display-prompt", "-t", "1"]);
        a.extend(attn);
        ok(&sparrow(&a, &cache))
    };
    let idx_s = idx.to_str().unwrap();
    let full = run(&["--attn", "full"]);
    let probed = |policy: &str, router: &[&str], probes: &str| {
        let mut a = vec![
            "--attn",
            policy,
            "--saap-index",
            idx_s,
            "--saap-probes",
            probes,
        ];
        a.extend(router);
        run(&a)
    };
    let hedged = ["--saap-router", "hedged"];
    // Every bucket probed (the index has 8) is full attention, to the bit.
    assert_eq!(probed("saap", &hedged, "8"), full);
    assert_eq!(probed("kmeans", &[], "8"), full);
    probed("saap", &hedged, "1");
    // The default cells router reads a budget, not whole buckets: probes are refused.
    let e = one_error(&sparrow(
        &[
            "run",
            "-m",
            m,
            "-p",
            "x",
            "-n",
            "1",
            "--attn",
            "saap",
            "--saap-index",
            idx_s,
            "--saap-probes",
            "1",
        ],
        &cache,
    ));
    assert!(e.contains("--saap-router"), "{e}");

    // No index in the cache yet: refused, saying how to make one.
    let e = one_error(&sparrow(
        &["run", "-m", m, "-p", "x", "-n", "1", "--attn", "saap"],
        &cache,
    ));
    assert!(e.contains("sparrow saap train"), "{e}");
    // Trained straight from the text into the cache: now found there.
    let mut train = vec!["saap", "train", "-m", m, "--text", texts.to_str().unwrap()];
    train.extend(text_flags);
    train.extend(train_flags);
    ok(&sparrow(&train, &cache));
    ok(&sparrow(
        &["run", "-m", m, "-p", "x", "-n", "1", "--attn", "saap"],
        &cache,
    ));

    // `bench` runs Saap on the store a run makes for it, its layers kept in bucket order
    // (the fill's blocks placed as they seal, with a streaming fill too), and every other
    // policy on one kept by position.
    for fill in ["full", "streaming"] {
        let out = ok(&sparrow(
            &[
                "bench",
                "-m",
                m,
                "-p",
                "0",
                "-n",
                "3",
                "-d",
                "300",
                "-r",
                "2",
                "-t",
                "1",
                "--attn",
                "quest,saap,full",
                "--fill-attn",
                fill,
                "--json",
            ],
            &cache,
        ));
        let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
        let rows = rows.as_array().unwrap();
        let binned = |attn: &str| {
            let row = rows
                .iter()
                .find(|r| r["attention"].as_str().unwrap().starts_with(attn))
                .unwrap_or_else(|| panic!("no {attn} row in {out}"));
            assert_eq!(row["samples_ns"].as_array().unwrap().len(), 2, "{row}");
            row["kv_layers_in_bins"].as_u64().unwrap()
        };
        let sparse_layers = sparrow::synthetic::synthetic_config(&SyntheticSpec::default())
            .unwrap()
            .n_layer as u64
            - 1;
        assert_eq!(binned("saap"), sparse_layers, "fill {fill}: {out}");
        assert_eq!(binned("quest"), 0, "{out}");
        assert_eq!(binned("full"), 0, "{out}");
    }

    // Another model's index, a truncated one, a record passed as an index.
    let refused = |model: &str, index: &Path| {
        let args = [
            "run",
            "-m",
            model,
            "-p",
            "x",
            "-n",
            "1",
            "--attn",
            "saap",
            "--saap-index",
        ];
        let mut args = args.to_vec();
        args.push(index.to_str().unwrap());
        one_error(&sparrow(&args, &cache))
    };
    let other = model("other.gguf", 2);
    let e = refused(other.to_str().unwrap(), &idx);
    assert!(e.contains("different model"), "{e}");
    let bytes = std::fs::read(&idx).unwrap();
    let cut = d.join("cut.saap");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = refused(m, &cut);
    assert!(e.contains("truncated or corrupted"), "{e}");
    let rec = std::fs::read_dir(&recs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let e = refused(m, &rec);
    assert!(e.contains("not a Saap index"), "{e}");
}
