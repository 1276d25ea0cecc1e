//! `sparrow serve`: an OpenAI-compatible HTTP server (axum + tokio).
//!
//! `POST /v1/chat/completions`, `POST /v1/completions` (streaming with server-sent events or
//! not), `GET /v1/models`, `GET /health`, `GET /metrics`. Requests are checked and tokenized
//! on the async side, then queued as a [`job`] for the library's continuous-batching
//! [`Scheduler`] (its own thread); this module is the HTTP layer over it. A full queue is a
//! 503, bad input a 400 with an OpenAI-style error body, a missing or wrong API key a 401.
//! A client that disconnects drops its receiver, and the scheduler stops its request at
//! the next step.

pub use sparrow_cli::openai as api;
pub mod job;
pub mod metrics;
pub mod prefix_cache;

use crate::{KvArgs, ModelArgs};
use api::ApiError;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics::Metrics;
use serde_json::{json, Value};
use sparrow::chat::tool_calls::{StreamEvent, ToolCallStream};
use sparrow::grammar::JsonVocab;
use sparrow::scheduler::{self, Event, Scheduler};
use sparrow::tokenizer::Tokenizer;
use sparrow::{ChatTemplate, Engine};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

/// Arguments of `sparrow serve` (llama-server's names where they exist).
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long = "host", default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the chosen one is printed).
    #[arg(long = "port", default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint except /health.
    #[arg(long = "api-key")]
    api_key: Option<String>,
    /// Context size per slot, in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    ctx_size: usize,
    /// Requests served at once (each has its own KV cache); their tokens share each
    /// forward pass (continuous batching).
    #[arg(long = "parallel", short = 'n', alias = "np", default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait for a slot; more get 503.
    #[arg(long = "queue-size", default_value_t = 16)]
    queue_size: usize,
    /// Largest `max_tokens` a request may ask for (also the default).
    #[arg(long = "max-tokens-limit", default_value_t = 2048)]
    max_tokens_limit: usize,
    /// Longest prompt in tokens (default: the context size minus one).
    #[arg(long = "max-prompt-tokens")]
    max_prompt_tokens: Option<usize>,
    /// Tokens per forward pass: one for each request generating, the rest for prompts being
    /// read (larger: prompts read faster; smaller: shorter pauses for the requests
    /// generating while a prompt is read).
    #[arg(short = 'b', long = "batch-size", default_value_t = 256)]
    batch_size: usize,
    /// Threads for the model math (default: all cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// KV cache types and the attention policy, for every slot (each slot has its own cache
    /// and its own instance of the policy).
    #[command(flatten)]
    kv: KvArgs,
    /// Name reported by /v1/models (default: the file name).
    #[arg(long = "alias")]
    alias: Option<String>,
    /// Drafts per slot (speculative decoding; the output does not change).
    #[command(flatten)]
    speculative: crate::speculative::SpeculativeArgs,
    /// Prompt prefixes shared by every slot, in RAM and on disk.
    #[command(flatten)]
    prefix_cache: prefix_cache::PrefixCacheArgs,
}

/// Everything the handlers share.
pub struct AppState {
    pub engine: Engine,
    pub template: ChatTemplate,
    pub scheduler: Scheduler,
    /// Grammar data for `json_object` and `json_schema` responses (built once per model).
    pub json_vocab: Arc<JsonVocab>,
    pub metrics: Arc<Metrics>,
    pub model_name: String,
    pub api_key: Option<String>,
    pub n_ctx: usize,
    pub max_prompt: usize,
    pub max_tokens_limit: usize,
    pub created: u64,
    pub ids: AtomicU64,
}

type Shared = Arc<AppState>;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn serve(a: ServeArgs) -> Result<(), String> {
    if a.ctx_size < 2 {
        return Err("-c/--ctx-size must be at least 2".into());
    }
    if a.parallel == 0 {
        return Err("--parallel must be at least 1".into());
    }
    // Bad policy names and settings are refused here, before the model is loaded.
    let kv_types = a.kv.types();
    let attention = a.kv.choice()?;
    let threads = crate::run::init_pool_threads(a.threads)?;
    let path = a.model.resolve()?;
    let options = a
        .model
        .load_options_for(a.speculative.is_on() || a.parallel > 1);
    let mut engine = Engine::load_with(&path, options).map_err(|e| e.to_string())?;
    for w in engine.tokenizer.warnings() {
        eprintln!("warning: {w}");
    }
    let template = match engine.chat_template.take() {
        Some(t) => t,
        None => {
            eprintln!("warning: the model has no chat template; using ChatML");
            ChatTemplate::builtin("chatml").expect("built in")
        }
    };
    // The template comes with the model file: if it cannot render a one-message chat
    // (broken, or hostile and stopped by its sandbox), say so now, not on every request.
    template
        .render(&[sparrow::ChatMessage::new("user", "hello")], true)
        .map_err(|e| format!("the model's chat template cannot render a one-message chat: {e}"))?;
    let (attn_prefill, attn_decode) = attention.phase_names()?;
    let scheduler = Scheduler::start(
        &engine,
        scheduler::Config {
            slots: a.parallel,
            n_ctx: a.ctx_size,
            kv: a.kv.options(),
            attention: attention.clone(),
            queue: a.queue_size,
            batch: a.batch_size,
            speculation: a.speculative.factory(
                &engine,
                a.ctx_size,
                &a.kv.options(),
                a.batch_size,
            )?,
            prefix_cache: a.prefix_cache.config(),
        },
    )
    .map_err(|e| e.to_string())?;
    if let Some(cfg) = a.prefix_cache.config() {
        let disk = scheduler
            .stats()
            .prefix_cache
            .disk_bytes
            .load(Ordering::Relaxed);
        for line in prefix_cache::describe(&cfg, scheduler.cache_scan(), disk) {
            eprintln!("{line}");
        }
    }
    let metrics = Arc::new(Metrics::new(
        metrics::Info {
            attention: attention.label(),
            attention_prefill: attn_prefill,
            attention_decode: attn_decode,
            cache_type_k: kv_types.k.name().into(),
            cache_type_v: kv_types.v.name().into(),
        },
        scheduler.stats().clone(),
    ));
    let json_vocab = Arc::new(JsonVocab::new(&engine.tokenizer));
    let model_name = a.alias.clone().unwrap_or_else(|| {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sparrow".into())
    });
    let state = Arc::new(AppState {
        engine,
        template,
        scheduler,
        json_vocab,
        metrics,
        model_name,
        api_key: a.api_key.clone(),
        n_ctx: a.ctx_size,
        max_prompt: a
            .max_prompt_tokens
            .unwrap_or(a.ctx_size - 1)
            .min(a.ctx_size - 1),
        max_tokens_limit: a.max_tokens_limit,
        created: now(),
        ids: AtomicU64::new(0),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    rt.block_on(async move {
        let addr = format!("{}:{}", a.host, a.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("cannot read the bound address: {e}"))?;
        eprintln!(
            "sparrow serve: {} ({} slots × {} tokens, KV cache {kv_types}, attention {}, {threads} threads), listening on http://{local}",
            path.display(),
            a.parallel,
            a.ctx_size,
            attention.label()
        );
        axum::serve(listener, router(state))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(|e| format!("server error: {e}"))
    })
}

/// The routes, with the API-key check and status counting around them.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn guard(State(st): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        if req.uri().path() != "/health" {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
                st.metrics.count_status(401);
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_api_key",
                    "missing or wrong API key: send 'Authorization: Bearer <key>'",
                )
                .into_response();
            }
        }
    }
    let resp = next.run(req).await;
    st.metrics.count_status(resp.status().as_u16());
    resp
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn metrics_text(State(st): State<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

async fn models(State(st): State<Shared>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_name,
            "object": "model",
            "created": st.created,
            "owned_by": "sparrow",
            "meta": {"n_ctx": st.n_ctx, "n_vocab": st.engine.tokenizer.vocab_size()},
        }]
    }))
}

async fn chat_completions(State(st): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    handle(st, headers, body, true)
        .await
        .unwrap_or_else(|e| e.into_response())
}

async fn completions(State(st): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    handle(st, headers, body, false)
        .await
        .unwrap_or_else(|e| e.into_response())
}

async fn handle(
    st: Shared,
    _headers: HeaderMap,
    body: Bytes,
    chat: bool,
) -> Result<Response, ApiError> {
    let mut req = api::parse_request(&body, chat, st.max_tokens_limit)?;
    let forced = api::forced_call(&req, &body)?;
    if let Some(schema) = forced.as_ref().and_then(|f| f.schema.clone()) {
        req.schema = Some(schema);
    }
    let rendered = |r: sparrow::Result<String>| {
        r.map_err(|e| ApiError::bad(&format!("cannot render the chat template: {e}")))
    };
    let text = match (&req.tool_messages, &req.messages) {
        (Some(tm), _) => {
            if !req.tools.is_empty() && !st.template.takes_tools() {
                return Err(ApiError::field(
                    "tools",
                    "'tools': this model's chat template never mentions tools, so it cannot show the model the functions".into(),
                ));
            }
            let mut t = rendered(st.template.render_with_tools(tm, &req.tools, true))?;
            if let Some(f) = &forced {
                t.push_str(&f.prefix);
            }
            t
        }
        (None, Some(m)) => rendered(st.template.render(m, true))?,
        (None, None) => req.prompt.clone().unwrap_or_default(),
    };
    let tool_mode = (chat && !req.tools.is_empty() && req.tool_choice != api::ToolChoice::None)
        .then(|| ToolMode {
            prefix: forced.map(|f| f.prefix),
            parallel: req.parallel_tool_calls,
        });
    let st2 = st.clone();
    let special = req.parse_special;
    let prompt =
        tokio::task::spawn_blocking(move || st2.engine.tokenizer.encode(&text, true, special))
            .await
            .map_err(|e| ApiError::internal(&format!("tokenizer task failed: {e}")))?;
    if prompt.is_empty() {
        return Err(ApiError::bad("the prompt is empty"));
    }
    if prompt.len() > st.max_prompt {
        return Err(ApiError::bad_param(
            &format!(
                "the prompt has {} tokens, more than this server's limit of {} (context {})",
                prompt.len(),
                st.max_prompt,
                st.n_ctx
            ),
            if chat { "messages" } else { "prompt" },
            "context_length_exceeded",
        ));
    }
    let room = st.n_ctx - prompt.len();
    let max_tokens = match req.max_tokens {
        Some(n) if n > room => {
            return Err(ApiError::bad_param(
                &format!(
                    "max_tokens {n} plus the prompt's {} tokens exceed the context of {} tokens",
                    prompt.len(),
                    st.n_ctx
                ),
                "max_tokens",
                "context_length_exceeded",
            ))
        }
        Some(n) => n,
        None => st.max_tokens_limit.min(room),
    };
    let (job, rx) = job::job(&req, prompt, max_tokens, &st.json_vocab);
    if st.scheduler.submit(job).is_err() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_busy",
            "the server is busy: the request queue is full, retry later",
        ));
    }
    let id = format!(
        "{}-{:x}{:06x}",
        if chat { "chatcmpl" } else { "cmpl" },
        st.created,
        st.ids.fetch_add(1, Ordering::Relaxed)
    );
    let meta = api::Meta {
        id,
        created: now(),
        model: st.model_name.clone(),
        chat,
    };
    let tokenizer = st.engine.tokenizer.clone();
    if req.stream {
        Ok(stream_response(rx, meta, req.include_usage, tokenizer, tool_mode).into_response())
    } else {
        collect_response(rx, meta, req.logprobs.is_some(), tokenizer, tool_mode).await
    }
}

/// How a chat with tools reads its output: calls are parsed out of it.
struct ToolMode {
    /// The opening of a call the prompt ended with (a required or named call): the
    /// output is the inside of that call.
    prefix: Option<String>,
    /// `parallel_tool_calls`: false keeps only the first call.
    parallel: bool,
}

impl ToolMode {
    /// A stream over the output, already told what the prompt opened.
    fn stream(&self) -> ToolCallStream {
        let mut s = ToolCallStream::default();
        if let Some(p) = &self.prefix {
            let opened = s.push(p);
            debug_assert!(opened.is_empty(), "an open call is held");
        }
        s
    }

    /// What closes the call the prompt opened, at the end of the output.
    fn suffix(&self) -> &'static str {
        if self.prefix.is_some() {
            "\n</tool_call>"
        } else {
            ""
        }
    }
}

/// A choice's `logprobs` value: null when not asked for.
fn logprobs_value(chat: bool, tokens: Option<&[api::TokenLogprob]>, tok: &Tokenizer) -> Value {
    match tokens {
        Some(t) => api::logprobs_json(chat, t, |id| tok.piece(id)),
        None => Value::Null,
    }
}

async fn collect_response(
    mut rx: UnboundedReceiver<Event>,
    meta: api::Meta,
    want_logprobs: bool,
    tokenizer: Arc<Tokenizer>,
    tools: Option<ToolMode>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Logprobs(l) => logprobs.extend(l),
            Event::Error(e) => return Err(ApiError::internal(&e)),
            Event::Done(u) => {
                let usage = api::usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens);
                let lp = logprobs_value(
                    meta.chat,
                    want_logprobs.then_some(&logprobs[..]),
                    &tokenizer,
                );
                let finish = job::finish_reason(u.stop);
                if let Some(mode) = &tools {
                    let mut s = mode.stream();
                    let mut content = String::new();
                    let mut calls = Vec::new();
                    let events = s.push(&text);
                    let closed = s.push(mode.suffix());
                    for e in events.into_iter().chain(closed).chain(s.finish()) {
                        match e {
                            StreamEvent::Text(t) => content.push_str(&t),
                            StreamEvent::Call(c) if mode.parallel || calls.is_empty() => {
                                calls.push(meta.call_json(calls.len(), &c))
                            }
                            StreamEvent::Call(_) => {}
                        }
                    }
                    if !calls.is_empty() {
                        let body =
                            meta.full_with_calls(content.trim(), &calls, "tool_calls", usage, lp);
                        return Ok(Json(body).into_response());
                    }
                    return Ok(Json(meta.full(&content, finish, usage, lp)).into_response());
                }
                return Ok(Json(meta.full(&text, finish, usage, lp)).into_response());
            }
        }
    }
    Err(ApiError::internal("the generation thread stopped"))
}

fn stream_response(
    rx: UnboundedReceiver<Event>,
    meta: api::Meta,
    include_usage: bool,
    tokenizer: Arc<Tokenizer>,
    tools: Option<ToolMode>,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    // With tools, the text goes through a call parser: (the parser, calls sent, the mode).
    let calls_state = tools.map(|mode| (mode.stream(), 0usize, mode));
    // States: 0 = send the role chunk (chat), 1 = relay events, 2 = [DONE] sent.
    // `lp`: log-probabilities waiting for the chunk that carries their text.
    let init = (
        rx,
        meta,
        0u8,
        Vec::<SseEvent>::new(),
        None::<Vec<api::TokenLogprob>>,
        calls_state,
    );
    let stream = futures_util::stream::unfold(
        init,
        move |(mut rx, meta, mut phase, mut pending, mut lp, mut calls_state)| {
            let tokenizer = tokenizer.clone();
            async move {
                let take_lp = |lp: &mut Option<Vec<api::TokenLogprob>>| {
                    logprobs_value(meta.chat, lp.take().as_deref(), &tokenizer)
                };
                loop {
                    if let Some(ev) = pending.pop() {
                        return Some((Ok(ev), (rx, meta, phase, pending, lp, calls_state)));
                    }
                    match phase {
                        0 => {
                            phase = 1;
                            if meta.chat {
                                let c = meta.chunk(
                                    Some(json!({"role": "assistant", "content": ""})),
                                    "",
                                    None,
                                    Value::Null,
                                );
                                pending.push(SseEvent::default().data(c.to_string()));
                            }
                        }
                        1 => match rx.recv().await {
                            Some(Event::Logprobs(l)) => lp.get_or_insert_with(Vec::new).extend(l),
                            Some(Event::Text(t)) => {
                                let l = take_lp(&mut lp);
                                match &mut calls_state {
                                    Some((parser, sent, mode)) => {
                                        let events = parser.push(&t);
                                        let chunks =
                                            tool_chunks(&meta, events, sent, mode.parallel, l);
                                        pending.extend(chunks.into_iter().rev());
                                    }
                                    None => {
                                        let c = meta.chunk(
                                            meta.chat.then(|| json!({"content": t})),
                                            &t,
                                            None,
                                            l,
                                        );
                                        pending.push(SseEvent::default().data(c.to_string()));
                                    }
                                }
                            }
                            Some(Event::Error(e)) => {
                                phase = 2;
                                let body = json!({"error": {"message": e, "type": "server_error", "param": null, "code": null}});
                                pending.push(SseEvent::default().data("[DONE]"));
                                pending.push(SseEvent::default().data(body.to_string()));
                            }
                            Some(Event::Done(usage)) => {
                                phase = 2;
                                // Pushed in reverse: popped last-in first-out.
                                pending.push(SseEvent::default().data("[DONE]"));
                                if include_usage {
                                    let mut u = meta.chunk(None, "", None, Value::Null);
                                    u["choices"] = json!([]);
                                    u["usage"] = api::usage(
                                        usage.prompt_tokens,
                                        usage.completion_tokens,
                                        usage.cached_tokens,
                                    );
                                    pending.push(SseEvent::default().data(u.to_string()));
                                }
                                let l = take_lp(&mut lp);
                                let mut finish = job::finish_reason(usage.stop);
                                let mut rest = Vec::new();
                                if let Some((parser, sent, mode)) = &mut calls_state {
                                    let mut events = parser.push(mode.suffix());
                                    events.extend(parser.finish());
                                    rest = tool_chunks(
                                        &meta,
                                        events,
                                        sent,
                                        mode.parallel,
                                        Value::Null,
                                    );
                                    if *sent > 0 {
                                        finish = "tool_calls";
                                    }
                                }
                                let c =
                                    meta.chunk(meta.chat.then(|| json!({})), "", Some(finish), l);
                                pending.push(SseEvent::default().data(c.to_string()));
                                pending.extend(rest.into_iter().rev());
                            }
                            None => return None,
                        },
                        _ => return None,
                    }
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// The chunks for what a call parser let out: text as content deltas, each call as one
/// `tool_calls` delta (its index, id, type, name and the whole arguments), OpenAI's stream
/// shape. `sent` counts the calls sent; without `parallel` only the first is. `logprobs`
/// go with the first chunk.
fn tool_chunks(
    meta: &api::Meta,
    events: Vec<StreamEvent>,
    sent: &mut usize,
    parallel: bool,
    logprobs: Value,
) -> Vec<SseEvent> {
    let mut lp = Some(logprobs);
    let mut out = Vec::new();
    for e in events {
        let delta = match e {
            StreamEvent::Text(t) if t.is_empty() => continue,
            StreamEvent::Text(t) => json!({"content": t}),
            StreamEvent::Call(_) if !parallel && *sent > 0 => continue,
            StreamEvent::Call(c) => {
                let mut call = meta.call_json(*sent, &c);
                call["index"] = json!(*sent);
                *sent += 1;
                json!({"tool_calls": [call]})
            }
        };
        let c = meta.chunk(Some(delta), "", None, lp.take().unwrap_or(Value::Null));
        out.push(SseEvent::default().data(c.to_string()));
    }
    out
}
