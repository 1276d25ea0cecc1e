//! The decoder of every family sparrow runs (llama, qwen2, mistral, gemma3), each a list of
//! layer specs ([`spec`]): one forward pass that reads top to bottom like the model's
//! equations. The [`Model`] is immutable and shareable; everything a
//! sequence owns (KV cache, position, scratch) lives in a [`State`].

pub mod arch;
pub mod config;
mod forward;
mod head;
pub mod rope;
pub mod spec;
pub mod weights;

use crate::attention::{DenseAttention, SparsePolicy};
use crate::error::{Error, Result};
use crate::kv::{BlockTable, KvOptions, KvShape, KvStore, KvTypes, DEFAULT_BLOCK};
pub use arch::{Architecture, RopeLayout};
pub use config::ModelConfig;
pub use forward::{SeqStep, Workspace};
pub use head::VocabHead;
use rope::RopeTable;
use sparrow_gguf::GgufFile;
pub use spec::{Activation, LayerAttention, LayerSpec};
use std::path::Path;
use std::sync::Arc;
pub use weights::RowGroups;
use weights::Weights;

/// How a model is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Copy the matrices whose ggml layout is slow to decode (Q5_0) into RAM in sparrow's
    /// packed layout ([`sparrow_quant::packed`]), releasing their pages of the mapping.
    /// Results are the same integer sums; decode reads them nearly twice as fast.
    pub repack: bool,
    /// The memory-lean mode: no repack (the weights stay in the file mapping, whose pages
    /// the OS reads in and drops as it needs), and prefill in batches of at most
    /// [`LEAN_BATCH`] tokens so the scratch stays small. `Some(true)` always,
    /// `Some(false)` never, `None` (default) chosen for the machine: lean when a repack
    /// was to happen and the memory available ([`crate::memory::available_memory`]) is
    /// below what it copies, announced on stderr.
    pub lean: Option<bool>,
    /// Map the file (default), or read it whole into the process's memory (llama.cpp's
    /// `--no-mmap`): the weights are then anonymous memory already, so nothing is
    /// repacked.
    pub mmap: bool,
    /// Lock what decode reads in RAM (llama.cpp's `--mlock`): the repacked copies, or the
    /// file's image when the weights are read from it (lean mode, no repack, `--no-mmap`).
    /// A refusal by the OS (`ulimit -l`) is reported on stderr and the model runs
    /// unlocked.
    pub mlock: bool,
    /// Which matrices repacking stores in row groups ([`sparrow_quant::row_groups`]: 16
    /// rows in a register's lanes), where the active SIMD level has group kernels
    /// (AVX-512): see [`RowGroups`]. Default [`RowGroups::Decode`].
    pub row_groups: RowGroups,
}

/// The most tokens one forward pass of a lean model computes at once: a longer batch is
/// run as several (the last one giving the logits asked for), so the scratch holds at most
/// this many tokens' activations (Qwen2.5-0.5B: ~5 MiB instead of ~40 at 512).
pub const LEAN_BATCH: usize = 64;

impl Default for LoadOptions {
    /// Repacking on wherever a SIMD kernel reads the packed layout (the scalar one only
    /// unpacks it again); lean if memory is short; mapped; not locked.
    fn default() -> Self {
        LoadOptions {
            repack: sparrow_quant::SimdLevel::active() != sparrow_quant::SimdLevel::Scalar,
            lean: None,
            mmap: true,
            mlock: false,
            row_groups: RowGroups::default(),
        }
    }
}

/// What [`decide_residency`] chose.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Residency {
    repack: bool,
    lean: bool,
    /// Printed on stderr when the lean mode was chosen for the machine.
    notice: Option<String>,
}

/// Whether to repack and whether to run lean, given `options`, the bytes the repack copies
/// (`need`) and the memory available.
fn decide_residency(options: &LoadOptions, need: u64, available: Option<u64>) -> Residency {
    let would_repack = options.repack && options.mmap && need > 0;
    let (lean, notice) = match (options.lean, available) {
        (Some(lean), _) => (lean, None),
        (None, Some(have)) if would_repack && have < need => {
            let h = crate::memory::human_bytes;
            let notice = format!(
                "sparrow: {} of memory available, less than the {} the repacked weights \
                 take: memory-lean mode, the weights stay in the file mapping (--lean \
                 always runs so, --repack never)",
                h(have),
                h(need)
            );
            (true, Some(notice))
        }
        _ => (false, None),
    };
    Residency {
        repack: would_repack && !lean,
        lean,
        notice,
    }
}

/// A loaded model: configuration and weight views into the mapped file (or, for
/// repacked matrices, into RAM).
pub struct Model {
    file: Arc<GgufFile>,
    pub config: ModelConfig,
    weights: Weights,
    repacked: bool,
    /// Whether some matrices are in row groups ([`LoadOptions::row_groups`]).
    row_groups: bool,
    lean: bool,
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
    /// Per layer (shared between layers with the same base and scale).
    ropes: Vec<Arc<RopeTable>>,
    /// Per layer: the window of a sliding layer (what a rewind must keep), else `None`.
    windows: Vec<Option<usize>>,
    n_past: usize,
    vocab: usize,
    scratch: Workspace,
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

    /// Every logits row the most recent forward pass that produced logits left here
    /// (`vocab` floats per row: what [`Model::forward`] returned, or this sequence's rows
    /// of a [`Model::forward_many`]).
    pub fn logits(&self) -> &[f32] {
        &self.scratch.logits
    }

    /// The prompt the next forward passes feed ends at position `end`: the attention
    /// policy may spend more on its last tokens (see `SparsePolicy::prompt_ends_at`).
    pub fn expect_prompt_end(&mut self, end: usize) {
        self.attention.prompt_ends_at(end);
    }

    /// Forget everything; the next forward starts at position 0.
    pub fn reset(&mut self) {
        self.attention.forget_from(0);
        self.blocks.forget_from(0);
        self.n_past = 0;
    }

    /// Whether a [`State::truncate`] leaves the attention policy exactly as it was at that
    /// length (see `SparsePolicy::rewinds_exactly`), and the policy's name.
    pub fn rewinds_exactly(&self) -> (bool, &str) {
        (self.attention.rewinds_exactly(), self.attention.name())
    }

    /// Whether a speculative check on this state may carry sibling drafts
    /// ([`Model::forward_steps_with_siblings`]): every layer global (a sliding window's
    /// ring cannot write a position again once the window has moved past it) and the
    /// decode policy reading every key (`SparsePolicy::decodes_every_key`).
    pub fn takes_siblings(&self) -> bool {
        self.windows.iter().all(Option::is_none) && self.attention.decodes_every_key()
    }

    /// Drop positions beyond `n` (keep a shared prefix, discard the rest); returns the
    /// positions kept. That is `min(n, n_past)`, except when a sliding-window layer's ring
    /// has already overwritten positions the window before `n` needs: then nothing is kept
    /// (0) and the caller evaluates the prefix again.
    #[must_use = "the prefix kept may be shorter than asked: feed the tokens from there"]
    pub fn truncate(&mut self, n: usize) -> usize {
        let mut n = n.min(self.n_past);
        for (l, w) in self.windows.iter().enumerate() {
            if let Some(w) = *w {
                if n.saturating_sub(w - 1) < self.kv.intact_from(l) {
                    n = 0;
                }
            }
        }
        self.attention.forget_from(n);
        self.blocks.forget_from(n);
        self.n_past = n;
        n
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

    /// Replace positions `0..n` a layer at a time: `layer(l, keys, values)` fills the two
    /// buffers with layer `l`'s share ([`KvStore::import_layer`]), so only one layer's rows
    /// are in memory beside the store at once. If a layer does not fit, the state is left
    /// empty (its earlier layers were overwritten) and the error says why.
    pub fn import_prefix_by_layer(
        &mut self,
        n: usize,
        mut layer: impl FnMut(usize, &mut Vec<u8>, &mut Vec<u8>),
    ) -> Result<()> {
        if n > self.n_ctx() {
            return Err(Error::ContextFull {
                n_ctx: self.n_ctx(),
            });
        }
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for l in 0..self.kv.n_layer() {
            keys.clear();
            values.clear();
            layer(l, &mut keys, &mut values);
            if let Err(e) = self.kv.import_layer(l, n, &keys, &values) {
                self.reset();
                return Err(Error::Other(e));
            }
        }
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

/// Extra rows a sliding layer's ring holds beyond its window: the most batch positions one
/// append-then-attend step of that layer takes.
const RING_SLACK: usize = 512;

/// Rows of the ring of a sliding layer with `window` in a context of `n_ctx`.
fn ring_rows(window: usize, n_ctx: usize) -> usize {
    (window + RING_SLACK).min(n_ctx)
}

impl Model {
    /// Open a GGUF file and load a model from it with the default [`LoadOptions`].
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Self::load_with(path, LoadOptions::default())
    }

    /// Open a GGUF file and load a model from it.
    pub fn load_with(path: impl AsRef<Path>, options: LoadOptions) -> Result<Model> {
        let file = GgufFile::open_with(path, options.mmap)?;
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
        let mmap = options.mmap && file.is_mapped();
        let options = LoadOptions { mmap, ..options };
        let need = weights.repack_bytes() as u64;
        let available = if options.lean.is_none() && options.repack {
            crate::memory::available_memory()
        } else {
            None
        };
        let chosen = decide_residency(&options, need, available);
        if let Some(n) = &chosen.notice {
            eprintln!("{n}");
        }
        let row_groups = chosen.repack && weights.repack(&file, options.row_groups)?.row_groups;
        if options.mlock {
            let locked = if chosen.repack {
                weights.lock_in_ram()
            } else {
                file.lock()
            };
            if let Err(e) = locked {
                eprintln!(
                    "sparrow: --mlock: could not lock the weights in RAM ({e}); running \
                     unlocked (raise `ulimit -l`)"
                );
            }
        }
        Ok(Model {
            file,
            config,
            weights,
            repacked: chosen.repack,
            row_groups,
            lean: chosen.lean,
        })
    }

    /// Whether the matrices were copied into RAM at load ([`LoadOptions::repack`]), or
    /// decode reads them from the file's image (the memory-lean mode, or `--no-mmap`).
    pub fn is_repacked(&self) -> bool {
        self.repacked
    }

    /// Whether some matrices are stored in row groups ([`LoadOptions::row_groups`]).
    pub fn has_row_groups(&self) -> bool {
        self.row_groups
    }

    /// Whether the model runs in the memory-lean mode ([`LoadOptions::lean`]).
    pub fn is_lean(&self) -> bool {
        self.lean
    }

    /// The GGUF file the model was loaded from.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// The GGUF file, mutably, while the model alone holds it (to take metadata out).
    pub(crate) fn file_mut(&mut self) -> Option<&mut GgufFile> {
        Arc::get_mut(&mut self.file)
    }

    /// A fresh sequence state for up to `n_ctx` positions, with keys and values of
    /// `kv` (one [`crate::KvType`] for both, a [`KvTypes`], or [`KvOptions`] with a cold
    /// tier: a RAM budget, the rest in a file). A Q8_0 cache the model's head size does not
    /// suit is an error, as is a budget too small for the store's fixed part.
    pub fn new_state(&self, n_ctx: usize, kv: impl Into<KvOptions>) -> Result<State> {
        self.new_state_with(n_ctx, kv.into(), true, &[])
    }

    /// A fresh state running the attention `choice`: [`Model::new_state`] with the policy
    /// set, and under a cold tier the policy's summaries at `n_ctx` taken off the RAM
    /// budget first, so the store and the summaries together keep to it.
    pub fn new_sequence(
        &self,
        n_ctx: usize,
        kv: impl Into<KvOptions>,
        choice: &crate::attention::AttentionChoice,
    ) -> Result<State> {
        let policy = choice.build(&self.config).map_err(Error::Other)?;
        self.new_sequence_with(n_ctx, kv, policy)
    }

    /// [`Model::new_sequence`] for a policy already built (one of a library user's own):
    /// its summaries charged, its partition (`SparsePolicy::partition`) given to the store.
    pub fn new_sequence_with(
        &self,
        n_ctx: usize,
        kv: impl Into<KvOptions>,
        policy: Box<dyn SparsePolicy>,
    ) -> Result<State> {
        let mut kv = kv.into();
        // Under a cold tier the summaries come off the RAM budget; either way they must fit
        // the machine with the cache.
        kv.reserved += policy.summary_bytes(n_ctx, self.config.kv_dim());
        let partitions: Vec<_> = (0..self.config.n_layer)
            .map(|l| policy.partition(l))
            .collect();
        let mut state = self.new_state_with(n_ctx, kv, true, &partitions)?;
        state.set_attention(policy);
        Ok(state)
    }

    /// Like [`Model::new_state`], but sliding-window layers keep every position instead of
    /// a ring of their window (they still read only their window): the memory a model
    /// without rings would take, and the reference the rings are tested against.
    pub fn new_state_without_rings(
        &self,
        n_ctx: usize,
        kv_type: impl Into<KvTypes>,
    ) -> Result<State> {
        self.new_state_with(n_ctx, KvOptions::from(kv_type.into()), false, &[])
    }

    fn new_state_with(
        &self,
        n_ctx: usize,
        kv: KvOptions,
        rings: bool,
        partitions: &[Option<crate::kv::Partition>],
    ) -> Result<State> {
        if n_ctx == 0 {
            return Err(Error::BadHyperParameter("context size 0".into()));
        }
        let c = &self.config;
        let kv_types = kv.types;
        self.check_state_fits(n_ctx, kv_types, kv.cold.is_some(), kv.reserved)?;
        let ropes = self.rope_tables(n_ctx);
        let windows: Vec<Option<usize>> = c
            .layers
            .iter()
            .map(|l| match l.attention {
                LayerAttention::Sliding { window } => Some(window),
                LayerAttention::Global => None,
            })
            .collect();
        let rings: Vec<Option<usize>> = windows
            .iter()
            .map(|w| w.filter(|_| rings).map(|w| ring_rows(w, n_ctx)))
            .collect();
        let store = crate::kv::open(
            &kv,
            &KvShape {
                n_ctx,
                kv_dim: c.kv_dim(),
                head_dim: c.head_dim,
                rings,
            },
            partitions,
        )?;
        Ok(State {
            kv: store,
            attention: Box::new(DenseAttention),
            blocks: BlockTable::new(DEFAULT_BLOCK, c.n_layer),
            ropes,
            windows,
            n_past: 0,
            vocab: c.vocab_size,
            scratch: Workspace::default(),
        })
    }

    /// One RoPE table per distinct (base, scale) among the layers, shared by the layers
    /// that use it.
    fn rope_tables(&self, n_ctx: usize) -> Vec<Arc<RopeTable>> {
        let c = &self.config;
        let mut made: Vec<((u32, u32), Arc<RopeTable>)> = Vec::new();
        c.layers
            .iter()
            .map(|l| {
                let key = (l.rope_base.to_bits(), l.rope_freq_scale.to_bits());
                if let Some((_, t)) = made.iter().find(|(k, _)| *k == key) {
                    return t.clone();
                }
                let t = Arc::new(RopeTable::new(
                    n_ctx,
                    c.n_rot,
                    l.rope_base,
                    l.rope_freq_scale,
                    c.rope_layout,
                ));
                made.push((key, t.clone()));
                t
            })
            .collect()
    }

    /// Distinct RoPE tables the layers use.
    fn n_rope_tables(&self) -> usize {
        let mut keys: Vec<(u32, u32)> = self
            .config
            .layers
            .iter()
            .map(|l| (l.rope_base.to_bits(), l.rope_freq_scale.to_bits()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.len()
    }

    /// Refuse a state whose KV cache and RoPE table alone pass the machine's memory (a
    /// context size from a hostile file, or a `-c` typed with one zero too many).
    /// The KV cache (unless `cold`: a tiered store keeps its budget, checked as it is made),
    /// the policy's `summaries` and RoPE tables of `n_ctx` positions must fit the machine's
    /// memory.
    fn check_state_fits(
        &self,
        n_ctx: usize,
        kv_types: KvTypes,
        cold: bool,
        summaries: usize,
    ) -> Result<()> {
        let c = &self.config;
        let row = (kv_types.k.row_bytes(c.kv_dim()) + kv_types.v.row_bytes(c.kv_dim())) as u128;
        let mut need = (4 * c.n_rot as u128 * self.n_rope_tables() as u128)
            .saturating_mul(n_ctx as u128)
            .saturating_add(summaries as u128);
        for l in &c.layers {
            let rows = match l.attention {
                LayerAttention::Sliding { window } => ring_rows(window, n_ctx),
                LayerAttention::Global => n_ctx,
            };
            if !cold {
                need = need.saturating_add(row.saturating_mul(rows as u128));
            }
        }
        let need = u64::try_from(need).unwrap_or(u64::MAX);
        match crate::memory::machine_memory() {
            Some(have) if need > have => Err(Error::ContextTooLarge { n_ctx, need, have }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod lean_tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn opts(repack: bool, lean: Option<bool>) -> LoadOptions {
        LoadOptions {
            repack,
            lean,
            ..LoadOptions::default()
        }
    }

    fn plain(repack: bool, lean: bool) -> Residency {
        Residency {
            repack,
            lean,
            notice: None,
        }
    }

    #[test]
    fn lean_is_chosen_and_announced_only_when_memory_is_short() {
        let auto = opts(true, None);
        // enough, or unknown: repack as asked
        assert_eq!(
            decide_residency(&auto, 400 * MIB, Some(401 * MIB)),
            plain(true, false)
        );
        assert_eq!(decide_residency(&auto, 400 * MIB, None), plain(true, false));
        // short: lean, with a notice naming both sizes
        let r = decide_residency(&auto, 400 * MIB, Some(300 * MIB));
        assert!(!r.repack && r.lean);
        let notice = r.notice.unwrap();
        assert!(
            notice.contains("300.0 MiB") && notice.contains("400.0 MiB"),
            "{notice}"
        );
        assert!(notice.contains("memory-lean"), "{notice}");
        // no repack to make room for (not asked, --no-mmap, nothing to copy): not lean
        assert_eq!(
            decide_residency(&opts(false, None), 400 * MIB, Some(MIB)),
            plain(false, false)
        );
        let read = LoadOptions {
            mmap: false,
            ..auto
        };
        assert_eq!(
            decide_residency(&read, 400 * MIB, Some(MIB)),
            plain(false, false)
        );
        assert_eq!(decide_residency(&auto, 0, Some(MIB)), plain(false, false));
        // asked for: no notice either way
        let always = opts(true, Some(true));
        assert_eq!(
            decide_residency(&always, 400 * MIB, None),
            plain(false, true)
        );
        let never = opts(true, Some(false));
        assert_eq!(
            decide_residency(&never, 400 * MIB, Some(MIB)),
            plain(true, false)
        );
    }
}
