//! # sparrow-attn
//!
//! Sparse attention for long contexts on small CPUs, with no runtime dependencies.
//!
//! Everything runs on one primitive, the [`kernel`]: a block of query rows (tokens × the
//! query heads of one GQA group) attends over key ranges of a [`kernel::KvSource`] in tiles
//! of keys with a one-pass online softmax, giving partials `(m, l, o)` that merge exactly by
//! log-sum-exp. Its inner loops have a scalar reference with an AVX2 twin (x86_64 with
//! AVX2, FMA and F16C, detected at run time) and a NEON twin (AArch64); the level
//! ([`kernel::Level`]: `scalar`, `avx2` or `neon`; no AVX-512 level, an AVX-512 CPU runs
//! AVX2) is the best the CPU supports, chosen once per process, and `SPARROW_SIMD=scalar`
//! forces the scalar loops (other values leave the best level on); f16 rows are converted
//! per tile. [`policy`] states what one layer reads as a [`policy::ReadPlan`] (key ranges
//! per token and KV head, plus small side tables) and runs any plan through the kernel. The engine's attention paths are these two modules.
//!
//! The seed-style API is built on the same primitive:
//!
//! * a sparse pattern ([`SparseConfig`]: local window, sink tokens, log-stride ladder, block
//!   landmarks) run by [`SparseAttention`] (`forward`, `forward_gqa`, `forward_auto`, and
//!   `forward_flash` / `forward_gqa_flash`, the same computation since the kernel always
//!   tiles): per query, ascending key ranges of the keys, plus landmark rows (block means)
//!   of a side table — one read plan; [`forward_dense`] is the pattern with a window
//!   covering everything;
//! * KV caches ([`LayerCache`], one layer's; the aliases [`KvCache`] and `KvCacheF16` with
//!   feature `fp16`), which are `KvSource`s, with incremental landmark means,
//!   `decode_step` in `O(window + log T + T/block)`, `decode_batch`, and H2O eviction
//!   (`evict_and_append`);
//! * [`partial_attention`] → [`Partial`] and an exact [`merge`]: attention over disjoint key
//!   sets (a window, some blocks, a bucket) combines into attention over their union;
//!   [`OnlineSoftmax`] accumulates partials, or single keys (`push`, the plain single-row
//!   reference);
//! * [`candidates`], which counts the pairs a pattern visits.
//!
//! Errors are values ([`AttnError`]); no function panics on caller input. Tests compare
//! every path with dense attention and with the f64 oracle [`kernel::reference`].
//!
//! Features: `parallel` (rayon across blocks of query rows and pieces of long key ranges),
//! `fp16` (`half::f16` key/value storage, Q8_0 rows for the engine).
//!
//! ```
//! use sparrow_attn::{SparseAttention, SparseConfig, Tensor3, forward_dense};
//!
//! let (seq, heads, dim) = (256, 4, 32);
//! let f = |s: usize, h: usize, d: usize| ((s * 7 + h * 3 + d) % 11) as f32 / 11.0 - 0.5;
//! let q = Tensor3::from_fn(seq, heads, dim, f)?;
//! let k = Tensor3::from_fn(seq, heads, dim, |s, h, d| f(s + 1, h, d))?;
//! let v = Tensor3::from_fn(seq, heads, dim, |s, h, d| f(s + 2, h, d))?;
//!
//! // A window covering the whole sequence is exactly dense attention.
//! let full = SparseAttention::new(SparseConfig { window: seq, ..SparseConfig::default() })?;
//! let dense = forward_dense(&q, &k, &v, true)?;
//! assert!(full.forward(&q, &k, &v)?.max_abs_diff(&dense) < 1e-5);
//! # Ok::<(), sparrow_attn::AttnError>(())
//! ```

#![warn(missing_docs)]

mod cache;
mod element;
mod error;
pub mod kernel;
mod pattern;
pub mod policy;
mod softmax;
mod sparse;
mod tensor;

#[cfg(feature = "fp16")]
pub use cache::KvCacheF16;
pub use cache::{KvCache, LayerCache};
pub use element::KvElement;
pub use error::{AttnError, Result};
pub use pattern::{
    candidates, candidates_for, CandidateCount, LandmarkMode, QueryCandidates, SparseConfig,
};
pub use softmax::{
    merge, merge_into, partial_attention, partial_attention_into, KeySet, KvView, OnlineSoftmax,
    Partial,
};
pub use sparse::{forward_dense, forward_dense_flash, SparseAttention};
pub use tensor::Tensor3;

/// The instruction set the attention kernels run at: [`kernel::Level::active`]'s name
/// (`scalar`, `avx2` or `neon`), detected once; `SPARROW_SIMD=scalar` forces `scalar`.
pub fn kernel_name() -> &'static str {
    kernel::Level::active().name()
}

/// `half::f16`, re-exported so users of [`KvCacheF16`] need no direct dependency.
#[cfg(feature = "fp16")]
pub use half::f16;

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
