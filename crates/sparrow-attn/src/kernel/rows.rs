//! What the tile kernel reads: runs of key or value rows in the store's element type, and
//! the [`KvSource`] trait through which any store (the engine's cache, a tiered store, a
//! policy's small side table of landmarks) hands them out.

#[cfg(feature = "fp16")]
use half::f16;
use std::ops::Range;

/// Values per Q8_0 block.
pub const QK8_0: usize = 32;
/// Bytes of one Q8_0 block (f16 scale + 32 quants).
pub const BLOCK_Q8_0_BYTES: usize = 2 + QK8_0;

/// One Q8_0 block, laid out as ggml's `block_q8_0`: value `i` is `qs[i] * d`.
#[cfg(feature = "fp16")]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants.
    pub qs: [i8; QK8_0],
}

#[cfg(feature = "fp16")]
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == BLOCK_Q8_0_BYTES);

#[cfg(feature = "fp16")]
impl BlockQ8_0 {
    /// Quantize 32 values as ggml does (`d = max|x| / 127`, quants rounded to nearest),
    /// except that the quants are computed against the f16-rounded scale that is stored, so
    /// every finite element is within `d / 2` of its value (ggml divides by the f32 scale,
    /// which can add up to 127 · the f16 rounding of `d`).
    pub fn quantize(x: &[f32]) -> BlockQ8_0 {
        assert_eq!(x.len(), QK8_0, "a Q8_0 block holds 32 values");
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let mut d = f16::from_f32(amax / 127.0);
        if d.is_infinite() {
            d = f16::MAX;
        }
        let df = d.to_f32();
        let id = if df != 0.0 { 1.0 / df } else { 0.0 };
        let mut qs = [0i8; QK8_0];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
        BlockQ8_0 { d, qs }
    }

    /// The 32 values (`qs[i] * d` in f32, one rounding).
    pub fn dequantize(&self, dst: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in dst[..QK8_0].iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

/// A run of rows borrowed in the store's element type: `n` rows `kv_dim` values apart (for
/// Q8_0, `kv_dim / 32` blocks apart).
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    /// f32 rows, read in place.
    F32(&'a [f32]),
    /// f16 rows, converted per tile (F16C on x86).
    #[cfg(feature = "fp16")]
    F16(&'a [f16]),
    /// Q8_0 rows, dequantized per tile and kv head.
    #[cfg(feature = "fp16")]
    Q8_0(&'a [BlockQ8_0]),
}

impl<'a> KvRows<'a> {
    /// Values `start..start + len` (for Q8_0 both multiples of 32).
    pub fn slice(&self, start: usize, len: usize) -> KvRows<'a> {
        match *self {
            KvRows::F32(x) => KvRows::F32(&x[start..start + len]),
            #[cfg(feature = "fp16")]
            KvRows::F16(x) => KvRows::F16(&x[start..start + len]),
            #[cfg(feature = "fp16")]
            KvRows::Q8_0(x) => KvRows::Q8_0(&x[start / QK8_0..(start + len) / QK8_0]),
        }
    }

    /// The first `dst.len()` values as f32 (whole rows; for Q8_0, whole 32-value blocks).
    pub fn to_f32(&self, dst: &mut [f32]) {
        match self {
            KvRows::F32(x) => dst.copy_from_slice(&x[..dst.len()]),
            #[cfg(feature = "fp16")]
            KvRows::F16(x) => {
                use half::slice::HalfFloatSliceExt;
                x[..dst.len()].convert_to_f32_slice(dst)
            }
            #[cfg(feature = "fp16")]
            KvRows::Q8_0(x) => {
                for (b, d) in x.iter().zip(dst.chunks_exact_mut(QK8_0)) {
                    b.dequantize(d);
                }
            }
        }
    }
}

/// Rows of keys and values addressed by position, as the tile kernel reads them. A source
/// hands out runs of consecutive rows; a store whose rows are not all in one buffer (paged,
/// tiered) says through [`KvSource::run_len`] how many rows from a position are contiguous,
/// and the kernel cuts its tiles there.
pub trait KvSource: Sync {
    /// Values per row (kv heads × head size).
    fn kv_dim(&self) -> usize;
    /// Keys of positions `start..start + n`.
    fn key_rows(&self, start: usize, n: usize) -> KvRows<'_>;
    /// Values of positions `start..start + n`.
    fn value_rows(&self, start: usize, n: usize) -> KvRows<'_>;
    /// How many of the rows `start..start + max` can be borrowed as one run (≥ 1 when
    /// `max ≥ 1`). Default: all of them.
    fn run_len(&self, _start: usize, max: usize) -> usize {
        max
    }
    /// Where KV head `kv_head`'s values start within a row. Default: heads side by side,
    /// `kv_head × head_dim`.
    fn head_offset(&self, kv_head: usize, head_dim: usize) -> usize {
        kv_head * head_dim
    }

    // One KV head's rows. The kernels read through these, so a source may keep each head's
    // rows apart (a store that arranges a layer's rows by bucket, per head).

    /// How many of KV head `kv_head`'s rows of positions `start..start + max` can be read as
    /// one run (≥ 1 when `max ≥ 1`). Default: [`Self::run_len`].
    fn head_run_len(&self, _kv_head: usize, start: usize, max: usize) -> usize {
        self.run_len(start, max)
    }
    /// KV head `kv_head`'s keys (head size `hd`) of positions `start..start + n`, a run as
    /// [`Self::head_run_len`] gives. Default: that head's part of [`Self::key_rows`].
    fn head_keys(&self, kv_head: usize, hd: usize, start: usize, n: usize) -> HeadRun<'_> {
        HeadRun {
            rows: self.key_rows(start, n),
            stride: self.kv_dim(),
            offset: self.head_offset(kv_head, hd),
        }
    }
    /// KV head `kv_head`'s values of positions `start..start + n` (as [`Self::head_keys`]).
    fn head_values(&self, kv_head: usize, hd: usize, start: usize, n: usize) -> HeadRun<'_> {
        HeadRun {
            rows: self.value_rows(start, n),
            stride: self.kv_dim(),
            offset: self.head_offset(kv_head, hd),
        }
    }

    // Slots: the rows in the order the source keeps them. A source that arranges a head's
    // rows by bin (Saap's buckets) serves a bin's rows as a few runs of slots; by default
    // the slots are the positions.

    /// How many of KV head `kv_head`'s slots `start..start + max` can be read as one run.
    fn slot_run_len(&self, kv_head: usize, start: usize, max: usize) -> usize {
        self.head_run_len(kv_head, start, max)
    }
    /// KV head `kv_head`'s keys in slots `start..start + n`.
    fn slot_keys(&self, kv_head: usize, hd: usize, start: usize, n: usize) -> HeadRun<'_> {
        self.head_keys(kv_head, hd, start, n)
    }
    /// KV head `kv_head`'s values in slots `start..start + n`.
    fn slot_values(&self, kv_head: usize, hd: usize, start: usize, n: usize) -> HeadRun<'_> {
        self.head_values(kv_head, hd, start, n)
    }
    /// The position whose rows KV head `kv_head`'s slot `slot` holds.
    fn slot_position(&self, _kv_head: usize, slot: usize) -> usize {
        slot
    }
    /// Whether the source keeps KV head `kv_head`'s rows by bin, so that [`Self::bin_slots`]
    /// serves every entry of a complete segment (a reader that would otherwise find a
    /// bin's positions itself need not). Default: no.
    fn keeps_bins(&self, _kv_head: usize) -> bool {
        false
    }
    /// Appends to `out`, as runs, the slots of entries `entries` of bin `bin` of KV head
    /// `kv_head` (a bin lists its positions in ascending order) that the source keeps by
    /// bin; returns how many entries, from the first, that is (0 when the source keeps this
    /// head's rows by position; the rest are read by position).
    fn bin_slots(
        &self,
        _kv_head: usize,
        _bin: usize,
        _entries: Range<usize>,
        _out: &mut Vec<Range<usize>>,
    ) -> usize {
        0
    }
}

/// One KV head's part of a run of rows, as the kernels read it: `rows` (in the source's
/// element type), row `t`'s head values `offset..offset + hd` of its `stride` values from
/// `t × stride` (for Q8_0, `stride` and `offset` are values too, multiples of 32).
#[derive(Clone, Copy, Debug)]
pub struct HeadRun<'a> {
    /// The rows.
    pub rows: KvRows<'a>,
    /// Values from one row's start to the next's.
    pub stride: usize,
    /// Where the head's values start in a row.
    pub offset: usize,
}

/// A source read through its slots: its `head_*` reads are the source's `slot_*` reads, so
/// the kernels walk slot ranges as they walk position ranges.
pub struct SlotView<'a, S: KvSource + ?Sized>(pub &'a S);

impl<S: KvSource + ?Sized> KvSource for SlotView<'_, S> {
    fn kv_dim(&self) -> usize {
        self.0.kv_dim()
    }
    fn key_rows(&self, _start: usize, _n: usize) -> KvRows<'_> {
        unreachable!("slots are read a KV head at a time")
    }
    fn value_rows(&self, _start: usize, _n: usize) -> KvRows<'_> {
        unreachable!("slots are read a KV head at a time")
    }
    fn head_run_len(&self, kv_head: usize, start: usize, max: usize) -> usize {
        self.0.slot_run_len(kv_head, start, max)
    }
    fn head_keys(&self, kv_head: usize, hd: usize, start: usize, n: usize) -> HeadRun<'_> {
        self.0.slot_keys(kv_head, hd, start, n)
    }
    fn head_values(&self, kv_head: usize, hd: usize, start: usize, n: usize) -> HeadRun<'_> {
        self.0.slot_values(kv_head, hd, start, n)
    }
}

/// Ask the CPU to start loading one KV head's part (`hd` values from `head_off`) of the `n`
/// rows of `rows`, `kv_dim` values apart: a hint, with no effect on results. A gathered tile
/// reads scattered rows, each a cache miss the hardware prefetcher cannot predict; issuing
/// every load of a tile (keys and values) before converting any lets the misses overlap
/// instead of queueing one behind the other.
#[allow(unused_variables)] // elsewhere than x86-64 it does nothing
pub fn prefetch_head_rows(rows: KvRows<'_>, head_off: usize, kv_dim: usize, hd: usize, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let (base, len, row, off, bytes): (*const u8, usize, usize, usize, usize) = match rows {
            KvRows::F32(x) => (
                x.as_ptr().cast(),
                x.len() * 4,
                kv_dim * 4,
                head_off * 4,
                hd * 4,
            ),
            #[cfg(feature = "fp16")]
            KvRows::F16(x) => (
                x.as_ptr().cast(),
                x.len() * 2,
                kv_dim * 2,
                head_off * 2,
                hd * 2,
            ),
            #[cfg(feature = "fp16")]
            KvRows::Q8_0(x) => {
                let b = BLOCK_Q8_0_BYTES;
                (
                    x.as_ptr().cast(),
                    x.len() * b,
                    kv_dim / QK8_0 * b,
                    head_off / QK8_0 * b,
                    hd / QK8_0 * b,
                )
            }
        };
        for r in 0..n {
            let first = r * row + off;
            let last = (first + bytes).min(len);
            // Every 64-byte line the head's values touch: one probe per line, and the last
            // byte (the span need not start on a line).
            let probes = (first..last)
                .step_by(64)
                .chain((last > first).then(|| last - 1));
            for at in probes {
                // SAFETY: `at < len`, so the pointer is inside the borrowed rows; a prefetch
                // reads nothing into the program and cannot fault.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(at).cast()) };
            }
        }
    }
}

/// Keys (or, with `values`, values) of positions `start..start + dst.len() / kv_dim` of `src`
/// as f32 rows `kv_dim` wide, KV head by KV head (heads `hd` values each), in runs as the
/// source hands them out.
pub fn read_f32<S: KvSource + ?Sized>(
    src: &S,
    values: bool,
    hd: usize,
    start: usize,
    dst: &mut [f32],
) {
    let kv_dim = src.kv_dim().max(1);
    let hd = hd.clamp(1, kv_dim);
    let (heads, n) = (kv_dim / hd, dst.len() / kv_dim);
    let head = |h: usize, at: usize, len: usize| {
        if values {
            src.head_values(h, hd, at, len)
        } else {
            src.head_keys(h, hd, at, len)
        }
    };
    let mut row = vec![0.0f32; hd];
    // Runs of head 0; where every head's rows of the run are one block of whole rows (a
    // store by position), the block is converted at once, else head by head, row by row.
    let mut done = 0;
    while done < n {
        let at = start + done;
        let run = src.head_run_len(0, at, n - done).max(1);
        let first = head(0, at, run);
        let whole = first.stride == kv_dim
            && first.offset == 0
            && (1..heads).all(|h| {
                let r = head(h, at, run);
                src.head_run_len(h, at, run) >= run && r.stride == kv_dim && r.offset == h * hd
            });
        let out = &mut dst[done * kv_dim..(done + run) * kv_dim];
        if whole {
            first.rows.slice(0, run * kv_dim).to_f32(out);
        } else {
            for h in 0..heads {
                for_each_head_run(src, values, h, hd, at, run, |rows, d, len| {
                    for t in 0..len {
                        rows.rows
                            .slice(t * rows.stride + rows.offset, hd)
                            .to_f32(&mut row);
                        out[(d + t) * kv_dim + h * hd..][..hd].copy_from_slice(&row);
                    }
                });
            }
        }
        done += run;
    }
}

/// KV head `kv_head`'s keys (or, with `values`, values) of positions `start..start + n` of
/// `src`, in the runs the source hands them out: `f(run, done, len)` for positions
/// `start + done..start + done + len`.
pub(crate) fn for_each_head_run<S: KvSource + ?Sized>(
    src: &S,
    values: bool,
    kv_head: usize,
    hd: usize,
    start: usize,
    n: usize,
    mut f: impl FnMut(HeadRun<'_>, usize, usize),
) {
    let mut done = 0;
    while done < n {
        let run = src.head_run_len(kv_head, start + done, n - done).max(1);
        let rows = if values {
            src.head_values(kv_head, hd, start + done, run)
        } else {
            src.head_keys(kv_head, hd, start + done, run)
        };
        f(rows, done, run);
        done += run;
    }
}

/// f32 keys and values held in two row-major buffers (`rows × kv_dim` each): a policy's side
/// table (landmarks, centroids, a per-head copy of kept rows) or a test's cache. A row holds
/// KV heads `first_head..` side by side (0 for a table of every head; a table of one head's
/// rows is `kv_dim = head_dim` with `first_head` that head).
#[derive(Clone, Copy, Debug)]
pub struct F32Rows<'a> {
    /// Keys, `rows × kv_dim`.
    pub keys: &'a [f32],
    /// Values, `rows × kv_dim`.
    pub values: &'a [f32],
    /// Values per row.
    pub kv_dim: usize,
    /// The KV head a row's first values belong to.
    pub first_head: usize,
}

impl<'a> F32Rows<'a> {
    /// A table of rows holding every KV head.
    pub fn all_heads(keys: &'a [f32], values: &'a [f32], kv_dim: usize) -> Self {
        F32Rows {
            keys,
            values,
            kv_dim,
            first_head: 0,
        }
    }
}

impl KvSource for F32Rows<'_> {
    fn head_offset(&self, kv_head: usize, head_dim: usize) -> usize {
        (kv_head - self.first_head) * head_dim
    }
    fn kv_dim(&self) -> usize {
        self.kv_dim
    }
    fn key_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        KvRows::F32(&self.keys[start * self.kv_dim..(start + n) * self.kv_dim])
    }
    fn value_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        KvRows::F32(&self.values[start * self.kv_dim..(start + n) * self.kv_dim])
    }
}
