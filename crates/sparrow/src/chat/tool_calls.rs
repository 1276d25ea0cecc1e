//! Tool calls in a model's output: the `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
//! blocks that Qwen2.5's chat template asks for (the Hermes format, which many other
//! templates share), turned into calls — whole ([`parse`]) or as the text streams in
//! ([`ToolCallStream`]). A block that does not hold a call (not JSON, no name, arguments
//! that are not an object) stays plain text, as does one the generation never closed.

use serde_json::{Map, Value};

/// Where a call starts and ends in the output.
pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// One call: the function's name and its arguments as JSON text (an object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// An output split into its text (outside the calls, trimmed) and its calls, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// The call a block's inside holds, if it holds one: a JSON object with a string `name`
/// and `arguments` that are an object (or a string holding one, as some models write).
pub fn call_of(inside: &str) -> Option<ToolCall> {
    let v: Map<String, Value> = serde_json::from_str(inside.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    if name.is_empty() {
        return None;
    }
    let arguments = match v.get("arguments") {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::Object(o)) => Value::Object(o.clone()).to_string(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(o)) => Value::Object(o).to_string(),
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(ToolCall { name, arguments })
}

/// Split a whole output into text and calls.
pub fn parse(text: &str) -> Parsed {
    let mut stream = ToolCallStream::default();
    let mut out = Parsed::default();
    for event in stream.push(text).into_iter().chain(stream.finish()) {
        match event {
            StreamEvent::Text(t) => out.content.push_str(&t),
            StreamEvent::Call(c) => out.calls.push(c),
        }
    }
    out.content = out.content.trim().to_string();
    out
}

/// What a [`ToolCallStream`] lets out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamEvent {
    /// Text that is final and not part of a call.
    Text(String),
    /// A complete call.
    Call(ToolCall),
}

/// Finds calls in text that arrives in pieces: text that may be the start of a call is held
/// back until it is known not to be, and a call is let out once its block closes.
#[derive(Debug, Default)]
pub struct ToolCallStream {
    /// Text not yet let out: the start of a possible block, or a block still open.
    held: String,
}

impl ToolCallStream {
    /// Take the next piece of output; what became final.
    pub fn push(&mut self, piece: &str) -> Vec<StreamEvent> {
        self.held.push_str(piece);
        let mut out = Vec::new();
        loop {
            match self.held.find(OPEN) {
                Some(at) => {
                    if at > 0 {
                        out.push(StreamEvent::Text(self.held[..at].to_string()));
                        self.held.drain(..at);
                    }
                    let Some(end) = self.held.find(CLOSE) else {
                        break;
                    };
                    let block: String = self.held.drain(..end + CLOSE.len()).collect();
                    match call_of(&block[OPEN.len()..end]) {
                        Some(call) => out.push(StreamEvent::Call(call)),
                        None => out.push(StreamEvent::Text(block)),
                    }
                }
                None => {
                    // Keep the longest tail that could begin `<tool_call>`.
                    let keep = (1..OPEN.len().min(self.held.len() + 1))
                        .rev()
                        .find(|&k| {
                            self.held.is_char_boundary(self.held.len() - k)
                                && OPEN.starts_with(&self.held[self.held.len() - k..])
                        })
                        .unwrap_or(0);
                    let cut = self.held.len() - keep;
                    if cut > 0 {
                        out.push(StreamEvent::Text(self.held[..cut].to_string()));
                        self.held.drain(..cut);
                    }
                    break;
                }
            }
        }
        out
    }

    /// The output ended: what was held is text (an unclosed block is not a call).
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        if self.held.is_empty() {
            Vec::new()
        } else {
            vec![StreamEvent::Text(std::mem::take(&mut self.held))]
        }
    }

    /// Whether text is being held back (a call may be under way).
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_text_are_told_apart() {
        let p = parse("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
        assert_eq!(p.content, "Let me look.");
        assert_eq!(
            p.calls,
            vec![ToolCall {
                name: "get_weather".into(),
                arguments: r#"{"city":"Oslo"}"#.into()
            }]
        );
        // Two calls; arguments given as a string holding an object; none at all.
        let p = parse("<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>");
        assert_eq!(p.content, "");
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[0].arguments, r#"{"x":1}"#);
        assert_eq!(p.calls[1].arguments, "{}");
        // Not calls: plain text, kept whole.
        for bad in [
            "<tool_call>not json</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>",
            "<tool_call>{\"name\": \"\"}</tool_call>",
            "<tool_call>{\"name\": \"a\"}",
            "a < b and <tool_ca",
        ] {
            let p = parse(bad);
            assert!(p.calls.is_empty(), "{bad}");
            assert_eq!(p.content, bad.trim(), "{bad}");
        }
    }

    #[test]
    fn streaming_holds_back_only_what_may_be_a_call() {
        let text = "Sure é.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"<tool\"}}\n</tool_call> done <t";
        // Any split into pieces gives the same events, merged.
        for step in [1, 2, 3, 7, 100] {
            let mut s = ToolCallStream::default();
            let mut text_out = String::new();
            let mut calls = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(step) {
                let piece: String = piece.iter().collect();
                for e in s.push(&piece) {
                    match e {
                        StreamEvent::Text(t) => text_out.push_str(&t),
                        StreamEvent::Call(c) => calls.push(c),
                    }
                }
                // Nothing that cannot begin a call is held.
                assert!(!text_out.ends_with("<tool_call>"));
            }
            assert!(s.holding(), "the trailing '<t' may begin a call");
            for e in s.finish() {
                if let StreamEvent::Text(t) = e {
                    text_out.push_str(&t);
                }
            }
            assert_eq!(text_out, "Sure é. done <t", "step {step}");
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].arguments, r#"{"q":"<tool"}"#);
        }
    }
}
