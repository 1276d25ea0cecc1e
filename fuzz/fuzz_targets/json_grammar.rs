//! The JSON constraint fed arbitrary token sequences.
//!
//! The first byte picks the root (any value or an object) and whether to check each step
//! against the allowed-token mask; the rest is little-endian token ids. Every token the
//! mask allows must be accepted (the mask may be stricter: no whitespace after a finished
//! value), and the property that matters: whenever the constraint accepts
//! end-of-generation, the text so far is valid JSON (an object under the object root) by
//! `serde_json`, a parser we did not write.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparrow::grammar::{JsonConstraint, JsonVocab, Root};
use sparrow_fuzz::{tokenizer, words};
use std::sync::{Arc, OnceLock};

fn vocab() -> Arc<JsonVocab> {
    static VOCAB: OnceLock<Arc<JsonVocab>> = OnceLock::new();
    VOCAB
        .get_or_init(|| Arc::new(JsonVocab::new(tokenizer())))
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let tok = tokenizer();
    let root = if mode & 1 == 0 {
        Root::Any
    } else {
        Root::Object
    };
    let check_mask = mode & 2 != 0;
    let n_vocab = tok.vocab_size() as u32;
    let eog: Vec<u32> = tok.eog_ids().to_vec();
    let mut json = JsonConstraint::new(vocab(), root);
    let mut accepted: Vec<u32> = Vec::new();
    for (i, w) in words(rest).enumerate().take(256) {
        // Half the words name an end-of-generation token, so EOS is tried often.
        let id = if w & 0x8000_0000 != 0 && !eog.is_empty() {
            eog[i % eog.len()]
        } else {
            w % n_vocab
        };
        let allowed = check_mask.then(|| json.allowed(None).contains(id));
        let ok = json.accept(id);
        if allowed == Some(true) {
            // The mask may be stricter (no whitespace after a finished value), never looser.
            assert!(ok, "the mask allows token {id} but the grammar refuses it");
        }
        if !ok {
            continue;
        }
        if eog.contains(&id) {
            let text = String::from_utf8(tok.decode_bytes(&accepted))
                .expect("the grammar accepted invalid UTF-8 at EOS");
            // serde_json with its defaults: the grammar bounds nesting and number sizes so
            // that what it accepts parses there (and in any stricter client).
            let v: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("accepted invalid JSON at EOS: {text:?}: {e}"));
            if root == Root::Object {
                assert!(v.is_object(), "not an object: {text:?}");
            }
            return;
        }
        accepted.push(id);
    }
});
