//! `sparrow eval attention` and `sparrow eval needle --heatmap` end to end on a synthetic
//! model: one clear error line for unknown policies, JSON with the measurements, and a
//! valid PNG of the announced size.

mod common;

use common::{one_error, sparrow};
use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use std::path::PathBuf;

fn dir() -> PathBuf {
    common::test_dir("eval-cli")
}

fn model() -> PathBuf {
    let p = dir().join("eval.gguf");
    if !p.exists() {
        let spec = SyntheticSpec {
            context_length: 1024,
            ..Default::default()
        };
        std::fs::write(&p, synthetic_gguf(&spec)).unwrap();
    }
    p
}

/// A few KB of sentences (the synthetic tokenizer is byte level: one token per byte).
fn text_file() -> PathBuf {
    let hay = dir().join("hay");
    std::fs::create_dir_all(&hay).unwrap();
    let p = hay.join("a.txt");
    let text: String = (0..200)
        .map(|i| format!("The river bend {i} was quiet. "))
        .collect();
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn unknown_policy_is_one_error_line_listing_the_valid_ones() {
    let (m, f) = (model(), text_file());
    let out = sparrow(&[
        "eval",
        "attention",
        "-m",
        m.to_str().unwrap(),
        "-f",
        f.to_str().unwrap(),
        "-c",
        "64",
        "--attn",
        "full,nosuch",
    ]);
    let error = one_error(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for name in [
        "'nosuch'",
        "full",
        "streaming",
        "quest",
        "xattention",
        "h2o",
        "ladder",
    ] {
        assert!(error.contains(name), "lacks {name}: {error}");
    }
}

#[test]
fn eval_attention_prints_a_table_and_writes_json() {
    let (m, f) = (model(), text_file());
    let json = dir().join("attn.json");
    let out = sparrow(&[
        "eval",
        "attention",
        "-m",
        m.to_str().unwrap(),
        "-f",
        f.to_str().unwrap(),
        "-c",
        "200",
        "-t",
        "1",
        "--attn",
        "full,streaming,xattention",
        "--attn-sinks",
        "4",
        "--attn-window",
        "16",
        "--per-layer",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("| full | decode (1 query) | 1.0000 | 1.0000 |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| streaming | decode (1 query) | 0.1000 | 0.1000 |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| xattention | prefill (last 64 rows) |"),
        "{stdout}"
    );
    assert!(stdout.contains("streaming per layer:"), "{stdout}");

    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["n_ctx"], 200);
    let policies = v["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 3);
    let full = &policies[0];
    assert_eq!(full["policy"], "full");
    assert_eq!(full["summary"]["mean_selectivity"], 1.0);
    let streaming = &policies[1];
    let layers = streaming["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    for head in layers[0]["heads"].as_array().unwrap() {
        assert_eq!(head["selectivity"], 0.1);
        assert!(head["mass"].as_f64().unwrap() < 1.0);
    }
    assert_eq!(policies[2]["phase"], "prefill");
    assert!(policies[2]["summary"]["mean_mass"].is_null());
}

#[test]
fn eval_needle_draws_a_png_heatmap() {
    let (m, f) = (model(), text_file());
    let png_path = dir().join("needle.png");
    let out = sparrow(&[
        "eval",
        "needle",
        "-m",
        m.to_str().unwrap(),
        "--haystack",
        f.parent().unwrap().to_str().unwrap(),
        "--lengths",
        "64,96,128",
        "--depths",
        "0,0.5",
        "-t",
        "1",
        "--attn",
        "streaming",
        "--heatmap",
        png_path.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let bytes = std::fs::read(&png_path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    // 3 lengths × 2 depths: 64 + 2 × 48 + 70 high; at least 480 wide (more for the title).
    assert_eq!(info.height, 230);
    assert!((480..1000).contains(&info.width), "{}", info.width);
    // Not a blank image: the cells are coloured.
    let coloured = buf
        .chunks_exact(3)
        .filter(|p| !(p[0] == p[1] && p[1] == p[2]))
        .count();
    assert!(coloured > 6 * 40 * 30, "only {coloured} coloured pixels");
}

/// The haystack of the real tests (RULER's vocabulary needs real prose).
fn books() -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/haystack/books");
    p.to_str().unwrap().to_string()
}

/// `eval ruler` end to end on a synthetic model (a byte-level tokenizer: one token per
/// byte): a progress line per case, a table per policy and per length, JSON of every
/// result, the plot; `--resume` runs only what the JSON lacks; a pair `A+B` is one choice.
#[test]
fn eval_ruler_tables_json_plot_and_resume() {
    let m = model();
    let (json, png) = (dir().join("ruler.json"), dir().join("ruler.png"));
    let _ = std::fs::remove_file(&json);
    let run = |tasks: &str| {
        sparrow(&[
            "eval",
            "ruler",
            "-m",
            m.to_str().unwrap(),
            "--haystack",
            &books(),
            "--lengths",
            "768,1024",
            "--tasks",
            tasks,
            "--cases",
            "1",
            "-t",
            "1",
            "--attn",
            "full,full+streaming",
            "--attn-window",
            "16",
            "--json",
            json.to_str().unwrap(),
            "--resume",
            "--plot",
            png.to_str().unwrap(),
        ])
    };
    let out = run("niah_single_1");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("[1/2] niah_single_1 768 #0 ("), "{stderr}");
    assert!(stderr.contains("): full "), "{stderr}");
    assert!(stdout.contains("RULER score (%): full\n"), "{stdout}");
    assert!(stdout.contains("RULER score (%): streaming\n"), "{stdout}");
    assert!(stdout.contains("| niah_single_1 |"), "{stdout}");
    assert!(stdout.contains("by task family at 1024 tokens"), "{stdout}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 4, "2 lengths × 2 policies");
    for r in results {
        assert_eq!(r["task"], "niah_single_1");
        assert!(r["prompt_tokens"].as_u64().unwrap() <= r["length"].as_u64().unwrap() - 128);
        let score = r["score"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&score));
    }
    assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    // Resumed with one more task: the first task's cases are skipped, the new one runs.
    let out = run("niah_single_1,niah_multikey_2");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("niah_single_1 768 #0: in the JSON already"),
        "{stderr}"
    );
    assert!(stderr.contains("niah_multikey_2 768 #0 ("), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["results"].as_array().unwrap().len(), 8);
}

#[test]
fn eval_ruler_refuses_bad_arguments_by_name() {
    let m = model();
    let m = m.to_str().unwrap();
    let books = books();
    for (args, needle) in [
        (&["--tasks", "qa_1"][..], "unknown RULER task 'qa_1'"),
        (&["--cases", "0"][..], "--cases must be at least 1"),
        (&["--lengths", "100"][..], "--lengths: 100 is too short"),
        (
            &["--read-share", "1.5"][..],
            "--read-share 1.5 is outside (0, 1]",
        ),
        (&["--attn", "full+nosuch"][..], "'nosuch'"),
    ] {
        let mut all = vec!["eval", "ruler", "-m", m, "--haystack", &books, "-t", "1"];
        all.extend_from_slice(args);
        let e = one_error(&sparrow(&all));
        assert!(e.contains(needle), "{args:?}: {e}");
    }
}
