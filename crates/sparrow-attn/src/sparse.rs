//! Prefill attention: `forward`, `forward_flash`, `forward_gqa`, `forward_gqa_flash`,
//! `forward_auto`, and the dense references `forward_dense` / `forward_dense_flash`.
//!
//! Every path is one read plan run by the kernel's executor ([`crate::policy::execute`]):
//! per query, the pattern's key ranges of the keys and values as they are (`seq` rows of
//! `kv_heads × dim`), and its landmark blocks as rows of a side table of block means; the
//! two partial softmaxes merge by log-sum-exp. The kernel always works flash-style (blocks
//! of query rows over tiles of 64 keys, one-pass online softmax), so the `_flash` variants
//! are the same computation as the plain ones and give the same bits.

use crate::error::{AttnError, Result};
use crate::kernel::{AttnShape, F32Rows, KvSource, Level};
use crate::pattern::{candidates, CandidateCount, LandmarkMode, SparseConfig, Visible};
use crate::policy::{execute, Batch, PlanEntry, ReadPlan, SideTable, Source};
use crate::tensor::{same_shape, Tensor3};

/// Sparse attention with a fixed pattern ([`SparseConfig`]).
///
/// Scores are `q·k / sqrt(dim)`. Tensors are `(seq, heads, dim)`; for grouped-query
/// attention query head `h` reads key/value head `h / (q_heads / kv_heads)`.
#[derive(Clone, Debug)]
pub struct SparseAttention {
    config: SparseConfig,
    parallel: bool,
}

impl SparseAttention {
    /// Validate `config` and build the attention.
    pub fn new(config: SparseConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            config,
            parallel: true,
        })
    }

    /// The pattern configuration.
    pub fn config(&self) -> &SparseConfig {
        &self.config
    }

    /// Turn the rayon paths on or off at run time (only has an effect with feature
    /// `parallel`; on by default). Off runs the same work split on one thread, so the
    /// results are bit for bit the same.
    pub fn with_parallel(mut self, on: bool) -> Self {
        self.parallel = on;
        self
    }

    /// Whether this instance will use rayon (feature `parallel` and not switched off).
    pub fn is_parallel(&self) -> bool {
        cfg!(feature = "parallel") && self.parallel
    }

    /// Pairs visited per head at sequence length `seq` (see [`candidates`]).
    pub fn candidates(&self, seq: usize) -> Result<CandidateCount> {
        candidates(&self.config, seq)
    }

    /// Multi-head sparse attention; `q`, `k`, `v` must have the same shape.
    pub fn forward(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        validate_mha(q, k, v)?;
        self.prefill(q, k, v)
    }

    /// [`forward`](Self::forward); kept for compatibility: the kernel always computes in
    /// tiles, so this is the same computation.
    pub fn forward_flash(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        self.forward(q, k, v)
    }

    /// Grouped-query sparse attention: `q` has `q_heads`, `k`/`v` have `kv_heads`, and
    /// `q_heads` must be a multiple of `kv_heads`.
    pub fn forward_gqa(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        validate_gqa(q, k, v)?;
        self.prefill(q, k, v)
    }

    /// [`forward_gqa`](Self::forward_gqa); the same computation (see
    /// [`forward_flash`](Self::forward_flash)).
    pub fn forward_gqa_flash(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        self.forward_gqa(q, k, v)
    }

    /// Dispatch on head counts: equal → [`forward_flash`](Self::forward_flash), otherwise
    /// [`forward_gqa_flash`](Self::forward_gqa_flash).
    pub fn forward_auto(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        if q.heads() == k.heads() {
            self.forward_flash(q, k, v)
        } else {
            self.forward_gqa_flash(q, k, v)
        }
    }

    fn prefill(&self, q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<Tensor3> {
        let (seq, n_head, head_dim) = q.shape();
        let shape = AttnShape {
            n_head,
            n_head_kv: k.heads(),
            head_dim,
        };
        let mut out = Tensor3::zeros(seq, n_head, head_dim)?;
        let pattern = (0..seq)
            .map(|i| Visible::of(&self.config, seq, i))
            .collect();
        let (lk, lv) = match self.config.landmarks {
            LandmarkMode::Off => (Vec::new(), Vec::new()),
            _ => (
                block_means(k, self.config.block_size),
                block_means(v, self.config.block_size),
            ),
        };
        let kv_dim = shape.kv_dim();
        let store = F32Rows::all_heads(k.data(), v.data(), kv_dim);
        let landmarks = F32Rows::all_heads(&lk, &lv, kv_dim);
        self.attend(
            shape,
            &store,
            landmarks,
            pattern,
            Batch {
                q: q.data(),
                out: out.data_mut(),
                lse: None,
            },
        );
        Ok(out)
    }

    /// Run the pattern (`visible[i]` for batch token `i`) over `store` and the landmark
    /// table `landmarks` (row `b` = block `b`'s means, every KV head) through the kernel's
    /// executor for `batch`.
    pub(crate) fn attend<S: KvSource + ?Sized>(
        &self,
        shape: AttnShape,
        store: &S,
        landmarks: F32Rows<'_>,
        visible: Vec<Visible>,
        batch: Batch<'_>,
    ) {
        let (tokens, blocks): (Vec<_>, Vec<_>) =
            visible.into_iter().map(|v| (v.tokens, v.blocks)).unzip();
        let mut plan = ReadPlan::same_for_all_heads(shape, tokens);
        if blocks.iter().any(|b| !b.is_empty()) {
            plan.entries.push(PlanEntry {
                kv_heads: 0..shape.n_head_kv,
                source: Source::Side(0),
                weight: 1.0,
                visible: blocks,
            });
            plan.side.push(SideTable {
                rows: landmarks.into(),
                positions: None,
            });
        }
        #[cfg(feature = "parallel")]
        let threads = rayon::current_num_threads();
        #[cfg(not(feature = "parallel"))]
        let threads = 1;
        let run = || execute(Level::active(), threads, shape, store, &plan, batch);
        #[cfg(feature = "parallel")]
        if !self.parallel {
            use std::sync::OnceLock;
            static SERIAL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
            let pool =
                SERIAL.get_or_init(|| rayon::ThreadPoolBuilder::new().num_threads(1).build().ok());
            if let Some(pool) = pool {
                return pool.install(run);
            }
        }
        run()
    }
}

/// Mean row of every block of `block` tokens of `x` (the last block may be short):
/// `blocks × heads × dim`.
fn block_means(x: &Tensor3, block: usize) -> Vec<f32> {
    let w = x.heads() * x.dim();
    let mut means = vec![0.0f32; x.seq().div_ceil(block) * w];
    for (rows, m) in x.data().chunks(block * w).zip(means.chunks_exact_mut(w)) {
        for row in rows.chunks_exact(w) {
            m.iter_mut().zip(row).for_each(|(a, x)| *a += x);
        }
        let inv = 1.0 / (rows.len() / w) as f32;
        m.iter_mut().for_each(|a| *a *= inv);
    }
    means
}

/// Dense softmax attention (every key; causal or not). Accepts grouped-query shapes
/// (`q_heads` a multiple of `kv_heads`). The exact reference the sparse paths are
/// measured against.
pub fn forward_dense(q: &Tensor3, k: &Tensor3, v: &Tensor3, causal: bool) -> Result<Tensor3> {
    validate_gqa(q, k, v)?;
    SparseAttention::new(SparseConfig::dense(causal))?.prefill(q, k, v)
}

/// [`forward_dense`]; kept for compatibility: the kernel always computes flash-style
/// (blocks of queries against tiles of keys, online softmax), so this is the same
/// computation.
pub fn forward_dense_flash(q: &Tensor3, k: &Tensor3, v: &Tensor3, causal: bool) -> Result<Tensor3> {
    forward_dense(q, k, v, causal)
}

fn validate_mha(q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<()> {
    same_shape(q, k)?;
    same_shape(q, v)
}

pub(crate) fn validate_gqa(q: &Tensor3, k: &Tensor3, v: &Tensor3) -> Result<()> {
    same_shape(k, v)?;
    if q.seq() != k.seq() {
        return Err(AttnError::ShapeMismatch {
            what: "seq",
            expected: q.seq(),
            got: k.seq(),
        });
    }
    if q.dim() != k.dim() {
        return Err(AttnError::ShapeMismatch {
            what: "dim",
            expected: q.dim(),
            got: k.dim(),
        });
    }
    if q.heads().checked_rem(k.heads()) != Some(0) {
        return Err(AttnError::HeadsNotDivisible {
            q_heads: q.heads(),
            kv_heads: k.heads(),
        });
    }
    Ok(())
}
