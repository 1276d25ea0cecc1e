//! JSON-Schema-constrained sampling over a byte-level vocabulary plus multi-byte pieces
//! that cross JSON's lexemes (`{"`, `":`, `"},{"`, `true]`, …): a walk that only
//! takes tokens the mask allows (the first byte picks the schema; each following word picks
//! one of the allowed tokens, or end-of-generation when its top bit is set and the mask
//! allows it), then a completion that also follows the mask, preferring tokens that close
//! the value. Every masked token must be accepted and must keep the text a prefix of a
//! valid document: the mask never runs dry before the document is complete, and the
//! completion reaches end-of-generation. Whenever end-of-generation is allowed, the text
//! must parse (`serde_json`) and be valid against the schema by an independent check
//! (`sparrow_fuzz::schema_check`).
//!
//! Not the real 151K vocabulary the `json_grammar` target uses: a schema's masks over it
//! are computed per automaton state, and this target ran at 210 executions a second on it
//! (1M would take 80 minutes); over this vocabulary it runs hundreds of times faster. The
//! real vocabulary under schemas is sampled by `crates/sparrow/tests/json_schema.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparrow::grammar::{JsonConstraint, JsonVocab, Schema, TokenMask};
use sparrow_fuzz::schema_check::{valid, SCHEMAS};
use sparrow::synthetic::byte_tokenizer;
use sparrow::tokenizer::Tokenizer;
use sparrow_fuzz::words;
use std::sync::{Arc, OnceLock};

/// Pieces beyond the 256 bytes: JSON punctuation run together, literals, the schemas'
/// keys and enum values, escapes and number parts, so tokens end inside lexemes.
const PIECES: &[&str] = &[
    "{\"", "\":", "\": ", "\",\"", "\", \"", "\"}", "\"]", "},{", "}]", "]}", "[{", "[[",
    "true", "false", "null", "true]", "null}", "\"name\"", "\"role\":\"", "admin", "guest",
    "\"items\":[", "\"tags\"", "\"id\":", "meta", "\"k\":\"v\"", "\\u00", "\\n",
    "1.5e", "-0.", "12", "e+", "  ", "\n  ",
];

/// The vocabulary under test (built once).
fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| byte_tokenizer(PIECES))
}

/// Tokens of the walk; tokens of the completion before it is called stuck.
const WALK: usize = 32;
const COMPLETE: usize = 128;

struct Setup {
    vocab: Arc<JsonVocab>,
    schemas: Vec<(serde_json::Value, Arc<Schema>)>,
    /// Tokens the completion tries after end-of-generation: `"` first (inside a string
    /// it closes it; `}` there would be text), then `}`, `]`. (Not a digit: digits can
    /// go on for ever; the fallback's byte order reaches `,` `-` `.` before them.)
    closers: Vec<u32>,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let tok = tokenizer();
        let closers = ["\"", "}", "]"]
            .iter()
            .filter_map(|s| match tok.encode(s, false, false).as_slice() {
                [id] => Some(*id),
                _ => None,
            })
            .collect();
        Setup {
            vocab: Arc::new(JsonVocab::new(tok)),
            schemas: SCHEMAS
                .iter()
                .map(|s| {
                    (
                        serde_json::from_str(s).unwrap(),
                        Arc::new(Schema::parse(s).unwrap()),
                    )
                })
                .collect(),
            closers,
        }
    })
}

/// The text so far must be a valid document: end-of-generation was allowed.
fn check_document(accepted: &[u32], schema: &serde_json::Value) {
    let text = String::from_utf8(tokenizer().decode_bytes(accepted))
        .expect("end-of-generation allowed on invalid UTF-8");
    let doc: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("end-of-generation allowed on invalid JSON {text:?}: {e}"));
    assert!(
        valid(schema, &doc),
        "end-of-generation allowed on a document the schema refuses: {text:?} against {schema}"
    );
}

/// One of the `n` tokens of `mask`, chosen by `w`: the first allowed id from `w` on when
/// the mask is dense (inside a string almost every token is), else the `w mod n`-th, so
/// a step costs microseconds either way.
fn pick(mask: &TokenMask, n: usize, w: u32) -> u32 {
    let n_vocab = tokenizer().vocab_size() as u32;
    if n > 4096 {
        let start = w % n_vocab;
        if let Some(id) = (0..4096).map(|i| (start + i) % n_vocab).find(|&t| mask.contains(t)) {
            return id;
        }
    }
    mask.iter().nth(w as usize % n).expect("count")
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let s = setup();
    let tok = tokenizer();
    let eos = tok.eog_ids()[0];
    let (schema_json, schema) = &s.schemas[mode as usize % s.schemas.len()];
    let mut json = JsonConstraint::with_schema(s.vocab.clone(), schema.clone());
    let mut accepted: Vec<u32> = Vec::new();
    let mut steps = words(rest).take(WALK).map(Some).collect::<Vec<_>>();
    steps.extend(std::iter::repeat_n(None, COMPLETE));
    for word in steps {
        let mask = json.allowed(None);
        let n = mask.count();
        if mask.contains(eos) {
            check_document(&accepted, schema_json);
        }
        assert!(n > 0, "no token allowed after {:?}", String::from_utf8_lossy(&tok.decode_bytes(&accepted)));
        let id = match word {
            Some(w) if w & 0x8000_0000 != 0 && mask.contains(eos) => eos,
            Some(w) => pick(&mask, n, w),
            // Completion: end if allowed, else close, else the first allowed token that is
            // not whitespace.
            None => std::iter::once(eos)
                .chain(s.closers.iter().copied())
                .find(|&t| mask.contains(t))
                .or_else(|| {
                    let spaced = |t: u32| tok.piece(t).first().is_some_and(u8::is_ascii_whitespace);
                    mask.iter().find(|&t| !spaced(t))
                })
                .unwrap_or_else(|| mask.iter().next().expect("count")),
        };
        assert!(json.accept(id), "the mask allows token {id} but the grammar refuses it");
        // Every end-of-generation id ends (Qwen has several: <|im_end|>, the FIM markers).
        if tok.is_eog(id) {
            return;
        }
        accepted.push(id);
    }
    panic!(
        "no end of generation after {COMPLETE} completing tokens: {:?}",
        String::from_utf8_lossy(&tok.decode_bytes(&accepted))
    );
});
