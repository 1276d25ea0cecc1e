//! The Saap index file: per layer and KV head, the k-means centroids that partition the
//! de-roped keys and the Q-model that maps a de-roped query to the buckets holding its
//! attention mass — trained offline (`sparrow saap train`), loaded by the `saap` policy.
//!
//! Layout (integers little-endian, floats f32 little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `SPRWSAAP` |
//! | 4 | format version ([`VERSION`]) |
//! | 32 | model fingerprint ([`crate::model::config::file_fingerprint`]) |
//! | 4 | length `m` of the metadata |
//! | m | metadata, JSON ([`IndexMeta`]: shapes, `C`, hidden width, how it was trained) |
//! | … | per layer, per KV head ([`HeadModel`]): centroids `C × head_dim`, centroid biases `C`, `w1` `hidden × head_dim`, `b1` `hidden`, `w2` `C × hidden`, `b2` `C` |
//! | 32 | SHA-256 of everything above |
//!
//! Loading checks, in order: length, magic, version, checksum (a truncated or altered file
//! fails here), fingerprint, metadata, shapes against the model, exact size, finite
//! values; each failure is an [`IndexError`] that says what is wrong.

use crate::model::ModelConfig;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sparrow_attn::kernel::rows::{BlockQ8_0, QK8_0};
use sparrow_attn::kernel::tile::{dequant_q8_0_tile, scores, softmax_tile, Tile};
use sparrow_attn::kernel::Level;
use std::path::Path;

/// File magic.
pub const MAGIC: &[u8; 8] = b"SPRWSAAP";
/// Format version written and read.
pub const VERSION: u32 = 1;
/// Largest bucket count or hidden width accepted (bounds allocations from a header).
pub const MAX_WIDTH: usize = 1 << 16;
const HEADER: usize = 8 + 4 + 32 + 4;

/// Why an index file was refused.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("Saap index {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("Saap index is truncated ({len} bytes; a valid index has at least {need})")]
    Truncated { len: usize, need: usize },
    #[error("not a Saap index file (bad magic)")]
    BadMagic,
    #[error(
        "Saap index format version {found} is not supported (this sparrow reads version {VERSION})"
    )]
    Version { found: u32 },
    #[error("Saap index checksum mismatch: the file is truncated or corrupted")]
    Checksum,
    #[error("Saap index was trained for a different model (fingerprint mismatch): train one for this model with `sparrow saap train`")]
    OtherModel,
    #[error("Saap index metadata is invalid: {0}")]
    Meta(String),
    #[error("Saap index shape ({what}) does not match the model ({want})")]
    Shape { what: String, want: String },
    #[error("Saap index size is wrong ({len} bytes, expected {want})")]
    Size { len: usize, want: usize },
    #[error("Saap index holds a non-finite value in layer {layer}, KV head {kv_head}")]
    NotFinite { layer: usize, kv_head: usize },
}

/// How an index was trained (reported, not used by the policy).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingInfo {
    /// Training contexts, their length in tokens, and the queries trained on.
    pub contexts: usize,
    pub context_tokens: usize,
    pub queries: usize,
    /// Random seed (k-means initialisation, sampling, MLP initialisation).
    pub seed: u64,
    /// K-means iterations, and whether it was spherical (unit centroids, cosine).
    pub kmeans_iterations: usize,
    pub spherical: bool,
    /// Q-model optimisation steps, batch size and learning rate (Adam).
    pub steps: usize,
    pub batch: usize,
    pub learning_rate: f64,
    /// Minimum distance (tokens) from a training query to its best key.
    pub min_distance: usize,
    /// Wall time of the training, seconds.
    pub seconds: f64,
    /// Where the training text came from.
    pub text: String,
}

/// The index's shapes and provenance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexMeta {
    pub n_layer: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Buckets per (layer, KV head): `C`.
    pub clusters: usize,
    /// Q-model hidden width.
    pub hidden: usize,
    /// Whether the Q-model's logits start from the query's scaled similarity to the
    /// centroids (`c · q / √head_dim`, what the `kmeans` router ranks by), the MLP adding
    /// a learned correction; false (and in files written before it existed): the paper's
    /// plain MLP.
    #[serde(default)]
    pub centroid_prior: bool,
    pub training: TrainingInfo,
}

impl IndexMeta {
    /// Heads stored: one model per (layer, KV head).
    pub fn n_heads(&self) -> usize {
        self.n_layer * self.n_head_kv
    }

    /// Values of one [`HeadModel`].
    fn head_values(&self) -> usize {
        let (c, h, d) = (self.clusters, self.hidden, self.head_dim);
        c * d + c + h * d + h + c * h + c
    }

    fn check(&self) -> Result<(), IndexError> {
        let bad = |m: String| Err(IndexError::Meta(m));
        if self.n_layer == 0 || self.n_head_kv == 0 || self.head_dim == 0 {
            return bad("a zero layer count, KV head count or head size".into());
        }
        if self.clusters < 1 || self.clusters > MAX_WIDTH {
            return bad(format!(
                "{} buckets (1..={MAX_WIDTH} accepted)",
                self.clusters
            ));
        }
        if self.hidden < 1 || self.hidden > MAX_WIDTH {
            return bad(format!(
                "hidden width {} (1..={MAX_WIDTH} accepted)",
                self.hidden
            ));
        }
        if self.head_dim > MAX_WIDTH || self.n_layer > 4096 || self.n_head_kv > 4096 {
            return bad("absurd shapes".into());
        }
        Ok(())
    }
}

/// One (layer, KV head)'s partition and query classifier.
///
/// A key `k` (de-roped) goes to bucket `argmax_c centroids[c] · k + centroid_bias[c]`: with
/// bias `-‖c‖²/2` that is the nearest centroid (standard k-means); with unit centroids and
/// bias 0, the most similar one (spherical k-means).
///
/// The Q-model maps a de-roped query `q` to a distribution over the buckets:
/// `softmax(w2 · relu(w1 · q + b1) + b2 + prior_scale · centroids · q)`, batch
/// normalisation folded into `w1`/`b1`; `prior_scale` is 0 for the paper's plain MLP and
/// `1/√head_dim` when the MLP learns a correction to the centroid router
/// ([`IndexMeta::centroid_prior`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HeadModel {
    /// `C × head_dim`.
    pub centroids: Vec<f32>,
    /// `C`.
    pub centroid_bias: Vec<f32>,
    /// `hidden × head_dim`.
    pub w1: Vec<f32>,
    /// `hidden`.
    pub b1: Vec<f32>,
    /// `C × hidden`.
    pub w2: Vec<f32>,
    /// `C`.
    pub b2: Vec<f32>,
    /// Weight of the centroid similarities in the logits (0: none).
    pub prior_scale: f32,
}

/// How a query chooses its buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Router {
    /// The Q-model's distribution plus the centroid router's: the trained router hedged
    /// by the geometric one for queries unlike its training text (a needle's digits in a
    /// book-trained index: docs/long-context.md, "Hedged routing").
    Hedged,
    /// The trained Q-model alone (the paper).
    Qmodel,
    /// The query's own similarity to the centroids (plain k-means; the paper's baseline,
    /// and the `kmeans` policy).
    Centroids,
    /// Not a bucket ranking: each bucket split by position segment into cells, ranked by
    /// the live mean of their RoPE'd keys against the group's summed query
    /// ([`crate::policy::saap::cells`]); the index supplies the partition only.
    Cells,
}

impl Router {
    /// Whether routing reads the trained Q-model (`w1`, `b1`, `w2`, `b2`); the other
    /// routers need only the partition (the centroids), and the policy loads no more
    /// ([`SaapIndex::partition_only`]).
    pub fn reads_qmodel(self) -> bool {
        matches!(self, Router::Hedged | Router::Qmodel)
    }
}

/// The rows of a `C`-row router matrix (the centroids, or the Q-model's output layer), as
/// trained (f32) or in Q8_0 blocks (ggml's 8-bit format, [`RouterCopy`]).
#[derive(Clone, Copy, Debug)]
pub enum RouterRows<'a> {
    F32(&'a [f32]),
    Q8(&'a [BlockQ8_0]),
}

/// The two `C`-row matrices a route reads; the rest of the Q-model (its first layer, the
/// biases) is small and always read from the [`HeadModel`].
#[derive(Clone, Copy, Debug)]
pub struct RouterWeights<'a> {
    pub centroids: RouterRows<'a>,
    pub w2: RouterRows<'a>,
}

/// A Q8_0 copy of a head's two `C`-row router matrices, for decode: a decode step reads
/// them for every sparse layer and KV head (0.5 MiB per head in f32 at 1,024 buckets,
/// 23 MiB per token on Qwen2.5-0.5B, more than the matrix products leave in the cache), and
/// Q8_0 reads 34 bytes per 32 values instead of 128. Rows whose width is not a multiple of
/// 32 stay f32. The key assignment keeps the f32 centroids (the inverted lists are exact).
#[derive(Clone, Debug, Default)]
pub struct RouterCopy {
    centroids: Option<Vec<BlockQ8_0>>,
    w2: Option<Vec<BlockQ8_0>>,
}

/// `rows` (each `width` values) in Q8_0 blocks, or `None` if `width` is not a multiple of
/// the block size.
fn quantize_rows(rows: &[f32], width: usize) -> Option<Vec<BlockQ8_0>> {
    (width > 0 && width.is_multiple_of(QK8_0))
        .then(|| rows.chunks_exact(QK8_0).map(BlockQ8_0::quantize).collect())
}

impl RouterCopy {
    /// The Q8_0 copy of `head`'s router matrices.
    pub fn of(head: &HeadModel) -> RouterCopy {
        RouterCopy {
            centroids: quantize_rows(&head.centroids, head.head_dim()),
            w2: quantize_rows(&head.w2, head.hidden()),
        }
    }

    /// The weights a route of `head` (the head this copy was made of) reads.
    pub fn weights<'a>(&'a self, head: &'a HeadModel) -> RouterWeights<'a> {
        let pick = |q: &'a Option<Vec<BlockQ8_0>>, f: &'a [f32]| match q {
            Some(q) => {
                debug_assert_eq!(q.len() * QK8_0, f.len(), "a copy of another head");
                RouterRows::Q8(q)
            }
            None => RouterRows::F32(f),
        };
        RouterWeights {
            centroids: pick(&self.centroids, &head.centroids),
            w2: pick(&self.w2, &head.w2),
        }
    }
}

/// Rows per dequantized tile of a Q8_0 router matrix (16 KiB of f32 at width 64).
const ROUTER_TILE: usize = 64;

/// A router matrix: `n` rows of `width`, as trained or in Q8_0.
#[derive(Clone, Copy)]
struct Matrix<'a> {
    rows: RouterRows<'a>,
    n: usize,
    width: usize,
}

/// `scale · m · xt` into `out` (`m.n × rw`), `xt` the transposed input (`m.width × rw`).
/// Q8_0 rows are dequantized a tile at a time into `tile` (the attention kernel's Q8_0 path).
fn product(
    level: Level,
    m: Matrix<'_>,
    (xt, rw): (&[f32], usize),
    scale: f32,
    out: &mut Vec<f32>,
    tile: &mut Vec<f32>,
) {
    let Matrix { rows, n, width } = m;
    out.resize(n * rw, 0.0);
    match rows {
        RouterRows::F32(m) => scores(level, Tile::new(m, width, n, width), xt, rw, scale, out),
        RouterRows::Q8(m) => {
            let blocks = width / QK8_0;
            tile.resize(ROUTER_TILE * width, 0.0);
            for t0 in (0..n).step_by(ROUTER_TILE) {
                let nt = ROUTER_TILE.min(n - t0);
                dequant_q8_0_tile(level, &m[t0 * blocks..], blocks, nt, blocks, tile);
                let out = &mut out[t0 * rw..(t0 + nt) * rw];
                scores(level, Tile::new(tile, width, nt, width), xt, rw, scale, out);
            }
        }
    }
}

/// Scratch for [`HeadModel`]'s products, kept between calls.
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    /// Input rows transposed (`dim × rw`).
    xt: Vec<f32>,
    /// First layer's output, transposed (`hidden × rw`).
    hidden: Vec<f32>,
    /// Products of the second layer or the centroids (`C × rw`).
    out: Vec<f32>,
    /// The centroid products under the Q-model's logits (`C × rw`).
    prior: Vec<f32>,
    /// Softmax statistics per row: maximum, sum, correction (`3 × rw`).
    stats: Vec<f32>,
    /// A dequantized tile of Q8_0 router rows.
    tile: Vec<f32>,
}

/// `rows` padded to a multiple of 8 (at least 8): the width of a transposed tile.
fn padded_rows(rows: usize) -> usize {
    rows.div_ceil(8).max(1) * 8
}

/// Rows of `x` (`rows × dim`) transposed into `xt[d * rw + r]`, `rw` the rows padded to a
/// multiple of 8 with zeros: the layout of the attention kernel's query tile, whose
/// `scores` product ([`sparrow_attn::kernel::tile::scores`], an AVX2 twin under a scalar
/// reference) computes every matrix product here.
fn transpose_rows(x: &[f32], dim: usize, xt: &mut Vec<f32>) -> usize {
    let rows = x.len() / dim.max(1);
    let rw = padded_rows(rows);
    xt.clear();
    xt.resize(dim * rw, 0.0);
    for (r, row) in x.chunks_exact(dim).enumerate() {
        for (d, &v) in row.iter().enumerate() {
            xt[d * rw + r] = v;
        }
    }
    rw
}

impl HeadModel {
    /// A head for `c` buckets, hidden width `h` and head size `d`, each array taken from
    /// `next(len)` in the order the index file stores them; the centroid similarities
    /// enter the logits when `centroid_prior`.
    pub fn from_parts(
        c: usize,
        h: usize,
        d: usize,
        centroid_prior: bool,
        mut next: impl FnMut(usize) -> Vec<f32>,
    ) -> HeadModel {
        HeadModel {
            centroids: next(c * d),
            centroid_bias: next(c),
            w1: next(h * d),
            b1: next(h),
            w2: next(c * h),
            b2: next(c),
            prior_scale: if centroid_prior { prior_scale(d) } else { 0.0 },
        }
    }

    /// Buckets.
    pub fn clusters(&self) -> usize {
        self.centroid_bias.len()
    }

    /// Hidden width.
    pub fn hidden(&self) -> usize {
        self.b1.len()
    }

    /// Whether the Q-model's weights are here (not dropped by
    /// [`SaapIndex::partition_only`]).
    pub fn has_qmodel(&self) -> bool {
        !self.b1.is_empty()
    }

    /// Values per key.
    pub fn head_dim(&self) -> usize {
        self.centroids.len() / self.clusters().max(1)
    }

    /// The router matrices as trained (f32).
    pub fn weights(&self) -> RouterWeights<'_> {
        RouterWeights {
            centroids: RouterRows::F32(&self.centroids),
            w2: RouterRows::F32(&self.w2),
        }
    }

    /// Writes to `buckets` the bucket of each de-roped key row of `keys` (`rows ×
    /// head_dim`), against the f32 centroids.
    pub fn assign(
        &self,
        level: Level,
        keys: &[f32],
        scratch: &mut Scratch,
        buckets: &mut Vec<u32>,
    ) {
        let (c, d) = (self.clusters(), self.head_dim());
        let rows = keys.len() / d.max(1);
        let rw = transpose_rows(keys, d, &mut scratch.xt);
        let centroids = RouterRows::F32(&self.centroids);
        let (xt, out, tile) = (&scratch.xt, &mut scratch.out, &mut scratch.tile);
        product(
            level,
            Matrix {
                rows: centroids,
                n: c,
                width: d,
            },
            (xt, rw),
            1.0,
            out,
            tile,
        );
        buckets.clear();
        for r in 0..rows {
            let mut best = (f32::NEG_INFINITY, 0u32);
            for (c, &bias) in self.centroid_bias.iter().enumerate() {
                let s = scratch.out[c * rw + r] + bias;
                if s > best.0 {
                    best = (s, c as u32);
                }
            }
            buckets.push(best.1);
        }
    }

    /// Adds to `mass` (`C`) the distribution over buckets that `router` gives each
    /// de-roped query row of `queries` (`rows × head_dim`), reading the router matrices
    /// `w` (this head's, as trained or a [`RouterCopy`]): the summed distribution of a GQA
    /// group (the paper's batched queries).
    ///
    /// - [`Router::Qmodel`]: `softmax(w2 · relu(w1 · q + b1) + b2 + prior_scale · c · q)`;
    /// - [`Router::Centroids`]: `softmax(c · q / √head_dim)`, buckets picked by the query
    ///   itself, as a plain inverted-file index does (the paper's baseline);
    /// - [`Router::Hedged`]: both added, the trained router hedged by the geometric one,
    ///   which needs no training text like the query; the centroid products are computed
    ///   once for both.
    pub fn add_mass(
        &self,
        router: Router,
        w: RouterWeights<'_>,
        level: Level,
        queries: &[f32],
        scratch: &mut Scratch,
        mass: &mut [f32],
    ) {
        let (c, h, d) = (self.clusters(), self.hidden(), self.head_dim());
        let rows = queries.len() / d.max(1);
        let rw = transpose_rows(queries, d, &mut scratch.xt);
        let Scratch {
            xt,
            hidden,
            out,
            prior,
            stats,
            tile,
        } = scratch;
        if router == Router::Cells {
            // Cells are ranked by the policy's own statistics, not by the index.
            return;
        }
        let qmodel = router.reads_qmodel();
        assert!(
            !qmodel || self.has_qmodel(),
            "routing by the Q-model of an index loaded without it (SaapIndex::partition_only)"
        );
        // The centroid similarities `c · q`, unscaled.
        if router != Router::Qmodel || self.prior_scale != 0.0 {
            product(
                level,
                Matrix {
                    rows: w.centroids,
                    n: c,
                    width: d,
                },
                (xt, rw),
                1.0,
                prior,
                tile,
            );
        }
        if qmodel {
            let w1 = RouterRows::F32(&self.w1);
            product(
                level,
                Matrix {
                    rows: w1,
                    n: h,
                    width: d,
                },
                (xt, rw),
                1.0,
                hidden,
                tile,
            );
            // ReLU that keeps NaN (`max` would turn a broken query into a valid-looking one).
            for (row, &b) in hidden.chunks_exact_mut(rw).zip(&self.b1) {
                row.iter_mut().for_each(|x| {
                    let v = *x + b;
                    *x = if v < 0.0 { 0.0 } else { v };
                });
            }
            product(
                level,
                Matrix {
                    rows: w.w2,
                    n: c,
                    width: h,
                },
                (hidden, rw),
                1.0,
                out,
                tile,
            );
            if self.prior_scale != 0.0 {
                let s = self.prior_scale;
                out.iter_mut()
                    .zip(prior.iter())
                    .for_each(|(o, p)| *o += p * s);
            }
            add_softmaxes(level, (out, rw, rows), (Some(&self.b2), 1.0), stats, mass);
        }
        if router != Router::Qmodel {
            add_softmaxes(
                level,
                (prior, rw, rows),
                (None, prior_scale(d)),
                stats,
                mass,
            );
        }
    }
}

/// The scale of the centroid similarities, as the attention scores' (`1/√head_dim`).
pub fn prior_scale(head_dim: usize) -> f32 {
    1.0 / (head_dim as f32).sqrt()
}

/// For each row `r < rows` of `logits` (`C × rw`, column `r`): adds
/// `softmax(scale · logits[·, r] + bias)` to `mass` (no bias: zero). A row that is not
/// finite adds nothing. The exponentials are the attention kernel's softmax tile (one
/// tile of `C` scores for `rw` rows), vectorised where it is; `stats` is scratch.
fn add_softmaxes(
    level: Level,
    (logits, rw, rows): (&mut [f32], usize, usize),
    (bias, scale): (Option<&[f32]>, f32),
    stats: &mut Vec<f32>,
    mass: &mut [f32],
) {
    let c = logits.len() / rw.max(1);
    for (k, row) in logits.chunks_exact_mut(rw).enumerate() {
        let b = bias.map_or(0.0, |b| b[k]);
        row.iter_mut().for_each(|x| *x = *x * scale + b);
    }
    stats.clear();
    stats.resize(3 * rw, 0.0);
    let (m, rest) = stats.split_at_mut(rw);
    let (l, weight) = rest.split_at_mut(rw);
    m.fill(f32::NEG_INFINITY);
    softmax_tile(level, logits, c, rw, m, l, weight);
    // Each row's weight in the sum: 1 / its softmax denominator, 0 for padding and rows
    // that are not finite (whose probabilities are zeroed: 0 · NaN would still be NaN).
    for r in 0..rw {
        let ok = r < rows && l[r].is_finite() && l[r] > 0.0;
        weight[r] = if ok { 1.0 / l[r] } else { 0.0 };
        if !ok && r < rows {
            logits.chunks_exact_mut(rw).for_each(|row| row[r] = 0.0);
        }
    }
    for (acc, row) in mass.iter_mut().zip(logits.chunks_exact(rw)) {
        *acc += row
            .iter()
            .zip(weight.iter())
            .map(|(p, w)| p * w)
            .sum::<f32>();
    }
}

/// A trained index: metadata, the model it belongs to, one [`HeadModel`] per (layer, KV
/// head), layer-major.
#[derive(Clone, Debug, PartialEq)]
pub struct SaapIndex {
    pub meta: IndexMeta,
    pub fingerprint: [u8; 32],
    pub heads: Vec<HeadModel>,
}

impl SaapIndex {
    /// The model of `kv_head` in `layer`.
    pub fn head(&self, layer: usize, kv_head: usize) -> &HeadModel {
        &self.heads[layer * self.meta.n_head_kv + kv_head]
    }

    /// The partition alone: each head's centroids and biases, the Q-model's weights
    /// dropped. A router that ranks cells or centroids never reads them, and they are most
    /// of the index (at 256 buckets and hidden width 64, 3.9 of Qwen2.5-0.5B's 7.2 MB —
    /// resident beside every sequence's KV, against the memory the policy must fit in).
    pub fn partition_only(mut self) -> SaapIndex {
        for head in &mut self.heads {
            for part in [&mut head.w1, &mut head.b1, &mut head.w2, &mut head.b2] {
                *part = Vec::new();
            }
        }
        self
    }

    /// The file image.
    ///
    /// # Panics
    /// On an index without its Q-model ([`SaapIndex::partition_only`]): it is not a file.
    pub fn encode(&self) -> Vec<u8> {
        assert!(
            self.heads.iter().all(HeadModel::has_qmodel),
            "a partition-only Saap index cannot be written"
        );
        let meta = serde_json::to_vec(&self.meta).expect("index metadata serialises");
        let mut out = Vec::with_capacity(
            HEADER + meta.len() + 4 * self.meta.head_values() * self.heads.len() + 32,
        );
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.fingerprint);
        out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        out.extend_from_slice(&meta);
        for h in &self.heads {
            for part in [&h.centroids, &h.centroid_bias, &h.w1, &h.b1, &h.w2, &h.b2] {
                for v in part.iter() {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        let sum: [u8; 32] = Sha256::digest(&out).into();
        out.extend_from_slice(&sum);
        out
    }

    /// Parse and validate an index image for `model` (its fingerprint and shapes).
    pub fn decode(bytes: &[u8], model: &ModelConfig) -> Result<SaapIndex, IndexError> {
        let need = HEADER + 32;
        if bytes.len() < need {
            return Err(IndexError::Truncated {
                len: bytes.len(),
                need,
            });
        }
        if &bytes[..8] != MAGIC {
            return Err(IndexError::BadMagic);
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(IndexError::Version { found: version });
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if Sha256::digest(body).as_slice() != sum {
            return Err(IndexError::Checksum);
        }
        if bytes[12..44] != model.fingerprint {
            return Err(IndexError::OtherModel);
        }
        let meta_len = u32::from_le_bytes(bytes[44..48].try_into().expect("4 bytes")) as usize;
        let meta_bytes = body
            .get(HEADER..HEADER.saturating_add(meta_len))
            .ok_or_else(|| {
                IndexError::Meta(format!("{meta_len} bytes of metadata past the end"))
            })?;
        let meta: IndexMeta =
            serde_json::from_slice(meta_bytes).map_err(|e| IndexError::Meta(e.to_string()))?;
        meta.check()?;
        let have = (meta.n_layer, meta.n_head_kv, meta.head_dim);
        let want = (model.n_layer, model.n_head_kv, model.head_dim);
        if have != want {
            return Err(IndexError::Shape {
                what: format!("{} layers × {} KV heads × {}", have.0, have.1, have.2),
                want: format!("{} layers × {} KV heads × {}", want.0, want.1, want.2),
            });
        }
        let values = meta.head_values() * meta.n_heads();
        let want_len = HEADER + meta_len + 4 * values + 32;
        if bytes.len() != want_len {
            return Err(IndexError::Size {
                len: bytes.len(),
                want: want_len,
            });
        }
        let mut floats = body[HEADER + meta_len..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")));
        let (c, h, d) = (meta.clusters, meta.hidden, meta.head_dim);
        let mut take = |n: usize| -> Vec<f32> { floats.by_ref().take(n).collect() };
        let mut heads = Vec::with_capacity(meta.n_heads());
        for i in 0..meta.n_heads() {
            let head = HeadModel::from_parts(c, h, d, meta.centroid_prior, &mut take);
            let finite = [
                &head.centroids,
                &head.centroid_bias,
                &head.w1,
                &head.b1,
                &head.w2,
                &head.b2,
            ]
            .iter()
            .all(|p| p.iter().all(|v| v.is_finite()));
            if !finite {
                return Err(IndexError::NotFinite {
                    layer: i / meta.n_head_kv,
                    kv_head: i % meta.n_head_kv,
                });
            }
            heads.push(head);
        }
        Ok(SaapIndex {
            meta,
            fingerprint: model.fingerprint,
            heads,
        })
    }

    /// Write the index to `path` (through a temporary file renamed into place, so a
    /// crash never leaves half an index where a good one was).
    pub fn save(&self, path: &Path) -> Result<(), IndexError> {
        let io = |source| IndexError::Io {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, self.encode()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Read and validate the index at `path` for `model`.
    pub fn load(path: &Path, model: &ModelConfig) -> Result<SaapIndex, IndexError> {
        let bytes = std::fs::read(path).map_err(|source| IndexError::Io {
            path: path.display().to_string(),
            source,
        })?;
        SaapIndex::decode(&bytes, model)
    }
}

/// Where `sparrow saap train` keeps the index of the model with `fingerprint` when no path
/// is given, and where the `saap` policy looks for it: `$SPARROW_SAAP_DIR`, else
/// `$XDG_CACHE_HOME/sparrow/saap`, else `~/.cache/sparrow/saap`; the file is named by the
/// fingerprint, so every model has its own and a re-downloaded model finds its index.
pub fn default_index_path(fingerprint: &[u8; 32]) -> Option<std::path::PathBuf> {
    let dir = if let Some(d) = std::env::var_os("SPARROW_SAAP_DIR") {
        std::path::PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        std::path::PathBuf::from(d).join("sparrow").join("saap")
    } else {
        std::path::PathBuf::from(std::env::var_os("HOME")?)
            .join(".cache")
            .join("sparrow")
            .join("saap")
    };
    let hex: String = fingerprint[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Some(dir.join(format!("{hex}.saap")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{synthetic_config, synthetic_saap_index, SyntheticSpec};
    use rand::{Rng, SeedableRng};

    fn model() -> ModelConfig {
        synthetic_config(&SyntheticSpec::default()).unwrap()
    }

    #[test]
    fn round_trips() {
        let m = model();
        let mut idx = synthetic_saap_index(&m, 8, 6, 1);
        assert_eq!(SaapIndex::decode(&idx.encode(), &m).unwrap(), idx);
        // With the centroid prior, the heads' scale follows the metadata.
        idx.meta.centroid_prior = true;
        for h in &mut idx.heads {
            h.prior_scale = prior_scale(m.head_dim);
        }
        assert_eq!(SaapIndex::decode(&idx.encode(), &m).unwrap(), idx);
    }

    /// Another model, a truncated file, any flipped bit, a wrong magic or version: each is
    /// refused with its own reason.
    #[test]
    fn refuses_foreign_truncated_and_corrupt_files() {
        let m = model();
        let bytes = synthetic_saap_index(&m, 8, 6, 2).encode();
        let mut other = m.clone();
        other.fingerprint[0] ^= 1;
        assert!(matches!(
            SaapIndex::decode(&bytes, &other),
            Err(IndexError::OtherModel)
        ));
        let mut shape = m.clone();
        shape.n_layer += 1;
        assert!(matches!(
            SaapIndex::decode(&bytes, &shape),
            Err(IndexError::Shape { .. })
        ));
        for cut in [0, 10, HEADER + 5, bytes.len() / 2, bytes.len() - 1] {
            let e = SaapIndex::decode(&bytes[..cut], &m).unwrap_err();
            assert!(
                matches!(e, IndexError::Truncated { .. } | IndexError::Checksum),
                "cut at {cut}: {e}"
            );
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for _ in 0..64 {
            let mut b = bytes.clone();
            let at = rng.random_range(12..b.len());
            b[at] ^= 1 << rng.random_range(0..8);
            assert!(
                matches!(SaapIndex::decode(&b, &m), Err(IndexError::Checksum)),
                "flip at {at}"
            );
        }
        let mut b = bytes.clone();
        b[0] = b'X';
        assert!(matches!(
            SaapIndex::decode(&b, &m),
            Err(IndexError::BadMagic)
        ));
        let mut b = bytes.clone();
        b[8] = 9;
        assert!(matches!(
            SaapIndex::decode(&b, &m),
            Err(IndexError::Version { found: 9 })
        ));
    }

    /// A file whose checksum is right but whose values are not finite is refused too.
    #[test]
    fn refuses_non_finite_values() {
        let m = model();
        let mut idx = synthetic_saap_index(&m, 4, 3, 4);
        idx.heads[1].w2[2] = f32::NAN;
        let e = SaapIndex::decode(&idx.encode(), &m).unwrap_err();
        assert!(
            matches!(
                e,
                IndexError::NotFinite {
                    layer: 0,
                    kv_head: 1
                }
            ),
            "{e}"
        );
    }

    /// `Σ_rows softmax(logits)` in f64 for the rows of `q`: the distribution `router` gives
    /// a group, written from the formulas in [`HeadModel`]'s documentation.
    fn reference_mass(head: &HeadModel, router: Router, q: &[f32]) -> Vec<f64> {
        let (c, h, d) = (head.clusters(), head.hidden(), head.head_dim());
        let dot = |a: &[f32], b: &[f32]| -> f64 {
            a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
        };
        let add_softmax = |logit: &[f64], want: &mut [f64]| {
            let mx = logit.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = logit.iter().map(|x| (x - mx).exp()).sum();
            for (w, x) in want.iter_mut().zip(logit) {
                *w += (x - mx).exp() / z;
            }
        };
        let mut want = vec![0f64; c];
        for row in q.chunks_exact(d) {
            let sim: Vec<f64> = head
                .centroids
                .chunks_exact(d)
                .map(|k| dot(k, row))
                .collect();
            if router != Router::Centroids {
                let hid: Vec<f64> = (0..h)
                    .map(|j| (dot(&head.w1[j * d..][..d], row) + head.b1[j] as f64).max(0.0))
                    .collect();
                let logit: Vec<f64> = (0..c)
                    .map(|k| {
                        let w2: f64 = (0..h).map(|j| head.w2[k * h + j] as f64 * hid[j]).sum();
                        w2 + head.b2[k] as f64 + sim[k] * head.prior_scale as f64
                    })
                    .collect();
                add_softmax(&logit, &mut want);
            }
            if router != Router::Qmodel {
                let scale = 1.0 / (d as f64).sqrt();
                let logit: Vec<f64> = sim.iter().map(|s| s * scale).collect();
                add_softmax(&logit, &mut want);
            }
        }
        want
    }

    fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
        for (a, b) in got.iter().zip(want) {
            assert!((*a as f64 - b).abs() < tol, "{what}: {a} vs {b}");
        }
    }

    /// Every router (Q-model plain and over the centroid prior, centroids, hedged) and the
    /// assignment against the f64 reference.
    #[test]
    fn routes_and_assignment_match_f64() {
        let m = model();
        let idx = synthetic_saap_index(&m, 11, 9, 5);
        let d = m.head_dim;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
        let q: Vec<f32> = (0..3 * d).map(|_| rng.random_range(-2.0..2.0)).collect();
        for (level, prior) in Level::supported()
            .into_iter()
            .flat_map(|l| [(l, false), (l, true)])
        {
            let mut head = idx.heads[0].clone();
            head.prior_scale = if prior { prior_scale(d) } else { 0.0 };
            let head = &head;
            for router in [Router::Qmodel, Router::Centroids, Router::Hedged] {
                let mut mass = vec![0f32; 11];
                let w = head.weights();
                head.add_mass(router, w, level, &q, &mut Scratch::default(), &mut mass);
                let what = format!("{level:?}, {router:?}, prior {prior}");
                assert_close(&mass, &reference_mass(head, router, &q), 1e-5, &what);
                let groups = if router == Router::Hedged { 6.0 } else { 3.0 };
                assert!((mass.iter().sum::<f32>() - groups).abs() < 1e-4, "{what}");
            }
            let mut buckets = Vec::new();
            head.assign(level, &q, &mut Scratch::default(), &mut buckets);
            for (row, &got) in q.chunks_exact(d).zip(&buckets) {
                let best = (0..11)
                    .max_by(|&a, &b| {
                        let s = |c: usize| {
                            (0..d)
                                .map(|i| head.centroids[c * d + i] as f64 * row[i] as f64)
                                .sum::<f64>()
                                + head.centroid_bias[c] as f64
                        };
                        s(a).total_cmp(&s(b))
                    })
                    .unwrap();
                assert_eq!(got as usize, best, "{level:?}");
            }
        }
    }

    /// The Q8_0 router copy: each router's distribution equals the f64 reference over the
    /// copy's dequantized matrices (it reads exactly what is stored, tiles and the last
    /// partial tile included), and stays within Q8_0's rounding of the f32 router's; a
    /// width that is not a multiple of 32 keeps f32 rows.
    #[test]
    fn q8_router_copy_routes_its_own_weights() {
        let (c, h, d) = (70, 32, 64);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
        let mut v =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-0.5..0.5)).collect() };
        let head = HeadModel::from_parts(c, h, d, true, &mut v);
        let q = v(7 * d);
        let copy = RouterCopy::of(&head);
        let w = copy.weights(&head);
        let dequantized = |rows: RouterRows<'_>| -> Vec<f32> {
            let RouterRows::Q8(blocks) = rows else {
                panic!("a width of 32 or 64 is quantized")
            };
            let mut out = vec![0f32; blocks.len() * QK8_0];
            for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK8_0)) {
                b.dequantize(o);
            }
            out
        };
        let mut stored = head.clone();
        stored.centroids = dequantized(w.centroids);
        stored.w2 = dequantized(w.w2);
        assert_ne!(stored.centroids, head.centroids, "Q8_0 rounds");
        for level in Level::supported() {
            for router in [Router::Qmodel, Router::Centroids, Router::Hedged] {
                let what = format!("{level:?}, {router:?}");
                let mut mass = vec![0f32; c];
                head.add_mass(router, w, level, &q, &mut Scratch::default(), &mut mass);
                assert_close(&mass, &reference_mass(&stored, router, &q), 1e-5, &what);
                assert_close(&mass, &reference_mass(&head, router, &q), 2e-2, &what);
            }
        }
        let odd = HeadModel::from_parts(5, 9, 16, true, &mut v);
        let copy = RouterCopy::of(&odd);
        let w = copy.weights(&odd);
        assert!(matches!(w.centroids, RouterRows::F32(_)) && matches!(w.w2, RouterRows::F32(_)));
    }

    /// Hedged routing adds the Q-model's and the centroid router's distributions, with the
    /// centroid products shared (over a prior) or computed apart (plain Q-model); one
    /// scratch reused across calls of either kind.
    #[test]
    fn hedged_mass_is_the_sum_of_both_routers() {
        let m = model();
        let idx = synthetic_saap_index(&m, 13, 6, 11);
        let d = m.head_dim;
        let q: Vec<f32> = (0..5 * d).map(|i| (i as f32 * 0.61).cos() * 1.5).collect();
        let mut scratch = Scratch::default();
        for level in Level::supported() {
            for prior in [true, false, true] {
                let mut head = idx.heads[3].clone();
                head.prior_scale = if prior { prior_scale(d) } else { 0.0 };
                let mut hedged = vec![0f32; 13];
                let w = head.weights();
                head.add_mass(Router::Hedged, w, level, &q, &mut scratch, &mut hedged);
                let mut want = vec![0f32; 13];
                for router in [Router::Qmodel, Router::Centroids] {
                    head.add_mass(router, w, level, &q, &mut Scratch::default(), &mut want);
                }
                for (a, b) in hedged.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-5, "{level:?}, prior {prior}: {a} vs {b}");
                }
                assert!((hedged.iter().sum::<f32>() - 10.0).abs() < 1e-4);
            }
        }
    }

    /// The partition alone assigns keys and routes by centroids exactly as the whole index
    /// does, holds none of the Q-model, and refuses to route by it or to be written.
    #[test]
    fn partition_only_keeps_what_the_centroid_routers_read() {
        let m = model();
        let idx = synthetic_saap_index(&m, 11, 6, 12);
        let part = idx.clone().partition_only();
        let d = m.head_dim;
        let keys: Vec<f32> = (0..9 * d).map(|i| (i as f32 * 0.43).sin() * 2.0).collect();
        for (whole, alone) in idx.heads.iter().zip(&part.heads) {
            assert!(whole.has_qmodel() && !alone.has_qmodel());
            assert!(alone.w1.is_empty() && alone.w2.is_empty() && alone.b2.is_empty());
            assert_eq!(
                (&whole.centroids, &whole.centroid_bias),
                (&alone.centroids, &alone.centroid_bias)
            );
            let level = Level::active();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            whole.assign(level, &keys, &mut Scratch::default(), &mut a);
            alone.assign(level, &keys, &mut Scratch::default(), &mut b);
            assert_eq!(a, b);
            let (mut ma, mut mb) = (vec![0f32; 11], vec![0f32; 11]);
            let q = &keys[..3 * d];
            let router = Router::Centroids;
            whole.add_mass(
                router,
                whole.weights(),
                level,
                q,
                &mut Scratch::default(),
                &mut ma,
            );
            alone.add_mass(
                router,
                alone.weights(),
                level,
                q,
                &mut Scratch::default(),
                &mut mb,
            );
            assert_eq!(ma, mb);
        }
        let head = part.heads[0].clone();
        let routed = std::panic::catch_unwind(move || {
            let mut mass = vec![0f32; 11];
            let q = vec![0.5f32; d];
            let w = head.weights();
            head.add_mass(
                Router::Qmodel,
                w,
                Level::Scalar,
                &q,
                &mut Scratch::default(),
                &mut mass,
            );
        });
        assert!(routed.is_err(), "routed by a Q-model it does not have");
        assert!(std::panic::catch_unwind(|| part.encode()).is_err());
        assert!(Router::Hedged.reads_qmodel() && Router::Qmodel.reads_qmodel());
        assert!(!Router::Cells.reads_qmodel() && !Router::Centroids.reads_qmodel());
    }

    /// A query row that is not finite (a broken activation) adds nothing; the others
    /// still add their distribution.
    #[test]
    fn a_non_finite_query_adds_nothing() {
        let m = model();
        let idx = synthetic_saap_index(&m, 9, 4, 10);
        let d = m.head_dim;
        let mut q: Vec<f32> = (0..3 * d).map(|i| (i as f32 * 0.37).sin()).collect();
        q[d + 2] = f32::NAN;
        q[2 * d + 1] = f32::NAN;
        for level in Level::supported() {
            for router in [Router::Qmodel, Router::Centroids, Router::Hedged] {
                let mut mass = vec![0f32; 9];
                let head = &idx.heads[1];
                head.add_mass(
                    router,
                    head.weights(),
                    level,
                    &q,
                    &mut Scratch::default(),
                    &mut mass,
                );
                assert!(mass.iter().all(|x| x.is_finite()), "{level:?}: {mass:?}");
                let rows = if router == Router::Hedged { 2.0 } else { 1.0 };
                assert!((mass.iter().sum::<f32>() - rows).abs() < 1e-5, "{level:?}");
            }
        }
    }
}
