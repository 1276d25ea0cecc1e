//! Pre-tokenizers: split text into the "words" that BPE merges never cross.
//!
//! The splits are hand-written equivalents of the regular expressions used by
//! llama.cpp (which in turn mirror the Hugging Face `tokenizer.json` files).
//! They are tested equal to those expressions run through `fancy-regex`.
//!
//! * GPT-2 (the default):
//!   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! * Qwen2: `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//!   (the `(?i:'s|...)` group of `tokenizer.json` written out with ASCII
//!   case classes, exactly as llama.cpp does).
//! * Llama 3 (`llama-bpe`): as Qwen2 but with `\p{N}{1,3}`.
//! * SmolLM (`smollm`): two expressions in turn, as llama.cpp applies them: `\p{N}` (every
//!   digit its own piece), then GPT-2's on the text between digits.

use std::sync::OnceLock;

/// Which split a tokenizer uses before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// The original GPT-2 split (also used for unknown `tokenizer.ggml.pre`).
    Gpt2,
    /// Qwen2 / Qwen2.5 (`tokenizer.ggml.pre = "qwen2"`): single digits.
    Qwen2,
    /// Llama 3 (`llama-bpe`, `llama3`, ...): digits in groups of up to three.
    Llama3,
    /// SmolLM (`smollm`): every digit alone, GPT-2's split between them.
    Smollm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

struct Tables {
    letter: Vec<(u32, u32)>,
    number: Vec<(u32, u32)>,
    space: Vec<(u32, u32)>,
    ascii: [Class; 128],
}

/// The code point ranges of a single-class pattern such as `\p{L}`, taken from
/// `regex-syntax` so that the classes are exactly those of the regex engines.
fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class as HirClass, HirKind};
    let Ok(hir) = regex_syntax::Parser::new().parse(pattern) else {
        return Vec::new();
    };
    match hir.kind() {
        HirKind::Class(HirClass::Unicode(cls)) => cls
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        _ => Vec::new(),
    }
}

fn in_ranges(ranges: &[(u32, u32)], cp: u32) -> bool {
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                std::cmp::Ordering::Less
            } else if lo > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut t = Tables {
            letter: class_ranges(r"\p{L}"),
            number: class_ranges(r"\p{N}"),
            space: class_ranges(r"\s"),
            ascii: [Class::Other; 128],
        };
        for cp in 0..128u32 {
            t.ascii[cp as usize] = classify_slow(&t, cp);
        }
        t
    })
}

fn classify_slow(t: &Tables, cp: u32) -> Class {
    if in_ranges(&t.letter, cp) {
        Class::Letter
    } else if in_ranges(&t.number, cp) {
        Class::Number
    } else if in_ranges(&t.space, cp) {
        Class::Space
    } else {
        Class::Other
    }
}

#[inline]
fn classify(t: &Tables, c: char) -> Class {
    let cp = c as u32;
    if cp < 128 {
        t.ascii[cp as usize]
    } else {
        classify_slow(t, cp)
    }
}

#[inline]
fn is_newline(c: char) -> bool {
    c == '\r' || c == '\n'
}

impl PreTokenizer {
    /// Maps a `tokenizer.ggml.pre` value to a pre-tokenizer; `None` when the
    /// value is not known (callers fall back to [`PreTokenizer::Gpt2`]).
    pub fn from_name(name: &str) -> Option<PreTokenizer> {
        match name {
            "qwen2" => Some(PreTokenizer::Qwen2),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => Some(PreTokenizer::Llama3),
            "default" | "gpt-2" | "gpt2" => Some(PreTokenizer::Gpt2),
            "smollm" => Some(PreTokenizer::Smollm),
            _ => None,
        }
    }

    /// Splits `text` into pre-tokens, calling `emit` with each one in order.
    /// The pieces are non-empty and concatenate to `text`.
    pub fn split<'a>(&self, text: &'a str, mut emit: impl FnMut(&'a str)) {
        if *self != PreTokenizer::Smollm {
            return self.split_words(text, &mut emit);
        }
        let t = tables();
        let mut from = 0;
        for (p, c) in text.char_indices() {
            if classify(t, c) == Class::Number {
                PreTokenizer::Gpt2.split_words(&text[from..p], &mut emit);
                emit(&text[p..p + c.len_utf8()]);
                from = p + c.len_utf8();
            }
        }
        PreTokenizer::Gpt2.split_words(&text[from..], &mut emit);
    }

    /// One expression's split (every pre-tokenizer but SmolLM's two passes).
    fn split_words<'a, F: FnMut(&'a str)>(&self, text: &'a str, emit: &mut F) {
        if text.is_empty() {
            return;
        }
        let t = tables();
        let mut cs: Vec<char> = Vec::with_capacity(text.len());
        let mut pos: Vec<usize> = Vec::with_capacity(text.len() + 1);
        let mut cls: Vec<Class> = Vec::with_capacity(text.len());
        for (p, c) in text.char_indices() {
            cs.push(c);
            pos.push(p);
            cls.push(classify(t, c));
        }
        pos.push(text.len());
        let n = cs.len();

        let scan = Scan {
            cs: &cs,
            cls: &cls,
            gpt2: *self == PreTokenizer::Gpt2,
            max_digits: match self {
                PreTokenizer::Gpt2 | PreTokenizer::Smollm => usize::MAX,
                PreTokenizer::Qwen2 => 1,
                PreTokenizer::Llama3 => 3,
            },
        };
        let mut i = 0;
        while i < n {
            let end = scan.match_at(i);
            debug_assert!(end > i);
            let end = end.max(i + 1);
            emit(&text[pos[i]..pos[end]]);
            i = end;
        }
    }
}

/// One text being split: its characters and their classes, and the two ways the
/// expressions differ (GPT-2's case-sensitive contractions and space rules; how many digits
/// one number piece takes).
struct Scan<'a> {
    cs: &'a [char],
    cls: &'a [Class],
    gpt2: bool,
    max_digits: usize,
}

impl Scan<'_> {
    /// The end of the run of `class` characters from `from`.
    fn run(&self, from: usize, class: Class) -> usize {
        let mut j = from;
        while j < self.cls.len() && self.cls[j] == class {
            j += 1;
        }
        j
    }

    /// The end of the piece the expression matches at `i`.
    #[inline]
    fn match_at(&self, i: usize) -> usize {
        let Scan {
            cs,
            cls,
            gpt2,
            max_digits,
        } = *self;
        let n = cs.len();
        let run = |from: usize, class: Class| self.run(from, class);
        let c = cs[i];
        let next = if i + 1 < n { Some(cls[i + 1]) } else { None };

        // Contractions.
        if c == '\'' && i + 1 < n {
            let fold = |ch: char| if gpt2 { ch } else { ch.to_ascii_lowercase() };
            match fold(cs[i + 1]) {
                's' | 't' | 'm' | 'd' => return i + 2,
                a @ ('r' | 'v' | 'l') if i + 2 < n => {
                    let want = if a == 'l' { 'l' } else { 'e' };
                    if fold(cs[i + 2]) == want {
                        return i + 3;
                    }
                }
                _ => {}
            }
        }

        // Letters, with an optional one-character prefix.
        if cls[i] == Class::Letter {
            return run(i, Class::Letter);
        }
        let prefix_ok = if gpt2 {
            c == ' '
        } else {
            cls[i] != Class::Number && !is_newline(c)
        };
        if prefix_ok && next == Some(Class::Letter) {
            return run(i + 1, Class::Letter);
        }

        // Numbers.
        if cls[i] == Class::Number {
            let e = run(i, Class::Number);
            return e.min(i.saturating_add(max_digits));
        }
        if gpt2 && c == ' ' && next == Some(Class::Number) {
            return run(i + 1, Class::Number);
        }

        // Punctuation and symbols, with an optional leading space.
        let punct_end = if cls[i] == Class::Other {
            Some(run(i, Class::Other))
        } else if c == ' ' && next == Some(Class::Other) {
            Some(run(i + 1, Class::Other))
        } else {
            None
        };
        if let Some(mut e) = punct_end {
            if !gpt2 {
                while e < n && is_newline(cs[e]) {
                    e += 1;
                }
            }
            return e;
        }

        // Whitespace (the only class left).
        let e = run(i, Class::Space);
        if !gpt2 {
            // \s*[\r\n]+ : up to and including the last newline of the run.
            if let Some(k) = (i..e).rev().find(|&k| is_newline(cs[k])) {
                return k + 1;
            }
        }
        // \s+(?!\S) then \s+
        if e == n || e - i < 2 {
            e
        } else {
            e - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GPT2_RE: &str =
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
    const QWEN2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const LLAMA3_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    fn regex_for(p: PreTokenizer) -> &'static fancy_regex::Regex {
        static RES: OnceLock<[fancy_regex::Regex; 3]> = OnceLock::new();
        let res = RES.get_or_init(|| {
            [
                fancy_regex::Regex::new(GPT2_RE).unwrap(),
                fancy_regex::Regex::new(QWEN2_RE).unwrap(),
                fancy_regex::Regex::new(LLAMA3_RE).unwrap(),
            ]
        });
        match p {
            PreTokenizer::Gpt2 | PreTokenizer::Smollm => &res[0],
            PreTokenizer::Qwen2 => &res[1],
            PreTokenizer::Llama3 => &res[2],
        }
    }

    fn by_regex(p: PreTokenizer, text: &str) -> Vec<String> {
        if p == PreTokenizer::Smollm {
            // llama.cpp's two passes: `\p{N}` matches and the text between them, then
            // GPT-2's expression on the text between.
            let digit = fancy_regex::Regex::new(r"\p{N}").unwrap();
            let mut out = Vec::new();
            let mut from = 0;
            for m in digit.find_iter(text) {
                let m = m.unwrap();
                out.extend(by_regex(PreTokenizer::Gpt2, &text[from..m.start()]));
                out.push(m.as_str().to_string());
                from = m.end();
            }
            out.extend(by_regex(PreTokenizer::Gpt2, &text[from..]));
            return out;
        }
        regex_for(p)
            .find_iter(text)
            .map(|m| m.unwrap().as_str().to_string())
            .collect()
    }

    fn by_hand(p: PreTokenizer, text: &str) -> Vec<String> {
        let mut v = Vec::new();
        p.split(text, |s| v.push(s.to_string()));
        v
    }

    const ALL: [PreTokenizer; 4] = [
        PreTokenizer::Gpt2,
        PreTokenizer::Qwen2,
        PreTokenizer::Llama3,
        PreTokenizer::Smollm,
    ];

    #[test]
    fn qwen2_examples() {
        let q = PreTokenizer::Qwen2;
        assert_eq!(
            by_hand(q, "Hello world's 123 (a)\n\n  x  "),
            vec!["Hello", " world", "'s", " ", "1", "2", "3", " (", "a", ")\n\n", " ", " x", "  "]
        );
        assert_eq!(by_hand(q, "I'LL DON'T"), vec!["I", "'LL", " DON", "'T"]);
        assert_eq!(by_hand(q, "a\n \n b"), vec!["a", "\n \n", " b"]);
        assert_eq!(by_hand(PreTokenizer::Llama3, "12345"), vec!["123", "45"]);
        assert_eq!(
            by_hand(PreTokenizer::Gpt2, "I'LL x's"),
            vec!["I", "'", "LL", " x", "'s"]
        );
    }

    #[test]
    fn matches_regex_on_tricky_inputs() {
        let cases = [
            "",
            " ",
            "   ",
            "a  ",
            "Hello, World! It's 2024.",
            "I'M YOU'RE WE'VE THEY'LL SHE'D IT'S DON'T",
            "'s 'S 'x '",
            "ſ 'ſ 'K",
            "12345678901 1.5e-3 ٣٤٥ ⅷ ½",
            "你好，世界！今天天气很好。",
            "line1\nline2\r\n\r\nline3\n\n\n",
            "  \n\t\n  foo\t\tbar\u{3000}baz\u{a0}qux",
            "trailing spaces   ",
            "emoji 😀👍🏽 🇫🇷 family 👨‍👩‍👧",
            "<|im_start|>user\n<|im_start <|im_end|",
            "def f(x):\n\treturn x**2  # sq\n",
            "a\u{301}e\u{301} combining",
            "((a)) ...x !!!\n\n?",
            "\u{85}next line\u{2028}sep",
            "x\r\ry\n\rz",
        ];
        for p in ALL {
            for text in cases {
                assert_eq!(by_hand(p, text), by_regex(p, text), "{p:?} on {text:?}");
            }
        }
    }

    fn interesting_char() -> impl Strategy<Value = char> {
        prop_oneof![
            prop::sample::select(vec![
                ' ', ' ', '\n', '\r', '\t', '\'', 's', 'S', 't', 'r', 'e', 'v', 'E', 'l', 'L', 'm',
                'd', 'a', '1', '9', '.', ',', '(', '!', '\u{a0}', '\u{3000}', '\u{85}', '中', '٣',
                '½', '😀', '\u{301}', 'é', '_', '-', '#', 'ſ',
            ]),
            any::<char>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn equals_regex(chars in prop::collection::vec(interesting_char(), 0..40)) {
            let text: String = chars.into_iter().collect();
            for p in ALL {
                let hand = by_hand(p, &text);
                prop_assert_eq!(hand.concat(), text.clone());
                prop_assert_eq!(hand, by_regex(p, &text), "{:?} on {:?}", p, text);
            }
        }
    }
}
