//! Prints a digest of the raw logits a model produces for fixed prompts — a batched prefill
//! followed by greedy decode steps — so two builds can be checked bit for bit (`full`
//! attention must not change when the attention code is refactored).
//!
//! `cargo run --release -p sparrow --example logits_digest -- MODEL [N_DECODE] [K_TYPE V_TYPE]`
//! (set `SPARROW_SIMD=scalar` to check the scalar kernels).

use sparrow::{Engine, KvType, KvTypes, Logits};

const PROMPTS: &[&str] = &[
    "The capital of France is",
    "fn fibonacci(n: u64) -> u64 {\n    match n {",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old \
     clockmaker who had never once left the valley. Every morning he opened his shop, wound \
     the hundred clocks on its walls, and waited for someone to bring him a broken watch.",
];

/// FNV-1a over the logits' bit patterns.
fn fnv(h: &mut u64, xs: &[f32]) {
    for x in xs {
        for b in x.to_bits().to_le_bytes() {
            *h ^= b as u64;
            *h = h.wrapping_mul(0x100000001b3);
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: logits_digest MODEL [N_DECODE]")?;
    let steps: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(16);
    let ty = |i: usize| -> Result<KvType, Box<dyn std::error::Error>> {
        Ok(args
            .get(i)
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(KvType::F16))
    };
    let types = KvTypes::new(ty(3)?, ty(4)?);
    let engine = Engine::load(path)?;
    // A long prompt too, so decode splits its keys across threads and merges the pieces.
    let long = PROMPTS[2].repeat(12);
    for prompt in PROMPTS.iter().copied().chain([long.as_str()]) {
        let tokens = engine.tokenizer.encode(prompt, true, true);
        let mut state = engine.model.new_state(1024, types)?;
        let mut h = 0xcbf29ce484222325u64;
        let logits = engine.model.forward(&mut state, &tokens, Logits::All)?;
        fnv(&mut h, logits);
        let mut next = argmax(state.last_logits());
        let mut out = vec![next];
        for _ in 0..steps {
            let logits = engine.model.forward(&mut state, &[next], Logits::Last)?;
            fnv(&mut h, logits);
            next = argmax(logits);
            out.push(next);
        }
        println!("{:016x} {} tokens {:?}", h, tokens.len(), out);
    }
    Ok(())
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}
