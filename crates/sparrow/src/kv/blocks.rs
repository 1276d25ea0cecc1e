//! The paged view of the KV cache: each layer's positions are cut into fixed-size blocks
//! (block `b` holds positions `b * size .. (b + 1) * size`). A block is *sealed* once every
//! position in it has been written; sealing hands its keys to the attention policy
//! ([`SparsePolicy::on_block_sealed`]) while they are hot, which is where block summaries
//! (Quest's min/max keys, landmark means) are built.
//!
//! The table is bookkeeping only: the stores keep positions in runs of rows (the attention
//! kernels read 64-key tiles), not in blocks, so sealing moves no data.

use super::store::{KvStore, StoreLayer};
use crate::attention::{AttnShape, SparsePolicy};
use sparrow_attn::kernel::read_f32;
use sparrow_attn::policy::KeysView;

/// Block size used when a policy has no preference.
pub const DEFAULT_BLOCK: usize = 16;

/// Sealed-block bookkeeping for every layer of one sequence.
#[derive(Clone, Debug)]
pub struct BlockTable {
    size: usize,
    /// Per layer: blocks `0..sealed[l]` are sealed.
    sealed: Vec<usize>,
    /// Scratch for one block's keys in f32.
    keys: Vec<f32>,
}

impl BlockTable {
    /// A table of `size`-position blocks (0 is read as 1) for `n_layer` layers.
    pub fn new(size: usize, n_layer: usize) -> Self {
        BlockTable {
            size: size.max(1),
            sealed: vec![0; n_layer],
            keys: Vec::new(),
        }
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.size
    }

    /// Number of sealed blocks of `layer`.
    pub fn sealed(&self, layer: usize) -> usize {
        self.sealed.get(layer).copied().unwrap_or(0)
    }

    /// Positions from `pos` on will be rewritten: unseal every block that holds one of them.
    pub fn forget_from(&mut self, pos: usize) {
        let keep = pos / self.size;
        self.sealed.iter_mut().for_each(|s| *s = (*s).min(keep));
    }

    /// [`Self::forget_from`] for one layer.
    pub fn forget_layer_from(&mut self, layer: usize, pos: usize) {
        let keep = pos / self.size;
        if let Some(s) = self.sealed.get_mut(layer) {
            *s = (*s).min(keep);
        }
    }

    /// Positions `0..filled` of `layer` are written: seal every block now complete, in order,
    /// telling `policy` about each, and `cache` where the policy places its rows
    /// ([`KvStore::arrange`]) when it partitions the layer.
    pub fn seal(
        &mut self,
        shape: AttnShape,
        cache: &mut dyn KvStore,
        layer: usize,
        filled: usize,
        policy: &mut dyn SparsePolicy,
    ) -> Result<(), String> {
        for block in self.complete(cache, layer, filled) {
            self.seal_block(shape, cache, layer, block, policy);
            if let Some(bins) = policy.placement() {
                cache.arrange(layer, block * self.size, bins)?;
            }
            self.sealed[layer] = block + 1;
        }
        Ok(())
    }

    /// [`Self::seal`] for a store read only: the policy's placements are not passed on
    /// (the store keeps rows by position; evaluation replays policies over a finished
    /// state this way).
    pub fn seal_in_place(
        &mut self,
        shape: AttnShape,
        cache: &dyn KvStore,
        layer: usize,
        filled: usize,
        policy: &mut dyn SparsePolicy,
    ) {
        for block in self.complete(cache, layer, filled) {
            self.seal_block(shape, cache, layer, block, policy);
            self.sealed[layer] = block + 1;
        }
    }

    /// The blocks of `layer` complete at `filled` positions and not sealed yet.
    fn complete(&self, cache: &dyn KvStore, layer: usize, filled: usize) -> std::ops::Range<usize> {
        let Some(sealed) = self.sealed.get(layer).copied() else {
            return 0..0;
        };
        sealed..(filled.min(cache.n_ctx()) / self.size).max(sealed)
    }

    /// Hand block `block` of `layer`'s keys to `policy`.
    fn seal_block(
        &mut self,
        shape: AttnShape,
        cache: &dyn KvStore,
        layer: usize,
        block: usize,
        policy: &mut dyn SparsePolicy,
    ) {
        let kv_dim = shape.n_head_kv * shape.head_dim;
        debug_assert_eq!(kv_dim, cache.kv_dim());
        self.keys.resize(self.size * kv_dim, 0.0);
        let rows = StoreLayer {
            store: cache,
            layer,
        };
        read_f32(
            &rows,
            false,
            shape.head_dim,
            block * self.size,
            &mut self.keys,
        );
        if let Ok(view) = KeysView::new(&self.keys, self.size, shape.n_head_kv, shape.head_dim) {
            policy.on_block_sealed(layer, block, view);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{PlanContext, ReadPlan};
    use crate::kv::{KvType, RamStore};

    /// Records every seal call: (layer, block, first key value of head 1).
    struct Recorder {
        size: usize,
        seen: Vec<(usize, usize, f32)>,
    }

    impl SparsePolicy for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
            ReadPlan::causal(ctx.shape, ctx.pos0, ctx.n_tokens())
        }
        fn block_size(&self) -> Option<usize> {
            Some(self.size)
        }
        fn on_block_sealed(&mut self, layer: usize, block: usize, keys: KeysView<'_>) {
            assert_eq!(keys.rows(), self.size);
            self.seen.push((layer, block, keys.key(0, 1)[0]));
        }
    }

    const SHAPE: AttnShape = AttnShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 4,
    };

    /// A cache whose key at (layer, pos) holds `pos + 1000 * layer` everywhere.
    fn cache(n: usize) -> RamStore {
        let mut c = RamStore::new(KvType::F32, 2, n, 8);
        for l in 0..2 {
            for p in 0..n {
                let k = vec![(p + 1000 * l) as f32; 8];
                c.write(l, p, &k, &k);
            }
        }
        c
    }

    #[test]
    fn complete_blocks_are_sealed_once_in_order_with_their_keys() {
        let c = cache(40);
        let mut r = Recorder {
            size: 8,
            seen: Vec::new(),
        };
        let mut t = BlockTable::new(8, 2);
        t.seal_in_place(SHAPE, &c, 1, 7, &mut r);
        assert!(r.seen.is_empty(), "no block is complete yet");
        t.seal_in_place(SHAPE, &c, 1, 17, &mut r);
        t.seal_in_place(SHAPE, &c, 1, 17, &mut r);
        t.seal_in_place(SHAPE, &c, 1, 24, &mut r);
        assert_eq!(r.seen, vec![(1, 0, 1000.0), (1, 1, 1008.0), (1, 2, 1016.0)]);
        assert_eq!((t.sealed(0), t.sealed(1)), (0, 3));
    }

    #[test]
    fn a_rewind_unseals_the_blocks_it_touches() {
        let c = cache(40);
        let mut r = Recorder {
            size: 8,
            seen: Vec::new(),
        };
        let mut t = BlockTable::new(8, 2);
        t.seal_in_place(SHAPE, &c, 0, 32, &mut r);
        t.forget_from(20); // block 2 (16..24) holds position 20
        assert_eq!(t.sealed(0), 2);
        r.seen.clear();
        t.seal_in_place(SHAPE, &c, 0, 32, &mut r);
        assert_eq!(r.seen, vec![(0, 2, 16.0), (0, 3, 24.0)]);
        t.forget_layer_from(0, 0);
        assert_eq!(t.sealed(0), 0);
        // Beyond the cache's capacity nothing is sealed.
        t.seal_in_place(SHAPE, &c, 0, 1000, &mut r);
        assert_eq!(t.sealed(0), 5);
    }
}
