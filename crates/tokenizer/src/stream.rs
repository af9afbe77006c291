//! Incremental detokenization for streaming output.

use crate::Tokenizer;

/// Turns a stream of token ids into text without ever emitting half a UTF-8
/// character: byte-level BPE tokens often split one character (emoji, CJK)
/// across several tokens, and SentencePiece spells a character outside its
/// vocabulary as one `<0xXX>` token per byte, so bytes of an unfinished
/// character are held back.
///
/// The concatenation of everything returned by [`push`](Self::push) and
/// [`flush`](Self::flush) equals [`Tokenizer::decode`] of the same ids,
/// including where invalid bytes become U+FFFD. (One exception: for a
/// SentencePiece vocabulary with `add_space_prefix`, `decode` drops the first
/// token's leading space, as llama.cpp's detokenizer does; a stream is a
/// continuation, so it keeps it, as llama.cpp's per-token pieces do.)
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token and returns the text that is now complete (maybe empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tok.token_bytes(id));
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // Safe: `valid_up_to` bytes were just validated.
                    out.push_str(std::str::from_utf8(&rest[..good]).expect("validated prefix"));
                    match e.error_len() {
                        // Definitely invalid: replace it now, exactly as the
                        // lossy conversion in `decode` would.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &rest[good + bad..];
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            rest = &rest[good..];
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }

    /// Returns whatever is still held back (an unfinished character becomes U+FFFD).
    pub fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
