//! Small random models in GGUF form, built in memory. Tests use them to exercise the loader
//! and forward pass on architectures and corner cases no downloadable model covers (llama
//! RoPE layout, missing biases, hostile headers) in milliseconds.

use crate::tokenizer::bytes::byte_to_char;
use sparrow_gguf::{GgmlType, GgufWriter, Value};

/// Shape and content of a synthetic model.
#[derive(Clone, Debug)]
pub struct SyntheticSpec {
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub context_length: usize,
    pub qkv_bias: bool,
    pub tied_output: bool,
    pub seed: u64,
    /// Metadata entries that replace (or add to) the generated ones: for hostile variants.
    pub overrides: Vec<(String, Value)>,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        SyntheticSpec {
            arch: "qwen2",
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 96,
            context_length: 256,
            qkv_bias: true,
            tied_output: false,
            seed: 1,
            overrides: Vec::new(),
        }
    }
}

/// The byte-level vocabulary: 256 byte tokens, then `<|endoftext|>` (control).
pub const SYNTHETIC_VOCAB: usize = 257;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// Random weights for `spec`, as named f32 tensors `(name, dims, data)` in ggml dim order.
pub fn synthetic_tensors(spec: &SyntheticSpec) -> Vec<(String, Vec<u64>, Vec<f32>)> {
    let mut rng = Rng(spec.seed);
    let d = spec.n_embd;
    let hd = d / spec.n_head;
    let kv = spec.n_head_kv * hd;
    let mut t = Vec::new();
    let mut push = |name: String, dims: Vec<u64>, data: Vec<f32>| t.push((name, dims, data));
    let w = 1.0 / (d as f32).sqrt();
    push(
        "token_embd.weight".into(),
        vec![d as u64, SYNTHETIC_VOCAB as u64],
        rng.vec(d * SYNTHETIC_VOCAB, 1.0),
    );
    for l in 0..spec.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}");
        push(
            n("attn_norm.weight"),
            vec![d as u64],
            rng.vec(d, 0.2).iter().map(|x| 1.0 + x).collect(),
        );
        push(
            n("attn_q.weight"),
            vec![d as u64, d as u64],
            rng.vec(d * d, w),
        );
        push(
            n("attn_k.weight"),
            vec![d as u64, kv as u64],
            rng.vec(d * kv, w),
        );
        push(
            n("attn_v.weight"),
            vec![d as u64, kv as u64],
            rng.vec(d * kv, w),
        );
        if spec.qkv_bias {
            push(n("attn_q.bias"), vec![d as u64], rng.vec(d, 0.1));
            push(n("attn_k.bias"), vec![kv as u64], rng.vec(kv, 0.1));
            push(n("attn_v.bias"), vec![kv as u64], rng.vec(kv, 0.1));
        }
        push(
            n("attn_output.weight"),
            vec![d as u64, d as u64],
            rng.vec(d * d, w),
        );
        push(
            n("ffn_norm.weight"),
            vec![d as u64],
            rng.vec(d, 0.2).iter().map(|x| 1.0 + x).collect(),
        );
        push(
            n("ffn_gate.weight"),
            vec![d as u64, spec.n_ff as u64],
            rng.vec(d * spec.n_ff, w),
        );
        push(
            n("ffn_up.weight"),
            vec![d as u64, spec.n_ff as u64],
            rng.vec(d * spec.n_ff, w),
        );
        push(
            n("ffn_down.weight"),
            vec![spec.n_ff as u64, d as u64],
            rng.vec(d * spec.n_ff, 1.0 / (spec.n_ff as f32).sqrt()),
        );
    }
    push(
        "output_norm.weight".into(),
        vec![d as u64],
        rng.vec(d, 0.2).iter().map(|x| 1.0 + x).collect(),
    );
    if !spec.tied_output {
        push(
            "output.weight".into(),
            vec![d as u64, SYNTHETIC_VOCAB as u64],
            rng.vec(d * SYNTHETIC_VOCAB, w),
        );
    }
    t
}

/// Metadata of `spec` (architecture hyper-parameters and a byte-level tokenizer).
pub fn synthetic_writer(spec: &SyntheticSpec) -> GgufWriter {
    let mut meta = GgufWriter::new();
    let a = spec.arch;
    let u = |v: usize| Value::U32(v as u32);
    let mut entries: Vec<(String, Value)> = Vec::new();
    let mut w = Collect(&mut entries);
    w.meta("general.architecture", Value::String(a.into()))
        .meta(&format!("{a}.block_count"), u(spec.n_layer))
        .meta(&format!("{a}.context_length"), u(spec.context_length))
        .meta(&format!("{a}.embedding_length"), u(spec.n_embd))
        .meta(&format!("{a}.feed_forward_length"), u(spec.n_ff))
        .meta(&format!("{a}.attention.head_count"), u(spec.n_head))
        .meta(&format!("{a}.attention.head_count_kv"), u(spec.n_head_kv))
        .meta(&format!("{a}.rope.freq_base"), Value::F32(10000.0))
        .meta(
            &format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        );
    let mut tokens: Vec<Value> = (0..=255u8)
        .map(|b| Value::String(byte_to_char(b).to_string()))
        .collect();
    tokens.push(Value::String("<|endoftext|>".into()));
    let mut types = vec![Value::I32(1); 256];
    types.push(Value::I32(3));
    w.meta("tokenizer.ggml.model", Value::String("gpt2".into()))
        .meta("tokenizer.ggml.pre", Value::String("qwen2".into()))
        .meta("tokenizer.ggml.tokens", Value::Array(tokens))
        .meta("tokenizer.ggml.token_type", Value::Array(types))
        .meta("tokenizer.ggml.merges", Value::Array(vec![]))
        .meta("tokenizer.ggml.eos_token_id", u(256))
        .meta("tokenizer.ggml.add_bos_token", Value::Bool(false));
    for (k, v) in &spec.overrides {
        match entries.iter_mut().find(|e| &e.0 == k) {
            Some(e) => e.1 = v.clone(),
            None => entries.push((k.clone(), v.clone())),
        }
    }
    for (k, v) in entries {
        meta.meta(&k, v);
    }
    meta
}

/// Gathers metadata entries so overrides can replace them before they are written.
struct Collect<'a>(&'a mut Vec<(String, Value)>);
impl Collect<'_> {
    fn meta(&mut self, key: &str, value: Value) -> &mut Self {
        self.0.push((key.to_string(), value));
        self
    }
}

/// A complete synthetic model as a GGUF image (all tensors f32).
pub fn synthetic_gguf(spec: &SyntheticSpec) -> Vec<u8> {
    let mut w = synthetic_writer(spec);
    for (name, dims, data) in synthetic_tensors(spec) {
        w.tensor_f32(&name, &dims, &data);
    }
    w.to_bytes(3)
}

/// Like [`synthetic_gguf`] but with every 2-D weight stored as `ty` bytes produced by
/// `encode` (so tests can build quantized variants without this crate knowing encoders).
pub fn synthetic_gguf_with(
    spec: &SyntheticSpec,
    ty: GgmlType,
    encode: impl Fn(&[f32]) -> Vec<u8>,
) -> Vec<u8> {
    let mut w = synthetic_writer(spec);
    for (name, dims, data) in synthetic_tensors(spec) {
        if dims.len() == 2 {
            w.tensor(&name, &dims, ty, encode(&data));
        } else {
            w.tensor_f32(&name, &dims, &data);
        }
    }
    w.to_bytes(3)
}

/// The hyper-parameters of the synthetic model `spec` describes, read back from its GGUF
/// header as a loader would (for tests that need a model's shapes and no weights, such as
/// building an attention policy).
pub fn synthetic_config(spec: &SyntheticSpec) -> crate::Result<crate::model::ModelConfig> {
    let file = sparrow_gguf::GgufFile::from_bytes(synthetic_writer(spec).to_bytes(3))?;
    crate::model::ModelConfig::from_gguf(&file)
}

/// The synthetic model `spec` describes, loaded (f32 weights).
pub fn synthetic_model(spec: &SyntheticSpec) -> crate::Result<crate::Model> {
    let file = sparrow_gguf::GgufFile::from_bytes(synthetic_gguf(spec))?;
    crate::Model::from_gguf(std::sync::Arc::new(file))
}

/// `n` pseudo-random token ids of the synthetic vocabulary (3..253, clear of the special
/// ids), a different sequence per `seed`: prompts for tests on synthetic models.
pub fn synthetic_tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 7) % 250 + 3)
        .collect()
}

/// A random Saap index (centroids and Q-models) for `model`'s shapes with `c` buckets and
/// hidden width `h`, bound to its fingerprint: for tests that run the `saap` and `kmeans`
/// policies on a synthetic model, where training one would take the training crate.
pub fn synthetic_saap_index(
    model: &crate::model::ModelConfig,
    c: usize,
    h: usize,
    seed: u64,
) -> crate::saap::index::SaapIndex {
    use crate::saap::index::{HeadModel, IndexMeta, SaapIndex, TrainingInfo};
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let d = model.head_dim;
    let mut v = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let heads = (0..model.n_layer * model.n_head_kv)
        .map(|_| HeadModel::from_parts(c, h, d, false, &mut v))
        .collect();
    SaapIndex {
        meta: IndexMeta {
            n_layer: model.n_layer,
            n_head_kv: model.n_head_kv,
            head_dim: d,
            clusters: c,
            hidden: h,
            centroid_prior: false,
            training: TrainingInfo::default(),
        },
        fingerprint: model.fingerprint,
        heads,
    }
}

/// A tokenizer of the 256 byte tokens, then `extra` (each a normal token spelling those
/// bytes), then `<|endoftext|>` (control, end of generation): for grammar tests, where
/// multi-byte tokens must cross the boundaries of JSON's lexemes.
pub fn byte_tokenizer(extra: &[&str]) -> crate::tokenizer::Tokenizer {
    use crate::tokenizer::{Tokenizer, TokenizerSpec};
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    for e in extra {
        tokens.push(e.bytes().map(byte_to_char).collect());
    }
    let mut types = vec![1; tokens.len()];
    tokens.push("<|endoftext|>".into());
    types.push(3);
    let eos = tokens.len() as u32 - 1;
    Tokenizer::from_spec(TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("qwen2".into()),
        tokens,
        token_types: types,
        eos: Some(eos),
        ..Default::default()
    })
    .expect("a byte vocabulary is a valid tokenizer")
}
