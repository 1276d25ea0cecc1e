//! Time of one pass of n decode steps (`forward_steps`) against n one-token passes and a
//! prefill batch (`forward`), after a prompt: what a speculative check costs; and a draft
//! model's step with logits over the whole vocabulary and over part of it.
//!
//! `cargo run --release -p sparrow --example steps_cost -- MODEL.gguf [THREADS] [ROW_GROUPS]`
//! (`ROW_GROUPS`: `off`, `decode` (the default: Q5_0 in row groups) or `batched` (every
//! format that has them), `LoadOptions::row_groups`)

use sparrow::{Engine, KvType, Logits, VocabHead};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("model path");
    let threads: usize = args.next().map_or(2, |t| t.parse().expect("threads"));
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .use_current_thread() // the passes start from a pool thread, as the CLI's do
        .build_global()
        .unwrap();
    let row_groups = match args.next().as_deref() {
        None | Some("decode") => sparrow::RowGroups::Decode,
        Some("off") => sparrow::RowGroups::Off,
        Some("batched") => sparrow::RowGroups::Batched,
        Some(other) => panic!("row groups: off, decode or batched, not {other}"),
    };
    let options = sparrow::LoadOptions {
        row_groups,
        ..Default::default()
    };
    let e = Engine::load_with(&path, options).unwrap();
    let m = &e.model;
    let prompt: Vec<u32> = (0..256u32).map(|i| 100 + (i * 37) % 5000).collect();
    let mut st = m.new_state(2048, KvType::F16).unwrap();
    m.forward(&mut st, &prompt, Logits::Last).unwrap();
    let base = st.n_past();
    for n in [1usize, 2, 4, 8, 16] {
        let toks: Vec<u32> = (0..n as u32).map(|i| 200 + i).collect();
        let mut best = [f64::MAX; 3];
        for _ in 0..5 {
            let t = Instant::now();
            m.forward_steps(&mut st, &toks, Logits::All).unwrap();
            best[0] = best[0].min(t.elapsed().as_secs_f64());
            let _ = st.truncate(base);
            let t = Instant::now();
            for &x in &toks {
                m.forward(&mut st, &[x], Logits::Last).unwrap();
            }
            best[1] = best[1].min(t.elapsed().as_secs_f64());
            let _ = st.truncate(base);
            let t = Instant::now();
            m.forward(&mut st, &toks, Logits::All).unwrap();
            best[2] = best[2].min(t.elapsed().as_secs_f64());
            let _ = st.truncate(base);
        }
        println!(
            "n={n:2}: steps {:7.1} ms, {n} one-token passes {:7.1} ms, batch {:7.1} ms",
            best[0] * 1e3,
            best[1] * 1e3,
            best[2] * 1e3
        );
    }
    // A draft model's step: one token with logits over the whole vocabulary, and over the
    // first ids (`--draft-vocab`'s default; the prompt's ids past them included).
    let vocab = m.config.vocab_size;
    let mut head = VocabHead::new(sparrow::speculative::DEFAULT_DRAFT_VOCAB, vocab);
    head.include(&prompt);
    let mut best = [f64::MAX; 2];
    for _ in 0..20 {
        let t = Instant::now();
        m.forward(&mut st, &[300], Logits::Last).unwrap();
        best[0] = best[0].min(t.elapsed().as_secs_f64());
        let _ = st.truncate(base);
        let t = Instant::now();
        m.forward_head(&mut st, &[300], &head).unwrap();
        best[1] = best[1].min(t.elapsed().as_secs_f64());
        let _ = st.truncate(base);
    }
    println!(
        "one token: whole head {:.2} ms, head of {} logits {:.2} ms",
        best[0] * 1e3,
        head.len(),
        best[1] * 1e3
    );
}
