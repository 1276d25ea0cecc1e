//! What the Saap file targets share: the model an index is bound to, and the wrapping that
//! turns a fuzzed body into a file whose header and SHA-256 are right (random bytes almost
//! never carry a valid checksum, so without it the fuzzer would only test the checksum).

use sha2::{Digest, Sha256};
use sparrow::model::ModelConfig;
use sparrow::synthetic::{synthetic_config, SyntheticSpec};
use std::sync::OnceLock;

/// The synthetic model's shapes and fingerprint (2 layers, 2 KV heads of 16).
pub fn saap_model() -> &'static ModelConfig {
    static CONFIG: OnceLock<ModelConfig> = OnceLock::new();
    CONFIG.get_or_init(|| synthetic_config(&SyntheticSpec::default()).unwrap())
}

/// A Saap file (index or record: both are magic, version, fingerprint, metadata length,
/// metadata, vectors, SHA-256) around `body` = metadata length (u16 LE), metadata,
/// vectors. A body too short for its length field is taken as all metadata.
pub fn wrap(magic: &[u8; 8], version: u32, fingerprint: &[u8; 32], body: &[u8]) -> Vec<u8> {
    let (meta_len, rest) = match body {
        [a, b, rest @ ..] => ((u16::from_le_bytes([*a, *b]) as usize).min(rest.len()), rest),
        _ => (body.len(), body),
    };
    let mut f = Vec::with_capacity(body.len() + 80);
    f.extend_from_slice(magic);
    f.extend_from_slice(&version.to_le_bytes());
    f.extend_from_slice(fingerprint);
    f.extend_from_slice(&(meta_len as u32).to_le_bytes());
    f.extend_from_slice(rest);
    let sum: [u8; 32] = Sha256::digest(&f).into();
    f.extend_from_slice(&sum);
    f
}

/// The body [`wrap`] takes for `meta` (JSON) and `vectors`: the inverse, for seeds.
pub fn body(meta: &[u8], vectors: &[u8]) -> Vec<u8> {
    let mut b = (meta.len() as u16).to_le_bytes().to_vec();
    b.extend_from_slice(meta);
    b.extend_from_slice(vectors);
    b
}
