//! Saap's files: the record file of a training context ([`record`]) and the index file the
//! trainer writes and the `saap` policy ([`crate::policy::saap`]) reads ([`index`]), with
//! the trained router it carries. Recording contexts lives in `sparrow-eval`, training
//! (k-means, the Q-model) in `sparrow-saap-train`, so the engine carries neither.

pub mod index;
pub mod record;

pub use index::{
    default_index_path, prior_scale, HeadModel, IndexError, IndexMeta, Router, RouterCopy,
    RouterRows, RouterWeights, SaapIndex, Scratch, TrainingInfo,
};
pub use record::{ContextRecord, RecordError, RecordMeta, RopeParams};
pub use sparrow_attn::kernel::Level;
