//! A byte-level pushdown automaton for JSON (RFC 8259), small enough to be `Copy`: the
//! container stack is a bit vector (1 = object, 0 = array) and every lexical state is a few
//! bytes. It accepts exactly the byte strings that are prefixes of a JSON text that
//! `serde_json` parses: strings must be valid UTF-8, `\uXXXX` escapes must pair surrogates,
//! numbers follow the grammar (no leading zeros, digits after `.` and `e`), literals are
//! `true`, `false`, `null`, and nesting is limited to [`MAX_DEPTH`] (serde_json's own limit
//! is 128).

/// Deepest nesting the automaton accepts.
pub const MAX_DEPTH: u8 = 100;
use super::lex::{is_ws, Num, Str, StrStep};
pub use super::lex::{MAX_EXP_DIGITS, MAX_INT_DIGITS};

/// What the top-level value may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Root {
    /// Any JSON value.
    Any,
    /// An object (what OpenAI's `response_format: json_object` promises).
    Object,
}

/// The lexical state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Lex {
    /// Before the top-level value.
    Start,
    /// A value is required (after `:` or `,` in an array).
    Value,
    /// After `[`: a value or `]`.
    ArrayFirst,
    /// After `{`: a key or `}`.
    ObjectFirst,
    /// After `,` in an object: a key.
    ObjectKey,
    /// After a key: `:`.
    Colon,
    /// After a value inside a container: `,` or the closing bracket.
    AfterValue,
    /// Inside a string (a key when `key`).
    Str {
        key: bool,
        s: Str,
    },
    Num(Num),
    /// Inside `true` / `false` / `null`: which word, how many bytes matched.
    Lit {
        word: u8,
        pos: u8,
    },
    /// The top-level value is complete; only whitespace may follow.
    Done,
}

const WORDS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// The automaton's state. `Copy`, hashable (the mask cache is keyed by it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JsonState {
    stack: u128,
    depth: u8,
    lex: Lex,
    root: Root,
}

impl JsonState {
    /// The state before any byte.
    pub fn new(root: Root) -> Self {
        JsonState {
            stack: 0,
            depth: 0,
            lex: Lex::Start,
            root,
        }
    }

    /// True when the bytes so far form a complete JSON text (end of generation may follow).
    pub fn is_complete(&self) -> bool {
        match self.lex {
            Lex::Done => true,
            Lex::Num(n) => self.depth == 0 && n.complete(),
            _ => false,
        }
    }

    /// True when the top-level value is finished: nothing but whitespace may follow.
    pub fn is_done(&self) -> bool {
        self.lex == Lex::Done
    }

    /// Current nesting depth.
    pub fn depth(&self) -> usize {
        self.depth as usize
    }

    fn top_is_object(&self) -> bool {
        self.depth > 0 && (self.stack >> (self.depth - 1)) & 1 == 1
    }

    fn push(&mut self, object: bool) -> bool {
        if self.depth >= MAX_DEPTH {
            return false;
        }
        if object {
            self.stack |= 1 << self.depth;
        } else {
            self.stack &= !(1 << self.depth);
        }
        self.depth += 1;
        self.lex = if object {
            Lex::ObjectFirst
        } else {
            Lex::ArrayFirst
        };
        true
    }

    fn pop(&mut self) {
        self.depth -= 1;
        self.stack &= !(1 << self.depth);
        self.value_done();
    }

    fn value_done(&mut self) {
        self.lex = if self.depth == 0 {
            Lex::Done
        } else {
            Lex::AfterValue
        };
    }

    /// Begin a value with byte `b`; false if no value starts with it.
    fn start_value(&mut self, b: u8) -> bool {
        match b {
            b'{' => self.push(true),
            b'[' => self.push(false),
            b'"' => {
                self.lex = Lex::Str {
                    key: false,
                    s: Str::Normal,
                };
                true
            }
            b'-' | b'0'..=b'9' => match Num::start(b) {
                Some(n) => {
                    self.lex = Lex::Num(n);
                    true
                }
                None => false,
            },
            b't' | b'f' | b'n' => {
                let word = match b {
                    b't' => 0,
                    b'f' => 1,
                    _ => 2,
                };
                self.lex = Lex::Lit { word, pos: 1 };
                true
            }
            _ => false,
        }
    }

    /// Feed one byte; false (state unspecified) if no JSON text continues with it.
    pub fn step(&mut self, b: u8) -> bool {
        match self.lex {
            Lex::Start => {
                if is_ws(b) {
                    return true;
                }
                if self.root == Root::Object && b != b'{' {
                    return false;
                }
                self.start_value(b)
            }
            Lex::Value => is_ws(b) || self.start_value(b),
            Lex::ArrayFirst => {
                if is_ws(b) {
                    true
                } else if b == b']' {
                    self.pop();
                    true
                } else {
                    self.start_value(b)
                }
            }
            Lex::ObjectFirst | Lex::ObjectKey => {
                if is_ws(b) {
                    true
                } else if b == b'}' && self.lex == Lex::ObjectFirst {
                    self.pop();
                    true
                } else if b == b'"' {
                    self.lex = Lex::Str {
                        key: true,
                        s: Str::Normal,
                    };
                    true
                } else {
                    false
                }
            }
            Lex::Colon => {
                if b == b':' {
                    self.lex = Lex::Value;
                    true
                } else {
                    is_ws(b)
                }
            }
            Lex::AfterValue => {
                let obj = self.top_is_object();
                match b {
                    b',' => {
                        self.lex = if obj { Lex::ObjectKey } else { Lex::Value };
                        true
                    }
                    b'}' if obj => {
                        self.pop();
                        true
                    }
                    b']' if !obj => {
                        self.pop();
                        true
                    }
                    _ => is_ws(b),
                }
            }
            Lex::Done => is_ws(b),
            Lex::Lit { word, pos } => {
                let w = WORDS[word as usize];
                if w[pos as usize] != b {
                    return false;
                }
                if pos as usize + 1 == w.len() {
                    self.value_done();
                } else {
                    self.lex = Lex::Lit { word, pos: pos + 1 };
                }
                true
            }
            Lex::Num(n) => self.step_num(n, b),
            Lex::Str { key, s } => self.step_str(key, s, b),
        }
    }

    fn step_num(&mut self, n: Num, b: u8) -> bool {
        let next = n.step(b, false);
        match next {
            Some(m) => {
                self.lex = Lex::Num(m);
                true
            }
            None if n.complete() => {
                // The number ended; the byte belongs to what follows it.
                self.value_done();
                self.step(b)
            }
            None => false,
        }
    }

    fn step_str(&mut self, key: bool, s: Str, b: u8) -> bool {
        match s.step(b) {
            StrStep::Next(next) => {
                self.lex = Lex::Str { key, s: next };
                true
            }
            StrStep::Close => {
                if key {
                    self.lex = Lex::Colon;
                } else {
                    self.value_done();
                }
                true
            }
            StrStep::Reject => false,
        }
    }

    /// Feed several bytes; false as soon as one is refused.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.step(b))
    }

    /// The fewest bytes that complete the text from here (each can be its own token in a
    /// byte-complete vocabulary): used to close the value before the token budget runs out.
    pub fn distance(&self) -> usize {
        let d = self.depth as usize;
        match self.lex {
            Lex::Done => 0,
            Lex::Start => match self.root {
                Root::Object => 2,
                Root::Any => 1,
            },
            Lex::Value => 1 + d,
            Lex::ArrayFirst | Lex::ObjectFirst | Lex::AfterValue => d,
            Lex::ObjectKey => 4 + d,
            Lex::Colon => 2 + d,
            Lex::Num(n) => d + usize::from(!n.complete()),
            Lex::Lit { word, pos } => WORDS[word as usize].len() - pos as usize + d,
            Lex::Str { key, s } => {
                let close = s.close_len();
                close + if key { 2 } else { 0 } + d
            }
        }
    }

    /// The shortest byte string that completes the text (for tests and diagnostics).
    pub fn completion(&self) -> Vec<u8> {
        let mut s = *self;
        let mut out = Vec::new();
        while !s.is_complete() {
            let b = s.closing_byte();
            assert!(s.step(b), "closing byte {b} refused in {s:?}");
            out.push(b);
        }
        out
    }

    fn closing_byte(&self) -> u8 {
        match self.lex {
            Lex::Start => match self.root {
                Root::Object => b'{',
                Root::Any => b'0',
            },
            Lex::Value | Lex::Num(Num::Minus | Num::Dot | Num::Exp | Num::ExpSign) => b'0',
            Lex::ObjectKey => b'"',
            Lex::Colon => b':',
            Lex::ArrayFirst | Lex::ObjectFirst | Lex::AfterValue | Lex::Num(_) => {
                if self.top_is_object() {
                    b'}'
                } else {
                    b']'
                }
            }
            Lex::Lit { word, pos } => WORDS[word as usize][pos as usize],
            Lex::Done => b' ',
            Lex::Str { s, .. } => s.closing_byte(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(root: Root, text: &[u8]) -> bool {
        let mut s = JsonState::new(root);
        s.feed(text) && s.is_complete()
    }

    #[test]
    fn valid_texts() {
        for t in [
            r#"{}"#,
            r#" { "a" : [1, -0.5e+3, 2E7, 0, true, false, null, "x\"\\\/\b\f\n\r\t"] } "#,
            r#"{"u":"\u00e9\uD83D\uDE00 café 😀 ж"}"#,
            r#"{"a":{"b":{"c":[[],[{}]]}}}"#,
        ] {
            let t = t.as_bytes();
            assert!(accepts(Root::Object, t), "{}", String::from_utf8_lossy(t));
            assert!(serde_json::from_slice::<serde_json::Value>(t).is_ok());
        }
        for t in [&b"0"[..], b"-12.5e-3", b"\"s\"", b"[1,2]", b"null"] {
            assert!(accepts(Root::Any, t));
            assert!(!accepts(Root::Object, t));
        }
    }

    #[test]
    fn invalid_texts() {
        for t in [
            &b"{"[..],
            b"{\"a\"}",
            b"{\"a\":}",
            b"{\"a\":1,}",
            b"[1,]",
            b"[01]",
            b"[1.]",
            b"[1e]",
            b"[-]",
            b"[tru]",
            b"[truex]",
            b"[\"\\x\"]",
            b"[\"\\uDC00\"]",
            b"[\"\\uD800\"]",
            b"[\"\\uD800\\u0041\"]",
            b"[\"\x01\"]",
            b"[\"\xc3\"]",
            b"[\"\xed\xa0\x80\"]",
            b"[\"\xc0\x80\"]",
            b"{}{}",
            b"{} x",
            b"[1e999]",
            b"[1 2]",
            b"{\"a\" 1}",
            b"{1:2}",
        ] {
            assert!(!accepts(Root::Any, t), "{}", String::from_utf8_lossy(t));
            assert!(serde_json::from_slice::<serde_json::Value>(t).is_err());
        }
    }

    #[test]
    fn completion_closes_everything_and_distance_matches() {
        for prefix in [
            &b""[..],
            b"{",
            b"{\"k",
            b"{\"k\"",
            b"{\"k\":",
            b"{\"k\":[1,{\"z\":\"\\u",
            b"{\"k\":[\"\\uD83D",
            b"{\"k\":-",
            b"{\"k\":tr",
            b"{\"k\":1.5e",
            b"{\"k\":\"\xf0\x9f",
        ] {
            let mut s = JsonState::new(Root::Object);
            assert!(s.feed(prefix));
            let tail = s.completion();
            assert_eq!(
                tail.len(),
                s.distance(),
                "{}",
                String::from_utf8_lossy(prefix)
            );
            let all = [prefix, &tail].concat();
            assert!(serde_json::from_slice::<serde_json::Value>(&all).is_ok());
        }
    }

    #[test]
    fn depth_limit() {
        let mut s = JsonState::new(Root::Any);
        assert!(s.feed(&vec![b'['; MAX_DEPTH as usize]));
        let mut t = s;
        assert!(!t.step(b'['));
        assert!(s.step(b'1'));
        assert_eq!(s.completion().len(), MAX_DEPTH as usize);
    }
}
