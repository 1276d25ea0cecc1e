//! Prefilled states kept on disk between evaluation runs (`--prefill-cache DIR`).
//!
//! A 32K RULER case on the 1.5B model prefills for 10–15 minutes and answers in seconds, so
//! a grid that adds one decode policy to cases already measured should not pay for the
//! prefills again. Each prefilled state is a prompt-cache file ([`sparrow::prompt_cache`]:
//! checked on load for the model, the cache types, the size and a checksum) named by a hash
//! of everything its bits depend on — the model, the prompt, the policy that prefilled it
//! with its settings, the batch size, the cache types and the SIMD levels — beside a small
//! file holding the seconds the prefill took, so a result read from the cache still reports
//! what its prefill cost. A file that does not load is refused with the reason and the
//! prompt is prefilled again (and the file rewritten).

use sha2::{Digest, Sha256};
use sparrow::attention::AttentionChoice;
use sparrow::engine::Engine;
use sparrow::kv::KvTypes;
use sparrow::model::State;
use sparrow::prompt_cache;
use std::path::{Path, PathBuf};

/// A folder of prefilled states.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefillCache {
    dir: PathBuf,
}

/// What one prefill's bits depend on, besides the model and the prompt.
#[derive(Clone, Debug)]
pub struct PrefillRecipe {
    /// The policy that runs the prefill and its settings (`xattention: XAttentionSettings
    /// { … }`); when the last prefill batch is a single token — which runs as a decode step —
    /// the decode policy too.
    pub policy: String,
    /// Prompt tokens per forward pass.
    pub batch_size: usize,
    /// Key and value cache types.
    pub types: KvTypes,
}

impl PrefillRecipe {
    /// The recipe of prefilling `prompt_len` tokens `batch_size` at a time under `choice`.
    pub fn new(
        choice: &AttentionChoice,
        prompt_len: usize,
        batch_size: usize,
        types: KvTypes,
    ) -> Result<Self, String> {
        let (prefill, decode) = choice.phase_names()?;
        let mut policy = format!("{prefill}: {}", choice.describe(&prefill));
        // A last batch of one token runs as a decode step.
        if prompt_len % batch_size.max(1) == 1 {
            policy += &format!("; last batch {decode}: {}", choice.describe(&decode));
        }
        Ok(PrefillRecipe {
            policy,
            batch_size,
            types,
        })
    }
}

impl PrefillCache {
    /// The cache in `dir` (created if missing), or why it cannot be used.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, String> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("--prefill-cache {}: {e}", dir.display()))?;
        Ok(PrefillCache { dir })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file holding `prompt` prefilled by `recipe` on `engine`'s model (it may not exist).
    pub fn path(&self, engine: &Engine, prompt: &[u32], recipe: &PrefillRecipe) -> PathBuf {
        let mut h = Sha256::new();
        h.update(prompt_cache::model_fingerprint(&engine.model));
        h.update((prompt.len() as u64).to_le_bytes());
        for t in prompt {
            h.update(t.to_le_bytes());
        }
        let mut line = |s: &str| {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        };
        line(&recipe.policy);
        line(&recipe.batch_size.to_string());
        line(&recipe.types.to_string());
        line(sparrow_attn::kernel::Level::active().name());
        line(sparrow_quant::SimdLevel::active().name());
        let digest = h.finalize();
        let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{name}.sparrow-prefill"))
    }

    /// Fill `state` with `prompt` from the cache, if it holds it: `Ok(Some(seconds))` with
    /// the seconds its prefill took, `Ok(None)` when there is no file, `Err` (why) when a
    /// file is there but cannot be used — the caller prefills then.
    pub fn load(
        &self,
        engine: &Engine,
        state: &mut State,
        prompt: &[u32],
        recipe: &PrefillRecipe,
    ) -> Result<Option<f64>, String> {
        let path = self.path(engine, prompt, recipe);
        if !path.exists() {
            return Ok(None);
        }
        let refused = |why: String| format!("prefill cache {}: {why}", path.display());
        let cache =
            prompt_cache::load(&path, &engine.model, state).map_err(|e| refused(e.to_string()))?;
        if cache.tokens != prompt {
            return Err(refused("it holds another prompt".into()));
        }
        let restored = cache
            .restore(state, prompt.len())
            .map_err(|e| refused(e.to_string()))?;
        if restored != prompt.len() {
            return Err(refused(format!(
                "only {restored} of its {} positions could be restored",
                prompt.len()
            )));
        }
        let seconds = std::fs::read_to_string(seconds_path(&path))
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN);
        Ok(Some(seconds))
    }

    /// Keep `state`'s first `prompt.len()` positions as `prompt` prefilled by `recipe`, which
    /// took `seconds`.
    pub fn save(
        &self,
        engine: &Engine,
        state: &State,
        prompt: &[u32],
        recipe: &PrefillRecipe,
        seconds: f64,
    ) -> Result<(), String> {
        let path = self.path(engine, prompt, recipe);
        prompt_cache::save(&path, &engine.model, state, prompt)
            .map_err(|e| format!("prefill cache {}: {e}", path.display()))?;
        std::fs::write(seconds_path(&path), format!("{seconds}\n"))
            .map_err(|e| format!("prefill cache {}: {e}", path.display()))
    }
}

/// The file beside `path` holding its prefill's seconds.
fn seconds_path(path: &Path) -> PathBuf {
    path.with_extension("seconds")
}
