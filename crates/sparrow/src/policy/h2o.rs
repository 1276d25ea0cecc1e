//! H2O, the Heavy-Hitter Oracle (Zhang et al., 2023), for decode.
//!
//! H2O bounds the KV cache a decoder reads: per layer and per KV head it keeps the
//! positions that have received the most attention so far ("heavy hitters") plus the most
//! recent ones, and evicts the rest for good. For a context of `n` positions the budget is
//! `ceil(heavy · n)` heavy hitters plus `ceil(recent · n)` recent positions (defaults 10% +
//! 10%, the method's code).
//!
//! Each decode step, per layer and KV head:
//!
//! 1. positions written since the last step (the new token, or a prompt appended in
//!    between) join the kept set with a score of 0;
//! 2. the group's query heads attend exactly over the kept set (which holds the recent
//!    window, the newest position included);
//! 3. each kept position's score grows by the sum over the group's query heads of its
//!    softmax probability (the accumulated attention H2O ranks by);
//! 4. among kept positions older than the recent window, all but the `ceil(heavy · n)`
//!    best-scoring are evicted (ties keep the later position).
//!
//! Evicted positions stay in the engine's cache (other policies, rewinds and prompt caches
//! still see them) but this backend never reads them again: that is H2O's bounded cache.
//!
//! **Seeding (a simplification).** The paper accumulates scores over the prompt's queries
//! as well. Our prefill is exact and keeps no per-key probabilities, so the first decode
//! step of a layer with no H2O state attends over the whole context once, seeds every
//! position's score with that step's probabilities, and then evicts to the budget.
//!
//! Prefill (batches of several tokens) and layers in `dense_layers` read everything.
//! Each layer keeps a compact f32 copy of its kept keys and values per KV head (H2O's
//! bounded cache; rows join it from the store as positions are written, and leave it on
//! eviction): heavy hitters are scattered, and reading them in place would cost a memory
//! miss per row. Its size is at most the budget, `(heavy + recent) · n × kv_dim × 8` bytes
//! per layer — 0.4× an f16 cache at the default 20%. The plan reads each head's copy as a
//! side table (whose rows name their store positions); the executor returns each query
//! row's log-sum-exp, from which [`SparsePolicy::after_attend`] recomputes the kept keys'
//! probabilities (scores again, `exp(s − lse)`) to add to their scores before evicting.

use super::{AttentionChoice, PolicyEntry, SettingsType};
use sparrow_attn::kernel::tile::{scores, Tile};
use sparrow_attn::kernel::{read_f32, F32Rows, Level};
use sparrow_attn::policy::{PlanContext, PlanEntry, ReadPlan, SideTable, Source, SparsePolicy};

/// The registry's entry: a decode policy.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "h2o",
    summary: "decode: heavy hitters + recent",
    prefill: false,
    decode: true,
    build: |b| {
        Ok(Box::new(H2oAttention::new(
            settings(b.choice)?,
            b.model.n_layer,
        )?))
    },
    check: |c| settings(c).map(|s| format!("{s:?}")),
    settings: SettingsType::of::<H2oSettings>(),
};

/// The settings with the shared `--dense-layers` applied, checked.
fn settings(c: &AttentionChoice) -> Result<H2oSettings, String> {
    let mut s = c.settings::<H2oSettings>();
    s.dense_layers = c.dense_layers()?.unwrap_or(s.dense_layers);
    s.validate()?;
    Ok(s)
}

/// H2O settings (defaults from the method's code: 10% heavy hitters + 10% recent).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct H2oSettings {
    /// H2O: heavy hitters kept, as a fraction of the context (0..=1).
    #[cfg_attr(feature = "cli", arg(id = "H2O_HEAVY", long = "h2o-heavy", default_value_t = 0.1, help_heading = crate::policy::HELP_HEADING))]
    pub heavy: f64,
    /// H2O: recent tokens kept, as a fraction of the context (0..=1).
    #[cfg_attr(feature = "cli", arg(id = "H2O_RECENT", long = "h2o-recent", default_value_t = 0.1, help_heading = crate::policy::HELP_HEADING))]
    pub recent: f64,
    /// Layers that keep exact attention (set by `--dense-layers`).
    #[cfg_attr(feature = "cli", arg(skip))]
    pub dense_layers: Vec<usize>,
}

impl Default for H2oSettings {
    fn default() -> Self {
        H2oSettings {
            heavy: 0.1,
            recent: 0.1,
            dense_layers: Vec::new(),
        }
    }
}

impl H2oSettings {
    /// Checks the settings, naming the bad one and its valid range.
    pub fn validate(&self) -> Result<(), String> {
        for (name, x) in [("heavy", self.heavy), ("recent", self.recent)] {
            // Written so that NaN fails too.
            if !(x > 0.0 && x <= 1.0) {
                return Err(format!(
                    "h2o {name} fraction {x} is out of range (0 < {name} <= 1, a fraction of the context)"
                ));
            }
        }
        Ok(())
    }

    /// `(heavy, recent)` budgets for a context of `n` positions: `ceil(fraction · n)`
    /// each, at most `n`; at least one recent position (the newest) when `n > 0`.
    pub fn budget(&self, n: usize) -> (usize, usize) {
        let count = |f: f64| ((f * n as f64).ceil() as usize).min(n);
        (count(self.heavy), count(self.recent).max(n.min(1)))
    }
}

/// One KV head's bounded cache: kept positions (ascending), their accumulated scores, and
/// a compact f32 copy of their keys and values (`pos.len() × head_dim` each, same order).
///
/// The copy is what H2O's bounded cache is: heavy hitters are scattered over the context,
/// and reading them in place costs a cache (and TLB) miss per row — several times the
/// arithmetic at long contexts — while a contiguous copy is read at full speed.
#[derive(Clone, Debug, Default)]
struct HeadKeep {
    pos: Vec<usize>,
    score: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl HeadKeep {
    /// Keep the entries whose flag is set, in order (rows of `hd` in `k` and `v`).
    fn retain(&mut self, keep: &[bool], hd: usize) {
        let mut w = 0;
        for (i, &kf) in keep.iter().enumerate() {
            if !kf {
                continue;
            }
            if w != i {
                self.pos[w] = self.pos[i];
                self.score[w] = self.score[i];
                self.k.copy_within(i * hd..(i + 1) * hd, w * hd);
                self.v.copy_within(i * hd..(i + 1) * hd, w * hd);
            }
            w += 1;
        }
        self.truncate(w, hd);
    }

    /// Keep the first `len` entries.
    fn truncate(&mut self, len: usize, hd: usize) {
        self.pos.truncate(len);
        self.score.truncate(len);
        self.k.truncate(len * hd);
        self.v.truncate(len * hd);
    }
}

/// One layer's H2O state: positions `0..n` have been seen (kept or evicted).
#[derive(Clone, Debug)]
struct LayerKeep {
    n: usize,
    head_dim: usize,
    heads: Vec<HeadKeep>,
}

impl LayerKeep {
    /// Forget positions `pos..`.
    fn truncate(&mut self, pos: usize) {
        for h in &mut self.heads {
            let keep = h.pos.partition_point(|&p| p < pos);
            h.truncate(keep, self.head_dim);
        }
        self.n = self.n.min(pos);
    }
}

/// The H2O decode policy (one per sequence).
pub struct H2oAttention {
    settings: H2oSettings,
    layers: Vec<Option<LayerKeep>>,
}

impl H2oAttention {
    /// A backend for a model of `n_layer` layers; out-of-range settings are an error naming
    /// the setting.
    pub fn new(settings: H2oSettings, n_layer: usize) -> Result<Self, String> {
        settings.validate()?;
        Ok(H2oAttention {
            settings,
            layers: (0..n_layer).map(|_| None).collect(),
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &H2oSettings {
        &self.settings
    }

    /// The positions `layer` keeps per KV head (ascending), or `None` before its first
    /// decode step (or a dense layer): for inspection and tests.
    pub fn kept(&self, layer: usize) -> Option<Vec<Vec<usize>>> {
        self.layers
            .get(layer)?
            .as_ref()
            .map(|s| s.heads.iter().map(|h| h.pos.clone()).collect())
    }

    /// Evict, among the positions of `head` older than the recent window of a context of
    /// `n`, all but the best-scoring heavy hitters.
    fn evict(&self, head: &mut HeadKeep, n: usize, hd: usize) {
        let (heavy, recent) = self.settings.budget(n);
        let old = head.pos.partition_point(|&p| p < n - recent);
        if old <= heavy {
            return;
        }
        let mut order: Vec<usize> = (0..old).collect();
        // Best first: higher score, then the later position; NaN (a broken activation)
        // ranks last.
        let key = |i: usize| {
            let s = head.score[i];
            if s.is_nan() {
                f32::NEG_INFINITY
            } else {
                s
            }
        };
        let mut keep = vec![false; old];
        if heavy > 0 {
            order.select_nth_unstable_by(heavy - 1, |&a, &b| {
                key(b).total_cmp(&key(a)).then(b.cmp(&a))
            });
            for &i in &order[..heavy] {
                keep[i] = true;
            }
        }
        // The recent window is always kept.
        keep.resize(head.pos.len(), true);
        head.retain(&keep, hd);
    }
}

/// Add to each kept key of `head` the probability the group's query heads (`q_group`,
/// `group × head_dim`) gave it: its score `q · k / √d` recomputed with the flash kernel's
/// score kernel, and `exp(score − lse)` with each head's log-sum-exp from the executor.
fn accumulate(level: Level, hd: usize, q_group: &[f32], lse: &[f32], head: &mut HeadKeep) {
    let group = q_group.len() / hd;
    let rw = group.div_ceil(8) * 8;
    let m = head.pos.len();
    if m == 0 {
        return;
    }
    // Queries transposed (`qt[d * rw + r]`); padding rows stay zero and are never used.
    let mut qt = vec![0f32; hd * rw];
    for (r, qh) in q_group.chunks_exact(hd).enumerate() {
        for (d, &x) in qh.iter().enumerate() {
            qt[d * rw + r] = x;
        }
    }
    let mut s = vec![0f32; m * rw];
    let keys = Tile::new(&head.k, hd, m, hd);
    scores(level, keys, &qt, rw, 1.0 / (hd as f32).sqrt(), &mut s);
    for (t, score) in head.score.iter_mut().enumerate() {
        let p: f32 = (0..group)
            .filter(|&r| lse[r].is_finite())
            .map(|r| (s[t * rw + r] - lse[r]).exp())
            .sum();
        if p.is_finite() {
            *score += p;
        }
    }
}

impl H2oAttention {
    /// Whether layer `layer` runs H2O for a batch of `n` tokens (else it reads everything).
    fn sparse_for(&self, layer: usize, n: usize) -> bool {
        n == 1 && layer < self.layers.len() && !self.settings.dense_layers.contains(&layer)
    }
}

impl SparsePolicy for H2oAttention {
    fn name(&self) -> &str {
        "h2o"
    }

    fn supports_prefill(&self) -> bool {
        false
    }

    /// Per KV head, the head's kept rows (a side table: the copy of its kept positions,
    /// the positions written since the last step having just joined it).
    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        let (shape, pos0) = (ctx.shape, ctx.pos0);
        if !self.sparse_for(ctx.layer, ctx.n_tokens()) {
            return ReadPlan::causal(shape, pos0, ctx.n_tokens());
        }
        let n = pos0 + 1;
        let hd = shape.head_dim;
        let fresh = || LayerKeep {
            n: 0,
            head_dim: hd,
            heads: vec![HeadKeep::default(); shape.n_head_kv],
        };
        let st = self.layers[ctx.layer].get_or_insert_with(fresh);
        if st.heads.len() != shape.n_head_kv || st.head_dim != hd {
            *st = fresh();
        }
        // Positions from `pos0` on are being written again without a rewind call (a
        // forward pass that failed midway): what was kept for them is stale.
        st.truncate(pos0);
        // Positions written since the last step join with a score of 0 (all of them at a
        // layer's first step: the seeding pass over the full context).
        if st.n < n {
            let kv_dim = shape.kv_dim();
            let mut kb = vec![0f32; (n - st.n) * kv_dim];
            let mut vb = vec![0f32; kb.len()];
            read_f32(ctx.store, false, hd, st.n, &mut kb);
            read_f32(ctx.store, true, hd, st.n, &mut vb);
            for (h, head) in st.heads.iter_mut().enumerate() {
                head.pos.extend(st.n..n);
                head.score.resize(head.pos.len(), 0.0);
                for (kr, vr) in kb.chunks_exact(kv_dim).zip(vb.chunks_exact(kv_dim)) {
                    head.k.extend_from_slice(&kr[h * hd..(h + 1) * hd]);
                    head.v.extend_from_slice(&vr[h * hd..(h + 1) * hd]);
                }
            }
            st.n = n;
        }
        let st = &*st;
        ReadPlan {
            entries: (0..shape.n_head_kv)
                .map(|h| PlanEntry {
                    kv_heads: h..h + 1,
                    source: Source::Side(h),
                    weight: 1.0,
                    visible: vec![vec![0..st.heads[h].pos.len()]],
                })
                .collect(),
            side: st
                .heads
                .iter()
                .enumerate()
                .map(|(h, head)| SideTable {
                    rows: F32Rows {
                        keys: &head.k,
                        values: &head.v,
                        kv_dim: hd,
                        first_head: h,
                    }
                    .into(),
                    positions: Some(&head.pos),
                })
                .collect(),
        }
    }

    fn wants_lse(&self) -> bool {
        true
    }

    /// The kept keys' probabilities join their scores; then eviction to the budget.
    fn after_attend(&mut self, ctx: &PlanContext<'_>, lse: &[f32]) {
        if !self.sparse_for(ctx.layer, ctx.n_tokens()) {
            return;
        }
        let Some(mut st) = self.layers[ctx.layer].take() else {
            return;
        };
        let (hd, group) = (ctx.shape.head_dim, ctx.shape.group());
        let level = Level::active();
        let n = ctx.pos0 + 1;
        for (h, head) in st.heads.iter_mut().enumerate() {
            accumulate(
                level,
                hd,
                ctx.group_queries(0, h),
                &lse[h * group..(h + 1) * group],
                head,
            );
            self.evict(head, n, hd);
        }
        self.layers[ctx.layer] = Some(st);
    }

    /// The scores of the positions kept still hold what the forgotten queries attended.
    fn rewinds_exactly(&self) -> bool {
        false
    }

    fn forget_from(&mut self, pos: usize) {
        for st in &mut self.layers {
            if pos == 0 {
                *st = None;
            } else if let Some(s) = st.as_mut() {
                s.truncate(pos);
            }
        }
    }

    /// The steady-state budget: `min(n, ceil(heavy · n) + ceil(recent · n)) / n` (the
    /// first step after a prompt reads everything once to seed the scores; dense layers
    /// read everything).
    fn fraction_read(&self, n_ctx: usize) -> f64 {
        if n_ctx == 0 {
            return 1.0;
        }
        let (heavy, recent) = self.settings.budget(n_ctx);
        (heavy + recent).min(n_ctx) as f64 / n_ctx as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend, read_set, AttnShape, DenseAttention, FixedReads};
    use crate::kv::{KvType, RamStore};

    use sparrow_attn::kernel::reference::uniform as rng;

    const SHAPE: AttnShape = AttnShape {
        n_head: 6,
        n_head_kv: 2,
        head_dim: 16,
    };
    const Q_DIM: usize = 96;
    const KV_DIM: usize = 32;

    fn h2o(heavy: f64, recent: f64) -> H2oAttention {
        H2oAttention::new(
            H2oSettings {
                heavy,
                recent,
                dense_layers: vec![],
            },
            2,
        )
        .unwrap()
    }

    fn random_cache(ty: KvType, n: usize, seed: u64) -> RamStore {
        let mut r = rng(seed);
        let mut c = RamStore::new(ty, 2, n, KV_DIM);
        for t in 0..n {
            let k: Vec<f32> = (0..KV_DIM).map(|_| r() * 2.0).collect();
            let v: Vec<f32> = (0..KV_DIM).map(|_| r()).collect();
            c.write(1, t, &k, &v);
        }
        c
    }

    #[test]
    fn settings_out_of_range_are_named() {
        for (heavy, recent, name) in [
            (0.0, 0.1, "heavy"),
            (1.5, 0.1, "heavy"),
            (f64::NAN, 0.1, "heavy"),
            (0.1, -0.2, "recent"),
            (0.1, 1.01, "recent"),
        ] {
            let e = H2oAttention::new(
                H2oSettings {
                    heavy,
                    recent,
                    dense_layers: vec![],
                },
                1,
            )
            .err()
            .unwrap();
            assert!(
                e.contains(name) && e.contains("0 <") && e.contains("<= 1"),
                "{e}"
            );
        }
        assert_eq!(H2oSettings::default().budget(95), (10, 10));
        assert_eq!(H2oSettings::default().budget(1), (1, 1));
    }

    /// With heavy + recent ≥ 1 nothing is ever evicted: every decode step (the seeding one
    /// and the later ones) equals dense attention.
    #[test]
    fn a_budget_covering_the_context_equals_dense() {
        for ty in [KvType::F32, KvType::F16] {
            let cache = random_cache(ty, 300, 4);
            let mut h = h2o(0.5, 0.5);
            let mut r = rng(8);
            for pos in 250..300 {
                let q: Vec<f32> = (0..Q_DIM).map(|_| r()).collect();
                let (mut want, mut got) = (vec![0f32; Q_DIM], vec![0f32; Q_DIM]);
                attend(&mut DenseAttention, SHAPE, &cache, 1, &q, pos, &mut want);
                attend(&mut h, SHAPE, &cache, 1, &q, pos, &mut got);
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-5, "{ty:?} pos {pos}: {a} vs {b}");
                }
                let kept = h.kept(1).unwrap();
                assert!(kept.iter().all(|k| k.len() == pos + 1));
            }
            assert_eq!(h.fraction_read(300), 1.0);
        }
    }

    /// Every step: the kept set fits the budget, holds the whole recent window (so the
    /// newest position), and the output is exact attention over what was read.
    #[test]
    fn kept_set_fits_the_budget_and_keeps_the_recent_window() {
        let cache = random_cache(KvType::F32, 400, 6);
        let mut h = h2o(0.1, 0.05);
        let mut r = rng(2);
        for pos in 200..400 {
            let q: Vec<f32> = (0..Q_DIM).map(|_| r()).collect();
            let read = read_set(&mut h, SHAPE, &cache, 1, &q, pos);
            let mut got = vec![0f32; Q_DIM];
            attend(&mut h, SHAPE, &cache, 1, &q, pos, &mut got);
            // The same as dense attention restricted to the read set (one kv head at a time).
            for (kv_head, ranges) in read.iter().enumerate() {
                let mut want = vec![0f32; Q_DIM];
                let mut exact = FixedReads(vec![ranges.clone(); 2]);
                attend(&mut exact, SHAPE, &cache, 1, &q, pos, &mut want);
                let want = &want[kv_head * 48..(kv_head + 1) * 48];
                for (a, b) in got[kv_head * 48..(kv_head + 1) * 48].iter().zip(want) {
                    assert!((a - b).abs() < 1e-5, "pos {pos}: {a} vs {b}");
                }
            }
            let n = pos + 1;
            let (heavy, recent) = h.settings().budget(n);
            for k in h.kept(1).unwrap() {
                assert!(
                    k.len() <= heavy + recent,
                    "{} > {heavy} + {recent}",
                    k.len()
                );
                assert!(k.windows(2).all(|w| w[0] < w[1]));
                assert!((n - recent..n).all(|p| k.binary_search(&p).is_ok()));
            }
        }
        assert!(h.fraction_read(400) < 0.16);
        // Layer 0 never decoded: it would read everything (the seeding step).
        let q = vec![0f32; Q_DIM];
        assert_eq!(
            read_set(&mut h, SHAPE, &cache, 0, &q, 9),
            vec![vec![0..10]; 2]
        );
    }

    /// A position whose key matches every query strongly collects attention and survives
    /// eviction while ordinary old positions go.
    #[test]
    fn a_heavy_hitter_survives_eviction() {
        let n = 600;
        let mut r = rng(12);
        let dir: Vec<f32> = (0..16).map(|_| r()).collect();
        let norm = dir.iter().map(|x| x * x).sum::<f32>().sqrt();
        let dir: Vec<f32> = dir.iter().map(|x| x / norm).collect();
        let mut cache = RamStore::new(KvType::F16, 2, n, KV_DIM);
        for t in 0..n {
            let mut k: Vec<f32> = (0..KV_DIM).map(|_| r() * 0.3).collect();
            if t == 37 {
                // Head 0's key points along every query: a score ~6 above the rest.
                for d in 0..16 {
                    k[d] = 6.0 * dir[d];
                }
            }
            let v: Vec<f32> = (0..KV_DIM).map(|_| r()).collect();
            cache.write(1, t, &k, &v);
        }
        let mut h = h2o(0.02, 0.02);
        for pos in 300..n {
            let q: Vec<f32> = (0..6)
                .flat_map(|_| dir.iter().map(|&x| 4.0 * x + 0.1 * r()).collect::<Vec<_>>())
                .collect();
            let mut out = vec![0f32; Q_DIM];
            attend(&mut h, SHAPE, &cache, 1, &q, pos, &mut out);
            let kept = h.kept(1).unwrap();
            assert!(kept[0].contains(&37), "evicted at {pos}: {:?}", kept[0]);
            assert!(kept[0].len() <= 24);
        }
        // Most old positions are gone.
        let kept = h.kept(1).unwrap();
        assert!(kept[0].iter().filter(|&&p| p < 500).count() <= 12);
    }

    #[test]
    fn rewinds_drop_state_and_later_positions() {
        let cache = random_cache(KvType::F32, 120, 3);
        let mut h = h2o(0.1, 0.1);
        let q = vec![0.3f32; Q_DIM];
        let mut out = vec![0f32; Q_DIM];
        for pos in 80..120 {
            attend(&mut h, SHAPE, &cache, 1, &q, pos, &mut out);
        }
        h.forget_from(100);
        assert!(h.kept(1).unwrap().iter().flatten().all(|&p| p < 100));
        // The next step re-adds the positions written since and reads them.
        let read = read_set(&mut h, SHAPE, &cache, 1, &q, 100);
        assert!(read[0].last().unwrap().contains(&100));
        h.forget_from(0);
        assert!(h.kept(1).is_none());
        // Prefill rows and dense layers are exact.
        let q2 = vec![0.1f32; 2 * Q_DIM];
        let (mut a, mut b) = (vec![0f32; 2 * Q_DIM], vec![0f32; 2 * Q_DIM]);
        attend(&mut h, SHAPE, &cache, 1, &q2, 50, &mut a);
        attend(&mut DenseAttention, SHAPE, &cache, 1, &q2, 50, &mut b);
        assert_eq!(a, b);
        assert!(h.kept(1).is_none());
    }
}
