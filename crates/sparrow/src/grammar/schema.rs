//! JSON Schema → a table the schema automaton ([`super::schema_state`]) walks.
//!
//! The subset is what OpenAI's structured outputs use: `type` (one name or a list) among
//! object, array, string, number, integer, boolean, null; `properties` and `required`
//! (properties not listed are never generated, so `additionalProperties` may only be absent
//! or false); `items` with optional `minItems`/`maxItems`; `enum` and `const` of any JSON
//! values (with at most `type` beside them). Annotations (`description`, `title`, `$schema`,
//! `default`, `examples`…) are ignored; every other keyword is refused with its JSON path, as
//! is anything past the size limits, so a hostile schema costs bounded memory and time.
//!
//! Without `$ref` a schema is a tree, so every container (object or array) has one parent,
//! known statically: the automaton's state needs no stack, only the innermost open container,
//! its position and the item counts of the few bounded arrays above it.
//!
//! What the automaton accepts is a subset of the valid documents, chosen so generation stays
//! cheap and bounded: properties in the declared order, each at most once; `enum`/`const`
//! values only in their compact spelling (keys in the schema's order, serde_json's escapes);
//! property names spelled as serde_json writes them; numbers within the JSON mode's digit
//! caps, integers without fraction or exponent; at most [`MAX_WS_RUN`] whitespace bytes
//! between two tokens.

use super::ordered::OrderedValue;
use super::trie::{Tries, NONE};
use sha2::{Digest, Sha256};
use std::fmt;

/// Deepest nesting of subschemas (`properties` / `items`).
pub const MAX_DEPTH: usize = 32;
/// Most subschemas in one schema.
pub const MAX_NODES: usize = 4096;
/// Most bytes of property names and `enum`/`const` values (as spelled) in one schema.
pub const MAX_LITERAL_BYTES: usize = 1 << 18;
/// Most arrays with `minItems`/`maxItems` nested in one another (their counts live in the
/// automaton's state).
pub const MAX_COUNTED_ARRAYS: usize = 4;
/// Most whitespace bytes in a row between two tokens (a newline and indentation).
pub const MAX_WS_RUN: u8 = 16;

pub(crate) const T_OBJECT: u8 = 1;
pub(crate) const T_ARRAY: u8 = 2;
pub(crate) const T_STRING: u8 = 4;
pub(crate) const T_NUMBER: u8 = 8;
pub(crate) const T_INTEGER: u8 = 16;
pub(crate) const T_BOOLEAN: u8 = 32;
pub(crate) const T_NULL: u8 = 64;

const TYPE_NAMES: [(&str, u8); 7] = [
    ("object", T_OBJECT),
    ("array", T_ARRAY),
    ("string", T_STRING),
    ("number", T_NUMBER),
    ("integer", T_INTEGER),
    ("boolean", T_BOOLEAN),
    ("null", T_NULL),
];

/// Keywords that do not constrain a value.
const ANNOTATIONS: [&str; 10] = [
    "description",
    "title",
    "$schema",
    "$comment",
    "$id",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
];
const SUPPORTED: [&str; 9] = [
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "const",
];
const OBJECT_KEYWORDS: [&str; 3] = ["properties", "required", "additionalProperties"];
const ARRAY_KEYWORDS: [&str; 3] = ["items", "minItems", "maxItems"];

/// Why a schema was refused: what, and where (a JSON pointer into the schema).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let at = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(f, "{} at {at}", self.message)
    }
}

impl std::error::Error for SchemaError {}

/// One subschema: the value types it allows, or its `enum` values.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub types: u8,
    /// The container used when the value is an object / an array, or `NONE`.
    pub object: u32,
    pub array: u32,
    /// Root of the trie of the allowed spellings (`enum`/`const`), or `NONE`.
    pub literals: u32,
    /// Fewest bytes of a valid value.
    pub min_len: usize,
}

#[derive(Clone, Debug)]
pub(crate) struct Prop {
    pub node: u32,
    /// The key as written, quotes included.
    pub key_len: usize,
}

#[derive(Clone, Debug)]
pub(crate) struct ObjectSpec {
    pub props: Vec<Prop>,
    /// Trie of the keys as written after the opening quote (closing quote included); word
    /// `i` is property `i`.
    pub keys: u32,
    /// For each position `i` (0..=n): the first required property at or after `i`, or NONE.
    pub next_required: Vec<u32>,
    /// For each position `i`: bytes of `,"key":value` for every required property from `i`
    /// on, values at their shortest.
    pub req_rest: Vec<usize>,
    /// For each position `i` < n: the fewest bytes of a key (quotes included), colon, value
    /// and everything required after it, over the properties allowed next.
    pub key_rest_min: Vec<usize>,
}

impl ObjectSpec {
    /// The last property index that may come next from position `i`: the first required
    /// one (it cannot be skipped), else the last.
    pub fn last_allowed(&self, i: u32) -> u32 {
        match self.next_required[i as usize] {
            NONE => (self.props.len() as u32).saturating_sub(1),
            r => r,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct ArraySpec {
    pub item: u32,
    pub min: u32,
    /// `u32::MAX` when unbounded.
    pub max: u32,
    /// Where the item count lives in the state, or `u8::MAX` when nothing is counted.
    pub slot: u8,
    /// Counts saturate here (nothing above it changes what is allowed).
    pub cap: u32,
}

#[derive(Clone, Debug)]
pub(crate) enum Kind {
    Object(ObjectSpec),
    Array(ArraySpec),
}

/// An object or array of the schema, with its static place in the tree.
#[derive(Clone, Debug)]
pub(crate) struct Container {
    /// The container the value sits in, or `NONE` at the top.
    pub parent: u32,
    /// Its property index when the parent is an object.
    pub index: u32,
    pub kind: Kind,
}

/// A compiled schema. Build with [`Schema::compile`] or [`Schema::parse`]; constrain
/// generation with [`super::JsonConstraint::with_schema`].
#[derive(Clone, Debug)]
pub struct Schema {
    pub(crate) nodes: Vec<Node>,
    pub(crate) containers: Vec<Container>,
    pub(crate) tries: Tries,
    /// Bound on how much one byte can raise the completion distance (the budget check's
    /// fast path).
    pub(crate) max_growth: usize,
    /// SHA-256 of the schema's compact text: keys masks in the per-model cache.
    pub(crate) fingerprint: [u8; 32],
}

impl Schema {
    /// Parse a JSON text (object keys keep their order) and compile it.
    pub fn parse(text: &str) -> Result<Schema, SchemaError> {
        let v = OrderedValue::parse(text).map_err(|e| SchemaError {
            path: String::new(),
            message: format!("the schema is not valid JSON: {e}"),
        })?;
        Schema::compile(&v)
    }

    /// Compile a schema.
    pub fn compile(schema: &OrderedValue) -> Result<Schema, SchemaError> {
        let mut c = Compiler {
            nodes: Vec::new(),
            containers: Vec::new(),
            tries: Tries::default(),
            literal_bytes: 0,
            max_literal: 0,
            path: Vec::new(),
        };
        let root = c.node(
            schema,
            Site {
                depth: 0,
                parent: NONE,
                index: 0,
                counted: 0,
            },
        )?;
        debug_assert_eq!(root, 0);
        let max_growth = c.max_growth();
        Ok(Schema {
            nodes: c.nodes,
            containers: c.containers,
            tries: c.tries,
            max_growth,
            fingerprint: Sha256::digest(schema.canonical().as_bytes()).into(),
        })
    }

    /// Fewest bytes of a document valid against the schema.
    pub fn min_len(&self) -> usize {
        self.nodes[0].min_len
    }

    pub(crate) fn object(&self, c: u32) -> &ObjectSpec {
        match &self.containers[c as usize].kind {
            Kind::Object(o) => o,
            Kind::Array(_) => unreachable!("container {c} is an array"),
        }
    }

    pub(crate) fn array(&self, c: u32) -> &ArraySpec {
        match &self.containers[c as usize].kind {
            Kind::Array(a) => a,
            Kind::Object(_) => unreachable!("container {c} is an object"),
        }
    }
}
/// Where a subschema sits: how deep, in which container (`parent`, [`NONE`] for the root),
/// at which property index of it, and under how many arrays whose items are counted.
#[derive(Clone, Copy)]
struct Site {
    depth: usize,
    parent: u32,
    index: u32,
    counted: usize,
}

struct Compiler {
    nodes: Vec<Node>,
    containers: Vec<Container>,
    tries: Tries,
    literal_bytes: usize,
    /// The longest `enum`/`const` spelling.
    max_literal: usize,
    /// JSON pointer segments of the subschema being compiled.
    path: Vec<String>,
}

fn kind_of(v: &OrderedValue) -> u8 {
    match v {
        OrderedValue::Null => T_NULL,
        OrderedValue::Bool(_) => T_BOOLEAN,
        OrderedValue::Number(n) => {
            let integral = n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|x| x.fract() == 0.0);
            if integral {
                T_NUMBER | T_INTEGER
            } else {
                T_NUMBER
            }
        }
        OrderedValue::String(_) => T_STRING,
        OrderedValue::Array(_) => T_ARRAY,
        OrderedValue::Object(_) => T_OBJECT,
    }
}

impl Compiler {
    fn err<T>(&self, message: String) -> Result<T, SchemaError> {
        let path = self
            .path
            .iter()
            .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
            .collect();
        Err(SchemaError { path, message })
    }

    fn add_literal_bytes(&mut self, n: usize) -> Result<(), SchemaError> {
        self.literal_bytes += n;
        if self.literal_bytes > MAX_LITERAL_BYTES {
            return self.err(format!(
                "property names and enum values exceed the limit of {MAX_LITERAL_BYTES} bytes"
            ));
        }
        Ok(())
    }

    /// Compile the subschema `v` that sits `at` its place in the tree.
    fn node(&mut self, v: &OrderedValue, at: Site) -> Result<u32, SchemaError> {
        if at.depth > MAX_DEPTH {
            return self.err(format!(
                "the schema nests deeper than the limit of {MAX_DEPTH} levels"
            ));
        }
        if self.nodes.len() >= MAX_NODES {
            return self.err(format!(
                "the schema has more than the limit of {MAX_NODES} subschemas"
            ));
        }
        let m = match v {
            OrderedValue::Object(m) => m,
            OrderedValue::Bool(_) => {
                return self.err("boolean schemas (true/false) are not supported".into())
            }
            _ => return self.err("a schema must be a JSON object".into()),
        };
        for (k, _) in m {
            if !ANNOTATIONS.contains(&k.as_str()) && !SUPPORTED.contains(&k.as_str()) {
                return self.err(format!("unsupported schema keyword '{k}'"));
            }
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(Node {
            types: 0,
            object: NONE,
            array: NONE,
            literals: NONE,
            min_len: 0,
        });
        let types = match v.get("type") {
            None => None,
            Some(t) => Some(self.types(t)?),
        };
        let values = match (v.get("enum"), v.get("const")) {
            (None, None) => None,
            (Some(OrderedValue::Array(e)), None) if !e.is_empty() => Some(e.clone()),
            (Some(_), None) => return self.err("'enum' must be a non-empty array".into()),
            (None, Some(c)) => Some(vec![c.clone()]),
            (Some(_), Some(_)) => {
                return self.err("'enum' and 'const' together are not supported".into())
            }
        };
        let node = if let Some(values) = values {
            if let Some(k) = OBJECT_KEYWORDS
                .iter()
                .chain(&ARRAY_KEYWORDS)
                .find(|k| v.get(k).is_some())
            {
                return self.err(format!("'{k}' beside 'enum' or 'const' is not supported"));
            }
            self.literals(&values, types.unwrap_or(u8::MAX))?
        } else {
            let Some(types) = types else {
                return self.err("a schema needs 'type', 'enum' or 'const'".into());
            };
            for (kw, t, name) in [
                (&OBJECT_KEYWORDS, T_OBJECT, "object"),
                (&ARRAY_KEYWORDS, T_ARRAY, "array"),
            ] {
                if let Some(k) = kw.iter().find(|k| v.get(k).is_some()) {
                    if types & t == 0 {
                        return self.err(format!("'{k}' needs type '{name}'"));
                    }
                }
            }
            let object = if types & T_OBJECT != 0 {
                self.object(v, at)?
            } else {
                NONE
            };
            let array = if types & T_ARRAY != 0 {
                self.array(v, at)?
            } else {
                NONE
            };
            let mut min_len = usize::MAX;
            for (t, len) in [
                (T_STRING, 2),
                (T_NUMBER | T_INTEGER, 1),
                (T_BOOLEAN, 4),
                (T_NULL, 4),
            ] {
                if types & t != 0 {
                    min_len = min_len.min(len);
                }
            }
            if object != NONE {
                min_len = min_len.min(1 + self.object_first_rest(object));
            }
            if array != NONE {
                min_len = min_len.min(1 + self.array_first_rest(array));
            }
            Node {
                types,
                object,
                array,
                literals: NONE,
                min_len,
            }
        };
        self.nodes[id as usize] = node;
        Ok(id)
    }

    fn types(&self, t: &OrderedValue) -> Result<u8, SchemaError> {
        let one = |s: &OrderedValue| match s {
            OrderedValue::String(s) => match TYPE_NAMES.iter().find(|(n, _)| n == s) {
                Some(&(_, bit)) => Ok(bit),
                None => self.err(format!("unknown type '{s}'")),
            },
            _ => self.err("'type' must be a type name or an array of them".into()),
        };
        match t {
            OrderedValue::Array(a) if !a.is_empty() => {
                let mut bits = 0;
                for s in a {
                    bits |= one(s)?;
                }
                Ok(bits)
            }
            OrderedValue::Array(_) => self.err("'type' must not be an empty array".into()),
            s => one(s),
        }
    }

    /// An `enum`/`const` node: the values that `types` allows, as a trie of their compact
    /// spellings.
    fn literals(&mut self, values: &[OrderedValue], types: u8) -> Result<Node, SchemaError> {
        let mut words: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for v in values {
            if kind_of(v) & types == 0 {
                continue;
            }
            let w = v.canonical();
            if seen.insert(w.clone()) {
                self.add_literal_bytes(w.len())?;
                self.max_literal = self.max_literal.max(w.len());
                words.push(w);
            }
        }
        if words.is_empty() {
            return self.err("no 'enum' or 'const' value has an allowed 'type'".into());
        }
        let bytes: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        let min_len = words.iter().map(String::len).min().unwrap_or(0);
        Ok(Node {
            types: 0,
            object: NONE,
            array: NONE,
            literals: self.tries.add(&bytes),
            min_len,
        })
    }

    fn object(&mut self, v: &OrderedValue, at: Site) -> Result<u32, SchemaError> {
        let cid = self.containers.len() as u32;
        self.containers.push(Container {
            parent: at.parent,
            index: at.index,
            kind: Kind::Array(ArraySpec {
                item: NONE,
                min: 0,
                max: 0,
                slot: 0,
                cap: 0,
            }),
        });
        match v.get("additionalProperties") {
            None | Some(OrderedValue::Bool(false)) => {}
            Some(_) => {
                self.path.push("additionalProperties".into());
                return self.err(
                    "only 'additionalProperties': false is supported (properties not listed are never generated)"
                        .into(),
                );
            }
        }
        let declared: &[(String, OrderedValue)] = match v.get("properties") {
            None => &[],
            Some(OrderedValue::Object(m)) => m,
            Some(_) => {
                self.path.push("properties".into());
                return self.err("'properties' must be an object".into());
            }
        };
        let mut props = Vec::with_capacity(declared.len());
        let mut words = Vec::with_capacity(declared.len());
        for (i, (name, sub)) in declared.iter().enumerate() {
            self.path.push("properties".into());
            self.path.push(name.clone());
            let node = self.node(
                sub,
                Site {
                    depth: at.depth + 1,
                    parent: cid,
                    index: i as u32,
                    counted: at.counted,
                },
            )?;
            let mut key = String::new();
            super::ordered::write_string(name, &mut key);
            self.add_literal_bytes(key.len())?;
            self.path.truncate(self.path.len() - 2);
            props.push(Prop {
                node,
                key_len: key.len(),
            });
            // The trie matches what follows the opening quote.
            words.push(key.into_bytes().split_off(1));
        }
        let mut required = vec![false; props.len()];
        match v.get("required") {
            None => {}
            Some(OrderedValue::Array(names)) => {
                for n in names {
                    let OrderedValue::String(n) = n else {
                        self.path.push("required".into());
                        return self.err("'required' must be an array of strings".into());
                    };
                    match declared.iter().position(|(k, _)| k == n) {
                        Some(i) => required[i] = true,
                        None => {
                            self.path.push("required".into());
                            return self
                                .err(format!("required property '{n}' is not in 'properties'"));
                        }
                    }
                }
            }
            Some(_) => {
                self.path.push("required".into());
                return self.err("'required' must be an array of strings".into());
            }
        }
        let n = props.len();
        let ml = |p: &Prop| self.nodes[p.node as usize].min_len;
        let mut next_required = vec![NONE; n + 1];
        let mut req_rest = vec![0usize; n + 1];
        for i in (0..n).rev() {
            next_required[i] = if required[i] {
                i as u32
            } else {
                next_required[i + 1]
            };
            req_rest[i] = req_rest[i + 1];
            if required[i] {
                let p = &props[i];
                req_rest[i] = req_rest[i]
                    .saturating_add(p.key_len + 2)
                    .saturating_add(ml(p));
            }
        }
        let mut key_rest_min = vec![usize::MAX; n];
        for (i, slot) in key_rest_min.iter_mut().enumerate() {
            let last = match next_required[i] {
                NONE => n - 1,
                r => r as usize,
            };
            for (j, p) in props.iter().enumerate().take(last + 1).skip(i) {
                let cost = (p.key_len + 1)
                    .saturating_add(ml(p))
                    .saturating_add(req_rest[j + 1]);
                *slot = (*slot).min(cost);
            }
        }
        let word_refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
        let keys = self.tries.add(&word_refs);
        self.containers[cid as usize].kind = Kind::Object(ObjectSpec {
            props,
            keys,
            next_required,
            req_rest,
            key_rest_min,
        });
        Ok(cid)
    }

    fn count(&mut self, v: &OrderedValue, key: &str) -> Result<Option<u32>, SchemaError> {
        match v.get(key) {
            None => Ok(None),
            Some(OrderedValue::Number(n)) if n.as_u64().is_some_and(|x| x <= u32::MAX as u64) => {
                Ok(n.as_u64().map(|x| x as u32))
            }
            Some(_) => {
                self.path.push(key.into());
                self.err(format!(
                    "'{key}' must be a non-negative integer up to {}",
                    u32::MAX
                ))
            }
        }
    }

    fn array(&mut self, v: &OrderedValue, at: Site) -> Result<u32, SchemaError> {
        let min = self.count(v, "minItems")?.unwrap_or(0);
        let max = self.count(v, "maxItems")?;
        if max.is_some_and(|m| m < min) {
            return self.err("'minItems' is larger than 'maxItems'".into());
        }
        let counts = min > 0 || max.is_some();
        if counts && at.counted >= MAX_COUNTED_ARRAYS {
            return self.err(format!(
                "arrays with 'minItems'/'maxItems' nest deeper than the limit of {MAX_COUNTED_ARRAYS}"
            ));
        }
        let items = match v.get("items") {
            Some(s @ OrderedValue::Object(_)) => s,
            Some(_) => {
                self.path.push("items".into());
                return self.err("'items' must be a single schema object".into());
            }
            None => return self.err("arrays need 'items'".into()),
        };
        let cid = self.containers.len() as u32;
        let spec = ArraySpec {
            item: NONE,
            min,
            max: max.unwrap_or(u32::MAX),
            slot: if counts { at.counted as u8 } else { u8::MAX },
            cap: min.max(max.unwrap_or(0)),
        };
        self.containers.push(Container {
            parent: at.parent,
            index: at.index,
            kind: Kind::Array(spec.clone()),
        });
        self.path.push("items".into());
        let item = self.node(
            items,
            Site {
                depth: at.depth + 1,
                parent: cid,
                index: 0,
                counted: at.counted + usize::from(counts),
            },
        )?;
        self.path.pop();
        self.containers[cid as usize].kind = Kind::Array(ArraySpec { item, ..spec });
        Ok(cid)
    }

    /// Fewest bytes after `{` that close the object.
    fn object_first_rest(&self, c: u32) -> usize {
        let Kind::Object(o) = &self.containers[c as usize].kind else {
            return 0;
        };
        if o.next_required[0] == NONE {
            1
        } else {
            o.key_rest_min[0].saturating_add(1)
        }
    }

    /// Fewest bytes after `[` that close the array.
    fn array_first_rest(&self, c: u32) -> usize {
        let Kind::Array(a) = &self.containers[c as usize].kind else {
            return 0;
        };
        if a.min == 0 {
            1
        } else {
            let item = self.nodes[a.item as usize].min_len;
            (a.min as usize).saturating_mul(item.saturating_add(1))
        }
    }

    /// A bound on the completion distance one byte can add: choosing the costliest
    /// alternative where the shortest completion took the cheapest — a value's type or
    /// `enum` value, an optional property, one more array item — or starting an escape.
    fn max_growth(&self) -> usize {
        let mut g = 8usize;
        for n in &self.nodes {
            g = g.max(n.min_len.saturating_add(8));
            if n.literals != NONE {
                g = g.max(self.max_literal.saturating_add(8));
            }
            if n.object != NONE {
                g = g.max(self.object_first_rest(n.object).saturating_add(8));
            }
            if n.array != NONE {
                g = g.max(self.array_first_rest(n.array).saturating_add(8));
            }
        }
        for c in &self.containers {
            match &c.kind {
                Kind::Object(o) => {
                    for p in &o.props {
                        let v = self.nodes[p.node as usize].min_len;
                        g = g.max(p.key_len.saturating_add(v).saturating_add(8));
                    }
                }
                Kind::Array(a) => {
                    let v = self.nodes[a.item as usize].min_len;
                    g = g.max(v.saturating_add(8));
                }
            }
        }
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(text: &str) -> String {
        Schema::parse(text)
            .err()
            .unwrap_or_else(|| panic!("accepted: {text}"))
            .to_string()
    }

    #[test]
    fn refusals_name_the_keyword_and_path() {
        let cases: &[(&str, &str)] = &[
            (
                r#"{"type":"object","properties":{"name":{"type":"string","pattern":"^a"}}}"#,
                "unsupported schema keyword 'pattern' at /properties/name",
            ),
            (r##"{"$ref":"#/defs/a"}"##, "unsupported schema keyword '$ref' at /"),
            (
                r#"{"type":"array","items":{"anyOf":[{"type":"string"}]}}"#,
                "unsupported schema keyword 'anyOf' at /items",
            ),
            (
                r#"{"type":"object","properties":{"a/b~":{"type":"string","format":"date"}}}"#,
                "unsupported schema keyword 'format' at /properties/a~1b~0",
            ),
            (r#"{"type":"string","minLength":1}"#, "unsupported schema keyword 'minLength' at /"),
            (r#"{"type":"number","minimum":0}"#, "unsupported schema keyword 'minimum' at /"),
            (
                r#"{"type":"object","additionalProperties":true}"#,
                "only 'additionalProperties': false is supported (properties not listed are never generated) at /additionalProperties",
            ),
            (
                r#"{"type":"object","additionalProperties":{"type":"string"}}"#,
                "at /additionalProperties",
            ),
            (
                r#"{"type":"object","properties":{"a":{"type":"string"}},"required":["b"]}"#,
                "required property 'b' is not in 'properties' at /required",
            ),
            (r#"{"type":"object","required":"a"}"#, "'required' must be an array of strings"),
            (r#"{"type":"array"}"#, "arrays need 'items' at /"),
            (
                r#"{"type":"array","items":[{"type":"string"}]}"#,
                "'items' must be a single schema object at /items",
            ),
            (
                r#"{"type":"array","items":{"type":"string"},"minItems":3,"maxItems":2}"#,
                "'minItems' is larger than 'maxItems'",
            ),
            (
                r#"{"type":"array","items":{"type":"string"},"minItems":-1}"#,
                "'minItems' must be a non-negative integer up to 4294967295 at /minItems",
            ),
            (
                r#"{"type":"array","items":{"type":"string"},"maxItems":1.5}"#,
                "'maxItems' must be a non-negative integer",
            ),
            (r#"{"type":"strin"}"#, "unknown type 'strin' at /"),
            (r#"{"type":[]}"#, "'type' must not be an empty array"),
            (r#"{"type":5}"#, "'type' must be a type name or an array of them"),
            (r#"{"enum":[]}"#, "'enum' must be a non-empty array"),
            (r#"{"enum":"a"}"#, "'enum' must be a non-empty array"),
            (r#"{"enum":[1,2],"type":"string"}"#, "no 'enum' or 'const' value has an allowed 'type'"),
            (
                r#"{"enum":[{}],"type":"object","properties":{}}"#,
                "'properties' beside 'enum' or 'const' is not supported",
            ),
            (r#"{"enum":[1],"const":1}"#, "'enum' and 'const' together are not supported"),
            (
                r#"{"type":"object","properties":{"a":{"description":"no type"}}}"#,
                "a schema needs 'type', 'enum' or 'const' at /properties/a",
            ),
            (r#"{"type":"string","properties":{}}"#, "'properties' needs type 'object'"),
            (r#"{"type":"string","maxItems":2}"#, "'maxItems' needs type 'array'"),
            (r#"true"#, "boolean schemas (true/false) are not supported"),
            (r#"{"type":"object","properties":{"a":3}}"#, "a schema must be a JSON object at /properties/a"),
            (r#"{"type":"object","properties":[]}"#, "'properties' must be an object"),
            (r#"{"type":"string""#, "the schema is not valid JSON"),
            (r#"{"type":"string","type":"null"}"#, "duplicate key"),
        ];
        for (text, want) in cases {
            let got = refusal(text);
            assert!(got.contains(want), "{text}: got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn size_limits_are_refused_by_name() {
        // Nesting.
        let mut deep = r#"{"type":"string"}"#.to_string();
        for _ in 0..=MAX_DEPTH {
            deep = format!(r#"{{"type":"array","items":{deep}}}"#);
        }
        assert!(refusal(&deep).contains("limit of 32 levels"));
        // Subschemas.
        let props: Vec<String> = (0..MAX_NODES)
            .map(|i| format!(r#""p{i}":{{"type":"null"}}"#))
            .collect();
        let wide = format!(
            r#"{{"type":"object","properties":{{{}}}}}"#,
            props.join(",")
        );
        assert!(refusal(&wide).contains("limit of 4096 subschemas"));
        // Literal bytes.
        let big = format!(
            r#"{{"enum":["{}","{}"]}}"#,
            "x".repeat(MAX_LITERAL_BYTES / 2),
            "y".repeat(MAX_LITERAL_BYTES / 2)
        );
        assert!(refusal(&big).contains("limit of 262144 bytes"));
        // Counted arrays.
        let mut counted = r#"{"type":"string"}"#.to_string();
        for _ in 0..=MAX_COUNTED_ARRAYS {
            counted = format!(r#"{{"type":"array","items":{counted},"maxItems":3}}"#);
        }
        assert!(refusal(&counted).contains("nest deeper than the limit of 4"));
        // Unbounded arrays nest freely (up to the depth limit).
        let mut free = r#"{"type":"string"}"#.to_string();
        for _ in 0..10 {
            free = format!(r#"{{"type":"array","items":{free}}}"#);
        }
        assert!(Schema::parse(&free).is_ok());
    }

    #[test]
    fn accepted_schemas_and_min_len() {
        let s = Schema::parse(
            r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","title":"t","description":"d",
               "type":"object","additionalProperties":false,
               "properties":{"b":{"type":"integer","default":1,"examples":[1]},"a":{"type":["string","null"]},
                             "e":{"enum":["x",1,null,{"k":[true]}]}},
               "required":["a","b"]}"#,
        )
        .unwrap();
        // {"b":0,"a":""} is the shortest document.
        assert_eq!(s.min_len(), r#"{"b":0,"a":""}"#.len());
        // Properties keep the declared order.
        let o = s.object(0);
        assert_eq!(o.props.len(), 3);
        assert_eq!(o.props[0].key_len, 3); // "b"
        assert_eq!(Schema::parse(r#"{"const":"hello"}"#).unwrap().min_len(), 7);
        // Same text, same fingerprint (masks shared across requests); different text, not.
        let a = Schema::parse(r#"{"type":"string"}"#).unwrap();
        let b = Schema::parse(r#"{ "type" : "string" }"#).unwrap();
        let c = Schema::parse(r#"{"type":"number"}"#).unwrap();
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_ne!(a.fingerprint, c.fingerprint);
    }
}
