//! How much attention mass the engine's routers would find, measured on recorded queries
//! (held-out ones, or other records): what C and the hidden width are chosen by.
//!
//! For each long-range (query position, query head) pair — the queries Saap exists for —
//! and each probe count ℓ: the mass of that head's attention (sink excluded) in the ℓ
//! buckets chosen for its group, by
//! - the Q-model: the group's summed predicted distributions, as the `saap` policy does;
//! - the centroid router: the group's summed softmax of `centroid·q/√d` (plain k-means
//!   routing, the policy's `--saap-router centroids`);
//! - the oracle: the buckets holding most of the group's true mass (the best any group
//!   choice can do);
//!
//! and the fraction of the keys before the query (sink excluded) those buckets hold (the
//! selectivity, what reading them costs; the policy also reads its dense window, which is
//! not counted). A uniformly random choice captures `ℓ/C` on average.

use crate::kmeans;
use crate::split::is_held_out;
use crate::targets::group_targets;
use crate::train::record_keys;
use crate::{TrainError, TrainSettings};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sparrow::saap::{ContextRecord, Router, SaapIndex};

/// Which recorded queries are evaluated.
#[derive(Clone, Debug, PartialEq)]
pub enum EvalRows {
    /// All of them (records not trained on).
    All,
    /// The positions [`crate::train`] held out with this seed and fraction (the records
    /// trained on).
    HeldOut { seed: u64, fraction: f64 },
}

/// How an index is evaluated.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalSettings {
    pub rows: EvalRows,
    /// Only queries whose best key is at least this far back count (as in training).
    pub min_distance: usize,
    /// Layers left out of the overall figures (they are read densely; the policy's
    /// default is layer 0); still reported per layer.
    pub dense_layers: Vec<usize>,
}

impl EvalSettings {
    /// The positions `train` held out with `settings`, long-range as in training.
    pub fn held_out(settings: &TrainSettings) -> EvalSettings {
        EvalSettings {
            rows: EvalRows::HeldOut {
                seed: settings.seed,
                fraction: settings.holdout,
            },
            min_distance: settings.min_distance,
            dense_layers: vec![0],
        }
    }
}

/// Means for one probe count, over long-range (query position, query head) pairs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeStats {
    /// Buckets read (ℓ).
    pub probes: usize,
    /// Attention mass captured by the Q-model's, the centroids' and the oracle's buckets.
    pub qmodel_mass: f64,
    pub centroid_mass: f64,
    pub oracle_mass: f64,
    /// A uniformly random choice: `ℓ/C`.
    pub uniform_mass: f64,
    /// Fraction of the keys before the query those buckets hold.
    pub qmodel_keys: f64,
    pub centroid_keys: f64,
    pub oracle_keys: f64,
}

/// One layer's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerReport {
    pub layer: usize,
    /// Long-range pairs evaluated.
    pub examples: usize,
    pub probes: Vec<ProbeStats>,
}

/// An evaluation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub clusters: usize,
    pub hidden: usize,
    pub min_distance: usize,
    /// Which queries: "held-out positions …" or "all positions".
    pub rows: String,
    /// (query position, query head) pairs looked at, and the long-range ones evaluated,
    /// outside the dense layers.
    pub candidates: usize,
    pub examples: usize,
    pub dense_layers: Vec<usize>,
    /// Over all layers but the dense ones.
    pub overall: Vec<ProbeStats>,
    pub layers: Vec<LayerReport>,
}

/// Sums for one probe count: mass and keys for the three routers.
type Sums = [f64; 6];

/// One (layer, KV head)'s sums.
struct HeadSums {
    layer: usize,
    candidates: usize,
    examples: usize,
    sums: Vec<Sums>,
}

/// Evaluate `index` on `records` (recorded from its model) at each probe count of
/// `probes`.
pub fn evaluate(
    index: &SaapIndex,
    records: &[ContextRecord],
    probes: &[usize],
    settings: &EvalSettings,
) -> Result<Report, TrainError> {
    let im = &index.meta;
    if records.is_empty() {
        return Err(TrainError::NoRecords("(no records given)".into()));
    }
    if probes.is_empty() || probes.contains(&0) {
        return Err(TrainError::Settings(format!(
            "probe counts {probes:?} (at least one, each at least 1)"
        )));
    }
    for (i, r) in records.iter().enumerate() {
        let m = &r.meta;
        let name = || format!("record {i} ({})", m.source);
        if r.fingerprint != index.fingerprint {
            return Err(TrainError::OtherModel { record: name() });
        }
        if (m.n_layer, m.n_head_kv, m.head_dim) != (im.n_layer, im.n_head_kv, im.head_dim)
            || !m.n_head.is_multiple_of(m.n_head_kv)
        {
            return Err(TrainError::IndexMismatch(format!(
                "{}: {} layers × {} KV heads × {}, the index {} × {} × {}",
                name(),
                m.n_layer,
                m.n_head_kv,
                m.head_dim,
                im.n_layer,
                im.n_head_kv,
                im.head_dim
            )));
        }
    }
    let heads: Vec<HeadSums> = (0..im.n_heads())
        .into_par_iter()
        .map(|i| {
            eval_head(
                index,
                records,
                i / im.n_head_kv,
                i % im.n_head_kv,
                probes,
                settings,
            )
        })
        .collect::<Result<_, TrainError>>()?;
    let c = im.clusters;
    let stats = |sums: &[Sums], n: usize| -> Vec<ProbeStats> {
        let n = n.max(1) as f64;
        probes
            .iter()
            .zip(sums)
            .map(|(&l, s)| ProbeStats {
                probes: l,
                qmodel_mass: s[0] / n,
                centroid_mass: s[1] / n,
                oracle_mass: s[2] / n,
                uniform_mass: l.min(c) as f64 / c as f64,
                qmodel_keys: s[3] / n,
                centroid_keys: s[4] / n,
                oracle_keys: s[5] / n,
            })
            .collect()
    };
    let add = |into: &mut Vec<Sums>, from: &[Sums]| {
        for (a, b) in into.iter_mut().zip(from) {
            for k in 0..6 {
                a[k] += b[k];
            }
        }
    };
    let (mut all, mut candidates, mut examples) = (vec![[0f64; 6]; probes.len()], 0, 0);
    let mut layers = Vec::new();
    for layer in 0..im.n_layer {
        let (mut sums, mut n) = (vec![[0f64; 6]; probes.len()], 0);
        for h in heads.iter().filter(|h| h.layer == layer) {
            add(&mut sums, &h.sums);
            n += h.examples;
            if !settings.dense_layers.contains(&layer) {
                candidates += h.candidates;
            }
        }
        if !settings.dense_layers.contains(&layer) {
            add(&mut all, &sums);
            examples += n;
        }
        layers.push(LayerReport {
            layer,
            examples: n,
            probes: stats(&sums, n),
        });
    }
    Ok(Report {
        clusters: c,
        hidden: im.hidden,
        min_distance: settings.min_distance,
        rows: match settings.rows {
            EvalRows::All => "all positions".into(),
            EvalRows::HeldOut { seed, fraction } => {
                format!("held-out positions ({:.0}%, seed {seed})", fraction * 100.0)
            }
        },
        candidates,
        examples,
        dense_layers: settings.dense_layers.clone(),
        overall: stats(&all, examples),
        layers,
    })
}

/// The buckets in order of decreasing `score` (NaN last, ties by index).
fn ranked(score: &[f32]) -> Vec<usize> {
    let key = |b: usize| {
        let s = score[b];
        if s.is_nan() {
            f32::NEG_INFINITY
        } else {
            s
        }
    };
    let mut order: Vec<usize> = (0..score.len()).collect();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    order
}

/// Sums of one (layer, KV head) over the records.
fn eval_head(
    index: &SaapIndex,
    records: &[ContextRecord],
    layer: usize,
    kv_head: usize,
    probes: &[usize],
    settings: &EvalSettings,
) -> Result<HeadSums, TrainError> {
    let head = index.head(layer, kv_head);
    let (c, d) = (head.clusters(), index.meta.head_dim);
    let mut out = HeadSums {
        layer,
        candidates: 0,
        examples: 0,
        sums: vec![[0f64; 6]; probes.len()],
    };
    let (mut scratch, mut queries) = (sparrow::saap::Scratch::default(), Vec::new());
    let level = sparrow::saap::Level::active();
    for r in records {
        let m = &r.meta;
        let g = m.n_head / m.n_head_kv;
        let rows: Vec<usize> = (0..m.query_positions.len())
            .filter(|&i| {
                let p = m.query_positions[i];
                p >= 1
                    && match settings.rows {
                        EvalRows::All => true,
                        EvalRows::HeldOut { seed, fraction } => {
                            is_held_out(seed, &m.source, p, fraction)
                        }
                    }
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        let buckets = kmeans::assign(
            &record_keys(r, layer, kv_head),
            d,
            &head.centroids,
            &head.centroid_bias,
        )?;
        let mut targets = group_targets(r, layer, kv_head, &buckets, c, &rows, 0)?;
        targets.sort_by_key(|t| t.position);
        // Keys per bucket among positions 1..=p, advanced with the rows.
        let (mut counts, mut upto) = (vec![0usize; c], 1);
        for t in &targets {
            while upto <= t.position {
                counts[buckets[upto] as usize] += 1;
                upto += 1;
            }
            out.candidates += g;
            let long: Vec<usize> = (0..g)
                .filter(|&h| t.long_range(h, settings.min_distance))
                .collect();
            if long.is_empty() {
                continue;
            }
            out.examples += long.len();
            queries.clear();
            for h in 0..g {
                queries.extend_from_slice(r.query(layer, kv_head * g + h, t.row));
            }
            let mut qmodel = vec![0f32; c];
            head.add_mass(
                Router::Qmodel,
                head.weights(),
                level,
                &queries,
                &mut scratch,
                &mut qmodel,
            );
            let mut cent = vec![0f32; c];
            head.add_mass(
                Router::Centroids,
                head.weights(),
                level,
                &queries,
                &mut scratch,
                &mut cent,
            );
            let mut oracle = vec![0f32; c];
            for &h in &long {
                for (o, &x) in oracle.iter_mut().zip(t.head_mass(h)) {
                    *o += x;
                }
            }
            for (router, score) in [qmodel, cent, oracle].iter().enumerate() {
                let order = ranked(score);
                let (mut mass, mut keys, mut taken) = (0f64, 0usize, 0);
                for (pi, &l) in probes.iter().enumerate() {
                    while taken < l.min(c) {
                        let b = order[taken];
                        mass += long.iter().map(|&h| t.head_mass(h)[b] as f64).sum::<f64>();
                        keys += counts[b];
                        taken += 1;
                    }
                    let s = &mut out.sums[pi];
                    s[router] += mass;
                    s[3 + router] += long.len() as f64 * keys as f64 / t.position as f64;
                }
            }
        }
    }
    Ok(out)
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Saap evaluation: C = {}, hidden {}; {} of {} (query, head) pairs long-range (best key ≥ {} back), {}; dense layers {:?} left out",
            self.clusters,
            self.hidden,
            self.examples,
            self.candidates,
            self.min_distance,
            self.rows,
            self.dense_layers
        )?;
        writeln!(
            f,
            "{:>5} | {:>8} {:>9} {:>8} {:>8} | {:>8} {:>9} {:>8}",
            "ℓ", "Q-model", "centroids", "oracle", "uniform", "Q-model", "centroids", "oracle"
        )?;
        writeln!(
            f,
            "{:>5} | {:^36} | {:^27}",
            "", "attention mass captured", "fraction of keys read"
        )?;
        for p in &self.overall {
            writeln!(
                f,
                "{:>5} | {:>8.3} {:>9.3} {:>8.3} {:>8.3} | {:>8.3} {:>9.3} {:>8.3}",
                p.probes,
                p.qmodel_mass,
                p.centroid_mass,
                p.oracle_mass,
                p.uniform_mass,
                p.qmodel_keys,
                p.centroid_keys,
                p.oracle_keys
            )?;
        }
        Ok(())
    }
}
