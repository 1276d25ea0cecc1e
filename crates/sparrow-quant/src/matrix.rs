//! A validated view of a 2-D weight tensor (its products are in `crate::products`).

use crate::error::check_len;
use crate::error::QuantError;
use crate::kernels::Kernels;
use crate::level::SimdLevel;
use crate::row_groups::GROUP_ROWS;
use crate::types::GgmlType;

/// A row-major matrix of `rows` rows, each `cols` elements of block format `ty`, viewed in
/// place (typically in a memory-mapped GGUF file).
///
/// Construction checks that `data` is exactly `rows * row_bytes` long (with overflow-checked
/// arithmetic) and that a row is a whole number of blocks, so the products need no further
/// per-row checks. In GGUF terms, `cols` is `ne[0]` and `rows` the product of the others.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    ty: GgmlType,
    data: &'a [u8],
    rows: usize,
    cols: usize,
    row_bytes: usize,
    /// How the rows are stored.
    layout: RowLayout,
}

/// How a [`QMatrix`]'s rows are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowLayout {
    /// ggml's, as in the file.
    Ggml,
    /// Sparrow's packed layout ([`crate::packed`]).
    Packed,
    /// Regrouped 16 rows at a time ([`crate::row_groups`]).
    Groups,
}

impl<'a> QMatrix<'a> {
    /// A `rows x cols` view of `data` as type `ty`.
    ///
    /// Errors: [`QuantError::ColsNotBlockMultiple`] if a row is not whole blocks,
    /// [`QuantError::SizeOverflow`] if the size does not fit in `usize`,
    /// [`QuantError::LenMismatch`] if `data` is not exactly the implied size. Types without
    /// kernels are accepted (their rows can still be read); the products reject them.
    pub fn new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self, QuantError> {
        let be = ty.block_elems();
        if !cols.is_multiple_of(be) {
            return Err(QuantError::ColsNotBlockMultiple {
                ty,
                cols,
                block_elems: be,
            });
        }
        let overflow = QuantError::SizeOverflow { rows, cols };
        let row_bytes = (cols / be)
            .checked_mul(ty.block_bytes())
            .ok_or(overflow.clone())?;
        let total = rows.checked_mul(row_bytes).ok_or(overflow)?;
        if data.len() != total {
            return Err(QuantError::LenMismatch {
                what: "matrix data",
                expected: total,
                actual: data.len(),
            });
        }
        Ok(QMatrix {
            ty,
            data,
            rows,
            cols,
            row_bytes,
            layout: RowLayout::Ggml,
        })
    }

    /// [`QMatrix::new`] in `layout`, which `ty` (and `rows`) must have.
    fn with_layout(
        ty: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
        layout: RowLayout,
    ) -> Result<Self, QuantError> {
        let supported = match layout {
            RowLayout::Ggml => true,
            RowLayout::Packed => crate::packed::is_packable(ty),
            RowLayout::Groups => crate::row_groups::is_groupable(ty, rows),
        };
        if !supported {
            return Err(QuantError::Unsupported(ty));
        }
        Ok(QMatrix {
            layout,
            ..Self::new(ty, data, rows, cols)?
        })
    }

    /// A `rows x cols` view of `data` whose rows were packed by
    /// [`crate::packed::pack_rows`]. Errors as [`QMatrix::new`], plus
    /// [`QuantError::Unsupported`] if `ty` has no packed layout.
    pub fn new_packed(
        ty: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, QuantError> {
        Self::with_layout(ty, data, rows, cols, RowLayout::Packed)
    }

    /// Whether the rows are in the packed layout (see [`QMatrix::new_packed`]).
    pub fn is_packed(&self) -> bool {
        self.layout == RowLayout::Packed
    }

    /// A `rows x cols` view of `data` whose rows were regrouped by
    /// [`crate::row_groups::group_rows`]. Errors as [`QMatrix::new`], plus
    /// [`QuantError::Unsupported`] if `ty` and `rows` have no row-group layout (see
    /// [`crate::row_groups::is_groupable`]).
    pub fn new_grouped(
        ty: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, QuantError> {
        Self::with_layout(ty, data, rows, cols, RowLayout::Groups)
    }

    /// Whether the rows are in row groups (see [`QMatrix::new_grouped`]).
    pub fn is_grouped(&self) -> bool {
        self.layout == RowLayout::Groups
    }

    /// The kernels that read this matrix's rows at `level`.
    pub(crate) fn kernels_at(&self, level: SimdLevel) -> Result<&'static Kernels, QuantError> {
        let k = if self.is_packed() {
            Kernels::packed_for_level(self.ty, level)
        } else {
            Kernels::for_level(self.ty, level)
        };
        k.ok_or(QuantError::Unsupported(self.ty))
    }

    /// The kernels for this matrix at the active SIMD level.
    pub(crate) fn kernels(&self) -> Result<&'static Kernels, QuantError> {
        self.kernels_at(SimdLevel::active())
    }

    /// The block format of the elements.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// The whole underlying byte slice.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (input features), elements per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The bytes of row `i` (in the packed layout if [`QMatrix::is_packed`]).
    ///
    /// # Panics
    /// If `i >= self.rows()`, like slice indexing, or the matrix is in row groups (whose
    /// rows are not contiguous); see [`QMatrix::try_row`] for the checked form.
    pub fn row(&self, i: usize) -> &'a [u8] {
        match self.try_row(i) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    /// The bytes of row `i`, or [`QuantError::RowOutOfRange`] (or
    /// [`QuantError::RowsInGroups`] for a matrix in row groups).
    pub fn try_row(&self, i: usize) -> Result<&'a [u8], QuantError> {
        if self.is_grouped() {
            return Err(QuantError::RowsInGroups);
        }
        if i >= self.rows {
            return Err(QuantError::RowOutOfRange {
                row: i,
                rows: self.rows,
            });
        }
        Ok(&self.data[i * self.row_bytes..(i + 1) * self.row_bytes])
    }

    /// Dequantize row `i` into `out` (`cols` elements), e.g. an embedding lookup.
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) -> Result<(), QuantError> {
        if !self.is_grouped() {
            let row = self.try_row(i)?;
            let k = self.kernels()?;
            check_len("out", self.cols, out.len())?;
            (k.dequantize)(row, out);
            return Ok(());
        }
        if i >= self.rows {
            return Err(QuantError::RowOutOfRange {
                row: i,
                rows: self.rows,
            });
        }
        let k = self.kernels()?;
        check_len("out", self.cols, out.len())?;
        let mut row = vec![0u8; self.row_bytes];
        crate::row_groups::ungroup_row(
            self.ty,
            self.group(i / GROUP_ROWS),
            i % GROUP_ROWS,
            &mut row,
        );
        (k.dequantize)(&row, out);
        Ok(())
    }

    /// The first `n` rows, viewed in place in the same layout: their products give each row
    /// the bits the whole matrix's give it (a draft model's logits over the most frequent
    /// part of a vocabulary, [`crate::matvec`] over them, the rest through
    /// [`crate::matvec_rows`]).
    ///
    /// Errors: [`QuantError::RowOutOfRange`] if `n` is zero or more than the rows;
    /// [`QuantError::RowsInGroups`] if the matrix is in row groups and `n` would split one
    /// (a multiple of 16 keeps them whole).
    pub fn first_rows(&self, n: usize) -> Result<QMatrix<'a>, QuantError> {
        if n == 0 || n > self.rows {
            return Err(QuantError::RowOutOfRange {
                row: n,
                rows: self.rows,
            });
        }
        if self.is_grouped() && !n.is_multiple_of(GROUP_ROWS) {
            return Err(QuantError::RowsInGroups);
        }
        Ok(QMatrix {
            data: &self.data[..n * self.row_bytes],
            rows: n,
            ..*self
        })
    }

    /// The bytes of row group `g` (rows `16 g .. 16 g + 16`) of a matrix in row groups.
    pub(crate) fn group(&self, g: usize) -> &'a [u8] {
        let bytes = GROUP_ROWS * self.row_bytes;
        &self.data[g * bytes..(g + 1) * bytes]
    }
}
