//! Unit tests on small synthetic vocabularies (the real-vocabulary tests are in
//! `crates/sparrow/tests/tokenizer_reference.rs`).

use super::*;

/// A byte-level vocabulary: the 256 byte characters, a few merges, and some
/// special tokens.
fn toy_spec() -> TokenizerSpec {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| bytes::byte_to_char(b).to_string())
        .collect();
    let mut types = vec![1; 256];
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    for (t, ty) in [
        ("<|im_start|>", 3),
        ("<|im_end|>", 3),
        ("<|endoftext|>", 3),
        ("<tool>", 4),
        ("<|im", 3),
        ("[PAD1]", 5),
    ] {
        tokens.push(t.to_string());
        types.push(ty);
    }
    TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("qwen2".into()),
        tokens,
        token_types: types,
        merges: merges.iter().map(|s| s.to_string()).collect(),
        bos: Some(264),
        eos: Some(263),
        ..Default::default()
    }
}

fn toy() -> Tokenizer {
    Tokenizer::from_spec(toy_spec()).unwrap()
}

#[test]
fn merges_apply() {
    let t = toy();
    let hello = t.token_id("hello").unwrap();
    let wo = t.token_id("Ġwo").unwrap();
    assert_eq!(t.encode("hello", false, false), vec![hello]);
    let ids = t.encode("hello world", false, false);
    assert_eq!(ids[..2], [hello, wo]);
    assert_eq!(t.decode(&ids), "hello world");
}

#[test]
fn special_parsing() {
    let t = toy();
    let start = t.token_id("<|im_start|>").unwrap();
    let im = t.token_id("<|im").unwrap();
    let tool = t.token_id("<tool>").unwrap();
    let ids = t.encode("<|im_start|>hello<tool><|im", false, true);
    assert_eq!(ids[0], start);
    assert_eq!(ids[2], tool);
    assert_eq!(ids[3], im);
    // Without parse_special control tokens are plain text but user-defined
    // tokens still match.
    let ids = t.encode("<|im_start|>hello<tool>", false, false);
    assert!(!ids.contains(&start));
    assert!(ids.contains(&tool));
    assert_eq!(t.decode(&ids), "<|im_start|>hello<tool>");
    // Unused tokens are never matched.
    let ids = t.encode("[PAD1]", false, true);
    assert_eq!(ids.len(), 6);
}

#[test]
fn add_special_follows_flags() {
    let t = toy();
    assert!(!t.adds_bos() && !t.adds_eos());
    assert_eq!(t.encode("a", true, false), t.encode("a", false, false));
    let mut spec = toy_spec();
    spec.add_bos = Some(true);
    spec.add_eos = Some(true);
    let t = Tokenizer::from_spec(spec).unwrap();
    let ids = t.encode("a", true, false);
    assert_eq!(ids, vec![264, t.token_id("a").unwrap(), 263]);
    // Llama 3 family defaults to adding BOS.
    let mut spec = toy_spec();
    spec.pre = Some("llama-bpe".into());
    assert!(Tokenizer::from_spec(spec).unwrap().adds_bos());
}

#[test]
fn eog_detection() {
    let t = toy();
    let end = t.token_id("<|im_end|>").unwrap();
    let eot = t.token_id("<|endoftext|>").unwrap();
    assert!(t.is_eog(end));
    assert!(t.is_eog(eot));
    assert!(!t.is_eog(t.token_id("<|im_start|>").unwrap()));
    assert_eq!(t.eot(), Some(end));
}

#[test]
fn pieces() {
    let t = toy();
    assert_eq!(t.token_to_piece(t.token_id("Ġwo").unwrap()), b" wo");
    assert_eq!(
        t.token_to_piece(t.token_id("<|im_end|>").unwrap()),
        b"<|im_end|>"
    );
    assert_eq!(t.token_to_piece(t.token_id("[PAD1]").unwrap()), b"");
    assert_eq!(t.token_to_piece(u32::MAX), b"");
    assert_eq!(t.vocab_size(), 268);
}

#[test]
fn errors_on_bad_data() {
    let mut s = toy_spec();
    s.model = "bert".into();
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::UnsupportedModel(_))
    ));
    // A SentencePiece vocabulary without one score per token.
    let mut s = toy_spec();
    s.model = "llama".into();
    s.scores = vec![0.0; 3];
    let e = Tokenizer::from_spec(s).err().unwrap().to_string();
    assert!(e.contains("3 scores for 268 tokens"), "{e}");

    let mut s = toy_spec();
    s.token_types.pop();
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::TypeCountMismatch { .. })
    ));

    let mut s = toy_spec();
    s.token_types[3] = 42;
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::InvalidTokenType { id: 3, ty: 42 })
    ));

    let mut s = toy_spec();
    s.merges.push("x q".into()); // "xq" is not a token
    let e = Tokenizer::from_spec(s).unwrap_err();
    assert!(
        matches!(&e, TokenizerError::MergeUnknownToken { token, .. } if token == "xq"),
        "{e}"
    );

    let mut s = toy_spec();
    s.merges.push("nospace".into());
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::MalformedMerge { .. })
    ));

    let mut s = toy_spec();
    s.merges.push(" ".into());
    assert!(Tokenizer::from_spec(s).is_err());

    let mut s = toy_spec();
    s.tokens.clear();
    s.token_types.clear();
    assert!(matches!(
        Tokenizer::from_spec(s),
        Err(TokenizerError::EmptyVocab)
    ));
}

#[test]
fn warnings_for_unknown_pre_and_bad_ids() {
    let mut s = toy_spec();
    s.pre = Some("something-new".into());
    s.bos = Some(10_000);
    let t = Tokenizer::from_spec(s).unwrap();
    assert_eq!(t.pre_tokenizer(), PreTokenizer::Gpt2);
    assert_eq!(t.bos(), None);
    assert_eq!(t.warnings().len(), 2, "{:?}", t.warnings());
}

#[test]
fn vocab_without_byte_tokens_does_not_panic() {
    let spec = TokenizerSpec {
        model: "gpt2".into(),
        tokens: vec!["a".into(), "b".into(), "ab".into()],
        merges: vec!["a b".into()],
        ..Default::default()
    };
    let t = Tokenizer::from_spec(spec).unwrap();
    assert_eq!(t.encode("abc ab", true, true), vec![2, 2]);
}
