//! What each layer of a model is, as data: the forward pass composes every layer from an
//! attention block and an FFN block that read a [`LayerSpec`], so a model family is a
//! function from its GGUF metadata to specs ([`family`]), not a branch in the loop.

use crate::error::{Error, Result};
use crate::model::config::Architecture;
use sparrow_gguf::Metadata;

/// Which keys a layer's queries may see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerAttention {
    /// Every earlier position (the user's attention policy chooses what is read).
    Global,
    /// Only the last `window` positions, the query's own included (the model was trained
    /// with this mask; its keys are kept in a ring of that size, so the layer's memory does
    /// not grow with the context).
    Sliding { window: usize },
}

/// The activation of a gated FFN: `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU): llama, qwen2, mistral.
    Silu,
    /// GELU in its tanh form (GeGLU): Gemma.
    GeluTanh,
}

impl Activation {
    /// `act(g) * u` for every element, into `g`.
    pub fn gate(self, g: &mut [f32], u: &[f32]) {
        match self {
            Activation::Silu => g
                .iter_mut()
                .zip(u)
                .for_each(|(g, &u)| *g = *g / (1.0 + (-*g).exp()) * u),
            Activation::GeluTanh => g
                .iter_mut()
                .zip(u)
                .for_each(|(g, &u)| *g = gelu_tanh(*g) * u),
        }
    }
}

/// GELU's tanh approximation: `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

/// One decoder layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    pub attention: LayerAttention,
    /// RoPE frequency base of this layer (Gemma 3: 10K on sliding layers, 1M on global).
    pub rope_base: f32,
    /// Positions are multiplied by this before rotation (linear scaling).
    pub rope_freq_scale: f32,
    /// Scale of the query·key products. The kernels apply `1/√head_dim`; a layer whose
    /// scale differs has its queries multiplied by the ratio.
    pub attn_scale: f32,
    /// RMS-normalise each query and key head (with its own weights) before RoPE.
    pub qk_norm: bool,
    /// RMS-normalise the attention block's and the FFN block's outputs before they are
    /// added to the residual stream (Gemma 2/3's "sandwich" norms).
    pub post_norms: bool,
}

/// What a family adds to the common hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilySpec {
    pub layers: Vec<LayerSpec>,
    pub activation: Activation,
    /// Embedding rows are multiplied by this (Gemma: √n_embd).
    pub embedding_scale: Option<f32>,
    /// Logits pass through `c · tanh(logit / c)` (Gemma 2 style soft-capping).
    pub final_logit_softcap: Option<f32>,
}

/// The common hyper-parameters a family's specs are derived from.
pub struct Common {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub rope_base: f32,
    pub rope_freq_scale: f32,
}

/// The specs of `arch`'s layers from the file's metadata.
pub fn family(arch: Architecture, md: &Metadata, c: &Common) -> Result<FamilySpec> {
    let key = |k: &str| format!("{}.{k}", arch.name());
    let plain = LayerSpec {
        attention: LayerAttention::Global,
        rope_base: c.rope_base,
        rope_freq_scale: c.rope_freq_scale,
        attn_scale: 1.0 / (c.head_dim as f32).sqrt(),
        qk_norm: false,
        post_norms: false,
    };
    match arch {
        Architecture::Llama | Architecture::Qwen2 | Architecture::Mistral => Ok(FamilySpec {
            layers: vec![plain; c.n_layer],
            activation: Activation::Silu,
            embedding_scale: None,
            final_logit_softcap: None,
        }),
        Architecture::Gemma3 => {
            // Sliding-window layers with a global one every `pattern` layers (the last of
            // each group), as Gemma 3 was trained; no window key means all global.
            let window = md.opt_u32(&key("attention.sliding_window"))?.unwrap_or(0) as usize;
            let pattern = md
                .opt_u32(&key("attention.sliding_window_pattern"))?
                .unwrap_or(6) as usize;
            let local_base = md.opt_f32(&key("rope.freq_base_swa"))?.unwrap_or(10_000.0);
            if !(local_base.is_finite() && local_base > 0.0) {
                return Err(Error::BadHyperParameter(format!(
                    "rope.freq_base_swa = {local_base}"
                )));
            }
            // The 27B model scales by the model width per head, not the head size (Gemma's
            // `query_pre_attn_scalar`).
            let attn_scale = if c.n_layer == 62 {
                1.0 / ((c.n_embd / c.n_head) as f32).sqrt()
            } else {
                1.0 / (c.head_dim as f32).sqrt()
            };
            let layers = (0..c.n_layer)
                .map(|l| {
                    let sliding = window > 0 && (pattern == 0 || l % pattern < pattern - 1);
                    LayerSpec {
                        attention: if sliding {
                            LayerAttention::Sliding { window }
                        } else {
                            LayerAttention::Global
                        },
                        rope_base: if sliding { local_base } else { c.rope_base },
                        rope_freq_scale: if sliding { 1.0 } else { c.rope_freq_scale },
                        attn_scale,
                        qk_norm: true,
                        post_norms: true,
                    }
                })
                .collect();
            let softcap = md
                .opt_f32(&key("final_logit_softcapping"))?
                .filter(|&c| c != 0.0);
            if let Some(cap) = softcap {
                if !(cap.is_finite() && cap > 0.0) {
                    return Err(Error::BadHyperParameter(format!(
                        "final_logit_softcapping = {cap}"
                    )));
                }
            }
            Ok(FamilySpec {
                layers,
                activation: Activation::GeluTanh,
                embedding_scale: Some((c.n_embd as f32).sqrt()),
                final_logit_softcap: softcap,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_tanh_matches_its_f64_formula_and_known_values() {
        for &x in &[-6.0f32, -1.5, -0.3, 0.0, 0.2, 1.0, 2.5, 8.0] {
            let xd = x as f64;
            let want = 0.5
                * xd
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
            assert!((gelu_tanh(x) as f64 - want).abs() < 1e-6, "{x}");
        }
        // GELU(1) ≈ 0.8412 (tanh form), GELU(-1) ≈ -0.1588.
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert!((gelu_tanh(-1.0) + 0.158_808).abs() < 1e-5);
    }

    #[test]
    fn silu_gate_is_x_sigmoid_x_times_up() {
        let mut g = [2.0f32, -1.0];
        Activation::Silu.gate(&mut g, &[3.0, 0.5]);
        let s = |x: f64| x / (1.0 + (-x).exp());
        assert!((g[0] as f64 - s(2.0) * 3.0).abs() < 1e-6);
        assert!((g[1] as f64 - s(-1.0) * 0.5).abs() < 1e-6);
    }
}
