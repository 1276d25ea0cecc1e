//! Choosing attention policies by name, per phase.
//!
//! Every policy is a [`SparsePolicy`] (it plans reads; the executor computes); this module
//! turns the user's words (`--attn`,
//! `--attn-prefill`, `--attn-decode` and each policy's settings) into a backend, refusing
//! unknown names, out-of-range settings and policies used in a phase they do not support.
//! When prefill and decode use different policies, [`PhasedAttention`] routes each call:
//! a forward pass of one token is decode, a batch of several is prefill.

pub mod full;
pub mod h2o;
pub mod ladder;
pub mod minference;
pub mod oracle;
pub mod quest;
pub mod streaming;

pub use full::DenseAttention;
pub use h2o::{H2oAttention, H2oSettings};
pub use ladder::{LadderAttention, LadderSettings};
pub use minference::{MInferenceAttention, MInferenceSettings};
pub use oracle::{OracleAttention, OracleSettings};
pub use quest::{QuestAttention, QuestSettings};
use sparrow_attn::policy::{KeysView, PlanContext, ReadPlan, SparsePolicy};
pub use streaming::StreamingAttention;

/// A built policy, or why its settings are refused.
pub type BuildResult = Result<Box<dyn SparsePolicy>, String>;

/// A policy as the registry knows it: its name, the phases it may run, and how it is
/// built from the user's choice (its own settings field of [`AttentionChoice`], the shared
/// `kv_block` and `dense_layers`) for a model of `n_layer` layers.
pub struct PolicyEntry {
    /// The `--attn` name.
    pub name: &'static str,
    /// Whether it may run prompt processing.
    pub prefill: bool,
    /// Whether it may run generation.
    pub decode: bool,
    /// Build it, or say which setting is wrong.
    pub build: fn(&AttentionChoice, usize) -> BuildResult,
    /// Its settings as they take effect, for reports (`Debug` of its settings struct).
    pub describe: fn(&AttentionChoice) -> String,
}

/// Every policy, in the order they are listed to users. Adding a policy: its file (with
/// its `ENTRY` and its settings), its `mod` line, a line here and a settings field in
/// [`AttentionChoice`].
pub const REGISTRY: &[PolicyEntry] = &[
    full::ENTRY,
    streaming::ENTRY,
    ladder::ENTRY,
    quest::ENTRY,
    minference::ENTRY,
    h2o::ENTRY,
    oracle::ENTRY,
];

/// Where `--help` lists the attention flags (with the CLI's KV cache flags).
pub const HELP_HEADING: &str = "KV cache and attention";

/// Names accepted by [`AttentionChoice::build`].
pub const POLICY_NAMES: &str = "full, streaming, ladder, quest, minference, h2o, oracle";

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
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct AttentionChoice {
    /// Attention policy: full (exact), streaming (sinks + recent window), ladder (window +
    /// sinks + log-stride + block landmarks), quest (decode: best pages within a budget),
    /// minference (prefill: vertical-slash pattern), h2o (decode: heavy hitters + recent),
    /// oracle (decode: the exact top keys by attention mass within --oracle-budget). A phase
    /// the policy does not support runs `full`. `sparrow bench` and `sparrow eval` take a
    /// comma-separated list and measure each.
    #[cfg_attr(feature = "cli", arg(id = "ATTN", long = "attn", default_value = "full", help_heading = crate::policy::HELP_HEADING))]
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
    /// Streaming's sinks and window.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub streaming: StreamingAttention,
    /// Quest: page size, token budget and dense layers.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub quest: QuestSettings,
    /// Ladder: window, sinks, log-stride and landmarks.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub ladder: LadderSettings,
    /// MInference: vertical-slash prefill budget.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub minference: MInferenceSettings,
    /// H2O: heavy hitters and recent tokens kept in decode.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub h2o: H2oSettings,
    /// Oracle: exact top keys within a budget (the selection quality ceiling).
    #[cfg_attr(feature = "cli", command(flatten))]
    pub oracle: OracleSettings,
}

impl Default for AttentionChoice {
    fn default() -> Self {
        AttentionChoice {
            name: "full".into(),
            prefill: None,
            decode: None,
            kv_block: None,
            dense_layers: None,
            streaming: StreamingAttention::default(),
            quest: QuestSettings::default(),
            ladder: LadderSettings::default(),
            minference: MInferenceSettings::default(),
            h2o: H2oSettings::default(),
            oracle: OracleSettings::default(),
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
        let lookup = |name: &str| {
            REGISTRY.iter().find(|p| p.name == name).ok_or_else(|| {
                format!("unknown attention policy '{name}' (available: {POLICY_NAMES})")
            })
        };
        let base = lookup(&self.name)?;
        let prefill = match &self.prefill {
            Some(p) => {
                if !lookup(p)?.prefill {
                    return Err(format!(
                        "attention policy '{p}' does not support prefill (prefill policies: {})",
                        names_for(true)
                    ));
                }
                p.clone()
            }
            None if base.prefill => base.name.to_string(),
            None => "full".to_string(),
        };
        let decode = match &self.decode {
            Some(d) => {
                if !lookup(d)?.decode {
                    return Err(format!(
                        "attention policy '{d}' does not support decode (decode policies: {})",
                        names_for(false)
                    ));
                }
                d.clone()
            }
            None if base.decode => base.name.to_string(),
            None => "full".to_string(),
        };
        Ok((prefill, decode))
    }

    /// Build the policy for a model of `n_layer` layers, or explain what is wrong.
    pub fn build(&self, n_layer: usize) -> Result<Box<dyn SparsePolicy>, String> {
        // Shared settings are checked whichever policy runs (a typo is never ignored).
        self.dense_layers()?;
        if self.kv_block == Some(0) || self.kv_block.is_some_and(|b| b > 4096) {
            return Err(format!(
                "KV block size {} is out of range (1..=4096 tokens)",
                self.kv_block.unwrap_or(0)
            ));
        }
        let (prefill, decode) = self.phase_names()?;
        if prefill == decode {
            return self.build_one(&prefill, n_layer);
        }
        let prefill = self.build_one(&prefill, n_layer)?;
        let decode = self.build_one(&decode, n_layer)?;
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
            .map_or(String::new(), |p| (p.describe)(self))
    }

    /// Build policy `name` alone (whatever phases it supports).
    pub fn build_one(&self, name: &str, n_layer: usize) -> Result<Box<dyn SparsePolicy>, String> {
        let entry = REGISTRY.iter().find(|p| p.name == name).ok_or_else(|| {
            format!("unknown attention policy '{name}' (available: {POLICY_NAMES})")
        })?;
        (entry.build)(self, n_layer)
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

    fn attend_own(&mut self, ctx: &PlanContext<'_>, out: &mut [f32]) -> bool {
        self.for_batch(ctx).attend_own(ctx, out)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_and_bad_settings_are_refused_with_the_valid_values() {
        let err = AttentionChoice::named("h3o").build(2).err().unwrap();
        assert!(err.contains("'h3o'") && err.contains(POLICY_NAMES), "{err}");
        assert!(AttentionChoice {
            streaming: StreamingAttention {
                sinks: 4,
                window: 0
            },
            ..AttentionChoice::named("streaming")
        }
        .build(2)
        .is_err());
        let mut bad_budget = AttentionChoice::named("quest");
        bad_budget.quest.budget = 3;
        assert!(bad_budget.build(2).err().unwrap().contains("budget 3"));
    }

    #[test]
    fn phases_fall_back_to_full_and_refuse_unsupported_overrides() {
        let names = |c: &AttentionChoice| c.phase_names().unwrap();
        assert_eq!(
            names(&AttentionChoice::named("quest")),
            ("full".into(), "quest".into())
        );
        assert_eq!(
            names(&AttentionChoice::named("minference")),
            ("minference".into(), "full".into())
        );
        assert_eq!(
            names(&AttentionChoice::named("streaming")),
            ("streaming".into(), "streaming".into())
        );
        let mixed = AttentionChoice {
            prefill: Some("minference".into()),
            decode: Some("quest".into()),
            ..AttentionChoice::named("full")
        };
        assert_eq!(names(&mixed), ("minference".into(), "quest".into()));
        assert_eq!(mixed.build(4).unwrap().name(), "minference+quest");

        let err = AttentionChoice {
            prefill: Some("quest".into()),
            ..AttentionChoice::named("full")
        }
        .build(2)
        .err()
        .unwrap();
        assert!(err.contains("does not support prefill"), "{err}");
        assert!(err.contains("full, streaming, ladder, minference"), "{err}");
        let err = AttentionChoice {
            decode: Some("minference".into()),
            ..AttentionChoice::named("full")
        }
        .build(2)
        .err()
        .unwrap();
        assert!(err.contains("does not support decode"), "{err}");
        assert!(
            err.contains("full, streaming, ladder, quest, h2o, oracle"),
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
        assert_eq!(names.join(", "), POLICY_NAMES);
        for p in REGISTRY {
            let built = AttentionChoice::named(p.name).build_one(p.name, 2).unwrap();
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
        assert_eq!(c.build(2).unwrap().block_size(), Some(8));
        assert_eq!(
            AttentionChoice {
                kv_block: Some(0),
                ..AttentionChoice::named("ladder")
            }
            .build(2)
            .err()
            .unwrap(),
            "KV block size 0 is out of range (1..=4096 tokens)"
        );
        let bad = AttentionChoice {
            dense_layers: Some(vec!["1".into(), "two".into()]),
            ..AttentionChoice::named("h2o")
        };
        assert!(bad
            .build(2)
            .err()
            .unwrap()
            .contains("'two' is not a layer number"));
    }
}
