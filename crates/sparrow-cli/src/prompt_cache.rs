//! `--prompt-cache FILE` for `sparrow run`: restore a saved prompt prefix before the prefill
//! and save the prompt's KV state after the run.

use sparrow::prompt_cache;
use sparrow::session::reusable_prefix;
use sparrow::{Engine, State};
use std::path::Path;

/// Restore the longest usable prefix of `ids` from `path` into `state`; returns how many
/// positions were restored (0 when the file is missing, refused or shares nothing).
pub fn restore(path: &Path, engine: &Engine, state: &mut State, ids: &[u32]) -> usize {
    if !path.exists() {
        eprintln!(
            "prompt cache: {} does not exist yet; it will be written after this run",
            path.display()
        );
        return 0;
    }
    let cache = match prompt_cache::load(path, &engine.model, state) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "warning: {e}; ignoring {} and processing the prompt normally",
                path.display()
            );
            return 0;
        }
    };
    let n = reusable_prefix(&cache.tokens, ids);
    if n == 0 {
        eprintln!(
            "prompt cache: {} shares no prefix with this prompt",
            path.display()
        );
        return 0;
    }
    match cache.restore(state, n) {
        Ok(0) => {
            eprintln!(
                "prompt cache: {} was saved too far past this prompt's prefix for the model's \
                 sliding-window layers; processing the prompt normally",
                path.display()
            );
            0
        }
        Ok(n) => {
            eprintln!(
                "prompt cache: restored {n} of {} prompt tokens from {}",
                ids.len(),
                path.display()
            );
            n
        }
        Err(e) => {
            eprintln!("warning: {e}; processing the prompt normally");
            state.reset();
            0
        }
    }
}

/// Save the prompt's positions to `path` unless the file already covered them.
pub fn save(path: &Path, engine: &Engine, state: &State, ids: &[u32], restored: usize) {
    if restored + 1 >= ids.len() && path.exists() {
        return;
    }
    match prompt_cache::save(path, &engine.model, state, ids) {
        Ok(()) => eprintln!(
            "prompt cache: saved {} tokens to {}",
            ids.len(),
            path.display()
        ),
        Err(e) => eprintln!("warning: cannot save the prompt cache: {e}"),
    }
}
