//! The byte-level automaton of a compiled [`Schema`]: it accepts exactly the prefixes of
//! the documents the schema's table allows (see [`super::schema`] for which spellings).
//!
//! The state is small and `Copy` (the mask walk copies one per byte): the innermost open
//! container, the next property position in it, the lexical state, the current whitespace
//! run and the item counts of the bounded arrays that are open. Everything else — which
//! containers enclose this one and where — is static in the schema's tree.

use super::lex::{is_ws, Num, Str, StrStep};
use super::schema::{
    Kind, Schema, MAX_COUNTED_ARRAYS, MAX_WS_RUN, T_BOOLEAN, T_INTEGER, T_NULL, T_NUMBER, T_STRING,
};
use super::trie::NONE;
use super::{Grammar, MaskKey};

const WORDS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// The lexical state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Lex {
    /// A value is required: at the top, after `:` or after `,` in an array.
    Value,
    /// After `[`: a value or `]`.
    ArrayFirst,
    /// After `{`: a key or `}`.
    ObjectFirst,
    /// After `,` in an object: a key.
    ObjectKey,
    /// Inside a key, at this node of the object's key trie.
    Key(u32),
    /// After a key: `:`.
    Colon,
    /// After a value inside a container: `,` or the closing bracket.
    AfterValue,
    /// Inside a string value.
    Str(Str),
    /// Inside a number; `integer`: no fraction or exponent.
    Num { n: Num, integer: bool },
    /// Inside `true` / `false` / `null`: which word, how many bytes matched.
    Lit { word: u8, pos: u8 },
    /// Inside an `enum`/`const` value, at this node of its trie.
    Enum(u32),
    /// The top-level value is complete.
    Done,
}

impl Lex {
    /// Between tokens, where whitespace may go.
    fn is_gap(self) -> bool {
        matches!(
            self,
            Lex::Value
                | Lex::ArrayFirst
                | Lex::ObjectFirst
                | Lex::ObjectKey
                | Lex::Colon
                | Lex::AfterValue
                | Lex::Done
        )
    }
}

/// Where the automaton is. `Copy` and hashable (the mask cache is keyed by it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SchemaState {
    /// The innermost open container, or `NONE` at the top level.
    cur: u32,
    /// In an object: properties before this index are written or skipped.
    next: u32,
    lex: Lex,
    /// Whitespace bytes in the current gap.
    ws: u8,
    /// Items begun in each open counted array (by its slot), saturated at its cap; zero
    /// when no such array is open, so equal positions have equal states.
    counts: [u32; MAX_COUNTED_ARRAYS],
}

impl SchemaState {
    /// The state before any byte.
    pub fn new() -> Self {
        SchemaState {
            cur: NONE,
            next: 0,
            lex: Lex::Value,
            ws: 0,
            counts: [0; MAX_COUNTED_ARRAYS],
        }
    }
}

impl Default for SchemaState {
    fn default() -> Self {
        Self::new()
    }
}

impl Schema {
    /// The node of the value expected at `s`.
    fn value_node(&self, s: &SchemaState) -> u32 {
        if s.cur == NONE {
            return 0;
        }
        match &self.containers[s.cur as usize].kind {
            Kind::Array(a) => a.item,
            Kind::Object(o) => o.props[s.next as usize - 1].node,
        }
    }

    fn value_done(&self, s: &mut SchemaState) {
        s.lex = if s.cur == NONE {
            Lex::Done
        } else {
            Lex::AfterValue
        };
    }

    /// Close the innermost container.
    fn pop(&self, s: &mut SchemaState) {
        let c = &self.containers[s.cur as usize];
        if let Kind::Array(a) = &c.kind {
            if a.slot != u8::MAX {
                s.counts[a.slot as usize] = 0;
            }
        }
        s.cur = c.parent;
        s.next = if c.parent != NONE
            && matches!(self.containers[c.parent as usize].kind, Kind::Object(_))
        {
            c.index + 1
        } else {
            0
        };
        self.value_done(s);
    }

    /// Begin a value of node `v` with byte `b`.
    fn start_value(&self, s: &mut SchemaState, v: u32, b: u8) -> bool {
        let node = &self.nodes[v as usize];
        if node.literals != NONE {
            return match self.tries.child(node.literals, b) {
                Some(t) => {
                    s.lex = Lex::Enum(t);
                    true
                }
                None => false,
            };
        }
        let t = node.types;
        match b {
            b'{' if node.object != NONE => {
                s.cur = node.object;
                s.next = 0;
                s.lex = Lex::ObjectFirst;
            }
            b'[' if node.array != NONE => {
                s.cur = node.array;
                s.lex = Lex::ArrayFirst;
            }
            b'"' if t & T_STRING != 0 => s.lex = Lex::Str(Str::Normal),
            b'-' | b'0'..=b'9' if t & (T_NUMBER | T_INTEGER) != 0 => {
                let Some(n) = Num::start(b) else {
                    return false;
                };
                s.lex = Lex::Num {
                    n,
                    integer: t & T_NUMBER == 0,
                };
            }
            b't' | b'f' if t & T_BOOLEAN != 0 => {
                s.lex = Lex::Lit {
                    word: u8::from(b == b'f'),
                    pos: 1,
                }
            }
            b'n' if t & T_NULL != 0 => s.lex = Lex::Lit { word: 2, pos: 1 },
            _ => return false,
        }
        true
    }

    /// `,`, `]` or the first item, in an array.
    fn step_array(&self, s: &mut SchemaState, b: u8) -> bool {
        let a = self.array(s.cur);
        let first = s.lex == Lex::ArrayFirst;
        let count = if first || a.slot == u8::MAX {
            0
        } else {
            s.counts[a.slot as usize]
        };
        match b {
            b']' if count >= a.min => {
                self.pop(s);
                true
            }
            b',' if !first && count < a.max => {
                if a.slot != u8::MAX {
                    s.counts[a.slot as usize] = (count + 1).min(a.cap);
                }
                s.lex = Lex::Value;
                true
            }
            _ if first && a.max > 0 => {
                if a.slot != u8::MAX {
                    s.counts[a.slot as usize] = 1.min(a.cap);
                }
                self.start_value(s, a.item, b)
            }
            _ => false,
        }
    }

    /// `,`, `}` or a key's opening quote, in an object.
    fn step_object(&self, s: &mut SchemaState, b: u8) -> bool {
        let o = self.object(s.cur);
        let n = o.props.len() as u32;
        match (s.lex, b) {
            (Lex::ObjectFirst | Lex::AfterValue, b'}')
                if o.next_required[s.next as usize] == NONE =>
            {
                self.pop(s);
                true
            }
            (Lex::AfterValue, b',') if s.next < n => {
                s.lex = Lex::ObjectKey;
                true
            }
            (Lex::ObjectFirst | Lex::ObjectKey, b'"') if s.next < n => {
                s.lex = Lex::Key(o.keys);
                true
            }
            _ => false,
        }
    }

    /// Feed one byte; false (state unspecified) if no allowed document continues with it.
    fn step_byte(&self, s: &mut SchemaState, b: u8) -> bool {
        if s.lex.is_gap() {
            if is_ws(b) {
                if s.ws >= MAX_WS_RUN {
                    return false;
                }
                s.ws += 1;
                return true;
            }
            s.ws = 0;
        }
        match s.lex {
            Lex::Value => self.start_value(s, self.value_node(s), b),
            Lex::Done => false,
            Lex::ArrayFirst | Lex::AfterValue | Lex::ObjectFirst | Lex::ObjectKey => {
                match &self.containers[s.cur as usize].kind {
                    Kind::Array(_) => self.step_array(s, b),
                    Kind::Object(_) => self.step_object(s, b),
                }
            }
            Lex::Key(t) => {
                let o = self.object(s.cur);
                let Some(c) = self.tries.child(t, b) else {
                    return false;
                };
                if !self.tries.has_below_in(c, s.next, o.last_allowed(s.next)) {
                    return false;
                }
                match self.tries.word(c) {
                    // Keys end with their closing quote: a word end is a leaf.
                    Some(j) => {
                        s.next = j + 1;
                        s.lex = Lex::Colon;
                    }
                    None => s.lex = Lex::Key(c),
                }
                true
            }
            Lex::Colon => {
                if b == b':' {
                    s.lex = Lex::Value;
                    true
                } else {
                    false
                }
            }
            Lex::Str(st) => match st.step(b) {
                StrStep::Next(n) => {
                    s.lex = Lex::Str(n);
                    true
                }
                StrStep::Close => {
                    self.value_done(s);
                    true
                }
                StrStep::Reject => false,
            },
            Lex::Num { n, integer } => match n.step(b, integer) {
                Some(m) => {
                    s.lex = Lex::Num { n: m, integer };
                    true
                }
                None if n.complete() => {
                    // The number ended; the byte belongs to what follows it.
                    self.value_done(s);
                    self.step_byte(s, b)
                }
                None => false,
            },
            Lex::Lit { word, pos } => {
                let w = WORDS[word as usize];
                if w[pos as usize] != b {
                    return false;
                }
                if pos as usize + 1 == w.len() {
                    self.value_done(s);
                } else {
                    s.lex = Lex::Lit { word, pos: pos + 1 };
                }
                true
            }
            Lex::Enum(t) => match self.tries.child(t, b) {
                Some(c) => {
                    s.lex = Lex::Enum(c);
                    true
                }
                None if self.tries.word(t).is_some() => {
                    // A number spelling ended (`1` of `1` and `12`); the byte follows it.
                    self.value_done(s);
                    self.step_byte(s, b)
                }
                None => false,
            },
        }
    }

    /// Fewest bytes that close container `c` after one of its values, `next` being its
    /// position when it is an object, plus the same for every container around it.
    fn rest_after(&self, s: &SchemaState, mut c: u32, mut next: u32) -> usize {
        let mut total = 0usize;
        while c != NONE {
            let cont = &self.containers[c as usize];
            let own = match &cont.kind {
                Kind::Object(o) => o.req_rest[next as usize].saturating_add(1),
                Kind::Array(a) => {
                    let count = if a.slot == u8::MAX {
                        a.min
                    } else {
                        s.counts[a.slot as usize]
                    };
                    let need = a.min.saturating_sub(count) as usize;
                    let item = self.nodes[a.item as usize].min_len;
                    need.saturating_mul(item.saturating_add(1))
                        .saturating_add(1)
                }
            };
            total = total.saturating_add(own);
            next = cont.index + 1;
            c = cont.parent;
        }
        total
    }

    /// `rest_after` for the containers around the innermost one.
    fn rest_above(&self, s: &SchemaState) -> usize {
        let c = &self.containers[s.cur as usize];
        self.rest_after(s, c.parent, c.index + 1)
    }

    /// The shortest byte string that completes the document (for tests and diagnostics).
    pub fn completion(&self, s: &SchemaState) -> Vec<u8> {
        let mut s = *s;
        let mut out = Vec::new();
        while !self.is_complete(&s) {
            let want = self.distance(&s) - 1;
            // Of the bytes that keep us on a shortest path, the first.
            let b = (0..=255u8)
                .find(|&b| {
                    let mut t = s;
                    self.step(&mut t, b) && self.distance(&t) == want
                })
                .unwrap_or_else(|| panic!("no closing byte in {s:?}"));
            assert!(self.step(&mut s, b));
            out.push(b);
        }
        out
    }
}

impl Grammar for Schema {
    type State = SchemaState;

    #[inline]
    fn step(&self, s: &mut SchemaState, b: u8) -> bool {
        self.step_byte(s, b)
    }

    fn max_growth(&self) -> usize {
        self.max_growth
    }

    fn key(&self, s: &SchemaState) -> MaskKey {
        MaskKey::Schema(self.fingerprint, *s)
    }

    /// True when the bytes so far are a complete document (end of generation may follow).
    fn is_complete(&self, s: &SchemaState) -> bool {
        match s.lex {
            Lex::Done => true,
            Lex::Num { n, .. } => s.cur == NONE && n.complete(),
            Lex::Enum(t) => s.cur == NONE && self.tries.word(t).is_some(),
            _ => false,
        }
    }

    /// True when the top-level value is finished.
    fn is_done(&self, s: &SchemaState) -> bool {
        s.lex == Lex::Done
    }

    /// The fewest bytes that complete the document from here (each can be its own token in
    /// a byte-complete vocabulary): used to close it before the token budget runs out.
    fn distance(&self, s: &SchemaState) -> usize {
        let after = || self.rest_after(s, s.cur, s.next);
        let own = match s.lex {
            Lex::Done => return 0,
            Lex::Value => self.nodes[self.value_node(s) as usize].min_len,
            Lex::AfterValue => 0,
            Lex::Str(st) => st.close_len(),
            Lex::Num { n, .. } => usize::from(!n.complete()),
            Lex::Lit { word, pos } => WORDS[word as usize].len() - pos as usize,
            Lex::Enum(t) => self.tries.min_rest(t),
            Lex::ArrayFirst => {
                let a = self.array(s.cur);
                let item = self.nodes[a.item as usize].min_len;
                let first = if a.min == 0 {
                    1
                } else {
                    (a.min as usize).saturating_mul(item.saturating_add(1))
                };
                return first.saturating_add(self.rest_above(s));
            }
            Lex::ObjectFirst | Lex::ObjectKey | Lex::Key(_) | Lex::Colon => {
                let o = self.object(s.cur);
                let own = match s.lex {
                    Lex::ObjectFirst if o.next_required[0] == NONE => 1,
                    Lex::ObjectFirst | Lex::ObjectKey => {
                        o.key_rest_min[s.next as usize].saturating_add(1)
                    }
                    Lex::Key(t) => {
                        let last = o.last_allowed(s.next);
                        let depth = self.tries.depth(t);
                        let best = self
                            .tries
                            .below(t)
                            .iter()
                            .filter(|&&j| j >= s.next && j <= last)
                            .map(|&j| {
                                let p = &o.props[j as usize];
                                let value = self.nodes[p.node as usize].min_len;
                                // The word is the key less its opening quote.
                                (p.key_len - 1 - depth + 1)
                                    .saturating_add(value)
                                    .saturating_add(o.req_rest[j as usize + 1])
                            })
                            .min()
                            .unwrap_or(usize::MAX);
                        best.saturating_add(1)
                    }
                    _ => {
                        // Colon: the value of property next - 1, then what is required.
                        let p = &o.props[s.next as usize - 1];
                        let value = self.nodes[p.node as usize].min_len;
                        (1 + value)
                            .saturating_add(o.req_rest[s.next as usize])
                            .saturating_add(1)
                    }
                };
                return own.saturating_add(self.rest_above(s));
            }
        };
        own.saturating_add(after())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashSet, VecDeque};

    const PERSON: &str = r#"{"type":"object","properties":{
        "name":{"type":"string"},
        "age":{"type":"integer"},
        "email":{"type":["string","null"]},
        "tags":{"type":"array","items":{"enum":["a","b","ab"]},"minItems":1,"maxItems":2},
        "ok":{"type":"boolean"}},
      "required":["name","tags"],"additionalProperties":false}"#;

    fn schema(text: &str) -> Schema {
        Schema::parse(text).unwrap()
    }

    /// Where the automaton first refuses `doc`, or None if it takes every byte.
    fn first_refused(g: &Schema, doc: &[u8]) -> Option<usize> {
        let mut s = SchemaState::new();
        doc.iter().position(|&b| !g.step(&mut s, b))
    }

    fn accepts(g: &Schema, doc: &str) -> bool {
        let mut s = SchemaState::new();
        g.feed(&mut s, doc.as_bytes()) && g.is_complete(&s)
    }

    #[test]
    fn state_is_small() {
        assert!(std::mem::size_of::<SchemaState>() <= 40);
    }

    #[test]
    fn hand_cases() {
        let g = schema(PERSON);
        for ok in [
            r#"{"name":"x","tags":["a"]}"#,
            r#"{"name":"\u00e9\n","age":-12,"email":null,"tags":["ab","b"],"ok":false}"#,
            " { \"name\" : \"x\" ,\n  \"tags\" : [ \"a\" ]\n} ",
            r#"{"name":"","email":"e","tags":["b"],"ok":true}"#,
        ] {
            assert!(accepts(&g, ok), "{ok}");
        }
        // (document, index of the first refused byte)
        for (bad, at) in [
            (r#"[]"#, 0),                                    // not an object
            (r#"{}"#, 1),                                    // name is required
            (r#"{"tags":["a"]}"#, 2),                        // name must come first
            (r#"{"name":1}"#, 8),                            // wrong type
            (r#"{"name":"x","age":1.5,"tags":["a"]}"#, 19),  // integer has no fraction
            (r#"{"name":"x","age":1e3,"tags":["a"]}"#, 19),  // nor an exponent
            (r#"{"name":"x"}"#, 11),                         // tags is required
            (r#"{"name":"x","tags":[]}"#, 20),               // minItems 1
            (r#"{"name":"x","tags":["a","b","a"]}"#, 27),    // maxItems 2
            (r#"{"name":"x","tags":["c"]}"#, 21),            // not in the enum
            (r#"{"name":"x","tags":["a"],"extra":1}"#, 26),  // no such property
            (r#"{"name":"x","name":"y","tags":["a"]}"#, 13), // no repeats
            (r#"{"name":"x","tags":["a"],"age":1}"#, 26),    // declared order
            (r#"{"name":"x","email":nul,"tags":["a"]}"#, 23),
            (r#"{"name":"x","tags":["a"]} x"#, 26), // nothing after the value
            (r#"{"name":"\x"}"#, 10),               // string escapes as in JSON
            (
                "{\"name\":\"x\",\"tags\":[\"a\"],                   \"ok\":true}",
                41,
            ),
        ] {
            assert_eq!(first_refused(&g, bad.as_bytes()), Some(at), "{bad}");
        }
        // Invalid UTF-8 inside a string.
        assert_eq!(first_refused(&g, b"{\"name\":\"\xc3(\"}"), Some(10));
    }

    #[test]
    fn enums_consts_and_top_level_scalars() {
        let g = schema(r#"{"enum":[1,12,"x",null,[1,{"a":true}],1.5]}"#);
        for ok in [
            "1",
            "12",
            "\"x\"",
            "null",
            "[1,{\"a\":true}]",
            "1.5",
            " 12 ",
        ] {
            assert!(accepts(&g, ok), "{ok}");
        }
        for bad in [
            "2",
            "123",
            "\"y\"",
            "[1, {\"a\":true}]",
            "1.50",
            "nul",
            "true",
        ] {
            assert!(!accepts(&g, bad), "{bad}");
        }
        let g = schema(r#"{"type":"integer"}"#);
        assert!(
            accepts(&g, "-0") && accepts(&g, "120") && !accepts(&g, "01") && !accepts(&g, "1.")
        );
        let g = schema(r#"{"type":["number","boolean"]}"#);
        assert!(accepts(&g, "-0.5e+3") && accepts(&g, "false") && !accepts(&g, "null"));
        let g = schema(r#"{"const":{"k":"v"},"type":"object"}"#);
        assert!(accepts(&g, r#"{"k":"v"}"#) && !accepts(&g, r#"{"k":"w"}"#));
        let g = schema(r#"{"type":"object"}"#);
        assert!(accepts(&g, "{}") && !accepts(&g, r#"{"a":1}"#));
    }

    #[test]
    fn arrays_count_items() {
        let g = schema(
            r#"{"type":"array","items":{"type":"array","items":{"type":"null"},"minItems":2,"maxItems":3},"maxItems":2}"#,
        );
        assert!(accepts(&g, "[]"));
        assert!(accepts(&g, "[[null,null],[null,null,null]]"));
        assert!(!accepts(&g, "[[null]]"));
        assert!(!accepts(&g, "[[null,null,null,null]]"));
        assert!(!accepts(&g, "[[null,null],[null,null],[null,null]]"));
        // After the inner array closes, its count is gone: equal positions, equal states.
        let mut a = SchemaState::new();
        let mut b = SchemaState::new();
        assert!(g.feed(&mut a, b"[[null,null,null],"));
        assert!(g.feed(&mut b, b"[[null,null],"));
        assert_eq!(a, b);
    }

    #[test]
    fn whitespace_runs_are_bounded() {
        let g = schema(r#"{"type":"array","items":{"type":"null"}}"#);
        let ok = format!("[{}null]", " ".repeat(MAX_WS_RUN as usize));
        assert!(accepts(&g, &ok));
        let bad = format!("[{}null]", " ".repeat(MAX_WS_RUN as usize + 1));
        assert_eq!(
            first_refused(&g, bad.as_bytes()),
            Some(MAX_WS_RUN as usize + 1)
        );
    }

    /// The exact fewest bytes to a complete document, by breadth-first search over states
    /// (whitespace bytes never help, so only the others are tried).
    fn bfs_distance(g: &Schema, start: SchemaState) -> usize {
        let mut seen = HashSet::new();
        let mut q = VecDeque::from([(start, 0usize)]);
        seen.insert(start);
        while let Some((s, d)) = q.pop_front() {
            if g.is_complete(&s) {
                return d;
            }
            for b in 0..=255u8 {
                if is_ws(b) {
                    continue;
                }
                let mut t = s;
                if g.step(&mut t, b) && seen.insert(t) {
                    q.push_back((t, d + 1));
                }
            }
        }
        panic!("no completion from {start:?}");
    }

    const SCHEMAS: [&str; 4] = [
        PERSON,
        r#"{"type":"object","properties":{"opt1":{"type":"string"},"opt2":{"type":"number"},
            "req":{"type":"object","properties":{"x":{"type":"null"},"xy":{"type":"boolean"}},"required":["xy"]},
            "opt3":{"enum":["long value here", 7]}},"required":["req"]}"#,
        r#"{"type":["array","object","null"],"items":{"type":"array","items":{"type":"integer"},"minItems":2},
            "minItems":1,"properties":{"a":{"type":"integer"}},"required":["a"]}"#,
        r#"{"enum":[12,123,"abc",{"k":[1,2]}]}"#,
    ];

    fn lcg(x: &mut u64) -> u64 {
        *x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *x >> 33
    }

    #[test]
    fn distance_is_exact_and_growth_bounded() {
        for (si, text) in SCHEMAS.iter().enumerate() {
            let g = schema(text);
            let mut rng = si as u64 + 1;
            let mut checked = 0;
            for _walk in 0..40 {
                let mut s = SchemaState::new();
                for _ in 0..60 {
                    let d = g.distance(&s);
                    assert_eq!(d, bfs_distance(&g, s), "schema {si}, {s:?}");
                    let tail = g.completion(&s);
                    assert_eq!(tail.len(), d);
                    let mut t = s;
                    assert!(g.feed(&mut t, &tail) && g.is_complete(&t));
                    checked += 1;
                    let allowed: Vec<u8> = (0..=255u8)
                        .filter(|&b| {
                            let mut t = s;
                            g.step(&mut t, b)
                        })
                        .collect();
                    if allowed.is_empty() || g.is_done(&s) {
                        break;
                    }
                    let b = allowed[lcg(&mut rng) as usize % allowed.len()];
                    let before = d;
                    assert!(g.step(&mut s, b));
                    assert!(
                        g.distance(&s) <= before + g.max_growth,
                        "schema {si}: byte {b} grew {before} to {}",
                        g.distance(&s)
                    );
                }
            }
            assert!(checked > 100);
        }
    }
}
