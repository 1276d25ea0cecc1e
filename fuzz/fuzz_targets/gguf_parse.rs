//! GGUF bytes → header, metadata and tensor table (validated), then everything the engine
//! builds from them: model config and weights, tokenizer, chat template, and one forward
//! step of whatever loads. Errors are fine; a panic, an out-of-bounds read or an
//! allocation the file's size cannot justify is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparrow::tokenizer::{Tokenizer, TokenizerSpec};
use sparrow::{ChatMessage, ChatTemplate, KvType, Logits, Model};
use sparrow_gguf::GgufFile;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (key, value) in file.metadata().iter() {
        let _ = (
            key.len(),
            value.type_name(),
            value.as_integer(),
            value.as_float(),
        );
    }
    for t in file.tensors() {
        // The table promised every tensor lies inside the file.
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.size, "{}", t.name);
        assert!(t.offset + t.size <= file.file_len(), "{}", t.name);
    }
    let file = Arc::new(file);
    let tokenizer = TokenizerSpec::from_gguf(&file)
        .ok()
        .and_then(|s| Tokenizer::from_spec(s).ok());
    if let Some(tok) = &tokenizer {
        let ids = tok.encode("Hello, world! 123", true, true);
        let _ = tok.decode(&ids);
        let text = |id: u32| tok.token_text(id).map(str::to_owned);
        if let Ok(Some(t)) = ChatTemplate::from_metadata(file.metadata(), text) {
            let _ = t.render(&[ChatMessage::new("user", "hi")], true);
        }
    }
    let Ok(model) = Model::from_gguf(file) else {
        return;
    };
    let Ok(mut state) = model.new_state(8, KvType::F32) else {
        return;
    };
    let n_vocab = model.config.vocab_size as u32;
    if n_vocab > 0 {
        let _ = model.forward(&mut state, &[0, n_vocab - 1], Logits::Last);
    }
});
