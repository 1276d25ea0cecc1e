//! The element types a KV store holds — FP16 by default (half the memory and bandwidth of
//! f32, with errors far below what 4-bit weights already introduce), f32 on request, or Q8_0
//! (ggml's 8-bit blocks: about half of f16 again) — and the row views the kernels borrow.
//! Keys and values may use different types (llama.cpp's `-ctk` / `-ctv`).

pub use sparrow_attn::kernel::{BlockQ8_0, KvRows, BLOCK_Q8_0_BYTES, QK8_0};

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    F32,
    /// ggml's Q8_0: blocks of 32 values, an f16 scale and 32 `i8` quants.
    Q8_0,
}

/// Names [`KvType`] parses, for messages.
pub const KV_TYPE_NAMES: &str = "f16, f32, q8_0";

impl KvType {
    /// The lowercase name (`f16`, `f32`, `q8_0`), as parsed.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes one row of `kv_dim` elements takes (`kv_dim` a multiple of 32 for Q8_0).
    pub fn row_bytes(self, kv_dim: usize) -> usize {
        match self {
            KvType::F16 => 2 * kv_dim,
            KvType::F32 => 4 * kv_dim,
            KvType::Q8_0 => kv_dim / QK8_0 * BLOCK_Q8_0_BYTES,
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            "q8_0" => Ok(KvType::Q8_0),
            other => Err(format!(
                "unknown KV cache type '{other}' (use one of {KV_TYPE_NAMES})"
            )),
        }
    }
}

/// The element types of keys and of values. A single [`KvType`] converts into both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    /// Keys of type `k`, values of type `v`.
    pub fn new(k: KvType, v: KvType) -> Self {
        KvTypes { k, v }
    }
}

impl From<KvType> for KvTypes {
    fn from(t: KvType) -> Self {
        KvTypes { k: t, v: t }
    }
}

impl std::fmt::Display for KvTypes {
    /// `k/v`, e.g. `f16/q8_0`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.k, self.v)
    }
}

/// The raw little-endian bytes of borrowed rows (for Q8_0, ggml's 34-byte blocks): what
/// prompt cache files and the cold tier's file hold.
pub fn bytes_of<'a>(rows: &KvRows<'a>) -> &'a [u8] {
    match *rows {
        KvRows::F16(r) => bytemuck::cast_slice(r),
        KvRows::F32(r) => bytemuck::cast_slice(r),
        KvRows::Q8_0(r) => bytemuck::cast_slice(r),
    }
}
