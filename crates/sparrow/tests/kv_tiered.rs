//! The cold KV tier on a synthetic model: a store keeping a RAM budget (down to one block)
//! and the rest in a file gives the RAM store's logits bit for bit — through prefill in
//! batches, decode, rewinds and prompt-cache export/import, for every cache type and for
//! exact and selecting policies — and every failure (no room, a short write, an unusable
//! directory, a budget below the minimum) is an error naming it.

mod common;

use common::prefill_and_decode as run;

use sparrow::attention::AttentionChoice;
use sparrow::kv::KvStore;
use sparrow::kv::{minimum_budget, ColdTier, ColdWrite, KvOptions, TieredStore};
use sparrow::policy::quest::QuestSettings;
use sparrow::policy::saap::Layout;
use sparrow::synthetic::{synthetic_model, synthetic_tokens, SyntheticSpec};
use sparrow::{KvType, KvTypes, Model, State};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const N_CTX: usize = 640;

/// Head size 32 so Q8_0 caches apply; three layers.
fn model() -> Model {
    let spec = SyntheticSpec {
        n_layer: 3,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 2,
        context_length: N_CTX,
        seed: 23,
        ..Default::default()
    };
    synthetic_model(&spec).unwrap()
}

fn quest() -> AttentionChoice {
    AttentionChoice {
        name: "quest".into(),
        ..Default::default()
    }
    .with(QuestSettings {
        page: 16,
        budget: 64,
        dense_layers: vec![0],
        rerank: 0,
    })
}

/// Every policy the tiered store must serve as the RAM store does: full, Quest, the sketch
/// ranked and with its weighted sample, Saap in both layouts (indexes written into `dir`).
fn policies(m: &Model, dir: &std::path::Path) -> Vec<AttentionChoice> {
    let mut all = vec![
        full(),
        quest(),
        common::small_sketch(64),
        common::small_sketch_sampling(64, 75),
    ];
    all.extend([Layout::Positions, Layout::Buckets].map(|l| saap(m, dir, l)));
    all
}

/// Saap over a random index (8 buckets, 2 visited): see [`common::random_saap`].
fn saap(m: &Model, dir: &std::path::Path, layout: Layout) -> AttentionChoice {
    common::random_saap(m, &dir.join("random.saap"), (8, 2, 7), layout)
}

fn full() -> AttentionChoice {
    AttentionChoice::default()
}

fn tier(budget: usize) -> Option<ColdTier> {
    Some(ColdTier {
        ram_budget: budget,
        dir: None,
    })
}

/// The smallest budget this model's store takes for `types` (one block of recent rows).
fn min_budget(m: &Model, types: KvTypes) -> usize {
    let rings = vec![None; m.config.n_layer];
    minimum_budget(types, &rings, N_CTX, m.config.kv_dim(), 0)
}

/// A sequence running `choice`, made as `run` makes one: the policy's summaries are charged
/// to the RAM budget (`Model::new_sequence`).
fn sequence(m: &Model, types: KvTypes, cold: Option<ColdTier>, choice: &AttentionChoice) -> State {
    let kv = KvOptions {
        types,
        cold,
        reserved: 0,
    };
    m.new_sequence(N_CTX, kv, choice).unwrap()
}

/// RAM beside the recent rows at `N_CTX`: see [`common::ram_beside_rows`].
fn summaries(m: &Model, choice: &AttentionChoice, types: KvTypes) -> (usize, usize) {
    common::ram_beside_rows(m, choice, types, N_CTX)
}

fn type_sets() -> [KvTypes; 3] {
    [
        KvType::F16.into(),
        KvType::F32.into(),
        KvTypes::new(KvType::Q8_0, KvType::F16),
    ]
}

#[test]
fn tiered_store_gives_the_ram_stores_logits_bit_for_bit() {
    let m = model();
    let prompt = synthetic_tokens(420, 1);
    let steps = synthetic_tokens(24, 2);
    let dir = tempfile::tempdir().unwrap();
    for types in type_sets() {
        let min = min_budget(&m, types);
        let row = (types.k.row_bytes(m.config.kv_dim()) + types.v.row_bytes(m.config.kv_dim()))
            * m.config.n_layer;
        let mut exact = None;
        for choice in &policies(&m, dir.path()) {
            let mut ram = sequence(&m, types, None, choice);
            let want = run(&m, &mut ram, &prompt, 100, &steps);
            // The selecting policies must really select here, or this tests only full.
            match &exact {
                None => exact = Some(want.clone()),
                Some(f) => assert!(f != &want, "{} read every position", choice.name),
            }
            let (need, open) = summaries(&m, choice, types);
            for budget in [min, min + 3 * 16 * row, min + 200 * row].map(|b| b + need + open) {
                let mut s = sequence(&m, types, tier(budget), choice);
                let got = run(&m, &mut s, &prompt, 100, &steps);
                assert!(
                    got == want,
                    "{types} {} budget {budget}: logits differ",
                    choice.name
                );
                // The summaries' share of the budget is not the store's to use (the store's
                // resident bytes include its open segments and maps).
                let kv = s.kv();
                assert!(
                    kv.bytes_resident() + need <= budget,
                    "{} {} + {need} > {budget}",
                    choice.name,
                    kv.bytes_resident()
                );
                assert!(
                    kv.bytes_cold() >= (prompt.len() + steps.len()) * row / 2,
                    "{types} budget {budget}: only {} bytes went cold",
                    kv.bytes_cold()
                );
            }
        }
    }
}

#[test]
fn rewinds_and_prefix_imports_match_the_ram_store() {
    let m = model();
    let types: KvTypes = KvType::F16.into();
    let min = min_budget(&m, types);
    let prompt = synthetic_tokens(300, 3);
    let dir = tempfile::tempdir().unwrap();
    for choice in &policies(&m, dir.path()) {
        let choice = choice.clone();
        let budget = min + {
            let (need, open) = summaries(&m, &choice, types);
            need + open
        };
        let mut ram = sequence(&m, types, None, &choice);
        let mut cold = sequence(&m, types, tier(budget), &choice);
        let a = run(&m, &mut ram, &prompt, 64, &synthetic_tokens(10, 4));
        let b = run(&m, &mut cold, &prompt, 64, &synthetic_tokens(10, 4));
        assert!(a == b);
        // Back into the cold part, then past where the ring was, with other tokens.
        for keep in [100, 150, 17] {
            assert_eq!(ram.truncate(keep), keep);
            assert_eq!(cold.truncate(keep), keep);
            let more = synthetic_tokens(90, keep as u32);
            let a = run(&m, &mut ram, &more, 40, &synthetic_tokens(6, 5));
            let b = run(&m, &mut cold, &more, 40, &synthetic_tokens(6, 5));
            assert!(a == b, "{} after a rewind to {keep}", choice.name);
        }
        // Prompt-cache bytes: the same from both stores, and importable into either.
        let n = ram.n_past();
        let bytes = ram.kv().export_prefix(n);
        assert!(cold.kv().export_prefix(n) == bytes);
        let mut restored = sequence(&m, types, tier(budget), &choice);
        restored.import_prefix(n, &bytes).unwrap();
        let mut restored_ram = sequence(&m, types, None, &choice);
        restored_ram.import_prefix(n, &bytes).unwrap();
        let steps = synthetic_tokens(8, 6);
        let a = run(&m, &mut restored_ram, &[], 1, &steps);
        let b = run(&m, &mut restored, &[], 1, &steps);
        assert!(a == b, "{} after importing a prefix", choice.name);
        // A sequence that goes on decoding is a restored one too — except for the sketch,
        // which chooses its channels again at a restored sequence's first step (its docs).
        if choice.name != "sketch" {
            let c = run(&m, &mut ram, &[], 1, &steps);
            assert!(c == b, "{} going on vs imported", choice.name);
        }
    }
}

#[test]
fn budgets_and_directories_that_cannot_work_are_refused_by_name() {
    let m = model();
    let types: KvTypes = KvType::F16.into();
    let min = min_budget(&m, types);
    let err = |kv: KvOptions| m.new_state(N_CTX, kv).err().expect("refused").to_string();
    let e = err(KvOptions {
        types,
        cold: tier(min - 1),
        reserved: 0,
    });
    assert!(
        e.contains("--kv-ram-budget") && e.contains("too small"),
        "{e}"
    );
    // Summaries the policy reserves count against the budget.
    let e = err(KvOptions {
        types,
        cold: tier(min),
        reserved: 1,
    });
    assert!(e.contains("too small"), "{e}");
    let file = tempfile::NamedTempFile::new().unwrap();
    for dir in [file.path().to_path_buf(), "/nonexistent/sparrow-kv".into()] {
        let e = err(KvOptions {
            types,
            cold: Some(ColdTier {
                ram_budget: min,
                dir: Some(dir.clone()),
            }),
            reserved: 0,
        });
        assert!(
            e.contains("cannot create the cold KV file") && e.contains(&*dir.to_string_lossy()),
            "{e}"
        );
    }
    // A budget covering Quest's page bounds, through `new_sequence`.
    let need = quest()
        .build(&m.config)
        .unwrap()
        .summary_bytes(N_CTX, m.config.kv_dim());
    assert!(need > 0);
    let kv = |budget| KvOptions {
        types,
        cold: tier(budget),
        reserved: 0,
    };
    assert!(m.new_sequence(N_CTX, kv(min + need - 1), &quest()).is_err());
    assert!(m.new_sequence(N_CTX, kv(min + need), &quest()).is_ok());
}

/// The store's own file, behind a disk that takes `room` more bytes and then says it is
/// full, at most `max_per_call` bytes a call (short writes).
struct FaultyDisk {
    inner: Box<dyn ColdWrite>,
    room: Arc<AtomicUsize>,
    max_per_call: usize,
}

impl ColdWrite for FaultyDisk {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let room = self.room.load(Ordering::SeqCst);
        if room == 0 {
            return Err(io::Error::from_raw_os_error(28)); // ENOSPC
        }
        let n = buf.len().min(room).min(self.max_per_call);
        let n = self.inner.write_at(&buf[..n], offset)?;
        self.room.fetch_sub(n, Ordering::SeqCst);
        Ok(n)
    }
}

struct StopsShort;

impl ColdWrite for StopsShort {
    fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<usize> {
        Ok(0)
    }
}

fn store(kv_dim: usize, budget: usize) -> TieredStore {
    TieredStore::new(
        KvType::F16.into(),
        &[None, None],
        256,
        kv_dim,
        kv_dim,
        &ColdTier {
            ram_budget: budget,
            dir: None,
        },
        0,
    )
    .unwrap()
}

/// Append positions `0..n` (values derived from the position) until one fails.
fn fill(s: &mut TieredStore, kv_dim: usize, n: usize) -> Result<(), String> {
    for p in 0..n {
        let k: Vec<f32> = (0..kv_dim).map(|i| (p * 7 + i) as f32 * 0.01).collect();
        let v: Vec<f32> = (0..kv_dim).map(|i| (p * 3 + i) as f32 * -0.02).collect();
        for l in 0..2 {
            s.append(l, p, &k, &v)?;
        }
    }
    Ok(())
}

fn faulty(
    room: &Arc<AtomicUsize>,
    max_per_call: usize,
) -> impl FnOnce(Box<dyn ColdWrite>) -> Box<dyn ColdWrite> {
    let room = room.clone();
    move |inner| {
        Box::new(FaultyDisk {
            inner,
            room,
            max_per_call,
        })
    }
}

#[test]
fn a_full_disk_or_a_write_that_stops_short_is_an_error_and_short_writes_are_finished() {
    let kv_dim = 64;
    let budget = minimum_budget(KvType::F16.into(), &[None, None], 256, kv_dim, 0);
    let mut reference = store(kv_dim, 1 << 30);
    fill(&mut reference, kv_dim, 200).unwrap();
    // Short writes (100 bytes a call) are finished: the file reads back what was written.
    let mut s = store(kv_dim, budget);
    s.wrap_writer(faulty(&Arc::new(AtomicUsize::new(usize::MAX)), 100));
    fill(&mut s, kv_dim, 200).unwrap();
    assert!(s.bytes_cold() > 0);
    assert!(s.export_prefix(200) == reference.export_prefix(200));
    // A full disk: the append that needs the disk fails, naming the cause and positions;
    // with room again, appending from there on reads back right.
    let mut s = store(kv_dim, budget);
    let room = Arc::new(AtomicUsize::new(5000));
    s.wrap_writer(faulty(&room, usize::MAX));
    let e = fill(&mut s, kv_dim, 200).unwrap_err();
    assert!(
        e.contains("No space left on device")
            && e.contains("cold KV file")
            && e.contains("positions"),
        "{e}"
    );
    room.store(usize::MAX, Ordering::SeqCst);
    fill(&mut s, kv_dim, 200).unwrap();
    assert!(s.export_prefix(200) == reference.export_prefix(200));
    // A write that makes no progress is an error, not a loop.
    let mut s = store(kv_dim, budget);
    s.wrap_writer(|_| Box::new(StopsShort));
    let e = fill(&mut s, kv_dim, 200).unwrap_err();
    assert!(e.contains("stopped short"), "{e}");
}
