//! Schema-constrained generation checked by a validator we did not write: Python's
//! `jsonschema` package (installed with pip when missing) judges every document the
//! automaton produces — random byte walks, random-logit sampling over a byte vocabulary and
//! over the real Qwen2.5 vocabulary, and the real model itself — and a table of hand
//! documents, valid and invalid, on which the automaton and the validator must agree.

mod common;

use sparrow::grammar::{Grammar, JsonConstraint, JsonVocab, OrderedValue, Schema, SchemaState};
use sparrow::synthetic::byte_tokenizer;
use sparrow::tokenizer::Tokenizer;
use sparrow::{collect_text, Engine, Generation, KvType, Sampler, SamplerConfig, Session};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, LazyLock, Once};

/// The shared schemas (`tests/fixtures/json_schemas.txt`, also the fuzz target's).
static SCHEMAS: LazyLock<Vec<String>> = LazyLock::new(sparrow::fixtures::json_schemas);

fn pip_jsonschema() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let have = Command::new("python3")
            .args(["-c", "import jsonschema"])
            .status()
            .is_ok_and(|s| s.success());
        if !have {
            let ok = Command::new("python3")
                .args(["-m", "pip", "install", "--quiet", "jsonschema"])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "python3 -m pip install --quiet jsonschema failed");
        }
    });
}

/// Python's verdict on each (schema, document): None when valid, else the reason.
fn python_verdicts(cases: &[(&str, String)]) -> Vec<Option<String>> {
    pip_jsonschema();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/validate_json_schema.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut input = String::new();
    for (schema, doc) in cases {
        let schema: serde_json::Value = serde_json::from_str(schema).unwrap();
        input.push_str(&serde_json::json!({"schema": schema, "doc": doc}).to_string());
        input.push('\n');
    }
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "the validator failed");
    let lines: Vec<Option<String>> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| (l != "valid").then(|| l.to_string()))
        .collect();
    assert_eq!(lines.len(), cases.len());
    lines
}

fn assert_all_valid(cases: &[(&str, String)]) {
    for ((schema, doc), verdict) in cases.iter().zip(python_verdicts(cases)) {
        assert!(verdict.is_none(), "{verdict:?}\nschema {schema}\ndoc {doc}");
    }
}

fn lcg(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 33
}

/// A document chosen byte by byte among the allowed bytes, freely for `free` bytes and then
/// only among bytes that bring the end closer.
fn random_walk(g: &Schema, rng: &mut u64, free: usize) -> String {
    let mut s = SchemaState::new();
    let mut out = Vec::new();
    loop {
        let closing = out.len() >= free;
        if g.is_done(&s) || g.is_complete(&s) && (closing || lcg(rng).is_multiple_of(8)) {
            break;
        }
        let d = g.distance(&s);
        let allowed: Vec<u8> = (0..=255u8)
            .filter(|&b| {
                let mut t = s;
                g.step(&mut t, b) && (!closing || g.distance(&t) < d)
            })
            .collect();
        assert!(
            !allowed.is_empty(),
            "stuck after {:?}",
            String::from_utf8_lossy(&out)
        );
        let b = allowed[lcg(rng) as usize % allowed.len()];
        assert!(g.step(&mut s, b));
        out.push(b);
    }
    String::from_utf8(out).expect("the automaton only takes UTF-8")
}

#[test]
fn random_byte_walks_validate() {
    let mut cases = Vec::new();
    let mut rng = 7u64;
    for text in SCHEMAS.iter() {
        let g = Schema::parse(text).unwrap();
        for i in 0..60 {
            let doc = random_walk(&g, &mut rng, i * 3);
            serde_json::from_str::<serde_json::Value>(&doc)
                .unwrap_or_else(|e| panic!("{e}: {doc}"));
            cases.push((text.as_str(), doc));
        }
    }
    assert_all_valid(&cases);
}

/// Sample with random logits under the schema and a budget of `budget` tokens.
fn random_logit_doc(
    tok: &Tokenizer,
    vocab: &Arc<JsonVocab>,
    schema: &Arc<Schema>,
    seed: u64,
    budget: usize,
) -> String {
    let mut c = JsonConstraint::with_schema(vocab.clone(), schema.clone());
    let mut s = Sampler::new(SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..Default::default()
    });
    let mut rng = seed.wrapping_add(99);
    let mut out = Vec::new();
    for n in 0..budget {
        let mut logits: Vec<f32> = (0..tok.vocab_size())
            .map(|_| (lcg(&mut rng) % 1000) as f32 / 250.0)
            .collect();
        let id = c.sample(&mut s, &mut logits, Some(budget - n));
        if tok.is_eog(id) {
            break;
        }
        out.extend_from_slice(tok.piece(id));
    }
    assert!(
        c.is_complete(),
        "budget {budget}: {}",
        String::from_utf8_lossy(&out)
    );
    String::from_utf8(out).unwrap()
}

#[test]
fn random_logits_within_budget_validate() {
    let tok = byte_tokenizer(&[
        "{\"", "\":", "\"}", "\",\"", "true", "null", "[[", "]]", "\\uD83D", "  ", "\n", "\"name",
        "admin\"", "id\":", "12", "-0.", "e+",
    ]);
    let vocab = Arc::new(JsonVocab::new(&tok));
    let mut cases = Vec::new();
    for (i, text) in SCHEMAS.iter().enumerate() {
        let schema = Arc::new(Schema::parse(text).unwrap());
        for seed in 0..40u64 {
            // Budgets from just enough to plenty: short ones must close early.
            let budget = schema.min_len() + 4 + (seed as usize * 7) % 80;
            let doc = random_logit_doc(&tok, &vocab, &schema, seed * 31 + i as u64, budget);
            cases.push((text.as_str(), doc));
        }
    }
    assert_all_valid(&cases);
}

#[test]
fn automaton_agrees_with_the_validator_on_hand_documents() {
    // (schema index, document): valid and invalid ones, spelled as the automaton spells
    // (declared order, compact enum values), so the two must agree exactly.
    let docs: &[(usize, &str)] = &[
        (0, r#"{"name":"a","role":"user"}"#),
        (
            0,
            r#"{"name":"a","age":3,"score":-1.5e3,"email":null,"role":"guest","active":true}"#,
        ),
        (0, r#"{"name":"a"}"#),
        (0, r#"{"name":"a","role":"root"}"#),
        (0, r#"{"name":"a","age":"3","role":"user"}"#),
        (0, r#"{"name":"a","age":3.5,"role":"user"}"#),
        (0, r#"{"name":"a","role":"user","extra":1}"#),
        (0, r#"{"name":null,"role":"user"}"#),
        (0, r#"["name"]"#),
        (1, r#"{"items":[{"id":1,"tags":[]}]}"#),
        (
            1,
            r#"{"items":[{"id":1,"tags":["a","b"],"meta":{"k":"v"}}],"total":1}"#,
        ),
        (1, r#"{"items":[]}"#),
        (
            1,
            r#"{"items":[{"id":1,"tags":[]},{"id":2,"tags":[]},{"id":3,"tags":[]},{"id":4,"tags":[]}]}"#,
        ),
        (1, r#"{"items":[{"id":1,"tags":["a","b","c"]}]}"#),
        (1, r#"{"items":[{"id":1,"tags":[],"meta":{"k":"w"}}]}"#),
        (1, r#"{"items":[{"id":1,"tags":[],"meta":{}}]}"#),
        (1, r#"{"items":[{"tags":[]}]}"#),
        (2, r#"[null,3]"#),
        (2, r#"[{"a":true},["x","y"]]"#),
        (2, r#"[null]"#),
        (2, r#"[{},null]"#),
        (2, r#"[["x","y","z"],null]"#),
        (2, r#"[true,null]"#),
        (3, r#"12"#),
        (3, r#"[1,"two"]"#),
        (3, r#"{"k":{"n":[]}}"#),
        (3, r#"13"#),
        (3, r#"[1,"three"]"#),
        (3, r#"false"#),
        (4, r#"{}"#),
        (4, r#"{"a":"x","c":[1,-2]}"#),
        (4, r#"{"c":[1.5]}"#),
        (4, r#"{"d":1}"#),
    ];
    let cases: Vec<(&str, String)> = docs
        .iter()
        .map(|&(i, d)| (SCHEMAS[i].as_str(), d.to_string()))
        .collect();
    let verdicts = python_verdicts(&cases);
    let mut invalid = 0;
    let mut fixed = Vec::new();
    for ((schema, doc), verdict) in cases.iter().zip(verdicts) {
        let g = Schema::parse(schema).unwrap();
        let mut s = SchemaState::new();
        let refused_at = doc.bytes().position(|b| !g.step(&mut s, b));
        let accepted = refused_at.is_none() && g.is_complete(&s);
        assert_eq!(
            accepted,
            verdict.is_none(),
            "{doc}: validator says {verdict:?}"
        );
        if verdict.is_some() {
            invalid += 1;
            // Refused as soon as the document can no longer be valid: no byte before the
            // refused one already made every continuation invalid.
            let at = refused_at.unwrap_or(doc.len());
            let mut s = SchemaState::new();
            assert!(g.feed(&mut s, &doc.as_bytes()[..at]));
            let mut t = s;
            let tail = g.completion(&s);
            assert!(g.feed(&mut t, &tail) && g.is_complete(&t));
            fixed.push((
                *schema,
                format!("{}{}", &doc[..at], String::from_utf8(tail).unwrap()),
            ));
        }
    }
    assert!(invalid > 10);
    assert_all_valid(&fixed);
}

#[test]
fn ordered_value_keeps_declared_property_order() {
    // The automaton writes properties in the schema's order, not serde_json's sorted one.
    let text = r#"{"type":"object","properties":{"zeta":{"type":"null"},"alpha":{"type":"null"}},"required":["zeta","alpha"]}"#;
    let g = Schema::compile(&OrderedValue::parse(text).unwrap()).unwrap();
    let mut s = SchemaState::new();
    assert_eq!(
        String::from_utf8(g.completion(&s)).unwrap(),
        r#"{"zeta":null,"alpha":null}"#
    );
    assert!(!g.feed(&mut s, br#"{"alpha""#));
}

#[test]
fn real_vocabulary_random_logits_validate() {
    let engine = Engine::load(common::qwen_path()).unwrap();
    let tok = &engine.tokenizer;
    let vocab = Arc::new(JsonVocab::new(tok));
    let mut cases = Vec::new();
    for (i, text) in SCHEMAS.iter().enumerate() {
        let schema = Arc::new(Schema::parse(text).unwrap());
        for seed in 0..8u64 {
            let budget = schema.min_len() + 2 + (seed as usize * 5) % 30;
            let doc = random_logit_doc(tok, &vocab, &schema, seed * 17 + i as u64, budget);
            cases.push((text.as_str(), doc));
        }
    }
    assert_all_valid(&cases);
}

#[test]
fn real_model_schema_completions_validate() {
    let engine = Engine::load(common::qwen_path()).unwrap();
    let tmpl = engine.chat_template.as_ref().unwrap();
    let vocab = Arc::new(JsonVocab::new(&engine.tokenizer));
    let text = SCHEMAS[0].as_str();
    let schema = Arc::new(Schema::parse(text).unwrap());
    let prompt = tmpl
        .render(
            &[sparrow::ChatMessage::new(
                "user",
                "Describe a user of a web site as JSON with name, age, email, role and active.",
            )],
            true,
        )
        .unwrap();
    let ids = engine.tokenizer.encode(&prompt, true, true);
    let mut cases = Vec::new();
    for seed in 0..4u64 {
        let mut session = Session::new(engine.model.new_state(512, KvType::F16).unwrap());
        let mut sampler = Sampler::new(SamplerConfig {
            temperature: 1.0,
            seed,
            ..Default::default()
        });
        let c = JsonConstraint::with_schema(vocab.clone(), schema.clone());
        let mut gen = Generation::new(24 + seed as usize * 12, false).with_constraint(c);
        let mut out = String::new();
        session
            .generate(
                &engine,
                &ids,
                &mut sampler,
                &mut gen,
                &mut collect_text(&mut out),
            )
            .unwrap();
        eprintln!("seed {seed}: {out}");
        cases.push((text, out));
    }
    assert_all_valid(&cases);
}
