//! Hyper-parameters of a llama-family model, read from GGUF metadata (`{arch}.*` keys) and
//! checked for consistency before any memory is sized from them.

use crate::error::{Error, Result};
pub use crate::model::arch::{Architecture, RopeLayout};
pub use crate::model::spec::{Activation, LayerAttention, LayerSpec};
use sparrow_gguf::GgufFile;

/// Model hyper-parameters.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Number of leading dimensions of each head that RoPE rotates.
    pub n_rot: usize,
    pub rope_base: f32,
    /// Positions are multiplied by this before rotation (linear RoPE scaling).
    pub rope_freq_scale: f32,
    pub rope_layout: RopeLayout,
    pub rms_eps: f32,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    pub vocab_size: usize,
    /// The file's identity ([`file_fingerprint`]): what files derived from this model (a
    /// prompt cache, a Saap index) are bound to.
    pub fingerprint: [u8; 32],
    /// Per layer: attention kind, RoPE, norms ([`LayerSpec`]).
    pub layers: Vec<LayerSpec>,
    /// The FFN's gate activation.
    pub activation: Activation,
    /// Embedding rows are multiplied by this (Gemma: √n_embd).
    pub embedding_scale: Option<f32>,
    /// Logit soft-capping `c · tanh(logit / c)`, if the model uses it.
    pub final_logit_softcap: Option<f32>,
}

/// SHA-256 of a GGUF's header, metadata and tensor table (everything before the tensor
/// data), plus the first 256 bytes of every tensor's data so that two files with the same
/// shapes but different weights differ too.
pub fn file_fingerprint(f: &GgufFile) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let end = (f.data_offset() as usize).min(f.bytes().len());
    let mut h = Sha256::new();
    h.update(&f.bytes()[..end]);
    for t in f.tensors() {
        let d = f.tensor_data(t);
        h.update(&d[..d.len().min(256)]);
    }
    h.finalize().into()
}

/// Upper bounds that reject absurd headers before they size allocations.
const MAX_DIM: usize = 1 << 20;
const MAX_LAYERS: usize = 4096;

impl ModelConfig {
    /// Read and check the hyper-parameters of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let md = file.metadata();
        let arch = Architecture::parse(md.get_str("general.architecture")?)?;
        let key = |k: &str| format!("{}.{k}", arch.name());
        let get = |k: &str| -> Result<usize> { Ok(md.get_u32(&key(k))? as usize) };

        let n_layer = get("block_count")?;
        let n_embd = get("embedding_length")?;
        let n_ff = get("feed_forward_length")?;
        let n_head = get("attention.head_count")?;
        let n_head_kv = match md.opt_u32(&key("attention.head_count_kv"))? {
            Some(v) => v as usize,
            None => n_head,
        };
        let head_dim = match md.opt_u32(&key("attention.key_length"))? {
            Some(v) => v as usize,
            None if n_head > 0 => n_embd / n_head,
            None => 0,
        };
        if let Some(vl) = md.opt_u32(&key("attention.value_length"))? {
            if vl as usize != head_dim {
                return Err(Error::Unsupported(format!(
                    "value head size {vl} differs from key head size {head_dim}"
                )));
            }
        }
        let n_rot = match md.opt_u32(&key("rope.dimension_count"))? {
            Some(v) => v as usize,
            None => head_dim,
        };
        let rope_base = md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let mut rope_freq_scale = 1.0;
        if let Some(kind) = md.opt_str(&key("rope.scaling.type"))? {
            match kind {
                "none" => {}
                "linear" => {
                    let factor = md.opt_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0);
                    if !(factor.is_finite() && factor > 0.0) {
                        return Err(Error::BadHyperParameter(format!(
                            "rope.scaling.factor = {factor}"
                        )));
                    }
                    rope_freq_scale = 1.0 / factor;
                }
                other => return Err(Error::Unsupported(format!("RoPE scaling type '{other}'"))),
            }
        }
        let rms_eps = md
            .opt_f32(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5);
        let n_ctx_train = match md.opt_u32(&key("context_length"))? {
            Some(v) => v as usize,
            None => 2048,
        };
        let vocab_size = match md.opt_u32(&key("vocab_size"))? {
            Some(v) => v as usize,
            None => md
                .get_array("tokenizer.ggml.tokens")
                .map(|a| a.len())
                .or_else(|_| {
                    file.require_tensor("token_embd.weight")
                        .map(|t| t.n_rows() as usize)
                })?,
        };

        let fam = crate::model::spec::family(
            arch,
            md,
            &crate::model::spec::Common {
                n_layer: n_layer.min(MAX_LAYERS + 1),
                n_embd,
                n_head,
                head_dim,
                rope_base,
                rope_freq_scale,
            },
        )?;
        let cfg = ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_base,
            rope_freq_scale,
            rope_layout: arch.rope_layout(),
            rms_eps,
            n_ctx_train,
            vocab_size,
            fingerprint: file_fingerprint(file),
            layers: fam.layers,
            activation: fam.activation,
            embedding_scale: fam.embedding_scale,
            final_logit_softcap: fam.final_logit_softcap,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::BadHyperParameter(m));
        for (name, v) in [
            ("block_count", self.n_layer),
            ("embedding_length", self.n_embd),
            ("feed_forward_length", self.n_ff),
            ("attention.head_count", self.n_head),
            ("attention.head_count_kv", self.n_head_kv),
            ("head size", self.head_dim),
            ("vocab size", self.vocab_size),
        ] {
            let max = if name == "block_count" {
                MAX_LAYERS
            } else {
                MAX_DIM * 4
            };
            if v == 0 || v > max {
                return bad(format!("{name} = {v}"));
            }
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        if self
            .n_head
            .checked_mul(self.head_dim)
            .is_none_or(|d| d > MAX_DIM)
        {
            return bad(format!("{} heads of size {}", self.n_head, self.head_dim));
        }
        if self.n_rot > self.head_dim || !self.n_rot.is_multiple_of(2) {
            return bad(format!(
                "rope.dimension_count {} for head size {}",
                self.n_rot, self.head_dim
            ));
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad(format!("rope.freq_base = {}", self.rope_base));
        }
        if self.layers.len() != self.n_layer {
            return bad(format!(
                "{} layer specs for {} layers",
                self.layers.len(),
                self.n_layer
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return bad(format!("layer_norm_rms_epsilon = {}", self.rms_eps));
        }
        Ok(())
    }

    /// Whether any layer sees only a sliding window of keys.
    pub fn has_sliding_layers(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l.attention, LayerAttention::Sliding { .. }))
    }

    /// Width of the query projection output (all heads).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the key/value projection output (all kv heads).
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
