//! Incremental detokenization that only ever returns complete UTF-8 text.

use super::Tokenizer;

/// Turns a stream of token ids into text, holding back the bytes of a
/// multi-byte character until the token that completes it arrives.
///
/// Invalid byte sequences are replaced by U+FFFD as soon as they are known
/// to be invalid; [`StreamDecoder::flush`] replaces an unfinished character
/// left at the end. The concatenation of everything returned equals
/// `String::from_utf8_lossy` of all the token bytes.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds token `id` and returns the text that became complete (possibly
    /// empty). Out-of-range ids contribute no bytes.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.push_bytes(tokenizer.piece(id))
    }

    /// Adds raw bytes and returns the text that became complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            let rest = &self.pending[consumed..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: `from_utf8` validated this prefix.
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            consumed += valid + bad;
                        }
                        None => {
                            // Incomplete character at the end: keep it.
                            consumed += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        out
    }

    /// True if bytes of an unfinished character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: returns leftover bytes as replacement characters (one
    /// U+FFFD per unfinished character) and clears the decoder.
    pub fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(chunks: &[&[u8]]) -> (Vec<String>, String) {
        let mut d = StreamDecoder::new();
        let outs: Vec<String> = chunks.iter().map(|c| d.push_bytes(c)).collect();
        let tail = d.flush();
        (outs, tail)
    }

    #[test]
    fn holds_back_partial_characters() {
        let s = "中😀".as_bytes(); // 3 + 4 bytes
        let (outs, tail) = feed(&[&s[..1], &s[1..4], &s[4..6], &s[6..]]);
        assert_eq!(outs, vec!["", "中", "", "😀"]);
        assert_eq!(tail, "");
    }

    #[test]
    fn invalid_bytes_become_replacement_immediately() {
        let (outs, tail) = feed(&[b"a\xFFb", b"\xE4\xB8"]);
        assert_eq!(outs, vec!["a\u{FFFD}b", ""]);
        assert_eq!(tail, "\u{FFFD}");
    }

    #[test]
    fn broken_sequence_followed_by_ascii() {
        // A lead byte followed by ASCII is invalid once the ASCII arrives.
        let (outs, tail) = feed(&[b"\xE4", b"x"]);
        assert_eq!(outs, vec!["", "\u{FFFD}x"]);
        assert_eq!(tail, "");
    }

    #[test]
    fn equals_lossy_decoding_of_the_whole() {
        let data: &[u8] = b"ok \xF0\x9F\x98\x80 \xC3 \xE4\xB8\xAD\xFF\xF0\x9F";
        for split in 0..data.len() {
            for split2 in split..data.len() {
                let (outs, tail) = feed(&[&data[..split], &data[split..split2], &data[split2..]]);
                let got = outs.concat() + &tail;
                assert_eq!(
                    got,
                    String::from_utf8_lossy(data),
                    "splits {split} {split2}"
                );
            }
        }
    }
}
