//! Saap index files (`SaapIndex::decode`, what `--attn saap` and `--saap-index FILE` read):
//! raw bytes through every check, and — mode bit set — a fuzzed body (metadata JSON and
//! vectors) wrapped as a file with the right magic, version, fingerprint and checksum.
//! An index that loads must have one model per (layer, KV head) of the model's shapes, all
//! finite, must route a query without a panic, and must encode back to the same image
//! that it decodes from again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparrow::saap::index::{SaapIndex, MAGIC, VERSION};
use sparrow_fuzz::saap_files::{saap_model, wrap};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let model = saap_model();
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        wrap(MAGIC, VERSION, &model.fingerprint, rest)
    };
    let Ok(index) = SaapIndex::decode(&bytes, model) else {
        return;
    };
    let m = &index.meta;
    assert_eq!(
        (m.n_layer, m.n_head_kv, m.head_dim),
        (model.n_layer, model.n_head_kv, model.head_dim)
    );
    assert_eq!(index.heads.len(), m.n_layer * m.n_head_kv);
    for layer in 0..m.n_layer {
        for kv_head in 0..m.n_head_kv {
            let head = index.head(layer, kv_head);
            assert_eq!(head.clusters(), m.clusters);
            assert_eq!(head.hidden(), m.hidden);
            assert_eq!(head.head_dim(), m.head_dim);
        }
    }
    let again = index.encode();
    assert_eq!(SaapIndex::decode(&again, model).unwrap(), index);
});
