//! The OpenAI wire format: request parsing with precise 400 messages, response and chunk
//! bodies, and the error body (`{"error": {"message", "type", "param", "code"}}`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sparrow::chat::tool_calls;
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
    pub fn field(param: &str, message: String) -> Self {
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
    /// The functions the model may call (`tools`, each `{"type": "function", "function":
    /// {...}}` as sent), and how it may (`tool_choice`, `parallel_tool_calls`).
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    /// The messages as the chat template reads them when tools are involved (an
    /// assistant's `tool_calls` with their arguments as objects, a tool result's
    /// `tool_call_id`); `None` for plain chats.
    pub tool_messages: Option<Vec<Value>>,
    /// Read special-token text in the prompt (`<|im_start|>`) as those tokens, as `run`
    /// does; a completion request may say `"parse_special": false` to have it read as
    /// plain text. Chats always parse it (their template writes it).
    pub parse_special: bool,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default with tools).
    Auto,
    /// No calls: the output is text.
    None,
    /// A call of some tool (constrained: the output is one call).
    Required,
    /// A call of this function (constrained).
    Named(String),
}

/// A function name as OpenAI takes them: 1 to 64 letters, digits, `_` or `-`.
fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tools`: an array of `{"type": "function", "function": {"name", "description"?,
/// "parameters"?, "strict"?}}`; a 400 names the first field at fault.
fn parse_tools(o: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let arr = match o.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::field("tools", "'tools' must be an array".into())),
    };
    let mut names = Vec::new();
    for (i, t) in arr.iter().enumerate() {
        let at = |f: &str| format!("tools[{i}]{f}");
        let t = t
            .as_object()
            .ok_or_else(|| ApiError::field(&at(""), format!("'{}' must be an object", at(""))))?;
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::field(
                &at(".type"),
                format!("'{}' must be \"function\"", at(".type")),
            ));
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                ApiError::field(
                    &at(".function"),
                    format!("'{}' is required and must be an object", at(".function")),
                )
            })?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        if !valid_name(name) {
            return Err(ApiError::field(
                &at(".function.name"),
                format!(
                    "'{}' is required: 1 to 64 letters, digits, '_' or '-'",
                    at(".function.name")
                ),
            ));
        }
        if names.contains(&name) {
            return Err(ApiError::field(
                &at(".function.name"),
                format!("'{}': '{name}' is defined twice", at(".function.name")),
            ));
        }
        names.push(name);
        if !matches!(
            f.get("description"),
            None | Some(Value::Null | Value::String(_))
        ) {
            return Err(ApiError::field(
                &at(".function.description"),
                format!("'{}' must be a string", at(".function.description")),
            ));
        }
        if !matches!(
            f.get("parameters"),
            None | Some(Value::Null | Value::Object(_))
        ) {
            return Err(ApiError::field(
                &at(".function.parameters"),
                format!(
                    "'{}' must be a JSON Schema object",
                    at(".function.parameters")
                ),
            ));
        }
    }
    Ok(arr.clone())
}

/// `tool_choice`: `"auto"`, `"none"`, `"required"` or `{"type": "function", "function":
/// {"name"}}` naming one of `tools`.
fn parse_tool_choice(o: &Map<String, Value>, tools: &[Value]) -> Result<ToolChoice, ApiError> {
    let named = |n: &str| tools.iter().any(|t| t["function"]["name"] == n);
    let choice = match o.get("tool_choice") {
        None | Some(Value::Null) => {
            return Ok(if tools.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            })
        }
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::field(
                    "tool_choice",
                    format!(
                    "'tool_choice' is '{other}'; expected auto, none, required or a named function"
                ),
                ))
            }
        },
        Some(Value::Object(c)) => {
            let name = c
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| c.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ApiError::field(
                        "tool_choice",
                        "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": …}}".into(),
                    )
                })?;
            if !named(name) {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("'tool_choice' names '{name}', which is not among 'tools'"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(_) => {
            return Err(ApiError::field(
                "tool_choice",
                "'tool_choice' must be a string or an object".into(),
            ))
        }
    };
    if tools.is_empty() && choice != ToolChoice::None {
        return Err(ApiError::field(
            "tool_choice",
            "'tool_choice' needs 'tools'".into(),
        ));
    }
    Ok(choice)
}

/// A message as a tool-aware template reads it: `tool_calls` kept with their arguments
/// parsed into objects (templates write them with `tojson`), `tool_call_id` and `name` of
/// a tool result kept; 400s name the field at fault.
fn template_message(m: &Value, role: &str, content: &str, i: usize) -> Result<Value, ApiError> {
    let mut out = json!({"role": role, "content": content});
    if let Some(id) = m.get("tool_call_id").and_then(Value::as_str) {
        out["tool_call_id"] = json!(id);
    }
    if let Some(n) = m.get("name").and_then(Value::as_str) {
        out["name"] = json!(n);
    }
    match m.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) => {
            let mut list = Vec::new();
            for (j, c) in calls.iter().enumerate() {
                let p = format!("messages[{i}].tool_calls[{j}]");
                let f = c
                    .get("function")
                    .ok_or_else(|| ApiError::field(&p, format!("'{p}.function' is required")))?;
                let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::field(&p, format!("'{p}.function.name' must be a string"))
                })?;
                let args = match f.get("arguments") {
                    Some(Value::String(a)) => serde_json::from_str::<Value>(a).map_err(|e| {
                        ApiError::field(&p, format!("'{p}.function.arguments' is not JSON: {e}"))
                    })?,
                    Some(Value::Object(a)) => Value::Object(a.clone()),
                    None | Some(Value::Null) => json!({}),
                    Some(_) => {
                        return Err(ApiError::field(
                            &p,
                            format!("'{p}.function.arguments' must be a JSON string"),
                        ))
                    }
                };
                list.push(json!({
                    "id": c.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                }));
            }
            out["tool_calls"] = Value::Array(list);
        }
        Some(_) => {
            return Err(ApiError::field(
                &format!("messages[{i}].tool_calls"),
                format!("'messages[{i}].tool_calls' must be an array"),
            ))
        }
    }
    Ok(out)
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
    let mut tool_msgs = None;
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
        let mut template_msgs = Vec::new();
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
            template_msgs.push(template_message(m, role, &content, i)?);
            msgs.push(ChatMessage::new(role, &content));
        }
        tool_msgs = Some(template_msgs);
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
    let parse_special = match o.get("parse_special") {
        None | Some(Value::Null) => true,
        _ if chat => {
            return Err(ApiError::field(
                "parse_special",
                "'parse_special' applies to /v1/completions (a chat's template writes its special tokens)".into(),
            ))
        }
        _ => opt_bool(o, "parse_special")?,
    };
    let logprobs = parse_logprobs(o, chat)?;
    let tools = if chat { parse_tools(o)? } else { Vec::new() };
    let tool_choice = parse_tool_choice(o, &tools)?;
    let parallel_tool_calls = match o.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        _ => opt_bool(o, "parallel_tool_calls")?,
    };
    // Plain chats render as before; a chat with tools, calls or results reads the JSON.
    let uses_tools = !tools.is_empty()
        || tool_msgs.as_ref().is_some_and(|ms: &Vec<Value>| {
            ms.iter()
                .any(|m| m.get("tool_calls").is_some() || m["role"] == "tool")
        });
    if uses_tools && (json || schema.is_some()) && tool_choice != ToolChoice::None {
        return Err(ApiError::field(
            "response_format",
            "'response_format' with 'tools' is not supported (use tool_choice: none, or no tools)"
                .into(),
        ));
    }
    Ok(Request {
        parse_special,
        tools,
        tool_choice,
        parallel_tool_calls,
        tool_messages: if uses_tools { tool_msgs } else { None },
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

/// The request's `tools`, read a second time so each schema keeps its key order.
#[derive(Deserialize)]
struct OrderedTools {
    tools: Vec<OrderedTool>,
}
#[derive(Deserialize)]
struct OrderedTool {
    function: OrderedFunction,
}
#[derive(Deserialize)]
struct OrderedFunction {
    name: String,
    #[serde(default)]
    parameters: Option<OrderedValue>,
}

/// A call the output must be (`tool_choice` required or named).
pub struct ForcedCall {
    /// What the prompt ends with: the call's opening tag, so the model starts inside it.
    pub prefix: String,
    /// The compiled schema of the call's JSON — `{"name": <the function>, "arguments":
    /// <its parameters>}` — when one function is meant (named, or required with a single
    /// tool); with several tools a required call is steered by the opening tag alone.
    pub schema: Option<Arc<Schema>>,
}

/// The call `req` forces, if any (see [`ForcedCall`]); `body` is read again for the
/// parameters' key order.
pub fn forced_call(req: &Request, body: &[u8]) -> Result<Option<ForcedCall>, ApiError> {
    let name = match &req.tool_choice {
        ToolChoice::Auto | ToolChoice::None => return Ok(None),
        ToolChoice::Named(n) => n.clone(),
        ToolChoice::Required if req.tools.len() == 1 => req.tools[0]["function"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        ToolChoice::Required => {
            return Ok(Some(ForcedCall {
                prefix: format!("{}\n", tool_calls::OPEN),
                schema: None,
            }))
        }
    };
    let ordered: OrderedTools = serde_json::from_slice(body)
        .map_err(|e| ApiError::field("tools", format!("'tools' could not be read: {e}")))?;
    let (i, f) = ordered
        .tools
        .iter()
        .enumerate()
        .find(|(_, t)| t.function.name == name)
        .map(|(i, t)| (i, &t.function))
        .ok_or_else(|| ApiError::field("tool_choice", format!("no tool named '{name}'")))?;
    let params = match &f.parameters {
        Some(p) => p.canonical(),
        None => r#"{"type":"object","properties":{}}"#.to_string(),
    };
    let wrapper = format!(
        r#"{{"type":"object","properties":{{"name":{{"const":{}}},"arguments":{params}}},"required":["name","arguments"],"additionalProperties":false}}"#,
        serde_json::Value::String(name.clone())
    );
    let param = format!("tools[{i}].function.parameters");
    let schema = OrderedValue::parse(&wrapper)
        .map_err(|e| ApiError::field(&param, format!("'{param}': {e}")))
        .and_then(|v| {
            Schema::compile(&v).map_err(|e| ApiError::field(&param, format!("'{param}': {e}")))
        })?;
    Ok(Some(ForcedCall {
        prefix: format!("{}\n", tool_calls::OPEN),
        schema: Some(Arc::new(schema)),
    }))
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

    /// The non-streamed chat body of an answer that calls tools: `content` (null when
    /// empty) and `tool_calls`.
    pub fn full_with_calls(
        &self,
        content: &str,
        calls: &[Value],
        finish: &str,
        usage: Value,
        logprobs: Value,
    ) -> Value {
        let content = if content.is_empty() {
            Value::Null
        } else {
            json!(content)
        };
        json!({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": calls}, "logprobs": logprobs, "finish_reason": finish}],
            "usage": usage,
        })
    }

    /// A call as OpenAI writes it in `tool_calls`: its id, type and function.
    pub fn call_json(&self, index: usize, call: &tool_calls::ToolCall) -> Value {
        json!({
            "id": format!("call_{}_{index}", self.id),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        })
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

    /// A one-message chat request with `extra` fields after its messages.
    fn chat_with(extra: &str) -> Result<Request, ApiError> {
        let body = format!(r#"{{"messages": [{{"role": "user", "content": "x"}}]{extra}}}"#);
        parse_request(body.as_bytes(), true, 100)
    }

    fn with_format(rf: &str) -> Result<Request, ApiError> {
        chat_with(&format!(r#", "response_format": {rf}"#))
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

    const TOOL: &str = r#"{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "city": {"type": "string"}},
                       "required": ["zeta", "city"], "additionalProperties": false}}}"#;

    fn with_tools(extra: &str) -> Result<Request, ApiError> {
        chat_with(&format!(r#", "tools": [{TOOL}]{extra}"#))
    }

    #[test]
    fn tools_and_tool_choice() {
        let r = with_tools("").unwrap();
        assert_eq!(r.tool_choice, ToolChoice::Auto);
        assert!(r.parallel_tool_calls && r.tools.len() == 1 && r.tool_messages.is_some());
        let r = with_tools(r#", "tool_choice": "none", "parallel_tool_calls": false"#).unwrap();
        assert_eq!(r.tool_choice, ToolChoice::None);
        assert!(!r.parallel_tool_calls);
        // A plain chat keeps the plain path.
        let plain = parse_request(
            br#"{"messages": [{"role": "user", "content": "x"}]}"#,
            true,
            100,
        )
        .unwrap();
        assert!(plain.tool_messages.is_none() && plain.tool_choice == ToolChoice::None);

        // A named call: the prompt opens it, the schema holds the name and the parameters
        // in their declared order.
        let body = format!(
            r#"{{"messages": [{{"role": "user", "content": "x"}}], "tools": [{TOOL}], "tool_choice": {{"type": "function", "function": {{"name": "get_weather"}}}}}}"#
        );
        let r = parse_request(body.as_bytes(), true, 100).unwrap();
        assert_eq!(r.tool_choice, ToolChoice::Named("get_weather".into()));
        let forced = forced_call(&r, body.as_bytes()).unwrap().unwrap();
        assert_eq!(forced.prefix, "<tool_call>\n");
        let schema = forced.schema.expect("one function: a schema");
        let s = sparrow::grammar::SchemaState::new();
        assert_eq!(
            String::from_utf8(schema.completion(&s)).unwrap(),
            r#"{"name":"get_weather","arguments":{"zeta":"","city":""}}"#
        );
        // Required with one tool is that tool; auto forces nothing.
        let r = with_tools(r#", "tool_choice": "required""#).unwrap();
        let body = format!(
            r#"{{"messages": [{{"role": "user", "content": "x"}}], "tools": [{TOOL}], "tool_choice": "required"}}"#
        );
        assert!(forced_call(&r, body.as_bytes())
            .unwrap()
            .unwrap()
            .schema
            .is_some());
        assert!(forced_call(&with_tools("").unwrap(), b"{}")
            .unwrap()
            .is_none());

        // A call and its result, as the template reads them: arguments as an object.
        let body = br#"{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "2"}]}"#;
        let r = parse_request(body, true, 100).unwrap();
        let m = r.tool_messages.expect("tool messages");
        assert_eq!(m[0]["tool_calls"][0]["function"]["arguments"]["a"], 1);
        assert_eq!(m[1]["tool_call_id"], "c1");

        // Errors name the field.
        let param = |r: Result<Request, ApiError>| r.unwrap_err().param.unwrap_or_default();
        assert_eq!(param(with_tools(r#", "tool_choice": 3"#)), "tool_choice");
        assert_eq!(
            param(with_tools(
                r#", "response_format": {"type": "json_object"}"#
            )),
            "response_format"
        );
        let dup = format!(
            r#"{{"messages": [{{"role": "user", "content": "x"}}], "tools": [{TOOL}, {TOOL}]}}"#
        );
        assert_eq!(
            param(parse_request(dup.as_bytes(), true, 100)),
            "tools[1].function.name"
        );
        let bad_params = r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}"#;
        assert_eq!(
            param(parse_request(bad_params.as_bytes(), true, 100)),
            "tools[0].function.parameters"
        );
    }
}
