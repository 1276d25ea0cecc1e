//! Saap training records (`ContextRecord::decode`, what `sparrow saap train --records DIR`
//! reads): raw bytes through every check, and — mode bit set — a fuzzed body (metadata JSON
//! and vectors) wrapped as a file with the right magic, version and checksum. A record
//! that loads must hold one key and one query block per layer of the sizes its metadata
//! states, every key and query row must be readable by the accessors the trainer uses,
//! and rotated by the recorded RoPE as the trainer does, and it must encode to an image
//! that decodes to the same record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparrow::saap::record::{ContextRecord, MAGIC, VERSION};
use sparrow_fuzz::saap_files::wrap;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        wrap(MAGIC, VERSION, &[7; 32], rest)
    };
    let Ok(rec) = ContextRecord::decode(&bytes) else {
        return;
    };
    let m = &rec.meta;
    // The trainer groups query heads by KV head and rotates key rows by the recorded RoPE.
    assert!(m.n_head_kv > 0 && m.n_head % m.n_head_kv == 0, "heads {m:?}");
    let rope = m.rope.rope();
    assert_eq!(rec.keys.len(), m.n_layer, "key blocks");
    assert_eq!(rec.queries.len(), m.n_layer, "query blocks");
    for layer in 0..m.n_layer {
        assert_eq!(rec.keys[layer].len(), m.n_tokens * m.n_head_kv * m.head_dim);
        assert_eq!(
            rec.queries[layer].len(),
            m.query_positions.len() * m.n_head * m.head_dim
        );
        // The rows the trainer reads: each query position's key, every query row.
        for (i, &p) in m.query_positions.iter().enumerate().take(4) {
            for h in 0..m.n_head_kv.min(4) {
                let mut row = rec.key(layer, h, p).to_vec();
                assert_eq!(row.len(), m.head_dim);
                rope.rotate(&mut row, m.head_dim, p);
            }
            for h in 0..m.n_head.min(4) {
                assert_eq!(rec.query(layer, h, i).len(), m.head_dim);
            }
        }
    }
    let again = ContextRecord::decode(&rec.encode()).unwrap();
    assert_eq!(again.meta, rec.meta);
    assert_eq!(again.fingerprint, rec.fingerprint);
    assert!(again.keys == rec.keys || rec.keys.iter().flatten().any(|v| v.is_nan()));
});
