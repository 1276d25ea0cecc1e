//! Choosing attention policies by name, per phase.
//!
//! Every policy is an [`AttentionBackend`]; this module turns the user's words (`--attn`,
//! `--attn-prefill`, `--attn-decode` and each policy's settings) into a backend, refusing
//! unknown names, out-of-range settings and policies used in a phase they do not support.
//! When prefill and decode use different policies, [`PhasedAttention`] routes each call:
//! a forward pass of one token is decode, a batch of several is prefill.

pub mod h2o;
pub mod ladder;
pub mod minference;

use crate::attention::{AttentionBackend, AttnShape, DenseAttention, StreamingAttention};
use crate::kv_cache::KvCache;
use crate::quest::{QuestAttention, QuestSettings};
pub use h2o::{H2oAttention, H2oSettings};
pub use ladder::{LadderAttention, LadderSettings};
pub use minference::{MInferenceAttention, MInferenceSettings};
use sparrow_attn::policy::KeysView;
use std::ops::Range;

/// Names accepted by [`AttentionChoice::build`].
pub const POLICY_NAMES: &str = "full, streaming, ladder, quest, minference, h2o";

/// What each policy may be used for: `(name, prefill, decode)`.
const PHASES: &[(&str, bool, bool)] = &[
    ("full", true, true),
    ("streaming", true, true),
    ("ladder", true, true),
    ("quest", false, true),
    ("minference", true, false),
    ("h2o", false, true),
];

/// Names of the policies usable in one phase, for error messages.
fn names_for(prefill: bool) -> String {
    PHASES
        .iter()
        .filter(|p| if prefill { p.1 } else { p.2 })
        .map(|p| p.0)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Settings that choose the attention backend (`--attn` and friends).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionChoice {
    /// The policy for both phases (`--attn`); a phase the policy does not support falls
    /// back to `full`.
    pub name: String,
    /// Prefill policy (`--attn-prefill`), overriding `name`; must support prefill.
    pub prefill: Option<String>,
    /// Decode policy (`--attn-decode`), overriding `name`; must support decode.
    pub decode: Option<String>,
    /// Streaming: sink tokens kept.
    pub sinks: usize,
    /// Streaming: recent tokens kept.
    pub window: usize,
    /// Quest: page size, token budget and dense layers.
    pub quest: QuestSettings,
    /// Ladder: window, sinks, log-stride and landmarks.
    pub ladder: LadderSettings,
    /// MInference: vertical-slash prefill budget.
    pub minference: MInferenceSettings,
    /// H2O: heavy hitters and recent tokens kept in decode.
    pub h2o: H2oSettings,
}

impl Default for AttentionChoice {
    fn default() -> Self {
        // StreamingLLM's defaults: 4 sinks and a 2000-token recent window.
        AttentionChoice {
            name: "full".into(),
            prefill: None,
            decode: None,
            sinks: 4,
            window: 2000,
            quest: QuestSettings::default(),
            ladder: LadderSettings::default(),
            minference: MInferenceSettings::default(),
            h2o: H2oSettings::default(),
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
            PHASES.iter().find(|p| p.0 == name).ok_or_else(|| {
                format!("unknown attention policy '{name}' (available: {POLICY_NAMES})")
            })
        };
        let base = lookup(&self.name)?;
        let prefill = match &self.prefill {
            Some(p) => {
                if !lookup(p)?.1 {
                    return Err(format!(
                        "attention policy '{p}' does not support prefill (prefill policies: {})",
                        names_for(true)
                    ));
                }
                p.clone()
            }
            None if base.1 => base.0.to_string(),
            None => "full".to_string(),
        };
        let decode = match &self.decode {
            Some(d) => {
                if !lookup(d)?.2 {
                    return Err(format!(
                        "attention policy '{d}' does not support decode (decode policies: {})",
                        names_for(false)
                    ));
                }
                d.clone()
            }
            None if base.2 => base.0.to_string(),
            None => "full".to_string(),
        };
        Ok((prefill, decode))
    }

    /// Build the backend for a model of `n_layer` layers, or explain what is wrong.
    pub fn build(&self, n_layer: usize) -> Result<Box<dyn AttentionBackend>, String> {
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

    fn build_one(&self, name: &str, n_layer: usize) -> Result<Box<dyn AttentionBackend>, String> {
        match name {
            "full" => Ok(Box::new(DenseAttention)),
            "streaming" => {
                if self.window == 0 {
                    return Err("streaming attention needs a window of at least 1 token".into());
                }
                Ok(Box::new(StreamingAttention {
                    sinks: self.sinks,
                    window: self.window,
                }))
            }
            "quest" => Ok(Box::new(QuestAttention::new(self.quest.clone(), n_layer)?)),
            "ladder" => Ok(Box::new(LadderAttention::new(
                self.ladder.clone(),
                n_layer,
            )?)),
            "minference" => Ok(Box::new(MInferenceAttention::new(
                self.minference.clone(),
                n_layer,
            )?)),
            "h2o" => Ok(Box::new(H2oAttention::new(self.h2o.clone(), n_layer)?)),
            other => Err(format!(
                "unknown attention policy '{other}' (available: {POLICY_NAMES})"
            )),
        }
    }
}

/// One policy for prefill, another for decode. A forward pass of a single token is decode;
/// a batch of several is prefill. Both see every block seal and rewind, so the decode
/// policy's summaries are complete when generation starts.
pub struct PhasedAttention {
    name: String,
    prefill: Box<dyn AttentionBackend>,
    decode: Box<dyn AttentionBackend>,
}

impl PhasedAttention {
    fn for_rows(&self, shape: AttnShape, q: &[f32]) -> &dyn AttentionBackend {
        if q.len() > shape.n_head * shape.head_dim {
            self.prefill.as_ref()
        } else {
            self.decode.as_ref()
        }
    }
}

impl AttentionBackend for PhasedAttention {
    fn name(&self) -> &str {
        &self.name
    }

    fn attend(
        &self,
        shape: AttnShape,
        cache: &KvCache,
        layer: usize,
        q: &[f32],
        pos0: usize,
        out: &mut [f32],
    ) {
        self.for_rows(shape, q)
            .attend(shape, cache, layer, q, pos0, out)
    }

    fn forget_from(&self, pos: usize) {
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

    fn on_block_sealed(&self, layer: usize, block: usize, keys: KeysView<'_>) {
        self.prefill.on_block_sealed(layer, block, keys);
        self.decode.on_block_sealed(layer, block, keys);
    }

    fn read_set(
        &self,
        shape: AttnShape,
        cache: &KvCache,
        layer: usize,
        q: &[f32],
        pos: usize,
    ) -> Vec<Vec<Range<usize>>> {
        self.decode.read_set(shape, cache, layer, q, pos)
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
            window: 0,
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
        assert!(err.contains("full, streaming, ladder, quest, h2o"), "{err}");
    }
}
