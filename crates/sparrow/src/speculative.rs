//! Speculative decoding: something cheap proposes the next few tokens, and the model checks
//! them all in one forward pass ([`Model::forward_steps`]), which reads its weights once —
//! decode is bound by reading the weights, so each accepted draft is a token for (almost)
//! free. Two proposers: a smaller model sharing the tokenizer ([`DraftModel`], llama.cpp's
//! `--draft-model`) and n-gram lookup in the context itself ([`PromptLookup`], `--lookup`).
//!
//! Why the output is the plain output. Drafts are proposed deterministically (the draft
//! model's most likely token; the lookup's continuation), and [`crate::Session`] checks
//! them by *sampling from the model's own logits* at each drafted position, exactly as
//! plain decoding would, keeping a draft only while the sampled token equals it. For a
//! deterministic draft this is the standard speculative-sampling rule (accept draft `x`
//! with probability min(1, p(x)/q(x)) = p(x), else draw from the normalised
//! max(0, p − q) = p without `x`) — and more: each output token costs one draw of the same
//! sampler with the same RNG, so the output is the plain output token for token, at
//! temperature 0 and with sampling, with penalties, grammars and stop strings alike.
//! Checked drafts see the bits a one-token pass gives (`forward_steps` attends token by
//! token with the decode policy and keeps the one-token products), and rejected ones are
//! rewound from the KV store and the policy ([`State::truncate`]). A check may also carry
//! the draft's second choices ([`Sibling`]); a sibling's row is read only when the
//! generation itself sampled that token in place of the draft, and it has the bits of the
//! one-token pass after it, so the output stays the plain output.

use crate::error::{Error, Result};
use crate::generate::{prefill, prefill_head, Generation, Next, SpeculationStats, TokenSink};
use crate::model::{Model, State, VocabHead};
use crate::sampler::argmax;
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

/// Most draft tokens per check unless set (llama.cpp's `--draft-max` default).
pub const DEFAULT_DRAFT_MAX: usize = 16;

/// The draft model stops drafting once the product of its drafts' probabilities falls
/// below this unless set (the number is llama.cpp's `--draft-p-min` default, whose rule is
/// per token: see [`DraftModel`]).
pub const DEFAULT_DRAFT_P_MIN: f32 = 0.75;

/// The draft model scores the vocabulary's first this many ids (and those of the context)
/// unless set (`--draft-vocab`; see [`VocabHead`]). 16,384 rather than session 21's 32,768
/// since drafts are checked whatever their odds: on the 1.5B with the 0.5B drafting, two
/// alternated pairs of each gave code 1.60–1.69× plain against 1.49–1.54×, chat 1.12–1.16×
/// against 1.11×; 8,192 drafted fewer code tokens a pass (3.7–3.8 against 4.3–4.4).
pub const DEFAULT_DRAFT_VOCAB: usize = 16384;

/// How drafts are made, and how many per check.
///
/// How many: a check of `k` drafts costs a pass of `k + 1` rows, which is not free — on
/// a CPU the batched products are partly bound by arithmetic, so each extra row adds a
/// share of a one-token pass (measured ~0.55 on two AVX2 cores, less with VNNI) — plus
/// `k` steps of the draft model. It yields `1 + α + … + α^k` tokens when each draft is
/// kept with probability α (drafts are kept in order, up to the first miss). So the
/// length follows the measurements: α from the recent checks, each length's pass time
/// and the draft's time per token from the recent passes, and each check asks for the
/// `k` in `draft_min..=draft_max` (or none) with the most tokens per second. When none
/// pays, the session decodes plainly and tries a short draft now and then, in case the
/// text has become easier to guess.
pub struct Speculation {
    drafter: Drafter,
    /// Most drafts per check (`--draft-max`).
    draft_max: usize,
    /// Fewer drafts than this are not checked: the step runs plainly (`--draft-min`).
    draft_min: usize,
    measure: Measurements,
    /// Ask for `draft_max` drafts every time, whatever they cost.
    always_max: bool,
    /// A deliberately wrong acceptance rule, for the tests that must tell it from the right
    /// one: every draft is taken as generated, unsampled.
    take_drafts_unchecked: bool,
    stats: SpeculationStats,
}

/// What the draft length is chosen from, decayed so recent passes count most.
struct Measurements {
    /// Drafts kept and drafts judged (a check ending at a miss judges `kept + 1`).
    kept: f64,
    judged: f64,
    /// Seconds of a pass checking `k` drafts, per `k` (0: a plain step).
    pass: Vec<Option<f64>>,
    /// Seconds the drafter takes per draft token, and per check before the first (a draft
    /// model catching up with what the last check kept).
    draft: Option<f64>,
    setup: Option<f64>,
    /// Plain steps since the last draft was checked.
    plain_steps: usize,
    /// Trial drafts since drafting last paid: each doubles the wait for the next.
    trials: u32,
    /// Tokens the recent checks gave, the seconds they took with their drafting, and how
    /// many checks that is (decayed alike): the rate drafting has reached.
    check_tokens: f64,
    check_seconds: f64,
    checks: f64,
    /// Whether the last check entered them (its pass was its own).
    last_check_counted: bool,
}

/// Checks (decayed) before the rate drafting reached decides whether it pays.
const CHECKS_TO_TRUST: f64 = 2.5;

/// Drafting stops when the recent checks' rate falls below this share of plain steps'
/// rate. Not 1: the rate is a few checks' average, and a response's first tokens are its
/// hardest to guess — on the 1.5B with the 0.5B drafting, the chat prompt "five tips for
/// studying" measured 0.98 after its first checks and stopped drafting for good in two
/// runs of three (40–41 tok/s) where drafting throughout gave 51.7 (plain: 40).
const STOP_BELOW: f64 = 0.9;

/// With a draft model, the fewest drafts a check asks for once drafting pays. The draft's
/// own odds end an unsure run (`--draft-p-min`, [`DraftModel::propose`]); the length
/// chooser's model — every draft kept at one rate α — undervalues a confident run where
/// the draft is unsure elsewhere: on the chat prompts (α ≈ 0.6) it asked for 2 drafts and
/// cut confident runs short. Replayed over the trace (`scripts/draft_rules.py`, product rule
/// at 0.75), drafts capped at 2 give chat 1.28× plain against 1.32× at 4; measured (`bench
/// -m $M15 -md $M05`, chat, four alternated pairs, each against its run's plain) 1.26,
/// 1.17, 1.28, 1.25× against 1.14, 1.08, 1.22, 1.23× without the floor. Asking for all 16
/// every time (the replay's best) lost 2–3% on code in three pairs.
pub const MODEL_DRAFT_FLOOR: usize = 4;

/// A draft model's second choice at a draft it is less sure of than this is checked beside
/// it, as a sibling ([`Sibling`]). Replayed over the trace of the 1.5B with the 0.5B
/// drafting (`scripts/draft_rules.py docs/speculative/draft-trace-1.5b-0.5b.json`, which
/// records the runner-up): chat 1.33× plain without siblings, 1.39, 1.38, 1.38, 1.37× with
/// them below 0.5, 0.6, 0.7, 0.8 and 1.34× beside every draft (code 1.94× → 1.95, 1.96,
/// 1.96, 1.95, 1.78×; edits level): on chat the draft is wrong at 30% of tokens, and its
/// second choice is the model's token at 45% of those.
pub const SIBLING_BELOW: f32 = 0.6;

/// A draft's alternative checked beside it: the draft model's second choice at draft
/// index `draft`. When the model samples `token` there instead of the draft, the check's
/// sibling row ([`Model::forward_steps_with_siblings`]) gives the model's next token too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sibling {
    pub draft: usize,
    pub token: u32,
}

/// The most tokens a draft model catches up after a check (the last draft, kept, and the
/// token after it); more is the backlog of plain steps.
const STEADY_CATCH_UP: usize = 2;

/// Weight of the past in each new measurement.
const DECAY: f64 = 0.9;

/// Plain steps before the first trial draft while drafting does not pay (doubling after
/// each trial that does not change that, up to 16 times as many).
const RETRY_AFTER: usize = 16;

/// Length of a trial draft.
const TRIAL_DRAFT: usize = 3;

impl Measurements {
    fn new(draft_max: usize) -> Self {
        // A prior worth a few checks: drafts kept two times in three.
        Measurements {
            kept: 2.0,
            judged: 3.0,
            pass: vec![None; draft_max + 1],
            draft: None,
            setup: None,
            plain_steps: 0,
            trials: 0,
            check_tokens: 0.0,
            check_seconds: 0.0,
            checks: 0.0,
            last_check_counted: false,
        }
    }

    /// Tokens per second of the recent checks, drafting included, once there are enough.
    fn drafting_rate(&self) -> Option<f64> {
        (self.checks >= CHECKS_TO_TRUST && self.check_seconds > 0.0)
            .then(|| self.check_tokens / self.check_seconds)
    }

    fn acceptance(&self) -> f64 {
        (self.kept / self.judged).clamp(0.0, 0.999)
    }

    /// Seconds a pass checking `k` drafts is expected to take: measured, or on the line
    /// between the nearest lengths measured on either side, or beyond them along the
    /// line through the two nearest (half a one-token pass per extra row while only one
    /// length has been measured).
    fn pass_seconds(&self, k: usize) -> Option<f64> {
        if let Some(t) = self.pass[k] {
            return Some(t);
        }
        let seen: Vec<(f64, f64)> = self
            .pass
            .iter()
            .enumerate()
            .filter_map(|(k, t)| t.map(|t| (k as f64, t)))
            .collect();
        let x = k as f64;
        let line = |(k0, t0): (f64, f64), (k1, t1): (f64, f64)| {
            let slope = ((t1 - t0) / (k1 - k0)).max(0.0);
            (t0 + slope * (x - k0)).max(t0.min(t1))
        };
        let above = seen.iter().position(|p| p.0 > x);
        Some(match (seen.len(), above) {
            (0, _) => return None,
            (1, _) => {
                let (k0, t0) = seen[0];
                t0 / (1.0 + 0.5 * k0) * (1.0 + 0.5 * x)
            }
            (_, Some(0)) => line(seen[0], seen[1]),
            (n, None) => line(seen[n - 2], seen[n - 1]),
            (_, Some(i)) => line(seen[i - 1], seen[i]),
        })
    }

    /// A proposal was made after a catch-up of `setup` seconds (`None`: not a check's
    /// usual catch-up).
    fn proposed(&mut self, setup: Option<f64>) {
        if let Some(setup) = setup {
            Self::update(&mut self.setup, setup);
        }
    }

    fn update(slot: &mut Option<f64>, value: f64) {
        *slot = Some(match *slot {
            Some(old) => DECAY * old + (1.0 - DECAY) * value,
            None => value,
        });
    }
}

/// The draft length in `min..=max` (or 0) with the most expected tokens per second, when
/// each draft is kept with probability `alpha`, a check of `k` drafts takes
/// `pass_seconds(k)`, each draft token `draft_seconds` and drafting at all
/// `setup_seconds` (a draft model catching up with the tokens kept).
pub fn best_draft_len(
    alpha: f64,
    pass_seconds: impl Fn(usize) -> f64,
    draft_seconds: f64,
    setup_seconds: f64,
    min: usize,
    max: usize,
) -> usize {
    let rate = |k: usize| {
        if k == 0 {
            return 1.0 / pass_seconds(0);
        }
        // 1 + α + … + α^k tokens
        let tokens = (0..=k).map(|j| alpha.powi(j as i32)).sum::<f64>();
        tokens / (setup_seconds + pass_seconds(k) + draft_seconds * k as f64)
    };
    let mut best = (0, rate(0));
    for k in min.max(1)..=max {
        let r = rate(k);
        if r > best.1 {
            best = (k, r);
        }
    }
    best.0
}

/// What proposes drafts.
pub enum Drafter {
    Model(Box<DraftModel>),
    Lookup(PromptLookup),
}

impl Speculation {
    /// Speculation with `drafter`, at most `draft_max` drafts per check (≥ 1) and none
    /// checked when fewer than `draft_min` come.
    pub fn new(drafter: Drafter, draft_max: usize, draft_min: usize) -> Result<Self> {
        Self::check_lengths(draft_max, draft_min)?;
        Ok(Speculation {
            drafter,
            draft_max,
            draft_min,
            measure: Measurements::new(draft_max),
            always_max: false,
            take_drafts_unchecked: false,
            stats: SpeculationStats::default(),
        })
    }

    /// Break the acceptance rule on purpose: take every draft as generated without
    /// sampling the model's row (the output is then the drafter's, not the model's). Only
    /// for the statistical tests, which must reject it.
    #[cfg(any(test, feature = "testing"))]
    pub fn take_drafts_unchecked(mut self) -> Self {
        self.take_drafts_unchecked = true;
        self
    }

    /// Whether drafts are taken unchecked (see [`Speculation::take_drafts_unchecked`]).
    pub(crate) fn takes_drafts_unchecked(&self) -> bool {
        self.take_drafts_unchecked
    }

    /// Ask for `draft_max` drafts at every step, whether they pay or not (for measuring
    /// the checks themselves, and tests that want many drafts judged).
    pub fn always_draft_max(mut self) -> Self {
        self.always_max = true;
        self
    }

    /// Whether `draft_max` (≥ 1) and `draft_min` (≤ `draft_max`) make sense together.
    pub fn check_lengths(draft_max: usize, draft_min: usize) -> Result<()> {
        if draft_max == 0 {
            return Err(Error::Other("--draft-max must be at least 1".into()));
        }
        if draft_min > draft_max {
            return Err(Error::Other(format!(
                "--draft-min {draft_min} is above --draft-max {draft_max}"
            )));
        }
        Ok(())
    }

    /// Counts so far.
    pub fn stats(&self) -> SpeculationStats {
        self.stats
    }

    /// The fewest drafts a check asks for once drafting pays: [`MODEL_DRAFT_FLOOR`] with a
    /// draft model (its odds end an unsure run), 1 with prompt lookup.
    fn len_floor(&self) -> usize {
        match self.drafter {
            Drafter::Model(_) => MODEL_DRAFT_FLOOR,
            Drafter::Lookup(_) => 1,
        }
    }

    /// How many drafts the next check should ask for, from the measurements, and whether
    /// that is a trial (drafting does not pay by the measurements so far).
    fn next_len(&self) -> (usize, bool) {
        let m = &self.measure;
        if self.always_max {
            return (self.draft_max, false);
        }
        let Some(_) = m.pass_seconds(0) else {
            // Nothing measured yet: a short draft, to learn (a long one that fails costs
            // several passes' worth of rows).
            return (
                TRIAL_DRAFT.clamp(self.draft_min.max(1), self.draft_max),
                false,
            );
        };
        let pass = |k: usize| m.pass_seconds(k).unwrap_or(f64::MAX);
        let (draft, setup) = (m.draft.unwrap_or(0.0), m.setup.unwrap_or(0.0));
        let k = best_draft_len(
            m.acceptance(),
            pass,
            draft,
            setup,
            self.draft_min,
            self.draft_max,
        );
        // Whether drafting pays: the rate the recent checks reached against a plain
        // step's, once measured — the model above (every draft kept at one rate α, all `k`
        // drafted) does not know that a draft model's odds end its unsure runs early, and
        // on chat (α ≈ 0.6) it turned drafting off where the checks ran ahead of plain
        // steps. Until both are measured, drafting, to measure it; then drafting stops
        // only below [`STOP_BELOW`] of the plain rate (a trial beating it starts again).
        let pays = match (m.drafting_rate(), m.pass[0]) {
            (Some(rate), Some(plain)) => rate * plain > STOP_BELOW,
            _ => true,
        };
        if pays {
            let k = if k > 0 { k } else { self.len_floor() };
            return (k.max(self.len_floor()).min(self.draft_max), false);
        }
        // Would drafts pay if every one were proposed and kept? If not, trying one cannot
        // change that.
        let could_pay =
            best_draft_len(0.999, pass, draft, setup, self.draft_min, self.draft_max) > 0;
        if could_pay && m.plain_steps >= RETRY_AFTER << m.trials.min(4) {
            (
                TRIAL_DRAFT.clamp(self.draft_min.max(1), self.draft_max),
                true,
            )
        } else {
            (0, false)
        }
    }

    /// Run what the drafter needs of a prompt now, with the prompt (a draft model's own
    /// prefill), rather than at the first draft.
    pub(crate) fn prefill(&mut self, context: &[u32]) -> Result<()> {
        if let Drafter::Model(m) = &mut self.drafter {
            m.catch_up(context, None)?;
        }
        Ok(())
    }

    /// Drafts to follow `context` then `next` (the token about to be fed), at most
    /// `room` of them, into `out` (emptied first), and when `siblings` is given, a draft
    /// model's second choices where it is unsure ([`SIBLING_BELOW`]; emptied first). Too
    /// few to check leaves both empty.
    /// `lead`: tokens already sampled to be fed before `next` (a sibling taken), which
    /// follow `context`.
    pub(crate) fn propose(
        &mut self,
        context: &[u32],
        lead: &[u32],
        next: u32,
        room: usize,
        out: &mut Vec<u32>,
        mut siblings: Option<&mut Vec<Sibling>>,
    ) -> Result<()> {
        let joined: Vec<u32>;
        let context = if lead.is_empty() {
            context
        } else {
            joined = [context, lead].concat();
            &joined
        };
        out.clear();
        if let Some(s) = siblings.as_deref_mut() {
            s.clear();
        }
        let (want, trial) = self.next_len();
        if want > 0 {
            self.measure.trials = if trial { self.measure.trials + 1 } else { 0 };
        }
        let want = want.min(room);
        if want == 0 || want < self.draft_min {
            return Ok(());
        }
        let (setup, seconds) = match &mut self.drafter {
            Drafter::Model(m) => m.propose(context, next, want, out, siblings.as_deref_mut())?,
            Drafter::Lookup(l) => {
                let started = std::time::Instant::now();
                l.propose(context, next, want, out);
                (Some(0.0), started.elapsed().as_secs_f64())
            }
        };
        self.measure.proposed(setup);
        if !out.is_empty() {
            Measurements::update(&mut self.measure.draft, seconds / out.len() as f64);
        }
        if out.len() < self.draft_min.max(1) {
            out.clear();
            if let Some(s) = siblings {
                s.clear();
            }
        }
        Ok(())
    }

    /// After a pass of `seconds` (`None`: shared with other sequences, so not this check's
    /// cost) that checked `drafted` tokens, the first `accepted` of them kept.
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize, seconds: Option<f64>) {
        self.stats.target_passes += 1;
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        let m = &mut self.measure;
        if let Some(seconds) = seconds {
            Measurements::update(&mut m.pass[drafted], seconds);
        }
        if drafted == 0 {
            m.plain_steps += 1;
            return;
        }
        m.plain_steps = 0;
        m.last_check_counted = seconds.is_some();
        if let Some(seconds) = seconds {
            let drafting = m.setup.unwrap_or(0.0) + m.draft.unwrap_or(0.0) * drafted as f64;
            let (tokens, seconds) = ((accepted + 1) as f64, drafting + seconds);
            let beats_plain = m
                .pass_seconds(0)
                .is_some_and(|plain| tokens * plain > seconds);
            if m.trials > 0 && beats_plain {
                // A trial that ran ahead of plain steps: the text has changed since the
                // checks that stopped drafting; start again from this one.
                m.check_tokens = CHECKS_TO_TRUST * tokens;
                m.check_seconds = CHECKS_TO_TRUST * seconds;
                m.checks = CHECKS_TO_TRUST;
            } else {
                m.check_tokens = DECAY * m.check_tokens + tokens;
                m.check_seconds = DECAY * m.check_seconds + seconds;
                m.checks = DECAY * m.checks + 1.0;
            }
        }
        let judged = accepted + usize::from(accepted < drafted);
        m.kept = DECAY * m.kept + accepted as f64;
        m.judged = DECAY * m.judged + judged as f64;
    }

    /// A check carried `checked` siblings, and the model took one of them or not.
    pub(crate) fn record_siblings(&mut self, checked: usize, taken: bool) {
        self.stats.siblings += checked;
        self.stats.siblings_kept += usize::from(taken);
        if taken && self.measure.last_check_counted {
            // The check gave a token more than its drafts kept.
            self.measure.check_tokens += 1.0;
        }
    }
}

/// A smaller model with the same vocabulary, run greedily on its own state (its own KV
/// cache and attention policy) to propose drafts.
pub struct DraftModel {
    model: Arc<Model>,
    state: State,
    /// The tokens the draft's cache holds (`tokens.len() == state.n_past()`).
    tokens: Vec<u32>,
    p_min: f32,
    batch_size: usize,
    /// Logits over part of the vocabulary only (`--draft-vocab`): the frequent ids and
    /// those of the context, which it includes as the context grows.
    head: Option<VocabHead>,
}

impl DraftModel {
    /// A draft model over `state` (a state of `model`), drafting while the product of its
    /// drafts' probabilities — its own odds that the check keeps them all — is at least
    /// `p_min` (see [`DraftModel::propose`]). `batch_size`: prompt tokens per pass when it
    /// catches up with a long context.
    pub fn new(model: Arc<Model>, state: State, p_min: f32, batch_size: usize) -> Result<Self> {
        if !(0.0..=1.0).contains(&p_min) {
            return Err(Error::Other(format!(
                "--draft-p-min {p_min} is outside [0, 1]"
            )));
        }
        Ok(DraftModel {
            model,
            state,
            tokens: Vec::new(),
            p_min,
            batch_size: batch_size.max(1),
            head: None,
        })
    }

    /// Draft from the logits of the vocabulary's first `first` ids and of the ids in the
    /// context ([`VocabHead`]) rather than of every token: each step reads less of the
    /// output matrix; a token outside them is never proposed (the check then decodes it),
    /// and the draft's confidence (`--draft-p-min`) is its best token's share of the head.
    /// `0`: the whole vocabulary.
    pub fn with_vocab_head(mut self, first: usize) -> Self {
        let vocab = self.model.config.vocab_size;
        self.head = (first != 0 && first < vocab).then(|| VocabHead::new(first, vocab));
        self
    }

    /// Logits of the last of `tokens`, fed at the draft's next positions as a prompt is:
    /// over the head if it has one (logit `i` is token [`DraftModel::token_of`]`(i)`).
    fn catch_up_pass(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        match &self.head {
            Some(head) => prefill_head(&self.model, &mut self.state, tokens, self.batch_size, head),
            None => prefill(
                &self.model,
                &mut self.state,
                tokens,
                self.batch_size,
                |_, _| {},
            ),
        }
        .map(<[f32]>::to_vec)
    }

    /// One decode step of the draft on `id`, its logits (as [`DraftModel::catch_up_pass`]'s)
    /// written over `logits`.
    fn step(&mut self, id: u32, logits: &mut Vec<f32>) -> Result<()> {
        let l = match &self.head {
            Some(head) => self.model.forward_head(&mut self.state, &[id], head)?,
            None => self
                .model
                .forward(&mut self.state, &[id], crate::model::Logits::Last)?,
        };
        logits.clear();
        logits.extend_from_slice(l);
        Ok(())
    }

    /// The token of logit `i` of [`DraftModel::catch_up_pass`].
    fn token_of(&self, i: u32) -> u32 {
        match &self.head {
            Some(head) => head.id(i as usize),
            None => i,
        }
    }

    /// Bring the draft's cache to `context` then `next` (keeping the prefix it already
    /// shares) and return the logits after them; `None` when they do not fit its context
    /// with room for a draft.
    fn catch_up(
        &mut self,
        context: &[u32],
        next: Option<u32>,
    ) -> Result<Option<(Vec<f32>, usize)>> {
        let total = context.len() + usize::from(next.is_some());
        if total == 0 || total >= self.state.n_ctx() {
            return Ok(None);
        }
        let token_at = |i: usize| context.get(i).copied().or(next).unwrap_or_default();
        let shared = self
            .tokens
            .iter()
            .enumerate()
            .take_while(|&(i, &t)| i < total && t == token_at(i))
            .count()
            .min(total - 1);
        let kept = self.state.truncate(shared);
        self.tokens.truncate(kept);
        let rest: Vec<u32> = (kept..total).map(token_at).collect();
        if let Some(head) = &mut self.head {
            if kept == 0 {
                head.clear_included();
            }
            head.include(&rest);
        }
        match self.catch_up_pass(&rest) {
            Ok(logits) => {
                self.tokens.extend_from_slice(&rest);
                Ok(Some((logits, rest.len())))
            }
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }

    /// Greedy drafts after `context` + `next`: catch the draft's cache up, then one token
    /// per pass until `want`, the end of its context, or the product of the drafts'
    /// probabilities below `p_min`. Every token a step computed is proposed, the one that
    /// crossed `p_min` included: its step is paid, and checking it costs a row of the
    /// check, not a pass — where declining an unsure first token (llama.cpp's rule, and
    /// sparrow's before) paid the step and a plain pass for nothing. On the 1.5B with the
    /// 0.5B drafting, the chat prompts' drafts are right 70% of the time but at least 0.75
    /// sure only 30%: `examples/draft_bound.rs` traces them, docs/performance.md has the
    /// rules tried. Returns the seconds of the catch-up (whatever the draft's length;
    /// `None` when it caught up more than a check leaves behind — the backlog of plain
    /// steps, a cost paid once, not at every check) and of the drafting steps. With
    /// `siblings`, each draft less than [`SIBLING_BELOW`] sure also gives its runner-up.
    fn propose(
        &mut self,
        context: &[u32],
        next: u32,
        want: usize,
        out: &mut Vec<u32>,
        mut siblings: Option<&mut Vec<Sibling>>,
    ) -> Result<(Option<f64>, f64)> {
        let catching_up = std::time::Instant::now();
        let Some((mut logits, fed)) = self.catch_up(context, Some(next))? else {
            // Past the draft's context: no drafts, the model decodes plainly.
            return Ok((None, 0.0));
        };
        let setup = (fed <= STEADY_CATCH_UP).then(|| catching_up.elapsed().as_secs_f64());
        let want = want.min(self.state.n_ctx() - self.state.n_past());
        let drafting = std::time::Instant::now();
        // The draft's own odds that every draft so far is kept.
        let mut all_kept = 1.0;
        while out.len() < want {
            let (best, p) = best_with_probability(&logits);
            let id = self.token_of(best);
            if let (Some(siblings), true) = (siblings.as_deref_mut(), p < SIBLING_BELOW) {
                if let Some(second) = runner_up(&logits, best) {
                    siblings.push(Sibling {
                        draft: out.len(),
                        token: self.token_of(second),
                    });
                }
            }
            out.push(id);
            all_kept *= p;
            if out.len() == want || all_kept < self.p_min {
                break;
            }
            if let Err(e) = self.step(id, &mut logits) {
                self.reset();
                return Err(e);
            }
            self.tokens.push(id);
        }
        Ok((setup, drafting.elapsed().as_secs_f64()))
    }

    fn reset(&mut self) {
        self.state.reset();
        self.tokens.clear();
    }
}

/// The most likely token and its probability under softmax(`logits`): a draft's token and
/// its odds (also `examples/draft_bound.rs`'s).
pub fn best_with_probability(logits: &[f32]) -> (u32, f32) {
    let id = argmax(logits);
    let max = logits[id as usize];
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (id, 1.0 / sum)
}

/// The index of the largest logit other than `best`'s (none when there is no other).
fn runner_up(logits: &[f32], best: u32) -> Option<u32> {
    logits
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best as usize)
        .fold(None, |top: Option<(usize, f32)>, (i, &l)| match top {
            Some((_, t)) if t >= l => top,
            _ => Some((i, l)),
        })
        .map(|(i, _)| i as u32)
}

/// Prompt lookup: the drafts are what followed the most recent earlier occurrence of the
/// context's last n-gram (longest first, from `ngram_max` tokens down to one), in the
/// prompt and the text generated so far — no second model. Code edits and summaries
/// repeat long runs of their input, which this finds for free.
pub struct PromptLookup {
    ngram_max: usize,
}

impl PromptLookup {
    /// Lookup matching up to `ngram_max` (≥ 1) tokens.
    pub fn new(ngram_max: usize) -> Result<Self> {
        if ngram_max == 0 {
            return Err(Error::Other(
                "--lookup needs an n-gram of at least 1 token".into(),
            ));
        }
        Ok(PromptLookup { ngram_max })
    }

    fn propose(&self, context: &[u32], next: u32, want: usize, out: &mut Vec<u32>) {
        let mut seq = Vec::with_capacity(context.len() + 1);
        seq.extend_from_slice(context);
        seq.push(next);
        out.extend_from_slice(lookup(&seq, self.ngram_max, want));
    }
}

/// Up to `want` tokens that followed an earlier occurrence of `seq`'s last n-gram, trying
/// n = `ngram_max` down to 1; empty when none occurs earlier. Of several occurrences, the
/// one whose preceding tokens also match `seq`'s for longest (up to [`CONTEXT_MAX`] more),
/// the latest on a tie: in a rewrite of code, the short n-gram at the end of the output
/// (`) {` and a newline, an indent) occurs all over the input, and the occurrence at the
/// same place in the input as the output has reached is the one whose context matches.
pub fn lookup(seq: &[u32], ngram_max: usize, want: usize) -> &[u32] {
    let len = seq.len();
    for n in (1..=ngram_max.min(len.saturating_sub(1))).rev() {
        let tail = &seq[len - n..];
        // Tokens before position `end` (exclusive) that equal those before the tail.
        let context = |end: usize| {
            (1..=CONTEXT_MAX.min(end))
                .take_while(|&k| seq[end - k] == seq[len - n - k])
                .count()
        };
        let best = (0..len - n)
            .rev()
            .filter(|&s| &seq[s..s + n] == tail)
            .map(|s| (context(s), s))
            // the first of the longest, going backwards: the latest on a tie
            .fold(None, |best: Option<(usize, usize)>, c| match best {
                Some(b) if b.0 >= c.0 => Some(b),
                _ => Some(c),
            });
        if let Some((_, start)) = best {
            let from = start + n;
            return &seq[from..(from + want).min(len)];
        }
    }
    &[]
}

/// Most tokens of context before an n-gram that [`lookup`] compares to choose among its
/// occurrences (bounding the cost of a proposal).
pub const CONTEXT_MAX: usize = 32;

/// How a check of drafts ended: the drafts kept, and the generation's last step (a token
/// to feed next — the one it sampled instead of a draft, or after the last — or its end).
pub struct Judged {
    pub kept: usize,
    pub next: Next,
    /// The sibling the generation sampled in place of the first draft it did not keep:
    /// `next` then follows it (feed the sibling, then `next`).
    pub sibling: Option<u32>,
}

/// The tokens of a check after `lead` (siblings taken, not yet fed): `lead`, `id`, the
/// drafts, then the siblings, into `batch`; the rows the siblings stand in for into `rows`
/// ([`Model::forward_steps_with_siblings`]).
pub fn check_batch(
    lead: &[u32],
    id: u32,
    drafts: &[u32],
    siblings: &[Sibling],
    batch: &mut Vec<u32>,
    rows: &mut Vec<usize>,
) {
    batch.clear();
    batch.extend_from_slice(lead);
    batch.push(id);
    batch.extend_from_slice(drafts);
    batch.extend(siblings.iter().map(|s| s.token));
    rows.clear();
    rows.extend(siblings.iter().map(|s| lead.len() + 1 + s.draft));
}

/// A pass that checked drafts, to be judged ([`judge_drafts`]).
pub struct Check<'a> {
    /// `vocab` logits after each checked token, the first being the token fed before the
    /// drafts.
    pub rows: &'a [f32],
    pub drafts: &'a [u32],
    /// The cache's room after the first token.
    pub room: usize,
    /// The siblings checked beside the drafts, and their rows of logits (`vocab` floats
    /// each, after the sibling).
    pub siblings: &'a [Sibling],
    pub sibling_rows: &'a [f32],
    /// The deliberately wrong rule of [`Speculation::take_drafts_unchecked`].
    pub unchecked: bool,
}

impl<'a> Check<'a> {
    /// The check in the logits `rows` (`vocab` each) of a pass over [`check_batch`]'s
    /// tokens, `fed` of them before the drafts (the lead and the token sampled), with
    /// `room` positions in the cache after them.
    pub fn of_pass(
        rows: &'a [f32],
        vocab: usize,
        fed: usize,
        drafts: &'a [u32],
        siblings: &'a [Sibling],
        room: usize,
    ) -> Self {
        let steps_end = (fed + drafts.len()) * vocab;
        Check {
            rows: &rows[(fed - 1) * vocab..steps_end],
            drafts,
            room,
            siblings,
            sibling_rows: &rows[steps_end..],
            unchecked: false,
        }
    }
}

/// Step `gen` through the rows of `check` as it would through one-token passes, while it
/// samples the drafts in order. `logits` is scratch for the row sampled.
pub fn judge_drafts(
    check: Check<'_>,
    gen: &mut Generation,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    logits: &mut Vec<f32>,
    sink: &mut impl TokenSink,
) -> Judged {
    let Check {
        rows,
        drafts,
        room,
        unchecked,
        siblings,
        sibling_rows,
    } = check;
    let vocab = rows.len() / (drafts.len() + 1);
    let mut kept = 0;
    for (j, row) in rows.chunks_exact(vocab).enumerate() {
        logits.clear();
        logits.extend_from_slice(row);
        if let (true, Some(&d)) = (unchecked, drafts.get(j)) {
            // The wrong rule the tests must catch: the draft, whatever the row says.
            logits.iter_mut().for_each(|l| *l = f32::NEG_INFINITY);
            logits[d as usize] = 0.0;
        }
        let next = gen.step(tokenizer, sampler, logits, room - j, sink);
        match next {
            Next::Feed(t) if drafts.get(j) == Some(&t) => kept += 1,
            Next::Feed(t) => {
                // The generation sampled `t` in place of draft `j`: if `t` was checked as
                // its sibling, the sibling's row is the one-token pass after `t`.
                let Some(i) = siblings.iter().position(|s| s.draft == j && s.token == t) else {
                    return Judged {
                        kept,
                        next: Next::Feed(t),
                        sibling: None,
                    };
                };
                logits.clear();
                logits.extend_from_slice(&sibling_rows[i * vocab..(i + 1) * vocab]);
                let next = gen.step(tokenizer, sampler, logits, room - j - 1, sink);
                return Judged {
                    kept,
                    next,
                    sibling: Some(t),
                };
            }
            next => {
                return Judged {
                    kept,
                    next,
                    sibling: None,
                }
            }
        }
    }
    unreachable!("the row after the last draft is never a draft")
}

/// Whether a sequence over `state` can speculate: rejected drafts are rewound, which needs
/// a policy that rewinds exactly (H2O's scores keep what every query attended to).
pub fn check_rewinds(state: &State) -> Result<()> {
    match state.rewinds_exactly() {
        (true, _) => Ok(()),
        (false, policy) => Err(Error::Other(format!(
            "speculative decoding rewinds rejected drafts, and attention policy '{policy}' cannot rewind exactly (its scores keep what the drafts attended to); use another --attn or no draft"
        ))),
    }
}

/// Whether `draft` can propose tokens for `target`: the same tokens under the same ids. The
/// error names the first id where they differ.
pub fn check_vocabularies(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    let (nt, nd) = (target.vocab_size(), draft.vocab_size());
    for id in 0..nt.min(nd) as u32 {
        if target.piece(id) != draft.piece(id) || target.token_text(id) != draft.token_text(id) {
            return Err(Error::Other(format!(
                "the draft model's vocabulary differs from the model's at token {id}: {:?} in the draft, {:?} in the model",
                draft.token_text(id).unwrap_or(""),
                target.token_text(id).unwrap_or("")
            )));
        }
    }
    if nt != nd {
        return Err(Error::Other(format!(
            "the draft model's vocabulary has {nd} tokens, the model's {nt} (the first {} agree)",
            nt.min(nd)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_occurrence_whose_context_matches_longest() {
        // "5 6 1 2 | 8 1 2 | 9 | 5 6 1 2": "1 2" occurs at 2 and at 5; the tokens before
        // the one at 2 ("5 6") match those before the tail, so 8 follows, not 9.
        let seq = [5, 6, 1, 2, 8, 1, 2, 9, 5, 6, 1, 2];
        assert_eq!(lookup(&seq, 2, 2), &[8, 1]);
        // Contexts of equal length (none): the latest occurrence, as before.
        let seq = [3, 1, 2, 8, 4, 1, 2, 9, 7, 1, 2];
        assert_eq!(lookup(&seq, 2, 1), &[9]);
        // The context does not reach before the start of the sequence.
        let seq = [1, 2, 7, 1, 2];
        assert_eq!(lookup(&seq, 2, 1), &[7]);
    }

    #[test]
    fn lookup_takes_the_longest_latest_match() {
        // "1 2 3 4 | 9 2 3 5 | 2 3": the 2-gram "2 3" last occurred before "5".
        let seq = [1, 2, 3, 4, 9, 2, 3, 5, 2, 3];
        assert_eq!(lookup(&seq, 2, 3), &[5, 2, 3]);
        // With 3-grams allowed, "5 2 3" never occurred before: falls back to "2 3".
        assert_eq!(lookup(&seq, 3, 1), &[5]);
        let seq = [7, 1, 2, 3, 8, 0, 1, 2, 3];
        // 3-gram "1 2 3" occurred at 1; what followed: 8, 0.
        assert_eq!(lookup(&seq, 3, 2), &[8, 0]);
        // Nothing repeats: no draft.
        assert!(lookup(&[1, 2, 3, 4], 3, 4).is_empty());
        assert!(lookup(&[5], 3, 4).is_empty());
        // The continuation stops at the end of the sequence.
        assert_eq!(lookup(&[4, 4], 1, 5), &[4]);
    }

    #[test]
    fn the_draft_length_follows_acceptance_and_cost() {
        // A check costs a one-token pass plus `c` of one per draft.
        let cost = |c: f64| move |k: usize| 1.0 + c * k as f64;
        // Cheap checks and sure drafts: as far as allowed.
        assert_eq!(best_draft_len(0.99, cost(0.1), 0.0, 0.0, 0, 16), 16);
        // Drafts kept one time in three, each extra row half a pass: not worth a check.
        assert_eq!(best_draft_len(0.3, cost(0.55), 0.0, 0.0, 0, 16), 0);
        // In between, a short draft: α = 0.8 at 0.3 per row peaks at 2 drafts.
        let k = best_draft_len(0.8, cost(0.3), 0.0, 0.0, 0, 16);
        assert!((2..=3).contains(&k), "{k}");
        // A slow drafter moves the balance: the same odds, each draft token 0.5 of a pass.
        assert_eq!(best_draft_len(0.8, cost(0.3), 0.5, 0.0, 0, 16), 0);
        // So does a costly start: sure drafts at 0.1 per row, but a whole pass to begin.
        assert_eq!(best_draft_len(0.99, cost(0.1), 0.0, 1.0, 0, 16), 16);
        assert_eq!(best_draft_len(0.5, cost(0.1), 0.0, 1.0, 0, 16), 0);
        // A start of 0.3 of a pass: at α = 0.8 and 0.1 a row, a longer draft to pay for it.
        assert_eq!(best_draft_len(0.8, cost(0.1), 0.0, 0.3, 0, 16), 7);
        assert_eq!(best_draft_len(0.8, cost(0.1), 0.0, 0.0, 0, 16), 6);
        // `min` bounds the lengths considered (0 is always one).
        assert_eq!(best_draft_len(0.99, cost(0.1), 0.0, 0.0, 0, 4), 4);
    }

    /// A catch-up longer than a check leaves behind (the backlog of plain steps before a
    /// trial) is not what a check's catch-up costs: it does not enter the measurements.
    #[test]
    fn a_backlog_catch_up_is_not_a_checks_cost() {
        let lookup = || Drafter::Lookup(PromptLookup::new(2).unwrap());
        let mut s = Speculation::new(lookup(), 8, 0).unwrap();
        s.measure.proposed(Some(0.004));
        s.measure.proposed(None);
        assert_eq!(s.measure.setup, Some(0.004));
    }

    #[test]
    fn measurements_choose_the_length() {
        let lookup = || Drafter::Lookup(PromptLookup::new(2).unwrap());
        let mut s = Speculation::new(lookup(), 8, 0).unwrap();
        // Nothing measured: a short draft, to learn.
        assert_eq!(s.next_len(), (TRIAL_DRAFT, false));
        // Every draft kept, each extra row a tenth of a pass: stay long.
        for _ in 0..10 {
            s.record(8, 8, Some(0.018));
            s.record(0, 0, Some(0.010));
        }
        assert_eq!(s.next_len(), (8, false));
        // Then every draft missed, and long checks cost more: plain steps…
        for _ in 0..30 {
            s.record(8, 0, Some(0.030));
        }
        assert_eq!(s.next_len(), (0, false));
        // …until a trial draft after enough of them, then twice as many before the next.
        for _ in 0..RETRY_AFTER {
            s.record(0, 0, Some(0.010));
        }
        assert_eq!(s.next_len(), (TRIAL_DRAFT, true));
        s.measure.trials = 1;
        s.record(TRIAL_DRAFT, 0, Some(0.016));
        for _ in 0..RETRY_AFTER {
            s.record(0, 0, Some(0.010));
        }
        assert_eq!(s.next_len(), (0, false));
        for _ in 0..RETRY_AFTER {
            s.record(0, 0, Some(0.010));
        }
        assert_eq!(s.next_len(), (TRIAL_DRAFT, true));
        // A drafter as slow as the model never pays, however good: no trials.
        s.measure.draft = Some(0.010);
        for _ in 0..10 * RETRY_AFTER {
            s.record(0, 0, Some(0.010));
        }
        assert_eq!(s.next_len(), (0, false));
        assert_eq!(s.stats().drafted, 8 * 10 + 8 * 30 + TRIAL_DRAFT);
        assert_eq!(s.stats().accepted, 80);
        assert!(Speculation::new(lookup(), 0, 0).is_err());
        assert!(Speculation::new(lookup(), 4, 5).is_err());
    }

    /// Once drafting pays, a draft model is asked for at least [`MODEL_DRAFT_FLOOR`] drafts
    /// (its own odds end an unsure run); prompt lookup for what the chooser picks.
    #[test]
    fn a_draft_model_is_asked_for_runs_its_odds_can_end() {
        use crate::synthetic::{synthetic_gguf, SyntheticSpec};
        let bytes = synthetic_gguf(&SyntheticSpec::default());
        let file = Arc::new(sparrow_gguf::GgufFile::from_bytes(bytes).unwrap());
        let model = Arc::new(Model::from_gguf(file).unwrap());
        let state = model.new_state(64, crate::KvType::F16).unwrap();
        let draft = DraftModel::new(model, state, 0.75, 16).unwrap();
        let lookup = Drafter::Lookup(PromptLookup::new(2).unwrap());
        let mut by_model = Speculation::new(Drafter::Model(Box::new(draft)), 8, 0).unwrap();
        let mut by_lookup = Speculation::new(lookup, 8, 0).unwrap();
        // Drafts kept about two times in three, each extra row a third of a pass: the
        // chooser's best is a short draft.
        for s in [&mut by_model, &mut by_lookup] {
            for _ in 0..20 {
                s.record(2, 1, Some(0.016));
                s.record(0, 0, Some(0.010));
                s.record(4, 3, Some(0.020));
            }
        }
        let (chosen, trial) = by_lookup.next_len();
        assert!(
            (1..MODEL_DRAFT_FLOOR).contains(&chosen) && !trial,
            "{chosen}"
        );
        assert_eq!(by_model.next_len(), (MODEL_DRAFT_FLOOR, false));
        // The floor never passes --draft-max, and does not start drafting that does not pay.
        by_model.draft_max = 3;
        assert_eq!(by_model.next_len(), (3, false));
        for _ in 0..40 {
            by_model.record(3, 0, Some(0.030));
        }
        assert_eq!(by_model.next_len(), (0, false));
    }

    /// Whether drafting pays is the rate the checks reached, once measured: drafts a
    /// draft model's odds cut short cost less than the length model assumes.
    #[test]
    fn drafting_pays_by_the_rate_its_checks_reach() {
        let lookup = || Drafter::Lookup(PromptLookup::new(2).unwrap());
        // The 1.5B with the 0.5B drafting on chat (ms): a plain step 24, a catch-up and
        // a draft step 6.5 each, a check of two drafts 26, one of the two kept.
        let run = |kept: usize| {
            let mut s = Speculation::new(lookup(), 8, 0).unwrap();
            s.measure.setup = Some(0.0065);
            s.measure.draft = Some(0.0065);
            for _ in 0..20 {
                s.record(2, kept, Some(0.026));
                s.record(0, 0, Some(0.024));
            }
            s
        };
        let s = run(1);
        let m = &s.measure;
        let pass = |k: usize| m.pass_seconds(k).unwrap();
        // The length model: α = 1/2, so no length beats a plain step…
        assert_eq!(
            best_draft_len(m.acceptance(), pass, 0.0065, 0.0065, 0, 8),
            0
        );
        // …but the checks gave 2 tokens in 45.5 ms, ahead of 1 in 24: keep drafting.
        assert_eq!(s.next_len(), (1, false));
        // None kept: 1 token in 45.5 ms, behind…
        let mut s = run(0);
        assert_eq!(s.next_len(), (0, false));
        // …until a trial runs ahead of plain steps (3 tokens in 45.5 ms): drafting again,
        // however long the checks before it lagged.
        s.measure.trials = 1;
        s.record(2, 2, Some(0.026));
        let (k, trial) = s.next_len();
        assert!(k > 0 && !trial, "{k} {trial}");
        // A trial that lags does not.
        let mut s = run(0);
        s.measure.trials = 1;
        s.record(2, 0, Some(0.026));
        assert_eq!(s.next_len(), (0, false));
    }

    #[test]
    fn best_probability_is_the_softmax_of_the_best() {
        let (id, p) = best_with_probability(&[0.0, 2.0_f32.ln(), 0.0]);
        assert_eq!(id, 1);
        assert!((p - 0.5).abs() < 1e-6, "{p}");
    }
}
