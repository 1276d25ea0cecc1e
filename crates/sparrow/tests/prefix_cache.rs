//! The shared prefix cache on synthetic models: a prefix restored from it — from RAM, from
//! its directory, after a restart — continues exactly as the same prefix computed in the
//! same batches (logits equal to the bit), for every KV type, sparse decode and prefill
//! policies and a cold tier; damaged or foreign files are never used; the disk and RAM
//! budgets hold; the scheduler computes a shared prefix once.

mod common;

use sparrow::attention::AttentionChoice;
use sparrow::kv::{ColdTier, KvOptions, KvTypes};
use sparrow::prefix_cache::{PrefixCache, PrefixCacheConfig, PrefixCacheStats, ScanReport};
use sparrow::scheduler::{reply_channel, Config, Event, Job, Scheduler};
use sparrow::synthetic::{synthetic_gguf, synthetic_tokens};
use sparrow::{Engine, Generation, KvType, Logits, Model, Sampler, SamplerConfig, Session, State};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const N_CTX: usize = 512;
/// Positions per cached block, and per forward pass on every side of a comparison.
const BLOCK: usize = 16;

fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sparrow-prefix-cache-{}-{name}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn engine(seed: u64) -> Engine {
    let path = scratch("model").join("synthetic.gguf");
    std::fs::write(&path, synthetic_gguf(&common::small_spec(seed, N_CTX))).unwrap();
    Engine::load(&path).unwrap()
}

/// Full attention, and the decode and prefill policies that keep summaries of the rows
/// (rebuilt from imported rows).
fn choices(m: &Model) -> Vec<(&'static str, AttentionChoice)> {
    common::small_policies(m, &scratch("saap"))
}

/// A sequence; `cold`: under a RAM budget of a few blocks (plus what the policy's
/// summaries and a store in bucket order keep in RAM), the rest of the rows in files.
fn sequence(m: &Model, choice: &AttentionChoice, types: KvTypes, cold: bool) -> State {
    let (summaries, open) = common::ram_beside_rows(m, choice, types, N_CTX);
    let beside = summaries + open;
    let kv = KvOptions {
        types,
        cold: cold.then(|| ColdTier {
            ram_budget: (112 << 10) + beside,
            dir: None,
        }),
        reserved: 0,
    };
    m.new_sequence(N_CTX, kv, choice).unwrap()
}

fn config(ram_bytes: u64, dir: Option<&Path>, disk_bytes: u64) -> PrefixCacheConfig {
    PrefixCacheConfig {
        ram_bytes,
        dir: dir.map(Path::to_path_buf),
        disk_bytes,
        block: BLOCK,
    }
}

fn open(
    cfg: &PrefixCacheConfig,
    m: &Model,
    state: &State,
    choice: &AttentionChoice,
) -> (PrefixCache, Option<ScanReport>) {
    PrefixCache::open(
        cfg,
        &m.config.fingerprint,
        state,
        choice,
        Arc::new(PrefixCacheStats::default()),
    )
    .unwrap()
}

/// Feed `tokens` after what `session` holds, `BLOCK` at a time, then `steps` greedy decode
/// steps; the bits of every logits row produced along the way.
fn run(m: &Model, session: &mut Session, tokens: &[u32], steps: usize) -> Vec<u32> {
    let mut bits = Vec::new();
    for chunk in tokens.chunks(BLOCK) {
        let logits = session.feed(m, chunk, Logits::Last).unwrap();
        bits.extend(logits.iter().map(|x| x.to_bits()));
    }
    for _ in 0..steps {
        let next = common::argmax(session.state().last_logits()) as u32;
        let logits = session.feed(m, &[next], Logits::Last).unwrap();
        bits.extend(logits.iter().map(|x| x.to_bits()));
    }
    bits
}

/// A document of 5½ blocks and two questions about it.
fn prompts() -> (Vec<u32>, Vec<u32>) {
    let doc = synthetic_tokens(5 * BLOCK + BLOCK / 2, 11);
    let p1 = [doc.clone(), synthetic_tokens(9, 3 << 20)].concat();
    let p2 = [doc, synthetic_tokens(13, 5 << 20)].concat();
    (p1, p2)
}

/// `p2` computed from scratch, and from what `cache` restores into a fresh state: equal to
/// the bit. Returns the positions restored.
fn restored_equals_computed(
    m: &Model,
    cache: &mut PrefixCache,
    make: &dyn Fn() -> State,
    p2: &[u32],
    label: &str,
) -> usize {
    let mut fresh = Session::new(make());
    let want = run(m, &mut fresh, p2, 4);
    let mut session = Session::new(make());
    let n = session.reuse_prefix_from(cache, p2);
    assert_eq!(n % BLOCK, 0, "{label}");
    assert_eq!(session.tokens(), &p2[..n], "{label}");
    assert_eq!(session.state().n_past(), n, "{label}");
    // The reference fed the first n positions in the same BLOCK-sized passes.
    let tail = run(m, &mut session, &p2[n..], 4);
    if label.contains("cold true") {
        assert!(
            session.state().kv().bytes_cold() > 0,
            "{label}: nothing went cold"
        );
    }
    let want_tail = &want[want.len() - tail.len()..];
    assert!(
        tail == want_tail,
        "{label}: restored prefix of {n} diverged"
    );
    n
}

#[test]
fn a_restored_prefix_continues_as_the_computed_one() {
    let e = engine(1);
    let m = &e.model;
    let (p1, p2) = prompts();
    // The questions share the document: five whole blocks.
    let shared = 5 * BLOCK;
    let types = [
        KvTypes::new(KvType::F16, KvType::F16),
        KvTypes::new(KvType::F32, KvType::F32),
        KvTypes::new(KvType::Q8_0, KvType::Q8_0),
        KvTypes::new(KvType::F16, KvType::Q8_0),
    ];
    for (name, choice) in choices(m) {
        for t in types {
            for cold in [false, true] {
                let label = format!("{name}, {t}, cold {cold}");
                let make = || sequence(m, &choice, t, cold);
                let mut first = Session::new(make());
                run(m, &mut first, &p1, 0);
                let (mut cache, _) = open(&config(1 << 30, None, 0), m, first.state(), &choice);
                cache.publish(&p1, p1.len(), first.state());
                assert_eq!(cache.cached_len(&p2), shared, "{label}");
                let n = restored_equals_computed(m, &mut cache, &make, &p2, &label);
                assert_eq!(n, shared, "{label}");
                assert_eq!(cache.stats().hits.load(Ordering::Relaxed), 1);
                assert_eq!(
                    cache.stats().tokens_reused.load(Ordering::Relaxed),
                    shared as u64
                );
            }
        }
    }
}

/// The comparison sees a wrong row: a prefix differing in one token of its first block
/// does not continue as the document's (so equal bits above mean the right rows).
#[test]
fn the_comparison_sees_one_token_changed() {
    let e = engine(1);
    let m = &e.model;
    let (_, p2) = prompts();
    let mut other = p2.clone();
    other[3] = (other[3] + 1) % 250 + 3;
    let choice = AttentionChoice::default();
    let make = || sequence(m, &choice, KvType::F16.into(), false);
    let a = run(m, &mut Session::new(make()), &p2, 2);
    let b = run(m, &mut Session::new(make()), &other, 2);
    let tail = (2 + p2.len().div_ceil(BLOCK) - 5) * m.config.vocab_size;
    assert_ne!(a[a.len() - tail..], b[b.len() - tail..]);
}

/// Blocks written to the directory are found by a new cache on it (a restart) and restore
/// exactly; a damaged file is removed with a warning and the prefix before it used; a
/// truncated one is removed at the scan; files of another model or KV type are left alone
/// and never used.
#[test]
fn the_directory_outlives_the_cache_and_refuses_bad_files() {
    let e = engine(1);
    let m = &e.model;
    let (p1, p2) = prompts();
    let choice = common::small_quest();
    let make = || sequence(m, &choice, KvType::F16.into(), false);
    let dir = scratch("disk");
    let mut first = Session::new(make());
    run(m, &mut first, &p1, 0);
    {
        // RAM budget 0: every block goes to the directory only.
        let (mut cache, scan) = open(&config(0, Some(&dir), 1 << 30), m, first.state(), &choice);
        assert_eq!(scan.unwrap(), ScanReport::default());
        cache.publish(&p1, p1.len(), first.state());
        assert_eq!(cache.bytes().0, 0);
        assert!(cache.bytes().1 > 0);
        let n = restored_equals_computed(m, &mut cache, &make, &p2, "from disk");
        assert_eq!(n, 5 * BLOCK);
    }
    let files = || {
        let mut f: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        f.sort();
        f
    };
    // The five blocks of the document, and one of the first question.
    assert_eq!(files().len(), 6);
    // A restart.
    let (mut cache, scan) = open(
        &config(1 << 30, Some(&dir), 1 << 30),
        m,
        first.state(),
        &choice,
    );
    assert_eq!(scan.unwrap().blocks, 6);
    let n = restored_equals_computed(m, &mut cache, &make, &p2, "after a restart");
    assert_eq!(n, 5 * BLOCK);
    drop(cache);

    // Another model, another KV type, another prefill policy: none of it is theirs.
    let other = engine(2);
    let other_state = sequence(&other.model, &choice, KvType::F16.into(), false);
    let f32_state = sequence(m, &choice, KvType::F32.into(), false);
    let mut xattention = choice.clone();
    xattention.prefill = Some("xattention".into());
    let x_state = sequence(m, &xattention, KvType::F16.into(), false);
    for (label, model, state, choice) in [
        ("other model", &other.model, &other_state, &choice),
        ("f32", m, &f32_state, &choice),
        ("xattention prefill", m, &x_state, &xattention),
    ] {
        let (mut cache, scan) = open(&config(1 << 30, Some(&dir), 1 << 30), model, state, choice);
        let scan = scan.unwrap();
        assert_eq!((scan.blocks, scan.foreign), (0, 6), "{label}");
        assert_eq!(cache.cached_len(&p2), 0, "{label}");
        let _ = &mut cache;
    }
    assert_eq!(files().len(), 6, "foreign files are left alone");

    // Damage the third block's data (the files are named by key: find it by the chain).
    let keys = sparrow::prefix_cache::chain_keys(
        &sparrow::prefix_cache::root(
            &m.config.fingerprint,
            &sparrow::prefix_cache::BlockShape::of(first.state().kv(), BLOCK),
            &choice,
        ),
        &p2,
        BLOCK,
        5,
    );
    let name = |k: &[u8; 32]| {
        dir.join(format!(
            "{}.sprb",
            k.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ))
    };
    let third = name(&keys[2]);
    let mut bytes = std::fs::read(&third).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(&third, &bytes).unwrap();
    // And truncate the fifth.
    let fifth = name(&keys[4]);
    let bytes = std::fs::read(&fifth).unwrap();
    std::fs::write(&fifth, &bytes[..bytes.len() - 7]).unwrap();
    let (mut cache, scan) = open(
        &config(1 << 30, Some(&dir), 1 << 30),
        m,
        first.state(),
        &choice,
    );
    let scan = scan.unwrap();
    assert_eq!((scan.blocks, scan.removed), (5, 1));
    assert!(!fifth.exists());
    // The damaged block is found only when read: then refused, and the two before it used.
    let n = restored_equals_computed(m, &mut cache, &make, &p2, "damaged");
    assert_eq!(n, 2 * BLOCK);
    assert!(!third.exists());
    assert_eq!(files().len(), 4);
}

/// The directory never holds more than its budget, nor RAM more than its own, however many
/// prompts pass; the most recently used blocks stay.
#[test]
fn budgets_hold() {
    let e = engine(1);
    let m = &e.model;
    let choice = AttentionChoice::default();
    let make = || sequence(m, &choice, KvType::F16.into(), false);
    let dir = scratch("budget");
    let probe = make();
    let block_bytes = {
        let (mut c, _) = open(&config(1 << 30, None, 0), m, &probe, &choice);
        let mut s = Session::new(make());
        let p = synthetic_tokens(BLOCK + 1, 1);
        run(m, &mut s, &p, 0);
        c.publish(&p, p.len(), s.state());
        c.bytes().0
    };
    let disk_budget = 7 * block_bytes + block_bytes / 2;
    let ram_budget = 3 * block_bytes;
    let (mut cache, _) = open(
        &config(ram_budget, Some(&dir), disk_budget),
        m,
        &probe,
        &choice,
    );
    let on_disk = || -> u64 {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    };
    let mut last = Vec::new();
    for seed in 0..12 {
        let p = synthetic_tokens(2 * BLOCK + 3, (100 + seed) << 16);
        let mut s = Session::new(make());
        run(m, &mut s, &p, 0);
        cache.publish(&p, p.len(), s.state());
        assert!(on_disk() <= disk_budget, "{} > {disk_budget}", on_disk());
        assert!(on_disk() > 0);
        assert!(cache.bytes().0 <= ram_budget);
        assert_eq!(cache.bytes().1, on_disk());
        last = p;
    }
    // The last prompt's blocks are all there.
    assert_eq!(cache.cached_len(&last), 2 * BLOCK);
    // And the first prompt's are gone (7 blocks fit, 24 were made).
    assert_eq!(
        cache.cached_len(&synthetic_tokens(2 * BLOCK + 3, 100 << 16)),
        0
    );
}

/// Under the scheduler, two jobs about one document sent together: the second waits for
/// the first to compute the document, then starts from the cache — the document's whole
/// blocks are computed once. Without the cache, both compute it.
#[test]
fn the_scheduler_computes_a_shared_prefix_once() {
    let e = engine(1);
    let (p1, p2) = prompts();
    let run_both = |cache: Option<PrefixCacheConfig>| {
        let scheduler = Scheduler::start(
            &e,
            Config {
                slots: 2,
                n_ctx: N_CTX,
                batch: BLOCK,
                prefix_cache: cache,
                ..Config::default()
            },
        )
        .unwrap();
        let mut replies = Vec::new();
        for p in [&p1, &p2] {
            let (reply, events) = reply_channel();
            scheduler
                .submit(Job {
                    prompt: p.clone(),
                    generation: Generation::new(6, false),
                    sampler: Sampler::new(SamplerConfig::greedy()),
                    reply: Box::new(reply),
                })
                .unwrap();
            replies.push(events);
        }
        let mut cached = Vec::new();
        for events in replies {
            for ev in events {
                match ev {
                    Event::Done(u) => {
                        cached.push(u.cached_tokens);
                        break;
                    }
                    Event::Error(e) => panic!("{e}"),
                    _ => {}
                }
            }
        }
        let stats = scheduler.stats().clone();
        (cached, stats)
    };
    let (cached, stats) = run_both(Some(config(1 << 30, None, 0)));
    assert_eq!(cached, vec![0, 5 * BLOCK]);
    assert_eq!(
        stats.prompt_tokens.load(Ordering::Relaxed) as usize,
        p1.len() + p2.len() - 5 * BLOCK
    );
    assert_eq!(stats.prefix_cache.hits.load(Ordering::Relaxed), 1);
    assert!(stats.prefix_cache.enabled.load(Ordering::Relaxed));
    let (cached, stats) = run_both(None);
    assert_eq!(cached, vec![0, 0]);
    assert_eq!(
        stats.prompt_tokens.load(Ordering::Relaxed) as usize,
        p1.len() + p2.len()
    );
    assert!(!stats.prefix_cache.enabled.load(Ordering::Relaxed));
}

/// Gemma-3 keeps its sliding-window layers in rings of window + 512 rows: a prefix longer
/// than the ring is restored with those layers' last rows only (taken while the ring still
/// held them, as the prompt was read), and continues as the computed prefix, to the bit.
/// Against a cache whose blocks miss a ring's rows the restore falls back to a shorter prefix
/// the blocks do cover — never to rows it does not have.
#[test]
fn gemma_sliding_layers_restore_from_their_rings() {
    let e = Engine::load(common::gemma_path()).unwrap();
    let m = &e.model;
    assert!(m.config.has_sliding_layers());
    let words = [
        "river", "lantern", "copper", "meadow", "signal", "harbor", "violet",
    ];
    let text: String = (0..400)
        .map(|i| {
            format!(
                "Entry {i} names the {} and the {}. ",
                words[i % 7],
                words[i * 3 % 7]
            )
        })
        .collect();
    let doc = e.tokenizer.encode(&text, true, false);
    let block = 256;
    assert!(doc.len() > 1800, "{}", doc.len());
    let doc = &doc[..1800];
    let p1 = [doc, &e.tokenizer.encode(" What first?", false, false)].concat();
    let p2 = [doc, &e.tokenizer.encode(" And then?", false, false)].concat();
    let choice = AttentionChoice::default();
    let make = || {
        m.new_sequence(2048, KvOptions::from(KvType::F16), &choice)
            .unwrap()
    };
    let feed = |s: &mut Session, tokens: &[u32]| -> Vec<u32> {
        let mut bits = Vec::new();
        for chunk in tokens.chunks(block) {
            let l = s.feed(m, chunk, Logits::Last).unwrap();
            bits.extend(l.iter().map(|x| x.to_bits()));
        }
        bits
    };
    let cfg = PrefixCacheConfig {
        ram_bytes: 1 << 30,
        dir: None,
        disk_bytes: 0,
        block,
    };
    // Published after every pass, as the scheduler does: each block has every layer.
    let mut first = Session::new(make());
    let (mut cache, _) = open(&cfg, m, first.state(), &choice);
    let mut done = 0;
    for chunk in p1.chunks(block) {
        first.feed(m, chunk, Logits::Last).unwrap();
        done += chunk.len();
        cache.publish(&p1, done, first.state());
    }
    let mut fresh = Session::new(make());
    let want = feed(&mut fresh, &p2);
    let mut restored = Session::new(make());
    let n = restored.reuse_prefix_from(&mut cache, &p2);
    assert_eq!(n, 7 * block);
    let got = feed(&mut restored, &p2[n..]);
    assert!(
        got == want[want.len() - got.len()..],
        "restored Gemma prefix diverged"
    );

    // Published once at the end: the rings then hold the last 1,024 positions only, so the
    // blocks before position ~780 miss the sliding layers' rows, and every prefix the
    // blocks make needs some of those (its last 1,024 positions): nothing is restored.
    let mut late = Session::new(make());
    feed(&mut late, &p1);
    let (mut cache, _) = open(&cfg, m, late.state(), &choice);
    cache.publish(&p1, p1.len(), late.state());
    assert_eq!(cache.cached_len(&p2), 7 * block, "the blocks are there");
    let mut partial = Session::new(make());
    let ring = (0..m.config.n_layer)
        .map(|l| partial.state().kv().layer_rows(l))
        .min()
        .unwrap();
    assert_eq!(ring, 1024);
    assert_eq!(partial.reuse_prefix_from(&mut cache, &p2), 0);
    assert_eq!(partial.state().n_past(), 0);
}
