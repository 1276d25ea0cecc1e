//! What each layer of a model is, as data: the forward pass composes every layer from an
//! attention block and an FFN block that read a [`LayerSpec`], so a model family is a
//! function from its GGUF metadata to specs ([`family`]), not a branch in the loop.

use crate::error::{Error, Result};
use crate::model::arch::Architecture;
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
    /// `act(g) * u` for every element, into `g` (across the rayon pool for long batches).
    pub fn gate(self, g: &mut [f32], u: &[f32]) {
        use rayon::prelude::*;
        const CHUNK: usize = 16 * 1024;
        let run = |g: &mut [f32], u: &[f32]| match self {
            Activation::Silu => g.iter_mut().zip(u).for_each(|(g, &u)| *g = silu(*g) * u),
            Activation::GeluTanh => g
                .iter_mut()
                .zip(u)
                .for_each(|(g, &u)| *g = gelu_tanh(*g) * u),
        };
        if g.len() <= CHUNK {
            run(g, u);
        } else {
            g.par_chunks_mut(CHUNK)
                .zip(u.par_chunks(CHUNK))
                .for_each(|(g, u)| run(g, u));
        }
    }
}

/// `x · sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// GELU's tanh approximation, `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`, written as
/// `x · sigmoid(2z)` (the same function: `(1 + tanh z)/2 = sigmoid(2z)`), so one [`exp`]
/// does it.
pub fn gelu_tanh(x: f32) -> f32 {
    const TWO_SQRT_2_OVER_PI: f32 = 1.595_769;
    x / (1.0 + exp(-TWO_SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)))
}

/// `e^x` to within 2 ulp over the range where f32 is finite (0 below, `f32::MAX`-ish
/// above), with no branches or library calls, so loops over it vectorize: the activations
/// call it once per FFN element, where libm's `expf`/`tanhf` took a fifth of a Gemma
/// prefill. `e^x = 2^n · e^r`, `n = round(x / ln 2)`, `r = x − n ln 2` in two parts, `e^r`
/// by its degree-6 Taylor polynomial (|r| ≤ ln2/2).
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5·2²³ rounds to an integer in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let ni = t.to_bits() as i32 - MAGIC.to_bits() as i32;
    // 2^n in two halves so n = -126..128 stays a normal number at every step.
    let half = ni >> 1;
    let a = f32::from_bits(((half + 127) << 23) as u32);
    let b = f32::from_bits(((ni - half + 127) << 23) as u32);
    p * a * b
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
            let sliding = sliding_layers(md, &key("attention.sliding_window_pattern"), c.n_layer)?;
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
                    let sliding = window > 0 && sliding[l];
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

/// Which layers slide, from `key`: absent, a period `p` (the last layer of every `p` is
/// global; 6 when absent, Gemma 3's; 0 means every layer slides), or one bool per layer.
fn sliding_layers(md: &Metadata, key: &str, n_layer: usize) -> Result<Vec<bool>> {
    use sparrow_gguf::Value;
    match md.get(key) {
        Some(Value::Array(flags)) => {
            if flags.len() != n_layer {
                return Err(Error::BadHyperParameter(format!(
                    "{key} has {} entries for {n_layer} layers",
                    flags.len()
                )));
            }
            flags
                .iter()
                .map(|f| match f {
                    Value::Bool(b) => Ok(*b),
                    other => Err(Error::BadHyperParameter(format!(
                        "{key} holds a {} where a bool is expected",
                        other.type_name()
                    ))),
                })
                .collect()
        }
        _ => {
            let p = md.opt_u32(key)?.unwrap_or(6) as usize;
            Ok((0..n_layer).map(|l| p == 0 || l % p < p - 1).collect())
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
    fn sliding_layers_from_a_period_or_one_flag_per_layer() {
        use sparrow_gguf::{Metadata, Value};
        let key = "gemma3.attention.sliding_window_pattern";
        let md = |v: Option<Value>| -> Metadata {
            v.map(|v| (key.to_string(), v)).into_iter().collect()
        };
        // Absent: Gemma 3's period of 6, the last of each group global.
        let got = sliding_layers(&md(None), key, 8).unwrap();
        assert_eq!(got, [true, true, true, true, true, false, true, true]);
        let got = sliding_layers(&md(Some(Value::U32(3))), key, 6).unwrap();
        assert_eq!(got, [true, true, false, true, true, false]);
        let got = sliding_layers(&md(Some(Value::U32(0))), key, 3).unwrap();
        assert_eq!(got, [true, true, true]);
        // One bool per layer, taken as written (not a period).
        let flags = [false, true, true, false];
        let arr = Value::Array(flags.iter().map(|&b| Value::Bool(b)).collect());
        assert_eq!(sliding_layers(&md(Some(arr)), key, 4).unwrap(), flags);
        // A wrong count or element type is refused, naming the key.
        let short = Value::Array(vec![Value::Bool(true)]);
        let e = sliding_layers(&md(Some(short)), key, 4)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(key) && e.contains("1 entries for 4 layers"),
            "{e}"
        );
        let wrong = Value::Array(vec![Value::U32(1), Value::U32(0)]);
        let e = sliding_layers(&md(Some(wrong)), key, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains("u32"), "{e}");
    }

    #[test]
    fn gates_match_f64_on_long_and_short_rows() {
        let s = |x: f64| x / (1.0 + (-x).exp());
        for n in [2usize, 40_000] {
            let g0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
            let u: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut g = g0.clone();
            Activation::Silu.gate(&mut g, &u);
            for i in 0..n {
                let want = s(g0[i] as f64) * u[i] as f64;
                assert!((g[i] as f64 - want).abs() < 1e-5, "{i}");
            }
        }
    }
}
