//! The tokenizer against llama.cpp's output on the real Qwen2.5 vocabulary.
//!
//! Needs `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` in `$SPARROW_MODELS` or
//! `~/.cache/sparrow/models` (`python3 scripts/fetch_models.py qwen`); a missing
//! model fails the tests.
//!
//! Oracles: `tests/fixtures/qwen_tokens.json` (llama-tokenize ids) and
//! `tests/fixtures/qwen_greedy.json` (llama.cpp prompt ids and token texts).

use proptest::prelude::*;
use serde_json::Value;
use sparrow::tokenizer::{PreTokenizer, StreamDecoder, TokenType, Tokenizer, TokenizerSpec};
use std::path::PathBuf;
use std::sync::OnceLock;

const MODEL_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

fn model_path() -> PathBuf {
    let dir = std::env::var_os("SPARROW_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/sparrow/models")
        });
    dir.join(MODEL_FILE)
}

/// Reads the tokenizer spec of the Qwen GGUF through `sparrow_gguf`.
fn load_spec() -> TokenizerSpec {
    let path = model_path();
    assert!(
        path.exists(),
        "{} not found; run `python3 scripts/fetch_models.py qwen`",
        path.display()
    );
    let file = sparrow_gguf::GgufFile::open(&path).expect("open GGUF");
    TokenizerSpec::from_gguf(&file).expect("tokenizer metadata")
}

fn qwen() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_spec(load_spec()).expect("build tokenizer"))
}

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture JSON")
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn metadata_is_read() {
    let t = qwen();
    assert_eq!(t.vocab_size(), 151_936);
    assert_eq!(t.pre_tokenizer(), PreTokenizer::Qwen2);
    assert_eq!(t.bos(), Some(151_643));
    assert_eq!(t.eos(), Some(151_645));
    assert!(!t.adds_bos());
    assert!(!t.adds_eos());
    assert_eq!(t.token_id("<|im_start|>"), Some(151_644));
    assert_eq!(t.token_type(151_657), Some(TokenType::UserDefined)); // <tool_call>
                                                                     // llama.cpp retypes the normal token `</s>` (128247) as control because
                                                                     // of its spelling; that is the only fix-up this vocabulary needs.
    assert_eq!(t.warnings().len(), 1, "{:?}", t.warnings());
    assert_eq!(t.token_type(128_247), Some(TokenType::Control));
}

#[test]
fn ids_match_llama_cpp() {
    let t = qwen();
    let fx = fixture("qwen_tokens.json");
    let cases = fx["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let parse_special = case["parse_special"].as_bool().unwrap();
        let want = ids_of(&case["ids"]);
        let got = t.encode(text, true, parse_special);
        assert_eq!(got, want, "text {text:?} parse_special {parse_special}");
        assert_eq!(t.decode(&got), text);
    }
}

#[test]
fn greedy_fixture_prompts_and_texts_match_llama_cpp() {
    let t = qwen();
    let fx = fixture("qwen_greedy.json");
    for p in fx["prompts"].as_array().expect("prompts") {
        let prompt = p["prompt"].as_str().unwrap();
        assert_eq!(
            t.encode(prompt, true, true),
            ids_of(&p["prompt_ids"]),
            "{prompt:?}"
        );
        let ids = ids_of(&p["ids"]);
        assert_eq!(t.decode(&ids), p["text"].as_str().unwrap());
        if let Some(i) = p["first_eog_index"].as_u64() {
            assert!(t.is_eog(ids[i as usize]));
            assert!(ids[..i as usize].iter().all(|&id| !t.is_eog(id)));
        } else {
            assert!(ids.iter().all(|&id| !t.is_eog(id)));
        }
    }
}

#[test]
fn end_of_generation_tokens() {
    let t = qwen();
    let id = |s: &str| t.token_id(s).unwrap();
    for eog in [
        "<|im_end|>",
        "<|endoftext|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ] {
        assert!(t.is_eog(id(eog)), "{eog}");
    }
    for not in ["<|im_start|>", "<tool_call>", "<|fim_prefix|>", "Hello"] {
        assert!(!t.is_eog(id(not)), "{not}");
    }
    // The same set llama.cpp reports: EOS/EOT, the FIM stop tokens and `</s>`.
    assert_eq!(
        t.eog_ids(),
        &[128_247, 151_643, 151_645, 151_662, 151_663, 151_664]
    );
}

/// Encoding `text` must equal encoding each expected pre-token separately.
fn assert_split(t: &Tokenizer, text: &str, words: &[&str]) {
    assert_eq!(words.concat(), text);
    let joined: Vec<u32> = words
        .iter()
        .flat_map(|w| t.encode(w, false, false))
        .collect();
    assert_eq!(t.encode(text, false, false), joined, "{text:?}");
    assert_eq!(t.decode(&joined), text);
}

#[test]
fn tricky_splits() {
    let t = qwen();
    assert_split(
        t,
        "I'M HERE, YOU'RE",
        &["I", "'M", " HERE", ",", " YOU", "'RE"],
    );
    assert_split(t, "don't DON'T", &["don", "'t", " DON", "'T"]);
    assert_split(t, "year 2024!", &["year", " ", "2", "0", "2", "4", "!"]);
    assert_split(t, "a\n\n\nb", &["a", "\n\n\n", "b"]);
    assert_split(t, "x  \n  y", &["x", "  \n", " ", " y"]);
    assert_split(t, "end   ", &["end", "   "]);
    assert_split(t, "f(x)\n\n", &["f", "(x", ")\n\n"]);
    assert_split(t, "你好，世界", &["你好", "，", "世界"]);
    // Every digit is its own token.
    let ids = t.encode("9876543210", false, false);
    assert_eq!(ids.len(), 10);
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(t.token_to_piece(id), &b"9876543210"[i..i + 1]);
    }
    // Known single tokens from the vocabulary.
    assert_eq!(
        t.encode("'M", false, false),
        vec![t.token_id("'M").unwrap()]
    );
    assert_eq!(
        t.encode(" DON", false, false),
        vec![t.token_id("ĠDON").unwrap()]
    );
    assert_eq!(
        t.encode("你好", false, false),
        vec![t.token_id("ä½łå¥½").unwrap()]
    );
    assert_eq!(
        t.encode("😀", false, false),
        vec![t.token_id("ðŁĺĢ").unwrap()]
    );
}

#[test]
fn special_token_text_handling() {
    let t = qwen();
    let start = t.token_id("<|im_start|>").unwrap();
    let end = t.token_id("<|im_end|>").unwrap();
    let tool = t.token_id("<tool_call>").unwrap();
    assert_eq!(
        t.encode("<|im_start|><|im_end|>", false, true),
        vec![start, end]
    );
    // Inside words, without surrounding spaces.
    let ids = t.encode("abc<|im_end|>def", false, true);
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 1);
    assert_eq!(t.decode(&ids), "abc<|im_end|>def");
    // Unterminated or broken special text stays plain text.
    for s in [
        "<|im_start",
        "<|im_start|",
        "im_start|>",
        "<| im_start|>",
        "<|IM_START|>",
    ] {
        let ids = t.encode(s, false, true);
        assert!(
            ids.iter()
                .all(|&i| t.token_type(i) == Some(TokenType::Normal)),
            "{s}"
        );
        assert_eq!(t.decode(&ids), s);
    }
    // Without parse_special, control text is plain; user-defined still matches.
    let ids = t.encode("<|im_start|><tool_call>", false, false);
    assert!(!ids.contains(&start));
    assert_eq!(ids.last(), Some(&tool));
    // Unused placeholders are never matched.
    let ids = t.encode("[PAD151700]", false, true);
    assert!(ids.len() > 1);
    // add_special adds nothing for Qwen (add_bos = false in the metadata).
    assert_eq!(t.encode("hi", true, true), t.encode("hi", false, true));
}

#[test]
fn pieces_render_special_tokens_as_text() {
    let t = qwen();
    assert_eq!(t.token_to_piece(151_645), b"<|im_end|>");
    assert_eq!(t.token_to_piece(t.token_id("Ġworld").unwrap()), b" world");
    assert_eq!(t.token_to_piece(t.token_id("Ċ").unwrap()), b"\n");
    assert_eq!(t.token_to_piece(151_700), b""); // unused
    assert_eq!(t.token_to_piece(999_999), b"");
}

#[test]
fn stream_decoder_on_real_tokens() {
    let t = qwen();
    // Rare CJK characters and emoji are split into byte-level tokens that are
    // not valid UTF-8 on their own.
    let text = "龘靐齉 🦀🫠🧬 ok 你好";
    let ids = t.encode(text, false, false);
    let mut d = StreamDecoder::new();
    let mut held_back = 0;
    let mut out = String::new();
    for &id in &ids {
        let piece = t.token_to_piece(id);
        let s = d.push(t, id);
        if std::str::from_utf8(&piece).is_err() {
            held_back += 1;
        }
        out.push_str(&s);
    }
    assert!(
        held_back > 0,
        "test text should contain partial-character tokens"
    );
    assert!(!d.has_pending());
    assert_eq!(d.flush(), "");
    assert_eq!(out, text);

    // A stream cut in the middle of a character flushes a replacement char.
    let glyph = t.encode("𓀀", false, false);
    assert!(glyph.len() > 1, "{glyph:?}");
    let mut d = StreamDecoder::new();
    assert_eq!(d.push(t, glyph[0]), "");
    assert!(d.has_pending());
    assert_eq!(d.flush(), "\u{FFFD}");
}

fn english_text(target_len: usize) -> String {
    // Deterministic pseudo-random prose with punctuation, numbers and code.
    let words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "model",
        "tokenizer",
        "is",
        "that",
        "for",
        "with",
        "inference",
        "engine",
        "quantized",
        "weights",
        "attention",
        "layer",
        "it's",
        "we'll",
        "performance",
        "memory",
        "bandwidth",
        "CPU",
        "cache",
        "matrix",
        "vector",
        "Rust",
        "language",
        "compiler",
        "benchmark",
        "throughput",
        "latency",
        "however",
        "therefore",
        "approximately",
        "implementation",
        "byte-level",
        "encoding",
        "merges",
        "vocabulary",
        "Transformer",
        "sequence",
        "context",
        "window",
        "prompt",
        "generation",
        "sampling",
    ];
    let mut s = String::with_capacity(target_len + 64);
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut sentence_start = true;
    while s.len() < target_len {
        let r = next();
        let w = words[(r % words.len() as u64) as usize];
        if sentence_start {
            let mut c = w.chars();
            if let Some(f) = c.next() {
                s.extend(f.to_uppercase());
                s.push_str(c.as_str());
            }
            sentence_start = false;
        } else {
            s.push_str(w);
        }
        match (r >> 32) % 23 {
            0 => {
                s.push_str(". ");
                sentence_start = true;
            }
            1 => s.push_str(", "),
            2 => s.push_str(&format!(" {} ", (r >> 40) % 100_000)),
            3 => {
                s.push_str(".\n\n");
                sentence_start = true;
            }
            4 => s.push_str(" (see section 3.2) "),
            _ => s.push(' '),
        }
    }
    s
}

#[test]
fn encodes_130k_of_english_losslessly() {
    let t = qwen();
    let text = english_text(130_000);
    let ids = t.encode(&text, false, true);
    assert!(ids.len() > 10_000 && ids.len() < 130_000);
    assert_eq!(t.decode(&ids), text);
}

#[test]
fn very_long_words_round_trip() {
    let t = qwen();
    for text in [
        "a".repeat(200_000),
        " ".repeat(200_000),
        "é😀".repeat(30_000),
    ] {
        let ids = t.encode(&text, false, false);
        assert_eq!(t.decode(&ids), text);
    }
}

fn arb_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        any::<char>().prop_map(|c| c.to_string()),
        "[a-zA-Z' ]{1,8}",
        "[0-9 .,]{1,6}",
        "[\n\r\t ]{1,4}",
        "\\PC{1,4}",
        prop::sample::select(vec![
            "<|im_start|>",
            "<|im_end|>",
            "<tool_call>",
            "<|im_start",
            "'S",
            "你好",
            "😀",
            "🦀",
        ])
        .prop_map(str::to_string),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn round_trip_random_text(text in arb_text()) {
        let t = qwen();
        for parse_special in [false, true] {
            let ids = t.encode(&text, true, parse_special);
            prop_assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size()));
            prop_assert_eq!(t.decode(&ids), text.clone());
            let mut d = StreamDecoder::new();
            let streamed: String = ids.iter().map(|&i| d.push(t, i)).collect::<String>() + &d.flush();
            prop_assert_eq!(streamed, text.clone());
        }
    }
}
