//! Chat templates: the GGUF's own `tokenizer.chat_template` (a Jinja template) rendered with
//! minijinja, so each model gets exactly the prompt format it was trained on.

use crate::error::{Error, Result};
use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};
use sparrow_gguf::Metadata;

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
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

fn raise_exception(msg: String) -> std::result::Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compile `source`. `bos_token`/`eos_token` are exposed to the template as variables.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
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
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
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
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self.env.get_template("chat").expect("added in new()");
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(|e| Error::Template(e.to_string()))
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
}
