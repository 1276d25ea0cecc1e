//! Train an index on recorded contexts and print the time per head and the held-out
//! evaluation: the measurement C, the hidden width and the step count are chosen by.
//!
//! `SAAP_RECORDS=DIR cargo run --release -p sparrow-saap-train --example train_records`.
//! `SAAP_MODEL` names the model (default: the default model in the sparrow cache);
//! `SAAP_CLUSTERS`, `SAAP_HIDDEN`, `SAAP_STEPS`, `SAAP_BATCH`, `SAAP_LR`, `SAAP_POINTS`,
//! `SAAP_THREADS`, `SAAP_SPHERICAL=1`, `SAAP_MIN_DISTANCE` override the defaults;
//! `SAAP_EVAL_MIN_DISTANCE` evaluates other queries than those trained on;
//! `SAAP_OUT=FILE` saves the index; `SAAP_LAYERS=1` prints the per-layer table too.

use sparrow_saap_train::{evaluate, load_records, train, EvalSettings, Progress, TrainSettings};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Instant;

fn env<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::var_os("SAAP_RECORDS").ok_or("set SAAP_RECORDS=DIR")?);
    let model = std::env::var_os("SAAP_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/sparrow/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
        });
    let config = sparrow::Model::load(&model)?.config;
    let t0 = Instant::now();
    let records = load_records(&dir)?;
    eprintln!(
        "{} records loaded in {:.1} s",
        records.len(),
        t0.elapsed().as_secs_f64()
    );
    let d = TrainSettings::default();
    let s = TrainSettings {
        clusters: env("SAAP_CLUSTERS", d.clusters),
        hidden: env("SAAP_HIDDEN", d.hidden),
        steps: env("SAAP_STEPS", d.steps),
        batch: env("SAAP_BATCH", d.batch),
        learning_rate: env("SAAP_LR", d.learning_rate),
        points_per_centroid: env("SAAP_POINTS", d.points_per_centroid),
        threads: env("SAAP_THREADS", d.threads),
        spherical: env("SAAP_SPHERICAL", 0u8) == 1,
        min_distance: env("SAAP_MIN_DISTANCE", d.min_distance),
        ..d
    };
    eprintln!("{s:?}");
    let index = train(&records, &config, &s, &mut |p| {
        if let Progress::Done { head, summary: m } = p {
            eprintln!(
                "head {:2}/{} (layer {:2}, kv {}): k-means {:.2} s, targets {:.2} s, Q-model {:.2} s; {} of {} queries at ≥ {} tokens, KL train {:.3} held-out {:.3}",
                head.index + 1,
                head.total,
                head.layer,
                head.kv_head,
                m.kmeans_seconds,
                m.targets_seconds,
                m.qmodel_seconds,
                m.examples,
                m.candidates,
                m.min_distance,
                m.train_kl,
                m.held_out_kl.unwrap_or(f64::NAN)
            );
        }
    })?;
    let n = index.heads.len() as f64;
    eprintln!(
        "trained in {:.1} s ({:.2} s per head, wall)",
        index.meta.training.seconds,
        index.meta.training.seconds / n
    );
    if let Some(out) = std::env::var_os("SAAP_OUT") {
        index.save(&PathBuf::from(out))?;
    }
    let t0 = Instant::now();
    let probes = [1, 2, 4, 8, 16, 32];
    let mut eval = EvalSettings::held_out(&s);
    eval.min_distance = env("SAAP_EVAL_MIN_DISTANCE", eval.min_distance);
    let report = evaluate(&index, &records, &probes, &eval)?;
    eprintln!("evaluated in {:.1} s", t0.elapsed().as_secs_f64());
    println!("{report}");
    if env("SAAP_LAYERS", 0u8) == 1 {
        println!("per layer, ℓ = 8: mass Q-model / centroids / oracle");
        for l in &report.layers {
            let p = &l.probes[3];
            println!(
                "layer {:2}: {:5} pairs  {:.3} / {:.3} / {:.3}",
                l.layer, l.examples, p.qmodel_mass, p.centroid_mass, p.oracle_mass
            );
        }
    }
    Ok(())
}
