//! Tokenizer encode of arbitrary bytes and decode of arbitrary ids.
//!
//! The first byte picks the flags; the rest is text (lossily UTF-8) for encode and
//! little-endian ids (any `u32`, in range or not) for decode. Besides never panicking:
//! every id encode returns is in the vocabulary, and without special-token parsing the
//! byte-level tokenizer gives back exactly the text it was given.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparrow::tokenizer::StreamDecoder;
use sparrow_fuzz::{tokenizer, words};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let tok = tokenizer();
    let text = String::from_utf8_lossy(rest);
    let (add_special, parse_special) = (flags & 1 != 0, flags & 2 != 0);
    let ids = tok.encode(&text, add_special, parse_special);
    let n_vocab = tok.vocab_size() as u32;
    assert!(
        ids.iter().all(|&id| id < n_vocab),
        "an id out of the vocabulary"
    );
    if !add_special && !parse_special {
        assert_eq!(
            tok.decode_bytes(&ids),
            text.as_bytes(),
            "round trip of {text:?}"
        );
    }
    // Arbitrary ids: decode (whole and streamed) never panics, out-of-range ones included.
    let ids: Vec<u32> = words(rest)
        .map(|w| {
            if flags & 4 != 0 {
                w % n_vocab.max(1)
            } else {
                w
            }
        })
        .collect();
    let _ = tok.decode(&ids);
    let mut stream = StreamDecoder::new();
    for &id in &ids {
        let _ = stream.push(tok, id);
    }
});
