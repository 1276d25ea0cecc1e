//! Grammar-constrained sampling: plain JSON ([`json`]) or JSON valid against a schema
//! ([`schema`], automaton in `schema_state`), each a byte-level automaton ([`Grammar`])
//! turned into a token mask by the same machinery.
//!
//! Per model, [`JsonVocab`] precomputes once the decoded bytes of every token, sorted, with
//! the length of the prefix each shares with the one before it (a flattened trie). The mask
//! for a parser state is one walk over that list that steps the automaton only over bytes not
//! shared with the previous token and skips every token below a refused prefix; masks are
//! cached per parser state (generation revisits the same few states: "inside a string at
//! depth 2", "after a value in an object"…), so most steps cost a hash lookup.
//!
//! End of generation is allowed only when the value is complete (and is then the only
//! choice). With a token budget, tokens after which the value could no longer be closed in
//! the tokens left are refused, so a completion cut by `max_tokens` is still valid JSON.

pub mod json;
mod lex;
pub mod ordered;
pub mod schema;
mod schema_state;
mod trie;

use crate::sampler::Sampler;
use crate::tokenizer::{TokenType, Tokenizer};
pub use json::{JsonState, Root};
pub use ordered::OrderedValue;
pub use schema::{Schema, SchemaError};
pub use schema_state::SchemaState;
use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// Most bytes' worth of completion distance one byte can add in plain JSON (see
/// [`JsonState::distance`]): `\uD8` adds 5 (the low surrogate must follow).
const MAX_GROWTH_PER_BYTE: usize = 5;

/// A byte-level automaton the mask machinery walks: the grammar is `self`, the position a
/// small `Copy` state (the walk copies one per byte of ~150K tokens).
pub trait Grammar {
    type State: Copy + Eq + Hash + Debug;
    /// Feed one byte; false (state unspecified) if no accepted text continues with it.
    fn step(&self, s: &mut Self::State, b: u8) -> bool;
    /// Feed several bytes; false as soon as one is refused.
    fn feed(&self, s: &mut Self::State, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.step(s, b))
    }
    /// True when the text so far is complete (end of generation may follow).
    fn is_complete(&self, s: &Self::State) -> bool;
    /// True when the value is finished and nothing but end of generation should follow.
    fn is_done(&self, s: &Self::State) -> bool;
    /// The fewest bytes that complete the text from `s`.
    fn distance(&self, s: &Self::State) -> usize;
    /// A bound on how much one byte can raise [`Grammar::distance`].
    fn max_growth(&self) -> usize;
    /// The mask cache's key for `s` (it must tell grammars apart).
    fn key(&self, s: &Self::State) -> MaskKey;
}

/// Plain JSON: the grammar of [`JsonState`] (its root kind lives in the state).
pub struct Json;

impl Grammar for Json {
    type State = JsonState;
    #[inline]
    fn step(&self, s: &mut JsonState, b: u8) -> bool {
        s.step(b)
    }
    fn is_complete(&self, s: &JsonState) -> bool {
        s.is_complete()
    }
    fn is_done(&self, s: &JsonState) -> bool {
        s.is_done()
    }
    fn distance(&self, s: &JsonState) -> usize {
        s.distance()
    }
    fn max_growth(&self) -> usize {
        MAX_GROWTH_PER_BYTE
    }
    fn key(&self, s: &JsonState) -> MaskKey {
        MaskKey::Json(*s)
    }
}

/// What a cached mask was computed for: a plain JSON state, or a schema (by the SHA-256 of
/// its text, so requests sending the same schema share masks) and a state of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaskKey {
    Json(JsonState),
    Schema([u8; 32], SchemaState),
}
/// Masks kept per model before the cache is cleared.
const CACHE_CAP: usize = 512;

/// A set of token ids as a bit vector.
#[derive(Clone, Debug)]
pub struct TokenMask {
    bits: Vec<u64>,
}

impl TokenMask {
    fn new(n: usize) -> Self {
        TokenMask {
            bits: vec![0; n.div_ceil(64)],
        }
    }
    fn set(&mut self, t: u32) {
        self.bits[t as usize >> 6] |= 1 << (t & 63);
    }
    /// True if token `t` is in the set.
    #[inline]
    pub fn contains(&self, t: u32) -> bool {
        self.bits
            .get(t as usize >> 6)
            .is_some_and(|w| (w >> (t & 63)) & 1 == 1)
    }
    /// Number of tokens in the set.
    pub fn count(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }
    /// The ids in the set, ascending (the JSON-schema fuzz target walks them).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.bits.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros();
                w &= w - 1;
                Some(i as u32 * 64 + b)
            })
        })
    }
}

/// Per-model data for JSON masks: token bytes sorted into a flattened trie, the
/// end-of-generation ids, and the mask cache.
pub struct JsonVocab {
    n_vocab: usize,
    /// Token ids in byte order of their pieces.
    order: Vec<u32>,
    /// For `order[i]`: bytes shared with `order[i - 1]`.
    lcp: Vec<u16>,
    /// Piece bytes of every token (by id): `data[offsets[id]..offsets[id + 1]]`.
    offsets: Vec<u32>,
    data: Vec<u8>,
    max_len: usize,
    eog: Vec<u32>,
    cache: Mutex<HashMap<MaskKey, Arc<TokenMask>>>,
}

impl JsonVocab {
    /// Precompute for `tokenizer`. Control, unknown and unused tokens are never allowed
    /// (except end-of-generation ones, which close a complete value); pieces longer than
    /// 65,535 bytes are left out.
    pub fn new(tokenizer: &Tokenizer) -> Self {
        let n = tokenizer.vocab_size();
        let mut offsets = Vec::with_capacity(n + 1);
        let mut data = Vec::new();
        let mut order = Vec::new();
        offsets.push(0u32);
        for id in 0..n as u32 {
            let piece = tokenizer.piece(id);
            let usable = !tokenizer.is_eog(id)
                && !piece.is_empty()
                && piece.len() <= u16::MAX as usize
                && !matches!(
                    tokenizer.token_type(id),
                    Some(TokenType::Control | TokenType::Unknown | TokenType::Unused)
                );
            if usable {
                data.extend_from_slice(piece);
                order.push(id);
            }
            offsets.push(data.len() as u32);
        }
        let bytes =
            |id: u32| &data[offsets[id as usize] as usize..offsets[id as usize + 1] as usize];
        order.sort_unstable_by(|&a, &b| bytes(a).cmp(bytes(b)));
        let mut lcp = Vec::with_capacity(order.len());
        let mut max_len = 0;
        for (i, &id) in order.iter().enumerate() {
            let b = bytes(id);
            max_len = max_len.max(b.len());
            let shared = if i == 0 {
                0
            } else {
                let p = bytes(order[i - 1]);
                p.iter().zip(b).take_while(|(x, y)| x == y).count()
            };
            lcp.push(shared as u16);
        }
        JsonVocab {
            n_vocab: n,
            order,
            lcp,
            max_len,
            eog: tokenizer.eog_ids().to_vec(),
            offsets,
            data,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.offsets.len() {
            return &[];
        }
        &self.data[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// The same precomputed data with an empty mask cache (benchmarks of cold masks).
    pub fn new_from(other: &JsonVocab) -> Self {
        JsonVocab {
            n_vocab: other.n_vocab,
            order: other.order.clone(),
            lcp: other.lcp.clone(),
            offsets: other.offsets.clone(),
            data: other.data.clone(),
            max_len: other.max_len,
            eog: other.eog.clone(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Walk the sorted tokens from `start`, setting every token whose bytes the automaton
    /// accepts (and, with `budget`, after which the value can still be closed in `budget`
    /// more bytes).
    fn walk<G: Grammar>(&self, g: &G, start: G::State, budget: Option<usize>) -> TokenMask {
        let mut mask = TokenMask::new(self.n_vocab);
        if g.is_complete(&start) {
            for &e in &self.eog {
                mask.set(e);
            }
            if g.is_done(&start) && !self.eog.is_empty() {
                // Only whitespace could follow: stop instead.
                return mask;
            }
        }
        let mut states = vec![start; self.max_len + 1];
        let mut valid = 0usize; // states[0..=valid] hold the current token's prefixes
        let mut i = 0;
        while i < self.order.len() {
            let id = self.order[i];
            let b = self.bytes(id);
            let mut k = (self.lcp[i] as usize).min(valid);
            let mut ok = true;
            while k < b.len() {
                let mut s = states[k];
                if !g.step(&mut s, b[k]) {
                    ok = false;
                    break;
                }
                states[k + 1] = s;
                k += 1;
            }
            valid = k;
            i += 1;
            if ok {
                if budget.is_none_or(|left| g.distance(&states[k]) <= left) {
                    mask.set(id);
                }
            } else {
                // Every following token that shares b[..=k] is refused too.
                while i < self.order.len() && self.lcp[i] as usize > k {
                    i += 1;
                }
            }
        }
        mask
    }

    /// The tokens allowed in `state` of grammar `g` (no budget), from the cache when
    /// possible.
    pub fn mask<G: Grammar>(&self, g: &G, state: &G::State) -> Arc<TokenMask> {
        let key = g.key(state);
        if let Some(m) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return m.clone();
        }
        let m = Arc::new(self.walk(g, *state, None));
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if c.len() >= CACHE_CAP {
            c.clear();
        }
        c.insert(key, m.clone());
        m
    }

    /// Number of cached masks.
    pub fn cached_masks(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }
}

/// What a constraint holds to: plain JSON, or a schema.
#[derive(Clone)]
enum Mode {
    Json(JsonState),
    Schema(Arc<Schema>, SchemaState),
}

/// The JSON constraint of one generation: the shared vocabulary data, the grammar (plain
/// JSON or a schema) and the parser state.
#[derive(Clone)]
pub struct JsonConstraint {
    vocab: Arc<JsonVocab>,
    mode: Mode,
}

impl JsonConstraint {
    /// A constraint at the start of a text whose top-level value is `root`.
    pub fn new(vocab: Arc<JsonVocab>, root: Root) -> Self {
        JsonConstraint {
            vocab,
            mode: Mode::Json(JsonState::new(root)),
        }
    }

    /// A constraint at the start of a document valid against `schema`.
    pub fn with_schema(vocab: Arc<JsonVocab>, schema: Arc<Schema>) -> Self {
        JsonConstraint {
            vocab,
            mode: Mode::Schema(schema, SchemaState::new()),
        }
    }

    /// The plain-JSON parser state (`None` under a schema).
    pub fn state(&self) -> Option<&JsonState> {
        match &self.mode {
            Mode::Json(s) => Some(s),
            Mode::Schema(..) => None,
        }
    }

    /// True when the text so far is a complete JSON value (valid against the schema).
    pub fn is_complete(&self) -> bool {
        match &self.mode {
            Mode::Json(s) => s.is_complete(),
            Mode::Schema(g, s) => g.is_complete(s),
        }
    }

    /// The fewest bytes that complete the text from here.
    pub fn distance(&self) -> usize {
        match &self.mode {
            Mode::Json(s) => s.distance(),
            Mode::Schema(g, s) => g.distance(s),
        }
    }

    /// The allowed tokens now, given that at most `remaining` tokens (this one included) may
    /// still be generated. When no token can keep the value closable in the budget, the
    /// grammar-only mask is returned (best effort).
    pub fn allowed(&self, remaining: Option<usize>) -> Arc<TokenMask> {
        match &self.mode {
            Mode::Json(s) => self.allowed_in(&Json, s, remaining),
            Mode::Schema(g, s) => self.allowed_in(&**g, s, remaining),
        }
    }

    fn allowed_in<G: Grammar>(
        &self,
        g: &G,
        state: &G::State,
        remaining: Option<usize>,
    ) -> Arc<TokenMask> {
        let mask = self.vocab.mask(g, state);
        let Some(rem) = remaining else {
            return mask;
        };
        let left = rem.saturating_sub(1);
        let dist = g.distance(state);
        let growth = g.max_growth();
        if dist.saturating_add(growth.saturating_mul(self.vocab.max_len)) <= left {
            return mask;
        }
        // The budget may bind: check each allowed token whose bytes could push the distance
        // past what is left.
        let mut tight = TokenMask::new(self.vocab.n_vocab);
        for t in mask.iter() {
            let b = self.vocab.bytes(t);
            let ok = if b.is_empty() {
                g.is_complete(state) // end of generation
            } else if dist.saturating_add(growth.saturating_mul(b.len())) <= left {
                true
            } else {
                let mut s = *state;
                g.feed(&mut s, b) && g.distance(&s) <= left
            };
            if ok {
                tight.set(t);
            }
        }
        if tight.count() == 0 {
            mask
        } else {
            Arc::new(tight)
        }
    }

    /// Sample the next token under the constraint (and the budget) and advance the state.
    pub fn sample(
        &mut self,
        sampler: &mut Sampler,
        logits: &mut [f32],
        remaining: Option<usize>,
    ) -> u32 {
        let mask = self.allowed(remaining);
        let id = sampler.sample_masked(logits, |t| mask.contains(t));
        self.accept(id);
        id
    }

    /// Advance over token `id`; false if the grammar does not allow it (the state is then
    /// left unchanged).
    pub fn accept(&mut self, id: u32) -> bool {
        let vocab = &self.vocab;
        match &mut self.mode {
            Mode::Json(s) => accept_in(vocab, &Json, s, id),
            Mode::Schema(g, s) => accept_in(vocab, &**g, s, id),
        }
    }
}

fn accept_in<G: Grammar>(vocab: &JsonVocab, g: &G, state: &mut G::State, id: u32) -> bool {
    if vocab.eog.contains(&id) {
        return g.is_complete(state);
    }
    let b = vocab.bytes(id);
    if b.is_empty() {
        return false;
    }
    let mut s = *state;
    if g.feed(&mut s, b) {
        *state = s;
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplerConfig;
    use crate::synthetic::byte_tokenizer;

    #[test]
    fn walk_equals_brute_force() {
        let tok = byte_tokenizer(&[
            "{\"", "\":", "\"}", "true", "tru", "}}", "]}", "1.5e", "\\u", "\\uD83D",
        ]);
        let v = JsonVocab::new(&tok);
        for prefix in [
            "",
            "{",
            "{\"a",
            "{\"a\":",
            "{\"a\":[",
            "{\"a\":[1",
            "{\"a\":[1]",
            "{\"a\":[1]}",
            "{\"a\":\"\\",
            "{\"a\":\"\\u",
        ] {
            let mut st = JsonState::new(Root::Object);
            assert!(st.feed(prefix.as_bytes()));
            let m = v.walk(&Json, st, None);
            for id in 0..tok.vocab_size() as u32 {
                let want = if tok.is_eog(id) {
                    st.is_complete()
                } else {
                    !st.is_done() && {
                        let mut s = st;
                        s.feed(tok.piece(id))
                    }
                };
                assert_eq!(
                    m.contains(id),
                    want,
                    "prefix {prefix:?} token {:?}",
                    tok.piece(id)
                );
            }
        }
    }

    #[test]
    fn random_logits_always_give_valid_json_within_budget() {
        let tok = byte_tokenizer(&["{\"", "\":", "\"}", "true", "[[[[", "\\uD83D", "  ", "\"\n"]);
        let v = Arc::new(JsonVocab::new(&tok));
        let mut rng = 12345u64;
        for seed in 0..200 {
            let mut c = JsonConstraint::new(
                v.clone(),
                if seed % 2 == 0 {
                    Root::Object
                } else {
                    Root::Any
                },
            );
            let mut s = Sampler::new(SamplerConfig {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..Default::default()
            });
            let budget = 5 + (seed as usize % 40);
            let mut out = Vec::new();
            for n in 0..budget {
                let mut logits: Vec<f32> = (0..tok.vocab_size())
                    .map(|_| {
                        rng = rng
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        (rng >> 40) as f32 / (1u64 << 24) as f32 * 4.0
                    })
                    .collect();
                let id = c.sample(&mut s, &mut logits, Some(budget - n));
                if tok.is_eog(id) {
                    break;
                }
                out.extend_from_slice(tok.piece(id));
            }
            assert!(
                serde_json::from_slice::<serde_json::Value>(&out).is_ok(),
                "seed {seed}: {}",
                String::from_utf8_lossy(&out)
            );
        }
    }
}
