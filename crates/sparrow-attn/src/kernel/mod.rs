//! The attention kernel library: the tile kernel every attention path of sparrow runs on
//! (the engine's exact and sparse attention, and this crate's own API).
//!
//! * [`level`]: the instruction set, chosen once per process (`SPARROW_SIMD` caps it);
//! * [`tile`]: the inner loops (scores, online-softmax step, P·V, f16 conversion, Q8_0
//!   dequantization), each a scalar reference with an AVX2 twin (x86_64) and a NEON twin
//!   (AArch64) tested against it; the twins are one set of loops (`simd`) over each
//!   instruction set's vector primitives (`avx2`, `neon`);
//! * [`rows`]: the rows a kernel reads ([`KvRows`]: f32, f16, Q8_0) and the [`KvSource`]
//!   trait through which a store hands them out;
//! * [`block`]: the primitive — a block of query rows over key ranges of a source, giving a
//!   [`BlockPartial`] `(m, l, o)` — and the exact log-sum-exp merge, plus the dense batch
//!   executor [`attend_batch`].

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
pub mod block;
pub mod level;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
pub mod reference;
pub mod rows;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod simd;
#[cfg(all(test, feature = "fp16"))]
mod tests;
pub mod tile;
mod view;

pub use block::{
    attend_batch, attend_block, head_rows, head_rows_into, plan_units, read_head_f32, run_units,
    runs, split_keys, union, write_merged, AttnShape, BlockPartial, Unit, BLOCK_ROWS, MIN_PIECE,
    TILE,
};
pub use level::{vnni_available, Level};
#[cfg(feature = "fp16")]
pub use rows::BlockQ8_0;
pub use rows::{read_f32, F32Rows, HeadRun, KvRows, KvSource, SlotView, BLOCK_Q8_0_BYTES, QK8_0};
