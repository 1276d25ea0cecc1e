//! The forward pass, read top to bottom like the model's equations: embed, then per layer
//! `x += attention(norm(x))` and `x += ffn(norm(x))`, then the final norm and the output
//! projection.
//!
//! One pass may carry several sequences ([`Model::forward_many`]): their token rows are
//! stacked, so every weight matrix is read once for all of them (decode is bound by reading
//! the weights), while attention runs per sequence over its own cache and policy. A
//! single-sequence [`Model::forward`] is the same code with one sequence.

use super::weights::{self, Linear};
use super::{LayerAttention, LayerSpec, Logits, Model, State, LEAN_BATCH};
use crate::attention::{attend, attend_sliding, AttnShape};
use crate::error::{Error, Result};
use crate::kv::KvStore;
use sparrow_quant::{matmul, matmul_multi, matmul_rowwise, matvec, matvec_multi, QMatrix};
use std::ops::Range;

/// Activations of one forward pass, reused between passes. Each [`State`] has its own; a
/// server batching several sequences keeps one more for the stacked pass.
#[derive(Default)]
pub struct Workspace {
    /// The residual stream of every row of the pass (after the pass: the last layer's).
    pub(super) x: Vec<f32>,
    pub(super) xb: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    pub(super) logits: Vec<f32>,
    /// This pass's batched products keep one-token bits (no panel kernels): set for
    /// [`Model::forward_steps`].
    rowwise: bool,
}

/// One sequence's share of a batched pass: its state, the tokens to run at its next
/// positions, and the logits it wants (left in its state: [`State::logits`]).
pub struct SeqStep<'a> {
    pub state: &'a mut State,
    pub tokens: &'a [u32],
    pub want: Logits,
    /// Run the tokens as consecutive decode steps ([`Model::forward_steps`]): a
    /// speculative check of drafts.
    pub as_steps: bool,
    /// The rows the last `siblings.len()` tokens stand in for (decode steps only:
    /// [`Model::forward_steps_with_siblings`]); empty for none.
    pub siblings: &'a [usize],
}

/// The span of token rows `rows` in a buffer holding `width` floats per row.
fn span(rows: &Range<usize>, width: usize) -> Range<usize> {
    rows.start * width..rows.end * width
}

impl Model {
    /// Run `tokens` through the model at the state's next positions, append their keys and
    /// values to the cache, and return the logits asked for (`vocab` floats per row).
    pub fn forward<'s>(
        &self,
        state: &'s mut State,
        tokens: &[u32],
        want: Logits,
    ) -> Result<&'s [f32]> {
        if tokens.is_empty() {
            return Ok(&[]);
        }
        self.check_step(state, tokens)?;
        if let Some(split) = self.lean_split(tokens.len(), want) {
            for chunk in tokens[..split].chunks(LEAN_BATCH) {
                self.forward_one(state, chunk, Logits::None, false, &[])?;
            }
            return self.forward_one(state, &tokens[split..], want, false, &[]);
        }
        self.forward_one(state, tokens, want, false, &[])
    }

    /// Run `tokens` as consecutive decode steps in one pass: every weight matrix is read
    /// once for all of them (as [`Model::forward`] does), but each token's keys are
    /// appended, its blocks sealed and its attention planned and computed on its own, in
    /// order, exactly as a pass of that token alone would — so a decode policy (Quest,
    /// Saap, H2O…) plans each as it plans a generated token, and each row of logits has
    /// the bits a one-token pass gives. What speculative decoding checks drafts with.
    pub fn forward_steps<'s>(
        &self,
        state: &'s mut State,
        tokens: &[u32],
        want: Logits,
    ) -> Result<&'s [f32]> {
        self.forward_steps_with_siblings(state, tokens, &[], want)
    }

    /// [`Model::forward_steps`] where the last `siblings.len()` tokens are *siblings*: the
    /// sibling `tokens[m + i]` (`m` = the tokens before them) stands at the position of row
    /// `siblings[i]` in place of that row's token, after the rows before it — the pass
    /// after which a decode step on the sibling would come if the rows before it were kept.
    /// Its logits row has that step's bits: in each layer it is written and attended after
    /// the other rows, at its position, as a one-token pass there would (the layer's rows
    /// from there on are written again afterwards). So a check of drafts can also check
    /// the draft's second choice at a position, and when the model's token there is that
    /// one, its next token is known without another pass. Only `m` positions are taken;
    /// `siblings` must be increasing, each in `1..m`, and the state must take siblings
    /// ([`State::takes_siblings`]).
    pub fn forward_steps_with_siblings<'s>(
        &self,
        state: &'s mut State,
        tokens: &[u32],
        siblings: &[usize],
        want: Logits,
    ) -> Result<&'s [f32]> {
        if tokens.is_empty() {
            return Ok(&[]);
        }
        self.check_steps(state, tokens, siblings)?;
        if !siblings.is_empty() {
            return self.forward_one(state, tokens, want, true, siblings);
        }
        if self.lean && tokens.len() > LEAN_BATCH {
            // A lean model keeps its workspace small: the steps run LEAN_BATCH at a time
            // (each token attends alone either way), their rows gathered.
            let vocab = self.config.vocab_size;
            let mut rows = Vec::new();
            for chunk in tokens.chunks(LEAN_BATCH) {
                rows.extend_from_slice(self.forward_one(state, chunk, Logits::All, true, &[])?);
            }
            let keep = logit_rows(tokens.len(), want);
            state.scratch.logits = rows[keep.start * vocab..keep.end * vocab].to_vec();
            return Ok(&state.scratch.logits);
        }
        self.forward_one(state, tokens, want, true, &[])
    }

    /// One forward pass over several sequences at once: each `SeqStep`'s tokens run at its
    /// state's next positions and its logits are left in its state ([`State::logits`]).
    /// The matrices multiply all rows together (read once for every sequence); attention
    /// runs per sequence with its own cache and policy. `ws` holds the stacked activations.
    ///
    /// Every step is checked before anything runs; an error leaves every state's position
    /// where it was. A lean model runs the sequences one by one (its point is a small
    /// workspace).
    pub fn forward_many(&self, ws: &mut Workspace, steps: &mut [SeqStep<'_>]) -> Result<()> {
        for s in steps.iter() {
            if !s.as_steps && !s.siblings.is_empty() {
                return Err(Error::Other(
                    "sibling drafts are decode steps: a pass with siblings runs as steps".into(),
                ));
            }
            self.check_steps(s.state, s.tokens, s.siblings)?;
        }
        let total: usize = steps.iter().map(|s| s.tokens.len()).sum();
        if self.lean && total > LEAN_BATCH {
            for s in steps.iter_mut() {
                if s.as_steps {
                    self.forward_steps_with_siblings(s.state, s.tokens, s.siblings, s.want)?;
                } else {
                    self.forward(s.state, s.tokens, s.want)?;
                }
            }
            return Ok(());
        }
        let steps: Vec<&mut SeqStep<'_>> =
            steps.iter_mut().filter(|s| !s.tokens.is_empty()).collect();
        match steps.len() {
            0 => Ok(()),
            1 => {
                let s = steps.into_iter().next().expect("one step");
                self.forward_one(s.state, s.tokens, s.want, s.as_steps, s.siblings)
                    .map(|_| ())
            }
            _ => {
                let mut seqs: Vec<Seq<'_>> = steps
                    .into_iter()
                    .map(|s| Seq {
                        state: &mut *s.state,
                        tokens: s.tokens,
                        want: s.want,
                        as_steps: s.as_steps,
                        siblings: s.siblings,
                    })
                    .collect();
                self.run(ws, &mut seqs)?;
                // Hand each sequence its rows of the stacked logits.
                let vocab = self.config.vocab_size;
                let mut at = 0;
                for s in &mut seqs {
                    let n = logit_rows(s.tokens.len(), s.want).len() * vocab;
                    let mine = &mut s.state.scratch.logits;
                    mine.clear();
                    mine.extend_from_slice(&ws.logits[at..at + n]);
                    at += n;
                }
                Ok(())
            }
        }
    }

    /// [`Model::check_step`] for a pass whose last `siblings.len()` tokens are siblings
    /// ([`Model::forward_steps_with_siblings`]): the state must take them, their rows be
    /// increasing and within the other tokens' (not the first), and only the others need
    /// room.
    fn check_steps(&self, state: &State, tokens: &[u32], siblings: &[usize]) -> Result<()> {
        if siblings.is_empty() {
            return self.check_step(state, tokens);
        }
        if !state.takes_siblings() {
            return Err(Error::Other(
                "sibling drafts need global attention layers and a decode policy that reads every key (--attn full)".into(),
            ));
        }
        let steps = tokens.len().saturating_sub(siblings.len());
        let increasing = siblings.windows(2).all(|w| w[0] < w[1]);
        if !increasing || siblings[0] == 0 || siblings[siblings.len() - 1] >= steps {
            return Err(Error::Other(format!(
                "sibling rows {siblings:?} must be increasing and within 1..{steps}"
            )));
        }
        self.check_step(state, &tokens[..steps])?;
        match tokens[steps..]
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            Some(&id) => Err(Error::BadToken {
                id,
                vocab: self.config.vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// The checks a step must pass before it runs: room in the context, known token ids.
    fn check_step(&self, state: &State, tokens: &[u32]) -> Result<()> {
        let vocab = self.config.vocab_size;
        if state.n_past + tokens.len() > state.n_ctx() {
            return Err(Error::ContextFull {
                n_ctx: state.n_ctx(),
            });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::BadToken { id, vocab });
        }
        Ok(())
    }

    /// Where a lean model splits a batch of `n` tokens: the earlier tokens run
    /// [`LEAN_BATCH`] at a time without logits, the last (at most [`LEAN_BATCH`]) give the
    /// logits asked for. `None` when the batch runs whole: not lean, short enough, or
    /// logits asked for more tokens than the last piece holds.
    fn lean_split(&self, n: usize, want: Logits) -> Option<usize> {
        if !self.lean || n <= LEAN_BATCH {
            return None;
        }
        let split = (n - 1) / LEAN_BATCH * LEAN_BATCH;
        match want {
            Logits::None | Logits::Last => Some(split),
            Logits::Tail(k) if k <= n - split => Some(split),
            _ => None,
        }
    }

    /// One sequence's pass, whole (its checks already made), in the state's own workspace;
    /// `as_steps` attends token by token ([`Model::forward_steps`]), the last
    /// `siblings.len()` tokens as siblings ([`Model::forward_steps_with_siblings`]).
    fn forward_one<'s>(
        &self,
        state: &'s mut State,
        tokens: &[u32],
        want: Logits,
        as_steps: bool,
        siblings: &[usize],
    ) -> Result<&'s [f32]> {
        let mut ws = std::mem::take(&mut state.scratch);
        let done = self.run(
            &mut ws,
            &mut [Seq {
                state: &mut *state,
                tokens,
                want,
                as_steps,
                siblings,
            }],
        );
        state.scratch = ws;
        done?;
        Ok(&state.scratch.logits)
    }

    /// The pass itself over the stacked rows of `seqs`, in `ws`; the logits asked for land
    /// in `ws.logits`, sequence after sequence.
    fn run(&self, ws: &mut Workspace, seqs: &mut [Seq<'_>]) -> Result<()> {
        let c = &self.config;
        let d = c.n_embd;
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        resize(&mut ws.x, n * d);
        resize(&mut ws.xb, n * d);
        resize(&mut ws.q, n * c.q_dim());
        resize(&mut ws.k, n * c.kv_dim());
        resize(&mut ws.v, n * c.kv_dim());
        resize(&mut ws.att, n * c.q_dim());
        resize(&mut ws.proj, n * d);
        resize(&mut ws.gate, n * c.n_ff);
        resize(&mut ws.up, n * c.n_ff);
        ws.rowwise = seqs.iter().any(|s| s.as_steps);

        let embd = self.weights.token_embd.matrix(self.file.bytes());
        let tokens = seqs.iter().flat_map(|s| s.tokens);
        for (row, &t) in ws.x.chunks_exact_mut(d).zip(tokens) {
            embd.dequantize_row(t as usize, row)?;
            if let Some(scale) = c.embedding_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        for (l, (w, spec)) in self.weights.layers.iter().zip(&c.layers).enumerate() {
            self.attention_block(ws, seqs, l, spec, w, n)?;
            self.ffn_block(ws, w, n)?;
        }
        for s in seqs.iter_mut() {
            s.state.n_past += s.steps();
        }
        self.logits(ws, seqs)
    }

    /// `x += post_norm(wo · attention(rope(norm(q)), rope(norm(k)), v))` for layer `l`:
    /// projections over all rows, then each sequence's keys and values appended to its
    /// cache and its queries attended by its policy (global layers) or window (sliding).
    fn attention_block(
        &self,
        ws: &mut Workspace,
        seqs: &mut [Seq<'_>],
        l: usize,
        spec: &LayerSpec,
        w: &weights::LayerWeights,
        n: usize,
    ) -> Result<()> {
        let c = &self.config;
        let (d, qd, kvd, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.head_dim);
        let shape = AttnShape {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: hd,
        };
        for (x, xb) in ws.x.chunks_exact(d).zip(ws.xb.chunks_exact_mut(d)) {
            rms_norm(x, &w.attn_norm, c.rms_eps, xb);
        }
        self.linears(
            [&w.wq, &w.wk, &w.wv],
            &ws.xb,
            n,
            ws.rowwise,
            [&mut ws.q, &mut ws.k, &mut ws.v],
        )?;
        if let Some(norm) = &w.qk_norm {
            ws.q.chunks_exact_mut(hd)
                .for_each(|h| rms_norm_in_place(h, &norm.q, c.rms_eps));
            ws.k.chunks_exact_mut(hd)
                .for_each(|h| rms_norm_in_place(h, &norm.k, c.rms_eps));
        }
        // The kernels scale scores by 1/√head_dim; a layer that wants another scale has its
        // queries multiplied by the ratio.
        let q_scale = spec.attn_scale * (hd as f32).sqrt();
        let mut first = 0;
        for seq in seqs.iter_mut() {
            let rows = first..first + seq.tokens.len();
            first = rows.end;
            let pos0 = seq.state.n_past;
            let as_steps = seq.as_steps;
            let (steps, siblings) = (seq.steps(), seq.siblings);
            // Row `i`'s position from `pos0` (a sibling's is the row it stands in for).
            let offset = |i: usize| i.checked_sub(steps).map_or(i, |s| siblings[s]);
            let State {
                kv,
                attention,
                blocks,
                ropes,
                ..
            } = &mut *seq.state;
            let (q, k, v) = (
                &mut ws.q[span(&rows, qd)],
                &mut ws.k[span(&rows, kvd)],
                &ws.v[span(&rows, kvd)],
            );
            let att = &mut ws.att[span(&rows, qd)];
            let m = rows.len();
            for i in 0..m {
                ropes[l].apply(&mut q[i * qd..(i + 1) * qd], hd, pos0 + offset(i));
                ropes[l].apply(&mut k[i * kvd..(i + 1) * kvd], hd, pos0 + offset(i));
            }
            if (q_scale - 1.0).abs() > 1e-6 {
                q.iter_mut().for_each(|v| *v *= q_scale);
            }
            // Row `i`'s key and value at its position.
            let append = |kv: &mut Box<dyn KvStore>, rows: Range<usize>| {
                for i in rows {
                    let r = i * kvd..(i + 1) * kvd;
                    kv.append(l, pos0 + offset(i), &k[r.clone()], &v[r])
                        .map_err(Error::KvTier)?;
                }
                Ok::<(), Error>(())
            };
            match spec.attention {
                LayerAttention::Global if as_steps => {
                    // The steps in order, then the siblings from the last back (each finds
                    // the rows before its position as the steps left them), then the steps
                    // the siblings displaced written again.
                    let order = (0..steps).chain((steps..m).rev());
                    for i in order {
                        let pos = pos0 + offset(i);
                        append(kv, i..i + 1)?;
                        blocks.forget_layer_from(l, pos);
                        blocks
                            .seal(shape, kv.as_mut(), l, pos + 1, attention.as_mut())
                            .map_err(Error::KvTier)?;
                        let rows = i..i + 1;
                        attend(
                            attention.as_mut(),
                            shape,
                            kv.as_ref(),
                            l,
                            &q[span(&rows, qd)],
                            pos,
                            &mut att[span(&rows, qd)],
                        );
                    }
                    if let Some(&first) = siblings.first() {
                        append(kv, first..steps)?;
                        blocks.forget_layer_from(l, pos0 + first);
                        blocks
                            .seal(shape, kv.as_mut(), l, pos0 + steps, attention.as_mut())
                            .map_err(Error::KvTier)?;
                    }
                }
                LayerAttention::Global => {
                    append(kv, 0..m)?;
                    // Positions below `pos0` may have been rewritten since their block was
                    // sealed (a forward pass that failed midway): reseal from there.
                    blocks.forget_layer_from(l, pos0);
                    blocks
                        .seal(shape, kv.as_mut(), l, pos0 + m, attention.as_mut())
                        .map_err(Error::KvTier)?;
                    attend(attention.as_mut(), shape, kv.as_ref(), l, q, pos0, att);
                }
                LayerAttention::Sliding { window } => {
                    // The layer's ring holds `window - 1` earlier positions plus a chunk of
                    // this batch: append and attend chunk by chunk so no query's window is
                    // overwritten (token by token for decode steps).
                    let chunk = if as_steps {
                        1
                    } else {
                        sliding_chunk(kv.layer_rows(l), window)
                    };
                    let mut i = 0;
                    while i < m {
                        let j = (i + chunk).min(m);
                        append(kv, i..j)?;
                        attend_sliding(
                            shape,
                            kv.as_ref(),
                            l,
                            &q[i * qd..j * qd],
                            pos0 + i,
                            window,
                            &mut att[i * qd..j * qd],
                        );
                        i = j;
                    }
                }
            }
        }
        self.linear(&w.wo, &ws.att, n, ws.rowwise, &mut ws.proj)?;
        add_residual(
            &mut ws.x,
            &mut ws.proj,
            w.post_norms.as_ref().map(|p| &p.attn[..]),
            c.rms_eps,
            d,
        );
        Ok(())
    }

    /// `x += post_norm(down(act(gate(norm(x))) · up(norm(x))))`.
    fn ffn_block(&self, ws: &mut Workspace, w: &weights::LayerWeights, n: usize) -> Result<()> {
        let c = &self.config;
        let d = c.n_embd;
        for (x, xb) in ws.x.chunks_exact(d).zip(ws.xb.chunks_exact_mut(d)) {
            rms_norm(x, &w.ffn_norm, c.rms_eps, xb);
        }
        self.linears(
            [&w.w_gate, &w.w_up],
            &ws.xb,
            n,
            ws.rowwise,
            [&mut ws.gate, &mut ws.up],
        )?;
        c.activation.gate(&mut ws.gate, &ws.up);
        self.linear(&w.w_down, &ws.gate, n, ws.rowwise, &mut ws.proj)?;
        add_residual(
            &mut ws.x,
            &mut ws.proj,
            w.post_norms.as_ref().map(|p| &p.ffn[..]),
            c.rms_eps,
            d,
        );
        Ok(())
    }

    /// The final norm and the output projection for the rows each sequence asks for,
    /// stacked in `ws.logits` sequence after sequence.
    fn logits(&self, ws: &mut Workspace, seqs: &[Seq<'_>]) -> Result<()> {
        let c = &self.config;
        let d = c.n_embd;
        let mut m = 0;
        let mut first = 0;
        for s in seqs {
            for i in logit_rows(s.tokens.len(), s.want) {
                let x = &ws.x[(first + i) * d..(first + i + 1) * d];
                rms_norm(
                    x,
                    &self.weights.output_norm,
                    c.rms_eps,
                    &mut ws.xb[m * d..(m + 1) * d],
                );
                m += 1;
            }
            first += s.tokens.len();
        }
        resize(&mut ws.logits, m * c.vocab_size);
        if m == 0 {
            return Ok(());
        }
        let out = self.weights.output.matrix(self.file.bytes());
        product(&out, &ws.xb[..m * d], m, ws.rowwise, &mut ws.logits)?;
        soft_cap(&mut ws.logits, c.final_logit_softcap);
        Ok(())
    }

    fn linear(
        &self,
        w: &Linear,
        x: &[f32],
        n: usize,
        rowwise: bool,
        out: &mut [f32],
    ) -> Result<()> {
        product(&w.matrix(self.file.bytes()), x, n, rowwise, out)?;
        add_bias(w, out);
        Ok(())
    }

    /// Several projections of the same input `x` (q/k/v, gate/up): one parallel pass over
    /// all their rows ([`matvec_multi`] for one row, [`matmul_multi`] for a few rows of
    /// matrices in row groups; a prefill's batch runs one product each).
    fn linears<const N: usize>(
        &self,
        ws: [&Linear; N],
        x: &[f32],
        n: usize,
        rowwise: bool,
        mut outs: [&mut [f32]; N],
    ) -> Result<()> {
        let ms = ws.map(|w| w.matrix(self.file.bytes()));
        match n {
            1 => matvec_multi(&ms, x, &mut outs)?,
            _ => matmul_multi(&ms, x, &mut outs, rowwise)?,
        }
        for (w, out) in ws.into_iter().zip(outs) {
            add_bias(w, out);
        }
        Ok(())
    }
}

/// `out = m · x` for `n` rows of activations: one-token kernels for one row, else the
/// batched product (`rowwise`: without panels, each row's bits as alone).
fn product(m: &QMatrix<'_>, x: &[f32], n: usize, rowwise: bool, out: &mut [f32]) -> Result<()> {
    if n == 1 {
        matvec(m, x, out)?;
    } else if rowwise {
        matmul_rowwise(m, x, out)?;
    } else {
        matmul(m, x, out)?;
    }
    Ok(())
}

/// A sequence inside [`Model::run`].
struct Seq<'a> {
    state: &'a mut State,
    tokens: &'a [u32],
    want: Logits,
    /// Attend token by token, each as a one-token pass would ([`Model::forward_steps`]).
    as_steps: bool,
    /// The rows the last `siblings.len()` tokens stand in for
    /// ([`Model::forward_steps_with_siblings`]).
    siblings: &'a [usize],
}

impl Seq<'_> {
    /// The positions the pass takes: every token but the siblings.
    fn steps(&self) -> usize {
        self.tokens.len() - self.siblings.len()
    }
}

/// Which of a step's `n` rows produce logits.
fn logit_rows(n: usize, want: Logits) -> Range<usize> {
    match want {
        Logits::None | Logits::Tail(0) => 0..0,
        Logits::Last => n.saturating_sub(1)..n,
        Logits::All => 0..n,
        Logits::Tail(k) => n - k.min(n)..n,
    }
}

fn resize(v: &mut Vec<f32>, n: usize) {
    v.resize(n, 0.0);
}

pub(super) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// The model's final logit soft-cap (Gemma 2's `cap · tanh(logit / cap)`), if it has one.
pub(super) fn soft_cap(logits: &mut [f32], cap: Option<f32>) {
    if let Some(cap) = cap {
        logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
    }
}

/// Adds `w`'s bias (if any) to every row of `out`.
fn add_bias(w: &Linear, out: &mut [f32]) {
    if let Some(b) = &w.bias {
        for row in out.chunks_exact_mut(w.rows) {
            row.iter_mut().zip(b).for_each(|(o, &bv)| *o += bv);
        }
    }
}

/// RMS-normalise `x` in place with `weight` (a query or key head).
fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    x.iter_mut()
        .zip(weight)
        .for_each(|(v, &w)| *v = *v * scale * w);
}

/// `x += block_out`, row by row, through the block's post-norm if it has one (which then
/// normalises `block_out` in place first).
fn add_residual(
    x: &mut [f32],
    block_out: &mut [f32],
    post_norm: Option<&[f32]>,
    eps: f32,
    d: usize,
) {
    if let Some(w) = post_norm {
        block_out
            .chunks_exact_mut(d)
            .for_each(|row| rms_norm_in_place(row, w, eps));
    }
    x.iter_mut()
        .zip(block_out.iter())
        .for_each(|(x, p)| *x += p);
}

/// How many batch positions a sliding layer whose ring has `rows` rows can append and
/// attend at once: each query's `window - 1` predecessors must still be in the ring.
fn sliding_chunk(rows: usize, window: usize) -> usize {
    (rows + 1).saturating_sub(window).max(1)
}
