//! Parsing of the GGUF header, metadata and tensor table. Pure functions over a byte slice,
//! so they can be tested on in-memory files; `GgufFile` runs them over the memory map.

use crate::cursor::Cursor;
use crate::error::{GgufError, Result};
use crate::tensor::TensorInfo;
use crate::value::{Metadata, Value};
use sparrow_quant::GgmlType;
use std::collections::HashSet;

/// "GGUF" read as a little-endian u32.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are refused (no real file needs more than one level).
const MAX_ARRAY_DEPTH: usize = 8;

/// Value type ids as stored in the file.
pub(crate) mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Smallest encoded size of one value of type `t` (used to refuse absurd array lengths
/// before allocating).
fn min_encoded_size(t: u32) -> u64 {
    match t {
        ty::U8 | ty::I8 | ty::BOOL => 1,
        ty::U16 | ty::I16 => 2,
        ty::U32 | ty::I32 | ty::F32 => 4,
        ty::STRING | ty::U64 | ty::I64 | ty::F64 => 8,
        ty::ARRAY => 12,
        _ => 1,
    }
}

pub(crate) struct Parsed {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

fn read_value(c: &mut Cursor, key: &str, t: u32, depth: usize) -> Result<Value> {
    let what = || format!("value of metadata key '{key}'");
    Ok(match t {
        ty::U8 => Value::U8(c.u8(&what)?),
        ty::I8 => Value::I8(c.u8(&what)? as i8),
        ty::U16 => Value::U16(c.u16(&what)?),
        ty::I16 => Value::I16(c.u16(&what)? as i16),
        ty::U32 => Value::U32(c.u32(&what)?),
        ty::I32 => Value::I32(c.u32(&what)? as i32),
        ty::F32 => Value::F32(f32::from_bits(c.u32(&what)?)),
        ty::BOOL => match c.u8(&what)? {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => {
                return Err(GgufError::OutOfRange {
                    key: key.to_string(),
                    value: b.to_string(),
                    target: "bool",
                })
            }
        },
        ty::STRING => Value::String(c.string(&what)?),
        ty::U64 => Value::U64(c.u64(&what)?),
        ty::I64 => Value::I64(c.u64(&what)? as i64),
        ty::F64 => Value::F64(f64::from_bits(c.u64(&what)?)),
        ty::ARRAY => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::TooDeep {
                    key: key.to_string(),
                    max: MAX_ARRAY_DEPTH,
                });
            }
            let offset = c.pos();
            let elem_t = c.u32(&|| format!("array element type of metadata key '{key}'"))?;
            if elem_t > ty::F64 {
                return Err(GgufError::UnknownValueType {
                    key: key.to_string(),
                    offset,
                    ty: elem_t,
                });
            }
            let count = c.u64(&|| format!("array length of metadata key '{key}'"))?;
            let remaining = c.remaining();
            if count.saturating_mul(min_encoded_size(elem_t)) > remaining {
                return Err(GgufError::ArrayTooLong {
                    key: key.to_string(),
                    count,
                    remaining,
                });
            }
            let mut values = Vec::with_capacity(count as usize);
            for _ in 0..count {
                values.push(read_value(c, key, elem_t, depth + 1)?);
            }
            Value::Array(values)
        }
        other => {
            return Err(GgufError::UnknownValueType {
                key: key.to_string(),
                offset: c.pos().saturating_sub(4),
                ty: other,
            })
        }
    })
}

fn read_tensor_info(c: &mut Cursor, index: u64) -> Result<(TensorInfo, u64)> {
    let name = c.string(&|| format!("name of tensor #{index}"))?;
    let n_dims = c.u32(&|| format!("dimension count of tensor '{name}'"))?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name,
            n_dims,
            max: MAX_DIMS,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(c.u64(&|| format!("dimension {d} of tensor '{name}'"))?);
    }
    let type_offset = c.pos();
    let id = c.u32(&|| format!("type of tensor '{name}'"))?;
    let ty = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownTensorType {
        tensor: name.clone(),
        offset: type_offset,
        id,
    })?;
    let rel_offset = c.u64(&|| format!("data offset of tensor '{name}'"))?;
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| GgufError::ShapeOverflow {
            tensor: name.clone(),
            dims: dims.clone(),
        })?;
    let row = dims.first().copied().unwrap_or(1);
    if row % ty.block_elems() as u64 != 0 {
        return Err(GgufError::PartialBlock {
            tensor: name,
            ty: ty.name(),
            dims,
            row,
            block: ty.block_elems(),
        });
    }
    let size = ty
        .bytes_for(n_elements)
        .ok_or_else(|| GgufError::ShapeOverflow {
            tensor: name.clone(),
            dims: dims.clone(),
        })? as u64;
    Ok((
        TensorInfo {
            name,
            dims,
            ty,
            offset: 0,
            size,
        },
        rel_offset,
    ))
}

/// Parse a whole GGUF file held in `bytes`.
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed> {
    let file_len = bytes.len() as u64;
    let mut c = Cursor::new(bytes);
    let magic = c.take(4, &|| "magic".to_string())?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.try_into().expect("4 bytes"),
        });
    }
    let version = c.u32(&|| "version".to_string())?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(&|| "tensor count".to_string())?;
    let n_kv = c.u64(&|| "metadata count".to_string())?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key = c.string(&|| format!("key of metadata entry #{i}"))?;
        let t = c.u32(&|| format!("value type of metadata key '{key}'"))?;
        let value = read_value(&mut c, &key, t, 0)?;
        if metadata.map.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        metadata.map.insert(key, value);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let a = v.as_integer().unwrap_or(0);
            if a <= 0 || a > u32::MAX as i128 || (a as u64).count_ones() != 1 {
                return Err(GgufError::BadAlignment(a.max(0) as u64));
            }
            a as u64
        }
    };

    // A tensor-table entry takes at least 8 (name length) + 4 + 4 + 8 bytes.
    let remaining = c.remaining();
    if n_tensors.saturating_mul(24) > remaining {
        return Err(GgufError::TooManyTensors {
            count: n_tensors,
            remaining,
        });
    }
    let mut entries = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let (info, rel) = read_tensor_info(&mut c, i)?;
        if !names.insert(info.name.clone()) {
            return Err(GgufError::DuplicateTensor(info.name));
        }
        entries.push((info, rel));
    }

    let data_offset = c.pos().div_ceil(alignment) * alignment;
    let mut tensors = Vec::with_capacity(entries.len());
    for (mut info, rel) in entries {
        if rel % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                tensor: info.name,
                offset: rel,
                alignment,
            });
        }
        let start = data_offset.checked_add(rel);
        let end = start.and_then(|s| s.checked_add(info.size));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => info.offset = start,
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: info.name,
                    start: data_offset.saturating_add(rel),
                    size: info.size,
                    file_len,
                })
            }
        }
        tensors.push(info);
    }
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
