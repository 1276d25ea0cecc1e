//! H2O (heavy-hitter oracle) decode. PLACEHOLDER being implemented this session.

use crate::attention::{AttentionBackend, AttnShape, DenseAttention};
use crate::kv_cache::KvCache;

/// H2O settings (defaults from the method's code: 10% heavy hitters + 10% recent).
#[derive(Clone, Debug, PartialEq)]
pub struct H2oSettings {
    /// Heavy hitters kept, as a fraction of the context.
    pub heavy: f64,
    /// Recent tokens kept, as a fraction of the context.
    pub recent: f64,
    /// Layers that keep exact attention.
    pub dense_layers: Vec<usize>,
}

impl Default for H2oSettings {
    fn default() -> Self {
        H2oSettings {
            heavy: 0.1,
            recent: 0.1,
            dense_layers: Vec::new(),
        }
    }
}

/// The H2O decode backend (one per sequence).
pub struct H2oAttention {
    #[allow(dead_code)]
    settings: H2oSettings,
}

impl H2oAttention {
    /// A backend for a model of `n_layer` layers.
    pub fn new(settings: H2oSettings, _n_layer: usize) -> Result<Self, String> {
        Ok(H2oAttention { settings })
    }
}

impl AttentionBackend for H2oAttention {
    fn name(&self) -> &str {
        "h2o"
    }

    fn supports_prefill(&self) -> bool {
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
