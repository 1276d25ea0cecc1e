//! `Engine`: a model together with its tokenizer and chat template, all built from one GGUF
//! file. This is what the CLI and the server hold.

use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
use crate::model::{LoadOptions, Model};
use crate::tokenizer::{Tokenizer, TokenizerSpec};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A loaded model with everything needed to turn text into text.
pub struct Engine {
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<ChatTemplate>,
    /// How long loading took (open, validate, build the tokenizer).
    pub load_time: Duration,
}

impl Engine {
    /// Load model, tokenizer and chat template from `path` (default [`LoadOptions`]).
    pub fn load(path: impl AsRef<Path>) -> Result<Engine> {
        Self::load_with(path, LoadOptions::default())
    }

    /// Load model, tokenizer and chat template from `path`. The vocabulary arrays
    /// (`tokenizer.ggml.tokens`, `merges`, `token_type`, `scores`) are moved out of the
    /// model file's parsed metadata into the tokenizer; open the file again
    /// ([`sparrow_gguf::GgufFile::open`]) to read them as stored.
    pub fn load_with(path: impl AsRef<Path>, options: LoadOptions) -> Result<Engine> {
        let start = Instant::now();
        let mut model = Model::load_with(path, options)?;
        // The vocabulary moves from the file's parsed metadata into the tokenizer rather
        // than being held twice (the model's file is not shared yet).
        let spec = match model.file_mut() {
            Some(file) => TokenizerSpec::take_from_metadata(file.metadata_mut()),
            None => TokenizerSpec::from_gguf(model.file()),
        }
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let tokenizer = Tokenizer::from_spec(spec).map_err(|e| Error::Tokenizer(e.to_string()))?;
        if tokenizer.vocab_size() != model.config.vocab_size {
            return Err(Error::BadHyperParameter(format!(
                "tokenizer has {} tokens but the model's vocabulary is {}",
                tokenizer.vocab_size(),
                model.config.vocab_size
            )));
        }
        let chat_template = ChatTemplate::from_metadata(model.file().metadata(), |id| {
            tokenizer.token_text(id).map(str::to_string)
        })?
        .or_else(|| ChatTemplate::builtin_for(model.config.arch));
        Ok(Engine {
            model: Arc::new(model),
            tokenizer: Arc::new(tokenizer),
            chat_template,
            load_time: start.elapsed(),
        })
    }
}
