//! The GPT-2 byte <-> unicode mapping used by byte-level BPE vocabularies.
//!
//! Every byte value is given a printable character so that token texts can be
//! stored as ordinary strings: the printable bytes `!`..=`~`, `¡`..=`¬` and
//! `®`..=`ÿ` map to the character with the same code point, the remaining 68
//! bytes map, in increasing byte order, to U+0100, U+0101, ... (so a space
//! becomes `Ġ` U+0120 and a newline `Ċ` U+010A).

/// True if byte `b` is represented by the character with the same code point.
const fn is_direct(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn build_byte_to_char() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut next = 0u32;
    let mut b = 0usize;
    while b < 256 {
        if is_direct(b as u8) {
            table[b] = b as u32;
        } else {
            table[b] = 256 + next;
            next += 1;
        }
        b += 1;
    }
    table
}

const fn build_shifted_to_byte() -> [u8; 68] {
    let mut table = [0u8; 68];
    let mut next = 0usize;
    let mut b = 0usize;
    while b < 256 {
        if !is_direct(b as u8) {
            table[next] = b as u8;
            next += 1;
        }
        b += 1;
    }
    table
}

static BYTE_TO_CHAR: [u32; 256] = build_byte_to_char();
static SHIFTED_TO_BYTE: [u8; 68] = build_shifted_to_byte();

/// The character that stands for byte `b` in byte-level token texts.
#[inline]
pub fn byte_to_char(b: u8) -> char {
    // All table entries are < 0x144, hence valid scalar values.
    char::from_u32(BYTE_TO_CHAR[b as usize]).unwrap_or('\u{FFFD}')
}

/// The byte a byte-level character stands for, or `None` if `c` is not part
/// of the mapping.
#[inline]
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 && is_direct(cp as u8) {
        Some(cp as u8)
    } else if (256..256 + 68).contains(&cp) {
        Some(SHIFTED_TO_BYTE[(cp - 256) as usize])
    } else {
        None
    }
}

/// Appends the byte-level encoding of `bytes` to `out`.
pub fn encode_into(bytes: &[u8], out: &mut String) {
    for &b in bytes {
        out.push(byte_to_char(b));
    }
}

/// Decodes a byte-level token text into raw bytes. Characters outside the
/// mapping (which a well-formed vocabulary never contains) are kept as their
/// UTF-8 encoding rather than dropped.
pub fn decode_into(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "duplicate char for byte {b}");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(seen.len(), 256);
    }

    #[test]
    fn well_known_entries() {
        // Values from the GPT-2 `bytes_to_unicode` table.
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(0), 'Ā');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        assert_eq!(byte_to_char(0x7F), 'ġ');
        assert_eq!(char_to_byte('x'), Some(b'x'));
        assert_eq!(char_to_byte('中'), None);
    }

    #[test]
    fn decode_keeps_unmapped_chars() {
        let mut out = Vec::new();
        decode_into("ĠhiĊ中", &mut out);
        assert_eq!(out, b" hi\n\xE4\xB8\xAD");
    }
}
