//! Chat templates: the GGUF's own `tokenizer.chat_template` (a Jinja template) rendered with
//! minijinja, so each model gets exactly the prompt format it was trained on.
//!
//! A template is a program written by whoever made the model file, so it runs in a sandbox
//! ([`TemplateLimits`]): an instruction budget (fuel) stops runaway loops, a recursion limit
//! stops runaway macros, the output is capped, and so is the heap a render may grow by
//! (a string doubled in a loop reaches gigabytes in a few dozen instructions, long before
//! the fuel runs out). The environment has no loader (so `include`/`import` of a path finds
//! nothing) and no functions beyond the two below; it cannot reach the filesystem or the
//! process environment. minijinja itself caps `range` at 100,000 items and `str * n` at
//! 100 MB.
//!
//! The heap cap is kept by the global allocator ([`TemplateAllocator`], which the `sparrow`
//! binary installs), the render running in a coroutine on the caller's thread: why, and
//! what it costs, in [`heap_cap`] and docs/reliability.md. Without that allocator renders
//! run with the other limits only.

pub mod heap_cap;
mod isolate;
mod limits;
pub mod tool_calls;

pub use heap_cap::TemplateAllocator;
pub use limits::TemplateLimits;

use crate::error::{Error, Result};
use minijinja::{context, Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use sparrow_gguf::Metadata;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Names [`ChatTemplate::builtin`] knows.
pub const BUILTIN_FORMATS: &[&str] = &["chatml", "gemma"];

/// ChatML (`<|im_start|>role … <|im_end|>`): Qwen's and SmolLM's format, and the fallback
/// `sparrow serve` uses for a model without a template.
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Gemma's turns: `<start_of_turn>user|model … <end_of_turn>`, no system role (a system
/// message is put before the first user message's text, blank line between), content
/// trimmed. The BOS token is not written here: the tokenizer adds it (`add_bos_token`).
const GEMMA: &str = "{%- set ns = namespace(prefix='') -%}\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}{%- set ns.prefix = ns.prefix + (m.content | trim) + '\n\n' -%}\
{%- else -%}\
{{ '<start_of_turn>' + ('model' if m.role == 'assistant' else m.role) + '\n' + ns.prefix + (m.content | trim) + '<end_of_turn>\n' }}\
{%- set ns.prefix = '' -%}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}";

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A compiled chat template plus the special-token strings templates refer to.
pub struct ChatTemplate {
    compiled: Arc<Compiled>,
    /// Set once a render passed the heap cap: its worker is stopped for good holding up to
    /// the cap, so later renders are refused at once rather than each leaving another.
    over_memory: AtomicBool,
}

/// What a render needs, shared with the render's thread.
struct Compiled {
    env: Environment<'static>,
    /// Whether the template refers to `tools` at all (a template that does not cannot
    /// show a model the functions it may call).
    takes_tools: bool,
    limits: TemplateLimits,
    bos_token: String,
    eos_token: String,
}

/// A writer that refuses to grow past `limit` bytes (the output cap).
struct CappedWriter {
    out: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            self.exceeded = true;
            return Err(io::Error::other("chat template output limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn raise_exception(msg: String) -> std::result::Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compile `source` under the default [`TemplateLimits`]. `bos_token`/`eos_token` are
    /// exposed to the template as variables.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        Self::with_limits(source, bos_token, eos_token, TemplateLimits::default())
    }

    /// Compile `source` to render under `limits`.
    pub fn with_limits(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        limits: TemplateLimits,
    ) -> Result<Self> {
        // Compiling folds constant expressions (`"x" * 99999999 ~ "x" * 99999999` is one
        // string at compile time), so it runs under the heap cap too.
        let owned = source.to_string();
        let takes_tools = source.contains("tools");
        let compile_limit = limits.compile_limit(source.len());
        let env = match isolate::run_capped(compile_limit, move || compile(owned, limits)) {
            Ok(env) => env?,
            Err(stopped) => return Err(stopped_error(stopped, compile_limit)),
        };
        Ok(ChatTemplate {
            compiled: Arc::new(Compiled {
                env,
                takes_tools,
                limits,
                bos_token: bos_token.to_string(),
                eos_token: eos_token.to_string(),
            }),
            over_memory: AtomicBool::new(false),
        })
    }

    /// A built-in format by name (`chatml`, `gemma`; see [`BUILTIN_FORMATS`]): for a model
    /// file without a template, or to override one. `None` for an unknown name.
    pub fn builtin(name: &str) -> Option<Self> {
        let source = match name {
            "chatml" => CHATML,
            "gemma" => GEMMA,
            _ => return None,
        };
        Some(Self::new(source, "", "").expect("the built-in templates compile"))
    }

    /// The built-in format a model of `arch` was trained on, for a file that carries no
    /// template (Gemma 3 GGUFs often do not): Gemma's turns for gemma3, else none.
    pub fn builtin_for(arch: crate::model::Architecture) -> Option<Self> {
        match arch {
            crate::model::Architecture::Gemma3 => Self::builtin("gemma"),
            _ => None,
        }
    }

    /// The template stored in the model's metadata, if it has one. `token_text` maps a token
    /// id to its text (for `bos_token`/`eos_token`).
    pub fn from_metadata(
        md: &Metadata,
        token_text: impl Fn(u32) -> Option<String>,
    ) -> Result<Option<Self>> {
        let Some(source) = md.opt_str("tokenizer.chat_template")? else {
            return Ok(None);
        };
        let text_of = |key: &str| -> Result<String> {
            Ok(md.opt_u32(key)?.and_then(&token_text).unwrap_or_default())
        };
        let bos = text_of("tokenizer.ggml.bos_token_id")?;
        let eos = text_of("tokenizer.ggml.eos_token_id")?;
        Self::new(source, &bos, &eos).map(Some)
    }

    /// Render `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins.
    ///
    /// A template that breaks a limit is stopped with an error naming the limit.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let c = &self.compiled;
        self.render_ctx(c.limits.output_limit(messages), || {
            context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => c.bos_token,
                eos_token => c.eos_token,
            }
        })
    }

    /// Whether the template shows the model a list of `tools` (it refers to them).
    pub fn takes_tools(&self) -> bool {
        self.compiled.takes_tools
    }

    /// Render messages given as JSON (OpenAI's shape: an assistant's `tool_calls`, a tool
    /// result's `tool_call_id`, as templates written for tools read them) with the
    /// function definitions `tools` (none: the template's `tools` is undefined).
    pub fn render_with_tools(
        &self,
        messages: &[serde_json::Value],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let text: usize = messages
            .iter()
            .chain(tools)
            .map(|v| v.to_string().len())
            .sum();
        let c = &self.compiled;
        let tools = (!tools.is_empty()).then(|| Value::from_serialize(tools));
        self.render_ctx(c.limits.output_limit_for(text), || {
            context! {
                messages => Value::from_serialize(messages),
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => c.bos_token,
                eos_token => c.eos_token,
            }
        })
    }

    /// Render the context `ctx` makes, its output capped at `output_limit` bytes, under the
    /// other limits.
    fn render_ctx(&self, output_limit: usize, ctx: impl FnOnce() -> Value) -> Result<String> {
        let c = &self.compiled;
        let memory_limit = c.limits.memory_limit(output_limit);
        if self.over_memory.load(Ordering::Relaxed) {
            return Err(stopped_error(isolate::Stopped::OverCap, memory_limit));
        }
        let ctx = ctx();
        let job = Arc::clone(c);
        match isolate::run_capped(memory_limit, move || job.render(ctx, output_limit)) {
            Ok(rendered) => rendered,
            Err(stopped) => {
                if matches!(stopped, isolate::Stopped::OverCap) {
                    self.over_memory.store(true, Ordering::Relaxed);
                }
                Err(stopped_error(stopped, memory_limit))
            }
        }
    }
}

/// A minijinja environment holding `source` as the template `chat`, sandboxed by `limits`.
fn compile(source: String, limits: TemplateLimits) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    env.set_fuel(Some(limits.fuel));
    env.set_recursion_limit(limits.recursion);
    // Templates are written for Python's Jinja: allow str methods like .strip().
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |fmt: String| -> String {
        // Templates use this for a "today's date" line; we render a fixed, honest
        // placeholder rather than pull in a date library for it.
        let _ = fmt;
        "today".to_string()
    });
    env.add_template_owned("chat", source)
        .map_err(|e| Error::Template(format!("cannot compile: {e}")))?;
    Ok(env)
}

/// The error of capped work (a compile or a render) that was stopped; `limit` is its cap.
fn stopped_error(stopped: isolate::Stopped, limit: usize) -> Error {
    Error::Template(match stopped {
        isolate::Stopped::OverCap => format!(
            "its values passed the memory limit of {limit} bytes ({} MiB); the template in this model file is broken or hostile",
            limit >> 20
        ),
        isolate::Stopped::Panicked => "its compiler or renderer panicked; the template in this model file is broken or hostile".into(),
        isolate::Stopped::NoStack(e) => format!("cannot map a stack to render it on: {e}"),
    })
}

impl Compiled {
    /// Render the template on `ctx`, its output capped at `output_limit` bytes.
    fn render(&self, ctx: Value, output_limit: usize) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| Error::Template(e.to_string()))?;
        let mut out = CappedWriter {
            out: Vec::new(),
            limit: output_limit,
            exceeded: false,
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.out)
                .map_err(|_| Error::Template("it produced invalid UTF-8".into())),
            Err(_) if out.exceeded => Err(Error::Template(format!(
                "its output passed the limit of {} bytes (1 MiB beyond four times the messages' text); the template in this model file is broken or hostile",
                out.limit
            ))),
            Err(e) => Err(Error::Template(self.describe(e))),
        }
    }

    /// The render error, naming the sandbox limit when one stopped the template.
    fn describe(&self, e: JinjaError) -> String {
        if e.kind() == ErrorKind::OutOfFuel {
            format!(
                "it ran past its budget of {} instructions (a runaway loop?); the template in this model file is broken or hostile",
                self.limits.fuel
            )
        } else if e.to_string().contains("recursion limit") {
            format!(
                "it nested deeper than its limit of {} levels; the template in this model file is broken or hostile",
                self.limits.recursion
            )
        } else if e.to_string().contains("repeated string is too large") {
            "it repeated a string past minijinja's limit of 100000000 bytes; the template in this model file is broken or hostile".to_string()
        } else {
            e.to_string()
        }
    }
}

#[cfg(test)]
mod tests;
