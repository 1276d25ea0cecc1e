//! `sparrow chat`: an interactive chat in the terminal with the model's chat template. The
//! whole history is rendered each turn, and the KV cache keeps the prefix it shares with the
//! previous turn, so only the new messages are prefilled. Ctrl-C stops the reply being
//! generated and returns to the prompt; `/exit` or Ctrl-D ends the session, `/reset` clears
//! the history. The KV cache types and the attention policy come from the shared [`KvArgs`]
//! flags; the policy's per-sequence state is rewound with the cache when a turn keeps only
//! the prefix it shares with the previous one.

use crate::{KvArgs, ModelArgs, SamplingArgs};
use sparrow::grammar::{JsonConstraint, JsonVocab, Root};
use sparrow::{ChatMessage, Engine, Generation, Sampler, Session};
use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Arguments of `sparrow chat`.
#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// System message.
    #[arg(long = "system-prompt", short = 'S')]
    system_prompt: Option<String>,
    /// Context size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    ctx_size: usize,
    /// Most tokens per reply (-1: until the end of the turn).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    #[command(flatten)]
    kv: KvArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    speculative: crate::speculative::SpeculativeArgs,
    /// Replies are JSON objects (constrained sampling).
    #[arg(long = "json")]
    json: bool,
}

static STOP: AtomicBool = AtomicBool::new(false);

pub fn chat(a: ChatArgs) -> Result<(), String> {
    let cfg = a.sampling.config()?;
    let kv_types = a.kv.types();
    let attention = a.kv.choice()?;
    crate::run::init_threads(a.threads)?;
    let path = a.model.resolve()?;
    let options = a.model.load_options_for(a.speculative.is_on());
    let engine = Engine::load_with(&path, options).map_err(|e| e.to_string())?;
    let tmpl = engine
        .chat_template
        .as_ref()
        .ok_or("this model has no chat template; use `sparrow run`")?;
    // The session keeps the prefix each turn shares with the previous one; the policy's
    // per-sequence state is rewound with the cache.
    let mut session = Session::new(
        engine
            .model
            .new_sequence(a.ctx_size, a.kv.options(), &attention)
            .map_err(|e| e.to_string())?,
    )
    .with_batch_size(256);
    if let Some(spec) = a
        .speculative
        .speculation(&engine, a.ctx_size, &a.kv.options(), 256)?
    {
        session = session.with_speculation(spec);
    }
    ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst))
        .map_err(|e| format!("cannot install the Ctrl-C handler: {e}"))?;
    let json_vocab = a.json.then(|| Arc::new(JsonVocab::new(&engine.tokenizer)));
    let mut sampler = Sampler::new(cfg);
    let system: Vec<ChatMessage> = a
        .system_prompt
        .iter()
        .map(|s| ChatMessage::new("system", s))
        .collect();
    let mut history = system.clone();
    eprintln!(
        "sparrow chat: {} (context {}, KV cache {kv_types}, attention {}) — Ctrl-C stops a reply, /reset clears the history, /exit or Ctrl-D quits",
        path.display(),
        a.ctx_size,
        attention.label()
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        print!("> ");
        let _ = std::io::stdout().flush();
        STOP.store(false, Ordering::SeqCst);
        let line = match lines.next() {
            Some(Ok(l)) => l,
            Some(Err(e)) => return Err(format!("cannot read the terminal: {e}")),
            None => break,
        };
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history = system.clone();
                eprintln!("(history cleared)");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", line));
        // Render; drop the oldest turns while the conversation does not fit.
        let ids = loop {
            let text = tmpl.render(&history, true).map_err(|e| e.to_string())?;
            let ids = engine.tokenizer.encode(&text, true, true);
            if ids.len() + 16 < a.ctx_size || history.len() <= system.len() + 1 {
                break ids;
            }
            history.remove(system.len());
        };
        if ids.len() >= a.ctx_size {
            eprintln!(
                "(the message is too long for the context of {} tokens)",
                a.ctx_size
            );
            history.pop();
            continue;
        }
        let limit = usize::try_from(a.n_predict).unwrap_or(usize::MAX);
        let mut gen = Generation::new(limit, false);
        if let Some(v) = &json_vocab {
            gen = gen.with_constraint(JsonConstraint::new(v.clone(), Root::Object));
        }
        let mut reply = String::new();
        let mut out = std::io::stdout();
        let result = session.generate(
            &engine,
            &ids,
            &mut sampler,
            &mut gen,
            &mut |_: Option<u32>, piece: &str| {
                reply.push_str(piece);
                let _ = out.write_all(piece.as_bytes());
                let _ = out.flush();
                if STOP.load(Ordering::SeqCst) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        );
        println!();
        match result {
            Ok(stats) if stats.stop == sparrow::StopReason::Cancelled => eprintln!("(stopped)"),
            Ok(stats) => {
                if let Some(s) = &stats.speculation {
                    eprintln!("{}", crate::speculative::summary(s, stats.n_generated));
                }
            }
            // The session emptied its cache; the next turn starts from the whole history.
            Err(e) => eprintln!("error: {e}"),
        }
        history.push(ChatMessage::new("assistant", &reply));
    }
    Ok(())
}
