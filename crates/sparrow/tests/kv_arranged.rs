//! A store that keeps layers grouped by bin (`ArrangedStore`) reads as a store kept by
//! position, bit for bit, for every policy — through prefill batches, decode steps,
//! rewinds, prompt-cache exports and imports — and Saap in bucket order keeps one copy of
//! the KV.

mod common;

use common::prefill_and_decode as run;

use common::{small_policies, small_spec};
use sparrow::attention::{KeysView, PlanContext, ReadPlan, SparsePolicy};
use sparrow::kv::Partition;
use sparrow::kv::{KvOptions, KvType, KvTypes};
use sparrow::synthetic::{synthetic_model, synthetic_tokens};

const N_CTX: usize = 512;

/// `inner`, its sealed rows placed in `bins` pseudo-random bins per KV head on every layer
/// but the first, in segments of `segment` positions: any placement must read back as the
/// positions it came from.
struct Placed {
    inner: Box<dyn SparsePolicy>,
    bins: usize,
    segment: usize,
    placed: Vec<u32>,
}

impl Placed {
    fn new(inner: Box<dyn SparsePolicy>, segment: usize) -> Box<Placed> {
        Box::new(Placed {
            inner,
            bins: 5,
            segment,
            placed: Vec::new(),
        })
    }
}

impl SparsePolicy for Placed {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn supports_prefill(&self) -> bool {
        self.inner.supports_prefill()
    }
    fn block_size(&self) -> Option<usize> {
        self.inner.block_size()
    }
    fn requires_block_selection(&self) -> bool {
        self.inner.requires_block_selection()
    }
    fn on_block_sealed(&mut self, layer: usize, block: usize, keys: KeysView<'_>) {
        self.inner.on_block_sealed(layer, block, keys);
        self.placed.clear();
        if layer > 0 {
            for h in 0..keys.kv_heads() {
                for r in 0..keys.rows() {
                    let x = (layer * 7919 + (block * keys.rows() + r) * 104_729 + h * 31) as u64;
                    let mixed = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                    self.placed.push((mixed % self.bins as u64) as u32);
                }
            }
        }
    }
    fn partition(&self, layer: usize) -> Option<Partition> {
        (layer > 0).then_some(Partition {
            bins: self.bins,
            segment: self.segment,
        })
    }
    fn placement(&self) -> Option<&[u32]> {
        (!self.placed.is_empty()).then_some(&self.placed[..])
    }
    fn forget_from(&mut self, pos: usize) {
        self.inner.forget_from(pos)
    }
    fn rewinds_exactly(&self) -> bool {
        self.inner.rewinds_exactly()
    }
    fn plan<'p>(&'p mut self, ctx: &PlanContext<'_>) -> ReadPlan<'p> {
        self.inner.plan(ctx)
    }
    fn wants_lse(&self) -> bool {
        self.inner.wants_lse()
    }
    fn after_attend(&mut self, ctx: &PlanContext<'_>, lse: &[f32]) {
        self.inner.after_attend(ctx, lse)
    }
}

#[test]
fn every_policy_reads_an_arranged_store_as_the_store_by_position() {
    let m = synthetic_model(&small_spec(5, N_CTX)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prompt = synthetic_tokens(300, 1);
    let types: [KvTypes; 3] = [
        KvType::F16.into(),
        KvType::F32.into(),
        KvTypes::new(KvType::Q8_0, KvType::F16),
    ];
    for (name, choice) in small_policies(&m, dir.path()) {
        // Saap in bucket order reads the store's own buckets: another placement would
        // hand it other rows (its own arrangement is tested below).
        if name == "saap in bucket order" {
            continue;
        }
        // Segments of whole blocks, and segments that end inside a block.
        for (types, segment) in types.into_iter().zip([48, 40, 64]) {
            let kv = KvOptions::from(types);
            let mut by_position = m.new_state(N_CTX, kv.clone()).unwrap();
            by_position.set_attention(choice.build(&m.config).unwrap());
            let placed = Placed::new(choice.build(&m.config).unwrap(), segment);
            let mut arranged = m.new_sequence_with(N_CTX, kv.clone(), placed).unwrap();
            let steps = synthetic_tokens(12, 2);
            let a = run(&m, &mut by_position, &prompt, 64, &steps);
            let b = run(&m, &mut arranged, &prompt, 64, &steps);
            assert!(a == b, "{name} {types}: logits differ");
            // Rewinds into the arranged rows, and past them, with other tokens.
            for keep in [150, 17, 80] {
                assert_eq!(by_position.truncate(keep), keep);
                assert_eq!(arranged.truncate(keep), keep);
                let more = synthetic_tokens(70, keep as u32);
                let a = run(&m, &mut by_position, &more, 40, &synthetic_tokens(5, 3));
                let b = run(&m, &mut arranged, &more, 40, &synthetic_tokens(5, 3));
                assert!(a == b, "{name} {types}: after a rewind to {keep}");
            }
            // Prompt-cache bytes are the same, and import into an arranged store.
            let n = by_position.n_past();
            let bytes = by_position.kv().export_prefix(n);
            assert!(
                arranged.kv().export_prefix(n) == bytes,
                "{name} {types}: export"
            );
            let placed = Placed::new(choice.build(&m.config).unwrap(), segment);
            let mut restored = m.new_sequence_with(N_CTX, kv.clone(), placed).unwrap();
            restored.import_prefix(n, &bytes).unwrap();
            let mut restored_by_position = m.new_state(N_CTX, kv).unwrap();
            restored_by_position.set_attention(choice.build(&m.config).unwrap());
            restored_by_position.import_prefix(n, &bytes).unwrap();
            let steps = synthetic_tokens(6, 4);
            let a = run(&m, &mut by_position, &[], 1, &steps);
            let b = run(&m, &mut restored, &[], 1, &steps);
            let c = run(&m, &mut restored_by_position, &[], 1, &steps);
            assert!(b == c, "{name} {types}: importing a prefix");
            // The sketch chooses its channels at the first step after a prompt, so a
            // sequence restored mid-answer reads other keys than the one that went on.
            if name != "sketch" {
                assert!(a == b, "{name} {types}: after importing a prefix");
            }
        }
    }
}

/// Saap in bucket order keeps one copy of the KV (the store's, arranged), and its reads
/// do not depend on the rewinds that led to the store's contents: a sequence rewound and
/// refilled gives the logits of one filled afresh, bit for bit.
#[test]
fn saap_in_bucket_order_keeps_one_copy_and_rewinds_exactly() {
    let m = synthetic_model(&small_spec(6, N_CTX)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policies = small_policies(&m, dir.path());
    let choice = |name: &str| policies.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let (buckets, positions) = (choice("saap in bucket order"), choice("saap"));
    let kv = KvOptions::from(KvType::F16);
    let prompt = synthetic_tokens(400, 7);
    let mut arranged = m.new_sequence(N_CTX, kv.clone(), &buckets).unwrap();
    let mut scattered = m.new_sequence(N_CTX, kv.clone(), &positions).unwrap();
    let steps = synthetic_tokens(20, 8);
    let a = run(&m, &mut arranged, &prompt, 100, &steps);
    let b = run(&m, &mut scattered, &prompt, 100, &steps);
    // The same keys are read in another order: equal to rounding.
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "bucket order moved a logit by {worst}");
    let (one, other) = (
        arranged.kv().bytes_resident(),
        scattered.kv().bytes_resident(),
    );
    assert!(
        (one as f64) < 1.25 * other as f64,
        "{one} bytes in bucket order against {other} by position: a second copy?"
    );
    // Rewound and refilled against filled afresh.
    assert_eq!(arranged.truncate(123), 123);
    let tail: Vec<u32> = prompt[123..].to_vec();
    let again = run(&m, &mut arranged, &tail, 50, &steps);
    let mut fresh = m.new_sequence(N_CTX, kv, &buckets).unwrap();
    let want = run(&m, &mut fresh, &prompt, 100, &steps);
    let n = steps.len();
    assert!(
        again[again.len() - n * m.config.vocab_size..]
            == want[want.len() - n * m.config.vocab_size..],
        "a rewound store reads in another order than a fresh one"
    );
}
