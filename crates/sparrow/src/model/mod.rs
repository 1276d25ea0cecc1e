//! The llama-family decoder (llama, qwen2, mistral): one forward pass that reads top to
//! bottom like the model's equations. The [`Model`] is immutable and shareable; everything a
//! sequence owns (KV cache, position, scratch) lives in a [`State`].

pub mod config;
pub mod rope;
pub mod weights;

use crate::attention::{attend, AttnShape, DenseAttention, SparsePolicy};
use crate::error::{Error, Result};
use crate::kv_blocks::{BlockTable, DEFAULT_BLOCK};
use crate::kv_cache::{KvCache, KvTypes};
use crate::kv_store::KvStore;
pub use config::{Architecture, ModelConfig, RopeLayout};
use rope::RopeTable;
use sparrow_gguf::GgufFile;
use sparrow_quant::{matmul, matvec, matvec_multi};
use std::path::Path;
use std::sync::Arc;
use weights::{Linear, Weights};

/// How a model is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Copy the matrices whose ggml layout is slow to decode (Q5_0) into RAM in sparrow's
    /// packed layout ([`sparrow_quant::packed`]), releasing their pages of the mapping.
    /// Results are the same integer sums; decode reads them nearly twice as fast.
    pub repack: bool,
}

impl Default for LoadOptions {
    /// Repacking on wherever a SIMD kernel reads the packed layout (the scalar one only
    /// unpacks it again).
    fn default() -> Self {
        LoadOptions {
            repack: sparrow_quant::SimdLevel::active() != sparrow_quant::SimdLevel::Scalar,
        }
    }
}

/// A loaded model: configuration and weight views into the mapped file (or, for
/// repacked matrices, into RAM).
pub struct Model {
    file: Arc<GgufFile>,
    pub config: ModelConfig,
    weights: Weights,
}

/// Which logits a forward pass should produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only for the last token of the batch (generation).
    Last,
    /// For every token of the batch (perplexity, speculative checks).
    All,
    /// None (prefill of a prefix whose continuation is known).
    None,
    /// For the last `k` tokens of the batch (scoring only part of a chunk).
    Tail(usize),
}

/// Per-sequence state: the KV cache, how many positions are filled, the attention backend
/// (a per-sequence choice, since sparse policies keep per-sequence metadata), and scratch.
pub struct State {
    /// Private: everything outside the model reads it through [`State::kv`] and replaces
    /// positions through [`State::import_prefix`], so a store that pages blocks out of RAM
    /// can take its place without its users changing.
    kv: Box<dyn KvStore>,
    attention: Box<dyn SparsePolicy>,
    /// Which fixed-size blocks of each layer are sealed (the paged view of `kv`).
    blocks: BlockTable,
    rope: Arc<RopeTable>,
    n_past: usize,
    vocab: usize,
    scratch: Scratch,
}

#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xb: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    logits: Vec<f32>,
}

impl State {
    /// Number of positions already in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Context size (cache capacity in positions).
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    /// Replace the attention backend (e.g. with a sparse policy) for what follows.
    /// The new backend's block size pages the cache; blocks already complete are sealed for
    /// it at the next forward pass.
    pub fn set_attention(&mut self, backend: Box<dyn SparsePolicy>) {
        self.blocks = BlockTable::new(
            backend.block_size().unwrap_or(DEFAULT_BLOCK),
            self.kv.n_layer(),
        );
        self.attention = backend;
    }

    /// The attention backend in use.
    pub fn attention(&self) -> &dyn SparsePolicy {
        self.attention.as_ref()
    }

    /// Logits of the last token of the most recent forward pass that produced logits.
    pub fn last_logits(&self) -> &[f32] {
        let l = &self.scratch.logits;
        &l[l.len().saturating_sub(self.vocab)..]
    }

    /// Forget everything; the next forward starts at position 0.
    pub fn reset(&mut self) {
        self.attention.forget_from(0);
        self.blocks.forget_from(0);
        self.n_past = 0;
    }

    /// Drop positions beyond `n` (keep a shared prefix, discard the rest).
    pub fn truncate(&mut self, n: usize) {
        self.attention.forget_from(n);
        self.blocks.forget_from(n);
        self.n_past = self.n_past.min(n);
    }
}

/// Prefix restore (prompt cache files, prefix reuse across requests). Added for the serving
/// issue; nothing above depends on it.
impl State {
    /// The KV cache, read-only (its types and shape, exports for prompt cache files,
    /// evaluation).
    pub fn kv(&self) -> &dyn KvStore {
        self.kv.as_ref()
    }

    /// Replace positions `0..n` with `bytes` made by [`KvStore::export_prefix`] on a store of
    /// the same types and shape, and continue from position `n`.
    pub fn import_prefix(&mut self, n: usize, bytes: &[u8]) -> Result<()> {
        if n > self.n_ctx() {
            return Err(Error::ContextFull {
                n_ctx: self.n_ctx(),
            });
        }
        self.kv.import_prefix(n, bytes).map_err(Error::Other)?;
        self.set_n_past(n)
    }

    /// Declare positions `0..n` of the cache filled (after importing them into `kv`).
    pub fn set_n_past(&mut self, n: usize) -> Result<()> {
        if n > self.n_ctx() {
            return Err(Error::ContextFull {
                n_ctx: self.n_ctx(),
            });
        }
        // The cache's contents were replaced from outside: nothing known about them holds.
        self.attention.forget_from(0);
        self.blocks.forget_from(0);
        self.n_past = n;
        Ok(())
    }
}

fn resize(v: &mut Vec<f32>, n: usize) {
    v.resize(n, 0.0);
}

fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// Adds `w`'s bias (if any) to every row of `out`.
fn add_bias(w: &Linear, out: &mut [f32]) {
    if let Some(b) = &w.bias {
        for row in out.chunks_exact_mut(w.rows) {
            row.iter_mut().zip(b).for_each(|(o, &bv)| *o += bv);
        }
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

impl Model {
    /// Open a GGUF file and load a model from it with the default [`LoadOptions`].
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Self::load_with(path, LoadOptions::default())
    }

    /// Open a GGUF file and load a model from it.
    pub fn load_with(path: impl AsRef<Path>, options: LoadOptions) -> Result<Model> {
        let file = GgufFile::open(path)?;
        Self::from_gguf_with(Arc::new(file), options)
    }

    /// Build a model from an already-open GGUF file with the default [`LoadOptions`].
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Model> {
        Self::from_gguf_with(file, LoadOptions::default())
    }

    /// Build a model from an already-open GGUF file.
    pub fn from_gguf_with(file: Arc<GgufFile>, options: LoadOptions) -> Result<Model> {
        let config = ModelConfig::from_gguf(&file)?;
        let mut weights = Weights::load(&file, &config)?;
        if options.repack {
            weights.repack(&file)?;
        }
        Ok(Model {
            file,
            config,
            weights,
        })
    }

    /// The GGUF file the model was loaded from.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// A fresh sequence state for up to `n_ctx` positions, with keys and values of
    /// `kv_type` (one [`crate::KvType`] for both, or a [`KvTypes`]). A Q8_0 cache
    /// the model's head size does not suit is an error.
    pub fn new_state(&self, n_ctx: usize, kv_type: impl Into<KvTypes>) -> Result<State> {
        if n_ctx == 0 {
            return Err(Error::BadHyperParameter("context size 0".into()));
        }
        let c = &self.config;
        let kv_types: KvTypes = kv_type.into();
        self.check_state_fits(n_ctx, kv_types)?;
        let rope = RopeTable::new(
            n_ctx,
            c.n_rot,
            c.rope_base,
            c.rope_freq_scale,
            c.rope_layout,
        );
        Ok(State {
            kv: Box::new(
                KvCache::try_new(kv_types, c.n_layer, n_ctx, c.kv_dim(), c.head_dim)
                    .map_err(Error::Other)?,
            ),
            attention: Box::new(DenseAttention),
            blocks: BlockTable::new(DEFAULT_BLOCK, c.n_layer),
            rope: Arc::new(rope),
            n_past: 0,
            vocab: c.vocab_size,
            scratch: Scratch::default(),
        })
    }

    /// Refuse a state whose KV cache and RoPE table alone pass the machine's memory (a
    /// context size from a hostile file, or a `-c` typed with one zero too many).
    fn check_state_fits(&self, n_ctx: usize, kv_types: KvTypes) -> Result<()> {
        let c = &self.config;
        let per_position = (kv_types.k.row_bytes(c.kv_dim()) + kv_types.v.row_bytes(c.kv_dim()))
            as u128
            * c.n_layer as u128
            + 4 * c.n_rot as u128;
        let need = per_position.saturating_mul(n_ctx as u128);
        let need = u64::try_from(need).unwrap_or(u64::MAX);
        match crate::memory::machine_memory() {
            Some(have) if need > have => Err(Error::ContextTooLarge { n_ctx, need, have }),
            _ => Ok(()),
        }
    }

    fn linear(&self, w: &Linear, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let m = w.matrix(self.file.bytes());
        if n == 1 {
            matvec(&m, x, out)?;
        } else {
            matmul(&m, x, out)?;
        }
        add_bias(w, out);
        Ok(())
    }

    /// Several projections of the same input `x` (q/k/v, gate/up): in decode one parallel
    /// pass over all their rows ([`matvec_multi`]), otherwise one batched product each.
    fn linears<const N: usize>(
        &self,
        ws: [&Linear; N],
        x: &[f32],
        n: usize,
        mut outs: [&mut [f32]; N],
    ) -> Result<()> {
        if n == 1 {
            let ms = ws.map(|w| w.matrix(self.file.bytes()));
            matvec_multi(&ms, x, &mut outs)?;
            for (w, out) in ws.into_iter().zip(outs) {
                add_bias(w, out);
            }
        } else {
            for (w, out) in ws.into_iter().zip(outs) {
                self.linear(w, x, n, out)?;
            }
        }
        Ok(())
    }

    /// Run `tokens` through the model at the state's next positions, append their keys and
    /// values to the cache, and return the logits asked for (`vocab` floats per row).
    pub fn forward<'s>(
        &self,
        state: &'s mut State,
        tokens: &[u32],
        want: Logits,
    ) -> Result<&'s [f32]> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Ok(&[]);
        }
        let pos0 = state.n_past;
        if pos0 + n > state.n_ctx() {
            return Err(Error::ContextFull {
                n_ctx: state.n_ctx(),
            });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(Error::BadToken {
                id,
                vocab: c.vocab_size,
            });
        }
        let (d, qd, kvd, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
        let shape = AttnShape {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
        };
        let bytes = self.file.bytes();
        let s = &mut state.scratch;
        resize(&mut s.x, n * d);
        resize(&mut s.xb, n * d);
        resize(&mut s.q, n * qd);
        resize(&mut s.k, n * kvd);
        resize(&mut s.v, n * kvd);
        resize(&mut s.att, n * qd);
        resize(&mut s.proj, n * d);
        resize(&mut s.gate, n * ff);
        resize(&mut s.up, n * ff);

        let embd = self.weights.token_embd.matrix(bytes);
        for (row, &t) in s.x.chunks_exact_mut(d).zip(tokens) {
            embd.dequantize_row(t as usize, row)?;
        }

        for (l, w) in self.weights.layers.iter().enumerate() {
            for (x, xb) in s.x.chunks_exact(d).zip(s.xb.chunks_exact_mut(d)) {
                rms_norm(x, &w.attn_norm, c.rms_eps, xb);
            }
            self.linears(
                [&w.wq, &w.wk, &w.wv],
                &s.xb,
                n,
                [&mut s.q, &mut s.k, &mut s.v],
            )?;
            for i in 0..n {
                let pos = pos0 + i;
                state
                    .rope
                    .apply(&mut s.q[i * qd..(i + 1) * qd], c.head_dim, pos);
                state
                    .rope
                    .apply(&mut s.k[i * kvd..(i + 1) * kvd], c.head_dim, pos);
                state.kv.append(
                    l,
                    pos,
                    &s.k[i * kvd..(i + 1) * kvd],
                    &s.v[i * kvd..(i + 1) * kvd],
                );
            }
            // Positions below `pos0` may have been rewritten since their block was sealed
            // (a forward pass that failed midway): reseal from there.
            state.blocks.forget_layer_from(l, pos0);
            state.blocks.seal(
                shape,
                state.kv.as_ref(),
                l,
                pos0 + n,
                state.attention.as_mut(),
            );
            attend(
                state.attention.as_mut(),
                shape,
                state.kv.as_ref(),
                l,
                &s.q,
                pos0,
                &mut s.att,
            );
            self.linear(&w.wo, &s.att, n, &mut s.proj)?;
            s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);

            for (x, xb) in s.x.chunks_exact(d).zip(s.xb.chunks_exact_mut(d)) {
                rms_norm(x, &w.ffn_norm, c.rms_eps, xb);
            }
            self.linears([&w.w_gate, &w.w_up], &s.xb, n, [&mut s.gate, &mut s.up])?;
            s.gate
                .iter_mut()
                .zip(&s.up)
                .for_each(|(g, &u)| *g = silu(*g) * u);
            self.linear(&w.w_down, &s.gate, n, &mut s.proj)?;
            s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
        }
        state.n_past = pos0 + n;

        let rows: std::ops::Range<usize> = match want {
            Logits::None => return Ok(&[]),
            Logits::Last => n - 1..n,
            Logits::All => 0..n,
            Logits::Tail(0) => return Ok(&[]),
            Logits::Tail(k) => n - k.min(n)..n,
        };
        let m = rows.len();
        for (j, i) in rows.enumerate() {
            let (x, xb) = (&s.x[i * d..(i + 1) * d], &mut s.xb[j * d..(j + 1) * d]);
            rms_norm(x, &self.weights.output_norm, c.rms_eps, xb);
        }
        resize(&mut s.logits, m * c.vocab_size);
        let out = self.weights.output.matrix(bytes);
        if m == 1 {
            matvec(&out, &s.xb[..d], &mut s.logits)?;
        } else {
            matmul(&out, &s.xb[..m * d], &mut s.logits)?;
        }
        Ok(&s.logits)
    }
}
