//! The Saap policy against f64 references and full attention.

use super::settings::RANKED;
use super::*;
use crate::attention::{attend, read_set, AttnShape, DenseAttention};
use crate::kv::{ArrangedStore, BlockTable, KvStore, KvType, RamStore, StoreLayer};
use crate::policy::AttentionChoice;
use crate::synthetic::synthetic_saap_index;
use crate::synthetic::{synthetic_config, SyntheticSpec};
use sparrow_attn::policy::rank_key;

fn model() -> crate::ModelConfig {
    synthetic_config(&SyntheticSpec::default()).unwrap()
}

fn shape(m: &crate::ModelConfig) -> AttnShape {
    AttnShape {
        n_head: m.n_head,
        n_head_kv: m.n_head_kv,
        head_dim: m.head_dim,
    }
}

/// A cache of `n` positions of pseudo-random keys for every layer.
fn cache(m: &crate::ModelConfig, n: usize) -> RamStore {
    let kv_dim = m.kv_dim();
    let mut c = RamStore::new(KvType::F32, m.n_layer, n, kv_dim);
    for l in 0..m.n_layer {
        for t in 0..n {
            let k: Vec<f32> = (0..kv_dim)
                .map(|d| (((t * 31 + d * 7 + l * 5) % 23) as f32 - 11.0) / 7.0)
                .collect();
            c.write(l, t, &k, &k);
        }
    }
    c
}

/// Feed every complete block of `cache` (positions `0..n`) to `p`, as the engine does.
fn seal(p: &mut SaapAttention, m: &crate::ModelConfig, c: &RamStore, n: usize) {
    let (bs, kv_dim) = (p.settings.block, m.kv_dim());
    let mut keys = vec![0f32; bs * kv_dim];
    for l in 0..m.n_layer {
        for b in 0..n / bs {
            c.read_keys(l, b * bs, &mut keys);
            p.on_block_sealed(
                l,
                b,
                KeysView::new(&keys, bs, m.n_head_kv, m.head_dim).unwrap(),
            );
        }
    }
}

fn policy(m: &crate::ModelConfig, s: SaapSettings, c: usize) -> SaapAttention {
    SaapAttention::new(s, Arc::new(synthetic_saap_index(m, c, 8, 7)), Rope::of(m)).unwrap()
}

/// The inverted lists (the bucket routers') and the buckets of positions (the cells
/// router's) equal a brute-force assignment of the de-roped keys, and a rewind leaves them
/// as if the forgotten blocks had never been sealed.
#[test]
fn lists_equal_brute_force_assignment_and_rewinds_prune_them() {
    for router in [Router::Cells, Router::Hedged] {
        lists_equal_brute_force_assignment(router);
    }
}

fn lists_equal_brute_force_assignment(router: Router) {
    let m = model();
    let n = 200;
    let c = cache(&m, n);
    let s = SaapSettings {
        router,
        ..Default::default()
    };
    let mut p = policy(&m, s, 5);
    seal(&mut p, &m, &c, n);
    let rope = Rope::of(&m);
    let hd = m.head_dim;
    let index = p.index.clone();
    let brute = |upto: usize, layer: usize, h: usize| -> Vec<Vec<u32>> {
        let mut lists = vec![Vec::new(); 5];
        let mut k = vec![0f32; m.kv_dim()];
        for t in 0..upto {
            c.read_keys(layer, t, &mut k);
            rope.unrotate(&mut k, hd, t);
            let key = &k[h * hd..(h + 1) * hd];
            let model = index.head(layer, h);
            // Nearest by the index's own rule, scored in f64.
            let best = (0..5)
                .max_by(|&a, &b| {
                    let s = |x: usize| {
                        key.iter()
                            .zip(&model.centroids[x * hd..(x + 1) * hd])
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            + model.centroid_bias[x] as f64
                    };
                    s(a).total_cmp(&s(b))
                })
                .unwrap();
            lists[best].push(t as u32);
        }
        lists
    };
    let sealed = n / 16 * 16;
    for l in 1..m.n_layer {
        for h in 0..m.n_head_kv {
            assert_eq!(
                p.layers[l].heads[h].bucket_lists(5),
                brute(sealed, l, h),
                "layer {l} head {h}"
            );
        }
    }
    assert!(
        p.layers[0]
            .heads
            .iter()
            .all(|h| h.bucket_lists(5).iter().all(Vec::is_empty)),
        "layer 0 is dense"
    );
    p.forget_from(70);
    for l in 1..m.n_layer {
        assert_eq!(p.layers[l].assigned, 64);
        assert_eq!(p.layers[l].heads[0].bucket_lists(5), brute(64, l, 0));
    }
    seal(&mut p, &m, &c, n);
    for l in 1..m.n_layer {
        assert_eq!(p.layers[l].heads[1].bucket_lists(5), brute(sealed, l, 1));
    }
}

/// The synthetic model, its shape, a cache of `n` positions and one decode query whose
/// `i`-th value is `value(i)`.
fn decode_case(
    n: usize,
    value: impl Fn(usize) -> f32,
) -> (crate::ModelConfig, AttnShape, RamStore, Vec<f32>) {
    let m = model();
    let sh = shape(&m);
    let c = cache(&m, n);
    let q = (0..sh.q_dim()).map(value).collect();
    (m, sh, c, q)
}

/// The buckets of `p`'s KV head `h` in `layer`, most mass first under its router for
/// the decode query `q` at position `n - 1` of `c`, recomputed here (the oracle's in f64
/// from the keys of `c`).
fn ranked_buckets(
    p: &SaapAttention,
    m: &crate::ModelConfig,
    c: &RamStore,
    q: &[f32],
    layer: usize,
    h: usize,
    n: usize,
) -> Vec<usize> {
    let model = p.index.head(layer, h);
    let (group, hd) = (m.n_head / m.n_head_kv, m.head_dim);
    let mut qg = q[h * group * hd..(h + 1) * group * hd].to_vec();
    if p.settings.oracle {
        let kv_dim = m.n_head_kv * hd;
        let mut keys = vec![0f32; n * kv_dim];
        c.read_keys(layer, 0, &mut keys);
        let mut key_mass = vec![0f64; n];
        for row in qg.chunks_exact(hd) {
            let s: Vec<f64> = keys
                .chunks_exact(kv_dim)
                .map(|k| {
                    let k = &k[h * hd..(h + 1) * hd];
                    let dot: f64 = k.iter().zip(row).map(|(a, b)| *a as f64 * *b as f64).sum();
                    dot / (hd as f64).sqrt()
                })
                .collect();
            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
            key_mass
                .iter_mut()
                .zip(&s)
                .for_each(|(w, x)| *w += (x - mx).exp() / z);
        }
        let end = n - p.settings.window;
        let lists = &p.layers[layer].heads[h].buckets;
        let mass: Vec<f64> = lists
            .iter()
            .map(|l| {
                l.iter()
                    .filter(|&&x| x >= 1 && (x as usize) < end)
                    .map(|&x| key_mass[x as usize])
                    .sum()
            })
            .collect();
        let mut order: Vec<usize> = (0..mass.len()).collect();
        order.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]));
        return order;
    }
    Rope::of(m).unrotate(&mut qg, hd, n - 1);
    let mut mass = vec![0f32; model.clusters()];
    let weights = router_weights(&p.copies, model, layer * m.n_head_kv + h);
    let (level, scratch) = (Level::active(), &mut Scratch::default());
    model.add_mass(p.settings.router, weights, level, &qg, scratch, &mut mass);
    let mut order: Vec<usize> = (0..mass.len()).collect();
    order.sort_by(|&a, &b| mass[b].total_cmp(&mass[a]));
    order
}

/// Probing every bucket reads everything: exact attention, bit for bit. Fewer probes
/// read the sink, the window and the chosen buckets' positions — and nothing else.
#[test]
fn all_probes_equal_full_and_fewer_read_the_chosen_buckets() {
    let n = 300;
    let (m, sh, c, q) = decode_case(n, |i| ((i * 13 % 7) as f32 - 3.0) / 2.0);
    let s = SaapSettings {
        window: 32,
        probes: Some(6),
        router: Router::Hedged,
        ..Default::default()
    };
    let mut all = policy(&m, s.clone(), 6);
    seal(&mut all, &m, &c, n);
    for layer in 0..m.n_layer {
        let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
        attend(&mut all, sh, &c, layer, &q, n - 1, &mut a);
        attend(&mut DenseAttention, sh, &c, layer, &q, n - 1, &mut b);
        assert_eq!(a, b, "layer {layer}");
    }
    let routers = [Router::Hedged, Router::Qmodel, Router::Centroids].map(|r| (r, false));
    for (router, oracle) in routers.into_iter().chain([(Router::Hedged, true)]) {
        let s = SaapSettings {
            probes: Some(2),
            router,
            oracle,
            ..s.clone()
        };
        reads_the_chosen_buckets(&m, &c, n, &q, s);
    }
}

/// The positions `s` (2 of 6 buckets) reads in layer 1 for a decode query `q` at the
/// end of `c` (`n` positions): the sink, the window and the two buckets with the most mass under
/// its router, recomputed here.
fn reads_the_chosen_buckets(
    m: &crate::ModelConfig,
    c: &RamStore,
    n: usize,
    q: &[f32],
    s: SaapSettings,
) {
    let (sh, router) = (shape(m), s.router);
    let mut few = policy(m, s, 6);
    seal(&mut few, m, c, n);
    let layer = 1;
    let read = read_set(&mut few, sh, c, layer, q, n - 1);
    for (h, ranges) in read.iter().enumerate() {
        let got: Vec<usize> = ranges.iter().cloned().flatten().collect();
        let order = ranked_buckets(&few, m, c, q, layer, h, n);
        let mut want: Vec<usize> = order[..2]
            .iter()
            .flat_map(|&b| {
                few.layers[layer].heads[h].buckets[b]
                    .iter()
                    .map(|&p| p as usize)
            })
            .filter(|&p| p >= 1 && p < n - 32)
            .collect();
        want.push(0);
        want.extend(n - 32..n);
        want.sort_unstable();
        assert_eq!(
            got, want,
            "{router:?}, oracle {}, head {h}",
            few.settings.oracle
        );
        assert!(
            got.len() < n,
            "two of six buckets read less than everything"
        );
    }
}

/// With a budget, the step reads the top buckets in rank order that fit in that share
/// of the context (sink and window included), at least one: no more, no fewer — with
/// few buckets, and with more than are ranked up front ([`RANKED`]).
#[test]
fn a_budget_reads_the_top_buckets_that_fit() {
    let n = 300;
    let (m, sh, c, q) = decode_case(n, |i| ((i * 7 % 11) as f32 - 5.0) / 3.0);
    let cases = [0.05, 0.3, 0.7, 1.0].map(|b| (b, 6)).into_iter();
    for (budget, clusters) in cases.chain([(0.7, RANKED + 72), (1.0, RANKED + 72)]) {
        let s = SaapSettings {
            window: 32,
            budget,
            router: Router::Hedged,
            ..Default::default()
        };
        let mut p = policy(&m, s, clusters);
        seal(&mut p, &m, &c, n);
        let layer = 1;
        let read = read_set(&mut p, sh, &c, layer, &q, n - 1);
        let window_start = n - 32;
        let dense = 1 + (n - window_start);
        let target = ((budget * n as f64).ceil() as usize).saturating_sub(dense);
        for (h, ranges) in read.iter().enumerate() {
            let got: Vec<usize> = ranges
                .iter()
                .cloned()
                .flatten()
                .filter(|&p| p >= 1 && p < window_start)
                .collect();
            let order = ranked_buckets(&p, &m, &c, &q, layer, h, n);
            let bucket = |b: usize| -> Vec<usize> {
                p.layers[layer].heads[h].buckets[b]
                    .iter()
                    .map(|&x| x as usize)
                    .filter(|&x| x >= 1 && x < window_start)
                    .collect()
            };
            // The top buckets that fit in the target, at least one.
            let (mut want, mut k) = (Vec::new(), 0);
            while k < clusters && (k == 0 || want.len() + bucket(order[k]).len() <= target) {
                want.extend(bucket(order[k]));
                k += 1;
            }
            want.sort_unstable();
            assert_eq!(got, want, "budget {budget}, head {h}");
            assert!(k == 1 || got.len() <= target, "budget {budget}");
            if k < clusters {
                let next = bucket(order[k]).len();
                assert!(
                    k == 1 || got.len() + next > target,
                    "the next one would fit"
                );
            }
            if budget == 1.0 {
                assert_eq!(got.len(), window_start - 1, "everything before the window");
            }
        }
    }
}

/// The rows of `c` (positions `0..n`) in a store arranged by `p`'s buckets, sealed as the
/// engine seals them (each block's placement passed on); `p` has seen every block.
fn arranged(
    p: &mut SaapAttention,
    m: &crate::ModelConfig,
    c: &RamStore,
    n: usize,
) -> ArrangedStore {
    let partitions: Vec<_> = (0..m.n_layer).map(|l| p.partition(l)).collect();
    let arranged = crate::kv::arranged::arranged_layers(&partitions, &vec![None; m.n_layer]);
    let kept = arranged.iter().filter(|a| !**a).count();
    let inner = Box::new(RamStore::new(KvType::F32, kept, n, m.kv_dim()));
    let mut a = ArrangedStore::new(inner, &arranged, &partitions, (n, m.head_dim), None).unwrap();
    assert_eq!(a.arranged_layers(), m.n_layer - 1, "layer 0 is dense");
    let mut blocks = BlockTable::new(p.settings.block, m.n_layer);
    let (mut k, mut v) = (vec![0f32; m.kv_dim()], vec![0f32; m.kv_dim()]);
    p.forget_from(0);
    for l in 0..m.n_layer {
        for t in 0..n {
            c.read_keys(l, t, &mut k);
            c.read_values(l, t, &mut v);
            a.append(l, t, &k, &v).unwrap();
        }
        blocks.seal(shape(m), &mut a, l, n, p).unwrap();
    }
    a
}

/// Read from a store that keeps the sparse layers by bucket, a step reads the same
/// positions as from a store kept by position and gets the same attention (to rounding:
/// the keys come in another order) — after a rewind too, which takes rows out of their
/// buckets and files them again.
#[test]
fn a_store_in_bucket_order_serves_the_reads_a_store_by_position_does() {
    // At 330 positions the window starts in the cells' open segment (positions 288..336,
    // not sorted by the store yet); at 300 in a complete one.
    let cases = [
        (300, Router::Hedged, Some(1), 0.05),
        (300, Router::Hedged, Some(3), 0.05),
        (300, Router::Hedged, None, 0.3),
        (300, Router::Cells, None, 0.1),
        (330, Router::Cells, None, 0.1),
        (330, Router::Cells, None, 0.3),
    ];
    for (n, router, probes, budget) in cases {
        let (m, sh, c, q) = decode_case(n, |i| ((i * 5 % 9) as f32 - 4.0) / 3.0);
        let settings = |layout| SaapSettings {
            window: 32,
            probes,
            budget,
            layout,
            router,
            ..Default::default()
        };
        let mut by_bucket = policy(&m, settings(Layout::Buckets), 6);
        let mut by_position = policy(&m, settings(Layout::Positions), 6);
        let mut store = arranged(&mut by_bucket, &m, &c, n);
        seal(&mut by_position, &m, &c, n);
        for rewind in [None, Some(150)] {
            if let Some(at) = rewind {
                by_bucket.forget_from(at);
                by_position.forget_from(at);
                seal(&mut by_position, &m, &c, n);
                let mut blocks = BlockTable::new(by_bucket.settings.block, m.n_layer);
                let (mut k, mut v) = (vec![0f32; m.kv_dim()], vec![0f32; m.kv_dim()]);
                for l in 0..m.n_layer {
                    // The rewind's rows written again, then every block sealed again.
                    for t in at..n {
                        c.read_keys(l, t, &mut k);
                        c.read_values(l, t, &mut v);
                        store.append(l, t, &k, &v).unwrap();
                    }
                    blocks.seal(sh, &mut store, l, n, &mut by_bucket).unwrap();
                }
            }
            for layer in 1..m.n_layer {
                let a = read_set(&mut by_bucket, sh, &store, layer, &q, n - 1);
                let b = read_set(&mut by_position, sh, &c, layer, &q, n - 1);
                assert_eq!(a, b, "{n} {router:?} {probes:?} {budget} layer {layer}");
                assert!(a
                    .iter()
                    .all(|r| r.iter().map(|r| r.len()).sum::<usize>() < n));
                // The plan really reads slots of the store's buckets.
                let plan = by_bucket.plan(&PlanContext {
                    layer,
                    shape: sh,
                    pos0: n - 1,
                    q: &q,
                    store: &StoreLayer {
                        store: &store,
                        layer,
                    },
                });
                assert!(plan.entries.iter().any(|e| e.source == Source::Slots));
                let (mut x, mut y) = (vec![0f32; q.len()], vec![0f32; q.len()]);
                attend(&mut by_bucket, sh, &store, layer, &q, n - 1, &mut x);
                attend(&mut by_position, sh, &c, layer, &q, n - 1, &mut y);
                for (i, (x, y)) in x.iter().zip(&y).enumerate() {
                    assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{i}: {x} vs {y}");
                }
            }
        }
    }
}

/// A cache of `n` positions of keys without repeats (`cache`'s repeat every 23
/// positions, which would tie cells).
fn distinct_cache(m: &crate::ModelConfig, n: usize) -> RamStore {
    let kv_dim = m.kv_dim();
    let mut c = RamStore::new(KvType::F32, m.n_layer, n, kv_dim);
    let mut x = 0x2545_f491u32;
    for l in 0..m.n_layer {
        for t in 0..n {
            let k: Vec<f32> = (0..kv_dim)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    (x % 4001) as f32 / 1000.0 - 2.0
                })
                .collect();
            c.write(l, t, &k, &k);
        }
    }
    c
}

/// The cells router reads the sink, the window and the top cells that fit in the budget
/// (at least one), ranked by an f64 reference of each cell's estimated log-mass (the
/// exponent of its longest RoPE'd key's logit for the group's summed query, plus the
/// other keys' count times the exponent of their mean logit, in log);
/// at a full budget, exact attention. The same after a rewind (cells refolded), from
/// either layout, at head sizes 16 and 32.
#[test]
fn cells_read_the_top_cells_that_fit() {
    let n = 300;
    // The case tells a count-and-mean ranking from a slightly different one, and reads
    // halos that add positions.
    let (mut sensitive, mut halos_read) = (false, false);
    let wide = SyntheticSpec {
        n_embd: 128,
        ..Default::default()
    };
    for m in [model(), synthetic_config(&wide).unwrap()] {
        let sh = shape(&m);
        let c = distinct_cache(&m, n);
        // Small enough that a cell's count weighs against its mean logit in the ranking.
        let q: Vec<f32> = (0..sh.q_dim())
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 60.0)
            .collect();
        let (hd, group, window) = (m.head_dim, m.n_head / m.n_head_kv, 32);
        let end = n - window;
        // Segments of 4: more cells than are ranked up front (MIN_RANKED_CELLS).
        let cases = [Layout::Buckets, Layout::Positions]
            .map(|l| (l, 64))
            .into_iter();
        let cases = cases.chain([(Layout::Buckets, 4)]);
        for ((layout, segment), halo) in cases.flat_map(|c| [(c, 0), (c, 6)]) {
            for budget in [0.1, 0.3, 1.0] {
                let s = SaapSettings {
                    window,
                    budget,
                    layout,
                    router: Router::Cells,
                    segment: Some(segment),
                    halo,
                    ..Default::default()
                };
                let mut p = policy(&m, s, 6);
                seal(&mut p, &m, &c, n);
                for rewind in [false, true] {
                    if rewind {
                        read_set(&mut p, sh, &c, 1, &q, n - 1);
                        p.forget_from(150);
                        seal(&mut p, &m, &c, n);
                    }
                    let layer = 1;
                    let read = read_set(&mut p, sh, &c, layer, &q, n - 1);
                    let target = ((budget * n as f64).ceil() as usize).saturating_sub(1 + window);
                    let mut key = vec![0f32; m.kv_dim()];
                    for (h, ranges) in read.iter().enumerate() {
                        let got: Vec<usize> = ranges
                            .iter()
                            .cloned()
                            .flatten()
                            .filter(|&x| x >= 1 && x < end)
                            .collect();
                        let qsum: Vec<f64> = (0..hd)
                            .map(|i| (0..group).map(|g| q[(h * group + g) * hd + i] as f64).sum())
                            .collect();
                        let lists = p.layers[layer].heads[h].bucket_lists(6);
                        // Every (segment, bucket) with keys, scored from the definition.
                        let sealed = n / 16 * 16;
                        // Per cell: its score, readable positions, longest key's position
                        // and logit.
                        type Cell = (f64, Vec<usize>, usize, f64);
                        let mut cells: Vec<Cell> = Vec::new();
                        let mut mis_scored: Vec<Cell> = Vec::new();
                        for seg in 0..end.div_ceil(segment) {
                            for list in &lists {
                                let in_cell = |x: usize| x >= 1 && x / segment == seg && x < sealed;
                                let all: Vec<usize> = list
                                    .iter()
                                    .map(|&x| x as usize)
                                    .filter(|&x| in_cell(x))
                                    .collect();
                                if all.is_empty() {
                                    continue;
                                }
                                // Per key: its logit for the group's summed query
                                // (over the group size and √head_dim) and its length.
                                let scale = 1.0 / (group as f64 * (hd as f64).sqrt());
                                let per_key: Vec<(f64, f64)> = all
                                    .iter()
                                    .map(|&x| {
                                        c.read_keys(layer, x, &mut key);
                                        let k = &key[h * hd..(h + 1) * hd];
                                        let dot: f64 =
                                            k.iter().zip(&qsum).map(|(&k, &q)| k as f64 * q).sum();
                                        let norm: f64 =
                                            k.iter().map(|&k| k as f64 * k as f64).sum();
                                        (dot * scale, norm)
                                    })
                                    .collect();
                                // The first longest key alone, the rest by their mean.
                                let longest = (0..per_key.len())
                                    .reduce(|b, i| if per_key[i].1 > per_key[b].1 { i } else { b })
                                    .unwrap();
                                let rest = per_key.len() - 1;
                                let score = |times: f64| {
                                    let one = (per_key[longest].0 * times).exp();
                                    let others = if rest == 0 {
                                        0.0
                                    } else {
                                        let sum: f64 = per_key.iter().map(|k| k.0).sum();
                                        let mean = (sum - per_key[longest].0) / rest as f64;
                                        rest as f64 * (mean * times).exp()
                                    };
                                    (one + others).ln()
                                };
                                let at = all[longest];
                                let readable: Vec<usize> =
                                    all.into_iter().filter(|&x| x < end).collect();
                                let sharp = |times: f64| per_key[longest].0 * times;
                                cells.push((score(1.0), readable.clone(), at, sharp(1.0)));
                                // Scored as a sum over the group instead of its mean.
                                let wrong =
                                    (score(group as f64), readable, at, sharp(group as f64));
                                mis_scored.push(wrong);
                            }
                        }
                        // The top cells that fit, a sharp one (its longest key at least half
                        // its mass, below `end`) counting `halo` more; then each sharp
                        // cell's halo, a quarter before its longest key.
                        let fill = |mut cells: Vec<Cell>| {
                            if target >= end - 1 {
                                return (false, (1..end).collect());
                            }
                            cells.sort_by(|a, b| b.0.total_cmp(&a.0));
                            let (mut want, mut cost, mut centres) = (Vec::new(), 0, Vec::new());
                            for (k, (score, positions, at, longest)) in cells.iter().enumerate() {
                                let sharp = halo > 0
                                    && !positions.is_empty()
                                    && *at < end
                                    && *longest >= score - std::f64::consts::LN_2;
                                let extra = if sharp { halo } else { 0 };
                                if k > 0 && cost + positions.len() + extra > target {
                                    break;
                                }
                                want.extend(positions);
                                cost += positions.len() + extra;
                                if sharp {
                                    centres.push(*at);
                                }
                            }
                            want.sort_unstable();
                            let in_cells = want.len();
                            for at in centres {
                                let from = at.saturating_sub(halo / 4).max(1);
                                want.extend(from..(at + halo - halo / 4).min(end));
                            }
                            want.sort_unstable();
                            want.dedup();
                            (want.len() > in_cells, want)
                        };
                        let (more, want) = fill(cells);
                        halos_read |= more;
                        sensitive |= want != fill(mis_scored).1;
                        assert_eq!(
                            got, want,
                            "{layout:?} segment {segment} budget {budget} rewind {rewind} head {h}"
                        );
                        if budget < 1.0 {
                            assert!(got.len() < end - 1, "a budget reads less than everything");
                        }
                    }
                    if budget == 1.0 {
                        for layer in 0..m.n_layer {
                            let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
                            attend(&mut p, sh, &c, layer, &q, n - 1, &mut a);
                            attend(&mut DenseAttention, sh, &c, layer, &q, n - 1, &mut b);
                            assert_eq!(a, b, "full budget, layer {layer}");
                        }
                    }
                }
            }
        }
    }
    assert!(
        sensitive,
        "the case cannot tell the group's mean logit from its sum"
    );
    assert!(halos_read, "no halo read more than the cells");
}

/// Without `--saap-segment` the cells router cuts segments of 8 × C positions, whatever
/// C the index has: a policy at the default reads what one told 8 × C reads.
#[test]
fn the_default_segment_is_eight_keys_per_bucket() {
    let d = SaapSettings::default();
    assert_eq!(d.segment_for(256), 2048);
    assert_eq!(d.segment_for(1024), 8192);
    let told = SaapSettings {
        segment: Some(40),
        ..d.clone()
    };
    assert_eq!(told.segment_for(128), 40);
    let (n, m) = (300, model());
    let sh = shape(&m);
    let c = distinct_cache(&m, n);
    let q: Vec<f32> = (0..sh.q_dim())
        .map(|i| ((i * 5 % 13) as f32 - 6.0) / 50.0)
        .collect();
    let read = |segment| {
        let s = SaapSettings {
            window: 32,
            budget: 0.3,
            segment,
            ..Default::default()
        };
        let mut p = policy(&m, s, 6);
        seal(&mut p, &m, &c, n);
        read_set(&mut p, sh, &c, 1, &q, n - 1)
    };
    assert_eq!(read(None), read(Some(48)), "8 × C = 48 at C = 6");
    assert_ne!(read(None), read(Some(300)), "a segment the default is not");
}

/// A read limit caps the budget: a full budget capped at 90 positions reads what a 30%
/// budget does at 300 (⌈0.3 · 300⌉ = 90), for the bucket and the cell routers, and the
/// policy reports that share.
#[test]
fn the_read_limit_caps_the_budget() {
    let n = 300;
    let m = model();
    let sh = shape(&m);
    let c = distinct_cache(&m, n);
    let q: Vec<f32> = (0..sh.q_dim())
        .map(|i| ((i * 7 % 11) as f32 - 5.0) / 60.0)
        .collect();
    for router in [Router::Hedged, Router::Cells] {
        let at = |budget, max_read| {
            let s = SaapSettings {
                window: 32,
                budget,
                max_read,
                router,
                segment: Some(64),
                ..Default::default()
            };
            let mut p = policy(&m, s, 6);
            seal(&mut p, &m, &c, n);
            let read = read_set(&mut p, sh, &c, 1, &q, n - 1);
            (read, p.fraction_read(n))
        };
        let (share, share_fraction) = at(0.3, 0);
        let (capped, capped_fraction) = at(1.0, 90);
        let (uncapped, _) = at(1.0, 0);
        assert_eq!(capped, share, "{router:?}");
        assert_ne!(capped, uncapped, "{router:?}: the cap changes the read");
        assert_eq!(capped_fraction, share_fraction);
        assert_eq!(capped_fraction, 90.0 / n as f64);
    }
}

/// Rank keys sort as scores descending (an f64-free reference: the scores' own order,
/// NaN last), ties by cell.
#[test]
fn rank_keys_sort_by_score_descending_then_cell() {
    let scores = [
        0.5,
        -0.0,
        0.0,
        -3.25,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-30,
        -1e-30,
        0.5,
        7.0,
        -f32::NAN,
    ];
    let mut keys: Vec<u64> = (0..scores.len() as u32)
        .map(|c| rank_key(scores[c as usize], c))
        .collect();
    keys.sort_unstable();
    let got: Vec<u32> = keys.iter().map(|&k| k as u32).collect();
    let mut want: Vec<u32> = (0..scores.len() as u32).collect();
    let value = |c: u32| {
        let s = scores[c as usize];
        if s.is_nan() {
            f64::NEG_INFINITY
        } else {
            s as f64
        }
    };
    // -0.0 and 0.0 differ by bits, as `total_cmp` orders them.
    want.sort_by(|&a, &b| {
        let (x, y) = (scores[a as usize], scores[b as usize]);
        value(b)
            .total_cmp(&value(a))
            .then(if x == 0.0 && y == 0.0 {
                y.total_cmp(&x)
            } else {
                std::cmp::Ordering::Equal
            })
            .then(a.cmp(&b))
    });
    assert_eq!(got, want);
}

#[test]
fn settings_are_checked() {
    let mut s = SaapSettings::default();
    assert!(s.validate().is_ok());
    s.probes = Some(0);
    assert!(s.validate().unwrap_err().contains("probes"));
    for budget in [0.0, -0.1, 1.5, f64::NAN] {
        let s = SaapSettings {
            budget,
            ..Default::default()
        };
        assert!(s.validate().unwrap_err().contains("budget"), "{budget}");
    }
    let s = SaapSettings {
        window: 8,
        ..Default::default()
    };
    assert!(s.validate().unwrap_err().contains("window"));
    let cells = SaapSettings {
        router: Router::Cells,
        ..Default::default()
    };
    assert!(cells.validate().is_ok());
    for bad in [
        SaapSettings {
            segment: Some(0),
            ..cells.clone()
        },
        SaapSettings {
            probes: Some(4),
            ..cells.clone()
        },
        SaapSettings {
            oracle: true,
            ..cells.clone()
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
    // A missing index is refused at build with what to do about it.
    let choice = AttentionChoice::named("saap").with(SaapSettings {
        index: Some("/nonexistent/x.saap".into()),
        ..Default::default()
    });
    let e = choice.build(&model()).err().unwrap();
    assert!(e.contains("/nonexistent/x.saap"), "{e}");
}
