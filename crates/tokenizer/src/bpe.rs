//! Byte-level BPE (GGUF `tokenizer.ggml.model = "gpt2"`), as llama.cpp's
//! `llm_tokenizer_bpe` does it: pre-tokenize, map bytes to the GPT-2 byte
//! alphabet, then merge pairs by rank within each word.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tandem_gguf::Gguf;

use crate::hash::FastMap;
use crate::pretok::PreTokenizer;
use crate::tokenizer::{string_array, NO_ID};
use crate::unicode::byte_to_char_table;
use crate::TokenizerError;

#[derive(Clone, Copy)]
struct Merge {
    rank: u32,
    /// Interned id of the merged string (a vocab id, or an id past the vocab
    /// when the merge result is not itself a token).
    merged: u32,
}

#[inline]
fn pair_key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

/// The BPE model: merges and the byte alphabet.
pub(crate) struct Bpe {
    merges: FastMap<u64, Merge>,
    /// Interned id of the one-character string each byte becomes, or NO_ID.
    byte_sym: [u32; 256],
    /// Token whose text is exactly this ASCII byte, or NO_ID (BPE's last-resort fallback).
    ascii_tok: [u32; 128],
    pre: PreTokenizer,
    n_vocab: u32,
}

impl std::fmt::Debug for Bpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bpe").field("merges", &self.merges.len()).field("pre", &self.pre).finish_non_exhaustive()
    }
}

/// One BPE symbol: a byte range of the word, the interned id of its text, and
/// list links (merged-away symbols keep `len == 0`).
#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    len: u32,
    id: u32,
    prev: u32,
    next: u32,
}

/// A queued merge: (rank, left index) orders it like llama.cpp's queue (lowest
/// rank, then leftmost); (right index, left id, right id) detect stale entries.
type Bigram = (u32, u32, u32, u32, u32);

/// Reusable buffers for encoding, so a long text does not allocate per word.
#[derive(Default)]
pub(crate) struct Scratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<Bigram>>,
    words: Vec<(usize, usize)>,
}

impl Bpe {
    /// Reads `tokenizer.ggml.merges`; `text_to_id` maps the vocabulary's texts.
    pub(crate) fn from_gguf(g: &Gguf, pre: PreTokenizer, text_to_id: &FastMap<String, u32>, n: usize) -> Result<Self, TokenizerError> {
        let merges_raw =
            string_array(g, "tokenizer.ggml.merges")?.ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.merges".into()))?;

        // --- merges: intern both halves and the result, keyed by id pair ---
        let mut extra: FastMap<String, u32> = FastMap::default();
        let intern = |s: &str, extra: &mut FastMap<String, u32>| -> u32 {
            if let Some(&id) = text_to_id.get(s) {
                return id;
            }
            let next = (n + extra.len()) as u32;
            *extra.entry(s.to_owned()).or_insert(next)
        };
        let mut merges = FastMap::with_capacity_and_hasher(merges_raw.len(), Default::default());
        let mut joined = String::new();
        for (rank, m) in merges_raw.iter().enumerate() {
            // Split at the first space after the first byte, like llama.cpp.
            let Some(sp) = m.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (a, b) = (&m[..sp], &m[sp + 1..]);
            let ia = intern(a, &mut extra);
            let ib = intern(b, &mut extra);
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let merged = intern(&joined, &mut extra);
            // The first occurrence of a pair keeps its rank.
            merges.entry(pair_key(ia, ib)).or_insert(Merge { rank: rank as u32, merged });
        }

        let byte_chars = byte_to_char_table();
        let mut byte_sym = [NO_ID; 256];
        let mut buf = [0u8; 4];
        for (b, sym) in byte_sym.iter_mut().enumerate() {
            let s: &str = byte_chars[b].encode_utf8(&mut buf);
            *sym = text_to_id.get(s).or_else(|| extra.get(s)).copied().unwrap_or(NO_ID);
        }
        let mut ascii_tok = [NO_ID; 128];
        for (b, t) in ascii_tok.iter_mut().enumerate() {
            let s = (b as u8 as char).to_string();
            *t = text_to_id.get(&s).copied().unwrap_or(NO_ID);
        }
        Ok(Self { merges, byte_sym, ascii_tok, pre, n_vocab: n as u32 })
    }

    /// Encodes one fragment of raw text (no special tokens in it).
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>, scratch: &mut Scratch) {
        let mut words = std::mem::take(&mut scratch.words);
        words.clear();
        self.pre.split(text, &mut words);
        for &(s, e) in &words {
            self.bpe_word(&text.as_bytes()[s..e], out, scratch);
        }
        scratch.words = words;
    }

    /// BPE on one pre-tokenized word: repeatedly merge the adjacent pair with the
    /// lowest merge rank (leftmost on ties), as llama.cpp's queue does.
    fn bpe_word(&self, word: &[u8], out: &mut Vec<u32>, sc: &mut Scratch) {
        let syms = &mut sc.syms;
        syms.clear();
        for (i, &b) in word.iter().enumerate() {
            syms.push(Sym {
                start: i as u32,
                len: 1,
                id: self.byte_sym[b as usize],
                prev: if i == 0 { NO_ID } else { i as u32 - 1 },
                next: if i + 1 == word.len() { NO_ID } else { i as u32 + 1 },
            });
        }
        let heap = &mut sc.heap;
        heap.clear();
        let merges = &self.merges;
        let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: u32, r: u32| {
            if l == NO_ID || r == NO_ID {
                return;
            }
            let (li, ri) = (syms[l as usize].id, syms[r as usize].id);
            if li == NO_ID || ri == NO_ID {
                return;
            }
            if let Some(m) = merges.get(&pair_key(li, ri)) {
                heap.push(Reverse((m.rank, l, r, li, ri)));
            }
        };
        for i in 1..syms.len() as u32 {
            push(heap, syms, i - 1, i);
        }
        while let Some(Reverse((rank, l, r, li, ri))) = heap.pop() {
            let (ls, rs) = (syms[l as usize], syms[r as usize]);
            // Stale entry: one side has merged since it was queued.
            if ls.len == 0 || rs.len == 0 || ls.id != li || rs.id != ri {
                continue;
            }
            let merged = merges[&pair_key(li, ri)].merged;
            debug_assert_eq!(merges[&pair_key(li, ri)].rank, rank);
            let left = &mut syms[l as usize];
            left.len += rs.len;
            left.id = merged;
            left.next = rs.next;
            syms[r as usize].len = 0;
            if rs.next != NO_ID {
                syms[rs.next as usize].prev = l;
            }
            push(heap, syms, ls.prev, l);
            push(heap, syms, l, rs.next);
        }

        let mut i = if syms.is_empty() { NO_ID } else { 0 };
        while i != NO_ID {
            let s = syms[i as usize];
            if s.id < self.n_vocab {
                out.push(s.id);
            } else {
                // Not a token: llama.cpp looks up each byte of the symbol's
                // (byte-encoded) text as a one-byte token; only ASCII can match.
                let byte_chars = byte_to_char_table();
                let mut buf = [0u8; 4];
                for &b in &word[s.start as usize..(s.start + s.len) as usize] {
                    for &u in byte_chars[b as usize].encode_utf8(&mut buf).as_bytes() {
                        if u < 128 && self.ascii_tok[u as usize] != NO_ID {
                            out.push(self.ascii_tok[u as usize]);
                        }
                    }
                }
            }
            i = s.next;
        }
    }
}
