//! Chat templates: the GGUF's own `tokenizer.chat_template` (a Jinja template) rendered with
//! minijinja, so each model gets exactly the prompt format it was trained on.
//!
//! A template is a program written by whoever made the model file, so it runs in a sandbox
//! ([`TemplateLimits`]): an instruction budget (fuel) stops runaway loops, a recursion limit
//! stops runaway macros, and the output is capped. The environment has no loader (so
//! `include`/`import` of a path finds nothing) and no functions beyond the two below; it
//! cannot reach the filesystem or the process environment. minijinja itself caps `range`
//! at 100,000 items and `str * n` at 100 MB. What no limit here bounds is a value grown by
//! repeated concatenation (a string doubled in a loop reaches gigabytes in a few dozen
//! instructions): minijinja has no hook on value sizes, so that template would exhaust
//! memory before its fuel ran out. `sparrow serve` renders the template once at startup,
//! so such a file fails there rather than on a client's request.

use crate::error::{Error, Result};
use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};
use sparrow_gguf::Metadata;
use std::io;

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

/// What one render of a chat template may spend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TemplateLimits {
    /// Template instructions per render. Real templates spend a few hundred per message.
    pub fuel: u64,
    /// Nesting depth of loops, conditions and macro calls (minijinja's own counter).
    pub recursion: usize,
    /// Bytes of output beyond the messages' own text (which a template may repeat a few
    /// times, see [`TemplateLimits::output_limit`]).
    pub output_bytes: usize,
}

impl Default for TemplateLimits {
    /// 10 million instructions (well under a second; thousands of messages), depth 100,
    /// 1 MiB of template text.
    fn default() -> Self {
        TemplateLimits {
            fuel: 10_000_000,
            recursion: 100,
            output_bytes: 1 << 20,
        }
    }
}

impl TemplateLimits {
    /// The output cap for `messages`: [`Self::output_bytes`] plus four times their text (a
    /// template may quote a message more than once, e.g. a system prompt).
    pub fn output_limit(&self, messages: &[ChatMessage]) -> usize {
        let text: usize = messages
            .iter()
            .map(|m| m.content.len() + m.role.len())
            .sum();
        self.output_bytes.saturating_add(text.saturating_mul(4))
    }
}

/// A compiled chat template plus the special-token strings templates refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
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
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| Error::Template(format!("cannot compile: {e}")))?;
        Ok(ChatTemplate {
            env,
            limits,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
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
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| Error::Template(e.to_string()))?;
        let mut out = CappedWriter {
            out: Vec::new(),
            limit: self.limits.output_limit(messages),
            exceeded: false,
        };
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.out)
                .map_err(|_| Error::Template("the chat template produced invalid UTF-8".into())),
            Err(_) if out.exceeded => Err(Error::Template(format!(
                "the chat template's output passed its limit of {} bytes (1 MiB beyond four times the messages' text); the template in this model file is broken or hostile",
                out.limit
            ))),
            Err(e) => Err(Error::Template(self.describe(e))),
        }
    }

    /// The render error, naming the sandbox limit when one stopped the template.
    fn describe(&self, e: JinjaError) -> String {
        if e.kind() == ErrorKind::OutOfFuel {
            format!(
                "the chat template ran past its budget of {} instructions (a runaway loop?); the template in this model file is broken or hostile",
                self.limits.fuel
            )
        } else if e.to_string().contains("recursion limit") {
            format!(
                "the chat template nested deeper than its limit of {} levels; the template in this model file is broken or hostile",
                self.limits.recursion
            )
        } else {
            e.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let s = t.render(&[ChatMessage::new("user", " hi ")], true).unwrap();
        assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn builtin_gemma_turns() {
        let t = ChatTemplate::builtin("gemma").unwrap();
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", " What is a sparrow? "),
            ChatMessage::new("assistant", "A bird."),
            ChatMessage::new("user", "Name three planets."),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<start_of_turn>user\nBe brief.\n\nWhat is a sparrow?<end_of_turn>\n\
             <start_of_turn>model\nA bird.<end_of_turn>\n\
             <start_of_turn>user\nName three planets.<end_of_turn>\n<start_of_turn>model\n"
        );
        // The reference prompts of ../shared/data/reference/gemma_greedy.json, as rendered
        // there (without the BOS the tokenizer adds).
        assert_eq!(
            t.render(&[ChatMessage::new("user", "Name three planets.")], true)
                .unwrap(),
            "<start_of_turn>user\nName three planets.<end_of_turn>\n<start_of_turn>model\n"
        );
        assert!(ChatTemplate::builtin("vicuna").is_none());
        assert!(ChatTemplate::builtin("chatml")
            .unwrap()
            .render(&[ChatMessage::new("user", "hi")], true)
            .unwrap()
            .ends_with("<|im_start|>assistant\n"));
    }

    #[test]
    fn python_methods_and_exceptions() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{{ messages[0].content.upper() }}{{ bos_token }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "ab")], false).unwrap(),
            "AB<s>"
        );
        let e = t
            .render(&[ChatMessage::new("system", "x")], false)
            .unwrap_err();
        assert!(e.to_string().contains("first must be user"), "{e}");
    }

    #[test]
    fn bad_template_is_an_error() {
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }

    fn user(text: &str) -> Vec<ChatMessage> {
        vec![ChatMessage::new("user", text)]
    }

    /// The known hole: three nested `range(9999)` loops used to spin for ever.
    #[test]
    fn runaway_loop_stops_at_the_fuel_limit() {
        let t = ChatTemplate::new(
            "{% for a in range(9999) %}{% for b in range(9999) %}{% for c in range(9999) %}{% endfor %}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let e = t.render(&user("hi"), true).unwrap_err().to_string();
        assert!(e.contains("10000000 instructions"), "{e}");
    }

    #[test]
    fn runaway_recursion_stops_at_the_depth_limit() {
        let t = ChatTemplate::new(
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "",
            "",
        )
        .unwrap();
        let e = t.render(&user("hi"), true).unwrap_err().to_string();
        assert!(e.contains("deeper than its limit of 100"), "{e}");
    }

    #[test]
    fn huge_output_stops_at_the_output_limit() {
        // 100 KiB per iteration, few instructions: the output cap stops it, not the fuel.
        let t = ChatTemplate::new(
            "{% for i in range(99999) %}{{ 'x' * 102400 }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let msgs = user("hello");
        let limit = TemplateLimits::default().output_limit(&msgs);
        let e = t.render(&msgs, true).unwrap_err().to_string();
        assert!(e.contains(&format!("limit of {limit} bytes")), "{e}");
        // The cap grows with the messages: a long message quoted twice is fine.
        let long = "y".repeat(3 << 20);
        let twice = ChatTemplate::new("{{ messages[0].content }}{{ messages[0].content }}", "", "")
            .unwrap();
        assert_eq!(twice.render(&user(&long), false).unwrap().len(), 6 << 20);
    }

    #[test]
    fn templates_cannot_reach_files_or_the_environment() {
        for source in [
            "{% include '/etc/passwd' %}",
            "{% import '/etc/passwd' as p %}{{ p }}",
            "{% extends '/etc/hostname' %}",
            "{% from 'Cargo.toml' import x %}{{ x }}",
        ] {
            let t = ChatTemplate::new(source, "", "").unwrap();
            let e = t.render(&user("hi"), true).unwrap_err().to_string();
            assert!(
                e.contains("not found") || e.contains("template"),
                "{source}: {e}"
            );
            assert!(!e.contains("root:"), "{source} leaked a file: {e}");
        }
        // No globals beyond ours: environment lookups are undefined (render empty).
        let home = std::env::var("PATH").unwrap_or_default();
        for source in [
            "{{ env }}{{ environ }}{{ os }}{{ self.__init__ }}",
            "{{ config }}{{ cycler }}{{ lipsum }}{{ namespace.__class__ }}",
        ] {
            let t = ChatTemplate::new(source, "", "").unwrap();
            if let Ok(out) = t.render(&user("hi"), true) {
                assert!(home.is_empty() || !out.contains(&home), "{source}: {out}");
            }
        }
    }

    /// Real conversations stay far inside the limits.
    #[test]
    fn long_conversations_render_within_the_limits() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let msgs: Vec<ChatMessage> = (0..5000)
            .map(|i| {
                ChatMessage::new(
                    if i % 2 == 0 { "user" } else { "assistant" },
                    "some words here",
                )
            })
            .collect();
        let out = t.render(&msgs, true).unwrap();
        assert_eq!(out.matches("<|im_start|>").count(), 5001);
    }
}
