//! KV caches for decoding: [`LayerCache`], one layer's cache, with the aliases [`KvCache`]
//! (f32) and [`KvCacheF16`] (feature `fp16`). The name says what it holds — one layer — and
//! stays clear of the engine's `KvStore` trait, which stores every layer. Keys/values are
//! stored one row of `kv_heads × dim` per slot, the layout the kernel reads ([`KvSource`];
//! f16 rows are converted per tile). Block landmark means are kept up to date by a Welford
//! update on every append (`O(kv_heads × dim)`), so a decode step costs
//! `O(window + log T + T / block_size)` row reads, never `O(T)`.
//!
//! H2O eviction: every tracked decode step adds the attention probability each visited
//! token received (summed over query heads) to that token's score; landmark weight goes
//! to the block and is shared by its tokens. When full, `evict_and_append` removes the
//! lowest-scoring token that is neither a sink nor in the recent window.

use core::ops::Range;

use crate::element::KvElement;
use crate::error::{AttnError, Result};
use crate::kernel::tile::{scores, Tile};
use crate::kernel::{head_rows, AttnShape, F32Rows, KvRows, KvSource, Level, TILE};
use crate::pattern::{SparseConfig, Visible};
use crate::policy::Batch;
use crate::softmax::KvView;
use crate::sparse::SparseAttention;
use crate::tensor::{checked_len, Tensor3};

/// A KV cache for one layer: `capacity` tokens × `kv_heads` × `head_dim`, keys and values
/// stored as `E`, with per-block landmark means (f32) and H2O attention scores. As a
/// [`KvSource`] its positions are logical: position `t` is read from slot `order()[t]`.
#[derive(Clone, Debug)]
pub struct LayerCache<E: KvElement = f32> {
    capacity: usize,
    kv_heads: usize,
    dim: usize,
    block_size: usize,
    len: usize,
    /// `capacity × kv_heads × dim`, one row per storage slot.
    keys: Vec<E>,
    values: Vec<E>,
    /// Block means, `blocks × kv_heads × dim`.
    lm_keys: Vec<f32>,
    lm_values: Vec<f32>,
    lm_count: Vec<u32>,
    lm_downdates: Vec<u32>,
    /// H2O attention mass per *slot*.
    mass: Vec<f32>,
    /// Landmark attention mass per logical block.
    block_mass: Vec<f32>,
    /// Logical position → storage slot. The identity until the first eviction; an
    /// eviction removes one entry and the new token reuses the freed slot.
    order: Vec<usize>,
    /// True while `order[t] == t` for every `t`.
    identity: bool,
    /// Next block whose landmark mean is recomputed exactly after an eviction.
    refresh_next: usize,
    /// Slot freed by the last eviction, taken by the next append.
    free_slot: Option<usize>,
}

/// f32 KV cache.
pub type KvCache = LayerCache<f32>;

/// f16 KV cache (half the bytes; landmark means and arithmetic stay f32).
#[cfg(feature = "fp16")]
pub type KvCacheF16 = LayerCache<half::f16>;

impl<E: KvElement> LayerCache<E> {
    /// An empty cache. `block_size` is the landmark granularity; it should match the
    /// `block_size` of the [`SparseConfig`] used to decode. All four must be positive.
    pub fn new(
        capacity: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    ) -> Result<Self> {
        for (what, x) in [
            ("capacity", capacity),
            ("kv_heads", kv_heads),
            ("head_dim", head_dim),
            ("block_size", block_size),
        ] {
            if x == 0 {
                return Err(AttnError::ZeroDim { what });
            }
        }
        let n = checked_len(capacity, kv_heads, head_dim)?;
        let nblocks = capacity.div_ceil(block_size);
        let nl = nblocks * kv_heads * head_dim; // ≤ n: no overflow
        Ok(Self {
            capacity,
            kv_heads,
            dim: head_dim,
            block_size,
            len: 0,
            keys: vec![E::default(); n],
            values: vec![E::default(); n],
            lm_keys: vec![0.0; nl],
            lm_values: vec![0.0; nl],
            lm_count: vec![0; nblocks],
            lm_downdates: vec![0; nblocks],
            mass: vec![0.0; capacity],
            block_mass: vec![0.0; nblocks],
            order: Vec::new(),
            identity: true,
            refresh_next: 0,
            free_slot: None,
        })
    }

    /// Maximum number of tokens.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }
    /// Values per head.
    pub fn head_dim(&self) -> usize {
        self.dim
    }
    /// Tokens per landmark block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when no token is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// True when `len() == capacity()`.
    pub fn is_full(&self) -> bool {
        self.len >= self.capacity
    }
    /// Bytes held by the key and value storage.
    pub fn storage_bytes(&self) -> usize {
        2 * self.keys.len() * core::mem::size_of::<E>()
    }

    /// Forget every token (keeps the allocation).
    pub fn reset(&mut self) {
        self.len = 0;
        self.lm_keys.fill(0.0);
        self.lm_values.fill(0.0);
        self.lm_count.fill(0);
        self.lm_downdates.fill(0);
        self.mass.fill(0.0);
        self.block_mass.fill(0.0);
        self.order.clear();
        self.identity = true;
        self.refresh_next = 0;
        self.free_slot = None;
    }

    /// Append one token from `(1, kv_heads, head_dim)` tensors.
    pub fn try_append(&mut self, k: &Tensor3, v: &Tensor3) -> Result<()> {
        self.check_tokens(k, v, 1)?;
        self.append_rows(k.data(), v.data())
    }

    /// Append one token given as two slices of `kv_heads * head_dim` values
    /// (head-major within the token, as in a `Tensor3` row).
    pub fn append_rows(&mut self, k: &[f32], v: &[f32]) -> Result<()> {
        for (what, got) in [("key token", k.len()), ("value token", v.len())] {
            if got != self.kv_dim() {
                return Err(AttnError::DataLength {
                    what,
                    expected: self.kv_dim(),
                    got,
                });
            }
        }
        if self.is_full() {
            return Err(AttnError::CacheFull {
                capacity: self.capacity,
                len: self.len,
                adding: 1,
            });
        }
        // Before any eviction the next slot is `len`; afterwards appends only follow an
        // eviction, which hands over the freed slot through `free_slot`.
        let slot = if self.identity {
            self.len
        } else {
            self.free_slot.take().unwrap_or(self.len)
        };
        self.write_slot(slot, k, v);
        self.order.push(slot);
        self.len += 1;
        let t = self.len - 1;
        self.landmark_add(t / self.block_size, slot);
        Ok(())
    }

    fn write_slot(&mut self, slot: usize, k: &[f32], v: &[f32]) {
        let w = self.kv_dim();
        E::store(&mut self.keys[slot * w..(slot + 1) * w], k);
        E::store(&mut self.values[slot * w..(slot + 1) * w], v);
        self.mass[slot] = 0.0;
    }

    /// Append every token of `(n, kv_heads, head_dim)` tensors (a prefill). All or
    /// nothing: on error the cache is unchanged.
    pub fn append_all(&mut self, k: &Tensor3, v: &Tensor3) -> Result<()> {
        self.check_tokens(k, v, k.seq())?;
        if self.len + k.seq() > self.capacity {
            return Err(AttnError::CacheFull {
                capacity: self.capacity,
                len: self.len,
                adding: k.seq(),
            });
        }
        for t in 0..k.seq() {
            self.append_rows(k.token(t)?, v.token(t)?)?;
        }
        Ok(())
    }

    fn check_tokens(&self, k: &Tensor3, v: &Tensor3, seq: usize) -> Result<()> {
        for t in [k, v] {
            if t.seq() != seq {
                return Err(AttnError::ShapeMismatch {
                    what: "seq",
                    expected: seq,
                    got: t.seq(),
                });
            }
            if t.heads() != self.kv_heads {
                return Err(AttnError::ShapeMismatch {
                    what: "kv heads",
                    expected: self.kv_heads,
                    got: t.heads(),
                });
            }
            if t.dim() != self.dim {
                return Err(AttnError::ShapeMismatch {
                    what: "head dim",
                    expected: self.dim,
                    got: t.dim(),
                });
            }
        }
        Ok(())
    }

    /// `mean(b) = keep * mean(b) + w * row(slot)` for keys and values of every head.
    fn landmark_axpy(&mut self, b: usize, keep: f32, w: f32, slot: usize) {
        let n = self.kv_dim();
        let mut row = vec![0.0f32; n];
        for (lm, src) in [
            (&mut self.lm_keys, &self.keys),
            (&mut self.lm_values, &self.values),
        ] {
            E::rows(&src[slot * n..(slot + 1) * n]).to_f32(&mut row);
            for (m, x) in lm[b * n..(b + 1) * n].iter_mut().zip(&row) {
                *m = keep * *m + w * x;
            }
        }
    }

    /// Welford: add the token in `slot` to the mean of block `b`.
    fn landmark_add(&mut self, b: usize, slot: usize) {
        self.lm_count[b] += 1;
        let c = self.lm_count[b] as f32;
        self.landmark_axpy(b, 1.0 - 1.0 / c, 1.0 / c, slot);
    }

    /// Inverse Welford: remove the token in `slot` from the mean of block `b`.
    fn landmark_remove(&mut self, b: usize, slot: usize) {
        let c = self.lm_count[b];
        self.lm_count[b] = c - 1;
        self.lm_downdates[b] += 1;
        if c == 1 {
            return self.landmark_clear(b);
        }
        let c = c as f32;
        self.landmark_axpy(b, c / (c - 1.0), -1.0 / (c - 1.0), slot);
    }

    fn landmark_clear(&mut self, b: usize) {
        let n = self.kv_dim();
        self.lm_keys[b * n..(b + 1) * n].fill(0.0);
        self.lm_values[b * n..(b + 1) * n].fill(0.0);
    }

    /// Recompute the mean of block `b` exactly from its stored rows.
    fn landmark_refresh(&mut self, b: usize) {
        let bs = self.block_size;
        let tokens = b * bs..((b + 1) * bs).min(self.len);
        self.lm_count[b] = tokens.len() as u32;
        self.lm_downdates[b] = 0;
        self.landmark_clear(b);
        let w = 1.0 / tokens.len().max(1) as f32;
        for t in tokens {
            self.landmark_axpy(b, 1.0, w, self.order[t]);
        }
    }

    /// Keys and values of head `head`, for [`partial_attention`](crate::partial_attention)
    /// over any key subset. Row `r` is storage slot `r`; logical position `t` is row
    /// `order()[t]` (the same number until the first eviction).
    pub fn view(&self, head: usize) -> Result<KvView<'_, E>> {
        let o = self.check_head(head)? * self.dim;
        KvView::new(
            &self.keys[o..],
            &self.values[o..],
            self.len,
            self.dim,
            self.kv_dim(),
        )
    }

    /// Landmark means (row `b` = mean key/value of block `b`) of head `head`, over the
    /// blocks that hold at least one token.
    pub fn landmark_view(&self, head: usize) -> Result<KvView<'_, f32>> {
        let o = self.check_head(head)? * self.dim;
        KvView::new(
            &self.lm_keys[o..],
            &self.lm_values[o..],
            self.len.div_ceil(self.block_size),
            self.dim,
            self.kv_dim(),
        )
    }

    fn check_head(&self, head: usize) -> Result<usize> {
        if head >= self.kv_heads {
            return Err(AttnError::IndexOutOfRange {
                what: "kv head",
                index: head,
                len: self.kv_heads,
            });
        }
        Ok(head)
    }

    /// The landmark means of every head as the kernel reads them (row `b` = block `b`).
    fn landmarks(&self) -> F32Rows<'_> {
        F32Rows::all_heads(&self.lm_keys, &self.lm_values, self.kv_dim())
    }

    /// Elements of the rows of logical positions `start..start + n` (one run of slots).
    fn slots(&self, start: usize, n: usize) -> Range<usize> {
        let w = self.kv_dim();
        let s = self.order[start];
        s * w..(s + n) * w
    }

    /// Storage slot of every logical position (`order()[t]` is where token `t` lives).
    /// The identity until the first eviction. Rows of [`view`](Self::view) are slots.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// H2O score of every stored token: attention probability received so far (summed
    /// over tracked decode steps and query heads), landmark weight shared within blocks.
    pub fn h2o_scores(&self) -> Vec<f32> {
        (0..self.len).map(|t| self.h2o_score(t)).collect()
    }

    /// H2O score of logical position `t`.
    #[inline]
    fn h2o_score(&self, t: usize) -> f32 {
        let b = t / self.block_size;
        self.mass[self.order[t]] + self.block_mass[b] / self.lm_count[b].max(1) as f32
    }

    /// Which token [`evict_and_append`](Self::evict_and_append) would evict now under the
    /// protection of `config` (`config.sinks` first tokens and the `config.window` most
    /// recent): the lowest H2O score, ties to the oldest. If every non-sink token is in the
    /// window, the deterministic fallback is the oldest non-sink token. `None` when the
    /// cache is empty or holds only sinks.
    pub fn eviction_victim(&self, config: &SparseConfig) -> Option<usize> {
        let start = config.sinks.min(self.len);
        if start >= self.len {
            return None;
        }
        let end = self.len.saturating_sub(config.window).max(start);
        if end == start {
            return Some(start);
        }
        let mut best = start;
        let mut best_s = self.h2o_score(start);
        for t in start + 1..end {
            let s = self.h2o_score(t);
            if s < best_s {
                best = t;
                best_s = s;
            }
        }
        Some(best)
    }

    /// Append one token; if the cache is full, first evict the token chosen by
    /// [`eviction_victim`](Self::eviction_victim). Returns the evicted position (later
    /// tokens shift down by one) or `None` when there was room. The cache stays at
    /// capacity. Cost: one `memmove` of the tokens after the victim plus `O(T / block)`
    /// landmark updates (no rebuild).
    pub fn evict_and_append(
        &mut self,
        k: &Tensor3,
        v: &Tensor3,
        config: &SparseConfig,
    ) -> Result<Option<usize>> {
        config.validate()?;
        self.check_tokens(k, v, 1)?;
        if !self.is_full() {
            self.append_rows(k.data(), v.data())?;
            return Ok(None);
        }
        let victim = self
            .eviction_victim(config)
            .ok_or(AttnError::NothingToEvict)?;
        self.remove(victim);
        self.append_rows(k.data(), v.data())?;
        Ok(Some(victim))
    }

    /// Remove logical position `t`: later tokens move down one logical position (only the
    /// order index moves; their rows stay in place) and the landmark means of the blocks
    /// whose membership changes are fixed up (each loses its first token to the block
    /// before and gains the first token of the block after). One block per call is
    /// recomputed exactly, in rotation, so rounding cannot drift.
    fn remove(&mut self, t: usize) {
        let bs = self.block_size;
        let last = (self.len - 1) / bs;
        let bt = t / bs;
        for b in bt..=last {
            let out_tok = if b == bt { t } else { b * bs };
            self.landmark_remove(b, self.order[out_tok]);
            let in_tok = (b + 1) * bs;
            if in_tok < self.len {
                self.landmark_add(b, self.order[in_tok]);
            }
        }
        let slot = self.order.remove(t);
        self.identity = false;
        self.free_slot = Some(slot);
        self.len -= 1;
        let nb = self.len.div_ceil(bs).max(1);
        let b = self.refresh_next % nb;
        self.refresh_next = b + 1;
        if self.lm_downdates[b] > 0 {
            self.landmark_refresh(b);
        }
    }
}

impl SparseAttention {
    /// Attention of one new token against the cache. The caller appends the token's
    /// key/value first; the query sits at position `len - 1`. `q` is `(1, q_heads, dim)`
    /// with `q_heads` a multiple of the cache's `kv_heads`. Same result as the last row of
    /// [`forward_gqa`](Self::forward_gqa) over the cached sequence.
    pub fn decode_step<E: KvElement>(&self, q: &Tensor3, cache: &LayerCache<E>) -> Result<Tensor3> {
        self.check_decode(q, cache, 1)?;
        let mut out = Tensor3::zeros(1, q.heads(), q.dim())?;
        self.decode(q.data(), cache, out.data_mut());
        Ok(out)
    }

    /// [`decode_step`](Self::decode_step) that also adds the attention each visited token
    /// received to the cache's H2O scores (used by `evict_and_append`).
    pub fn decode_step_tracked<E: KvElement>(
        &self,
        q: &Tensor3,
        cache: &mut LayerCache<E>,
    ) -> Result<Tensor3> {
        self.check_decode(q, cache, 1)?;
        let mut out = Tensor3::zeros(1, q.heads(), q.dim())?;
        let (seen, lse) = self.decode(q.data(), cache, out.data_mut());
        cache.track(q.data(), &seen, &lse);
        Ok(out)
    }

    /// Several new tokens (e.g. speculative drafts): for each row `t`, append
    /// `new_k`/`new_v` row `t` and decode `q` row `t` (tracked). Shapes and capacity are
    /// checked up front, so on error the cache is unchanged. Returns `(m, q_heads, dim)`.
    pub fn decode_batch<E: KvElement>(
        &self,
        q: &Tensor3,
        new_k: &Tensor3,
        new_v: &Tensor3,
        cache: &mut LayerCache<E>,
    ) -> Result<Tensor3> {
        let m = q.seq();
        cache.check_tokens(new_k, new_v, m)?;
        if cache.len + m > cache.capacity {
            return Err(AttnError::CacheFull {
                capacity: cache.capacity,
                len: cache.len,
                adding: m,
            });
        }
        self.check_shape_decode(q, cache)?;
        let mut out = Tensor3::zeros(m, q.heads(), q.dim())?;
        let w = q.heads() * q.dim();
        for (t, (qt, ot)) in q
            .data()
            .chunks_exact(w)
            .zip(out.data_mut().chunks_exact_mut(w))
            .enumerate()
        {
            cache.append_rows(new_k.token(t)?, new_v.token(t)?)?;
            let (seen, lse) = self.decode(qt, cache, ot);
            cache.track(qt, &seen, &lse);
        }
        Ok(out)
    }

    /// Decode the query row `q` of the token at position `len - 1` against the cache into
    /// `out`; returns what it read and each query head's log-sum-exp.
    fn decode<E: KvElement>(
        &self,
        q: &[f32],
        cache: &LayerCache<E>,
        out: &mut [f32],
    ) -> (Visible, Vec<f32>) {
        let seen = Visible::of(self.config(), cache.len, cache.len - 1);
        let mut lse = vec![0.0f32; q.len() / cache.dim];
        let visible = vec![seen.clone()];
        let (shape, lm) = (cache.shape(q), cache.landmarks());
        let batch = Batch {
            q,
            out,
            lse: Some(&mut lse[..]),
        };
        self.attend(shape, cache, lm, visible, batch);
        (seen, lse)
    }

    fn check_shape_decode<E: KvElement>(&self, q: &Tensor3, cache: &LayerCache<E>) -> Result<()> {
        if q.dim() != cache.dim {
            return Err(AttnError::ShapeMismatch {
                what: "head dim",
                expected: cache.dim,
                got: q.dim(),
            });
        }
        if q.heads().checked_rem(cache.kv_heads) != Some(0) {
            return Err(AttnError::HeadsNotDivisible {
                q_heads: q.heads(),
                kv_heads: cache.kv_heads,
            });
        }
        if cache.block_size != self.config().block_size {
            return Err(AttnError::InvalidConfig {
                field: "block_size",
                reason: "cache block_size differs from the attention config",
            });
        }
        Ok(())
    }

    fn check_decode<E: KvElement>(
        &self,
        q: &Tensor3,
        cache: &LayerCache<E>,
        seq: usize,
    ) -> Result<()> {
        if q.seq() != seq {
            return Err(AttnError::ShapeMismatch {
                what: "query seq",
                expected: seq,
                got: q.seq(),
            });
        }
        self.check_shape_decode(q, cache)?;
        if cache.is_empty() {
            return Err(AttnError::EmptyCache);
        }
        Ok(())
    }
}

impl<E: KvElement> LayerCache<E> {
    /// Head counts of a decode of the query row `q`.
    fn shape(&self, q: &[f32]) -> AttnShape {
        AttnShape {
            n_head: q.len() / self.dim,
            n_head_kv: self.kv_heads,
            head_dim: self.dim,
        }
    }

    /// H2O: add to each token and landmark block the query row `q` read (`seen`) the
    /// attention probability it received, summed over query heads (`lse` per head).
    fn track(&mut self, q: &[f32], seen: &Visible, lse: &[f32]) {
        let (level, shape) = (Level::active(), self.shape(q));
        let tokens = probabilities(level, shape, &*self, q, lse, &seen.tokens);
        let blocks = probabilities(level, shape, &self.landmarks(), q, lse, &seen.blocks);
        for (t, p) in seen.tokens.iter().cloned().flatten().zip(tokens) {
            self.mass[self.order[t]] += p;
        }
        for (b, p) in seen.blocks.iter().cloned().flatten().zip(blocks) {
            self.block_mass[b] += p;
        }
    }
}

impl<E: KvElement> KvSource for LayerCache<E> {
    fn kv_dim(&self) -> usize {
        self.kv_heads * self.dim
    }
    fn key_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        E::rows(&self.keys[self.slots(start, n)])
    }
    fn value_rows(&self, start: usize, n: usize) -> KvRows<'_> {
        E::rows(&self.values[self.slots(start, n)])
    }
    /// Consecutive positions whose slots are consecutive too (all of them until the first
    /// eviction).
    fn run_len(&self, start: usize, max: usize) -> usize {
        if self.identity || max <= 1 {
            return max;
        }
        let s0 = self.order[start];
        let same = self.order[start + 1..start + max]
            .iter()
            .zip(s0 + 1..)
            .take_while(|(a, b)| **a == *b)
            .count();
        1 + same
    }
}

/// The attention probability each key of `keys` (ascending ranges of `src`) received from
/// the query row `q` (`n_head × head_dim`), summed over query heads: `exp(s − lse)` with the
/// score `s` recomputed by the kernel's score tile and each head's log-sum-exp `lse`.
fn probabilities<S: KvSource + ?Sized>(
    level: Level,
    shape: AttnShape,
    src: &S,
    q: &[f32],
    lse: &[f32],
    keys: &[Range<usize>],
) -> Vec<f32> {
    let (hd, group) = (shape.head_dim, shape.group());
    let rw = group.div_ceil(8) * 8;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut p = vec![0.0f32; keys.iter().map(|r| r.len()).sum()];
    let (mut qt, mut s, mut buf) = (vec![0.0f32; hd * rw], vec![0.0f32; TILE * rw], Vec::new());
    for g in 0..shape.n_head_kv {
        let heads = g * group..(g + 1) * group;
        for (r, qh) in q[heads.start * hd..heads.end * hd]
            .chunks_exact(hd)
            .enumerate()
        {
            for (d, &x) in qh.iter().enumerate() {
                qt[d * rw + r] = x;
            }
        }
        let lse = &lse[heads];
        let mut at = 0;
        for range in keys {
            let mut start = range.start;
            while start < range.end {
                let n = src
                    .head_run_len(g, start, TILE.min(range.end - start))
                    .max(1);
                let run = src.head_keys(g, hd, start, n);
                let (k, stride) =
                    head_rows(level, run.rows, run.offset, run.stride, hd, n, &mut buf);
                scores(level, Tile::new(k, stride, n, hd), &qt, rw, scale, &mut s);
                for (t, pt) in p[at..at + n].iter_mut().enumerate() {
                    *pt += lse
                        .iter()
                        .enumerate()
                        .filter(|(_, l)| l.is_finite())
                        .map(|(r, l)| (s[t * rw + r] - l).exp())
                        .sum::<f32>();
                }
                at += n;
                start += n;
            }
        }
    }
    p
}
