//! Saap's offline half: recording training contexts ([`collect`]), the record file
//! ([`record`]) and the index file the trainer writes and the `saap` policy
//! ([`crate::policy::saap`]) reads ([`index`]), and the policy's inverted file of key and
//! value rows grouped by bucket ([`buckets`]) and its positional cells ([`cells`]). Training itself (k-means, the Q-model)
//! lives in the `sparrow-saap-train` crate, so the engine carries no training library.

pub mod buckets;
pub mod cells;
pub mod collect;
pub mod index;
pub mod record;

pub use collect::{collect_context, text_contexts, CollectSettings, TextContext};
pub use index::{
    default_index_path, prior_scale, HeadModel, IndexError, IndexMeta, Router, RouterCopy,
    RouterRows, RouterWeights, SaapIndex, Scratch, TrainingInfo,
};
pub use record::{ContextRecord, RecordError, RecordMeta, RopeParams};
pub use sparrow_attn::kernel::Level;
