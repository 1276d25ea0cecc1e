//! Choosing attention policies by name, per phase.
//!
//! Every policy is a [`SparsePolicy`] (it plans reads; the executor computes); this module
//! turns the user's words (`--attn`,
//! `--attn-prefill`, `--attn-decode` and each policy's settings) into a backend, refusing
//! unknown names, out-of-range settings and policies used in a phase they do not support.
//! When prefill and decode use different policies, [`PhasedAttention`] routes each call:
//! a forward pass of one token is decode, a batch of several is prefill.

use crate::model::config::ModelConfig;
use sparrow_attn::policy::{KeysView, PlanContext, ReadPlan, SparsePolicy};

pub mod settings;

pub mod full;
pub mod h2o;
pub mod ladder;
pub mod oracle;
pub mod quest;
pub mod saap;
pub mod sketch;
pub mod streaming;
pub mod xattention;

/// Every policy, in the order they are listed to users: adding a policy is its file, its
/// `mod` line above and its entry here. (Plain `mod` lines, not a macro, so that `cargo
/// fmt` reaches the policy files.)
pub const REGISTRY: &[PolicyEntry] = &[
    full::ENTRY,
    streaming::ENTRY,
    ladder::ENTRY,
    quest::ENTRY,
    sketch::ENTRY,
    xattention::ENTRY,
    h2o::ENTRY,
    oracle::ENTRY,
    saap::ENTRY,
    saap::kmeans::ENTRY,
];

pub use full::DenseAttention;
pub use h2o::{H2oAttention, H2oSettings};
pub use ladder::{LadderAttention, LadderSettings};
pub use oracle::{OracleAttention, OracleSettings};
pub use quest::{QuestAttention, QuestSettings};
pub use saap::{Layout as SaapLayout, Router as SaapRouter, SaapAttention, SaapSettings};
pub use settings::{NoSettings, PolicySettings, SettingsMap, SettingsType};
pub use sketch::{SketchAttention, SketchSettings};
pub use streaming::StreamingAttention;
pub use xattention::{XAttention, XAttentionSettings};

/// A built policy, or why its settings are refused.
pub type BuildResult = Result<Box<dyn SparsePolicy>, String>;

/// What a policy's `build` sees: the user's choice (the policy's own settings, and the
/// shared `--kv-block` and `--dense-layers`) and the model's shapes. A policy that needs a
/// file (a trained index) takes its path as one of its settings and loads it here, so a
/// missing or foreign file is refused before anything runs.
pub struct BuildContext<'a> {
    /// The user's choice.
    pub choice: &'a AttentionChoice,
    /// The model the policy will run on.
    pub model: &'a ModelConfig,
}

impl BuildContext<'_> {
    /// The policy's settings of type `S` (the user's, or `S::default()`).
    pub fn settings<S: PolicySettings>(&self) -> S {
        self.choice.settings::<S>()
    }
}

/// A policy as the registry knows it: its name, the phases it may run, its settings type
/// (whose flags every command accepts) and how it is built.
pub struct PolicyEntry {
    /// The `--attn` name.
    pub name: &'static str,
    /// What it does, in a few words (for `--help`).
    pub summary: &'static str,
    /// Whether it may run prompt processing.
    pub prefill: bool,
    /// Whether it may run generation.
    pub decode: bool,
    /// Build it, or say which setting is wrong.
    pub build: fn(&BuildContext<'_>) -> BuildResult,
    /// Its settings as they take effect (`Debug`, for reports), or which one is wrong:
    /// checked before a model is loaded.
    pub check: fn(&AttentionChoice) -> Result<String, String>,
    /// Its settings type, erased.
    pub settings: SettingsType,
}

/// Where `--help` lists the attention flags (with the CLI's KV cache flags).
pub const HELP_HEADING: &str = "KV cache and attention";

/// The names accepted by [`AttentionChoice::build`], comma-separated, in registry order.
pub fn policy_names() -> String {
    REGISTRY
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Stable names for "the recommended policy of its kind": `(alias, policy)`. Scripts can
/// say `--attn-prefill sparse` without tracking which method measures best this month
/// (docs/long-context.md has the measurements behind each choice).
pub const ALIASES: &[(&str, &str)] = &[("sparse", "xattention")];

/// The registry entry `name` (a policy or an alias) stands for, or why there is none.
fn lookup(name: &str) -> Result<&'static PolicyEntry, String> {
    let name = ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, policy)| policy);
    REGISTRY.iter().find(|p| p.name == name).ok_or_else(|| {
        format!(
            "unknown attention policy '{name}' (available: {}; aliases: {})",
            policy_names(),
            ALIASES
                .iter()
                .map(|(a, p)| format!("{a} = {p}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// `--attn`'s help: every policy with its summary.
pub fn attn_help() -> String {
    let list: Vec<String> = REGISTRY
        .iter()
        .map(|p| format!("{} ({})", p.name, p.summary))
        .collect();
    format!(
        "Attention policy: {}. Aliases: {}. A phase the policy does not support runs `full`. `sparrow bench` and `sparrow eval` take a comma-separated list and measure each.",
        list.join(", "),
        ALIASES
            .iter()
            .map(|(a, p)| format!("{a} = {p}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Names of the policies usable in one phase, for error messages.
fn names_for(prefill: bool) -> String {
    REGISTRY
        .iter()
        .filter(|p| if prefill { p.prefill } else { p.decode })
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Settings that choose the attention policy (`--attn` and friends). With feature `cli`
/// it is a clap argument group: each policy's settings bring their own flags.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct AttentionChoice {
    /// Attention policy (the help lists the registry's policies).
    #[cfg_attr(feature = "cli", arg(id = "ATTN", long = "attn", default_value = "full", help = attn_help(), help_heading = crate::policy::HELP_HEADING))]
    pub name: String,
    /// Policy for prompt processing only (overrides --attn for prefill).
    #[cfg_attr(feature = "cli", arg(id = "ATTN_PREFILL", long = "attn-prefill", help_heading = crate::policy::HELP_HEADING))]
    pub prefill: Option<String>,
    /// Policy for generation only (overrides --attn for decode).
    #[cfg_attr(feature = "cli", arg(id = "ATTN_DECODE", long = "attn-decode", help_heading = crate::policy::HELP_HEADING))]
    pub decode: Option<String>,
    /// Positions per KV block: the cache is paged and sealed at this size, and it is
    /// Quest's page and the ladder's landmark block [default: 16, each policy's own].
    #[cfg_attr(feature = "cli", arg(id = "KV_BLOCK", long = "kv-block", alias = "quest-page", help_heading = crate::policy::HELP_HEADING))]
    pub kv_block: Option<usize>,
    /// Layers that keep exact attention under a sparse policy (comma-separated; empty for
    /// none). Default: each policy's own (Quest's authors keep layers 0 and 1 dense; the
    /// others none).
    #[cfg_attr(feature = "cli", arg(id = "DENSE_LAYERS", long = "dense-layers", value_delimiter = ',', help_heading = crate::policy::HELP_HEADING))]
    pub dense_layers: Option<Vec<String>>,
    /// Each policy's settings, by type (with feature `cli`, their flags).
    #[cfg_attr(feature = "cli", command(flatten))]
    pub settings: SettingsMap,
}

impl Default for AttentionChoice {
    fn default() -> Self {
        AttentionChoice {
            name: "full".into(),
            prefill: None,
            decode: None,
            kv_block: None,
            dense_layers: None,
            settings: SettingsMap::default(),
        }
    }
}

impl AttentionChoice {
    /// A choice of `name` for both phases with default settings.
    pub fn named(name: &str) -> Self {
        AttentionChoice {
            name: name.into(),
            ..Default::default()
        }
    }

    /// The policy settings of type `S` (the user's, or the defaults).
    pub fn settings<S: PolicySettings>(&self) -> S {
        self.settings.get::<S>()
    }

    /// The policy settings of type `S`, to change.
    pub fn settings_mut<S: PolicySettings>(&mut self) -> &mut S {
        self.settings.get_mut::<S>()
    }

    /// The same choice with the policy settings `s`.
    pub fn with<S: PolicySettings>(mut self, s: S) -> Self {
        *self.settings.get_mut::<S>() = s;
        self
    }

    /// The same settings with policy `name` for both phases (for `sparrow bench`'s and
    /// `eval`'s comma-separated lists).
    pub fn with_name(&self, name: &str) -> Self {
        AttentionChoice {
            name: name.into(),
            ..self.clone()
        }
    }

    /// `--dense-layers` as layer numbers (`None`: each policy's own default).
    pub fn dense_layers(&self) -> Result<Option<Vec<usize>>, String> {
        self.dense_layers
            .as_ref()
            .map(|list| {
                list.iter()
                    .map(|s| s.trim())
                    .filter(|s| !s.is_empty())
                    .map(|s| {
                        s.parse::<usize>()
                            .map_err(|_| format!("--dense-layers: '{s}' is not a layer number"))
                    })
                    .collect()
            })
            .transpose()
    }

    /// How results name this choice: the policy, or `prefill+decode` when both phases are
    /// sparse and differ.
    pub fn label(&self) -> String {
        match self.phase_names() {
            Ok((p, d)) if p == d || d == "full" => p,
            Ok((p, d)) if p == "full" => d,
            Ok((p, d)) => format!("{p}+{d}"),
            Err(_) => self.name.clone(),
        }
    }

    /// The policy names used for prefill and decode, or why the combination is refused.
    pub fn phase_names(&self) -> Result<(String, String), String> {
        let base = lookup(&self.name)?;
        let prefill = match &self.prefill {
            Some(p) => {
                let entry = lookup(p)?;
                if !entry.prefill {
                    return Err(format!(
                        "attention policy '{p}' does not support prefill (prefill policies: {})",
                        names_for(true)
                    ));
                }
                entry.name.to_string()
            }
            None if base.prefill => base.name.to_string(),
            None => "full".to_string(),
        };
        let decode = match &self.decode {
            Some(d) => {
                let entry = lookup(d)?;
                if !entry.decode {
                    return Err(format!(
                        "attention policy '{d}' does not support decode (decode policies: {})",
                        names_for(false)
                    ));
                }
                entry.name.to_string()
            }
            None if base.decode => base.name.to_string(),
            None => "full".to_string(),
        };
        Ok((prefill, decode))
    }

    /// Check what can be checked without a model: the shared settings, the policy names per
    /// phase and those policies' settings.
    pub fn check(&self) -> Result<(), String> {
        // Shared settings are checked whichever policy runs (a typo is never ignored).
        self.dense_layers()?;
        if self.kv_block == Some(0) || self.kv_block.is_some_and(|b| b > 4096) {
            return Err(format!(
                "KV block size {} is out of range (1..=4096 tokens)",
                self.kv_block.unwrap_or(0)
            ));
        }
        let (prefill, decode) = self.phase_names()?;
        for name in [prefill, decode] {
            if let Some(entry) = REGISTRY.iter().find(|p| p.name == name) {
                (entry.check)(self)?;
            }
        }
        Ok(())
    }

    /// Build the policy for `model`, or explain what is wrong.
    pub fn build(&self, model: &ModelConfig) -> Result<Box<dyn SparsePolicy>, String> {
        self.check()?;
        let (prefill, decode) = self.phase_names()?;
        if prefill == decode {
            return self.build_one(&prefill, model);
        }
        let prefill = self.build_one(&prefill, model)?;
        let decode = self.build_one(&decode, model)?;
        if let (Some(p), Some(d)) = (prefill.block_size(), decode.block_size()) {
            if p != d {
                return Err(format!(
                    "the prefill policy '{}' pages the cache in blocks of {p} tokens and the decode policy '{}' in blocks of {d}: use one block size",
                    prefill.name(),
                    decode.name(),
                ));
            }
        }
        // `--attn quest` reads as "quest" (its prefill is exact); a real mix names both.
        let name = self.label();
        Ok(Box::new(PhasedAttention {
            name,
            prefill,
            decode,
        }))
    }

    /// The settings policy `name` runs with, for reports ("" for an unknown name).
    pub fn describe(&self, name: &str) -> String {
        REGISTRY
            .iter()
            .find(|p| p.name == name)
            .map_or(String::new(), |p| (p.check)(self).unwrap_or_else(|e| e))
    }

    /// Build policy `name` alone (whatever phases it supports).
    pub fn build_one(
        &self,
        name: &str,
        model: &ModelConfig,
    ) -> Result<Box<dyn SparsePolicy>, String> {
        let entry = lookup(name)?;
        (entry.build)(&BuildContext {
            choice: self,
            model,
        })
    }
}

/// One policy for prefill, another for decode. A forward pass of a single token is decode;
/// a batch of several is prefill. Both see every block seal and rewind, so the decode
/// policy's summaries are complete when generation starts.
pub struct PhasedAttention {
    name: String,
    prefill: Box<dyn SparsePolicy>,
    decode: Box<dyn SparsePolicy>,
}

impl PhasedAttention {
    fn for_batch(&mut self, ctx: &PlanContext<'_>) -> &mut dyn SparsePolicy {
        if ctx.n_tokens() > 1 {
            self.prefill.as_mut()
        } else {
            self.decode.as_mut()
        }
    }
}

impl SparsePolicy for PhasedAttention {
    fn name(&self) -> &str {
        &self.name
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        self.for_batch(ctx).plan(ctx)
    }

    fn wants_lse(&self) -> bool {
        self.prefill.wants_lse() || self.decode.wants_lse()
    }

    fn after_attend(&mut self, ctx: &PlanContext<'_>, lse: &[f32]) {
        self.for_batch(ctx).after_attend(ctx, lse)
    }

    fn forget_from(&mut self, pos: usize) {
        self.prefill.forget_from(pos);
        self.decode.forget_from(pos);
    }

    fn prompt_ends_at(&mut self, end: usize) {
        self.prefill.prompt_ends_at(end);
        self.decode.prompt_ends_at(end);
    }

    fn rewinds_exactly(&self) -> bool {
        self.prefill.rewinds_exactly() && self.decode.rewinds_exactly()
    }

    fn decodes_every_key(&self) -> bool {
        self.decode.decodes_every_key()
    }

    fn summary_bytes(&self, n_ctx: usize, kv_dim: usize) -> usize {
        self.prefill.summary_bytes(n_ctx, kv_dim) + self.decode.summary_bytes(n_ctx, kv_dim)
    }

    fn fraction_read(&self, n_ctx: usize) -> f64 {
        self.decode.fraction_read(n_ctx)
    }

    fn requires_block_selection(&self) -> bool {
        self.prefill.requires_block_selection() || self.decode.requires_block_selection()
    }

    fn block_size(&self) -> Option<usize> {
        self.decode.block_size().or(self.prefill.block_size())
    }

    fn on_block_sealed(&mut self, layer: usize, block: usize, keys: KeysView<'_>) {
        self.prefill.on_block_sealed(layer, block, keys);
        self.decode.on_block_sealed(layer, block, keys);
    }

    /// The decode policy's partition (Saap's): the store is arranged for the phase that
    /// reads it sparsely, and every prefill policy reads the store by position.
    fn partition(&self, layer: usize) -> Option<sparrow_attn::policy::Partition> {
        self.decode.partition(layer)
    }

    fn placement(&self) -> Option<&[u32]> {
        self.decode.placement()
    }
}

/// A model of `n_layer` layers (its shapes are all a policy's build looks at).
#[cfg(test)]
fn shapes(n_layer: usize) -> ModelConfig {
    crate::synthetic::synthetic_config(&crate::synthetic::SyntheticSpec {
        n_layer,
        ..Default::default()
    })
    .expect("the synthetic model's header is valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_and_bad_settings_are_refused_with_the_valid_values() {
        let err = AttentionChoice::named("h3o")
            .build(&shapes(2))
            .err()
            .unwrap();
        assert!(
            err.contains("'h3o'") && err.contains(&policy_names()),
            "{err}"
        );
        assert!(AttentionChoice::named("streaming")
            .with(StreamingAttention {
                sinks: 4,
                window: 0
            })
            .build(&shapes(2))
            .is_err());
        let mut bad_budget = AttentionChoice::named("quest");
        bad_budget.settings_mut::<QuestSettings>().budget = 3;
        assert!(bad_budget
            .build(&shapes(2))
            .err()
            .unwrap()
            .contains("budget 3"));
    }

    #[test]
    fn phases_fall_back_to_full_and_refuse_unsupported_overrides() {
        let names = |c: &AttentionChoice| c.phase_names().unwrap();
        assert_eq!(
            names(&AttentionChoice::named("quest")),
            ("full".into(), "quest".into())
        );
        assert_eq!(
            names(&AttentionChoice::named("xattention")),
            ("xattention".into(), "full".into())
        );
        assert_eq!(
            names(&AttentionChoice::named("streaming")),
            ("streaming".into(), "streaming".into())
        );
        let mixed = AttentionChoice {
            prefill: Some("xattention".into()),
            decode: Some("quest".into()),
            ..AttentionChoice::named("full")
        };
        assert_eq!(names(&mixed), ("xattention".into(), "quest".into()));
        assert_eq!(mixed.build(&shapes(4)).unwrap().name(), "xattention+quest");

        let err = AttentionChoice {
            prefill: Some("quest".into()),
            ..AttentionChoice::named("full")
        }
        .build(&shapes(2))
        .err()
        .unwrap();
        assert!(err.contains("does not support prefill"), "{err}");
        assert!(err.contains("full, streaming, ladder, xattention"), "{err}");
        let err = AttentionChoice {
            decode: Some("xattention".into()),
            ..AttentionChoice::named("full")
        }
        .build(&shapes(2))
        .err()
        .unwrap();
        assert!(err.contains("does not support decode"), "{err}");
        assert!(
            err.contains("full, streaming, ladder, quest, sketch, h2o, oracle"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod registry_tests {
    use super::*;

    /// The names listed to users are exactly the registry's, in its order.
    #[test]
    fn policy_names_list_the_registry() {
        let names: Vec<&str> = REGISTRY.iter().map(|p| p.name).collect();
        assert_eq!(names.join(", "), policy_names());
        // Saap and kmeans read a trained index: a random one for these shapes.
        let model = shapes(2);
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join("registry.saap");
        crate::synthetic::synthetic_saap_index(&model, 4, 4, 1)
            .save(&index)
            .unwrap();
        for p in REGISTRY {
            let built = AttentionChoice::named(p.name)
                .with(SaapSettings {
                    index: Some(index.clone()),
                    ..Default::default()
                })
                .build_one(p.name, &model)
                .unwrap();
            assert_eq!(built.supports_prefill(), p.prefill, "{}", p.name);
            assert_eq!(built.supports_decode(), p.decode, "{}", p.name);
        }
    }

    /// `--kv-block` pages Quest and the ladder; `--dense-layers` reaches every policy and
    /// refuses what is not a layer number.
    #[test]
    fn shared_settings_reach_the_policies() {
        let c = AttentionChoice {
            kv_block: Some(8),
            ..AttentionChoice::named("quest")
        };
        assert_eq!(c.build(&shapes(2)).unwrap().block_size(), Some(8));
        assert_eq!(
            AttentionChoice {
                kv_block: Some(0),
                ..AttentionChoice::named("ladder")
            }
            .build(&shapes(2))
            .err()
            .unwrap(),
            "KV block size 0 is out of range (1..=4096 tokens)"
        );
        let bad = AttentionChoice {
            dense_layers: Some(vec!["1".into(), "two".into()]),
            ..AttentionChoice::named("h2o")
        };
        assert!(bad
            .build(&shapes(2))
            .err()
            .unwrap()
            .contains("'two' is not a layer number"));
    }
}
