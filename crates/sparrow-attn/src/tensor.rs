//! `Tensor3`: a dense `(seq, heads, dim)` f32 tensor, row-major.

use crate::error::{AttnError, Result};

/// Multiply the three shape components with overflow checks.
pub(crate) fn checked_len(seq: usize, heads: usize, dim: usize) -> Result<usize> {
    seq.checked_mul(heads)
        .and_then(|x| x.checked_mul(dim))
        .ok_or(AttnError::ShapeOverflow {
            what: "seq * heads * dim",
        })
}

/// `Ok` when `a` and `b` have the same shape, else a [`AttnError::ShapeMismatch`] naming the
/// first component that differs (`b`'s against `a`'s).
pub(crate) fn same_shape(a: &Tensor3, b: &Tensor3) -> Result<()> {
    let (x, y) = (a.shape(), b.shape());
    let (what, expected, got) = if x.0 != y.0 {
        ("seq", x.0, y.0)
    } else if x.1 != y.1 {
        ("heads", x.1, y.1)
    } else if x.2 != y.2 {
        ("dim", x.2, y.2)
    } else {
        return Ok(());
    };
    Err(AttnError::ShapeMismatch {
        what,
        expected,
        got,
    })
}

/// A `(seq, heads, dim)` tensor of `f32`, stored row-major: element `(t, h, d)` lives at
/// `(t * heads + h) * dim + d`. One "row" is the `dim` values of one token and one head.
///
/// `heads` and `dim` must be positive; `seq` may be zero (an empty sequence).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor3 {
    data: Vec<f32>,
    seq: usize,
    heads: usize,
    dim: usize,
}

impl Tensor3 {
    /// A tensor of zeros. Errors when `heads` or `dim` is zero or the size overflows.
    pub fn zeros(seq: usize, heads: usize, dim: usize) -> Result<Self> {
        check_heads_dim(heads, dim)?;
        let len = checked_len(seq, heads, dim)?;
        Ok(Self {
            data: vec![0.0; len],
            seq,
            heads,
            dim,
        })
    }

    /// Wrap `data` as a tensor of the given shape; `data.len()` must equal `seq * heads * dim`.
    pub fn from_vec(data: Vec<f32>, seq: usize, heads: usize, dim: usize) -> Result<Self> {
        check_heads_dim(heads, dim)?;
        let len = checked_len(seq, heads, dim)?;
        if data.len() != len {
            return Err(AttnError::DataLength {
                what: "Tensor3 data",
                expected: len,
                got: data.len(),
            });
        }
        Ok(Self {
            data,
            seq,
            heads,
            dim,
        })
    }

    /// Build a tensor by calling `f(t, h, d)` for every element.
    pub fn from_fn(
        seq: usize,
        heads: usize,
        dim: usize,
        mut f: impl FnMut(usize, usize, usize) -> f32,
    ) -> Result<Self> {
        let mut t = Self::zeros(seq, heads, dim)?;
        let mut idx = 0;
        for s in 0..seq {
            for h in 0..heads {
                for d in 0..dim {
                    t.data[idx] = f(s, h, d);
                    idx += 1;
                }
            }
        }
        Ok(t)
    }

    /// Number of tokens.
    pub fn seq(&self) -> usize {
        self.seq
    }

    /// Number of heads.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Values per head (the head dimension).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// `(seq, heads, dim)`.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.seq, self.heads, self.dim)
    }

    /// All elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// All elements, row-major, mutable.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Consume the tensor and return its buffer.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// The `dim` values of token `t`, head `h`.
    pub fn row(&self, t: usize, h: usize) -> Result<&[f32]> {
        let off = self.row_offset(t, h)?;
        Ok(&self.data[off..off + self.dim])
    }

    /// The `dim` values of token `t`, head `h`, mutable.
    pub fn row_mut(&mut self, t: usize, h: usize) -> Result<&mut [f32]> {
        let off = self.row_offset(t, h)?;
        let dim = self.dim;
        Ok(&mut self.data[off..off + dim])
    }

    /// All heads of token `t` (`heads * dim` values).
    pub fn token(&self, t: usize) -> Result<&[f32]> {
        if t >= self.seq {
            return Err(AttnError::IndexOutOfRange {
                what: "token",
                index: t,
                len: self.seq,
            });
        }
        let w = self.heads * self.dim;
        Ok(&self.data[t * w..(t + 1) * w])
    }

    fn row_offset(&self, t: usize, h: usize) -> Result<usize> {
        if t >= self.seq {
            return Err(AttnError::IndexOutOfRange {
                what: "token",
                index: t,
                len: self.seq,
            });
        }
        if h >= self.heads {
            return Err(AttnError::IndexOutOfRange {
                what: "head",
                index: h,
                len: self.heads,
            });
        }
        Ok((t * self.heads + h) * self.dim)
    }

    /// Largest absolute element-wise difference to `other` (`f32::INFINITY` on shape mismatch).
    pub fn max_abs_diff(&self, other: &Tensor3) -> f32 {
        if self.shape() != other.shape() {
            return f32::INFINITY;
        }
        self.data
            .iter()
            .zip(&other.data)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
    }
}

fn check_heads_dim(heads: usize, dim: usize) -> Result<()> {
    if heads == 0 {
        return Err(AttnError::ZeroDim { what: "heads" });
    }
    if dim == 0 {
        return Err(AttnError::ZeroDim { what: "dim" });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_errors() {
        assert_eq!(Tensor3::zeros(0, 1, 1).unwrap().data().len(), 0);
        assert!(matches!(
            Tensor3::zeros(1, 0, 1),
            Err(AttnError::ZeroDim { what: "heads" })
        ));
        assert!(matches!(
            Tensor3::zeros(1, 1, 0),
            Err(AttnError::ZeroDim { what: "dim" })
        ));
        assert!(matches!(
            Tensor3::zeros(usize::MAX, 2, 2),
            Err(AttnError::ShapeOverflow { .. })
        ));
        assert!(matches!(
            Tensor3::from_vec(vec![0.0; 5], 2, 1, 2),
            Err(AttnError::DataLength {
                expected: 4,
                got: 5,
                ..
            })
        ));
        let t = Tensor3::from_fn(2, 3, 4, |s, h, d| (s * 100 + h * 10 + d) as f32).unwrap();
        assert_eq!(t.row(1, 2).unwrap(), &[120.0, 121.0, 122.0, 123.0]);
        assert!(t.row(2, 0).is_err());
        assert!(t.row(0, 3).is_err());
        assert!(t.token(2).is_err());
        assert_eq!(t.token(1).unwrap().len(), 12);
    }
}
