//! The one error type of this crate.
//!
//! Every size check names the sizes involved, because the usual cause of a mismatch is a
//! wrong tensor shape read from a model file, and the numbers are what one needs to find it.

use std::fmt;

use crate::types::GgmlType;

/// Why a dequantize / dot / matrix operation was refused.
///
/// Kernels never panic on bad input: every shape problem is reported here instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuantError {
    /// The type is in the catalogue but sparrow has no kernels for it (IQ*, TQ*, MXFP4,
    /// integer types, ...).
    Unsupported(GgmlType),
    /// A byte slice is not a whole number of blocks of `ty`.
    PartialBlock {
        /// The block format.
        ty: GgmlType,
        /// Length of the slice in bytes.
        len: usize,
        /// Bytes per block of `ty`.
        block_bytes: usize,
    },
    /// A column count is not a whole number of blocks of `ty`.
    ColsNotBlockMultiple {
        /// The block format.
        ty: GgmlType,
        /// The requested number of columns.
        cols: usize,
        /// Elements per block of `ty`.
        block_elems: usize,
    },
    /// A slice (`what` names it) does not have the length the other operands imply.
    LenMismatch {
        /// Which operand, e.g. `"x"` or `"out"`.
        what: &'static str,
        /// The length implied by the other operands.
        expected: usize,
        /// The length actually passed.
        actual: usize,
    },
    /// `rows * cols` (or its byte size) does not fit in `usize`.
    SizeOverflow {
        /// The requested number of rows.
        rows: usize,
        /// The requested number of columns.
        cols: usize,
    },
    /// A row's bytes were asked of a matrix stored in row groups ([`crate::row_groups`]),
    /// whose rows are not contiguous (use [`crate::QMatrix::dequantize_row`]).
    RowsInGroups,
    /// A row index past the end of a matrix.
    RowOutOfRange {
        /// The requested row.
        row: usize,
        /// The number of rows of the matrix.
        rows: usize,
    },
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            QuantError::Unsupported(ty) => write!(f, "no kernels for tensor type {ty}"),
            QuantError::PartialBlock {
                ty,
                len,
                block_bytes,
            } => write!(
                f,
                "{len} bytes of {ty} data is not a whole number of {block_bytes}-byte blocks"
            ),
            QuantError::ColsNotBlockMultiple {
                ty,
                cols,
                block_elems,
            } => write!(
                f,
                "{cols} columns of {ty} is not a whole number of {block_elems}-element blocks"
            ),
            QuantError::LenMismatch {
                what,
                expected,
                actual,
            } => write!(f, "{what} has length {actual}, expected {expected}"),
            QuantError::SizeOverflow { rows, cols } => {
                write!(f, "a {rows} x {cols} matrix overflows usize")
            }
            QuantError::RowOutOfRange { row, rows } => {
                write!(f, "row {row} out of range for a matrix of {rows} rows")
            }
            QuantError::RowsInGroups => write!(
                f,
                "the matrix is stored in row groups: a row's bytes are not contiguous"
            ),
        }
    }
}

impl std::error::Error for QuantError {}

/// [`QuantError::LenMismatch`] unless `actual == expected`: the one length check every
/// public entry point makes of its slices.
pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), QuantError> {
    if expected != actual {
        return Err(QuantError::LenMismatch {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}
