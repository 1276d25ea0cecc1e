//! How closely an attention policy follows exact attention on real activations.
//!
//! A prompt of `N` tokens is run through the model with exact attention; the query rows of
//! the last positions are recorded on the way (a wrapper backend that stores each layer's
//! queries and delegates to [`DenseAttention`]), so every layer has the decode query of
//! position `N - 1` and a cache holding all `N` positions. Each policy is then built fresh,
//! fed every sealed block of every layer, and asked to attend with the recorded queries.
//! Per layer and query head this gives:
//!
//! - **selectivity**: store positions the policy's plan reads ([`read_set`]) for the head's
//!   KV head, over `N`;
//! - **relative L2 error** `‖o_P − o_full‖ / ‖o_full‖` of the attention output;
//! - **attention mass captured**: the sum of the exact softmax probabilities (in f64, from
//!   the cached keys) over the positions the policy reads.
//!
//! Policies that cannot decode (XAttention) are measured on the last prefill rows instead:
//! only the error and the policy's own [`SparsePolicy::fraction_read`] are reported.
//! Everything goes through the [`SparsePolicy`] trait and the executor, so a policy's
//! internals do not matter here.

use serde::Serialize;
use sparrow::attention::{
    attend, read_set, AttentionChoice, AttnShape, DenseAttention, PlanContext, ReadPlan,
    SparsePolicy,
};
use sparrow::kv::StoreLayer;
use sparrow::kv::{BlockTable, DEFAULT_BLOCK};
use sparrow::model::ModelConfig;
use sparrow::model::{Logits, Model, State};
use sparrow::tokenizer::Tokenizer;
use sparrow::{Error, Result};
use sparrow_attn::kernel::read_f32;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Query rows of the last prefill batch recorded for prefill-only policies.
pub const DEFAULT_TAIL: usize = 64;

/// Query rows recorded per layer: `(pos0, rows)` for each attention call.
type Recorded = Arc<Mutex<Vec<Vec<(usize, Vec<f32>)>>>>;

/// Exact attention that keeps a copy of every query batch it is handed.
struct RecordingAttention {
    rows: Recorded,
}

impl SparsePolicy for RecordingAttention {
    fn name(&self) -> &str {
        "full"
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        {
            let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
            if rows.len() <= ctx.layer {
                rows.resize_with(ctx.layer + 1, Vec::new);
            }
            rows[ctx.layer].push((ctx.pos0, ctx.q.to_vec()));
        }
        ReadPlan::causal(ctx.shape, ctx.pos0, ctx.n_tokens())
    }
}

/// The model's activations at the end of a prompt: the cache with all `n_ctx` positions
/// and, per layer, the query rows of the last `tail` positions.
pub struct Capture {
    /// The sequence state; `state.kv()` holds positions `0..n_ctx` of every layer.
    pub state: State,
    pub shape: AttnShape,
    /// The model's hyper-parameters (policies are built for them).
    pub config: ModelConfig,
    /// Positions in the cache (`N`); the decode query is at `N - 1`.
    pub n_ctx: usize,
    /// Recorded query rows per layer (the last one is the decode query).
    pub tail: usize,
    /// Per layer: `tail` rows of `n_head * head_dim`, for positions `n_ctx - tail..n_ctx`.
    pub queries: Vec<Vec<f32>>,
}

/// The first `n` tokens of `text` (with the model's BOS when it wants one; special-token
/// text is not parsed), or an error when the text is shorter.
pub fn text_tokens(tokenizer: &Tokenizer, text: &str, n: usize) -> Result<Vec<u32>> {
    // Tokenize a growing prefix instead of a whole book.
    let mut bytes = (n * 6).max(256);
    loop {
        let mut end = bytes.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let ids = tokenizer.encode(&text[..end], true, false);
        if ids.len() >= n {
            return Ok(ids[..n].to_vec());
        }
        if end == text.len() {
            return Err(Error::Other(format!(
                "the text holds only {} tokens, fewer than the {n} asked for",
                ids.len()
            )));
        }
        bytes *= 2;
    }
}

/// Run `tokens` through `model` with exact attention: prefill all but the last `tail`
/// positions in batches of `batch_size` (calling `progress(done, total)` after each), then
/// the last `tail - 1` positions in one batch and the last one alone (a decode step), with
/// their query rows recorded.
pub fn capture(
    model: &Model,
    tokens: &[u32],
    kv: impl Into<sparrow::KvOptions>,
    batch_size: usize,
    tail: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<Capture> {
    let n = tokens.len();
    if model.config.has_sliding_layers() {
        return Err(Error::Unsupported(format!(
            "attention evaluation of a {} model: its sliding-window layers are not compared \
             against full attention yet",
            model.config.arch.name()
        )));
    }
    if n < 2 {
        return Err(Error::Other(
            "attention evaluation needs at least 2 tokens".into(),
        ));
    }
    let tail = tail.clamp(1, n);
    let c = &model.config;
    let shape = AttnShape {
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim: c.head_dim,
    };
    let mut state = model.new_state(n, kv)?;
    state.set_attention(Box::new(DenseAttention));
    let head = n - tail;
    let batch = batch_size.max(1);
    progress(0, n);
    for start in (0..head).step_by(batch) {
        let end = (start + batch).min(head);
        model.forward(&mut state, &tokens[start..end], Logits::None)?;
        progress(end, n);
    }
    let rows: Recorded = Arc::default();
    state.set_attention(Box::new(RecordingAttention { rows: rows.clone() }));
    if tail > 1 {
        model.forward(&mut state, &tokens[head..n - 1], Logits::None)?;
    }
    model.forward(&mut state, &tokens[n - 1..], Logits::None)?;
    progress(n, n);
    state.set_attention(Box::new(DenseAttention));

    let q_dim = shape.n_head * shape.head_dim;
    let rows = std::mem::take(&mut *rows.lock().unwrap_or_else(|e| e.into_inner()));
    let mut queries = Vec::with_capacity(c.n_layer);
    for layer in 0..c.n_layer {
        let mut q = Vec::with_capacity(tail * q_dim);
        for (pos0, batch) in rows.get(layer).map(|r| r.as_slice()).unwrap_or(&[]) {
            debug_assert_eq!(*pos0, head + q.len() / q_dim);
            q.extend_from_slice(batch);
        }
        if q.len() != tail * q_dim {
            return Err(Error::Other(format!(
                "layer {layer}: recorded {} query rows, expected {tail}",
                q.len() / q_dim
            )));
        }
        queries.push(q);
    }
    Ok(Capture {
        state,
        shape,
        config: c.clone(),
        n_ctx: n,
        tail,
        queries,
    })
}

/// Which queries a policy was measured on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Decode queries: the one at position `N - 1`, or more recorded rows each at its own
    /// position ([`evaluate_queries`]).
    Decode,
    /// The last prefill rows (policies that do not decode).
    Prefill,
}

/// One query head of one layer (at one decode query).
#[derive(Clone, Debug, Serialize)]
pub struct HeadStats {
    pub head: usize,
    pub kv_head: usize,
    /// Positions read over `N` (decode only).
    pub selectivity: Option<f64>,
    /// `‖o_P − o_full‖ / ‖o_full‖` (over all measured rows of the head).
    pub rel_l2: f64,
    /// Exact softmax probability over the positions read (decode only).
    pub mass: Option<f64>,
}

/// Aggregates over a set of heads.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub mean_selectivity: Option<f64>,
    pub mean_rel_l2: f64,
    pub max_rel_l2: f64,
    pub mean_mass: Option<f64>,
    pub min_mass: Option<f64>,
}

impl Summary {
    /// Means, maximum and minimum over `heads`.
    pub fn of<'a>(heads: impl IntoIterator<Item = &'a HeadStats>) -> Summary {
        let heads: Vec<&HeadStats> = heads.into_iter().collect();
        let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let sel: Vec<f64> = heads.iter().filter_map(|h| h.selectivity).collect();
        let err: Vec<f64> = heads.iter().map(|h| h.rel_l2).collect();
        let mass: Vec<f64> = heads.iter().filter_map(|h| h.mass).collect();
        Summary {
            mean_selectivity: mean(&sel),
            mean_rel_l2: mean(&err).unwrap_or(0.0),
            max_rel_l2: err.iter().copied().fold(0.0, f64::max),
            mean_mass: mean(&mass),
            min_mass: (!mass.is_empty())
                .then(|| mass.iter().copied().fold(f64::INFINITY, f64::min)),
        }
    }
}

/// One layer's heads and their aggregate.
#[derive(Clone, Debug, Serialize)]
pub struct LayerStats {
    pub layer: usize,
    pub summary: Summary,
    /// Per query head; with several decode queries, per query and head (query-major).
    pub heads: Vec<HeadStats>,
}

/// Everything measured for one policy.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyReport {
    /// The policy asked for (`--attn`).
    pub policy: String,
    /// The backend's own name.
    pub backend: String,
    pub phase: Phase,
    /// Positions in the cache.
    pub n_ctx: usize,
    /// Query rows measured per layer (decode: the decode queries, 1 unless more were
    /// asked for).
    pub rows: usize,
    /// Positions per sealed block.
    pub block_size: usize,
    /// The backend's own [`AttentionBackend::fraction_read`] at `n_ctx`.
    pub fraction_read: f64,
    /// Over every layer × head.
    pub summary: Summary,
    pub layers: Vec<LayerStats>,
}

/// Number of positions below `n` in `ranges` (overlaps counted once).
fn count_read(ranges: &[Range<usize>], n: usize) -> usize {
    let mut seen = vec![false; n];
    for r in ranges {
        seen[r.start.min(n)..r.end.min(n)].fill(true);
    }
    seen.iter().filter(|&&s| s).count()
}

/// Per head `(‖a − b‖² , ‖b‖²)` summed over the rows of `a` and `b`.
fn head_errors(shape: AttnShape, a: &[f32], b: &[f32]) -> Vec<f64> {
    let hd = shape.head_dim;
    let mut diff = vec![0.0f64; shape.n_head];
    let mut norm = vec![0.0f64; shape.n_head];
    for (i, (x, y)) in a.chunks_exact(hd).zip(b.chunks_exact(hd)).enumerate() {
        let h = i % shape.n_head;
        for (&p, &f) in x.iter().zip(y) {
            diff[h] += (p as f64 - f as f64).powi(2);
            norm[h] += (f as f64).powi(2);
        }
    }
    diff.iter()
        .zip(&norm)
        .map(|(&d, &n)| {
            if n > 0.0 {
                (d / n).sqrt()
            } else if d > 0.0 {
                f64::INFINITY
            } else {
                0.0
            }
        })
        .collect()
}

/// Exact softmax probabilities (f64) of query row `q_head` over the first `n` keys of
/// `keys` (`n × kv_dim`) for KV head `kv_head`.
fn probabilities(
    q_head: &[f32],
    keys: &[f32],
    kv_dim: usize,
    kv_head: usize,
    n: usize,
) -> Vec<f64> {
    let hd = q_head.len();
    let scale = 1.0 / (hd as f64).sqrt();
    let mut s: Vec<f64> = (0..n)
        .map(|j| {
            let k = &keys[j * kv_dim + kv_head * hd..][..hd];
            q_head
                .iter()
                .zip(k)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * scale
        })
        .collect();
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0.0;
    for x in s.iter_mut() {
        *x = (*x - m).exp();
        total += *x;
    }
    s.iter_mut().for_each(|x| *x /= total);
    s
}

/// Query head `h`'s KV head and its exact probabilities over the first `seen` keys of
/// `keys` (`n × kv_dim`), `q` one token's query rows.
fn head_probabilities(
    shape: AttnShape,
    q: &[f32],
    keys: &[f32],
    h: usize,
    seen: usize,
) -> (usize, Vec<f64>) {
    let (hd, kv_head) = (shape.head_dim, h / shape.group());
    let p = probabilities(
        &q[h * hd..(h + 1) * hd],
        keys,
        shape.kv_dim(),
        kv_head,
        seen,
    );
    (kv_head, p)
}

/// Build `choice`'s policy by itself (not wrapped with `full` for the phase it does not
/// run, so its own `fraction_read` shows), and the phase it is measured in: decode when it
/// decodes, otherwise prefill.
fn build_policy(
    choice: &AttentionChoice,
    model: &ModelConfig,
) -> Result<(Phase, Box<dyn SparsePolicy>)> {
    // Its own name for both phases: `prefill`/`decode` overrides do not apply here.
    let choice = &AttentionChoice {
        prefill: None,
        decode: None,
        ..choice.clone()
    };
    let (_, decode) = choice.phase_names().map_err(Error::Other)?;
    let phase = if decode == choice.name {
        Phase::Decode
    } else {
        Phase::Prefill
    };
    let backend = choice
        .build_one(&choice.name, model)
        .map_err(Error::Other)?;
    Ok((phase, backend))
}

/// Measure `choice` (its `name` for both phases; `prefill`/`decode` overrides are ignored)
/// against exact attention on `cap`.
pub fn evaluate(cap: &Capture, choice: &AttentionChoice) -> Result<PolicyReport> {
    evaluate_queries(cap, choice, 1)
}

/// The recorded rows measured as decode queries: `queries` of the `tail`, evenly spaced
/// back from the last (which is always one), ascending.
fn decode_rows(tail: usize, queries: usize) -> Vec<usize> {
    let queries = queries.clamp(1, tail.max(1));
    let stride = tail / queries;
    (0..queries).rev().map(|j| tail - 1 - j * stride).collect()
}

/// [`evaluate`] with a decode policy measured at `queries` recorded rows (evenly spaced
/// back from the decode query at `N - 1` over the recorded tail, at most all of it), each
/// a decode step at its own position: one query is one sample of a policy's routing, and
/// which positions a query wants varies from token to token. A head's entry per row;
/// prefill-only policies are measured as [`evaluate`] does. As in [`evaluate_steps`], the
/// policy has been fed every block up to `N` first: an earlier row reads nothing past its
/// own position, but a policy's summaries (Quest's page bounds, Saap's cells) may include
/// the later positions of the tail.
pub fn evaluate_queries(
    cap: &Capture,
    choice: &AttentionChoice,
    queries: usize,
) -> Result<PolicyReport> {
    let (phase, mut backend) = build_policy(choice, &cap.config)?;
    let backend = backend.as_mut();
    let (shape, kv, n) = (cap.shape, cap.state.kv(), cap.n_ctx);
    let rows = decode_rows(cap.tail, queries);
    let (q_dim, first) = (shape.q_dim(), n - cap.tail);
    let block_size = backend.block_size().unwrap_or(DEFAULT_BLOCK);
    let mut blocks = BlockTable::new(block_size, cap.config.n_layer);
    let mut keys = vec![0.0f32; n * shape.kv_dim()];
    let mut layers = Vec::with_capacity(cap.config.n_layer);
    for layer in 0..cap.config.n_layer {
        blocks.seal_in_place(shape, kv, layer, n, backend);
        let heads: Vec<HeadStats> = if phase == Phase::Decode {
            read_f32(
                &StoreLayer { store: kv, layer },
                false,
                shape.head_dim,
                0,
                &mut keys,
            );
            let mut heads = Vec::with_capacity(rows.len() * shape.n_head);
            for &r in &rows {
                let (q, pos) = (&cap.queries[layer][r * q_dim..(r + 1) * q_dim], first + r);
                let seen = pos + 1;
                // The read set first: it is the plan the query then runs (a policy that
                // updates its state after attending, like H2O's eviction, would report its
                // next step's).
                let read = read_set(backend, shape, kv, layer, q, pos);
                let mut full = vec![0.0f32; q.len()];
                let mut out = vec![0.0f32; q.len()];
                attend(&mut DenseAttention, shape, kv, layer, q, pos, &mut full);
                attend(backend, shape, kv, layer, q, pos, &mut out);
                let errors = head_errors(shape, &out, &full);
                heads.extend((0..shape.n_head).map(|h| {
                    let (kv_head, p) = head_probabilities(shape, q, &keys, h, seen);
                    let ranges = read.get(kv_head).map(|r| r.as_slice()).unwrap_or(&[]);
                    let mass: f64 = ranges
                        .iter()
                        .map(|r| p[r.start.min(seen)..r.end.min(seen)].iter().sum::<f64>())
                        .sum();
                    HeadStats {
                        head: h,
                        kv_head,
                        selectivity: Some(count_read(ranges, seen) as f64 / seen as f64),
                        rel_l2: errors[h],
                        mass: Some(mass),
                    }
                }));
            }
            heads
        } else {
            let (q, pos0) = (cap.queries[layer].as_slice(), n - cap.tail);
            let mut full = vec![0.0f32; q.len()];
            let mut out = vec![0.0f32; q.len()];
            attend(&mut DenseAttention, shape, kv, layer, q, pos0, &mut full);
            attend(backend, shape, kv, layer, q, pos0, &mut out);
            let errors = head_errors(shape, &out, &full);
            (0..shape.n_head)
                .map(|h| HeadStats {
                    head: h,
                    kv_head: h / shape.group(),
                    selectivity: None,
                    rel_l2: errors[h],
                    mass: None,
                })
                .collect()
        };
        layers.push(LayerStats {
            layer,
            summary: Summary::of(&heads),
            heads,
        });
    }
    Ok(PolicyReport {
        policy: choice.name.clone(),
        backend: backend.name().to_string(),
        phase,
        n_ctx: n,
        rows: match phase {
            Phase::Decode => rows.len(),
            Phase::Prefill => cap.queries.first().map_or(0, |q| q.len() / shape.q_dim()),
        },
        block_size,
        fraction_read: backend.fraction_read(n),
        summary: Summary::of(layers.iter().flat_map(|l| &l.heads)),
        layers,
    })
}

/// One layer at one decode step (means over the layer's query heads).
#[derive(Clone, Debug, Serialize)]
pub struct StepLayer {
    pub layer: usize,
    /// Positions read over the positions the query sees.
    pub selectivity: f64,
    /// Exact softmax probability over the positions read.
    pub mass: f64,
    /// Exact softmax probability on the focus positions (what full attention gives them).
    pub focus_full: f64,
    /// The part of `focus_full` on focus positions the policy read.
    pub focus_read: f64,
}

/// One decode step: the recorded query at `pos` attending to positions `0..=pos`.
#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    pub pos: usize,
    pub layers: Vec<StepLayer>,
}

impl StepReport {
    /// The share of full attention's focus mass the policy read, over every layer and head.
    pub fn focus_recall(&self) -> f64 {
        let full: f64 = self.layers.iter().map(|l| l.focus_full).sum();
        let read: f64 = self.layers.iter().map(|l| l.focus_read).sum();
        if full > 0.0 {
            read / full
        } else {
            1.0
        }
    }

    /// The layer whose heads keep the smallest share of their focus mass, among layers
    /// that give the focus at least `min_full` (mean over heads): `(layer, share)`.
    pub fn worst_layer(&self, min_full: f64) -> Option<(usize, f64)> {
        self.layers
            .iter()
            .filter(|l| l.focus_full >= min_full)
            .map(|l| (l.layer, l.focus_read / l.focus_full))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Means over layers of selectivity and mass.
    pub fn means(&self) -> (f64, f64) {
        let n = self.layers.len().max(1) as f64;
        (
            self.layers.iter().map(|l| l.selectivity).sum::<f64>() / n,
            self.layers.iter().map(|l| l.mass).sum::<f64>() / n,
        )
    }
}

/// Measure a decode policy at every recorded query row of `cap` as a decode step at its
/// own position (a teacher-forced answer: each row sees the positions up to its own), and
/// how much of full attention's mass on the `focus` positions (e.g. the needle's
/// sentence) it reads.
pub fn evaluate_steps(
    cap: &Capture,
    choice: &AttentionChoice,
    focus: Range<usize>,
) -> Result<Vec<StepReport>> {
    let (phase, mut backend) = build_policy(choice, &cap.config)?;
    if phase != Phase::Decode {
        return Err(Error::Other(format!(
            "{} does not decode: its steps cannot be measured",
            choice.name
        )));
    }
    let backend = backend.as_mut();
    let (shape, kv, n) = (cap.shape, cap.state.kv(), cap.n_ctx);
    let q_dim = shape.q_dim();
    let first = n - cap.tail;
    let mut steps: Vec<StepReport> = (first..n)
        .map(|pos| StepReport {
            pos,
            layers: Vec::new(),
        })
        .collect();
    let block_size = backend.block_size().unwrap_or(DEFAULT_BLOCK);
    let mut blocks = BlockTable::new(block_size, cap.config.n_layer);
    let mut keys = vec![0.0f32; n * shape.kv_dim()];
    for layer in 0..cap.config.n_layer {
        blocks.seal_in_place(shape, kv, layer, n, backend);
        read_f32(
            &StoreLayer { store: kv, layer },
            false,
            shape.head_dim,
            0,
            &mut keys,
        );
        for (r, step) in steps.iter_mut().enumerate() {
            let pos = step.pos;
            let seen = pos + 1;
            let q = &cap.queries[layer][r * q_dim..(r + 1) * q_dim];
            let read = read_set(backend, shape, kv, layer, q, pos);
            let mut sums = [0.0f64; 4];
            for h in 0..shape.n_head {
                let (kv_head, p) = head_probabilities(shape, q, &keys, h, seen);
                let ranges = read.get(kv_head).map(|r| r.as_slice()).unwrap_or(&[]);
                let clip = |r: &Range<usize>, within: &Range<usize>| {
                    r.start.max(within.start).min(seen)..r.end.min(within.end).min(seen)
                };
                let sum = |r: Range<usize>| p[r.start..r.end.max(r.start)].iter().sum::<f64>();
                let all = 0..seen;
                sums[0] += count_read(ranges, seen) as f64 / seen as f64;
                sums[1] += ranges.iter().map(|r| sum(clip(r, &all))).sum::<f64>();
                sums[2] += sum(clip(&focus, &all));
                // Overlapping ranges would count twice: mark what is read first.
                let mut read_focus = vec![false; focus.len()];
                for r in ranges {
                    let c = clip(r, &focus);
                    if c.start < c.end {
                        read_focus[c.start - focus.start..c.end - focus.start].fill(true);
                    }
                }
                sums[3] += read_focus
                    .iter()
                    .enumerate()
                    .filter(|&(i, &hit)| hit && focus.start + i < seen)
                    .map(|(i, _)| p[focus.start + i])
                    .sum::<f64>();
            }
            let heads = shape.n_head as f64;
            step.layers.push(StepLayer {
                layer,
                selectivity: sums[0] / heads,
                mass: sums[1] / heads,
                focus_full: sums[2] / heads,
                focus_read: sums[3] / heads,
            });
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_counts_merge_overlaps_and_clip() {
        assert_eq!(count_read(&[0..4, 2..6, 8..20], 10), 8);
        assert_eq!(count_read(&[], 10), 0);
    }

    #[test]
    fn probabilities_sum_to_one_and_follow_scores() {
        // kv_dim 4, two kv heads of 2; head 1 sees keys [1,0], [0,1], [1,1].
        let keys = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0];
        let p = probabilities(&[2.0, 0.0], &keys, 4, 1, 3);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(p[0] > p[1] && (p[0] - p[2]).abs() < 1e-12);
    }

    #[test]
    fn head_errors_are_relative_per_head() {
        let shape = AttnShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 2,
        };
        let full = [3.0, 4.0, 1.0, 0.0];
        let out = [3.0, 4.0, 1.0, 1.0];
        let e = head_errors(shape, &out, &full);
        assert_eq!(e[0], 0.0);
        assert!((e[1] - 1.0).abs() < 1e-12);
    }
}
