//! The OpenAI wire format: request parsing with precise 400 messages, response and chunk
//! bodies, and the error body (`{"error": {"message", "type", "param", "code"}}`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sparrow::grammar::{OrderedValue, Schema};
use sparrow::{ChatMessage, SamplerConfig};
use std::sync::Arc;

/// An error answered as OpenAI does.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub param: Option<String>,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: &str) -> Self {
        ApiError {
            status,
            code,
            param: None,
            message: message.to_string(),
        }
    }
    /// A 400 for the request as a whole.
    pub fn bad(message: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
    /// A 400 naming the offending field.
    pub fn bad_param(message: &str, param: &str, code: &'static str) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, code, message)
        }
    }
    fn field(param: &str, message: String) -> Self {
        Self::bad_param(&message, param, "invalid_value")
    }
    pub fn internal(message: &str) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::INTERNAL_SERVER_ERROR => "server_error",
            StatusCode::NOT_FOUND => "not_found_error",
            _ => "invalid_request_error",
        };
        let body = json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
        }});
        let mut r = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}

pub use sparrow::TokenLogprob;

/// A checked request.
#[derive(Debug)]
pub struct Request {
    pub messages: Option<Vec<ChatMessage>>,
    pub prompt: Option<String>,
    pub max_tokens: Option<usize>,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// `response_format: {"type": "json_object"}`.
    pub json: bool,
    /// `response_format: {"type": "json_schema", ...}`: the compiled schema (build the
    /// constraint with `sparrow::grammar::JsonConstraint::with_schema`).
    pub schema: Option<Arc<Schema>>,
    pub ignore_eos: bool,
    /// Report log-probabilities with this many alternatives per token (chat:
    /// `logprobs: true` + `top_logprobs`; completions: `logprobs: N`).
    pub logprobs: Option<usize>,
}

fn opt_f32(o: &Map<String, Value>, key: &str, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let x = v
                .as_f64()
                .ok_or_else(|| ApiError::field(key, format!("'{key}' must be a number")))?
                as f32;
            if !(lo..=hi).contains(&x) {
                return Err(ApiError::field(
                    key,
                    format!("'{key}' must be between {lo} and {hi}, got {x}"),
                ));
            }
            Ok(Some(x))
        }
    }
}

fn opt_uint(o: &Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::field(key, format!("'{key}' must be a non-negative integer"))),
    }
}

fn opt_bool(o: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::field(
            key,
            format!("'{key}' must be true or false"),
        )),
    }
}

/// The text of a message's `content`: a string, or an array of `{"type":"text","text":…}`.
fn content_text(v: &Value, i: usize) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::field(
                            &param,
                            format!("'{param}': only text parts are supported"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::field(
            &param,
            format!("'{param}' must be a string or an array of text parts"),
        )),
    }
}

/// Parse and check a request body. `chat`: /v1/chat/completions (else /v1/completions).
pub fn parse_request(
    body: &[u8],
    chat: bool,
    max_tokens_limit: usize,
) -> Result<Request, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(&format!("the request body is not valid JSON: {e}")))?;
    let o = v
        .as_object()
        .ok_or_else(|| ApiError::bad("the request body must be a JSON object"))?;
    let (messages, prompt) = if chat {
        let arr = o.get("messages").and_then(Value::as_array).ok_or_else(|| {
            ApiError::field(
                "messages",
                "'messages' is required and must be an array".into(),
            )
        })?;
        if arr.is_empty() {
            return Err(ApiError::field(
                "messages",
                "'messages' must not be empty".into(),
            ));
        }
        let mut msgs = Vec::new();
        for (i, m) in arr.iter().enumerate() {
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
                ApiError::field(
                    &format!("messages[{i}].role"),
                    format!("'messages[{i}].role' must be a string"),
                )
            })?;
            if !matches!(role, "system" | "user" | "assistant" | "developer" | "tool") {
                return Err(ApiError::field(
                    &format!("messages[{i}].role"),
                    format!("'messages[{i}].role' is '{role}'; expected system, user, assistant, developer or tool"),
                ));
            }
            let role = if role == "developer" { "system" } else { role };
            let content = content_text(m.get("content").unwrap_or(&Value::Null), i)?;
            msgs.push(ChatMessage::new(role, &content));
        }
        (Some(msgs), None)
    } else {
        let p = match o.get("prompt") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                a[0].as_str().unwrap_or_default().to_string()
            }
            Some(Value::Array(_)) => {
                return Err(ApiError::field(
                    "prompt",
                    "'prompt' arrays must hold exactly one string".into(),
                ))
            }
            _ => {
                return Err(ApiError::field(
                    "prompt",
                    "'prompt' is required and must be a string".into(),
                ))
            }
        };
        (None, Some(p))
    };
    let max_tokens = match opt_uint(o, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => opt_uint(o, "max_tokens")?,
    };
    if let Some(n) = max_tokens {
        if n == 0 || n > max_tokens_limit as u64 {
            return Err(ApiError::field(
                "max_tokens",
                format!("'max_tokens' must be between 1 and this server's limit of {max_tokens_limit}, got {n}"),
            ));
        }
    }
    if let Some(n) = opt_uint(o, "n")? {
        if n != 1 {
            return Err(ApiError::field("n", "only n = 1 is supported".into()));
        }
    }
    let mut sampler = SamplerConfig::default();
    if let Some(t) = opt_f32(o, "temperature", 0.0, 2.0)? {
        sampler.temperature = t;
    }
    if let Some(p) = opt_f32(o, "top_p", 0.0, 1.0)? {
        sampler.top_p = p;
    }
    if let Some(p) = opt_f32(o, "min_p", 0.0, 1.0)? {
        sampler.min_p = p;
    }
    if let Some(p) = opt_f32(o, "repeat_penalty", 0.01, 10.0)? {
        sampler.repeat_penalty = p;
    }
    if let Some(k) = opt_uint(o, "top_k")? {
        sampler.top_k = k as usize;
    }
    sampler.seed = match o.get("seed") {
        None | Some(Value::Null) => SystemTimeSeed::next(),
        Some(v) => v
            .as_i64()
            .map(|s| s as u64)
            .or_else(|| v.as_u64())
            .ok_or_else(|| ApiError::field("seed", "'seed' must be an integer".into()))?,
    };
    let stop = match o.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::field(
                    "stop",
                    "'stop' must be a string or an array of strings".into(),
                )
            })?,
        Some(_) => {
            return Err(ApiError::field(
                "stop",
                "'stop' must be a string or an array of strings".into(),
            ))
        }
    };
    if stop.len() > 4 || stop.iter().any(|s| s.is_empty()) {
        return Err(ApiError::field(
            "stop",
            "'stop' takes up to 4 non-empty strings".into(),
        ));
    }
    let stream = opt_bool(o, "stream")?;
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) => opt_bool(so, "include_usage")?,
        Some(_) => {
            return Err(ApiError::field(
                "stream_options",
                "'stream_options' must be an object".into(),
            ))
        }
    };
    let (json, schema) = match o.get("response_format") {
        None | Some(Value::Null) => (false, None),
        Some(rf) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => (false, None),
            Some("json_object") => (true, None),
            Some("json_schema") => (false, Some(parse_json_schema(rf, body)?)),
            Some(other) => {
                return Err(ApiError::field(
                    "response_format",
                    format!(
                    "response_format type '{other}' is not supported (use 'text', 'json_object' or 'json_schema')"
                ),
                ))
            }
            None => {
                return Err(ApiError::field(
                    "response_format",
                    "'response_format' must be {\"type\": …}".into(),
                ))
            }
        },
    };
    // llama-server's extension: keep generating past end-of-generation tokens.
    let ignore_eos = opt_bool(o, "ignore_eos")?;
    let logprobs = parse_logprobs(o, chat)?;
    Ok(Request {
        logprobs,
        ignore_eos,
        messages,
        prompt,
        max_tokens: max_tokens.map(|n| n as usize),
        sampler,
        stop,
        stream,
        include_usage,
        json,
        schema,
    })
}

/// The path to a request's schema, read a second time so object keys keep their order
/// (`serde_json::Value` sorts them; properties are generated in the declared order).
#[derive(Deserialize)]
struct OrderedBody {
    response_format: OrderedFormat,
}
#[derive(Deserialize)]
struct OrderedFormat {
    json_schema: OrderedJsonSchema,
}
#[derive(Deserialize)]
struct OrderedJsonSchema {
    schema: OrderedValue,
}

/// `response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict",
/// "description"}}` (OpenAI's shape), compiled. Every constraint is enforced whatever
/// `strict` says.
fn parse_json_schema(rf: &Value, body: &[u8]) -> Result<Arc<Schema>, ApiError> {
    const P: &str = "response_format.json_schema";
    let js = match rf.get("json_schema") {
        Some(Value::Object(js)) => js,
        _ => {
            return Err(ApiError::field(
                P,
                format!("'{P}' is required with type 'json_schema' and must be an object"),
            ))
        }
    };
    if let Some(k) = js
        .keys()
        .find(|k| !matches!(k.as_str(), "name" | "schema" | "strict" | "description"))
    {
        return Err(ApiError::field(
            P,
            format!(
                "'{P}' has an unknown field '{k}' (expected name, schema, strict, description)"
            ),
        ));
    }
    let name_ok = |n: &str| {
        (1..=64).contains(&n.len())
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    match js.get("name") {
        Some(Value::String(n)) if name_ok(n) => {}
        _ => {
            return Err(ApiError::field(
                &format!("{P}.name"),
                format!("'{P}.name' is required: 1 to 64 letters, digits, '_' or '-'"),
            ))
        }
    }
    if !matches!(js.get("strict"), None | Some(Value::Null | Value::Bool(_))) {
        return Err(ApiError::field(
            &format!("{P}.strict"),
            format!("'{P}.strict' must be true or false"),
        ));
    }
    if !matches!(
        js.get("description"),
        None | Some(Value::Null | Value::String(_))
    ) {
        return Err(ApiError::field(
            &format!("{P}.description"),
            format!("'{P}.description' must be a string"),
        ));
    }
    let param = format!("{P}.schema");
    if !matches!(js.get("schema"), Some(Value::Object(_))) {
        return Err(ApiError::field(
            &param,
            format!("'{param}' is required and must be an object"),
        ));
    }
    let ordered: OrderedBody = serde_json::from_slice(body)
        .map_err(|e| ApiError::field(&param, format!("'{param}' could not be read: {e}")))?;
    Schema::compile(&ordered.response_format.json_schema.schema)
        .map(Arc::new)
        .map_err(|e| ApiError::field(&param, format!("'{param}': {e}")))
}

/// Chat: `logprobs` (bool) and `top_logprobs` (0..=20, only with `logprobs: true`).
/// Completions: `logprobs` (0..=5 alternatives, or null). OpenAI's limits.
fn parse_logprobs(o: &Map<String, Value>, chat: bool) -> Result<Option<usize>, ApiError> {
    if !chat {
        if o.get("top_logprobs").is_some_and(|v| !v.is_null()) {
            return Err(ApiError::field(
                "top_logprobs",
                "'top_logprobs' belongs to chat completions; here 'logprobs' takes the number of alternatives (0 to 5)".into(),
            ));
        }
        return match o.get("logprobs") {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= 5 => Ok(Some(n as usize)),
                _ => Err(ApiError::field(
                    "logprobs",
                    format!("'logprobs' must be an integer from 0 to 5, got {v}"),
                )),
            },
        };
    }
    let on = match o.get("logprobs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ApiError::field(
                "logprobs",
                format!("'logprobs' must be true or false, got {v}"),
            ))
        }
    };
    let top = match o.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n <= 20 => Some(n as usize),
            _ => {
                return Err(ApiError::field(
                    "top_logprobs",
                    format!("'top_logprobs' must be an integer from 0 to 20, got {v}"),
                ))
            }
        },
    };
    match (on, top) {
        (false, Some(_)) => Err(ApiError::field(
            "top_logprobs",
            "'top_logprobs' needs 'logprobs': true".into(),
        )),
        (false, None) => Ok(None),
        (true, top) => Ok(Some(top.unwrap_or(0))),
    }
}

/// The `logprobs` object of a choice for `tokens` (chat: `{"content": [...]}`;
/// completions: the parallel `tokens`/`token_logprobs`/`top_logprobs`/`text_offset`
/// arrays). `piece` gives a token's bytes.
pub fn logprobs_json<'a>(
    chat: bool,
    tokens: &[TokenLogprob],
    piece: impl Fn(u32) -> &'a [u8],
) -> Value {
    let text = |id: u32| String::from_utf8_lossy(piece(id)).into_owned();
    if chat {
        let entry =
            |id: u32, lp: f32| json!({"token": text(id), "logprob": lp, "bytes": piece(id)});
        let content: Vec<Value> = tokens
            .iter()
            .map(|t| {
                let mut e = entry(t.id, t.logprob);
                e["top_logprobs"] = t.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                e
            })
            .collect();
        json!({"content": content, "refusal": null})
    } else {
        let top: Vec<Value> = tokens
            .iter()
            .map(|t| {
                // Keyed by text, as OpenAI's format is: tokens that render alike (say, two
                // bytes of a split character, both U+FFFD) keep the likelier one.
                let mut m = Map::new();
                for &(id, lp) in &t.top {
                    m.entry(text(id)).or_insert(json!(lp));
                }
                Value::Object(m)
            })
            .collect();
        json!({
            "tokens": tokens.iter().map(|t| text(t.id)).collect::<Vec<_>>(),
            "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
            "top_logprobs": top,
            "text_offset": tokens.iter().map(|t| t.offset).collect::<Vec<_>>(),
        })
    }
}

/// A seed per request when the client gives none.
struct SystemTimeSeed;
impl SystemTimeSeed {
    fn next() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ N.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
    }
}

/// The `usage` object.
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// What every body of one response repeats.
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub chat: bool,
}

impl Meta {
    /// The non-streamed body.
    pub fn full(&self, text: &str, finish: &str, usage: Value, logprobs: Value) -> Value {
        if self.chat {
            json!({
                "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": finish}],
                "usage": usage,
            })
        } else {
            json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
                "usage": usage,
            })
        }
    }

    /// One streamed chunk: `delta` for chat, `text` for completions.
    pub fn chunk(
        &self,
        delta: Option<Value>,
        text: &str,
        finish: Option<&str>,
        logprobs: Value,
    ) -> Value {
        if self.chat {
            json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta.unwrap_or_else(|| json!({})), "logprobs": logprobs, "finish_reason": finish}],
            })
        } else {
            json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        parse_request(body.as_bytes(), true, 100)
            .unwrap_err()
            .message
    }

    #[test]
    fn clear_errors() {
        assert!(err("{").contains("not valid JSON"));
        assert!(err("[]").contains("JSON object"));
        assert!(err("{}").contains("'messages' is required"));
        assert!(err(r#"{"messages": []}"#).contains("must not be empty"));
        assert!(err(r#"{"messages": [{"role": "wizard", "content": "x"}]}"#).contains("wizard"));
        let m = r#""messages": [{"role": "user", "content": "x"}]"#;
        assert!(err(&format!("{{{m}, \"max_tokens\": 1000}}")).contains("limit of 100"));
        assert!(err(&format!("{{{m}, \"max_tokens\": -1}}")).contains("non-negative"));
        assert!(err(&format!("{{{m}, \"temperature\": 9}}")).contains("between 0 and 2"));
        assert!(err(&format!("{{{m}, \"temperature\": \"hot\"}}")).contains("number"));
        assert!(err(&format!("{{{m}, \"stop\": 3}}")).contains("'stop'"));
        assert!(err(&format!("{{{m}, \"n\": 2}}")).contains("n = 1"));
        assert!(err(&format!(
            "{{{m}, \"response_format\": {{\"type\": \"json_grammar\"}}}}"
        ))
        .contains("not supported"));
        let ok = parse_request(
            format!("{{{m}, \"stop\": [\"a\"], \"seed\": 5, \"response_format\": {{\"type\": \"json_object\"}}, \"stream\": true}}").as_bytes(),
            true,
            100,
        )
        .unwrap();
        assert!(ok.json && ok.stream && ok.sampler.seed == 5 && ok.stop == ["a"]);
    }

    fn with_format(rf: &str) -> Result<Request, ApiError> {
        let body = format!(
            r#"{{"messages": [{{"role": "user", "content": "x"}}], "response_format": {rf}}}"#
        );
        parse_request(body.as_bytes(), true, 100)
    }

    #[test]
    fn json_schema_response_format() {
        use sparrow::grammar::{Grammar, SchemaState};
        let ok = with_format(
            r#"{"type": "json_schema", "json_schema": {"name": "person_1", "strict": true,
                "schema": {"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "boolean"}},
                           "required": ["zeta", "alpha"], "additionalProperties": false}}}"#,
        )
        .unwrap();
        assert!(!ok.json);
        let schema = ok.schema.expect("a schema");
        // The declared order survives the request parsing (serde_json's Value would sort).
        let mut s = SchemaState::new();
        assert_eq!(schema.completion(&s), br#"{"zeta":0,"alpha":true}"#);
        assert!(!schema.feed(&mut s, br#"{"alpha""#));
        assert!(with_format(r#"{"type": "json_object"}"#)
            .unwrap()
            .schema
            .is_none());

        let bad = |rf: &str| {
            let e = with_format(rf).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            (e.param.unwrap_or_default(), e.message)
        };
        let (param, msg) = bad(r#"{"type": "json_schema"}"#);
        assert_eq!(param, "response_format.json_schema");
        assert!(msg.contains("is required"), "{msg}");
        let (param, msg) =
            bad(r#"{"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}"#);
        assert_eq!(param, "response_format.json_schema.name");
        assert!(msg.contains("1 to 64"), "{msg}");
        let (param, _) = bad(
            r#"{"type": "json_schema", "json_schema": {"name": "a b", "schema": {"type": "string"}}}"#,
        );
        assert_eq!(param, "response_format.json_schema.name");
        let (param, _) = bad(
            r#"{"type": "json_schema", "json_schema": {"name": "a", "strict": "yes", "schema": {"type": "string"}}}"#,
        );
        assert_eq!(param, "response_format.json_schema.strict");
        let (param, msg) =
            bad(r#"{"type": "json_schema", "json_schema": {"name": "a", "schemas": {}}}"#);
        assert_eq!(param, "response_format.json_schema");
        assert!(msg.contains("unknown field 'schemas'"), "{msg}");
        let (param, _) =
            bad(r#"{"type": "json_schema", "json_schema": {"name": "a", "schema": "string"}}"#);
        assert_eq!(param, "response_format.json_schema.schema");
        let (param, msg) = bad(
            r#"{"type": "json_schema", "json_schema": {"name": "a", "schema":
                {"type": "object", "properties": {"name": {"type": "string", "pattern": "^a"}}}}}"#,
        );
        assert_eq!(param, "response_format.json_schema.schema");
        assert_eq!(
            msg,
            "'response_format.json_schema.schema': unsupported schema keyword 'pattern' at /properties/name"
        );
        let (_, msg) = bad(
            r##"{"type": "json_schema", "json_schema": {"name": "a", "schema": {"$ref": "#/x"}}}"##,
        );
        assert!(
            msg.ends_with("unsupported schema keyword '$ref' at /"),
            "{msg}"
        );
        let (_, msg) = bad(
            r#"{"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "additionalProperties": true}}}"#,
        );
        assert!(msg.contains("additionalProperties"), "{msg}");
    }
}
