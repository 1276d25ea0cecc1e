//! sparrow-eval: the tools that measure the engine, kept out of it. Each runs a real model
//! through the engine's public API and reports what a policy keeps or loses:
//!
//! * [`needle`] — needle-in-a-haystack retrieval per attention policy;
//! * [`ruler`] — RULER's synthetic long-context tasks (needle variants, variable tracking,
//!   common- and frequent-word extraction) per attention policy;
//! * [`answer`] — one prompt answered under several policies for one prefill each;
//! * [`prefill_cache`] — prefilled states kept on disk between runs;
//! * [`attention`] — how closely each policy follows exact attention on real activations
//!   (attention mass kept, output error, reads);
//! * [`perplexity`] — perplexity over a text, with any decode-phase policy;
//! * [`collect`] — recording the de-roped keys and queries Saap's index is trained on;
//! * [`text`] — the folders of `.txt` files all of them read.

pub mod answer;
pub mod attention;
pub mod collect;
pub mod needle;
pub mod perplexity;
pub mod prefill_cache;
pub mod ruler;
pub mod text;

pub use collect::{collect_context, text_contexts, CollectSettings, TextContext};
