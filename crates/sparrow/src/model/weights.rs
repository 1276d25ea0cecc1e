//! Where each weight lives: views into the memory-mapped GGUF, checked for shape and type
//! at load time. Large matrices are never copied; only small vectors (norms, biases) are
//! dequantized into RAM because they are read on every token.

use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use sparrow_gguf::{GgufFile, TensorInfo};
use sparrow_quant::{GgmlType, QMatrix};
use std::ops::Range;

/// A weight matrix (rows × cols) stored in the file, plus an optional f32 bias.
#[derive(Clone, Debug)]
pub struct Linear {
    pub name: String,
    pub ty: GgmlType,
    pub bytes: Range<usize>,
    pub rows: usize,
    pub cols: usize,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    /// The matrix as a view over the file image `file_bytes`.
    pub fn matrix<'a>(&self, file_bytes: &'a [u8]) -> QMatrix<'a> {
        QMatrix::new(
            self.ty,
            &file_bytes[self.bytes.clone()],
            self.rows,
            self.cols,
        )
        .expect("shape was validated when the model was loaded")
    }
}

/// Weights of one decoder block.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub wo: Linear,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Linear,
    pub w_up: Linear,
    pub w_down: Linear,
}

/// All weights of the model.
#[derive(Clone, Debug)]
pub struct Weights {
    /// Token embedding table: one row of `n_embd` per token.
    pub token_embd: Linear,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// The output projection; the embedding table itself when the model ties them.
    pub output: Linear,
}

fn expect_shape(info: &TensorInfo, expected: &[u64]) -> Result<()> {
    if info.dims != expected {
        return Err(Error::TensorShape {
            tensor: info.name.clone(),
            found: info.dims.clone(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

fn check_type(info: &TensorInfo) -> Result<()> {
    if !info.ty.has_kernels() {
        return Err(Error::UnsupportedTensorType {
            tensor: info.name.clone(),
            ty: info.ty.name(),
        });
    }
    Ok(())
}

fn linear(file: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Linear> {
    let info = file.require_tensor(name)?;
    linear_from(info, rows, cols)
}

fn linear_from(info: &TensorInfo, rows: usize, cols: usize) -> Result<Linear> {
    expect_shape(info, &[cols as u64, rows as u64])?;
    check_type(info)?;
    let start = info.offset as usize;
    let lin = Linear {
        name: info.name.clone(),
        ty: info.ty,
        bytes: start..start + info.size as usize,
        rows,
        cols,
        bias: None,
    };
    Ok(lin)
}

fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let info = file.require_tensor(name)?;
    expect_shape(info, &[len as u64])?;
    check_type(info)?;
    let mut out = vec![0.0; len];
    sparrow_quant::dequantize(info.ty, file.tensor_data(info), &mut out)?;
    if let Some(i) = out.iter().position(|x| !x.is_finite()) {
        return Err(Error::BadHyperParameter(format!(
            "tensor '{name}' holds a non-finite value at index {i}"
        )));
    }
    Ok(out)
}

fn optional_bias(file: &GgufFile, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
    if file.tensor(name).is_some() {
        vector(file, name, len).map(Some)
    } else {
        Ok(None)
    }
}

impl Weights {
    /// Locate and check every tensor the architecture needs.
    pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights> {
        let d = cfg.n_embd;
        let token_embd = linear(file, "token_embd.weight", cfg.vocab_size, d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for l in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{l}.{s}");
            let mut wq = linear(file, &n("attn_q.weight"), cfg.q_dim(), d)?;
            let mut wk = linear(file, &n("attn_k.weight"), cfg.kv_dim(), d)?;
            let mut wv = linear(file, &n("attn_v.weight"), cfg.kv_dim(), d)?;
            wq.bias = optional_bias(file, &n("attn_q.bias"), cfg.q_dim())?;
            wk.bias = optional_bias(file, &n("attn_k.bias"), cfg.kv_dim())?;
            wv.bias = optional_bias(file, &n("attn_v.bias"), cfg.kv_dim())?;
            let mut wo = linear(file, &n("attn_output.weight"), d, cfg.q_dim())?;
            wo.bias = optional_bias(file, &n("attn_output.bias"), d)?;
            layers.push(LayerWeights {
                attn_norm: vector(file, &n("attn_norm.weight"), d)?,
                wq,
                wk,
                wv,
                wo,
                ffn_norm: vector(file, &n("ffn_norm.weight"), d)?,
                w_gate: linear(file, &n("ffn_gate.weight"), cfg.n_ff, d)?,
                w_up: linear(file, &n("ffn_up.weight"), cfg.n_ff, d)?,
                w_down: linear(file, &n("ffn_down.weight"), d, cfg.n_ff)?,
            });
        }
        let output = match file.tensor("output.weight") {
            Some(info) => linear_from(info, cfg.vocab_size, d)?,
            None => token_embd.clone(),
        };
        Ok(Weights {
            output_norm: vector(file, "output_norm.weight", d)?,
            token_embd,
            layers,
            output,
        })
    }
}
