//! How fast *any* chain of drafts from a draft model could make greedy decoding, on real
//! prompts: the ceiling a length chooser works under.
//!
//! `cargo run --release -p sparrow --example draft_bound -- TARGET.gguf DRAFT.gguf
//! PROMPTS.json [N] [THREADS] [TRACE.json]` (`PROMPTS.json` as `sparrow bench
//! --spec-prompts`: a list of `{"kind", "prompt"}`, rendered through the target's chat
//! template; `TRACE.json`: the costs and, per prompt, whether the draft's token was right
//! and how sure it was at each position — and the same for its runner-up, `ok2`/`p2`, a
//! sibling's odds — for trying stopping rules offline).
//!
//! Per prompt: the target's greedy continuation of `N` tokens (default 128), then the draft
//! model over the prompt and that continuation in one teacher-forced pass, which gives the
//! draft's greedy token and its probability at every position. Reported per kind: how often
//! the draft's token is the target's (`agree`), how often the draft is at least 0.75 sure
//! (`sure`, `--draft-p-min`'s default) and how often it is right then, and the **oracle
//! bound**: the best speed-up over plain decoding of a schedule that knows in advance which
//! draft tokens the target will keep — it drafts exactly a run of kept tokens (L draft
//! steps) and checks it in one pass of L + 1 rows, or decodes plainly — under the measured
//! costs of a draft step (the draft's `--draft-vocab` head) and of a pass of L rows (the
//! target in row groups, as speculative decoding loads it). No real chooser reaches it: it
//! never drafts a token that is thrown away, never declines, and its draft never catches
//! up. Siblings (a second candidate at a position) are outside it; the trace replays them.

use sparrow::speculative::best_with_probability;
use sparrow::{
    ChatMessage, Engine, Generation, KvType, LoadOptions, Logits, RowGroups, Sampler,
    SamplerConfig, Session, VocabHead,
};
use std::time::Instant;

#[derive(serde::Deserialize)]
struct Prompt {
    kind: String,
    prompt: String,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "draft_bound TARGET.gguf DRAFT.gguf PROMPTS.json [N] [THREADS]";
    let (target, draft, prompts) = (
        args.next().expect(usage),
        args.next().expect(usage),
        args.next().expect(usage),
    );
    let n: usize = args.next().map_or(128, |v| v.parse().expect("N"));
    let threads: usize = args.next().map_or(2, |v| v.parse().expect("THREADS"));
    let trace_path = args.next();
    let mut trace = Vec::new();
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .use_current_thread() // the passes start from a pool thread, as the CLI's do
        .build_global()
        .unwrap();
    let options = LoadOptions {
        row_groups: RowGroups::Batched,
        ..Default::default()
    };
    let t = Engine::load_with(&target, options).unwrap();
    let d = Engine::load_with(&draft, options).unwrap();
    let prompts: Vec<Prompt> =
        serde_json::from_str(&std::fs::read_to_string(&prompts).unwrap()).unwrap();
    let tmpl = t.chat_template.as_ref().expect("a chat template");

    let costs = measure_costs(&t, &d);
    println!(
        "costs: draft step {:.2} ms; target pass of 1, 2, 4, 8, 16 rows {} ms",
        costs.draft * 1e3,
        [1, 2, 4, 8, 16]
            .map(|l| format!("{:.1}", costs.pass(l) * 1e3))
            .join(", ")
    );

    let mut kinds: Vec<String> = prompts.iter().map(|p| p.kind.clone()).collect();
    kinds.dedup();
    println!("| kind | tokens | agree | sure | right when sure | oracle bound |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for kind in kinds {
        let (mut agree, mut sure, mut sure_right) = (Vec::new(), 0usize, 0usize);
        let (mut plain, mut best) = (0f64, 0f64);
        for p in prompts.iter().filter(|p| p.kind == kind) {
            let text = tmpl
                .render(&[ChatMessage::new("user", &p.prompt)], true)
                .unwrap();
            let ids = t.tokenizer.encode(&text, true, true);
            let out = greedy(&t, &ids, n);
            let mut st = d.model.new_state(ids.len() + n + 1, KvType::F16).unwrap();
            let all: Vec<u32> = ids.iter().chain(&out).copied().collect();
            let logits = d.model.forward(&mut st, &all, Logits::All).unwrap();
            let vocab = d.model.config.vocab_size;
            // The draft's view of output token `i` is the row before it.
            let (mut ok, mut sureness) = (Vec::new(), Vec::new());
            let (mut ok2, mut sureness2) = (Vec::new(), Vec::new());
            for i in 0..out.len() {
                let row = &logits[(ids.len() + i - 1) * vocab..][..vocab];
                let (best, p) = best_with_probability(row);
                let (second, p2) = runner_up(row, best, p);
                let right = best == out[i];
                if p >= 0.75 {
                    sure += 1;
                    sure_right += right as usize;
                }
                ok.push(right);
                sureness.push(p as f64);
                ok2.push(second == out[i]);
                sureness2.push(p2 as f64);
            }
            // Whether the model's token could be proposed through the default draft head:
            // among its first ids, or already in the context.
            let first = sparrow::speculative::DEFAULT_DRAFT_VOCAB as u32;
            let in_head: Vec<bool> = (0..out.len())
                .map(|i| out[i] < first || all[..ids.len() + i].contains(&out[i]))
                .collect();
            trace.push(serde_json::json!({"kind": kind, "ok": ok, "p": sureness,
                "ok2": ok2, "p2": sureness2, "in_head": in_head}));
            plain += out.len() as f64 * costs.pass(1);
            best += oracle_cost(&ok, &costs);
            agree.extend(ok);
        }
        let kept = agree.iter().filter(|&&a| a).count();
        println!(
            "| {kind} | {} | {:.2} | {:.2} | {:.2} | {:.2}× |",
            agree.len(),
            kept as f64 / agree.len() as f64,
            sure as f64 / agree.len() as f64,
            sure_right as f64 / sure.max(1) as f64,
            plain / best
        );
    }
    if let Some(path) = trace_path {
        let costs = serde_json::json!({"draft": costs.draft, "passes": costs.passes});
        let all = serde_json::json!({"costs": costs, "prompts": trace});
        std::fs::write(&path, serde_json::to_string(&all).unwrap()).unwrap();
    }
}

/// The draft's second-best token and its probability, given the best and its probability
/// (the best's probability is 1 / Σ exp(l − max), so the runner-up's is exp(l₂ − max) · p).
fn runner_up(row: &[f32], best: u32, p: f32) -> (u32, f32) {
    let (mut id, mut l) = (0u32, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if i as u32 != best && v > l {
            (id, l) = (i as u32, v);
        }
    }
    (id, (l - row[best as usize]).exp() * p)
}

/// The target's greedy continuation of `ids`, `n` tokens (fewer at an end of generation).
fn greedy(e: &Engine, ids: &[u32], n: usize) -> Vec<u32> {
    let state = e.model.new_state(ids.len() + n + 1, KvType::F16).unwrap();
    let mut out = Vec::new();
    Session::new(state)
        .generate(
            e,
            ids,
            &mut Sampler::new(SamplerConfig::greedy()),
            &mut Generation::new(n, false),
            &mut sparrow::collect_ids(&mut out),
        )
        .unwrap();
    out
}

/// Seconds of a draft step and of target passes of 1..=16 rows.
struct Costs {
    draft: f64,
    passes: [f64; 16],
}

impl Costs {
    fn pass(&self, rows: usize) -> f64 {
        self.passes[rows.clamp(1, 16) - 1]
    }
}

/// Best of 5 after a 256-token context: a draft step through `--draft-vocab`'s default
/// head, and a target pass of decode steps (`forward_steps`, as a check runs) of each size.
fn measure_costs(t: &Engine, d: &Engine) -> Costs {
    let ctx: Vec<u32> = (0..256u32).map(|i| 100 + (i * 37) % 5000).collect();
    let best = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let s = Instant::now();
                f();
                s.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    };
    let mut st = d.model.new_state(1024, KvType::F16).unwrap();
    d.model.forward(&mut st, &ctx, Logits::Last).unwrap();
    let mut head = VocabHead::new(
        sparrow::speculative::DEFAULT_DRAFT_VOCAB,
        d.model.config.vocab_size,
    );
    head.include(&ctx);
    let base = st.n_past();
    let draft = best(&mut || {
        d.model.forward_head(&mut st, &[300], &head).unwrap();
        let _ = st.truncate(base);
    });
    let mut st = t.model.new_state(1024, KvType::F16).unwrap();
    t.model.forward(&mut st, &ctx, Logits::Last).unwrap();
    let base = st.n_past();
    let passes = std::array::from_fn(|i| {
        let rows: Vec<u32> = (0..=i as u32).map(|j| 200 + j).collect();
        best(&mut || {
            t.model.forward_steps(&mut st, &rows, Logits::All).unwrap();
            let _ = st.truncate(base);
        })
    });
    Costs { draft, passes }
}

/// The least time to produce the continuation whose draft tokens are right where `ok` says,
/// knowing `ok`: at each point either a plain pass (one token), or L ≥ 1 draft steps over a
/// run of right tokens and a check of L + 1 rows (L + 1 tokens).
fn oracle_cost(ok: &[bool], c: &Costs) -> f64 {
    let n = ok.len();
    let mut best = vec![0f64; n + 1];
    for i in (0..n).rev() {
        let mut b = c.pass(1) + best[i + 1];
        let mut run = 0;
        while i + run < n && ok[i + run] && run < 15 {
            run += 1;
            let next = (i + run + 1).min(n);
            b = b.min(run as f64 * c.draft + c.pass(run + 1) + best[next]);
        }
        best[i] = b;
    }
    best[0]
}
