//! How a sequence's KV store is made ([`KvOptions`]): element types, and optionally a cold
//! tier under a RAM budget ([`ColdTier`]). [`super::open`] reads them.

use super::types::{KvType, KvTypes};
use std::path::PathBuf;

/// Where keys and values beyond a RAM budget go (`--kv-ram-budget`, `--kv-dir`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColdTier {
    /// Bytes of anonymous memory the store's keys and values may take, with what a policy
    /// reserves for its summaries (see [`KvOptions::reserved`]).
    pub ram_budget: usize,
    /// Directory for the session's file; the system temp dir when `None`.
    pub dir: Option<PathBuf>,
}

/// How a sequence's KV store is made: element types, and optionally a cold tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvOptions {
    /// Key and value element types.
    pub types: KvTypes,
    /// Keep only a RAM budget's worth of rows in memory, the rest in a file.
    pub cold: Option<ColdTier>,
    /// Bytes of the budget a policy's summaries will take (Quest's page bounds, Saap's
    /// lists), taken off what the store may keep in RAM.
    pub reserved: usize,
}

impl From<KvTypes> for KvOptions {
    fn from(types: KvTypes) -> Self {
        KvOptions {
            types,
            cold: None,
            reserved: 0,
        }
    }
}

impl From<KvType> for KvOptions {
    fn from(t: KvType) -> Self {
        KvOptions::from(KvTypes::from(t))
    }
}
