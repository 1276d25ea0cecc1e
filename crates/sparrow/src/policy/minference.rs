//! MInference-style prefill (vertical-slash pattern). PLACEHOLDER being implemented this
//! session.

use crate::attention::{AttentionBackend, AttnShape, DenseAttention};
use crate::kv_cache::KvCache;

/// MInference settings (defaults from the method's code).
#[derive(Clone, Debug, PartialEq)]
pub struct MInferenceSettings {
    /// First key columns every query reads.
    pub sinks: usize,
    /// Most recent diagonals every query reads.
    pub recent: usize,
    /// Keys read per query as a fraction of its context.
    pub budget: f64,
    /// Queries at the end of each prefill batch used to estimate the pattern.
    pub last_q: usize,
    /// Layers that keep exact attention.
    pub dense_layers: Vec<usize>,
}

impl Default for MInferenceSettings {
    fn default() -> Self {
        MInferenceSettings {
            sinks: 30,
            recent: 100,
            budget: 0.3,
            last_q: 64,
            dense_layers: Vec::new(),
        }
    }
}

/// The MInference prefill backend.
pub struct MInferenceAttention {
    #[allow(dead_code)]
    settings: MInferenceSettings,
}

impl MInferenceAttention {
    /// A backend for a model of `n_layer` layers.
    pub fn new(settings: MInferenceSettings, _n_layer: usize) -> Result<Self, String> {
        Ok(MInferenceAttention { settings })
    }
}

impl AttentionBackend for MInferenceAttention {
    fn name(&self) -> &str {
        "minference"
    }

    fn supports_decode(&self) -> bool {
        false
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
        DenseAttention.attend(shape, cache, layer, q, pos0, out)
    }
}
