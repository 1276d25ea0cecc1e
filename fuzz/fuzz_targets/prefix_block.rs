//! Prefix cache block files: arbitrary bytes through the reader's checks, and — since random
//! bytes almost never carry a valid SHA-256 — the same bytes wrapped as a well-formed file
//! of the synthetic model's cache (header, presence flags, rows and checksum made right),
//! then imported into a state as a cached prefix and decoded from. Any presence flags, any
//! row bits (NaN, infinities) must be taken without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparrow::attention::AttentionChoice;
use sparrow::prefix_cache::{self, Block, BlockFormat, BlockShape, Rows};
use sparrow::{KvType, Logits};
use sparrow_fuzz::small_model;

const N_CTX: usize = 32;
const BLOCK: usize = 4;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let model = small_model();
    let kv_type = [KvType::F16, KvType::F32, KvType::Q8_0][(mode as usize >> 1) % 3];
    let Ok(mut state) = model.new_state(N_CTX, kv_type) else {
        return;
    };
    let shape = BlockShape::of(state.kv(), BLOCK);
    let format = BlockFormat {
        root: prefix_cache::root(
            &model.config.fingerprint,
            &shape,
            &AttentionChoice::default(),
        ),
        shape: shape.clone(),
    };
    let key = [7u8; 32];
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        // A well-formed file around the fuzzed body: presence flags, then as many rows.
        let (flags, rows) = rest.split_at(rest.len().min(shape.n_layer));
        let mut present: Vec<bool> = flags.iter().map(|f| f & 1 == 1).collect();
        present.resize(shape.n_layer, true);
        let want = present.iter().filter(|&&p| p).count() * shape.layer_bytes();
        let mut data = rows.to_vec();
        data.resize(want, 0);
        let mut file = Vec::new();
        format
            .write(
                &key,
                0,
                &Block {
                    present,
                    data: Rows::Owned(data),
                },
                &mut file,
            )
            .unwrap();
        file
    };
    let Ok(block) = format.read(&key, bytes) else {
        return;
    };
    let rows: Vec<usize> = (0..shape.n_layer)
        .map(|l| state.kv().layer_rows(l))
        .collect();
    // A block without every layer cannot make a prefix: refused, never half-imported.
    let Some(prefix) = prefix_cache::assemble(&[&block], &shape, &rows) else {
        assert!(block.present.iter().any(|&p| !p));
        return;
    };
    state.import_prefix(BLOCK, &prefix).unwrap();
    let _ = model.forward(&mut state, &[1], Logits::Last);
});
