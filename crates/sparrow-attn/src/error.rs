//! The one error type of the crate. Every check on caller input ends here, as a value.

use core::fmt;

/// Everything that can go wrong when calling into `sparrow-attn`.
///
/// Each variant says *what* was wrong and carries the numbers needed to see *where*.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttnError {
    /// A dimension that must be positive was zero (`what` names it: "heads", "dim", ...).
    ZeroDim {
        /// Which dimension was zero.
        what: &'static str,
    },
    /// `seq * heads * dim` (or another size product) does not fit in `usize`.
    ShapeOverflow {
        /// Which size computation overflowed.
        what: &'static str,
    },
    /// A data buffer has the wrong number of elements.
    DataLength {
        /// Which buffer.
        what: &'static str,
        /// Elements the shape requires.
        expected: usize,
        /// Elements supplied.
        got: usize,
    },
    /// Two tensors (or a tensor and a cache) disagree on a shape component.
    ShapeMismatch {
        /// Which component ("seq", "heads", "dim", "q/k seq", ...).
        what: &'static str,
        /// The value required.
        expected: usize,
        /// The value supplied.
        got: usize,
    },
    /// The number of query heads is not a positive multiple of the key/value heads.
    HeadsNotDivisible {
        /// Query heads.
        q_heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// A configuration field has an unusable value.
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Why it is unusable.
        reason: &'static str,
    },
    /// An index (token, head, key row, block) is outside its range.
    IndexOutOfRange {
        /// What was indexed.
        what: &'static str,
        /// The index supplied.
        index: usize,
        /// The exclusive upper bound.
        len: usize,
    },
    /// A range of key rows is reversed or reaches past the end.
    BadRange {
        /// Range start.
        start: usize,
        /// Range end (exclusive).
        end: usize,
        /// Number of rows available.
        len: usize,
    },
    /// Appending would exceed the cache capacity.
    CacheFull {
        /// The capacity of the cache.
        capacity: usize,
        /// Tokens already stored.
        len: usize,
        /// Tokens the call tried to add.
        adding: usize,
    },
    /// A decode call was made on a cache holding no tokens.
    EmptyCache,
    /// Eviction found no token it is allowed to evict (every token is a sink).
    NothingToEvict,
}

impl fmt::Display for AttnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttnError::ZeroDim { what } => write!(f, "dimension `{what}` must be greater than zero"),
            AttnError::ShapeOverflow { what } => write!(f, "size of {what} overflows usize"),
            AttnError::DataLength { what, expected, got } => {
                write!(f, "{what}: expected {expected} elements, got {got}")
            }
            AttnError::ShapeMismatch { what, expected, got } => {
                write!(f, "shape mismatch in {what}: expected {expected}, got {got}")
            }
            AttnError::HeadsNotDivisible { q_heads, kv_heads } => write!(
                f,
                "query heads ({q_heads}) must be a positive multiple of key/value heads ({kv_heads})"
            ),
            AttnError::InvalidConfig { field, reason } => {
                write!(f, "invalid config field `{field}`: {reason}")
            }
            AttnError::IndexOutOfRange { what, index, len } => {
                write!(f, "{what} index {index} out of range (len {len})")
            }
            AttnError::BadRange { start, end, len } => {
                write!(f, "key range {start}..{end} is invalid for {len} rows")
            }
            AttnError::CacheFull { capacity, len, adding } => write!(
                f,
                "cache full: capacity {capacity}, holding {len}, tried to add {adding}"
            ),
            AttnError::EmptyCache => write!(f, "the cache holds no tokens"),
            AttnError::NothingToEvict => write!(f, "no evictable token: every token is a sink"),
        }
    }
}

impl std::error::Error for AttnError {}

/// Result alias used throughout the crate.
pub type Result<T> = core::result::Result<T, AttnError>;
