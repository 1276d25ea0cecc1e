//! An independent JSON-Schema check for the subset the grammar compiles (`type`,
//! `properties`, `required`, `additionalProperties: false`, `items`, `minItems`,
//! `maxItems`, `enum`, `const`), written from the specification over `serde_json` values
//! and sharing no code with `sparrow::grammar`: the judge of the `json_schema` target.

use serde_json::Value;
use std::sync::LazyLock;

/// The schemas the target draws from: those of `crates/sparrow/tests/json_schema.rs`, read
/// from the fixture both share (blank-line separated blocks, `//` lines are comments).
pub static SCHEMAS: LazyLock<Vec<String>> = LazyLock::new(sparrow::fixtures::json_schemas);

/// Whether `doc` is valid against `schema`.
pub fn valid(schema: &Value, doc: &Value) -> bool {
    let Some(s) = schema.as_object() else {
        return schema.as_bool().unwrap_or(true);
    };
    if let Some(c) = s.get("const") {
        if !same(c, doc) {
            return false;
        }
    }
    if let Some(Value::Array(options)) = s.get("enum") {
        if !options.iter().any(|o| same(o, doc)) {
            return false;
        }
    }
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(name) => has_type(name, doc),
            Value::Array(names) => names.iter().any(|n| n.as_str().is_some_and(|n| has_type(n, doc))),
            _ => true,
        };
        if !ok {
            return false;
        }
    }
    match doc {
        Value::Object(map) => {
            let props = s.get("properties").and_then(Value::as_object);
            if let Some(Value::Array(req)) = s.get("required") {
                if !req.iter().all(|k| k.as_str().is_some_and(|k| map.contains_key(k))) {
                    return false;
                }
            }
            for (k, v) in map {
                match props.and_then(|p| p.get(k)) {
                    Some(sub) => {
                        if !valid(sub, v) {
                            return false;
                        }
                    }
                    None => {
                        if s.get("additionalProperties") == Some(&Value::Bool(false)) {
                            return false;
                        }
                    }
                }
            }
            true
        }
        Value::Array(items) => {
            let n = items.len() as u64;
            if s.get("minItems").and_then(Value::as_u64).is_some_and(|m| n < m)
                || s.get("maxItems").and_then(Value::as_u64).is_some_and(|m| n > m)
            {
                return false;
            }
            match s.get("items") {
                Some(sub) => items.iter().all(|v| valid(sub, v)),
                None => true,
            }
        }
        _ => true,
    }
}

/// JSON Schema's type names; an integer is a number without a fractional part.
fn has_type(name: &str, v: &Value) -> bool {
    match name {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

/// JSON Schema's equality: numbers by value (1 equals 1.0), the rest structurally.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}
