//! Where a sequence's keys and values live.
//!
//! The model appends each position's rows to a [`KvStore`]; the attention executor borrows
//! runs of them ([`StoreLayer`]); between a policy's plan and its execution the store is told
//! what will be read ([`KvStore::prefetch`]). [`open`] builds the store that [`KvOptions`]
//! ask for — the model never names a store type:
//!
//! * [`types`] — element types (f16, f32, Q8_0) and the row views the kernels read;
//! * [`store`](KvStore) — the trait, one layer as a kernel source, prefix export (prompt caches);
//! * [`ram`] — [`RamStore`], every row in anonymous memory;
//! * [`tiered`] — [`TieredStore`], a RAM budget and the rest in a file (`--kv-ram-budget`);
//! * [`arranged`] — [`ArrangedStore`], a partitioning policy's layers kept by bin;
//! * [`blocks`] — which blocks of positions are sealed, so policies build their summaries.
//!
//! Arrows run one way: `mod.rs` → `ram`, `tiered` → `store`, `options` → `types`.
//! Adding a tier: a file (or folder) beside `ram.rs` implementing [`KvStore`], a field in
//! [`KvOptions`] that asks for it, and one arm in [`open`].

pub mod arranged;
pub mod blocks;
mod cold_file;
mod elements;
mod options;
pub mod ram;
mod store;
pub mod tiered;
pub mod types;

pub use arranged::ArrangedStore;
pub use blocks::{BlockTable, DEFAULT_BLOCK};
pub use options::{ColdTier, KvOptions};
pub use ram::RamStore;
pub use sparrow_attn::policy::Partition;
pub use store::{
    check_layer_import, export_prefix, layer_prefix_bytes, prefix_bytes, write_prefix, KvStore,
    StoreLayer,
};
pub use tiered::{minimum_budget, ColdWrite, TieredStore};
pub use types::{
    bytes_of, BlockQ8_0, KvRows, KvType, KvTypes, BLOCK_Q8_0_BYTES, KV_TYPE_NAMES, QK8_0,
};

/// The shape of one sequence's store: what the model, not the user, decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvShape {
    /// Positions a layer holds at most.
    pub n_ctx: usize,
    /// Values per row: KV heads × head size.
    pub kv_dim: usize,
    /// Head size (Q8_0 rows need a multiple of 32).
    pub head_dim: usize,
    /// One entry per layer: `None` for a layer holding every position, `Some(rows)` for a
    /// ring of that many rows (a sliding-window layer).
    pub rings: Vec<Option<usize>>,
}

/// The store `options` ask for, of `shape`: in RAM, or under a RAM budget with a cold file.
/// Layers `partitions` gives a partition for (a partitioning policy's,
/// `SparsePolicy::partition`) keep their rows grouped by bin, segment by segment
/// ([`ArrangedStore`]; under a RAM budget their sorted segments go to a file of their own,
/// their open segments stay in RAM within the budget). An impossible request (a Q8_0 type the head size does not
/// allow, a budget too small for the policy's summaries, an unwritable directory) is an
/// error naming it.
pub fn open(
    options: &KvOptions,
    shape: &KvShape,
    partitions: &[Option<Partition>],
) -> crate::Result<Box<dyn KvStore>> {
    let KvShape {
        n_ctx,
        kv_dim,
        head_dim,
        ref rings,
    } = *shape;
    let arranged = arranged::arranged_layers(partitions, rings);
    // The layers kept by position, numbered among themselves.
    let kept: Vec<Option<usize>> = rings
        .iter()
        .zip(&arranged)
        .filter(|(_, a)| !**a)
        .map(|(r, _)| *r)
        .collect();
    let by_position = |rings: &[Option<usize>]| -> crate::Result<Box<dyn KvStore>> {
        Ok(match &options.cold {
            Some(tier) if !rings.is_empty() => {
                // The arranged layers' open segments and maps stay in RAM: their share.
                let tails = arranged::ram_bytes(
                    partitions,
                    &shape.rings,
                    (n_ctx, kv_dim, head_dim),
                    options.types,
                );
                Box::new(
                    TieredStore::new(
                        options.types,
                        rings,
                        n_ctx,
                        kv_dim,
                        head_dim,
                        tier,
                        options.reserved + tails,
                    )
                    .map_err(crate::Error::KvTier)?,
                )
            }
            _ => Box::new(
                RamStore::with_rings(options.types, rings, n_ctx, kv_dim, head_dim)
                    .map_err(crate::Error::Other)?,
            ),
        })
    };
    if !arranged.contains(&true) {
        return by_position(rings);
    }
    let inner = by_position(&kept)?;
    let store = ArrangedStore::new(
        inner,
        &arranged,
        partitions,
        (n_ctx, head_dim),
        options.cold.as_ref(),
    )
    .map_err(crate::Error::KvTier)?;
    Ok(Box::new(store))
}
