//! Prompt-cache files: arbitrary bytes through the loader's checks, and — since random
//! bytes almost never carry a valid SHA-256 — the same bytes wrapped as a well-formed file
//! for the synthetic model (header, tokens, K/V rows and checksum made right), restored
//! into a state and decoded from. Any KV bits (NaN, infinities) and any token ids must be
//! taken without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};
use sparrow::prompt_cache::{self, MAGIC, VERSION};
use sparrow::{KvType, Logits};
use sparrow_fuzz::small_model;

const N_CTX: usize = 32;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let model = small_model();
    let kv_type = [KvType::F16, KvType::F32, KvType::Q8_0][(mode as usize >> 1) % 3];
    let mut state = model.new_state(N_CTX, kv_type).unwrap();
    let (n_layer, kv_dim) = (model.config.n_layer, model.config.kv_dim());
    let fp = prompt_cache::model_fingerprint(model);
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        // A well-formed file around the fuzzed body: n tokens, then their K/V rows.
        let row = state.kv().bytes_per_token();
        let n = (rest.len() / (4 + row)).min(N_CTX);
        let mut f = Vec::new();
        f.extend_from_slice(MAGIC);
        f.extend_from_slice(&VERSION.to_le_bytes());
        f.extend_from_slice(&fp);
        let code = match kv_type {
            KvType::F16 => 0u8,
            KvType::F32 => 1,
            KvType::Q8_0 => 2,
        };
        f.extend_from_slice(&[code, code, 0, 0]);
        for v in [n_layer, kv_dim, n] {
            f.extend_from_slice(&(v as u32).to_le_bytes());
        }
        f.extend_from_slice(&rest[..n * (4 + row)]);
        let sum: [u8; 32] = Sha256::digest(&f).into();
        f.extend_from_slice(&sum);
        f
    };
    let loaded = prompt_cache::decode(&bytes, &fp, state.kv().types(), n_layer, kv_dim, N_CTX);
    let cache = match loaded {
        Ok(c) => c,
        Err(e) => {
            assert!(mode & 1 == 0, "a well-formed file was refused: {e}");
            return;
        }
    };
    let n = cache.len();
    assert_eq!(cache.restore(&mut state, n).unwrap(), n);
    assert_eq!(state.n_past(), n);
    if n < N_CTX {
        let _ = model.forward(&mut state, &[1], Logits::Last);
    }
});
