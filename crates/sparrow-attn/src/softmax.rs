//! Partial attention with log-sum-exp, and the exact merge.
//!
//! Attention of one query over a key set `S` is `out = Σ_{j∈S} p_j v_j` with
//! `p_j = exp(s_j - lse)` and `lse = log Σ_{j∈S} exp(s_j)`. Split `S` into disjoint parts
//! (a window, a list of blocks, a bucket), compute `(out_i, lse_i)` for each, and
//! [`merge`] recovers the attention over the union *exactly* (up to rounding):
//! `lse = log(e^{lse_a} + e^{lse_b})`, `out = e^{lse_a - lse} out_a + e^{lse_b - lse} out_b`.
//!
//! [`partial_attention`] runs one query row through the kernel's block primitive
//! ([`crate::kernel::attend_block`]) over any rows a [`KvView`] names;
//! [`OnlineSoftmax`] accumulates such partials, or single keys, without normalising in
//! between.

use core::ops::Range;

use crate::element::KvElement;
use crate::error::{AttnError, Result};
use crate::kernel::{attend_block, union, write_merged, AttnShape, KvRows, KvSource, Level, Unit};
use crate::tensor::{same_shape, Tensor3};

/// Running softmax state of one query: running max, running denominator, and the
/// unnormalised weighted sum of values, rescaled whenever the max grows (Milakov &
/// Gimelshein, 2018). Keys can arrive one at a time ([`push`](Self::push): the plain
/// single-row reference), as whole key sets ([`attend`](Self::attend), through the
/// kernel), or as finished partials ([`merge_partial`](Self::merge_partial)).
#[derive(Clone, Debug)]
pub struct OnlineSoftmax {
    max: f32,
    sum: f32,
    acc: Vec<f32>,
}

impl OnlineSoftmax {
    /// An empty state for values of length `dim` (`dim` must be positive).
    pub fn new(dim: usize) -> Result<Self> {
        if dim == 0 {
            return Err(AttnError::ZeroDim { what: "dim" });
        }
        Ok(Self {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            acc: vec![0.0; dim],
        })
    }

    /// Value length.
    pub fn dim(&self) -> usize {
        self.acc.len()
    }

    /// Forget everything seen so far.
    pub fn reset(&mut self) {
        self.max = f32::NEG_INFINITY;
        self.sum = 0.0;
        self.acc.fill(0.0);
    }

    /// True when no key with a finite score has been absorbed.
    pub fn is_empty(&self) -> bool {
        self.sum == 0.0
    }

    /// `log Σ exp(score)` over everything absorbed (`-inf` when empty).
    pub fn lse(&self) -> f32 {
        if self.sum > 0.0 {
            self.max + self.sum.ln()
        } else {
            f32::NEG_INFINITY
        }
    }

    /// Absorb one key with (already scaled) `score` and its `value`.
    pub fn push(&mut self, score: f32, value: &[f32]) -> Result<()> {
        self.absorb("value", value, score)
    }

    /// Absorb a finished partial `(out, lse)` (normalised output over a disjoint key set).
    pub fn merge_partial(&mut self, out: &[f32], lse: f32) -> Result<()> {
        self.absorb("partial out", out, lse)
    }

    /// Add `e^{lse}` times `out` — one key (`out` its value, `lse` its score) or a
    /// normalised partial.
    fn absorb(&mut self, what: &'static str, out: &[f32], lse: f32) -> Result<()> {
        check_len(what, self.acc.len(), out.len())?;
        if lse == f32::NEG_INFINITY {
            return Ok(());
        }
        if lse > self.max {
            let c = (self.max - lse).exp();
            self.acc.iter_mut().for_each(|a| *a *= c);
            self.sum *= c;
            self.max = lse;
        }
        let w = (lse - self.max).exp();
        self.sum += w;
        self.acc.iter_mut().zip(out).for_each(|(a, v)| *a += w * v);
        Ok(())
    }

    /// Absorb the keys `keys` of `kv` for query `q` (scores are `scale * q·k`).
    pub fn attend<E: KvElement>(
        &mut self,
        q: &[f32],
        kv: &KvView<'_, E>,
        keys: KeySet<'_>,
        scale: f32,
    ) -> Result<()> {
        check_len("state", kv.dim, self.acc.len())?;
        let p = partial_attention(q, kv, keys, scale)?;
        self.merge_partial(&p.out, p.lse)
    }

    /// Write the normalised output into `out` and return the lse. An empty state writes
    /// zeros and returns `-inf`.
    pub fn finish(&self, out: &mut [f32]) -> Result<f32> {
        check_len("out", self.acc.len(), out.len())?;
        if self.sum > 0.0 {
            let inv = 1.0 / self.sum;
            out.iter_mut()
                .zip(&self.acc)
                .for_each(|(o, a)| *o = a * inv);
        } else {
            out.fill(0.0);
        }
        Ok(self.lse())
    }

    /// The normalised output and lse as a [`Partial`].
    pub fn to_partial(&self) -> Partial {
        let mut out = vec![0.0; self.acc.len()];
        let lse = self.finish(&mut out).unwrap_or(f32::NEG_INFINITY);
        Partial { out, lse }
    }
}

/// The attention of one query over one key set: normalised output and log-sum-exp of
/// the scores. An empty key set has `lse == -inf` and a zero output.
#[derive(Clone, Debug, PartialEq)]
pub struct Partial {
    /// `Σ p_j v_j` with `p_j = exp(s_j - lse)`.
    pub out: Vec<f32>,
    /// `log Σ exp(s_j)`.
    pub lse: f32,
}

impl Partial {
    /// The partial of an empty key set.
    pub fn empty(dim: usize) -> Self {
        Self {
            out: vec![0.0; dim],
            lse: f32::NEG_INFINITY,
        }
    }
}

/// Merge two partials over *disjoint* key sets into the partial over their union.
pub fn merge(a: &Partial, b: &Partial) -> Result<Partial> {
    let mut out = a.out.clone();
    let lse = merge_into(&mut out, a.lse, &b.out, b.lse)?;
    Ok(Partial { out, lse })
}

/// In-place [`merge`]: `out_a` becomes the merged output; returns the merged lse.
pub fn merge_into(out_a: &mut [f32], lse_a: f32, out_b: &[f32], lse_b: f32) -> Result<f32> {
    check_len("partial out", out_a.len(), out_b.len())?;
    if lse_b == f32::NEG_INFINITY {
        return Ok(lse_a);
    }
    if lse_a == f32::NEG_INFINITY {
        out_a.copy_from_slice(out_b);
        return Ok(lse_b);
    }
    let m = lse_a.max(lse_b);
    let (wa, wb) = ((lse_a - m).exp(), (lse_b - m).exp());
    let s = wa + wb;
    let (ca, cb) = (wa / s, wb / s);
    out_a
        .iter_mut()
        .zip(out_b)
        .for_each(|(a, b)| *a = ca * *a + cb * b);
    Ok(m + s.ln())
}

/// Read-only view of the keys and values of *one head*: row `j` of keys is
/// `keys[j * stride .. j * stride + dim]`, and likewise for values.
///
/// Views come from a [`Tensor3`] pair ([`KvView::from_tensors`]), from a KV cache
/// (`LayerCache::view`), or from any caller-owned buffers ([`KvView::new`]), so a sparse
/// policy can run [`partial_attention`] over whatever key subset it selects. A view is a
/// [`KvSource`] of one KV head (rows `stride` apart).
#[derive(Clone, Copy, Debug)]
pub struct KvView<'a, E: KvElement = f32> {
    pub(crate) keys: &'a [E],
    pub(crate) values: &'a [E],
    pub(crate) rows: usize,
    pub(crate) dim: usize,
    pub(crate) stride: usize,
}

impl<'a, E: KvElement> KvView<'a, E> {
    /// A view of `rows` rows of length `dim`, `stride` elements apart, in both slices.
    pub fn new(
        keys: &'a [E],
        values: &'a [E],
        rows: usize,
        dim: usize,
        stride: usize,
    ) -> Result<Self> {
        if dim == 0 {
            return Err(AttnError::ZeroDim { what: "dim" });
        }
        if stride < dim {
            return Err(AttnError::InvalidConfig {
                field: "stride",
                reason: "must be at least dim",
            });
        }
        let need = match rows {
            0 => 0,
            r => (r - 1)
                .checked_mul(stride)
                .and_then(|x| x.checked_add(dim))
                .ok_or(AttnError::ShapeOverflow {
                    what: "view rows * stride",
                })?,
        };
        for (what, got) in [("view keys", keys.len()), ("view values", values.len())] {
            if got < need {
                return Err(AttnError::DataLength {
                    what,
                    expected: need,
                    got,
                });
            }
        }
        Ok(Self {
            keys,
            values,
            rows,
            dim,
            stride,
        })
    }

    /// Number of key rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Row length.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Elements of rows `start..start + n` (the last row only `dim` long).
    fn span(&self, start: usize, n: usize) -> Range<usize> {
        let a = start * self.stride;
        a..a + n.saturating_sub(1) * self.stride + self.dim
    }
}

/// One KV head's rows, `stride` apart (the last row only `dim` long, so a run is exactly
/// what the kernel reads; not meant for [`crate::kernel::read_f32`]).
impl<E: KvElement> KvSource for KvView<'_, E> {
    fn kv_dim(&self) -> usize {
        self.stride
    }
    fn key_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        E::rows(&self.keys[self.span(start, n)])
    }
    fn value_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        E::rows(&self.values[self.span(start, n)])
    }
}

impl<'a> KvView<'a, f32> {
    /// The view of head `head` of a `(seq, heads, dim)` key tensor and value tensor.
    pub fn from_tensors(k: &'a Tensor3, v: &'a Tensor3, head: usize) -> Result<Self> {
        same_shape(k, v)?;
        if head >= k.heads() {
            return Err(AttnError::IndexOutOfRange {
                what: "head",
                index: head,
                len: k.heads(),
            });
        }
        let off = head * k.dim();
        Self::new(
            &k.data()[off..],
            &v.data()[off..],
            k.seq(),
            k.dim(),
            k.heads() * k.dim(),
        )
    }
}

/// Which key rows of a [`KvView`] a partial attention visits. A row named twice in one set
/// is read once.
#[derive(Clone, Debug)]
pub enum KeySet<'a> {
    /// Every row of the view.
    All,
    /// One contiguous range of rows.
    Range(Range<usize>),
    /// Several ranges (e.g. selected blocks).
    Ranges(&'a [Range<usize>]),
    /// Explicit row indices (e.g. a bucket or a candidate list).
    Indices(&'a [usize]),
}

impl KeySet<'_> {
    /// The set as ascending disjoint ranges of rows `< rows`, checked.
    fn ranges(self, rows: usize) -> Result<Vec<Range<usize>>> {
        let check = |r: &Range<usize>| {
            if r.start > r.end || r.end > rows {
                return Err(AttnError::BadRange {
                    start: r.start,
                    end: r.end,
                    len: rows,
                });
            }
            Ok(r.clone())
        };
        Ok(union(match self {
            KeySet::All => std::iter::once(0..rows).collect(),
            KeySet::Range(r) => std::iter::once(check(&r)?).collect(),
            KeySet::Ranges(rs) => rs.iter().map(check).collect::<Result<_>>()?,
            KeySet::Indices(ix) => {
                if let Some(&bad) = ix.iter().find(|&&j| j >= rows) {
                    return Err(AttnError::IndexOutOfRange {
                        what: "key row",
                        index: bad,
                        len: rows,
                    });
                }
                ix.iter().map(|&j| j..j + 1).collect()
            }
        }))
    }
}

/// Attention of query `q` over the rows `keys` of `kv`, with scores `scale * q·k`:
/// returns the normalised output and the log-sum-exp. The building block for any
/// selection policy: compute one [`Partial`] per key source, then [`merge`] them.
pub fn partial_attention<E: KvElement>(
    q: &[f32],
    kv: &KvView<'_, E>,
    keys: KeySet<'_>,
    scale: f32,
) -> Result<Partial> {
    let mut p = Partial::empty(kv.dim);
    p.lse = partial_attention_into(q, kv, keys, scale, &mut p.out)?;
    Ok(p)
}

/// [`partial_attention`] writing into a caller buffer (`out.len() == dim`); returns the lse.
/// One query row through [`attend_block`] (tiles of keys, online softmax).
pub fn partial_attention_into<E: KvElement>(
    q: &[f32],
    kv: &KvView<'_, E>,
    keys: KeySet<'_>,
    scale: f32,
    out: &mut [f32],
) -> Result<f32> {
    check_len("query", kv.dim, q.len())?;
    check_len("out", kv.dim, out.len())?;
    let keys = keys.ranges(kv.rows)?;
    let shape = AttnShape {
        n_head: 1,
        n_head_kv: 1,
        head_dim: kv.dim,
    };
    // The kernel scores `q·k / √dim`: fold the caller's scale into the query.
    let c = scale * (kv.dim as f32).sqrt();
    let q: Vec<f32> = q.iter().map(|x| x * c).collect();
    let unit = Unit {
        tokens: 0..1,
        kv_head: 0,
        keys: keys.clone(),
    };
    let part = attend_block(Level::active(), shape, kv, &q, &unit, &[keys]);
    let mut lse = [f32::NEG_INFINITY];
    write_merged(shape, &[(0..1, 0)], &[part], out, Some(&mut lse));
    Ok(lse[0])
}

pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected != got {
        return Err(AttnError::DataLength {
            what,
            expected,
            got,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::needless_range_loop)]
    use super::*;

    fn naive(
        q: &[f32],
        k: &[Vec<f32>],
        v: &[Vec<f32>],
        set: &[usize],
        scale: f32,
    ) -> (Vec<f64>, f64) {
        let s: Vec<f64> = set
            .iter()
            .map(|&j| {
                scale as f64
                    * q.iter()
                        .zip(&k[j])
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        let mut out = vec![0.0; q.len()];
        for (x, &j) in s.iter().zip(set) {
            let p = (x - m).exp() / z;
            for d in 0..q.len() {
                out[d] += p * v[j][d] as f64;
            }
        }
        (out, m + z.ln())
    }

    #[test]
    fn partials_merge_to_the_whole() {
        let dim = 12;
        let n = 40;
        let f = |i: usize, d: usize| ((i * 31 + d * 17) % 23) as f32 / 7.0 - 1.5;
        let k: Vec<Vec<f32>> = (0..n)
            .map(|i| (0..dim).map(|d| f(i, d)).collect())
            .collect();
        let v: Vec<Vec<f32>> = (0..n)
            .map(|i| (0..dim).map(|d| f(i + 5, d + 2)).collect())
            .collect();
        let kf: Vec<f32> = k.concat();
        let vf: Vec<f32> = v.concat();
        let view = KvView::new(&kf, &vf, n, dim, dim).unwrap();
        let q: Vec<f32> = (0..dim).map(|d| f(99, d)).collect();
        let scale = 0.3;
        let a = partial_attention(&q, &view, KeySet::Range(0..13), scale).unwrap();
        let b = partial_attention(&q, &view, KeySet::Indices(&[20, 13, 39, 14]), scale).unwrap();
        let c = partial_attention(&q, &view, KeySet::Ranges(&[15..20, 21..39]), scale).unwrap();
        let m = merge(&merge(&a, &b).unwrap(), &c).unwrap();
        let whole = partial_attention(&q, &view, KeySet::All, scale).unwrap();
        let (r, lse) = naive(&q, &k, &v, &(0..n).collect::<Vec<_>>(), scale);
        for d in 0..dim {
            assert!((m.out[d] as f64 - r[d]).abs() < 1e-5);
            assert!((whole.out[d] as f64 - r[d]).abs() < 1e-5);
        }
        assert!((m.lse as f64 - lse).abs() < 1e-5);
        // Online state fed one key at a time agrees too.
        let mut st = OnlineSoftmax::new(dim).unwrap();
        for j in (0..n).rev() {
            let s = scale * q.iter().zip(&k[j]).map(|(a, b)| a * b).sum::<f32>();
            st.push(s, &v[j]).unwrap();
        }
        let p = st.to_partial();
        assert!((p.lse as f64 - lse).abs() < 1e-5);
        // Merging partials into a state.
        let mut st2 = OnlineSoftmax::new(dim).unwrap();
        st2.merge_partial(&c.out, c.lse).unwrap();
        st2.attend(&q, &view, KeySet::Range(0..13), scale).unwrap();
        st2.merge_partial(&b.out, b.lse).unwrap();
        let p2 = st2.to_partial();
        for d in 0..dim {
            assert!((p2.out[d] as f64 - r[d]).abs() < 1e-5);
        }
    }

    #[test]
    fn empty_partials_are_neutral() {
        let e = Partial::empty(3);
        let a = Partial {
            out: vec![1.0, 2.0, 3.0],
            lse: 0.5,
        };
        assert_eq!(merge(&e, &a).unwrap(), a);
        assert_eq!(merge(&a, &e).unwrap(), a);
        assert_eq!(merge(&e, &e).unwrap().lse, f32::NEG_INFINITY);
    }

    #[test]
    fn invalid_inputs_are_errors() {
        let kf = vec![0.0f32; 20];
        assert!(KvView::new(&kf, &kf, 5, 0, 4).is_err());
        assert!(KvView::new(&kf, &kf, 5, 4, 3).is_err());
        assert!(KvView::new(&kf, &kf, 6, 4, 4).is_err());
        assert!(KvView::new(&kf[..19], &kf, 5, 4, 4).is_err());
        let view = KvView::new(&kf, &kf, 5, 4, 4).unwrap();
        let q = [0.0; 4];
        assert!(partial_attention(&q[..3], &view, KeySet::All, 1.0).is_err());
        assert!(partial_attention(&q, &view, KeySet::Range(3..6), 1.0).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let rev = KeySet::Range(3..2);
        assert!(partial_attention(&q, &view, rev, 1.0).is_err());
        assert!(partial_attention(&q, &view, KeySet::Indices(&[5]), 1.0).is_err());
        assert!(merge(&Partial::empty(3), &Partial::empty(4)).is_err());
        assert!(OnlineSoftmax::new(0).is_err());
        let mut st = OnlineSoftmax::new(4).unwrap();
        assert!(st.push(1.0, &[0.0; 3]).is_err());
        assert!(st.finish(&mut [0.0; 5]).is_err());
        let t = Tensor3::zeros(2, 2, 2).unwrap();
        let t2 = Tensor3::zeros(3, 2, 2).unwrap();
        assert!(KvView::from_tensors(&t, &t2, 0).is_err());
        assert!(KvView::from_tensors(&t, &t, 2).is_err());
    }
}
