//! Ladder: sparrow-attn's fixed pattern (sinks + local window + log-stride ladder + block
//! landmarks) inside the engine. PLACEHOLDER being implemented this session.

use crate::attention::{AttentionBackend, AttnShape, DenseAttention};
use crate::kv_cache::KvCache;

/// Ladder settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LadderSettings {
    /// Most recent positions every query reads (its own included).
    pub window: usize,
    /// First positions every query reads.
    pub sinks: usize,
    /// Positions per landmark block (the KV store's block size).
    pub block: usize,
    /// Read single keys at distances 1, 2, 4, … beyond the window.
    pub log_stride: bool,
    /// Summarise blocks outside the window by landmark (mean key, mean value).
    pub landmarks: bool,
    /// Layers that keep exact attention.
    pub dense_layers: Vec<usize>,
}

impl Default for LadderSettings {
    fn default() -> Self {
        LadderSettings {
            window: 256,
            sinks: 4,
            block: 16,
            log_stride: true,
            landmarks: true,
            dense_layers: Vec::new(),
        }
    }
}

/// The ladder backend (one per sequence).
pub struct LadderAttention {
    settings: LadderSettings,
}

impl LadderAttention {
    /// A backend for a model of `n_layer` layers.
    pub fn new(settings: LadderSettings, _n_layer: usize) -> Result<Self, String> {
        Ok(LadderAttention { settings })
    }
}

impl AttentionBackend for LadderAttention {
    fn name(&self) -> &str {
        "ladder"
    }

    fn block_size(&self) -> usize {
        self.settings.block
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
