//! Prompt cache files: the KV state after a prompt prefix, saved so a later run with the same
//! prefix skips its prefill (llama.cpp's `--prompt-cache`, PicoLLM's KV persistence).
//!
//! Layout (all integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `SPRWKVC\n` |
//! | 4 | format version ([`VERSION`]) |
//! | 32 | model fingerprint: SHA-256 of the GGUF's header, metadata and tensor table |
//! | 1 + 1 + 2 | key cache type, value cache type (0 = f16, 1 = f32, 2 = q8_0), 2 zero bytes |
//! | 4 + 4 | layers, KV width (kv heads × head size) |
//! | 4 | n, the number of prefix tokens |
//! | 4·n | the prefix token ids |
//! | … | per layer: keys of positions 0..n, then values, each raw in its cache type (f16 and
//! f32 elements; q8_0 rows as ggml's 34-byte blocks: f16 scale, 32 `i8`) |
//! | 32 | SHA-256 of everything above |
//!
//! Version 1 (before separate key and value types and q8_0) had one type byte for both,
//! followed by 3 zero bytes, and the same data layout; it is still read.
//!
//! Loading checks, in order: length, magic, version, fingerprint, cache type and shape, the
//! exact size, then the checksum; each failure is a [`PromptCacheError`] that says what is
//! wrong, and callers fall back to a normal prefill.

use crate::kv::{KvType, KvTypes};
use crate::model::{Model, State};
use sha2::{Digest, Sha256};
use std::path::Path;

/// File magic.
pub const MAGIC: &[u8; 8] = b"SPRWKVC\n";
/// Format version written (and the newest accepted).
pub const VERSION: u32 = 2;
/// Oldest format version accepted.
pub const MIN_VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 32 + 4 + 4 + 4 + 4;

/// Why a prompt cache file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PromptCacheError {
    #[error("prompt cache {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("prompt cache is truncated ({len} bytes, need at least {need})")]
    Truncated { len: usize, need: usize },
    #[error("not a sparrow prompt cache file (bad magic)")]
    BadMagic,
    #[error("prompt cache format version {found} is not supported (this sparrow reads versions {MIN_VERSION} to {VERSION})")]
    Version { found: u32 },
    #[error("prompt cache was made with a different model (fingerprint mismatch)")]
    OtherModel,
    #[error("prompt cache holds a {file} KV cache but this run uses {want}")]
    CacheType { file: String, want: String },
    #[error("prompt cache shape ({layers} layers × {width}) does not match the model ({want_layers} layers × {want_width})")]
    Shape {
        layers: usize,
        width: usize,
        want_layers: usize,
        want_width: usize,
    },
    #[error("prompt cache has {tokens} tokens but the context holds only {n_ctx}")]
    TooLong { tokens: usize, n_ctx: usize },
    #[error("prompt cache size is wrong ({len} bytes, expected {want}): truncated or corrupted")]
    Size { len: usize, want: usize },
    #[error("prompt cache checksum mismatch: the file is corrupted")]
    Checksum,
    #[error("prompt cache: {0}")]
    Other(String),
}

/// The model's fingerprint ([`crate::model::config::file_fingerprint`]): prompt caches are
/// bound to it.
pub fn model_fingerprint(model: &Model) -> [u8; 32] {
    model.config.fingerprint
}

fn type_code(t: KvType) -> u8 {
    match t {
        KvType::F16 => 0,
        KvType::F32 => 1,
        KvType::Q8_0 => 2,
    }
}

fn type_of(code: u8) -> Option<KvType> {
    match code {
        0 => Some(KvType::F16),
        1 => Some(KvType::F32),
        2 => Some(KvType::Q8_0),
        _ => None,
    }
}

fn type_name(code: u8) -> String {
    match type_of(code) {
        Some(t) => t.name().into(),
        None => format!("unknown (code {code})"),
    }
}

/// A validated prompt cache: the prefix tokens and their keys and values.
pub struct PromptCache {
    pub tokens: Vec<u32>,
    kv_types: KvTypes,
    n_layer: usize,
    kv_dim: usize,
    image: Image,
    /// Where the keys and values start in `image` (they run to the checksum).
    kv_at: usize,
}

/// A validated file's bytes: a copy, or (from [`load`]) a read-only mapping of the file, so
/// restoring a long context into a cold-tier store takes no memory of the file's size.
enum Image {
    Owned(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl std::ops::Deref for Image {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Image::Owned(v) => v,
            Image::Mapped(m) => m,
        }
    }
}

/// A writer that hashes what passes through it (the file's trailing checksum).
struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: std::io::Write> std::io::Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Write the file image of the first `tokens.len()` positions of `state` (which must hold
/// them) to `out`, checksum last, streaming the keys and values a run of rows at a time.
fn write_image(
    fingerprint: &[u8; 32],
    state: &State,
    tokens: &[u32],
    out: impl std::io::Write,
) -> Result<(), PromptCacheError> {
    use std::io::Write;
    let n = tokens.len();
    if n > state.n_past() {
        return Err(PromptCacheError::Other(format!(
            "the state holds {} positions, fewer than the {n} tokens to save",
            state.n_past()
        )));
    }
    let kv = state.kv();
    let mut out = Hashing {
        inner: out,
        hash: Sha256::new(),
    };
    let mut header = Vec::with_capacity(HEADER + 4 * n);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(fingerprint);
    let types = kv.types();
    header.extend_from_slice(&[type_code(types.k), type_code(types.v), 0, 0]);
    header.extend_from_slice(&(kv.n_layer() as u32).to_le_bytes());
    header.extend_from_slice(&(kv.kv_dim() as u32).to_le_bytes());
    header.extend_from_slice(&(n as u32).to_le_bytes());
    for t in tokens {
        header.extend_from_slice(&t.to_le_bytes());
    }
    let write = |r: std::io::Result<()>| r.map_err(|e| PromptCacheError::Other(e.to_string()));
    write(out.write_all(&header))?;
    write(kv.write_prefix(n, &mut out))?;
    let sum: [u8; 32] = out.hash.finalize_reset().into();
    write(out.inner.write_all(&sum))?;
    write(out.inner.flush())
}

/// Serialize the first `tokens.len()` positions of `state` (which must hold them).
pub fn encode(
    fingerprint: &[u8; 32],
    state: &State,
    tokens: &[u32],
) -> Result<Vec<u8>, PromptCacheError> {
    let mut out = Vec::with_capacity(
        HEADER + 4 * tokens.len() + crate::kv::prefix_bytes(state.kv(), tokens.len()) + 32,
    );
    write_image(fingerprint, state, tokens, &mut out)?;
    Ok(out)
}

/// Write a prompt cache file for the first `tokens.len()` positions of `state` (atomically:
/// a temporary file renamed over `path`). The keys and values are streamed to the file, so
/// saving a context held in a cold tier takes no memory of its size.
pub fn save(
    path: &Path,
    model: &Model,
    state: &State,
    tokens: &[u32],
) -> Result<(), PromptCacheError> {
    let io = |source| PromptCacheError::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("tmp-sparrow");
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let written = write_image(
        &model_fingerprint(model),
        state,
        tokens,
        std::io::BufWriter::with_capacity(1 << 20, &file),
    )
    .and_then(|()| file.sync_data().map_err(io));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(match e {
            PromptCacheError::Other(msg) => {
                PromptCacheError::Other(format!("writing {}: {msg}", tmp.display()))
            }
            e => e,
        });
    }
    std::fs::rename(&tmp, path).map_err(io)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Parse and validate a prompt cache image for a model with `fingerprint`, a state with
/// cache types `kv_types` (keys and values), `n_layer` layers of width `kv_dim` and `n_ctx`
/// positions, each layer holding every position.
pub fn decode(
    bytes: &[u8],
    fingerprint: &[u8; 32],
    kv_types: impl Into<KvTypes>,
    n_layer: usize,
    kv_dim: usize,
    n_ctx: usize,
) -> Result<PromptCache, PromptCacheError> {
    decode_for(
        bytes,
        fingerprint,
        kv_types,
        &vec![n_ctx; n_layer.min(1 << 16)],
        kv_dim,
        n_ctx,
    )
}

/// Like [`decode`], for a state whose layers hold `layer_rows` positions each (fewer than
/// `n_ctx` for a sliding-window layer's ring, of which the file holds the last ones).
pub fn decode_for(
    bytes: &[u8],
    fingerprint: &[u8; 32],
    kv_types: impl Into<KvTypes>,
    layer_rows: &[usize],
    kv_dim: usize,
    n_ctx: usize,
) -> Result<PromptCache, PromptCacheError> {
    let mut cache = validate(
        bytes,
        fingerprint,
        kv_types.into(),
        layer_rows,
        kv_dim,
        n_ctx,
    )?;
    cache.image = Image::Owned(bytes.to_vec());
    Ok(cache)
}

/// [`decode_for`]'s checks; the cache returned has an empty image for the caller to set.
fn validate(
    bytes: &[u8],
    fingerprint: &[u8; 32],
    kv_types: KvTypes,
    layer_rows: &[usize],
    kv_dim: usize,
    n_ctx: usize,
) -> Result<PromptCache, PromptCacheError> {
    let n_layer = layer_rows.len();
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        if bytes.len() < 8 && MAGIC.starts_with(bytes) {
            return Err(PromptCacheError::Truncated {
                len: bytes.len(),
                need: HEADER + 32,
            });
        }
        return Err(PromptCacheError::BadMagic);
    }
    if bytes.len() < 12 {
        return Err(PromptCacheError::Truncated {
            len: bytes.len(),
            need: HEADER + 32,
        });
    }
    let version = u32_at(bytes, 8);
    if !(MIN_VERSION..=VERSION).contains(&version) {
        return Err(PromptCacheError::Version { found: version });
    }
    if bytes.len() < HEADER + 32 {
        return Err(PromptCacheError::Truncated {
            len: bytes.len(),
            need: HEADER + 32,
        });
    }
    if &bytes[12..44] != fingerprint {
        return Err(PromptCacheError::OtherModel);
    }
    // Version 1 has one type for keys and values (and a zero byte after it).
    let (k_code, v_code) = if version == 1 {
        (bytes[44], bytes[44])
    } else {
        (bytes[44], bytes[45])
    };
    if (k_code, v_code) != (type_code(kv_types.k), type_code(kv_types.v)) {
        return Err(PromptCacheError::CacheType {
            file: format!("{}/{}", type_name(k_code), type_name(v_code)),
            want: kv_types.to_string(),
        });
    }
    let (layers, width, n) = (
        u32_at(bytes, 48) as usize,
        u32_at(bytes, 52) as usize,
        u32_at(bytes, 56) as usize,
    );
    if layers != n_layer || width != kv_dim {
        return Err(PromptCacheError::Shape {
            layers,
            width,
            want_layers: n_layer,
            want_width: kv_dim,
        });
    }
    if n > n_ctx {
        return Err(PromptCacheError::TooLong { tokens: n, n_ctx });
    }
    // n ≤ n_ctx and the shape matches the model, so these products are bounded. A ring
    // layer holds its last `min(n, rows)` positions.
    let kept: usize = layer_rows.iter().map(|&r| n.min(r)).sum();
    let kv_len = kept * (kv_types.k.row_bytes(width) + kv_types.v.row_bytes(width));
    let want = HEADER + 4 * n + kv_len + 32;
    if bytes.len() != want {
        return Err(PromptCacheError::Size {
            len: bytes.len(),
            want,
        });
    }
    let body = &bytes[..want - 32];
    let sum: [u8; 32] = Sha256::digest(body).into();
    if sum[..] != bytes[want - 32..] {
        return Err(PromptCacheError::Checksum);
    }
    let tokens = (0..n).map(|i| u32_at(bytes, HEADER + 4 * i)).collect();
    Ok(PromptCache {
        tokens,
        kv_types,
        n_layer: layers,
        kv_dim: width,
        image: Image::Owned(Vec::new()),
        kv_at: HEADER + 4 * n,
    })
}

/// Read and validate `path` for `model` and `state` (cache type and size). The file is
/// mapped, not read into memory: its pages are the OS's file cache, and a restore copies
/// them straight into the state's store (for a cold tier, file to file).
pub fn load(path: &Path, model: &Model, state: &State) -> Result<PromptCache, PromptCacheError> {
    let io = |source| PromptCacheError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let image = if file.metadata().map_err(io)?.len() < (HEADER + 32) as u64 {
        // Too short to be valid (and an empty file cannot be mapped): read it for the checks'
        // message.
        Image::Owned(std::fs::read(path).map_err(io)?)
    } else {
        // SAFETY: a read-only private mapping of a file we opened; the bytes are validated
        // (size, checksum) before use. If another process truncates the file while it is
        // mapped, reads past the new end fault — the same contract as the model's mapping.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let _ = map.advise(memmap2::Advice::Sequential);
        Image::Mapped(map)
    };
    let kv = state.kv();
    let rows: Vec<usize> = (0..kv.n_layer()).map(|l| kv.layer_rows(l)).collect();
    let mut cache = validate(
        &image,
        &model_fingerprint(model),
        kv.types(),
        &rows,
        kv.kv_dim(),
        state.n_ctx(),
    )?;
    cache.image = image;
    Ok(cache)
}

impl PromptCache {
    /// Number of cached tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when the cache holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Put the first `n` cached positions into `state` (replacing whatever it held) and set
    /// its position there; returns the positions restored. That is `n`, or 0 when the
    /// model's sliding-window layers no longer hold what `n` needs (a file saved far past
    /// `n`: their rings keep the last positions only).
    pub fn restore(&self, state: &mut State, n: usize) -> Result<usize, PromptCacheError> {
        let total = self.tokens.len();
        if n > total {
            return Err(PromptCacheError::Other(format!(
                "cannot restore {n} of {total} tokens"
            )));
        }
        if state.kv().types() != self.kv_types {
            return Err(PromptCacheError::CacheType {
                file: self.kv_types.to_string(),
                want: state.kv().types().to_string(),
            });
        }
        if state.kv().n_layer() != self.n_layer || state.kv().kv_dim() != self.kv_dim {
            return Err(PromptCacheError::Other(
                "state does not match the cache".into(),
            ));
        }
        state
            .import_prefix(total, &self.image[self.kv_at..self.image.len() - 32])
            .map_err(|e| PromptCacheError::Other(e.to_string()))?;
        Ok(state.truncate(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{synthetic_gguf, SyntheticSpec};
    use crate::Logits;
    use sparrow_gguf::GgufFile;
    use std::sync::Arc;

    fn model(seed: u64) -> Model {
        let bytes = synthetic_gguf(&SyntheticSpec {
            seed,
            ..Default::default()
        });
        Model::from_gguf(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap()
    }

    #[test]
    fn round_trip_and_hostile_images() {
        let m = model(1);
        let fp = model_fingerprint(&m);
        let mut st = m.new_state(64, KvType::F16).unwrap();
        let toks: Vec<u32> = (0..10).map(|i| i * 7 % 256).collect();
        m.forward(&mut st, &toks, Logits::None).unwrap();
        let img = encode(&fp, &st, &toks).unwrap();
        let (l, w) = (st.kv().n_layer(), st.kv().kv_dim());
        let pc = decode(&img, &fp, KvType::F16, l, w, 64).unwrap();
        assert_eq!(pc.tokens, toks);
        let mut st2 = m.new_state(64, KvType::F16).unwrap();
        assert_eq!(pc.restore(&mut st2, 6).unwrap(), 6);
        assert_eq!(st2.n_past(), 6);
        assert_eq!(st2.kv().export_prefix(6), st.kv().export_prefix(6));

        let err = |b: &[u8]| {
            decode(b, &fp, KvType::F16, l, w, 64)
                .err()
                .unwrap()
                .to_string()
        };
        for cut in [0, 5, 11, 40, HEADER + 10, img.len() - 1] {
            let e = err(&img[..cut]);
            assert!(e.contains("truncated"), "{cut}: {e}");
        }
        let mut bad = img.clone();
        bad[HEADER + 50] ^= 1;
        assert!(err(&bad).contains("checksum"));
        let mut bad = img.clone();
        bad[0] = b'X';
        assert!(err(&bad).contains("magic"));
        let mut bad = img.clone();
        bad[8] = 9;
        assert!(err(&bad).contains("version 9"));
        let other = model_fingerprint(&model(2));
        assert_ne!(
            other, fp,
            "a different model must have a different fingerprint"
        );
        assert!(decode(&img, &other, KvType::F16, l, w, 64)
            .err()
            .unwrap()
            .to_string()
            .contains("different model"));
        assert!(decode(&img, &fp, KvType::F32, l, w, 64)
            .err()
            .unwrap()
            .to_string()
            .contains("f16"));
        assert!(decode(&img, &fp, KvType::F16, l, w, 5)
            .err()
            .unwrap()
            .to_string()
            .contains("context"));
        let mut big = img.clone();
        big[56..60].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(!err(&big).is_empty());
    }

    /// Q8_0 and mixed K/V caches survive a save and restore bit for bit (the restored state
    /// then computes the same logits as the original), a file is refused by a state of any
    /// other K/V types with a message naming both, and version 1 files still load.
    #[test]
    fn q8_0_and_mixed_types_round_trip_and_mismatches_error() {
        // Heads of 16 cannot hold Q8_0 blocks: a clear error, not a panic.
        let e = model(1)
            .new_state(64, KvType::Q8_0)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("q8_0") && e.contains("16"), "{e}");
        // Heads of 32 (n_embd 128, 4 heads; 2 kv heads).
        let bytes = synthetic_gguf(&SyntheticSpec {
            seed: 5,
            n_embd: 128,
            n_ff: 160,
            ..Default::default()
        });
        let m = Model::from_gguf(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap();
        let fp = model_fingerprint(&m);
        let toks: Vec<u32> = (0..12).map(|i| i * 5 % 256).collect();
        let all = [KvType::F16, KvType::F32, KvType::Q8_0];
        for k in all {
            for v in all {
                let types = KvTypes::new(k, v);
                let mut st = m.new_state(64, types).unwrap();
                m.forward(&mut st, &toks, Logits::None).unwrap();
                let img = encode(&fp, &st, &toks[..10]).unwrap();
                let (l, w) = (st.kv().n_layer(), st.kv().kv_dim());
                let pc = decode(&img, &fp, types, l, w, 64).unwrap();
                let mut st2 = m.new_state(64, types).unwrap();
                assert_eq!(pc.restore(&mut st2, 7).unwrap(), 7);
                assert_eq!(
                    st2.kv().export_prefix(7),
                    st.kv().export_prefix(7),
                    "{types}"
                );
                // Same cached prefix, same next logits.
                let mut st3 = m.new_state(64, types).unwrap();
                m.forward(&mut st3, &toks[..7], Logits::None).unwrap();
                let a = m
                    .forward(&mut st2, &toks[7..9], Logits::Last)
                    .unwrap()
                    .to_vec();
                let b = m
                    .forward(&mut st3, &toks[7..9], Logits::Last)
                    .unwrap()
                    .to_vec();
                assert_eq!(a, b, "{types}");
                for k2 in all {
                    for v2 in all {
                        let other = KvTypes::new(k2, v2);
                        if other == types {
                            continue;
                        }
                        let e = decode(&img, &fp, other, l, w, 64)
                            .err()
                            .unwrap()
                            .to_string();
                        assert!(
                            e.contains(&types.to_string()) && e.contains(&other.to_string()),
                            "{e}"
                        );
                        let mut wrong = m.new_state(64, other).unwrap();
                        let e = pc.restore(&mut wrong, 3).unwrap_err().to_string();
                        assert!(e.contains(&types.to_string()), "{e}");
                    }
                }
            }
        }

        // A version 1 image: one type byte for both, then zeros.
        let mut st = m.new_state(64, KvType::F32).unwrap();
        m.forward(&mut st, &toks, Logits::None).unwrap();
        let mut img = encode(&fp, &st, &toks).unwrap();
        let body = img.len() - 32;
        img[8..12].copy_from_slice(&1u32.to_le_bytes());
        img[45] = 0; // in version 2 this would say "f16 values"
        let sum: [u8; 32] = Sha256::digest(&img[..body]).into();
        img[body..].copy_from_slice(&sum);
        let (l, w) = (st.kv().n_layer(), st.kv().kv_dim());
        let pc = decode(&img, &fp, KvType::F32, l, w, 64).unwrap();
        let mut st2 = m.new_state(64, KvType::F32).unwrap();
        assert_eq!(pc.restore(&mut st2, 12).unwrap(), 12);
        assert_eq!(st2.kv().export_prefix(12), st.kv().export_prefix(12));
        let e = decode(&img, &fp, KvTypes::new(KvType::F32, KvType::F16), l, w, 64)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("f32/f32"), "{e}");
    }
}
