//! One cached block: the keys and values of a run of `block` prompt positions, per layer,
//! named by a hash of every token up to its end (so a block is only ever found by a
//! prompt that starts with exactly those tokens), and how blocks are copied out of a
//! sequence's store and assembled back into a prefix it can import.

use crate::kv::{KvStore, KvTypes};
use sha2::{Digest, Sha256};

/// A block's name: SHA-256 over its parent's name and its tokens. The first block's parent
/// is the cache's root, which binds the chain to a model, KV types, block size and the
/// attention the rows were computed under.
pub type BlockKey = [u8; 32];

/// The names of the first `blocks` whole blocks of `tokens`, each chained to the last.
pub fn chain_keys(root: &BlockKey, tokens: &[u32], block: usize, blocks: usize) -> Vec<BlockKey> {
    let mut keys = Vec::with_capacity(blocks);
    let mut parent = *root;
    for chunk in tokens.chunks_exact(block).take(blocks) {
        let mut h = Sha256::new();
        h.update(parent);
        for t in chunk {
            h.update(t.to_le_bytes());
        }
        parent = h.finalize().into();
        keys.push(parent);
    }
    keys
}

/// The shape every block of one cache has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockShape {
    pub types: KvTypes,
    pub n_layer: usize,
    pub kv_dim: usize,
    /// Positions per block.
    pub block: usize,
}

impl BlockShape {
    /// The shape of `store`'s rows in blocks of `block` positions.
    pub fn of(store: &dyn KvStore, block: usize) -> Self {
        BlockShape {
            types: store.types(),
            n_layer: store.n_layer(),
            kv_dim: store.kv_dim(),
            block,
        }
    }

    fn row_bytes(&self) -> (usize, usize) {
        (
            self.types.k.row_bytes(self.kv_dim),
            self.types.v.row_bytes(self.kv_dim),
        )
    }

    /// Bytes one layer's keys and values take in a block.
    pub fn layer_bytes(&self) -> usize {
        let (k, v) = self.row_bytes();
        self.block * (k + v)
    }
}

/// Keys and values of positions `index·block .. (index+1)·block`, per layer: the layer's
/// keys then its values as raw rows (the store's types), or nothing for a layer whose
/// store no longer held those positions when the block was taken (a sliding-window layer's
/// ring that had gone round).
#[derive(Debug)]
pub struct Block {
    /// Which layers the block holds.
    pub present: Vec<bool>,
    /// The present layers' bytes, in layer order.
    pub data: Rows,
}

/// A block's bytes: its own (taken from a store), or a range of a block file's read-only
/// mapping (read from the directory: the OS's page cache holds them, not the process).
#[derive(Debug)]
pub enum Rows {
    Owned(Vec<u8>),
    Mapped {
        map: memmap2::Mmap,
        at: std::ops::Range<usize>,
    },
}

impl std::ops::Deref for Rows {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Rows::Owned(v) => v,
            Rows::Mapped { map, at } => &map[at.clone()],
        }
    }
}

impl Block {
    /// Copy block `index` out of `store`, which holds at least its positions.
    pub fn take(store: &dyn KvStore, shape: &BlockShape, index: usize) -> Block {
        let start = index * shape.block;
        let end = start + shape.block;
        let mut present = Vec::with_capacity(shape.n_layer);
        let mut data = Vec::new();
        for l in 0..shape.n_layer {
            // A ring holds its last `layer_rows` positions up to the latest one written.
            let held = store.intact_from(l) <= start;
            present.push(held);
            if !held {
                continue;
            }
            data.reserve(shape.layer_bytes());
            for values in [false, true] {
                store
                    .write_rows(l, values, start, end - start, &mut data)
                    .expect("writing to a Vec cannot fail");
            }
        }
        Block {
            present,
            data: Rows::Owned(data),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Layer `l`'s keys and values, if the block holds them.
    fn layer(&self, shape: &BlockShape, l: usize) -> Option<(&[u8], &[u8])> {
        if !self.present[l] {
            return None;
        }
        let before = self.present[..l].iter().filter(|&&p| p).count();
        let at = before * shape.layer_bytes();
        let (k, _) = shape.row_bytes();
        let layer = &self.data[at..at + shape.layer_bytes()];
        Some(layer.split_at(shape.block * k))
    }
}

/// Whether `blocks` (the first blocks of a prefix, in order) hold every row a store whose
/// layers keep `layer_rows` positions needs to import the prefix they make.
pub fn covers(blocks: &[&Block], shape: &BlockShape, layer_rows: &[usize]) -> bool {
    let n = blocks.len() * shape.block;
    layer_rows.iter().enumerate().all(|(l, &rows)| {
        let first = (n - n.min(rows)) / shape.block;
        blocks[first..].iter().all(|b| b.present[l])
    })
}

/// Layer `layer`'s share of the prefix `blocks` make ([`KvStore::import_layer`]'s keys and
/// values) for a store keeping `rows` positions of it, appended to `keys` and `values`;
/// the blocks must [`covers`] it.
pub fn assemble_layer(
    blocks: &[&Block],
    shape: &BlockShape,
    layer: usize,
    rows: usize,
    keys: &mut Vec<u8>,
    values: &mut Vec<u8>,
) {
    let n = blocks.len() * shape.block;
    let kept = n - n.min(rows)..n;
    let (krow, vrow) = shape.row_bytes();
    for (out, row, want_keys) in [(keys, krow, true), (values, vrow, false)] {
        out.reserve(kept.len() * row);
        let mut pos = kept.start;
        while pos < kept.end {
            let b = pos / shape.block;
            let (k, v) = blocks[b].layer(shape, layer).expect("covered");
            let part = if want_keys { k } else { v };
            let from = pos - b * shape.block;
            let to = (kept.end - b * shape.block).min(shape.block);
            out.extend_from_slice(&part[from * row..to * row]);
            pos = b * shape.block + to;
        }
    }
}

/// The bytes [`KvStore::import_prefix`] takes for the prefix `blocks` make, for a store
/// whose layers keep `layer_rows` positions (a ring keeps the prefix's last ones); `None`
/// unless [`covers`].
pub fn assemble(blocks: &[&Block], shape: &BlockShape, layer_rows: &[usize]) -> Option<Vec<u8>> {
    if !covers(blocks, shape, layer_rows) {
        return None;
    }
    let mut out = Vec::new();
    for (l, &rows) in layer_rows.iter().enumerate() {
        let (mut k, mut v) = (Vec::new(), Vec::new());
        assemble_layer(blocks, shape, l, rows, &mut k, &mut v);
        out.extend_from_slice(&k);
        out.extend_from_slice(&v);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_every_token_before() {
        let root = [7u8; 32];
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[3] = 99;
        let ka = chain_keys(&root, &a, 8, 5);
        let kb = chain_keys(&root, &b, 8, 5);
        assert_eq!(ka.len(), 5);
        // Every block after a changed token is named differently, the ones before are not.
        assert!(ka.iter().zip(&kb).all(|(x, y)| x != y));
        let mut c = a.clone();
        c[20] = 5;
        let kc = chain_keys(&root, &c, 8, 5);
        assert_eq!(ka[..2], kc[..2]);
        assert!(ka[2..].iter().zip(&kc[2..]).all(|(x, y)| x != y));
        // Another root (model or settings) names every block differently.
        let kd = chain_keys(&[8u8; 32], &a, 8, 5);
        assert!(ka.iter().zip(&kd).all(|(x, y)| x != y));
        // Only whole blocks are named.
        assert_eq!(chain_keys(&root, &a[..15], 8, 5).len(), 1);
    }
}
