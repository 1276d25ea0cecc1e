//! Metadata values: the twelve GGUF value types, plus typed accessors that turn a missing key
//! or a wrong type into an error naming the key.

use crate::error::{GgufError, Result};
use std::collections::BTreeMap;

/// One metadata value as stored in the file.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The GGUF type name of this value, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }

    /// Any integer value widened to i128 (so every GGUF integer fits), `None` otherwise.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any float value as f64 (integers are not silently accepted as floats... except that
    /// writers sometimes store float hyper-parameters as integers, so those convert too).
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_integer().map(|i| i as f64),
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The key/value metadata of a GGUF file, in key order.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    pub(crate) map: BTreeMap<String, Value>,
}

fn wrong(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_name(),
    }
}

impl FromIterator<(String, Value)> for Metadata {
    /// Metadata built in memory (tests, tools), as a file would hold it.
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(pairs: I) -> Self {
        Metadata {
            map: pairs.into_iter().collect(),
        }
    }
}

impl Metadata {
    /// The raw value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }

    /// True when `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// All keys and values, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when there are no keys.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong(key, "string", v))
    }

    fn get_int_in<T: TryFrom<i128>>(&self, key: &str, target: &'static str) -> Result<T> {
        let v = self.require(key)?;
        let i = v.as_integer().ok_or_else(|| wrong(key, target, v))?;
        T::try_from(i).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: i.to_string(),
            target,
        })
    }

    /// An integer value of any stored width that fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.get_int_in(key, "u32")
    }

    /// An integer value of any stored width that fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get_int_in(key, "u64")
    }

    /// An integer value of any stored width that fits in i64.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.get_int_in(key, "i64")
    }

    /// A float value (f32, f64, or an integer).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_float()
            .map(|f| f as f32)
            .ok_or_else(|| wrong(key, "f32", v))
    }

    /// A boolean value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(wrong(key, "bool", v)),
        }
    }

    /// The elements of an array value.
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| wrong(key, "array", v))
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.get_array(key)?
            .iter()
            .map(|e| e.as_str().ok_or_else(|| wrong(key, "array of string", e)))
            .collect()
    }

    /// Removes `key` and returns its value: for a reader that keeps what it needs in a form
    /// of its own, so the file's parsed metadata does not hold a second copy.
    pub fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key)
    }

    /// Removes `key`, an array of strings, and returns the strings themselves (moved, not
    /// copied). A missing key or a value of another type is an error naming the key, and
    /// the value then stays.
    pub fn take_str_array(&mut self, key: &str) -> Result<Vec<String>> {
        let v = self.require(key)?;
        let items = v.as_array().ok_or_else(|| wrong(key, "array", v))?;
        if let Some(e) = items.iter().find(|e| e.as_str().is_none()) {
            return Err(wrong(key, "array of string", e));
        }
        let Some(Value::Array(items)) = self.map.remove(key) else {
            return Err(GgufError::MissingKey(key.to_string()));
        };
        Ok(items
            .into_iter()
            .filter_map(|e| match e {
                Value::String(s) => Some(s),
                _ => None,
            })
            .collect())
    }

    /// An array of integers that each fit in i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.get_array(key)?
            .iter()
            .map(|e| {
                let i = e
                    .as_integer()
                    .ok_or_else(|| wrong(key, "array of integer", e))?;
                i32::try_from(i).map_err(|_| GgufError::OutOfRange {
                    key: key.to_string(),
                    value: i.to_string(),
                    target: "i32",
                })
            })
            .collect()
    }

    /// An array of floats.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.get_array(key)?
            .iter()
            .map(|e| {
                e.as_float()
                    .map(|f| f as f32)
                    .ok_or_else(|| wrong(key, "array of float", e))
            })
            .collect()
    }

    /// `get_u32` that returns `None` for a missing key but still errors on a wrong type.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        if self.contains(key) {
            self.get_u32(key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// `get_f32` that returns `None` for a missing key but still errors on a wrong type.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        if self.contains(key) {
            self.get_f32(key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// `get_bool` that returns `None` for a missing key but still errors on a wrong type.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        if self.contains(key) {
            self.get_bool(key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// `get_str` that returns `None` for a missing key but still errors on a wrong type.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        if self.contains(key) {
            self.get_str(key).map(Some)
        } else {
            Ok(None)
        }
    }
}
