//! A JSON value whose objects keep their keys in document order. The schema compiler needs
//! it: properties are generated in the order the schema declares them (a model asked for
//! `reasoning` then `answer` should write them in that order), and this crate's
//! `serde_json::Value` sorts keys (the `preserve_order` feature is off, and turning it on
//! would change every map in the workspace).

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Number;
use std::fmt;

/// A JSON value with object keys in document order (duplicate keys are refused).
#[derive(Clone, Debug, PartialEq)]
pub enum OrderedValue {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<OrderedValue>),
    Object(Vec<(String, OrderedValue)>),
}

impl OrderedValue {
    /// Parse a JSON text.
    pub fn parse(text: &str) -> serde_json::Result<OrderedValue> {
        serde_json::from_str(text)
    }

    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&OrderedValue> {
        match self {
            OrderedValue::Object(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The compact serialization, keys in order: the one spelling the schema automaton
    /// accepts for an `enum` or `const` value.
    pub fn canonical(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            OrderedValue::Null => out.push_str("null"),
            OrderedValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            OrderedValue::Number(n) => out.push_str(&n.to_string()),
            OrderedValue::String(s) => write_string(s, out),
            OrderedValue::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            OrderedValue::Object(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

/// `s` as a JSON string, escaped as serde_json escapes it.
pub fn write_string(s: &str, out: &mut String) {
    // Serializing a &str cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

impl<'de> Deserialize<'de> for OrderedValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = OrderedValue;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Null)
    }
    fn visit_none<E>(self) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Bool(b))
    }
    fn visit_u64<E>(self, n: u64) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Number(n.into()))
    }
    fn visit_i64<E>(self, n: i64) -> Result<OrderedValue, E> {
        Ok(OrderedValue::Number(n.into()))
    }
    fn visit_f64<E: de::Error>(self, x: f64) -> Result<OrderedValue, E> {
        Number::from_f64(x)
            .map(OrderedValue::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }
    fn visit_str<E>(self, s: &str) -> Result<OrderedValue, E> {
        Ok(OrderedValue::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<OrderedValue, E> {
        Ok(OrderedValue::String(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OrderedValue, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(OrderedValue::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedValue, A::Error> {
        let mut out: Vec<(String, OrderedValue)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        while let Some((k, v)) = map.next_entry::<String, OrderedValue>()? {
            if !seen.insert(k.clone()) {
                return Err(de::Error::custom(format!("duplicate key {k:?}")));
            }
            out.push((k, v));
        }
        Ok(OrderedValue::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_refuses_duplicates() {
        let v =
            OrderedValue::parse(r#"{"z": 1, "a": [true, null, "\u00e9\n"], "m": -2.5}"#).unwrap();
        assert_eq!(
            v.canonical(),
            "{\"z\":1,\"a\":[true,null,\"é\\n\"],\"m\":-2.5}"
        );
        // The canonical text is JSON that serde_json reads back to the same value.
        let a: serde_json::Value = serde_json::from_str(&v.canonical()).unwrap();
        let b: serde_json::Value =
            serde_json::from_str(r#"{"z": 1, "a": [true, null, "é\n"], "m": -2.5}"#).unwrap();
        assert_eq!(a, b);
        assert!(OrderedValue::parse(r#"{"a": 1, "a": 2}"#).is_err());
    }
}
