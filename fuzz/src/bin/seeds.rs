//! Writes the seed corpus of every fuzz target into `fuzz/corpus/<target>/` (run from
//! `fuzz/`: `cargo run --release --bin seeds`). Seeds come from real files where we have
//! them — the model's own metadata (its big arrays cut short), llama.cpp's reference
//! strings, a prompt cache the engine saved — and from the synthetic model otherwise.

use sparrow::synthetic::{synthetic_gguf, SyntheticSpec};
use sparrow::{prefix_cache, prompt_cache};
use sparrow::{KvType, Logits};
use sparrow_fuzz::{model_path, small_model, tokenizer};
use sparrow_gguf::{GgufFile, GgufWriter, Value};
use std::fs;
use std::path::Path;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(name), bytes).unwrap();
}

fn with_mode(mode: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![mode];
    v.extend_from_slice(body);
    v
}

fn ids_bytes(ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|i| i.to_le_bytes()).collect()
}

/// Arrays longer than this are cut in metadata seeds (a real vocabulary is megabytes).
const MAX_ARRAY: usize = 256;

fn cut(v: &Value) -> Value {
    match v {
        Value::Array(a) => Value::Array(a.iter().take(MAX_ARRAY).map(cut).collect()),
        other => other.clone(),
    }
}

fn main() {
    // GGUF: synthetic models of each family switch, and the real model's metadata.
    // One layer of width 32 keeps them small (fuzzing is faster on short inputs).
    let small = SyntheticSpec {
        n_layer: 1,
        n_embd: 32,
        n_head: 2,
        n_head_kv: 1,
        n_ff: 32,
        ..Default::default()
    };
    for (name, spec) in [
        ("qwen2", small.clone()),
        (
            "llama-tied",
            SyntheticSpec {
                arch: "llama",
                qkv_bias: false,
                tied_output: true,
                ..small
            },
        ),
    ] {
        write("gguf_parse", name, &synthetic_gguf(&spec));
    }
    if let Some(path) = model_path() {
        let file = GgufFile::open(&path).unwrap();
        let mut w = GgufWriter::new();
        for (key, value) in file.metadata().iter() {
            w.meta(key, cut(value));
        }
        w.tensor_f32("token_embd.weight", &[4, 2], &[0.5; 8]);
        write("gguf_parse", "real-metadata", &w.to_bytes(3));
    }

    // Tokenizer: llama.cpp's reference strings, plain and with special-token parsing.
    let refs: serde_json::Value = serde_json::from_str(
        &fs::read_to_string("../../shared/data/reference/qwen_tokens.json")
            .or_else(|_| fs::read_to_string("../shared/data/reference/qwen_tokens.json"))
            .expect("../shared/data/reference/qwen_tokens.json"),
    )
    .unwrap();
    let tok = tokenizer();
    for (i, case) in refs["cases"].as_array().unwrap().iter().enumerate() {
        let text = case["text"].as_str().unwrap();
        write(
            "tokenizer",
            &format!("ref-{i}"),
            &with_mode(0, text.as_bytes()),
        );
        write(
            "tokenizer",
            &format!("ref-{i}-special"),
            &with_mode(3, text.as_bytes()),
        );
        let ids = tok.encode(text, false, false);
        write(
            "tokenizer",
            &format!("ids-{i}"),
            &with_mode(4, &ids_bytes(&ids)),
        );
    }

    // Prompt cache: a file the engine saved, raw, and its body for the well-formed mode.
    let model = small_model();
    for (code, kv) in [(0u8, KvType::F16), (1, KvType::F32), (2, KvType::Q8_0)] {
        let mut state = model.new_state(32, kv).unwrap();
        let tokens = [1u32, 5, 9, 200, 7];
        model.forward(&mut state, &tokens, Logits::Last).unwrap();
        let fp = prompt_cache::model_fingerprint(model);
        let file = prompt_cache::encode(&fp, &state, &tokens).unwrap();
        write(
            "prompt_cache",
            &format!("saved-{code}"),
            &with_mode(code << 1, &file),
        );
        let body = &file[60..file.len() - 32];
        write(
            "prompt_cache",
            &format!("body-{code}"),
            &with_mode((code << 1) | 1, body),
        );
    }

    // Prefix cache blocks: a block the engine took, as its file and as the well-formed
    // mode's body (presence flags, rows).
    for (code, kv) in [(0u8, KvType::F16), (1, KvType::F32), (2, KvType::Q8_0)] {
        let mut state = model.new_state(32, kv).unwrap();
        model
            .forward(&mut state, &[1u32, 5, 9, 200, 7], Logits::Last)
            .unwrap();
        let shape = prefix_cache::BlockShape::of(state.kv(), 4);
        let format = prefix_cache::BlockFormat {
            root: prefix_cache::root(
                &model.config.fingerprint,
                &shape,
                &sparrow::attention::AttentionChoice::default(),
            ),
            shape,
        };
        let block = prefix_cache::Block::take(state.kv(), &format.shape, 0);
        let mut file = Vec::new();
        format.write(&[7u8; 32], 0, &block, &mut file).unwrap();
        write(
            "prefix_block",
            &format!("taken-{code}"),
            &with_mode(code << 1, &file),
        );
        let mut body: Vec<u8> = block.present.iter().map(|&p| p as u8).collect();
        body.extend_from_slice(&block.data);
        write(
            "prefix_block",
            &format!("body-{code}"),
            &with_mode((code << 1) | 1, &body),
        );
    }

    // JSON grammar: tokenized JSON texts, ending with end-of-generation.
    let eos = tok.eog_ids().first().copied().unwrap_or(0) | 0x8000_0000;
    for (i, text) in [
        r#"{"name": "sparrow", "tags": ["a", "b\n"], "n": -12.5e3, "ok": true, "x": null}"#,
        r#"[1, {"k": "\u00e9\ud83d\ude00"}, [], {}]"#,
        r#""just a string""#,
        "  {\"deep\": [[[[{\"a\": [0.0, 1E+2]}]]]]}  ",
    ]
    .iter()
    .enumerate()
    {
        let mut ids = tok.encode(text, false, false);
        ids.push(eos);
        write(
            "json_grammar",
            &format!("json-{i}"),
            &with_mode(2, &ids_bytes(&ids)),
        );
        write(
            "json_grammar",
            &format!("json-{i}-obj"),
            &with_mode(1, &ids_bytes(&ids)),
        );
    }

    // OpenAI requests: chat and completion bodies, good and bad.
    for (i, (chat, body)) in [
        (true, r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":16,"temperature":0.7,"top_p":0.9,"stop":["\n\n"],"stream":true,"stream_options":{"include_usage":true}}"#),
        (true, r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"response_format":{"type":"json_object"},"seed":-3,"n":1}"#),
        (true, r#"{"messages":[{"role":"developer","content":"x"},{"role":"tool","content":null}],"max_completion_tokens":5,"ignore_eos":true}"#),
        (false, r#"{"prompt":"Once upon a time","max_tokens":32,"top_k":40,"min_p":0.05,"repeat_penalty":1.1}"#),
        (false, r#"{"prompt":["one"],"stop":"END","seed":18446744073709551615}"#),
        (true, r#"{"messages":[]}"#),
    ]
    .iter()
    .enumerate()
    {
        write("openai_request", &format!("req-{i}"), &with_mode(*chat as u8, body.as_bytes()));
    }
    saap_seeds();
    schema_seeds();
    eprintln!("seeds written under fuzz/corpus/");
}

/// Saap files the engine writes: an index of the synthetic model (raw, and as the body the
/// wrapping mode takes) and a training record of its shapes.
fn saap_seeds() {
    use sparrow::saap::record::{ContextRecord, RecordMeta, RopeParams};
    use sparrow::synthetic::synthetic_saap_index;
    use sparrow_fuzz::saap_files::{body, saap_model};
    let model = saap_model();
    // The vectors of a Saap image: after the 48-byte header and the metadata, before the sum.
    let split = |img: &[u8]| -> (Vec<u8>, Vec<u8>) {
        let meta_len = u32::from_le_bytes(img[44..48].try_into().unwrap()) as usize;
        let meta = img[48..48 + meta_len].to_vec();
        (meta, img[48 + meta_len..img.len() - 32].to_vec())
    };
    for (c, h) in [(2, 1), (4, 3)] {
        let img = synthetic_saap_index(model, c, h, 1).encode();
        write("saap_index", &format!("index-{c}x{h}"), &with_mode(0, &img));
        let (meta, vectors) = split(&img);
        write(
            "saap_index",
            &format!("index-{c}x{h}-body"),
            &with_mode(1, &body(&meta, &vectors)),
        );
    }
    let (n_layer, n_head, n_head_kv, d, n_tokens) = (2, 4, 2, model.head_dim, 6);
    let positions = vec![2, 5];
    let value = |i: usize| ((i * 37 % 101) as f32 - 50.0) / 25.0;
    let rec = ContextRecord {
        meta: RecordMeta {
            n_layer,
            n_head,
            n_head_kv,
            head_dim: d,
            n_tokens,
            query_positions: positions.clone(),
            rope: RopeParams::of(model),
            source: "seed.txt@0".into(),
        },
        fingerprint: model.fingerprint,
        keys: (0..n_layer)
            .map(|_| (0..n_tokens * n_head_kv * d).map(value).collect())
            .collect(),
        queries: (0..n_layer)
            .map(|_| (0..positions.len() * n_head * d).map(value).collect())
            .collect(),
    };
    let img = rec.encode();
    write("saap_record", "record", &with_mode(0, &img));
    let (meta, vectors) = split(&img);
    write(
        "saap_record",
        "record-body",
        &with_mode(1, &body(&meta, &vectors)),
    );
}

/// One walk per schema of the JSON-schema target.
fn schema_seeds() {
    for i in 0..sparrow_fuzz::schema_check::SCHEMAS.len() {
        let words: Vec<u32> = (0..24u32)
            .map(|j| j.wrapping_mul(2654435761) >> 4)
            .collect();
        write(
            "json_schema",
            &format!("schema-{i}"),
            &with_mode(i as u8, &ids_bytes(&words)),
        );
    }
}
