//! JSON's lexical rules — strings and numbers — shared by the plain JSON automaton
//! ([`super::json`]) and the schema automaton ([`super::schema_state`]), so both accept
//! exactly the same spellings: strings are valid UTF-8 with every escape and surrogate pair
//! checked, numbers follow RFC 8259 with capped digit counts.

/// Most digits before the decimal point, and in an exponent: serde_json refuses numbers
/// beyond f64's range ("number out of range"), so magnitudes stay below 1e120.
pub const MAX_INT_DIGITS: u8 = 20;
pub const MAX_EXP_DIGITS: u8 = 2;

/// JSON whitespace.
pub fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Where we are inside a string (after its opening quote).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Str {
    /// Ordinary characters.
    Normal,
    /// After a backslash.
    Esc,
    /// After `\u`: the first hex digit (a `d` may start a surrogate).
    HexFirst,
    /// After `\ud`: the second digit decides between plain, high and (refused) low surrogate.
    HexSecondD,
    /// `left` hex digits to go; `high`: a high surrogate whose low half must follow.
    Hex {
        left: u8,
        high: bool,
    },
    /// A high surrogate was written: `\`, then `u`, then `d`, then `c`..`f` must follow.
    NeedBackslash,
    NeedU,
    NeedLowD,
    NeedLowCf,
    /// Inside a multi-byte UTF-8 character: `need` continuation bytes, the next in lo..=hi.
    Utf8 {
        need: u8,
        lo: u8,
        hi: u8,
    },
}

/// What one byte does to a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrStep {
    /// Still inside the string.
    Next(Str),
    /// The closing quote.
    Close,
    /// Not allowed here.
    Reject,
}

fn is_hex(b: u8) -> bool {
    b.is_ascii_hexdigit()
}

impl Str {
    /// Advance over byte `b`.
    pub fn step(self, b: u8) -> StrStep {
        let utf8 = |need, lo, hi| StrStep::Next(Str::Utf8 { need, lo, hi });
        let next = match self {
            Str::Normal => match b {
                b'"' => return StrStep::Close,
                b'\\' => Str::Esc,
                0x00..=0x1f => return StrStep::Reject,
                0x20..=0x7f => Str::Normal,
                0xc2..=0xdf => return utf8(1, 0x80, 0xbf),
                0xe0 => return utf8(2, 0xa0, 0xbf),
                0xed => return utf8(2, 0x80, 0x9f),
                0xe1..=0xef => return utf8(2, 0x80, 0xbf),
                0xf0 => return utf8(3, 0x90, 0xbf),
                0xf1..=0xf3 => return utf8(3, 0x80, 0xbf),
                0xf4 => return utf8(3, 0x80, 0x8f),
                _ => return StrStep::Reject,
            },
            Str::Utf8 { need, lo, hi } => {
                if !(lo..=hi).contains(&b) {
                    return StrStep::Reject;
                }
                if need == 1 {
                    Str::Normal
                } else {
                    Str::Utf8 {
                        need: need - 1,
                        lo: 0x80,
                        hi: 0xbf,
                    }
                }
            }
            Str::Esc => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Str::Normal,
                b'u' => Str::HexFirst,
                _ => return StrStep::Reject,
            },
            Str::HexFirst => match b {
                b'd' | b'D' => Str::HexSecondD,
                _ if is_hex(b) => Str::Hex {
                    left: 3,
                    high: false,
                },
                _ => return StrStep::Reject,
            },
            Str::HexSecondD => match b {
                b'0'..=b'7' => Str::Hex {
                    left: 2,
                    high: false,
                },
                b'8' | b'9' | b'a' | b'b' | b'A' | b'B' => Str::Hex {
                    left: 2,
                    high: true,
                },
                // A low surrogate without a high one before it.
                _ => return StrStep::Reject,
            },
            Str::Hex { left, high } => {
                if !is_hex(b) {
                    return StrStep::Reject;
                }
                match (left, high) {
                    (1, true) => Str::NeedBackslash,
                    (1, false) => Str::Normal,
                    _ => Str::Hex {
                        left: left - 1,
                        high,
                    },
                }
            }
            Str::NeedBackslash if b == b'\\' => Str::NeedU,
            Str::NeedU if b == b'u' => Str::NeedLowD,
            Str::NeedLowD if matches!(b, b'd' | b'D') => Str::NeedLowCf,
            Str::NeedLowCf if matches!(b, b'c'..=b'f' | b'C'..=b'F') => Str::Hex {
                left: 2,
                high: false,
            },
            _ => return StrStep::Reject,
        };
        StrStep::Next(next)
    }

    /// The fewest bytes that close the string, the quote included.
    pub fn close_len(self) -> usize {
        match self {
            Str::Normal => 1,
            Str::Esc => 2,
            Str::HexFirst => 5,
            Str::HexSecondD => 4,
            Str::Hex { left, high } => left as usize + if high { 6 } else { 0 } + 1,
            Str::NeedBackslash => 7,
            Str::NeedU => 6,
            Str::NeedLowD => 5,
            Str::NeedLowCf => 4,
            Str::Utf8 { need, .. } => need as usize + 1,
        }
    }

    /// The next byte of the shortest way to close the string.
    pub fn closing_byte(self) -> u8 {
        match self {
            Str::Normal => b'"',
            Str::Esc => b'n',
            Str::HexFirst | Str::HexSecondD | Str::Hex { .. } => b'0',
            Str::NeedBackslash => b'\\',
            Str::NeedU => b'u',
            Str::NeedLowD => b'd',
            Str::NeedLowCf => b'c',
            Str::Utf8 { lo, .. } => lo,
        }
    }
}

/// Where we are inside a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Num {
    Minus,
    Zero,
    /// Integer digits so far.
    Int(u8),
    Dot,
    Frac,
    Exp,
    ExpSign,
    /// Exponent digits so far.
    ExpDigits(u8),
}

impl Num {
    /// The number its first byte starts, if `b` can start one.
    pub fn start(b: u8) -> Option<Num> {
        match b {
            b'-' => Some(Num::Minus),
            b'0' => Some(Num::Zero),
            b'1'..=b'9' => Some(Num::Int(1)),
            _ => None,
        }
    }

    /// True when the bytes so far are a whole number.
    pub fn complete(self) -> bool {
        matches!(
            self,
            Num::Zero | Num::Int(_) | Num::Frac | Num::ExpDigits(_)
        )
    }

    /// The number continued by `b`, or `None` if `b` does not continue it (it may then
    /// follow a complete number). `integer`: no fraction or exponent.
    pub fn step(self, b: u8, integer: bool) -> Option<Num> {
        let digit = b.is_ascii_digit();
        match (self, b) {
            (Num::Minus, b'0') => Some(Num::Zero),
            (Num::Minus, _) if digit => Some(Num::Int(1)),
            (Num::Int(k), _) if digit && k < MAX_INT_DIGITS => Some(Num::Int(k + 1)),
            _ if integer => None,
            (Num::Zero | Num::Int(_), b'.') => Some(Num::Dot),
            (Num::Dot | Num::Frac, _) if digit => Some(Num::Frac),
            (Num::Zero | Num::Int(_) | Num::Frac, b'e' | b'E') => Some(Num::Exp),
            (Num::Exp, b'+' | b'-') => Some(Num::ExpSign),
            (Num::Exp | Num::ExpSign, _) if digit => Some(Num::ExpDigits(1)),
            (Num::ExpDigits(k), _) if digit && k < MAX_EXP_DIGITS => Some(Num::ExpDigits(k + 1)),
            _ => None,
        }
    }
}
