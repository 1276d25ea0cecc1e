//! `kmeans`: Saap's index read without its Q-model — the baseline the Saap paper measures
//! against. Keys go to buckets exactly as in `saap` (nearest trained centroid of the
//! de-roped key); a decode query picks its buckets by its *own* similarity to the
//! centroids (a softmax of the scaled inner products, summed over the GQA group), as a
//! plain inverted-file index would. Everything else — sink, window, probes, dense layers,
//! the index file — is `saap`'s, with `saap`'s flags, so the two compare at equal reads.

use super::settings::{load_index, settings, Router, SaapSettings};
use super::SaapAttention;
use crate::model::rope::Rope;
use crate::policy::{AttentionChoice, PolicyEntry, SettingsType};

/// The registry's entry: a decode policy configured by `saap`'s flags.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "kmeans",
    summary: "decode: saap's buckets chosen by the query's own centroid similarity (the paper's k-means baseline; --saap-* flags)",
    prefill: false,
    decode: true,
    build: |b| {
        let s = kmeans_settings(b.choice)?;
        let index = load_index(&s, b.model)?;
        Ok(Box::new(SaapAttention::new(s, index, Rope::of(b.model))?))
    },
    check: |c| kmeans_settings(c).map(|s| format!("{s:?}")),
    settings: SettingsType::of::<KmeansSettings>(),
};

/// `saap`'s settings with the centroid router.
fn kmeans_settings(c: &AttentionChoice) -> Result<SaapSettings, String> {
    settings(c, Some(Router::Centroids))
}

/// `kmeans` has no flags of its own (it reads `saap`'s).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct KmeansSettings {}
