//! Errors of the GGUF reader. Each says what was wrong and where (key, tensor, byte offset),
//! because a user facing a broken file needs to know which part of it is broken.

use std::path::PathBuf;

/// Everything that can go wrong reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic bytes are {found:?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} (sparrow reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: reading {what} at byte offset {offset} needs {needed} bytes but the file has {file_len}")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("{what} at byte offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("metadata key '{key}' at byte offset {offset} has unknown value type {ty}")]
    UnknownValueType { key: String, offset: u64, ty: u32 },
    #[error("metadata key '{key}' appears twice")]
    DuplicateKey { key: String },
    #[error("metadata key '{key}': arrays nested deeper than {max} levels")]
    TooDeep { key: String, max: usize },
    #[error("metadata key '{key}': array of {count} elements cannot fit in the {remaining} bytes left in the file")]
    ArrayTooLong {
        key: String,
        count: u64,
        remaining: u64,
    },
    #[error("general.alignment = {0} is not a non-zero power of two")]
    BadAlignment(u64),
    #[error("tensor '{tensor}' at byte offset {offset} has unknown type id {id}")]
    UnknownTensorType {
        tensor: String,
        offset: u64,
        id: u32,
    },
    #[error("tensor '{tensor}' has {n_dims} dimensions (at most {max} are allowed)")]
    TooManyDims {
        tensor: String,
        n_dims: u32,
        max: u32,
    },
    #[error("tensor '{tensor}' has shape {dims:?} whose element count overflows")]
    ShapeOverflow { tensor: String, dims: Vec<u64> },
    #[error("tensor '{tensor}' of type {ty} has shape {dims:?}: its rows ({row}) are not a whole number of {block}-element blocks")]
    PartialBlock {
        tensor: String,
        ty: &'static str,
        dims: Vec<u64>,
        row: u64,
        block: usize,
    },
    #[error(
        "tensor '{tensor}' data [{start}, {start}+{size}) lies outside the file ({file_len} bytes)"
    )]
    TensorOutOfBounds {
        tensor: String,
        start: u64,
        size: u64,
        file_len: u64,
    },
    #[error(
        "tensor '{tensor}' data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor '{0}' appears twice in the tensor table")]
    DuplicateTensor(String),
    #[error("tensor count {count} cannot fit in the {remaining} bytes left in the file")]
    TooManyTensors { count: u64, remaining: u64 },
    #[error("metadata key '{0}' is missing")]
    MissingKey(String),
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("metadata key '{key}' value {value} does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },
    #[error("tensor '{0}' is missing")]
    MissingTensor(String),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, GgufError>;
