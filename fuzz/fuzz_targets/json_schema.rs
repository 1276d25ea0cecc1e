//! JSON-Schema-constrained sampling over the real Qwen2.5 vocabulary: a walk that only
//! takes tokens the mask allows (the first byte picks the schema; each following word picks
//! one of the allowed tokens, or end-of-generation when its top bit is set and the mask
//! allows it), then a completion that also follows the mask, preferring tokens that close
//! the value. Every masked token must be accepted and must keep the text a prefix of a
//! valid document: the mask never runs dry before the document is complete, and the
//! completion reaches end-of-generation. Whenever end-of-generation is allowed, the text
//! must parse (`serde_json`) and be valid against the schema by an independent check
//! (`sparrow_fuzz::schema_check`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparrow::grammar::{JsonConstraint, JsonVocab, Schema};
use sparrow_fuzz::schema_check::{valid, SCHEMAS};
use sparrow_fuzz::{tokenizer, words};
use std::sync::{Arc, OnceLock};

/// Tokens of the walk; tokens of the completion before it is called stuck.
const WALK: usize = 48;
const COMPLETE: usize = 64;

struct Setup {
    vocab: Arc<JsonVocab>,
    schemas: Vec<(serde_json::Value, Arc<Schema>)>,
    /// Tokens the completion tries first, closing ones first: `}`, `]`, `"`, `0`.
    closers: Vec<u32>,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let tok = tokenizer();
        let closers = ["}", "]", "\"", "0"]
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
            Some(w) => mask.iter().nth(w as usize % n).expect("count"),
            // Completion: end if allowed, else close, else the first allowed token.
            None => std::iter::once(eos)
                .chain(s.closers.iter().copied())
                .find(|&t| mask.contains(t))
                .unwrap_or_else(|| mask.iter().next().expect("count")),
        };
        assert!(json.accept(id), "the mask allows token {id} but the grammar refuses it");
        if id == eos {
            return;
        }
        accepted.push(id);
    }
    panic!(
        "no end of generation after {COMPLETE} completing tokens: {:?}",
        String::from_utf8_lossy(&tok.decode_bytes(&accepted))
    );
});
