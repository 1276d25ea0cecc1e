//! Where each weight lives: views into the memory-mapped GGUF, checked for shape and type
//! at load time. Large matrices are never copied; only small vectors (norms, biases) are
//! dequantized into RAM because they are read on every token.

use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use sparrow_gguf::{GgufFile, TensorInfo};
use sparrow_quant::{packed, row_groups, GgmlType, Kernels, QMatrix};
use std::ops::Range;
use std::sync::Arc;

/// A weight matrix (rows × cols) stored in the file, plus an optional f32 bias.
#[derive(Clone, Debug)]
pub struct Linear {
    pub name: String,
    pub ty: GgmlType,
    pub bytes: Range<usize>,
    pub rows: usize,
    pub cols: usize,
    pub bias: Option<Vec<f32>>,
    /// The matrix copied into RAM for decode (see [`Weights::repack`]) and read instead of
    /// the file: in row groups if asked (`LoadOptions::row_groups`) and the active SIMD level
    /// has their kernels, else in sparrow's packed layout for the types that have one, else
    /// as stored.
    pub in_ram: Option<Arc<memmap2::Mmap>>,
    /// Whether `in_ram` holds the rows in row groups ([`sparrow_quant::row_groups`]).
    pub grouped: bool,
}

/// Rows copied per step of [`Linear::repack`] before their pages of the file mapping are
/// released, so loading never holds a whole large matrix twice.
const REPACK_CHUNK_BYTES: usize = 8 << 20;

impl Linear {
    /// The matrix as a view over its copy in RAM, or else over the file image `file_bytes`.
    pub fn matrix<'a>(&'a self, file_bytes: &'a [u8]) -> QMatrix<'a> {
        match &self.in_ram {
            Some(p) if self.grouped => QMatrix::new_grouped(self.ty, p, self.rows, self.cols),
            Some(p) if packed::is_packable(self.ty) => {
                QMatrix::new_packed(self.ty, p, self.rows, self.cols)
            }
            Some(p) => QMatrix::new(self.ty, p, self.rows, self.cols),
            None => QMatrix::new(
                self.ty,
                &file_bytes[self.bytes.clone()],
                self.rows,
                self.cols,
            ),
        }
        .expect("shape was validated when the model was loaded")
    }

    /// Copies this matrix into RAM (in row groups if `row_groups` wants its type and the
    /// level has their kernels, else packed if its type has a packed layout), releasing its
    /// pages of the file mapping as it goes unless `keep_mapped`; the bytes copied.
    fn repack(
        &mut self,
        file: &GgufFile,
        keep_mapped: bool,
        row_groups: RowGroups,
    ) -> Result<usize> {
        let src = &file.bytes()[self.bytes.clone()];
        if self.in_ram.is_some() || self.rows == 0 || src.is_empty() {
            return Ok(0);
        }
        let cannot =
            |e: String| Error::Other(format!("tensor '{}': cannot repack: {e}", self.name));
        // Anonymous memory asked for huge pages: decode streams every byte once per token,
        // and 2 MiB pages spare the TLB misses of 4 KiB ones and let the hardware prefetcher
        // run on across page boundaries (on Linux with transparent huge pages on `madvise`;
        // measured: decode ~5-8% faster than reading the same bytes from the file mapping).
        let mut dst = memmap2::MmapOptions::new()
            .len(src.len())
            .map_anon()
            .map_err(|e| cannot(e.to_string()))?;
        #[cfg(target_os = "linux")]
        let _ = dst.advise(memmap2::Advice::HugePage);
        let row_bytes = src.len() / self.rows;
        // Row groups if asked and the level has their kernels (see `LoadOptions::row_groups`);
        // chunks of whole groups.
        let grouped = row_groups.wants(self.ty)
            && row_groups::is_groupable(self.ty, self.rows)
            && Kernels::get(self.ty).is_some_and(|k| k.dot_q8_groups.is_some());
        let chunk_rows = REPACK_CHUNK_BYTES.div_ceil(row_bytes).max(1);
        let chunk = chunk_rows.next_multiple_of(row_groups::GROUP_ROWS) * row_bytes;
        for (i, (s, d)) in src.chunks(chunk).zip(dst.chunks_mut(chunk)).enumerate() {
            if grouped {
                row_groups::group_rows(self.ty, s, row_bytes, d)
                    .map_err(|e| cannot(e.to_string()))?;
            } else if packed::is_packable(self.ty) {
                packed::pack_rows(self.ty, s, row_bytes, d).map_err(|e| cannot(e.to_string()))?;
            } else {
                d.copy_from_slice(s);
            }
            if !keep_mapped {
                let start = self.bytes.start + i * chunk;
                file.release(start..start + s.len());
            }
        }
        let dst = dst.make_read_only().map_err(|e| cannot(e.to_string()))?;
        self.in_ram = Some(Arc::new(dst));
        self.grouped = grouped;
        Ok(src.len())
    }
}

/// Which weight matrices go into row groups at load ([`crate::LoadOptions::row_groups`]).
///
/// A pass of a few tokens — a speculative check, a batch of serving slots — costs about
/// half as much in row groups (the 1.5B model, two Zen 4 cores: 8 tokens in 2.1 one-token
/// passes instead of 3.3; the 0.5B's Q5_0 matrices 8 tokens in 22–24 ms instead of 37–43).
/// A one-token pass gains for Q5_0, whose row kernels spend more instructions per byte than
/// a core streams, and loses ~5–9% for Q4_K and Q6_K. Either way a matrix's products give
/// every token the same bits at every batch size below the panels' threshold, and a Q4_K or
/// Q6_K matrix gives the bits of its ggml rows (both sum in block totals), so the choice
/// between [`RowGroups::Decode`] and [`RowGroups::Batched`] changes speed, not results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RowGroups {
    /// Every matrix as stored (or packed): the row kernels throughout.
    Off,
    /// The formats whose one-token products are faster in row groups too (Q5_0), the
    /// others as stored: plain decoding.
    #[default]
    Decode,
    /// Every format that has row groups (Q5_0, Q4_K, Q6_K): passes of a few tokens.
    Batched,
}

impl RowGroups {
    /// Whether a matrix of `ty` goes into row groups under this choice (where it can:
    /// [`sparrow_quant::row_groups::is_groupable`] and the level's kernels decide too).
    pub fn wants(self, ty: GgmlType) -> bool {
        match self {
            RowGroups::Off => false,
            RowGroups::Decode => ty == GgmlType::Q5_0,
            RowGroups::Batched => true,
        }
    }
}

/// What [`Weights::repack`] did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Repacked {
    /// Bytes copied.
    pub bytes: usize,
    /// Whether some matrix went into row groups.
    pub row_groups: bool,
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
    /// Per-head RMS norms of queries and keys (the spec's `qk_norm`).
    pub qk_norm: Option<QkNorm>,
    /// Norms of the attention and FFN outputs (the spec's `post_norms`).
    pub post_norms: Option<PostNorms>,
}

/// Weights of the per-head query and key norms (`head_dim` each, shared by the heads).
#[derive(Clone, Debug)]
pub struct QkNorm {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
}

/// Weights of the norms applied to each block's output before the residual add.
#[derive(Clone, Debug)]
pub struct PostNorms {
    pub attn: Vec<f32>,
    pub ffn: Vec<f32>,
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
        in_ram: None,
        grouped: false,
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
            let spec = &cfg.layers[l];
            let qk_norm = match spec.qk_norm {
                true => Some(QkNorm {
                    q: vector(file, &n("attn_q_norm.weight"), cfg.head_dim)?,
                    k: vector(file, &n("attn_k_norm.weight"), cfg.head_dim)?,
                }),
                false => None,
            };
            let post_norms = match spec.post_norms {
                true => Some(PostNorms {
                    attn: vector(file, &n("post_attention_norm.weight"), d)?,
                    ffn: vector(file, &n("post_ffw_norm.weight"), d)?,
                }),
                false => None,
            };
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
                qk_norm,
                post_norms,
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

    /// The matrices [`Weights::repack`] copies, in the order it copies them, with whether
    /// each one's pages of the file mapping stay (a tied output is the embedding table).
    fn repackable(&mut self) -> Vec<(&mut Linear, bool)> {
        let tied = self.output.bytes == self.token_embd.bytes;
        let mut all: Vec<(&mut Linear, bool)> = Vec::new();
        for l in &mut self.layers {
            for w in [
                &mut l.wq,
                &mut l.wk,
                &mut l.wv,
                &mut l.wo,
                &mut l.w_gate,
                &mut l.w_up,
                &mut l.w_down,
            ] {
                all.push((w, false));
            }
        }
        all.push((&mut self.output, tied));
        all
    }

    /// Bytes [`Weights::repack`] would copy into anonymous memory (0 once done).
    pub fn repack_bytes(&mut self) -> usize {
        self.repackable()
            .iter()
            .filter(|(w, _)| w.in_ram.is_none())
            .map(|(w, _)| w.bytes.len())
            .sum()
    }

    /// Locks every repacked copy in RAM (`mlock`); stops at the first refusal.
    pub fn lock_in_ram(&mut self) -> std::io::Result<()> {
        for (w, _) in self.repackable() {
            if let Some(m) = &w.in_ram {
                m.lock()?;
            }
        }
        Ok(())
    }

    /// Copies every matrix the decoder multiplies (not the embedding table, of which one
    /// row per token is read) into RAM for decode: Q5_0 in sparrow's packed layout
    /// ([`sparrow_quant::packed`]), Q4_K and Q6_K in row groups if `row_groups` and the
    /// active level has their kernels ([`sparrow_quant::row_groups`]), other types as
    /// stored, in memory asked for huge pages;
    /// their pages of the file mapping are released as they are copied, so resident memory
    /// stays about the same. Returns the bytes copied and whether row groups were made.
    pub fn repack(&mut self, file: &GgufFile, row_groups: RowGroups) -> Result<Repacked> {
        let mut done = Repacked::default();
        // A tied output is the embedding table, whose rows are still read from the file.
        for (w, keep_mapped) in self.repackable() {
            done.bytes += w.repack(file, keep_mapped, row_groups)?;
            done.row_groups |= w.grouped;
        }
        Ok(done)
    }
}
