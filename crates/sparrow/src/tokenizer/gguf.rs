//! Reading a [`TokenizerSpec`] from GGUF metadata.

use super::{TokenizerError, TokenizerSpec};
use sparrow_gguf::{GgufFile, Metadata};

impl TokenizerSpec {
    /// Reads the `tokenizer.ggml.*` keys of an open GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<TokenizerSpec, TokenizerError> {
        Self::from_metadata(file.metadata())
    }

    /// Reads the `tokenizer.ggml.*` keys from GGUF metadata. `tokens` and `model` are
    /// required, and `merges` (`gpt2`) or `scores` (`llama`); a missing `token_type` means all
    /// tokens are normal; the special ids and flags are optional.
    pub fn from_metadata(md: &Metadata) -> Result<TokenizerSpec, TokenizerError> {
        Self::read(md, true)
    }

    /// As [`TokenizerSpec::from_metadata`], but moves the vocabulary (`tokens`, `merges`)
    /// out of `md` rather than copying it, and removes `token_type` and `scores` once read:
    /// what the engine does, so the vocabulary is not held twice (Qwen2.5's 151,936 tokens
    /// and 151,387 merges: ~20 MiB). On an error, `md` may have lost those keys.
    pub fn take_from_metadata(md: &mut Metadata) -> Result<TokenizerSpec, TokenizerError> {
        let mut spec = Self::read(md, false)?;
        spec.tokens = md.take_str_array("tokenizer.ggml.tokens")?;
        if spec.model != "llama" {
            spec.merges = md.take_str_array("tokenizer.ggml.merges")?;
        }
        md.take("tokenizer.ggml.token_type");
        md.take("tokenizer.ggml.scores");
        Ok(spec)
    }

    /// The spec; the vocabulary strings (`tokens`, `merges`) copied if `vocab`, else left
    /// empty for the caller to move in.
    fn read(md: &Metadata, vocab: bool) -> Result<TokenizerSpec, TokenizerError> {
        let owned = |v: Vec<&str>| v.into_iter().map(str::to_owned).collect::<Vec<_>>();
        let token_types = if md.contains("tokenizer.ggml.token_type") {
            md.get_i32_array("tokenizer.ggml.token_type")?
        } else {
            Vec::new()
        };
        let model = md.get_str("tokenizer.ggml.model")?.to_owned();
        // A SentencePiece vocabulary has scores instead of merges.
        let spm = model == "llama";
        Ok(TokenizerSpec {
            merges: if spm || !vocab {
                Vec::new()
            } else {
                owned(md.get_str_array("tokenizer.ggml.merges")?)
            },
            scores: if spm {
                md.get_f32_array("tokenizer.ggml.scores")?
            } else {
                Vec::new()
            },
            model,
            pre: md.opt_str("tokenizer.ggml.pre")?.map(str::to_owned),
            tokens: if vocab {
                owned(md.get_str_array("tokenizer.ggml.tokens")?)
            } else {
                Vec::new()
            },
            token_types,
            bos: md.opt_u32("tokenizer.ggml.bos_token_id")?,
            eos: md.opt_u32("tokenizer.ggml.eos_token_id")?,
            eot: md.opt_u32("tokenizer.ggml.eot_token_id")?,
            eom: md.opt_u32("tokenizer.ggml.eom_token_id")?,
            pad: md.opt_u32("tokenizer.ggml.padding_token_id")?,
            add_bos: md.opt_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: md.opt_bool("tokenizer.ggml.add_eos_token")?,
        })
    }
}
