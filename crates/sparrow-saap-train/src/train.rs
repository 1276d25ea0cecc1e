//! The training driver: every (layer, KV head) trained independently, several at once
//! (the Q-model's optimisation is a chain of small tensor operations that one core runs
//! about as fast as two, so heads, not operations, are what parallelise), each through
//! k-means, targets and the Q-model.

use crate::kmeans::{self, KMeansSettings};
use crate::qmodel::{self, Examples, QModelSettings};
use crate::split::is_held_out;
use crate::targets::group_targets;
use crate::{check_records, HeadId, HeadSummary, Phase, Progress, TrainError, TrainSettings};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sparrow::saap::{ContextRecord, HeadModel, IndexMeta, SaapIndex, TrainingInfo};
use sparrow::ModelConfig;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Instant;

/// Train an index for `model` on `records` (all recorded from `model`), reporting
/// through `progress`. Fails on records of another model or shape, on settings out of
/// range, and on a head with too few keys or long-range queries.
pub fn train(
    records: &[ContextRecord],
    model: &ModelConfig,
    settings: &TrainSettings,
    progress: &mut dyn FnMut(Progress),
) -> Result<SaapIndex, TrainError> {
    let start = Instant::now();
    settings.validate()?;
    check_records(records, model)?;
    let total = model.n_layer * model.n_head_kv;
    let threads = match settings.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(total);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<HeadModel, TrainError>>>> =
        Mutex::new((0..total).map(|_| None).collect());
    let (tx, rx) = mpsc::channel::<Progress>();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let tx = tx.clone();
            let (next, failed, results) = (&next, &failed, &results);
            s.spawn(move || loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= total || failed.load(Ordering::Relaxed) {
                    break;
                }
                let head = HeadId {
                    index,
                    total,
                    layer: index / model.n_head_kv,
                    kv_head: index % model.n_head_kv,
                };
                let send = |p| {
                    let _ = tx.send(p);
                };
                let r = train_head(records, head, settings, &send);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                results.lock().unwrap_or_else(|e| e.into_inner())[index] = Some(r);
            });
        }
        // The workers hold the only senders left: the loop ends when they are done.
        drop(tx);
        for p in rx {
            progress(p);
        }
    });
    let mut heads = Vec::with_capacity(total);
    let mut first_error = None;
    // Heads never started (another failed) are None; the failure is among the rest.
    for r in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
        match r {
            Some(Ok(h)) => heads.push(h),
            Some(Err(e)) => {
                first_error.get_or_insert(e);
            }
            None => {}
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let m = &records[0].meta;
    let training_rows: usize = records
        .iter()
        .map(|r| train_rows(r, settings).0.len())
        .sum();
    let tokens: usize = records.iter().map(|r| r.meta.n_tokens).sum();
    let mut sources: Vec<&str> = records.iter().map(|r| r.meta.source.as_str()).collect();
    if sources.len() > 8 {
        sources.truncate(8);
        sources.push("…");
    }
    Ok(SaapIndex {
        meta: IndexMeta {
            n_layer: m.n_layer,
            n_head_kv: m.n_head_kv,
            head_dim: m.head_dim,
            clusters: settings.clusters,
            hidden: settings.hidden,
            centroid_prior: settings.centroid_prior,
            training: TrainingInfo {
                contexts: records.len(),
                // Mean tokens per context.
                context_tokens: tokens / records.len(),
                queries: training_rows,
                seed: settings.seed,
                kmeans_iterations: settings.kmeans_iterations,
                spherical: settings.spherical,
                steps: settings.steps,
                batch: settings.batch,
                learning_rate: settings.learning_rate,
                min_distance: settings.min_distance,
                seconds: start.elapsed().as_secs_f64(),
                text: sources.join("; "),
            },
        },
        fingerprint: model.fingerprint,
        heads,
    })
}

/// A record's query rows past the sink: `(training rows, held-out rows)`.
fn train_rows(r: &ContextRecord, s: &TrainSettings) -> (Vec<usize>, Vec<usize>) {
    (0..r.meta.query_positions.len())
        .filter(|&i| r.meta.query_positions[i] >= 1)
        .partition(|&i| !is_held_out(s.seed, &r.meta.source, r.meta.query_positions[i], s.holdout))
}

/// One (layer, KV head)'s de-roped keys at positions `1..` of every record.
fn keys_of(records: &[ContextRecord], layer: usize, kv_head: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for r in records {
        for t in 1..r.meta.n_tokens {
            out.extend_from_slice(r.key(layer, kv_head, t));
        }
    }
    out
}

/// One record's keys (every position) for `kv_head` of `layer`.
pub(crate) fn record_keys(r: &ContextRecord, layer: usize, kv_head: usize) -> Vec<f32> {
    (0..r.meta.n_tokens)
        .flat_map(|t| r.key(layer, kv_head, t))
        .copied()
        .collect()
}

/// The training and held-out examples of one head: (query row, query head) pairs whose
/// best key is at least `min_distance` back, with their attention mass per bucket of
/// `part`. The distance of every training pair is pushed to `distances`.
fn examples(
    records: &[ContextRecord],
    head: HeadId,
    part: &kmeans::Partition,
    s: &TrainSettings,
    min_distance: usize,
    distances: &mut Vec<usize>,
) -> Result<(Examples, Examples), TrainError> {
    let (layer, kv_head) = (head.layer, head.kv_head);
    let m = &records[0].meta;
    let (d, g, c) = (m.head_dim, m.n_head / m.n_head_kv, s.clusters);
    let (mut train, mut held) = (Examples::new(d, c), Examples::new(d, c));
    for r in records {
        let keys = record_keys(r, layer, kv_head);
        let buckets = kmeans::assign(&keys, d, &part.centroids, &part.bias)?;
        let (train_rows, held_rows) = train_rows(r, s);
        // Queries inside the first window have no key the buckets must supply.
        let beyond = |i: &&usize| r.meta.query_positions[**i] > s.target_window;
        let train_rows: Vec<usize> = train_rows.iter().filter(beyond).copied().collect();
        let held_rows: Vec<usize> = held_rows.iter().filter(beyond).copied().collect();
        let rows: Vec<usize> = train_rows.iter().chain(&held_rows).copied().collect();
        let targets = group_targets(r, layer, kv_head, &buckets, c, &rows, s.target_window)?;
        for (k, t) in targets.iter().enumerate() {
            let is_train = k < train_rows.len();
            for h in 0..g {
                if is_train {
                    distances.push(t.position - t.best[h]);
                }
                if t.long_range(h, min_distance) {
                    let set = if is_train { &mut train } else { &mut held };
                    set.push(r.query(layer, kv_head * g + h, t.row), t.head_mass(h));
                }
            }
        }
    }
    Ok((train, held))
}

/// K-means, targets and Q-model for one head.
fn train_head(
    records: &[ContextRecord],
    head: HeadId,
    s: &TrainSettings,
    send: &dyn Fn(Progress),
) -> Result<HeadModel, TrainError> {
    let (layer, kv_head) = (head.layer, head.kv_head);
    let m = &records[0].meta;
    let (d, c) = (m.head_dim, s.clusters);
    let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
    rng.set_stream(head.index as u64);
    let mut summary = HeadSummary::default();

    send(Progress::Phase {
        head,
        phase: Phase::KMeans,
    });
    let t0 = Instant::now();
    let points = keys_of(records, layer, kv_head);
    if points.len() / d < c {
        return Err(TrainError::TooFewKeys {
            layer,
            kv_head,
            keys: points.len() / d,
            clusters: c,
        });
    }
    let part = kmeans::kmeans(
        &points,
        d,
        &KMeansSettings {
            clusters: c,
            iterations: s.kmeans_iterations,
            spherical: s.spherical,
            points_per_centroid: s.points_per_centroid,
        },
        &mut rng,
    )?;
    drop(points);
    summary.keys = part.points;
    summary.reseeded = part.reseeded;
    summary.kmeans_seconds = t0.elapsed().as_secs_f64();

    send(Progress::Phase {
        head,
        phase: Phase::Targets,
    });
    let t0 = Instant::now();
    let mut distances = Vec::new();
    let mut threshold = s.min_distance;
    let (mut train, mut held) = examples(records, head, &part, s, threshold, &mut distances)?;
    summary.candidates = distances.len();
    if train.len() < s.min_examples.min(distances.len()) {
        // Too few long-range queries (a head that mostly looks back a short way): train on
        // the `min_examples` longest-range ones instead of on almost nothing.
        distances.sort_unstable_by(|a, b| b.cmp(a));
        threshold = distances[s.min_examples.min(distances.len()) - 1];
        (train, held) = examples(records, head, &part, s, threshold, &mut Vec::new())?;
    }
    summary.min_distance = threshold;
    summary.examples = train.len();
    summary.held_out = held.len();
    summary.targets_seconds = t0.elapsed().as_secs_f64();
    if train.len() < 2 {
        return Err(TrainError::NoExamples {
            layer,
            kv_head,
            examples: train.len(),
            candidates: summary.candidates,
            min_distance: s.min_distance,
        });
    }

    send(Progress::Phase {
        head,
        phase: Phase::QModel,
    });
    let t0 = Instant::now();
    let fit = qmodel::fit(
        &train,
        &held,
        &QModelSettings {
            hidden: s.hidden,
            steps: s.steps,
            batch: s.batch,
            learning_rate: s.learning_rate,
            prior: s.centroid_prior.then(|| part.centroids.clone()),
        },
        &mut rng,
        &mut |step, loss| {
            send(Progress::Step {
                head,
                step,
                steps: s.steps,
                loss,
            })
        },
    )?;
    let [w1, b1, w2, b2] = fit.model.export()?;
    summary.train_kl = fit.train_kl;
    summary.held_out_kl = fit.held_out_kl;
    summary.qmodel_seconds = t0.elapsed().as_secs_f64();
    send(Progress::Done { head, summary });
    Ok(HeadModel {
        centroids: part.centroids,
        centroid_bias: part.bias,
        w1,
        b1,
        w2,
        b2,
        prior_scale: if s.centroid_prior {
            sparrow::saap::prior_scale(d)
        } else {
            0.0
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{evaluate, EvalSettings};
    use rand::Rng;
    use sparrow::saap::{RecordMeta, RopeParams};
    use sparrow::synthetic::{synthetic_config, SyntheticSpec};

    /// A 2-layer model with one KV head of size 8 and two query heads; RoPE turns only
    /// the first pair of dimensions, so the rest carry position-free content.
    fn model() -> ModelConfig {
        let mut m = synthetic_config(&SyntheticSpec {
            n_layer: 2,
            n_embd: 16,
            n_head: 2,
            n_head_kv: 1,
            n_ff: 32,
            ..SyntheticSpec::default()
        })
        .unwrap();
        assert_eq!(m.head_dim, 8);
        m.n_rot = 2;
        m
    }

    /// Records where the query→bucket mapping is learnable: each key sits near one of 4
    /// directions (dimensions 2..6), each query points at one of them, so its attention
    /// falls on that direction's keys.
    fn records(model: &ModelConfig, n: usize, seed: u64) -> Vec<ContextRecord> {
        let d = 8;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..3)
            .map(|k| {
                let positions: Vec<usize> = (16..n).step_by(2).collect();
                let mut vec_near = |dir: usize, len: f32| -> Vec<f32> {
                    let mut v: Vec<f32> = (0..d).map(|_| rng.random_range(-0.3..0.3)).collect();
                    v[2 + dir] += len;
                    v
                };
                let mut keys = Vec::new();
                let mut queries = Vec::new();
                for _ in 0..model.n_layer {
                    let dirs: Vec<usize> = (0..n).map(|t| (t * 7 + t / 3) % 4).collect();
                    keys.push(dirs.iter().flat_map(|&a| vec_near(a, 4.0)).collect());
                    let mut q = Vec::new();
                    for (i, _) in positions.iter().enumerate() {
                        let b = (i * 5 + k) % 4;
                        for h in 0..2 {
                            q.extend(vec_near(b, 4.0 + 2.0 * h as f32));
                        }
                    }
                    queries.push(q);
                }
                ContextRecord {
                    meta: RecordMeta {
                        n_layer: model.n_layer,
                        n_head: 2,
                        n_head_kv: 1,
                        head_dim: d,
                        n_tokens: n,
                        query_positions: positions,
                        rope: RopeParams::of(model),
                        source: format!("synthetic {seed}/{k}"),
                    },
                    fingerprint: model.fingerprint,
                    keys,
                    queries,
                }
            })
            .collect()
    }

    fn settings() -> TrainSettings {
        TrainSettings {
            clusters: 4,
            hidden: 16,
            steps: 200,
            batch: 32,
            learning_rate: 1e-2,
            min_distance: 8,
            min_examples: 16,
            holdout: 0.25,
            seed: 5,
            threads: 2,
            ..TrainSettings::default()
        }
    }

    /// Training runs end to end, reports every head, writes an index the engine loads,
    /// and its Q-model captures far more of the held-out attention than a uniform router.
    #[test]
    fn trains_a_learnable_mapping() {
        let m = model();
        let recs = records(&m, 160, 1);
        let s = settings();
        let mut done = Vec::new();
        let mut steps = 0;
        let index = train(&recs, &m, &s, &mut |p| match p {
            Progress::Done { head, summary } => done.push((head.index, summary)),
            Progress::Step { .. } => steps += 1,
            Progress::Phase { .. } => {}
        })
        .unwrap();
        done.sort_by_key(|d| d.0);
        assert_eq!(done.iter().map(|d| d.0).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(steps, 2 * 10);
        for (_, sum) in &done {
            assert!(
                sum.examples > 100 && sum.examples < sum.candidates,
                "{sum:?}"
            );
            assert!(sum.held_out > 10, "{sum:?}");
            assert!(sum.held_out_kl.unwrap() < 0.3, "{sum:?}");
        }
        assert_eq!(index.heads.len(), 2);
        assert_eq!(index.meta.training.contexts, 3);
        assert_eq!(index.meta.training.context_tokens, 160);
        assert!(index.meta.training.seconds > 0.0);
        let back = SaapIndex::decode(&index.encode(), &m).unwrap();
        assert_eq!(back, index);
        let report = evaluate(&index, &recs, &[1, 2], &EvalSettings::held_out(&s)).unwrap();
        assert_eq!(report.layers.len(), 2);
        let one = &report.overall[0];
        assert!(report.examples > 10, "{report}");
        assert_eq!(one.uniform_mass, 0.25);
        assert!(one.qmodel_mass > 0.8, "{report}");
        assert!(one.oracle_mass >= one.qmodel_mass - 1e-9, "{report}");
        assert!((one.qmodel_keys - 0.25).abs() < 0.1, "{report}");
        // Same seed, same index.
        let again = train(&recs, &m, &s, &mut |_| {}).unwrap();
        assert_eq!(again.heads, index.heads);
    }

    /// A head with too few long-range queries trains on its longest-range ones.
    #[test]
    fn falls_back_to_the_longest_range_queries() {
        let m = model();
        let recs = records(&m, 64, 3);
        let s = TrainSettings {
            min_distance: 64,
            min_examples: 40,
            ..settings()
        };
        let mut sums = Vec::new();
        train(&recs, &m, &s, &mut |p| {
            if let Progress::Done { summary, .. } = p {
                sums.push(summary)
            }
        })
        .unwrap();
        for sum in &sums {
            assert!(sum.min_distance < 64 && sum.min_distance > 0, "{sum:?}");
            assert!(
                sum.examples >= 40 && sum.examples < sum.candidates,
                "{sum:?}"
            );
        }
    }

    /// A record of another model, records without a query and too many clusters are
    /// refused with what is wrong.
    #[test]
    fn refuses_foreign_records_and_impossible_settings() {
        let m = model();
        let mut recs = records(&m, 64, 2);
        recs[1].fingerprint[3] ^= 1;
        let e = train(&recs, &m, &settings(), &mut |_| {}).unwrap_err();
        assert!(matches!(e, TrainError::OtherModel { .. }), "{e}");
        let mut recs = records(&m, 64, 2);
        for r in &mut recs {
            r.meta.query_positions.clear();
            r.queries.iter_mut().for_each(Vec::clear);
        }
        let e = train(&recs, &m, &settings(), &mut |_| {}).unwrap_err();
        assert!(matches!(e, TrainError::NoExamples { .. }), "{e}");
        let recs = records(&m, 64, 2);
        let many = TrainSettings {
            clusters: 1000,
            ..settings()
        };
        let e = train(&recs, &m, &many, &mut |_| {}).unwrap_err();
        assert!(matches!(e, TrainError::TooFewKeys { .. }), "{e}");
        let mut other = m.clone();
        other.n_layer = 3;
        let e = train(&recs, &other, &settings(), &mut |_| {}).unwrap_err();
        assert!(matches!(e, TrainError::Shape { .. }), "{e}");
    }
}
