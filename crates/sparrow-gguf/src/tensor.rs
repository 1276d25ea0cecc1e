//! The tensor table: name, shape, type and where each tensor's bytes lie in the file.

use sparrow_quant::GgmlType;

/// One entry of the tensor table, already checked against the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the innermost (contiguous) dimension, i.e. the
    /// number of columns of a weight matrix.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Total number of elements (checked when the table was read, so it cannot overflow).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Number of rows when viewed as a matrix of `dims[0]` columns.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Length of a row (`dims[0]`), 1 for a scalar.
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
}
