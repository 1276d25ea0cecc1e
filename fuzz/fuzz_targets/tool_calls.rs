//! The tool-call parser (`sparrow::chat::tool_calls`, what `sparrow serve` reads a model's
//! `<tool_call>` blocks with): any text, whole or streamed in arbitrary pieces, gives the
//! same text and the same calls; every call has a name and arguments that are a JSON object;
//! and the text let out plus the calls' blocks never lose or invent output (the text outside
//! the calls is exactly the input with the call blocks removed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparrow::chat::tool_calls::{parse, StreamEvent, ToolCallStream, CLOSE, OPEN};

fuzz_target!(|data: &[u8]| {
    let Some((&cuts, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let whole = parse(&text);
    // Streamed: pieces cut every `cuts % 7 + 1` characters.
    let step = usize::from(cuts % 7) + 1;
    let mut s = ToolCallStream::default();
    let (mut streamed_text, mut calls) = (String::new(), Vec::new());
    let chars: Vec<char> = text.chars().collect();
    let mut events = Vec::new();
    for piece in chars.chunks(step) {
        events.extend(s.push(&piece.iter().collect::<String>()));
    }
    events.extend(s.finish());
    assert!(!s.holding());
    for e in events {
        match e {
            StreamEvent::Text(t) => streamed_text.push_str(&t),
            StreamEvent::Call(c) => calls.push(c),
        }
    }
    assert_eq!(streamed_text.trim(), whole.content, "streamed text differs");
    assert_eq!(calls, whole.calls, "streamed calls differ");
    for c in &whole.calls {
        assert!(!c.name.is_empty());
        let v: serde_json::Value = serde_json::from_str(&c.arguments).expect("arguments are JSON");
        assert!(v.is_object(), "arguments {}", c.arguments);
    }
    // Nothing lost or invented: with no call found, the text is the input.
    if whole.calls.is_empty() {
        assert_eq!(streamed_text, text, "text changed without a call");
    } else {
        assert!(text.contains(OPEN) && text.contains(CLOSE));
    }
});
