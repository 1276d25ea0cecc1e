//! A prefix cache shared by every sequence of a server: the keys and values of prompt
//! prefixes in blocks of [`PrefixCacheConfig::block`] positions, named by a hash of all the
//! tokens up to each block's end, so any slot can start a prompt from the longest prefix
//! any earlier prompt computed — not only the slot that happened to hold it.
//!
//! Blocks live in RAM within a byte budget (least recently used out first, the last blocks
//! of a chain before its first ones), and, with a directory, on disk too: each block is
//! written through when it is made, so a restart finds it again; the directory keeps to its
//! own budget. A block read back from the directory is mapped, checked and imported, never
//! copied into RAM: the page cache holds it. Rows are copied, never shared: a sequence imports a prefix into its own KV
//! store a layer at a time ([`crate::State::import_prefix_by_layer`]) and its attention
//! policy rebuilds its summaries
//! from them, so what follows is what the sequence would compute had it run the prefix
//! itself in the same batches.
//!
//! Only prompt positions are cached (a sequence's generated tokens were computed one at a
//! time under the decode policy; a prompt's, under the prefill policy, which the root
//! names), and only whole blocks, never a prompt's last token (its logits start the
//! generation).

mod block;
mod disk;

pub use block::{assemble, assemble_layer, chain_keys, covers, Block, BlockKey, BlockShape, Rows};
pub use disk::{BlockFormat, DiskTier, ScanReport};

use crate::attention::AttentionChoice;
use crate::model::State;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Positions per cached block unless set otherwise: `serve`'s default batch, so a prompt
/// resumed after a cached prefix is cut into the batches a run from the start would use
/// when nothing else shares the passes.
pub const DEFAULT_BLOCK: usize = 256;

/// How a prefix cache is set up.
#[derive(Clone, Debug)]
pub struct PrefixCacheConfig {
    /// Bytes of blocks kept in RAM.
    pub ram_bytes: u64,
    /// Where blocks are also written, to outlive the process; `None`: RAM only.
    pub dir: Option<PathBuf>,
    /// Bytes of blocks kept in `dir`.
    pub disk_bytes: u64,
    /// Positions per block.
    pub block: usize,
}

/// Counters and gauges of a prefix cache, for `/metrics`.
#[derive(Debug, Default)]
pub struct PrefixCacheStats {
    /// Whether a cache reports here at all.
    pub enabled: AtomicBool,
    /// Prompts that started from a cached prefix, and the tokens they did not compute.
    pub hits: AtomicU64,
    pub tokens_reused: AtomicU64,
    /// Prompts looked up that found nothing.
    pub misses: AtomicU64,
    /// Blocks and bytes held in RAM and on disk.
    pub ram_blocks: AtomicUsize,
    pub ram_bytes: AtomicU64,
    pub disk_blocks: AtomicUsize,
    pub disk_bytes: AtomicU64,
}

struct Held {
    block: Block,
    used: u64,
}

/// The cache (one per model, KV types and prefill attention: its root).
pub struct PrefixCache {
    root: BlockKey,
    shape: BlockShape,
    ram_budget: u64,
    ram: HashMap<BlockKey, Held>,
    ram_bytes: u64,
    disk: Option<DiskTier>,
    clock: u64,
    stats: std::sync::Arc<PrefixCacheStats>,
}

/// The root of a cache's chains: what the rows of every block depend on besides their
/// tokens — the model, the KV types, the block size and the attention prefill runs.
pub fn root(fingerprint: &[u8; 32], shape: &BlockShape, attention: &AttentionChoice) -> BlockKey {
    let mut h = Sha256::new();
    h.update(b"sparrow prefix cache v1\n");
    h.update(fingerprint);
    h.update(format!(
        "{} {} {} {}\n",
        shape.types, shape.n_layer, shape.kv_dim, shape.block
    ));
    h.update(prefill_signature(attention));
    h.finalize().into()
}

/// What the prefill's rows depend on in `attention`: nothing for exact prefill; the policy
/// with its settings, dense layers and block size for a sparse one.
fn prefill_signature(attention: &AttentionChoice) -> String {
    let prefill = attention
        .phase_names()
        .map(|(p, _)| p)
        .unwrap_or_else(|e| e);
    if prefill == "full" {
        return "prefill full".into();
    }
    format!(
        "prefill {prefill} [{}] dense {:?} block {:?}",
        attention.describe(&prefill),
        attention.dense_layers(),
        attention.kv_block
    )
}

impl PrefixCache {
    /// A cache for sequences like `state` (its store's types and shape) of the model with
    /// `fingerprint` prefilled under `attention`; with a directory, the blocks already in
    /// it are indexed (what the scan found is returned for the caller to report).
    pub fn open(
        cfg: &PrefixCacheConfig,
        fingerprint: &[u8; 32],
        state: &State,
        attention: &AttentionChoice,
        stats: std::sync::Arc<PrefixCacheStats>,
    ) -> Result<(PrefixCache, Option<ScanReport>), String> {
        if cfg.block == 0 {
            return Err("the prefix cache's block size must be at least 1 token".into());
        }
        let shape = BlockShape::of(state.kv(), cfg.block);
        let root = root(fingerprint, &shape, attention);
        let (disk, report) = match &cfg.dir {
            Some(dir) => {
                let (tier, report) = DiskTier::open(dir, root, shape.clone(), cfg.disk_bytes)?;
                (Some(tier), Some(report))
            }
            None => (None, None),
        };
        let cache = PrefixCache {
            root,
            clock: disk.as_ref().map_or(0, |d| d.len() as u64),
            shape,
            ram_budget: cfg.ram_bytes,
            ram: HashMap::new(),
            ram_bytes: 0,
            disk,
            stats,
        };
        cache.publish_stats();
        Ok((cache, report))
    }

    /// The counters `/metrics` reads.
    pub fn stats(&self) -> &std::sync::Arc<PrefixCacheStats> {
        &self.stats
    }

    /// Positions per block.
    pub fn block(&self) -> usize {
        self.shape.block
    }

    /// Whole blocks of `prompt` that may come from the cache: the last token always runs.
    fn blocks_of(&self, prompt: &[u32]) -> usize {
        prompt.len().saturating_sub(1) / self.shape.block
    }

    /// Whether block `key` is held, in RAM or on disk.
    fn has(&self, key: &BlockKey) -> bool {
        self.ram.contains_key(key) || self.disk.as_ref().is_some_and(|d| d.contains(key))
    }

    /// Positions of `prompt` the cache has blocks for (not checking a sliding layer's
    /// needs, nor the disk files' checksums: [`PrefixCache::restore`] does).
    pub fn cached_len(&self, prompt: &[u32]) -> usize {
        let keys = chain_keys(&self.root, prompt, self.shape.block, self.blocks_of(prompt));
        keys.iter().take_while(|k| self.has(k)).count() * self.shape.block
    }

    /// Put the longest cached prefix of `prompt` into `state` (replacing what it held),
    /// if it is longer than `at_least` positions; returns the positions restored (0: the
    /// state is untouched).
    pub fn restore(&mut self, prompt: &[u32], state: &mut State, at_least: usize) -> usize {
        let keys = chain_keys(&self.root, prompt, self.shape.block, self.blocks_of(prompt));
        let held = keys.iter().take_while(|k| self.has(k)).count();
        if held * self.shape.block <= at_least {
            // The sequence already holds as much: not a miss, and nothing read from disk.
            if held == 0 {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
            }
            return 0;
        }
        self.clock += 1;
        let now = self.clock;
        // The chain's blocks as far as they go: in RAM, or mapped from their files (read for
        // this restore only: the page cache keeps them, outside --cache-ram).
        let mut mapped: Vec<Block> = Vec::new();
        let mut found = 0;
        for key in &keys {
            if !self.ram.contains_key(key) {
                match self.disk.as_mut().and_then(|d| d.get(key, now)) {
                    Some(block) => mapped.push(block),
                    None => break,
                }
            }
            found += 1;
        }
        let blocks: Vec<&Block> = {
            let mut from_disk = mapped.iter();
            keys[..found]
                .iter()
                .map(|key| match self.ram.get(key) {
                    Some(h) => &h.block,
                    None => from_disk
                        .next()
                        .expect("one mapped block per key not in RAM"),
                })
                .collect()
        };
        let layer_rows: Vec<usize> = (0..self.shape.n_layer)
            .map(|l| state.kv().layer_rows(l))
            .collect();
        // The longest prefix whose blocks hold every row the state needs.
        let mut restored = 0;
        for k in (1..=found).rev() {
            if k * self.shape.block <= at_least {
                break;
            }
            if !block::covers(&blocks[..k], &self.shape, &layer_rows) {
                continue;
            }
            let n = k * self.shape.block;
            let imported = state.import_prefix_by_layer(n, |l, keys, values| {
                block::assemble_layer(&blocks[..k], &self.shape, l, layer_rows[l], keys, values)
            });
            match imported {
                Ok(()) => restored = n,
                Err(e) => eprintln!("warning: prefix cache: cannot restore {n} positions: {e}"),
            }
            break;
        }
        drop(blocks);
        // The chain was used: its first blocks are the last to go.
        for (i, key) in keys[..found].iter().enumerate().rev() {
            if let Some(h) = self.ram.get_mut(key) {
                h.used = (now << 24) + (found - i) as u64;
            }
            if restored > 0 {
                if let Some(d) = self.disk.as_mut() {
                    d.touch(key, now);
                }
            }
        }
        let s = &self.stats;
        if restored > 0 {
            s.hits.fetch_add(1, Ordering::Relaxed);
            s.tokens_reused
                .fetch_add(restored as u64, Ordering::Relaxed);
        } else {
            s.misses.fetch_add(1, Ordering::Relaxed);
        }
        self.evict();
        self.publish_stats();
        restored
    }

    /// The names of `prompt`'s whole blocks, for [`PrefixCache::publish_chain`].
    pub fn chain(&self, prompt: &[u32]) -> Vec<BlockKey> {
        let blocks = prompt.len() / self.shape.block;
        chain_keys(&self.root, prompt, self.shape.block, blocks)
    }

    /// Take the whole blocks of `prompt` that `state` now holds (its first `held`
    /// positions, computed as a prompt) and the cache lacks.
    pub fn publish(&mut self, prompt: &[u32], held: usize, state: &State) {
        let chain = self.chain(prompt);
        self.publish_chain(&chain, held, state);
    }

    /// [`PrefixCache::publish`] for a prompt whose block names are `chain` (a prompt read
    /// over several passes names its blocks once).
    pub fn publish_chain(&mut self, chain: &[BlockKey], held: usize, state: &State) {
        let held = held.min(state.n_past());
        let blocks = (held / self.shape.block).min(chain.len());
        if blocks == 0 || self.ram_budget == 0 && self.disk.is_none() {
            return;
        }
        self.clock += 1;
        let now = self.clock;
        let mut changed = false;
        for (i, key) in chain[..blocks].iter().enumerate() {
            if let Some(held) = self.ram.get(key) {
                // Written through when it was taken, unless the directory has since dropped it.
                if let Some(d) = self.disk.as_mut().filter(|d| !d.contains(key)) {
                    d.put(key, i, &held.block, now);
                    changed = true;
                }
                continue;
            }
            let block = Block::take(state.kv(), &self.shape, i);
            if let Some(d) = self.disk.as_mut() {
                // A block already on disk is only marked used.
                d.put(key, i, &block, now);
            }
            if (block.bytes() as u64) <= self.ram_budget {
                self.ram_bytes += block.bytes() as u64;
                let used = (now << 24) + (blocks - i) as u64;
                self.ram.insert(*key, Held { block, used });
            }
            changed = true;
        }
        if changed {
            self.evict();
            self.publish_stats();
        }
    }

    /// Drop least recently used blocks from RAM until it is within budget (they stay on
    /// disk when there is one).
    fn evict(&mut self) {
        while self.ram_bytes > self.ram_budget {
            let Some(oldest) = self.ram.iter().min_by_key(|(_, h)| h.used).map(|(k, _)| *k) else {
                break;
            };
            let held = self.ram.remove(&oldest).expect("just found");
            self.ram_bytes -= held.block.bytes() as u64;
        }
    }

    fn publish_stats(&self) {
        let s = &self.stats;
        s.enabled.store(true, Ordering::Relaxed);
        s.ram_blocks.store(self.ram.len(), Ordering::Relaxed);
        s.ram_bytes.store(self.ram_bytes, Ordering::Relaxed);
        if let Some(d) = &self.disk {
            s.disk_blocks.store(d.len(), Ordering::Relaxed);
            s.disk_bytes.store(d.bytes(), Ordering::Relaxed);
        }
    }

    /// Bytes of blocks in RAM and on disk.
    pub fn bytes(&self) -> (u64, u64) {
        (self.ram_bytes, self.disk.as_ref().map_or(0, |d| d.bytes()))
    }
}
