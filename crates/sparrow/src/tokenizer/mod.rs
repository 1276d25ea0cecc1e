//! Byte-level BPE tokenizer (GPT-2 / Qwen2 / Llama 3 style) built from GGUF
//! tokenizer metadata, following llama.cpp's semantics.
//!
//! Build a [`TokenizerSpec`] (from plain data, or with
//! [`TokenizerSpec::from_gguf`]) and turn it into a [`Tokenizer`] with
//! [`Tokenizer::from_spec`]. Use [`StreamDecoder`] to turn generated ids into
//! text incrementally.

pub mod bpe;
pub mod bytes;
mod gguf;
pub mod pretokenize;
pub mod spm;
mod stream;

use std::collections::HashMap;

pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;

use bpe::{BpeScratch, MergeMap, NO_TOKEN};

/// The type of a vocabulary entry (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// Ordinary byte-level BPE token (1).
    Normal,
    /// The unknown token (2).
    Unknown,
    /// Control token such as `<|im_start|>` (3).
    Control,
    /// User-defined (added) token, matched in text even without
    /// `parse_special` (4).
    UserDefined,
    /// Unused placeholder (5); never produced by encoding, renders as nothing.
    Unused,
    /// Byte token such as `<0x0A>` (6).
    Byte,
}

impl TokenType {
    /// The type for a GGUF `token_type` value, `None` for values outside 1..=6.
    pub fn from_i32(v: i32) -> Option<TokenType> {
        Some(match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }
}

/// Everything needed to build a [`Tokenizer`], as found in GGUF metadata.
#[derive(Debug, Clone, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE with a merge list) or `"llama"`
    /// (SentencePiece-style BPE by token scores, [`spm`]).
    pub model: String,
    /// `tokenizer.ggml.pre`, e.g. `"qwen2"`, `"llama-bpe"`; `None` or an unknown
    /// value selects the GPT-2 split (with a warning).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, same length as `tokens` (empty: all normal).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`, `"left right"` in rank order (`gpt2` only).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores`, one per token (`llama` only).
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (detected from the vocabulary if absent).
    pub eot: Option<u32>,
    /// `tokenizer.ggml.eom_token_id` (detected from the vocabulary if absent).
    pub eom: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; when absent llama.cpp's default for the
    /// pre-tokenizer applies (true for the Llama 3 family, false otherwise).
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token` (default false).
    pub add_eos: Option<bool>,
}

/// Why a [`Tokenizer`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` is not a supported tokenizer type.
    #[error(
        "unsupported tokenizer model {0:?} (supported: \"gpt2\" byte-level BPE, \"llama\" \
         SentencePiece-style BPE)"
    )]
    UnsupportedModel(String),
    /// The vocabulary has no tokens.
    #[error("the vocabulary is empty")]
    EmptyVocab,
    /// More tokens than ids can address.
    #[error("the vocabulary has {0} tokens, more than a u32 id can address")]
    VocabTooLarge(usize),
    /// `token_type` does not have one entry per token.
    #[error("token_type has {types} entries but the vocabulary has {tokens} tokens")]
    TypeCountMismatch {
        /// Number of tokens.
        tokens: usize,
        /// Number of token types.
        types: usize,
    },
    /// A `token_type` value outside 1..=6.
    #[error("token {id} has invalid token type {ty}")]
    InvalidTokenType {
        /// The token id.
        id: u32,
        /// The type value found.
        ty: i32,
    },
    /// A merge rule without a separating space.
    #[error("merge rule #{index} {merge:?} is not of the form \"left right\"")]
    MalformedMerge {
        /// Position of the merge in the list.
        index: usize,
        /// The rule text.
        merge: String,
    },
    /// A merge rule whose parts or result are not vocabulary tokens.
    #[error("merge rule #{index} {merge:?} names {token:?}, which is not in the vocabulary")]
    MergeUnknownToken {
        /// Position of the merge in the list.
        index: usize,
        /// The rule text.
        merge: String,
        /// The missing token text.
        token: String,
    },
    /// Inconsistent tokenizer data not covered by the other variants.
    #[error("tokenizer metadata: {0}")]
    Metadata(String),
    /// Missing or mistyped GGUF metadata.
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] sparrow_gguf::GgufError),
}

/// Texts llama.cpp treats as end-of-turn when no `eot_token_id` is given
/// (in priority order).
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts llama.cpp marks as end-of-generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
];

/// A byte-level BPE tokenizer. Cheap to share: all methods take `&self`.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    tokens: Vec<String>,
    types: Vec<TokenType>,
    piece_data: Vec<u8>,
    piece_offsets: Vec<u32>,
    text_to_id: HashMap<String, u32>,
    merges: MergeMap,
    byte_ids: [u32; 256],
    /// Set for SentencePiece-style vocabularies, which encode by [`spm::Spm`] instead of
    /// the pre-tokenizer and merge list.
    spm: Option<spm::Spm>,
    pre: PreTokenizer,
    ignore_merges: bool,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
    warnings: Vec<String>,
}

#[derive(Clone, Copy)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

impl Tokenizer {
    /// Builds a tokenizer from metadata. Fails on unsupported models and on
    /// inconsistent data; never panics.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Tokenizer, TokenizerError> {
        let TokenizerSpec {
            model,
            pre,
            tokens,
            token_types,
            merges,
            scores,
            bos,
            eos,
            eot,
            eom,
            pad,
            add_bos,
            add_eos,
        } = spec;
        let is_spm = match model.as_str() {
            "gpt2" => false,
            "llama" => true,
            _ => return Err(TokenizerError::UnsupportedModel(model)),
        };
        let n = tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n >= u32::MAX as usize {
            return Err(TokenizerError::VocabTooLarge(n));
        }
        let mut warnings = Vec::new();

        let mut types = Vec::with_capacity(n);
        if token_types.is_empty() {
            types.resize(n, TokenType::Normal);
        } else if token_types.len() != n {
            return Err(TokenizerError::TypeCountMismatch {
                tokens: n,
                types: token_types.len(),
            });
        } else {
            for (i, &t) in token_types.iter().enumerate() {
                types.push(
                    TokenType::from_i32(t).ok_or(TokenizerError::InvalidTokenType {
                        id: i as u32,
                        ty: t,
                    })?,
                );
            }
        }

        let (pre_tok, llama3_family) = match pre.as_deref() {
            // SentencePiece vocabularies have no pre-tokenizer.
            _ if is_spm => (PreTokenizer::Gpt2, false),
            None => {
                warnings.push(
                    "tokenizer.ggml.pre is missing; using the default GPT-2 pre-tokenizer"
                        .to_string(),
                );
                (PreTokenizer::Gpt2, false)
            }
            Some(name) => match PreTokenizer::from_name(name) {
                Some(p) => (p, p == PreTokenizer::Llama3),
                None => {
                    warnings.push(format!(
                        "unknown pre-tokenizer {name:?}; using the default GPT-2 split \
                         (tokenization may differ from the model's)"
                    ));
                    (PreTokenizer::Gpt2, false)
                }
            },
        };

        // Later duplicates win, like llama.cpp's token_to_id map.
        let mut text_to_id: HashMap<String, u32> = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            text_to_id.insert(t.clone(), i as u32);
        }

        let mut merge_map = MergeMap::default();
        merge_map.reserve(merges.len());
        let mut joined = String::new();
        for (index, m) in merges.iter().enumerate() {
            // Like llama.cpp: the first space after the first byte separates
            // the parts (a space byte is never inside a multi-byte character).
            let split = m
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|p| p + 1);
            let Some(sp) = split else {
                return Err(TokenizerError::MalformedMerge {
                    index,
                    merge: m.clone(),
                });
            };
            let (left, right) = (&m[..sp], &m[sp + 1..]);
            let lookup = |s: &str| {
                text_to_id
                    .get(s)
                    .copied()
                    .ok_or_else(|| TokenizerError::MergeUnknownToken {
                        index,
                        merge: m.clone(),
                        token: s.to_string(),
                    })
            };
            let l = lookup(left)?;
            let r = lookup(right)?;
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let merged = lookup(&joined)?;
            merge_map
                .entry(bpe::pair_key(l, r))
                .or_insert((index as u32, merged));
        }

        let spm = if is_spm {
            if scores.len() != n {
                return Err(TokenizerError::Metadata(format!(
                    "a \"llama\" tokenizer needs one score per token: {} scores for {n} tokens",
                    scores.len()
                )));
            }
            // Byte fallback: `<0xNN>`, else the byte as a one-character token, else unknown.
            let unk = types.iter().position(|&t| t == TokenType::Unknown);
            let mut byte_ids = [0u32; 256];
            for (b, slot) in byte_ids.iter_mut().enumerate() {
                let hex = format!("<0x{b:02X}>");
                let raw = (b < 0x80).then(|| (b as u8 as char).to_string());
                *slot = text_to_id
                    .get(&hex)
                    .or_else(|| raw.and_then(|r| text_to_id.get(&r)))
                    .copied()
                    .or(unk.map(|u| u as u32))
                    .unwrap_or(0);
            }
            Some(spm::Spm { scores, byte_ids })
        } else {
            None
        };

        let mut byte_ids = [NO_TOKEN; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let c = bytes::byte_to_char(b as u8);
            if let Some(&id) = text_to_id.get(c.encode_utf8(&mut [0u8; 4]) as &str) {
                *slot = id;
            }
        }

        if !is_spm {
            let missing: Vec<String> = (0..256)
                .filter(|&b| byte_ids[b] == NO_TOKEN)
                .map(|b| format!("0x{b:02X}"))
                .collect();
            if !missing.is_empty() {
                warnings.push(format!(
                    "the vocabulary has no token for {} of the 256 bytes ({}): text containing \
                     them cannot be encoded, and those bytes are left out",
                    missing.len(),
                    missing.join(", ")
                ));
            }
        }

        let check_id = |name: &str, id: Option<u32>, warnings: &mut Vec<String>| match id {
            Some(i) if (i as usize) >= n => {
                warnings.push(format!(
                    "{name} token id {i} is outside the vocabulary ({n} tokens); ignored"
                ));
                None
            }
            other => other,
        };
        let bos = check_id("bos", bos, &mut warnings);
        let eos = check_id("eos", eos, &mut warnings);
        let mut eot = check_id("eot", eot, &mut warnings);
        let mut eom = check_id("eom", eom, &mut warnings);
        let pad = check_id("padding", pad, &mut warnings);

        // Detect special tokens by text as llama.cpp does, forcing their type
        // to control.
        let find = |list: &[&str]| list.iter().find_map(|t| text_to_id.get(*t).copied());
        let mut force_control = |id: u32, types: &mut Vec<TokenType>| {
            let t = &mut types[id as usize];
            if *t != TokenType::Control {
                warnings.push(format!(
                    "control-looking token {id} {:?} was not control-type; treating it as control",
                    tokens[id as usize]
                ));
                *t = TokenType::Control;
            }
        };
        if eot.is_none() {
            eot = find(EOT_TEXTS);
            if let Some(id) = eot {
                force_control(id, &mut types);
            }
        }
        if eom.is_none() {
            eom = find(EOM_TEXTS);
            if let Some(id) = eom {
                force_control(id, &mut types);
            }
        }
        let mut eog: Vec<u32> = Vec::new();
        for (list, is_eog) in [
            (FIM_PRE_TEXTS, false),
            (FIM_SUF_TEXTS, false),
            (FIM_MID_TEXTS, false),
            (FIM_PAD_TEXTS, true),
            (FIM_REP_TEXTS, true),
            (FIM_SEP_TEXTS, true),
        ] {
            if let Some(id) = find(list) {
                force_control(id, &mut types);
                if is_eog {
                    eog.push(id);
                }
            }
        }
        for text in EOG_TEXTS {
            if let Some(&id) = text_to_id.get(*text) {
                force_control(id, &mut types);
                eog.push(id);
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                matches!(
                    types[i as usize],
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                ) && !tokens[i as usize].is_empty()
            })
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));

        let mut piece_data = Vec::new();
        let mut piece_offsets = Vec::with_capacity(n + 1);
        piece_offsets.push(0u32);
        for (t, ty) in tokens.iter().zip(&types) {
            match ty {
                // SentencePiece pieces are text with `▁` for spaces (user-defined ones too,
                // as llama.cpp renders them).
                TokenType::Normal | TokenType::UserDefined if is_spm => {
                    piece_data.extend_from_slice(t.replace(spm::SPACE, " ").as_bytes())
                }
                TokenType::Normal => bytes::decode_into(t, &mut piece_data),
                TokenType::Control | TokenType::UserDefined | TokenType::Unknown => {
                    piece_data.extend_from_slice(t.as_bytes())
                }
                TokenType::Unused => {}
                TokenType::Byte => match parse_byte_token(t) {
                    Some(b) => piece_data.push(b),
                    None => bytes::decode_into(t, &mut piece_data),
                },
            }
            let off = u32::try_from(piece_data.len())
                .map_err(|_| TokenizerError::Metadata("token texts exceed 4 GiB".into()))?;
            piece_offsets.push(off);
        }

        Ok(Tokenizer {
            tokens,
            types,
            piece_data,
            piece_offsets,
            text_to_id,
            merges: merge_map,
            byte_ids,
            spm,
            pre: pre_tok,
            ignore_merges: llama3_family,
            specials,
            bos,
            eos,
            eot,
            eom,
            pad,
            // llama.cpp's defaults: SentencePiece vocabularies add BOS, byte-level ones only
            // for the Llama 3 family.
            add_bos: add_bos.unwrap_or(llama3_family || is_spm),
            add_eos: add_eos.unwrap_or(false),
            eog,
            warnings,
        })
    }

    /// Tokenizes `text`.
    ///
    /// With `add_special`, BOS/EOS are added as the metadata asks
    /// ([`Tokenizer::adds_bos`], [`Tokenizer::adds_eos`]). With
    /// `parse_special`, the text of control tokens (e.g. `<|im_start|>`) is
    /// recognised as those tokens; user-defined tokens are always recognised.
    /// Longer special texts are matched first, as in llama.cpp.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        let fragments = self.partition(text, parse_special);
        let mut state = EncodeState::default();
        for f in fragments {
            match f {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(s, e) => self.encode_plain(&text[s..e], &mut state, &mut out),
            }
        }
        if add_special && self.add_eos {
            if let Some(e) = self.eos {
                out.push(e);
            }
        }
        out
    }

    /// Splits `text` on special-token texts: for each special token, longest
    /// first, every remaining text fragment is split at its occurrences.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(0, text.len())];
        for &sid in &self.specials {
            let ty = self.types[sid as usize];
            if !parse_special && matches!(ty, TokenType::Control | TokenType::Unknown) {
                continue;
            }
            let pat = self.tokens[sid as usize].as_str();
            let mut rebuilt: Option<Vec<Fragment>> = None;
            for (fi, f) in frags.iter().enumerate() {
                match *f {
                    Fragment::Text(s, e) => {
                        let sub = &text[s..e];
                        let mut hits = sub.match_indices(pat).peekable();
                        if hits.peek().is_none() {
                            if let Some(r) = rebuilt.as_mut() {
                                r.push(*f);
                            }
                            continue;
                        }
                        let r = rebuilt.get_or_insert_with(|| frags[..fi].to_vec());
                        let mut cur = s;
                        for (off, m) in hits {
                            let at = s + off;
                            if at > cur {
                                r.push(Fragment::Text(cur, at));
                            }
                            r.push(Fragment::Token(sid));
                            cur = at + m.len();
                        }
                        if cur < e {
                            r.push(Fragment::Text(cur, e));
                        }
                    }
                    Fragment::Token(_) => {
                        if let Some(r) = rebuilt.as_mut() {
                            r.push(*f);
                        }
                    }
                }
            }
            if let Some(r) = rebuilt {
                frags = r;
            }
        }
        frags
    }

    fn encode_plain<'t>(&self, text: &'t str, st: &mut EncodeState<'t>, out: &mut Vec<u32>) {
        if let Some(spm) = &self.spm {
            return spm.encode(&spm::escape_spaces(text), &self.text_to_id, out);
        }
        self.pre.split(text, |word| {
            if let Some(&(start, len)) = st.cache.get(word) {
                out.extend_from_slice(&st.cache_ids[start as usize..(start + len) as usize]);
                return;
            }
            let before = out.len();
            let mut done = false;
            if self.ignore_merges {
                st.buf.clear();
                bytes::encode_into(word.as_bytes(), &mut st.buf);
                if let Some(&id) = self.text_to_id.get(st.buf.as_str()) {
                    out.push(id);
                    done = true;
                }
            }
            if !done {
                bpe::merge_word(
                    word.as_bytes(),
                    &self.byte_ids,
                    &self.merges,
                    &mut st.scratch,
                    out,
                );
            }
            let start = st.cache_ids.len() as u32;
            st.cache_ids.extend_from_slice(&out[before..]);
            st.cache.insert(word, (start, (out.len() - before) as u32));
        });
    }

    /// The bytes token `id` stands for, as an owned vector. Control and
    /// user-defined tokens render as their text, unused tokens as nothing;
    /// out-of-range ids give an empty vector.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.piece(id).to_vec()
    }

    /// Like [`Tokenizer::token_to_piece`] but borrowed.
    pub fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_offsets.len() {
            return &[];
        }
        &self.piece_data[self.piece_offsets[i] as usize..self.piece_offsets[i + 1] as usize]
    }

    /// Concatenated bytes of the pieces of `ids`.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.piece(id));
        }
        out
    }

    /// Decodes `ids` to text (special tokens rendered as their text; invalid
    /// UTF-8 replaced by U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// True if generating `id` should end generation (EOS, EOT, EOM, the
    /// well-known end markers such as `<|im_end|>`/`<|endoftext|>` and the
    /// FIM pad/repo/file-separator tokens, as llama.cpp decides).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (from metadata or detected by text).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// End-of-message token (from metadata or detected by text).
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }

    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn adds_eos(&self) -> bool {
        self.add_eos
    }

    /// The id of the token whose vocabulary text is exactly `text` (byte-level
    /// form for normal tokens, e.g. `"Ġthe"`; plain text for special tokens).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.text_to_id.get(text).copied()
    }

    /// The vocabulary text of token `id`.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The type of token `id` (after llama.cpp's fix-ups of control-looking
    /// tokens).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The pre-tokenizer in use.
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// Non-fatal problems found while building (unknown pre-tokenizer,
    /// out-of-range special ids, retyped tokens) for the caller to show.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

#[derive(Default)]
struct EncodeState<'t> {
    cache: HashMap<&'t str, (u32, u32)>,
    cache_ids: Vec<u32>,
    scratch: BpeScratch,
    buf: String,
}

/// Parses `<0xNN>`.
fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests;
