//! `full`: exact causal attention — every query reads every position up to its own.

use super::{NoSettings, PolicyEntry, SettingsType};
use sparrow_attn::policy::{PlanContext, ReadPlan, SparsePolicy};

/// The registry's entry.
pub const ENTRY: PolicyEntry = PolicyEntry {
    name: "full",
    summary: "exact",
    prefill: true,
    decode: true,
    build: |_| Ok(Box::new(DenseAttention)),
    check: |_| Ok(String::new()),
    settings: SettingsType::of::<NoSettings>(),
};

/// Exact causal attention (the reference every sparse policy is measured against).
#[derive(Clone, Copy, Debug, Default)]
pub struct DenseAttention;

impl SparsePolicy for DenseAttention {
    fn name(&self) -> &str {
        "full"
    }

    fn decodes_every_key(&self) -> bool {
        true
    }

    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        ReadPlan::causal(ctx.shape, ctx.pos0, ctx.n_tokens())
    }
}
