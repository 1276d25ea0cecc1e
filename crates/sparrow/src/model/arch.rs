//! The decoder architectures sparrow runs, and the one property that is theirs rather than a
//! layer's: how RoPE pairs dimensions.

use crate::error::{Error, Result};

/// The decoder architectures sparrow runs. They share one forward pass, composed per layer
/// from a [`LayerSpec`] the family derives from the metadata ([`crate::model::spec`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Mistral,
    Gemma3,
}

impl Architecture {
    /// The architecture named by `general.architecture`, or an error naming an unknown one.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Architecture::Llama),
            "qwen2" => Ok(Architecture::Qwen2),
            "mistral" => Ok(Architecture::Mistral),
            "gemma3" => Ok(Architecture::Gemma3),
            other => Err(Error::UnknownArchitecture(other.to_string())),
        }
    }

    /// The name used as metadata key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Mistral => "mistral",
            Architecture::Gemma3 => "gemma3",
        }
    }

    /// How RoPE pairs dimensions: llama-style GGUFs have their q/k rows permuted by the
    /// converter so that adjacent pairs rotate; Qwen2 keeps the original halves (NeoX).
    pub fn rope_layout(self) -> RopeLayout {
        match self {
            Architecture::Llama | Architecture::Mistral => RopeLayout::Normal,
            Architecture::Qwen2 | Architecture::Gemma3 => RopeLayout::Neox,
        }
    }
}

/// Which dimensions RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs (2i, 2i+1).
    Normal,
    /// Pairs (i, i + n_rot/2).
    Neox,
}
