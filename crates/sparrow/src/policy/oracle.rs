//! `oracle`: the quality ceiling of block-free token selection at a budget. For a decode
//! query, per KV head, every cached key is scored exactly — each query head of the group's
//! softmax probability, summed over the group — and the `budget` keys holding the most
//! probability are read. No selection policy reading that many positions can capture more
//! of the group's attention mass, so `sparrow eval attention` and `eval needle` show it
//! beside Quest and the others as the ceiling. It reads every key to score them, so it is
//! slow: an instrument, not a method. Prefill reads everything.

use super::{PolicyEntry, SettingsType};
use sparrow_attn::kernel::{read_f32, runs, AttnShape, KvSource, Level};
use sparrow_attn::policy::{
    group_row_mass, PlanContext, PlanEntry, ReadPlan, Source, SparsePolicy,
};
use std::ops::Range;

/// The registry's entry: a decode policy.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "oracle",
    summary: "decode: the exact top keys by attention mass within --oracle-budget",
    prefill: false,
    decode: true,
    build: |b| Ok(Box::new(OracleAttention::new(b.settings())?)),
    check: |c| {
        let s = c.settings::<OracleSettings>();
        s.validate().map(|_| format!("{s:?}"))
    },
    settings: SettingsType::of::<OracleSettings>(),
};

/// Oracle settings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct OracleSettings {
    /// Oracle: positions read per decode query and KV head — the exact top keys by
    /// attention mass (a quality ceiling for selection policies; slow: it scores every key).
    #[cfg_attr(feature = "cli", arg(id = "ORACLE_BUDGET", long = "oracle-budget", default_value_t = 1024, help_heading = crate::policy::HELP_HEADING))]
    pub budget: usize,
}

impl Default for OracleSettings {
    /// The same budget as Quest's default, so the two compare at equal reads.
    fn default() -> Self {
        OracleSettings { budget: 1024 }
    }
}

impl OracleSettings {
    /// Checks the settings, naming the bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.budget == 0 {
            return Err("oracle budget 0 is out of range (at least 1 token)".into());
        }
        Ok(())
    }
}

/// The oracle policy (stateless apart from scratch).
pub struct OracleAttention {
    settings: OracleSettings,
    keys: Vec<f32>,
}

impl OracleAttention {
    /// An oracle with `settings`.
    pub fn new(settings: OracleSettings) -> Result<Self, String> {
        settings.validate()?;
        Ok(OracleAttention {
            settings,
            keys: Vec::new(),
        })
    }

    /// The `budget` positions of `0..n` with the most summed probability for the query
    /// heads `q_group` (`group × head_dim`) over KV head `kv_head` of `keys`
    /// (`n × kv_dim`), as ascending ranges.
    fn select(
        &self,
        q_group: &[f32],
        keys: &[f32],
        kv_dim: usize,
        hd: usize,
        kv_head: usize,
    ) -> Vec<Range<usize>> {
        let n = keys.len() / kv_dim;
        if self.settings.budget >= n {
            return std::iter::once(0..n).collect();
        }
        let mass = group_key_mass(q_group, keys, kv_dim, hd, kv_head);
        let mut order: Vec<usize> = (0..n).collect();
        let k = self.settings.budget;
        // Most mass first; ties to the later position (recent keys are the safer guess).
        order.select_nth_unstable_by(k - 1, |&a, &b| mass[b].total_cmp(&mass[a]).then(b.cmp(&a)));
        let mut chosen = order[..k].to_vec();
        chosen.sort_unstable();
        runs(chosen)
    }
}

/// Exact attention mass of each key for a GQA group: `Σ_queries softmax(q · k / √hd)`
/// in f64 over the `keys` of KV head `kv_head` (rows of `kv_dim`, f32), the queries of
/// `q_group` (rows of `hd`). A query whose scores are not finite adds nothing.
pub(crate) fn group_key_mass(
    q_group: &[f32],
    keys: &[f32],
    kv_dim: usize,
    hd: usize,
    kv_head: usize,
) -> Vec<f64> {
    let n = keys.len() / kv_dim;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut mass = vec![0f64; n];
    let mut s = vec![0f64; n];
    for q in q_group.chunks_exact(hd) {
        for (t, st) in s.iter_mut().enumerate() {
            let k = &keys[t * kv_dim + kv_head * hd..][..hd];
            *st = q
                .iter()
                .zip(k)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * scale;
        }
        let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|&x| (x - mx).exp()).sum();
        for (m, &x) in mass.iter_mut().zip(&s) {
            let p = (x - mx).exp() / z;
            if p.is_finite() {
                *m += p;
            }
        }
    }
    mass
}

/// Of the `candidates` (ascending positions of `store`), the `keep` with the most exact
/// attention mass for the group `q_group` of `kv_head` — per query head a softmax over the
/// candidates' keys, summed ([`group_row_mass`]: the oracle's criterion within a candidate
/// set) — as ascending ranges. The exact second pass of the policies that pick candidates
/// from summaries (Quest's pages, the sketch's channels): it reads the candidates' keys.
pub(crate) fn top_by_exact_mass(
    store: &dyn KvSource,
    shape: AttnShape,
    kv_head: usize,
    q_group: &[f32],
    candidates: &[usize],
    keep: usize,
) -> Vec<Range<usize>> {
    let (kv_dim, hd) = (shape.kv_dim(), shape.head_dim);
    let rows = candidates.len();
    if keep >= rows {
        return runs(candidates.iter().copied());
    }
    if keep == 0 {
        return Vec::new();
    }
    let mut keys = vec![0f32; rows * kv_dim];
    let mut done = 0;
    for run in runs(candidates.iter().copied()) {
        let len = run.len();
        read_f32(
            store,
            false,
            hd,
            run.start,
            &mut keys[done * kv_dim..(done + len) * kv_dim],
        );
        done += len;
    }
    let mut mass = vec![0f32; rows];
    let at = kv_head * hd;
    group_row_mass(Level::active(), q_group, hd, &keys[at..], kv_dim, &mut mass);
    let mut order: Vec<usize> = (0..rows).collect();
    // Most mass first; ties to the later position.
    order.select_nth_unstable_by(keep - 1, |&a, &b| {
        mass[b].total_cmp(&mass[a]).then(b.cmp(&a))
    });
    order.truncate(keep);
    let mut positions: Vec<usize> = order.into_iter().map(|i| candidates[i]).collect();
    positions.sort_unstable();
    runs(positions)
}

impl SparsePolicy for OracleAttention {
    fn name(&self) -> &str {
        "oracle"
    }

    fn supports_prefill(&self) -> bool {
        false
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let (shape, n) = (ctx.shape, ctx.pos0 + 1);
        if ctx.n_tokens() != 1 || self.settings.budget >= n {
            return ReadPlan::causal(shape, ctx.pos0, ctx.n_tokens());
        }
        let kv_dim = shape.kv_dim();
        let mut keys = std::mem::take(&mut self.keys);
        keys.resize(n * kv_dim, 0.0);
        read_f32(ctx.store, false, shape.head_dim, 0, &mut keys);
        let entries = (0..shape.n_head_kv)
            .map(|h| PlanEntry {
                kv_heads: h..h + 1,
                source: Source::Store,
                weight: 1.0,
                visible: vec![self.select(
                    ctx.group_queries(0, h),
                    &keys,
                    kv_dim,
                    shape.head_dim,
                    h,
                )],
            })
            .collect();
        self.keys = keys;
        ReadPlan {
            entries,
            side: Vec::new(),
        }
    }

    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        self.settings.budget.min(n_ctx) as f64 / n_ctx as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend, read_set, AttnShape, DenseAttention};
    use crate::kv::{KvType, RamStore};

    const SHAPE: AttnShape = AttnShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 8,
    };

    fn cache(n: usize) -> RamStore {
        let mut c = RamStore::new(KvType::F32, 1, n, 16);
        for t in 0..n {
            let k: Vec<f32> = (0..16)
                .map(|d| (((t * 31 + d * 7) % 17) as f32 - 8.0) / 8.0)
                .collect();
            c.write(0, t, &k, &k);
        }
        c
    }

    /// The oracle's read set holds more of the exact attention mass than any other set of
    /// the same size: checked against the best single swap (every chosen key's mass is at
    /// least every unchosen key's), with the mass computed independently here.
    #[test]
    fn reads_the_keys_with_the_most_mass() {
        let c = cache(300);
        let q: Vec<f32> = (0..32).map(|i| ((i * 13 % 7) as f32 - 3.0) / 2.0).collect();
        let mut o = OracleAttention::new(OracleSettings { budget: 40 }).unwrap();
        let read = read_set(&mut o, SHAPE, &c, 0, &q, 299);
        let mut keys = vec![0f32; 300 * 16];
        c.read_keys(0, 0, &mut keys);
        for (h, ranges) in read.iter().enumerate() {
            let chosen: Vec<usize> = ranges.iter().cloned().flatten().collect();
            assert_eq!(chosen.len(), 40);
            let mut mass = vec![0f64; 300];
            for r in 0..2 {
                let qh = &q[(h * 2 + r) * 8..][..8];
                let s: Vec<f64> = (0..300)
                    .map(|t| {
                        let k = &keys[t * 16 + h * 8..][..8];
                        qh.iter().zip(k).map(|(a, b)| (*a * *b) as f64).sum::<f64>() / 8f64.sqrt()
                    })
                    .collect();
                let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                s.iter()
                    .enumerate()
                    .for_each(|(t, x)| mass[t] += (x - mx).exp() / z);
            }
            let min_in = chosen
                .iter()
                .map(|&t| mass[t])
                .fold(f64::INFINITY, f64::min);
            let max_out = (0..300)
                .filter(|t| !chosen.contains(t))
                .map(|t| mass[t])
                .fold(0.0, f64::max);
            assert!(min_in >= max_out - 1e-12, "head {h}: {min_in} < {max_out}");
        }
        // A budget covering the context is exact attention, bit for bit.
        let mut all = OracleAttention::new(OracleSettings { budget: 300 }).unwrap();
        let (mut a, mut b) = (vec![0f32; 32], vec![0f32; 32]);
        attend(&mut all, SHAPE, &c, 0, &q, 299, &mut a);
        attend(&mut DenseAttention, SHAPE, &c, 0, &q, 299, &mut b);
        assert_eq!(a, b);
        assert!(OracleAttention::new(OracleSettings { budget: 0 }).is_err());
    }
}
