//! The forward pass on small synthetic models: RoPE layouts, batching, tied output, cache
//! types, and loader errors on broken models.

use sparrow::synthetic::{synthetic_gguf, synthetic_tensors, synthetic_writer, SyntheticSpec};
use sparrow::{Error, KvType, Logits, Model};
use sparrow_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use std::sync::Arc;

fn load(bytes: Vec<u8>) -> Result<Model, Error> {
    Model::from_gguf(Arc::new(GgufFile::from_bytes(bytes)?))
}

fn all_logits(model: &Model, tokens: &[u32], kv: KvType) -> Vec<f32> {
    let mut st = model.new_state(64, kv).unwrap();
    model
        .forward(&mut st, tokens, Logits::All)
        .unwrap()
        .to_vec()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

const TOKENS: [u32; 9] = [72, 101, 108, 108, 111, 32, 119, 111, 114];

/// llama GGUFs store q/k rows permuted so that adjacent pairs rotate ("normal" RoPE); the
/// same model in NeoX layout (qwen2) must give the same logits after undoing that.
#[test]
fn llama_normal_rope_equals_neox_on_permuted_weights() {
    let spec = SyntheticSpec {
        arch: "qwen2",
        qkv_bias: false,
        ..Default::default()
    };
    let neox = load(synthetic_gguf(&spec)).unwrap();

    let llama_spec = SyntheticSpec {
        arch: "llama",
        ..spec.clone()
    };
    let mut w = synthetic_writer(&llama_spec);
    let hd = spec.n_embd / spec.n_head;
    for (name, dims, data) in synthetic_tensors(&spec) {
        let permute = name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight");
        let data = if permute {
            let cols = dims[0] as usize;
            let rows = dims[1] as usize;
            let mut out = vec![0.0; data.len()];
            for new in 0..rows {
                let (h, r) = (new / hd, new % hd);
                let old = h * hd + (r % 2) * (hd / 2) + r / 2;
                out[new * cols..(new + 1) * cols]
                    .copy_from_slice(&data[old * cols..(old + 1) * cols]);
            }
            out
        } else {
            data
        };
        w.tensor_f32(&name, &dims, &data);
    }
    let normal = load(w.to_bytes(3)).unwrap();
    let a = all_logits(&neox, &TOKENS, KvType::F32);
    let b = all_logits(&normal, &TOKENS, KvType::F32);
    assert!(max_diff(&a, &b) < 1e-4, "{}", max_diff(&a, &b));

    // And the layouts really differ: the unpermuted weights under llama give other logits.
    let mut w = synthetic_writer(&llama_spec);
    for (name, dims, data) in synthetic_tensors(&spec) {
        w.tensor_f32(&name, &dims, &data);
    }
    let wrong = load(w.to_bytes(3)).unwrap();
    assert!(max_diff(&a, &all_logits(&wrong, &TOKENS, KvType::F32)) > 1e-3);
}

#[test]
fn mistral_loads_like_llama() {
    let llama = load(synthetic_gguf(&SyntheticSpec {
        arch: "llama",
        qkv_bias: false,
        ..Default::default()
    }))
    .unwrap();
    let mistral = load(synthetic_gguf(&SyntheticSpec {
        arch: "mistral",
        qkv_bias: false,
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(
        all_logits(&llama, &TOKENS, KvType::F32),
        all_logits(&mistral, &TOKENS, KvType::F32)
    );
}

#[test]
fn batched_prefill_equals_token_by_token() {
    let model = load(synthetic_gguf(&SyntheticSpec::default())).unwrap();
    let batched = all_logits(&model, &TOKENS, KvType::F32);
    let mut st = model.new_state(64, KvType::F32).unwrap();
    let mut seq = Vec::new();
    for t in TOKENS {
        seq.extend_from_slice(model.forward(&mut st, &[t], Logits::Last).unwrap());
    }
    assert!(
        max_diff(&batched, &seq) < 1e-4,
        "{}",
        max_diff(&batched, &seq)
    );
    // Split prefill (two chunks) as well.
    let mut st = model.new_state(64, KvType::F32).unwrap();
    model.forward(&mut st, &TOKENS[..4], Logits::None).unwrap();
    let tail = model.forward(&mut st, &TOKENS[4..], Logits::All).unwrap();
    assert!(max_diff(&batched[4 * 257..], tail) < 1e-4);
}

#[test]
fn f16_cache_stays_close_to_f32() {
    let model = load(synthetic_gguf(&SyntheticSpec::default())).unwrap();
    let a = all_logits(&model, &TOKENS, KvType::F32);
    let b = all_logits(&model, &TOKENS, KvType::F16);
    let d = max_diff(&a, &b);
    assert!(d < 2e-2 && d > 0.0, "{d}");
}

#[test]
fn tied_output_uses_the_embedding() {
    let spec = SyntheticSpec {
        tied_output: true,
        ..Default::default()
    };
    let tied = load(synthetic_gguf(&spec)).unwrap();
    let mut w = synthetic_writer(&spec);
    let tensors = synthetic_tensors(&spec);
    for (name, dims, data) in &tensors {
        w.tensor_f32(name, dims, data);
    }
    let (_, dims, embd) = tensors.iter().find(|t| t.0 == "token_embd.weight").unwrap();
    w.tensor_f32("output.weight", dims, embd);
    let explicit = load(w.to_bytes(3)).unwrap();
    assert_eq!(
        all_logits(&tied, &TOKENS, KvType::F32),
        all_logits(&explicit, &TOKENS, KvType::F32)
    );
}

#[test]
fn context_overflow_and_bad_tokens_are_errors() {
    let model = load(synthetic_gguf(&SyntheticSpec::default())).unwrap();
    let mut st = model.new_state(4, KvType::F16).unwrap();
    assert!(matches!(
        model.forward(&mut st, &TOKENS, Logits::Last),
        Err(Error::ContextFull { n_ctx: 4 })
    ));
    assert_eq!(st.n_past(), 0, "a refused batch must not advance the state");
    assert!(matches!(
        model.forward(&mut st, &[9999], Logits::Last),
        Err(Error::BadToken { id: 9999, .. })
    ));
    assert!(model.new_state(0, KvType::F16).is_err());
}

fn with_meta(spec: &SyntheticSpec, key: &str, value: Value) -> Vec<u8> {
    let spec = SyntheticSpec {
        overrides: vec![(key.to_string(), value)],
        ..spec.clone()
    };
    let mut w = synthetic_writer(&spec);
    for (name, dims, data) in synthetic_tensors(&spec) {
        w.tensor_f32(&name, &dims, &data);
    }
    w.to_bytes(3)
}

#[test]
fn broken_models_are_refused_with_a_reason() {
    let spec = SyntheticSpec::default();

    let mut bad = synthetic_writer(&SyntheticSpec {
        arch: "gpt-j",
        ..spec.clone()
    });
    for (name, dims, data) in synthetic_tensors(&spec) {
        bad.tensor_f32(&name, &dims, &data);
    }
    let e = load(bad.to_bytes(3)).err().unwrap();
    assert!(
        matches!(e, Error::UnknownArchitecture(ref a) if a == "gpt-j"),
        "{e}"
    );

    // A weight in a type we have no kernels for.
    let mut w = synthetic_writer(&spec);
    for (name, dims, data) in synthetic_tensors(&spec) {
        if name == "blk.1.ffn_up.weight" {
            let n = (dims[0] * dims[1]) as usize / 256 * 66;
            w.tensor(
                &name,
                &[256, (dims[0] * dims[1]) / 256],
                GgmlType::IQ2_XXS,
                vec![0; n],
            );
        } else {
            w.tensor_f32(&name, &dims, &data);
        }
    }
    let e = load(w.to_bytes(3)).err().unwrap();
    let msg = e.to_string();
    assert!(msg.contains("blk.1.ffn_up.weight"), "{msg}");

    // Same tensor with the right type but a wrong shape.
    let mut w = synthetic_writer(&spec);
    for (name, dims, data) in synthetic_tensors(&spec) {
        let dims = if name == "blk.0.attn_k.weight" {
            vec![dims[1], dims[0]]
        } else {
            dims
        };
        w.tensor_f32(&name, &dims, &data);
    }
    let e = load(w.to_bytes(3)).err().unwrap();
    assert!(
        matches!(e, Error::TensorShape { ref tensor, .. } if tensor == "blk.0.attn_k.weight"),
        "{e}"
    );

    // A missing tensor.
    let mut w = synthetic_writer(&spec);
    for (name, dims, data) in synthetic_tensors(&spec) {
        if name != "blk.1.attn_v.weight" {
            w.tensor_f32(&name, &dims, &data);
        }
    }
    let e = load(w.to_bytes(3)).err().unwrap();
    assert!(e.to_string().contains("blk.1.attn_v.weight"), "{e}");

    // Hyper-parameters that cannot be right.
    let e = load(with_meta(
        &spec,
        "qwen2.attention.head_count_kv",
        Value::U32(3),
    ))
    .err()
    .unwrap();
    assert!(e.to_string().contains("head_count_kv"), "{e}");
    let e = load(with_meta(&spec, "qwen2.block_count", Value::U32(0)))
        .err()
        .unwrap();
    assert!(e.to_string().contains("block_count"), "{e}");
    let e = load(with_meta(
        &spec,
        "qwen2.embedding_length",
        Value::String("x".into()),
    ))
    .err()
    .unwrap();
    assert!(e.to_string().contains("embedding_length"), "{e}");
}

#[test]
fn writer_metadata_override_is_rejected_as_duplicate() {
    // Guard for the helper above: a duplicate key is a file error, not silently merged.
    let spec = SyntheticSpec::default();
    let mut w: GgufWriter = synthetic_writer(&spec);
    w.meta("qwen2.block_count", Value::U32(2));
    assert!(GgufFile::from_bytes(w.to_bytes(3)).is_err());
}

#[test]
fn streaming_attention_in_the_model() {
    use sparrow::attention::StreamingAttention;
    let model = load(synthetic_gguf(&SyntheticSpec::default())).unwrap();
    let full = all_logits(&model, &TOKENS, KvType::F32);
    let with = |sinks, window| {
        let mut st = model.new_state(64, KvType::F32).unwrap();
        st.set_attention(Box::new(StreamingAttention { sinks, window }));
        assert_eq!(st.attention().name(), "streaming");
        model
            .forward(&mut st, &TOKENS, Logits::All)
            .unwrap()
            .to_vec()
    };
    // A window covering the whole prompt is exactly full attention.
    assert_eq!(with(2, TOKENS.len()), full);
    // A short window changes the later rows but not the rows it still covers.
    let short = with(1, 3);
    let v = 257;
    assert_eq!(&short[..3 * v], &full[..3 * v]);
    assert!(max_diff(&short[6 * v..], &full[6 * v..]) > 1e-3);
}

/// Files whose metadata asks for absurd allocations are refused before anything is
/// allocated, with the number at fault in the message.
#[test]
fn absurd_sizes_are_refused_before_allocating() {
    let spec = SyntheticSpec::default();
    // A vocabulary of 2^30 tokens.
    let e = load(with_meta(&spec, "qwen2.vocab_size", Value::U32(1 << 30)))
        .err()
        .unwrap();
    assert!(e.to_string().contains("vocab size = 1073741824"), "{e}");
    // A million layers.
    let e = load(with_meta(&spec, "qwen2.block_count", Value::U32(1_000_000)))
        .err()
        .unwrap();
    assert!(e.to_string().contains("block_count = 1000000"), "{e}");
    // A token array that claims 2^30 entries in a file of a few hundred KiB: the parser
    // checks the count against the bytes left before reserving anything.
    let mut bytes = synthetic_gguf(&spec);
    let key = b"tokenizer.ggml.tokens";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // key, then the value type (u32 array = 9), the element type (string = 8), the count.
    assert_eq!(&bytes[at..at + 8], &[9, 0, 0, 0, 8, 0, 0, 0]);
    bytes[at + 8..at + 16].copy_from_slice(&(1u64 << 30).to_le_bytes());
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(e.to_string().contains("1073741824"), "{e}");
    // A training context of 2^31 positions loads (nothing is sized by it at load), but a
    // state that size is refused with the bytes it would need — not an abort.
    let model = load(with_meta(
        &spec,
        "qwen2.context_length",
        Value::U32(1 << 31),
    ))
    .unwrap();
    assert_eq!(model.config.n_ctx_train, 1 << 31);
    let have = sparrow::memory::machine_memory();
    let huge = 1usize << 40;
    match model.new_state(huge, KvType::F16) {
        Err(Error::ContextTooLarge {
            n_ctx,
            need,
            have: h,
        }) => {
            assert_eq!(n_ctx, huge);
            assert_eq!(Some(h), have);
            // f16 K and V of 2 layers × 32 wide, plus the RoPE table's cos and sin.
            let per = 2 * 2 * 2 * 32 + 4 * model.config.n_rot as u64;
            assert_eq!(need, per * huge as u64);
            let msg = model
                .new_state(huge, KvType::F16)
                .err()
                .unwrap()
                .to_string();
            assert!(
                msg.contains("TiB") && msg.contains("-c/--ctx-size"),
                "{msg}"
            );
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => assert!(have.is_none(), "a 2^40-position state was allocated"),
    }
}
