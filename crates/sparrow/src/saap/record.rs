//! What `sparrow saap collect` records from one training context, and its file.
//!
//! Per layer: every position's key and the query rows of sampled positions, both
//! *de-roped* (RoPE undone), which is the space Saap partitions and classifies in. The
//! true attention a training query pays each key is recomputed by the trainer: rotating a
//! de-roped key and query again by their positions ([`RopeParams`]) costs less than storing
//! a second, rotated copy of every key (which would double the file).
//!
//! Layout (integers little-endian, floats f32 little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `SPRWSAPC` |
//! | 4 | format version ([`VERSION`]) |
//! | 32 | model fingerprint |
//! | 4 | length `m` of the metadata |
//! | m | metadata, JSON ([`RecordMeta`]) |
//! | … | per layer: keys `n_tokens × n_head_kv × head_dim`, then queries `queries × n_head × head_dim` |
//! | 32 | SHA-256 of everything above |

use crate::model::config::RopeLayout;
use crate::model::rope::Rope;
use crate::model::ModelConfig;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;

/// File magic.
pub const MAGIC: &[u8; 8] = b"SPRWSAPC";
/// Format version written and read.
pub const VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 32 + 4;

/// RoPE's parameters as recorded (to rotate de-roped vectors again).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeParams {
    pub n_rot: usize,
    pub base: f32,
    pub freq_scale: f32,
    /// Dimensions paired as (i, i + n_rot/2) when true (NeoX), adjacent otherwise.
    pub neox: bool,
}

impl RopeParams {
    /// The recorded rotation.
    pub fn rope(&self) -> Rope {
        Rope {
            n_rot: self.n_rot,
            base: self.base,
            freq_scale: self.freq_scale,
            layout: if self.neox {
                RopeLayout::Neox
            } else {
                RopeLayout::Normal
            },
        }
    }

    /// The parameters of `config`'s model.
    pub fn of(config: &ModelConfig) -> RopeParams {
        RopeParams {
            n_rot: config.n_rot,
            base: config.rope_base,
            freq_scale: config.rope_freq_scale,
            neox: config.rope_layout == RopeLayout::Neox,
        }
    }
}

/// A record's shapes and provenance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordMeta {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Positions recorded (keys of `0..n_tokens`).
    pub n_tokens: usize,
    /// Position of each recorded query row.
    pub query_positions: Vec<usize>,
    pub rope: RopeParams,
    /// Where the text came from (file and token offset).
    pub source: String,
}

impl RecordMeta {
    /// The shapes a reader relies on — at least one layer, query heads in whole groups per
    /// KV head, a RoPE that fits the head (the trainer rotates every key row by it) — and
    /// the values per layer, counted without overflow. A record's metadata comes from a
    /// file, so each of these is checked, not assumed.
    fn check(&self) -> Result<usize, RecordError> {
        let bad = |m: String| Err(RecordError::Meta(m));
        if self.n_layer == 0 || self.n_head_kv == 0 || self.head_dim == 0 {
            return bad("a zero layer count, KV head count or head size".into());
        }
        if self.n_head == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "{} query heads do not group over {} KV heads",
                self.n_head, self.n_head_kv
            ));
        }
        let r = &self.rope;
        if !r.n_rot.is_multiple_of(2) || r.n_rot > self.head_dim {
            return bad(format!(
                "RoPE over {} dimensions of a head of {} (even, at most the head)",
                r.n_rot, self.head_dim
            ));
        }
        if !(r.base.is_finite() && r.base > 0.0 && r.freq_scale.is_finite()) {
            return bad(format!(
                "RoPE base {} and scale {} (finite, base positive)",
                r.base, r.freq_scale
            ));
        }
        let keys = self
            .n_tokens
            .checked_mul(self.n_head_kv)
            .and_then(|x| x.checked_mul(self.head_dim));
        let queries = self
            .query_positions
            .len()
            .checked_mul(self.n_head)
            .and_then(|x| x.checked_mul(self.head_dim));
        keys.zip(queries)
            .and_then(|(k, q)| k.checked_add(q))
            .ok_or_else(|| RecordError::Meta("shapes overflow".into()))
    }
}

/// One training context's de-roped keys and sampled queries.
#[derive(Clone, Debug, PartialEq)]
pub struct ContextRecord {
    pub meta: RecordMeta,
    pub fingerprint: [u8; 32],
    /// Per layer: `n_tokens × n_head_kv × head_dim`.
    pub keys: Vec<Vec<f32>>,
    /// Per layer: `queries × n_head × head_dim`.
    pub queries: Vec<Vec<f32>>,
}

/// Why a record file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("Saap training record {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("not a Saap training record (bad magic or too short)")]
    BadMagic,
    #[error("Saap training record format version {0} is not supported (this sparrow reads version {VERSION})")]
    Version(u32),
    #[error("Saap training record checksum mismatch: the file is truncated or corrupted")]
    Checksum,
    #[error("Saap training record metadata is invalid: {0}")]
    Meta(String),
}

impl ContextRecord {
    /// Key of `position` for `kv_head` in `layer` (de-roped).
    pub fn key(&self, layer: usize, kv_head: usize, position: usize) -> &[f32] {
        let (hd, kv) = (self.meta.head_dim, self.meta.n_head_kv);
        &self.keys[layer][(position * kv + kv_head) * hd..][..hd]
    }

    /// Query row `i` (of [`RecordMeta::query_positions`]) of `head` in `layer` (de-roped).
    pub fn query(&self, layer: usize, head: usize, i: usize) -> &[f32] {
        let (hd, nh) = (self.meta.head_dim, self.meta.n_head);
        &self.queries[layer][(i * nh + head) * hd..][..hd]
    }

    /// The file image.
    pub fn encode(&self) -> Vec<u8> {
        let meta = serde_json::to_vec(&self.meta).expect("record metadata serialises");
        let mut out = Vec::with_capacity(
            HEADER
                + meta.len()
                + 4 * self
                    .keys
                    .iter()
                    .chain(&self.queries)
                    .map(Vec::len)
                    .sum::<usize>()
                + 32,
        );
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.fingerprint);
        out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        out.extend_from_slice(&meta);
        for (k, q) in self.keys.iter().zip(&self.queries) {
            for v in k.iter().chain(q) {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        let sum: [u8; 32] = Sha256::digest(&out).into();
        out.extend_from_slice(&sum);
        out
    }

    /// Parse and check a record image.
    pub fn decode(bytes: &[u8]) -> Result<ContextRecord, RecordError> {
        if bytes.len() < HEADER + 32 || &bytes[..8] != MAGIC {
            return Err(RecordError::BadMagic);
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(RecordError::Version(version));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if Sha256::digest(body).as_slice() != sum {
            return Err(RecordError::Checksum);
        }
        let fingerprint: [u8; 32] = bytes[12..44].try_into().expect("32 bytes");
        let meta_len = u32::from_le_bytes(bytes[44..48].try_into().expect("4 bytes")) as usize;
        let meta_bytes = body
            .get(HEADER..HEADER.saturating_add(meta_len))
            .ok_or_else(|| RecordError::Meta("metadata runs past the end".into()))?;
        let meta: RecordMeta =
            serde_json::from_slice(meta_bytes).map_err(|e| RecordError::Meta(e.to_string()))?;
        let per_layer = meta.check()?;
        let data = &body[HEADER + meta_len..];
        if Some(data.len())
            != per_layer
                .checked_mul(4)
                .and_then(|b| b.checked_mul(meta.n_layer))
        {
            return Err(RecordError::Meta(format!(
                "{} bytes of vectors for {} layers of {per_layer} values",
                data.len(),
                meta.n_layer
            )));
        }
        if meta
            .query_positions
            .iter()
            .any(|&p| p == 0 || p >= meta.n_tokens)
        {
            return Err(RecordError::Meta(
                "a query position at 0 (no key past the sink) or past the keys".into(),
            ));
        }
        let n_keys = meta.n_tokens * meta.n_head_kv * meta.head_dim;
        let (mut keys, mut queries) = (Vec::new(), Vec::new());
        for layer in data.chunks_exact(4 * per_layer.max(1)) {
            let v: Vec<f32> = layer
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect();
            keys.push(v[..n_keys].to_vec());
            queries.push(v[n_keys..].to_vec());
        }
        Ok(ContextRecord {
            meta,
            fingerprint,
            keys,
            queries,
        })
    }

    /// Write the record to `path`.
    pub fn save(&self, path: &Path) -> Result<(), RecordError> {
        std::fs::write(path, self.encode()).map_err(|source| RecordError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Read the record at `path`.
    pub fn load(path: &Path) -> Result<ContextRecord, RecordError> {
        let bytes = std::fs::read(path).map_err(|source| RecordError::Io {
            path: path.display().to_string(),
            source,
        })?;
        ContextRecord::decode(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of 2 layers, 4 query heads over 2 KV heads of 16, 6 positions, 2 queries.
    fn record() -> ContextRecord {
        let (n_layer, n_head, n_head_kv, d, n_tokens) = (2, 4, 2, 16, 6);
        let positions = vec![2, 5];
        ContextRecord {
            meta: RecordMeta {
                n_layer,
                n_head,
                n_head_kv,
                head_dim: d,
                n_tokens,
                query_positions: positions.clone(),
                rope: RopeParams {
                    n_rot: d,
                    base: 10000.0,
                    freq_scale: 1.0,
                    neox: true,
                },
                source: "test".into(),
            },
            fingerprint: [7; 32],
            keys: vec![vec![0.5; n_tokens * n_head_kv * d]; n_layer],
            queries: vec![vec![-0.5; positions.len() * n_head * d]; n_layer],
        }
    }

    #[test]
    fn round_trips() {
        let r = record();
        assert_eq!(ContextRecord::decode(&r.encode()).unwrap(), r);
    }

    /// Found by the `saap_record` fuzz target: a RoPE over 26 dimensions of a head of 16
    /// loaded, and the trainer's rotation indexed past the row. Metadata that no reader
    /// can use is refused at load, with what is wrong.
    #[test]
    fn unusable_shapes_are_refused() {
        type Edit = fn(&mut RecordMeta);
        let cases: [(&str, Edit); 6] = [
            ("RoPE over 26", |m| m.rope.n_rot = 26),
            ("RoPE over 15", |m| m.rope.n_rot = 15),
            ("RoPE base", |m| m.rope.base = -1.0),
            ("do not group", |m| m.n_head = 3),
            ("zero layer", |m| m.n_head_kv = 0),
            ("overflow", |m| {
                m.n_layer = usize::MAX / 2;
                m.n_head = usize::MAX / 2;
                m.n_head_kv = 1;
            }),
        ];
        for (want, edit) in cases {
            let mut r = record();
            edit(&mut r.meta);
            let e = ContextRecord::decode(&r.encode()).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
