//! The speculative-decoding flags (llama.cpp's names and meanings) and the drafts they ask
//! for: `--draft-model FILE` (`-md`) with `--draft-max`, `--draft-min`, `--draft-p-min`
//! and `--attn-draft`, or `--lookup N` for drafts found in the context itself.

use sparrow::attention::AttentionChoice;
use sparrow::scheduler::SpeculationFactory;
use sparrow::speculative::{
    check_vocabularies, DEFAULT_DRAFT_MAX, DEFAULT_DRAFT_P_MIN, DEFAULT_DRAFT_VOCAB,
};
use sparrow::{DraftModel, Drafter, Engine, KvOptions, PromptLookup, Speculation};
use std::sync::Arc;

/// Where `--help` lists these flags.
const HEADING: &str = "Speculative decoding";

/// Speculative decoding: the output is what plain decoding gives, token for token; the
/// flags only change how many tokens each pass of the model checks.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpeculativeArgs {
    /// A smaller model with the same vocabulary that drafts tokens for this one (e.g. the
    /// 0.5B for the 1.5B; llama.cpp's -md / --model-draft).
    #[arg(long = "draft-model", aliases = ["model-draft", "spec-draft-model", "md"], value_name = "FILE", help_heading = HEADING)]
    pub draft_model: Option<std::path::PathBuf>,
    /// Draft tokens by matching the context's last N tokens against earlier text (the
    /// prompt and what was generated): no second model.
    #[arg(long = "lookup", value_name = "N", conflicts_with = "draft_model", help_heading = HEADING)]
    pub lookup: Option<usize>,
    /// Most draft tokens checked per pass (the draft length adapts below it).
    #[arg(long = "draft-max", aliases = ["draft", "draft-n", "spec-draft-n-max"], default_value_t = DEFAULT_DRAFT_MAX, help_heading = HEADING)]
    pub draft_max: usize,
    /// Fewest draft tokens worth a check; fewer, and the step runs plainly.
    #[arg(long = "draft-min", aliases = ["draft-n-min", "spec-draft-n-min"], default_value_t = 0, help_heading = HEADING)]
    pub draft_min: usize,
    /// The draft model stops drafting once the product of its drafts' probabilities (its
    /// own odds that the check keeps them all) falls below this; every token it computed
    /// is checked, the one that crossed the line included (llama.cpp stops at a single
    /// token below it, unchecked).
    #[arg(long = "draft-p-min", alias = "spec-draft-p-min", default_value_t = DEFAULT_DRAFT_P_MIN, help_heading = HEADING)]
    pub draft_p_min: f32,
    /// The draft model scores only the vocabulary's first N token ids (byte-level BPE
    /// numbers tokens roughly by frequency) and the ids already in the context: each
    /// draft step reads that much less of its output matrix. The output is unchanged (the
    /// model checks every token); 0 scores every token.
    #[arg(long = "draft-vocab", value_name = "N", default_value_t = DEFAULT_DRAFT_VOCAB, help_heading = HEADING)]
    pub draft_vocab: usize,
    /// The draft model's attention policy (default settings; an index-trained policy
    /// needs an index for the draft model).
    #[arg(long = "attn-draft", default_value = "full", help_heading = HEADING)]
    pub attn_draft: String,
}

impl SpeculativeArgs {
    /// Whether speculative decoding is asked for (`--draft-model` or `--lookup`).
    pub fn is_on(&self) -> bool {
        self.draft_model.is_some() || self.lookup.is_some()
    }

    /// What makes one sequence's speculation as these flags ask, for a model whose engine
    /// is `target`, at context `n_ctx` (the draft model's too) and cache options `kv` (its
    /// types; the draft never goes to a cold tier); `None` without `--draft-model` or
    /// `--lookup`. The draft model is loaded here, once, and its vocabulary checked
    /// against the target's; each call of the factory gives it a state of its own.
    pub fn factory(
        &self,
        target: &Engine,
        n_ctx: usize,
        kv: &KvOptions,
        batch_size: usize,
    ) -> Result<Option<SpeculationFactory>, String> {
        let (max, min) = (self.draft_max, self.draft_min);
        // Settings are checked now, not at the first request.
        Speculation::new(
            Drafter::Lookup(PromptLookup::new(1).expect("1 is valid")),
            max,
            min,
        )
        .map_err(|e| e.to_string())?;
        let make: Arc<dyn Fn() -> sparrow::Result<Speculation> + Send + Sync> =
            match (&self.draft_model, self.lookup) {
                (Some(path), _) => {
                    let draft = Engine::load(path)
                        .map_err(|e| format!("draft model {}: {e}", path.display()))?;
                    check_vocabularies(&target.tokenizer, &draft.tokenizer)
                        .map_err(|e| e.to_string())?;
                    let choice = AttentionChoice::named(&self.attn_draft);
                    choice.check().map_err(|e| format!("--attn-draft: {e}"))?;
                    let kv = KvOptions {
                        types: kv.types,
                        cold: None,
                        reserved: 0,
                    };
                    let p_min = self.draft_p_min;
                    if !(0.0..=1.0).contains(&p_min) {
                        return Err(format!("--draft-p-min {p_min} is outside [0, 1]"));
                    }
                    let model = Arc::clone(&draft.model);
                    let vocab_head = self.draft_vocab;
                    Arc::new(move || {
                        let state = model.new_sequence(n_ctx, kv.clone(), &choice)?;
                        let m = DraftModel::new(Arc::clone(&model), state, p_min, batch_size)?
                            .with_vocab_head(vocab_head);
                        Speculation::new(Drafter::Model(Box::new(m)), max, min)
                    })
                }
                (None, Some(n)) => {
                    PromptLookup::new(n).map_err(|e| e.to_string())?;
                    Arc::new(move || {
                        Speculation::new(Drafter::Lookup(PromptLookup::new(n)?), max, min)
                    })
                }
                (None, None) => return Ok(None),
            };
        Ok(Some(SpeculationFactory(make)))
    }

    /// One sequence's speculation as these flags ask (see [`SpeculativeArgs::factory`]).
    pub fn speculation(
        &self,
        target: &Engine,
        n_ctx: usize,
        kv: &KvOptions,
        batch_size: usize,
    ) -> Result<Option<Speculation>, String> {
        match self.factory(target, n_ctx, kv, batch_size)? {
            Some(f) => (f.0)().map(Some).map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }
}

/// The stderr line of a speculative generation's counts.
pub fn summary(s: &sparrow::SpeculationStats, n_generated: usize) -> String {
    let siblings = if s.siblings > 0 {
        format!(
            ", {} of {} second choices taken",
            s.siblings_kept, s.siblings
        )
    } else {
        String::new()
    };
    format!(
        "speculation: {} drafted, {} accepted ({:.1}%){siblings}, {:.2} tokens per pass of the model ({} passes)",
        s.drafted,
        s.accepted,
        100.0 * s.acceptance(),
        n_generated as f64 / s.target_passes.max(1) as f64,
        s.target_passes
    )
}
