//! Splitting special tokens out of raw text before the model's encoder runs
//! (llama.cpp's `tokenizer_st_partition`).
//!
//! llama.cpp takes the special tokens (control, user-defined and unknown) longest
//! text first and, for each one, splits every still-raw fragment at all its
//! occurrences, left to right. So a longer token wins over a shorter one even
//! when the shorter one starts further left. Doing that for every special token
//! on every call costs a scan of the text per token, and Gemma has 6,414 of them.
//! Here a trie over the token texts first finds which special tokens occur in
//! the text at all (one pass, usually one lookup per byte); only those then go
//! through llama.cpp's splitting, in llama.cpp's order, which gives the same
//! fragments.

use std::cmp::Reverse;

use crate::hash::FastMap;
use crate::tokenizer::{ATTR_CONTROL, ATTR_HIDDEN, ATTR_UNKNOWN, ATTR_USER_DEFINED, NO_ID};

/// A piece of the text to encode: raw text (a byte range) or a special token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frag {
    Text(usize, usize),
    Token(u32),
}

/// The special tokens and a trie over their texts.
pub(crate) struct Specials {
    /// Special token ids in matching order: longest text first, then by id.
    /// (llama.cpp's `std::sort` leaves the order of equal lengths unspecified;
    /// it only matters for two same-length tokens overlapping in the text.)
    order: Vec<u32>,
    /// Whether `order[rank]` is control or unknown, i.e. not matched without `parse_special`.
    hidden: Vec<bool>,
    /// Trie: the root's child for each first byte, or NO_ID.
    root: [u32; 256],
    /// Trie: `(node << 8) | byte` -> child node, below the root.
    children: FastMap<u64, u32>,
    /// Trie: for each node, the index into `ends` of the tokens whose text ends
    /// there, or NO_ID.
    end: Vec<u32>,
    /// Ranks (indices into `order`) of the tokens sharing one text.
    ends: Vec<Vec<u32>>,
}

impl std::fmt::Debug for Specials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Specials").field("tokens", &self.order.len()).field("trie_nodes", &self.end.len()).finish()
    }
}

impl Specials {
    /// Collects the tokens llama.cpp splits out of text: those with the control,
    /// user-defined or unknown attribute (final attributes, after any overrides).
    pub(crate) fn new(tokens: &[String], attrs: &[u16]) -> Self {
        let mut order: Vec<u32> =
            (0..tokens.len() as u32).filter(|&i| attrs[i as usize] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0).collect();
        order.sort_by_key(|&i| Reverse(tokens[i as usize].len()));
        let hidden = order.iter().map(|&i| attrs[i as usize] & ATTR_HIDDEN != 0).collect();

        let mut root = [NO_ID; 256];
        let mut children: FastMap<u64, u32> = FastMap::default();
        // Node 0 is the root; it never ends a token (texts are never empty).
        let mut end = vec![NO_ID];
        let mut ends: Vec<Vec<u32>> = Vec::new();
        for (rank, &id) in order.iter().enumerate() {
            let mut node = 0u32;
            for &b in tokens[id as usize].as_bytes() {
                let next = end.len() as u32;
                let slot = if node == 0 { &mut root[b as usize] } else { children.entry(((node as u64) << 8) | b as u64).or_insert(NO_ID) };
                if *slot == NO_ID {
                    *slot = next;
                    end.push(NO_ID);
                }
                node = *slot;
            }
            let e = &mut end[node as usize];
            if *e == NO_ID {
                *e = ends.len() as u32;
                ends.push(Vec::new());
            }
            ends[*e as usize].push(rank as u32);
        }
        Self { order, hidden, root, children, end, ends }
    }

    /// Ranks of the special tokens that occur somewhere in `text` and may be
    /// matched (`parse_special`, or not hidden), in matching order.
    fn occurring(&self, text: &[u8], parse_special: bool) -> Vec<u32> {
        let mut seen = vec![false; self.ends.len()];
        let mut ranks = Vec::new();
        for start in 0..text.len() {
            let mut node = self.root[text[start] as usize];
            let mut i = start;
            while node != NO_ID {
                let e = self.end[node as usize];
                if e != NO_ID && !seen[e as usize] {
                    seen[e as usize] = true;
                    ranks.extend(self.ends[e as usize].iter().copied().filter(|&r| parse_special || !self.hidden[r as usize]));
                }
                i += 1;
                if i == text.len() {
                    break;
                }
                node = self.children.get(&(((node as u64) << 8) | text[i] as u64)).copied().unwrap_or(NO_ID);
            }
        }
        ranks.sort_unstable();
        ranks
    }

    /// Splits `text` into raw fragments and special tokens. Without
    /// `parse_special`, control and unknown tokens stay text, but user-defined
    /// ones are still split out (llama.cpp / HF behaviour).
    pub(crate) fn partition(&self, text: &str, tokens: &[String], parse_special: bool) -> Vec<Frag> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Frag::Text(0, text.len()));
        let mut next = Vec::new();
        for rank in self.occurring(text.as_bytes(), parse_special) {
            let id = self.order[rank as usize];
            let needle = tokens[id as usize].as_str();
            next.clear();
            for f in frags.drain(..) {
                let Frag::Text(mut a, b) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(m) = text[a..b].find(needle) {
                    if m > 0 {
                        next.push(Frag::Text(a, a + m));
                    }
                    next.push(Frag::Token(id));
                    a += m + needle.len();
                }
                if a < b {
                    next.push(Frag::Text(a, b));
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::ATTR_NORMAL;

    fn specials(texts: &[(&str, u16)]) -> (Vec<String>, Specials) {
        let tokens: Vec<String> = texts.iter().map(|(t, _)| (*t).to_owned()).collect();
        let attrs: Vec<u16> = texts.iter().map(|&(_, a)| a).collect();
        let s = Specials::new(&tokens, &attrs);
        (tokens, s)
    }

    /// llama.cpp's algorithm, literally: every special token, longest first, over every fragment.
    fn reference(text: &str, tokens: &[String], s: &Specials, parse_special: bool) -> Vec<Frag> {
        let mut frags = vec![Frag::Text(0, text.len())];
        if text.is_empty() {
            return Vec::new();
        }
        for (rank, &id) in s.order.iter().enumerate() {
            if !parse_special && s.hidden[rank] {
                continue;
            }
            let needle = tokens[id as usize].as_str();
            let mut next = Vec::new();
            for f in frags {
                let Frag::Text(mut a, b) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(m) = text[a..b].find(needle) {
                    if m > 0 {
                        next.push(Frag::Text(a, a + m));
                    }
                    next.push(Frag::Token(id));
                    a += m + needle.len();
                }
                if a < b {
                    next.push(Frag::Text(a, b));
                }
            }
            frags = next;
        }
        frags
    }

    #[test]
    fn longest_token_wins_even_further_right() {
        let (tokens, s) = specials(&[("ab", ATTR_USER_DEFINED), ("bcd", ATTR_USER_DEFINED), ("x", ATTR_NORMAL)]);
        // "bcd" is longer, so it is split out first, leaving "a" as text.
        assert_eq!(s.partition("abcd", &tokens, false), [Frag::Text(0, 1), Frag::Token(1)]);
        assert_eq!(s.partition("ab ab", &tokens, false), [Frag::Token(0), Frag::Text(2, 3), Frag::Token(0)]);
        assert_eq!(s.partition("", &tokens, true), []);
        assert_eq!(s.partition("x", &tokens, true), [Frag::Text(0, 1)]);
    }

    #[test]
    fn hidden_tokens_need_parse_special() {
        let (tokens, s) = specials(&[("<c>", ATTR_CONTROL), ("<u>", ATTR_USER_DEFINED), ("<k>", ATTR_UNKNOWN)]);
        assert_eq!(s.partition("<c><u><k>", &tokens, true), [Frag::Token(0), Frag::Token(1), Frag::Token(2)]);
        assert_eq!(s.partition("<c><u><k>", &tokens, false), [Frag::Text(0, 3), Frag::Token(1), Frag::Text(6, 9)]);
    }

    #[test]
    fn matches_llamacpp_order_on_overlapping_tokens() {
        // Runs of one character (like Gemma's newline, space and tab tokens),
        // overlapping tags, a duplicated text and a control token.
        let (tokens, s) = specials(&[
            ("\n", ATTR_USER_DEFINED),
            ("\n\n", ATTR_USER_DEFINED),
            ("\n\n\n", ATTR_USER_DEFINED),
            ("  ", ATTR_USER_DEFINED),
            ("<a>", ATTR_USER_DEFINED),
            ("a><", ATTR_USER_DEFINED),
            ("<a><b>", ATTR_CONTROL),
            ("<b>", ATTR_CONTROL),
            ("<b>", ATTR_USER_DEFINED),
            ("é", ATTR_USER_DEFINED),
        ]);
        // A small deterministic generator over an alphabet that makes matches likely.
        let alphabet = ["\n", " ", "<", "a", ">", "b", "é", "x"];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in 0..40 {
            for _ in 0..50 {
                let mut text = String::new();
                for _ in 0..len {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    text.push_str(alphabet[(state % alphabet.len() as u64) as usize]);
                }
                for parse_special in [false, true] {
                    assert_eq!(
                        s.partition(&text, &tokens, parse_special),
                        reference(&text, &tokens, &s, parse_special),
                        "{text:?} parse_special={parse_special}"
                    );
                }
            }
        }
    }
}
