//! The engine's error type: what went wrong loading a model or running it, in words a user
//! can act on.

use sparrow_gguf::GgufError;
use sparrow_quant::QuantError;

/// Errors of the sparrow engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("unknown architecture '{0}' (sparrow runs llama, qwen2, mistral and gemma3)")]
    UnknownArchitecture(String),
    #[error("unsupported quant type {ty} for tensor '{tensor}'")]
    UnsupportedTensorType { tensor: String, ty: &'static str },
    #[error("tensor '{tensor}' has shape {found:?}, expected {expected:?}")]
    TensorShape {
        tensor: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("invalid model hyper-parameter: {0}")]
    BadHyperParameter(String),
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error(
        "the prompt has {n_prompt} tokens but the context size is {n_ctx} (raise -c/--ctx-size)"
    )]
    PromptTooLong { n_prompt: usize, n_ctx: usize },
    #[error(
        "a context of {n_ctx} positions needs {} (KV cache, RoPE table and the attention policy's summaries), more than this machine's {} of memory (RAM and swap): use a smaller -c/--ctx-size",
        crate::memory::human_bytes(*.need),
        crate::memory::human_bytes(*.have)
    )]
    ContextTooLarge { n_ctx: usize, need: u64, have: u64 },
    #[error("context is full: {n_ctx} tokens")]
    ContextFull { n_ctx: usize },
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    BadToken { id: u32, vocab: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("KV store: {0}")]
    KvTier(String),
    #[error("{0}")]
    Other(String),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, Error>;
