//! SentencePiece-style tokenization (GGUF `tokenizer.ggml.model = "llama"`), as
//! llama.cpp's `llm_tokenizer_spm` does it. Used by Llama 1/2, Mistral and Gemma.
//!
//! Unlike byte-level BPE there is no pre-tokenizer and no merge list: each raw
//! fragment (the text between special tokens) is encoded as a whole.
//!
//! 1. Spaces become `▁` (U+2581). With `add_space_prefix`, a `▁` is also put in
//!    front of a fragment that starts the text or follows a special token.
//! 2. The fragment starts as one symbol per character. Repeatedly, of all
//!    adjacent pairs whose concatenation is a vocabulary token, the one whose
//!    token has the highest score is merged (the leftmost on ties). A pair only
//!    merges if its concatenation is itself a token, so every merged symbol is a
//!    token.
//! 3. Each remaining symbol is its token; a single character that is not in the
//!    vocabulary becomes one byte token (`<0xXX>`) per UTF-8 byte, so nothing
//!    is lost (and a streaming decoder must hold back partial characters).
//!
//! Scores are SentencePiece's log-probabilities; which tokens they prefer is
//! what makes this differ from a greedy longest match.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use tandem_gguf::{Gguf, Value};

use crate::hash::FastMap;
use crate::tokenizer::{opt_bool, NO_ID};
use crate::TokenizerError;

/// The SentencePiece model: token scores and byte fallback.
pub(crate) struct Spm {
    /// `tokenizer.ggml.scores`, with -0.0 folded into 0.0 (llama.cpp compares
    /// scores with `<`, which does not tell them apart; `total_cmp` would).
    scores: Vec<f32>,
    /// The token for each byte, for characters outside the vocabulary:
    /// `<0xXX>`, else a token whose text is that (ASCII) byte, else NO_ID.
    byte_tok: [u32; 256],
    /// Stands in for a character with a byte that has no token at all.
    /// llama.cpp throws there; SentencePiece without byte fallback emits the
    /// unknown token, once per character, and so do we.
    unk: Option<u32>,
    /// `tokenizer.ggml.add_space_prefix`; SPM vocabularies default to true.
    add_space_prefix: bool,
    /// The longest token text in bytes: longer pairs need no lookup.
    max_token_len: usize,
}

impl std::fmt::Debug for Spm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spm").field("add_space_prefix", &self.add_space_prefix).field("unk", &self.unk).finish_non_exhaustive()
    }
}

/// One symbol: a byte range of the escaped fragment and list links
/// (merged-away symbols keep `len == 0`).
#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

/// A candidate merge of symbols `left` and `right`, whose concatenation (of
/// `size` bytes) is a token with `score`.
#[derive(Clone, Copy)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl Ord for Bigram {
    /// The max-heap pops the highest score first, and on equal scores the
    /// leftmost pair, like llama.cpp's queue.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// Reusable buffers for encoding.
#[derive(Default)]
pub(crate) struct Scratch {
    text: String,
    syms: Vec<Sym>,
    heap: BinaryHeap<Bigram>,
}

/// Reads `tokenizer.ggml.scores`: llama.cpp accepts an f32 or an i32 array.
fn read_scores(g: &Gguf, n: usize) -> Result<Vec<f32>, TokenizerError> {
    const KEY: &str = "tokenizer.ggml.scores";
    let v = g.get(KEY).ok_or_else(|| TokenizerError::MissingKey(KEY.into()))?;
    let bad = |found: &'static str| TokenizerError::WrongType { key: KEY.into(), expected: "array of f32 or i32", found };
    let arr = v.as_array().ok_or_else(|| bad(v.type_name()))?;
    if arr.len() < n {
        return Err(TokenizerError::Invalid(format!("{KEY} has {} entries for {n} tokens", arr.len())));
    }
    arr[..n]
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let s = match *s {
                Value::F32(s) => s,
                Value::I32(s) => s as f32,
                ref other => return Err(bad(other.type_name())),
            };
            if s.is_nan() {
                return Err(TokenizerError::Invalid(format!("{KEY}[{i}] is NaN")));
            }
            // Fold -0.0 into 0.0 so that `total_cmp` orders like `<`.
            Ok(s + 0.0)
        })
        .collect()
}

impl Spm {
    /// Reads the scores and `add_space_prefix` and builds the byte fallback
    /// table. `text_to_id` maps the vocabulary's texts; `unk` is the unknown token.
    pub(crate) fn from_gguf(
        g: &Gguf,
        tokens: &[String],
        text_to_id: &FastMap<String, u32>,
        unk: Option<u32>,
    ) -> Result<Self, TokenizerError> {
        let scores = read_scores(g, tokens.len())?;
        let add_space_prefix = opt_bool(g, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
        let mut byte_tok = [NO_ID; 256];
        for (b, t) in byte_tok.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            let single = (b < 0x80).then(|| (b as u8 as char).to_string());
            *t = text_to_id.get(&hex).or_else(|| single.and_then(|s| text_to_id.get(&s))).copied().unwrap_or(NO_ID);
        }
        let max_token_len = tokens.iter().map(String::len).max().unwrap_or(0);
        Ok(Self { scores, byte_tok, unk, add_space_prefix, max_token_len })
    }

    /// Whether a fragment at the start of the text or after a special token
    /// gets a leading space, and decoding drops the first token's leading space.
    pub(crate) fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Encodes one raw fragment. `after_special`: the fragment starts the text
    /// or follows a special token (where `add_space_prefix` applies).
    pub(crate) fn encode(&self, text: &str, after_special: bool, text_to_id: &FastMap<String, u32>, out: &mut Vec<u32>, sc: &mut Scratch) {
        let esc = &mut sc.text;
        esc.clear();
        if self.add_space_prefix && after_special {
            esc.push('▁');
        }
        // Only U+0020 is escaped; tabs and newlines stay as they are.
        for c in text.chars() {
            esc.push(if c == ' ' { '▁' } else { c });
        }

        let syms = &mut sc.syms;
        syms.clear();
        let n = esc.chars().count();
        for (i, (pos, c)) in esc.char_indices().enumerate() {
            let i = i as u32;
            syms.push(Sym {
                start: pos as u32,
                len: c.len_utf8() as u32,
                prev: if i == 0 { NO_ID } else { i - 1 },
                next: if i as usize + 1 == n { NO_ID } else { i + 1 },
            });
        }

        let heap = &mut sc.heap;
        heap.clear();
        // Queues the pair (l, r) if their concatenation is a token.
        let try_pair = |heap: &mut BinaryHeap<Bigram>, syms: &[Sym], l: u32, r: u32| {
            if l == NO_ID || r == NO_ID {
                return;
            }
            let (ls, rs) = (syms[l as usize], syms[r as usize]);
            let size = ls.len + rs.len;
            if size as usize > self.max_token_len {
                return;
            }
            let start = ls.start as usize;
            if let Some(&id) = text_to_id.get(&esc[start..start + size as usize]) {
                heap.push(Bigram { score: self.scores[id as usize], left: l, right: r, size });
            }
        };
        for i in 1..syms.len() as u32 {
            try_pair(heap, syms, i - 1, i);
        }
        while let Some(bg) = heap.pop() {
            let (ls, rs) = (syms[bg.left as usize], syms[bg.right as usize]);
            // Stale: one side has been merged away, or the right one has grown
            // (a symbol only grows by absorbing its right neighbour, so this is exact).
            if ls.len == 0 || rs.len == 0 || ls.len + rs.len != bg.size {
                continue;
            }
            let left = &mut syms[bg.left as usize];
            left.len = bg.size;
            left.next = rs.next;
            syms[bg.right as usize].len = 0;
            if rs.next != NO_ID {
                syms[rs.next as usize].prev = bg.left;
            }
            try_pair(heap, syms, ls.prev, bg.left);
            try_pair(heap, syms, bg.left, rs.next);
        }

        // Every merged symbol is a token; only single characters can miss.
        // (llama.cpp's `resegment` also consults a table of past merges, but
        // that never applies to a single character.)
        let mut i = if syms.is_empty() { NO_ID } else { 0 };
        while i != NO_ID {
            let s = syms[i as usize];
            let piece = &esc[s.start as usize..(s.start + s.len) as usize];
            match text_to_id.get(piece) {
                Some(&id) => out.push(id),
                None if piece.bytes().all(|b| self.byte_tok[b as usize] != NO_ID) => {
                    out.extend(piece.bytes().map(|b| self.byte_tok[b as usize]));
                }
                None => out.extend(self.unk),
            }
            i = s.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use tandem_gguf::{Gguf, GgufWriter, Value, ValueType};

    use crate::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer, TokenizerError};

    const CONTROL: i32 = 3;
    const UNKNOWN: i32 = 2;
    const USER_DEFINED: i32 = 4;
    const BYTE: i32 = 6;
    const NORMAL: i32 = 1;

    /// Specials 0-6, then (unless `bytes` is false) the 256 byte tokens, then
    /// the normal tokens with their scores.
    const SPECIALS: [(&str, i32); 7] = [
        ("<pad>", CONTROL),
        ("<eos>", CONTROL),
        ("<bos>", CONTROL),
        ("<unk>", UNKNOWN),
        ("<start_of_turn>", CONTROL),
        ("<end_of_turn>", CONTROL),
        ("\n", USER_DEFINED),
    ];
    const NORMALS: [(&str, f32); 17] = [
        ("▁", -2.0),
        ("a", -3.0),
        ("b", -3.0),
        ("c", -3.0),
        ("x", -3.0),
        ("ab", -1.5),
        ("bc", -1.0),
        ("aa", -1.0),
        ("▁a", -1.2),
        ("▁b", -1.3),
        ("▁ab", -0.5),
        // Unreachable: neither "cb" nor "ba" is a token, so SentencePiece never
        // gets here (a longest-match tokenizer would).
        ("cba", 0.0),
        // A tie between 0.0 and -0.0, which llama.cpp's `<` does not tell apart.
        ("xa", -0.0),
        ("ax", 0.0),
        ("é", -2.5),
        ("éé", -1.0),
        ("▁▁", -1.0),
    ];

    /// Id of a normal token in a vocabulary with byte tokens.
    fn id(text: &str) -> u32 {
        (SPECIALS.len() + 256 + NORMALS.iter().position(|(t, _)| *t == text).unwrap()) as u32
    }

    /// Id of a byte token.
    fn byte(b: u8) -> u32 {
        SPECIALS.len() as u32 + b as u32
    }

    /// Metadata under construction, so that tests can replace or drop keys.
    #[derive(Default)]
    struct Meta(Vec<(String, Value)>);

    impl Meta {
        fn set(&mut self, key: &str, value: Value) -> &mut Self {
            self.remove(key);
            self.0.push((key.to_owned(), value));
            self
        }

        fn remove(&mut self, key: &str) {
            self.0.retain(|(k, _)| k != key);
        }
    }

    fn build(bytes: bool, edit: impl FnOnce(&mut Meta)) -> Result<Tokenizer, TokenizerError> {
        let mut tokens: Vec<String> = SPECIALS.iter().map(|(t, _)| (*t).to_owned()).collect();
        let mut types: Vec<i32> = SPECIALS.iter().map(|&(_, ty)| ty).collect();
        let mut scores = vec![-1000.0f32; SPECIALS.len()];
        if bytes {
            tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
            types.extend([BYTE; 256]);
            scores.extend([0.0; 256]);
        }
        tokens.extend(NORMALS.iter().map(|(t, _)| (*t).to_owned()));
        types.extend(NORMALS.iter().map(|_| NORMAL));
        scores.extend(NORMALS.iter().map(|&(_, s)| s));
        let mut m = Meta::default();
        m.set("tokenizer.ggml.model", Value::String("llama".into()))
            .set("tokenizer.ggml.pre", Value::String("default".into()))
            .set("tokenizer.ggml.tokens", Value::Array(ValueType::String, tokens.into_iter().map(Value::String).collect()))
            .set("tokenizer.ggml.scores", Value::Array(ValueType::F32, scores.into_iter().map(Value::F32).collect()))
            .set("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()))
            .set("tokenizer.ggml.bos_token_id", Value::U32(2))
            .set("tokenizer.ggml.eos_token_id", Value::U32(1))
            .set("tokenizer.ggml.unknown_token_id", Value::U32(3))
            .set("tokenizer.ggml.add_space_prefix", Value::Bool(false));
        edit(&mut m);
        let mut w = GgufWriter::new();
        for (k, v) in m.0 {
            w.set(k, v);
        }
        Tokenizer::from_gguf(&Gguf::from_bytes(w.to_bytes().unwrap()).unwrap())
    }

    /// Gemma-like: byte tokens, no space prefix.
    fn tiny() -> Tokenizer {
        build(true, |_| {}).unwrap()
    }

    /// Llama-2-like: the space prefix left at SentencePiece's default (on).
    fn with_prefix() -> Tokenizer {
        build(true, |m| m.remove("tokenizer.ggml.add_space_prefix")).unwrap()
    }

    #[test]
    fn merges_by_score() {
        let t = tiny();
        // "bc" outscores "ab"; "abc" is not a token.
        assert_eq!(t.encode("abc", false), [id("a"), id("bc")]);
        // "▁a" first (-1.2 beats "ab" at -1.5), then "▁a"+"b" = "▁ab".
        assert_eq!(t.encode(" ab", false), [id("▁ab")]);
        // Equal scores: the leftmost pair.
        assert_eq!(t.encode("aaa", false), [id("aa"), id("a")]);
        // -0.0 and 0.0 tie too, so the leftmost pair wins, not the "larger" zero.
        assert_eq!(t.encode("xax", false), [id("xa"), id("x")]);
        // Only pairs that are tokens merge: "cba" is never reached.
        assert_eq!(t.encode("cba", false), [id("c"), id("b"), id("a")]);
        // Spaces are `▁`; runs of them merge like anything else.
        assert_eq!(t.encode("a b", false), [id("a"), id("▁b")]);
        assert_eq!(t.encode("a   b", false), [id("a"), id("▁▁"), id("▁b")]);
        assert_eq!(t.encode("", false), Vec::<u32>::new());
        assert_eq!(t.vocab_size(), SPECIALS.len() + 256 + NORMALS.len());
    }

    /// A direct transcription of the algorithm, quadratic: merge the best pair
    /// (highest score, then leftmost) until no adjacent pair is a token.
    fn reference(t: &Tokenizer, text: &str) -> Vec<u32> {
        let score = |s: &str| NORMALS.iter().find(|(n, _)| *n == s).map(|&(_, sc)| sc);
        let mut syms: Vec<String> = text.replace(' ', "▁").chars().map(String::from).collect();
        loop {
            let mut best: Option<(f32, usize)> = None;
            for i in 1..syms.len() {
                if let Some(sc) = score(&format!("{}{}", syms[i - 1], syms[i])) {
                    if best.is_none_or(|(b, _)| sc > b) {
                        best = Some((sc, i - 1));
                    }
                }
            }
            let Some((_, i)) = best else { break };
            let right = syms.remove(i + 1);
            syms[i].push_str(&right);
        }
        let mut out = Vec::new();
        for s in syms {
            match t.token_id(&s) {
                Some(i) => out.push(i),
                None => out.extend(s.bytes().map(byte)),
            }
        }
        out
    }

    #[test]
    fn agrees_with_a_direct_transcription() {
        let t = tiny();
        let alphabet = ["a", "b", "c", "x", " ", "é", "z", "€"];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..24 {
            for _ in 0..200 {
                let mut text = String::new();
                for _ in 0..len {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    text.push_str(alphabet[(state % alphabet.len() as u64) as usize]);
                }
                assert_eq!(t.encode(&text, false), reference(&t, &text), "{text:?}");
                assert_eq!(t.decode(&t.encode(&text, false)), text);
            }
        }
    }

    #[test]
    fn byte_fallback() {
        let t = tiny();
        // "€" (E2 82 AC) is not in the vocabulary: one byte token per byte.
        assert_eq!(t.encode("a€", false), [id("a"), byte(0xE2), byte(0x82), byte(0xAC)]);
        assert_eq!(t.encode("éé é", false), [id("éé"), id("▁"), id("é")]);
        assert_eq!(t.decode(&t.encode("a€", false)), "a€");
        assert_eq!(t.token_bytes(byte(0xE2)), [0xE2]);
        // A streaming decoder holds the partial character back.
        let mut dec = StreamDecoder::new();
        assert_eq!(dec.push(&t, id("a")), "a");
        assert_eq!(dec.push(&t, byte(0xE2)), "");
        assert_eq!(dec.push(&t, byte(0x82)), "");
        assert_eq!(dec.push(&t, byte(0xAC)), "€");
        assert_eq!(dec.push(&t, byte(0xE2)), "");
        assert_eq!(dec.flush(), "\u{FFFD}");
        // Without byte tokens, a character outside the vocabulary is one <unk>.
        let t = build(false, |_| {}).unwrap();
        let unk = 3;
        let a = (SPECIALS.len() + 1) as u32;
        assert_eq!(t.encode("a€a", false), [a, unk, a]);
        assert_eq!(t.decode(&[a, unk, a]), "aa");
        assert_eq!(t.decode_special(&[a, unk, a]), "a<unk>a");
    }

    #[test]
    fn special_tokens() {
        let t = tiny();
        assert_eq!(t.encode("<start_of_turn>ab<end_of_turn>", true), [4, id("ab"), 5]);
        // Control tokens stay text without parse_special; `<`, `s`, ... are not
        // in this vocabulary, so they come out as bytes.
        let spelled = t.encode("<eos>", false);
        assert_eq!(spelled, b"<eos>".iter().map(|&b| byte(b)).collect::<Vec<_>>());
        assert_eq!(t.decode(&spelled), "<eos>");
        // User-defined tokens match either way.
        assert_eq!(t.encode("a\nb", false), [id("a"), 6, id("b")]);
        assert_eq!(t.encode("a\nb", true), [id("a"), 6, id("b")]);
        // Decoding: control tokens hidden unless asked for, `▁` is a space.
        assert_eq!(t.decode(&[2, id("▁ab"), 6, 1]), " ab\n");
        assert_eq!(t.decode_special(&[2, id("▁ab"), 6, 1]), "<bos> ab\n<eos>");
        assert_eq!(t.token_str(id("▁ab")), "▁ab");
        assert_eq!(t.token_bytes(id("▁ab")), b" ab");
        assert_eq!(t.token_bytes(4), b"");
        assert_eq!((t.bos_id(), t.eos_id()), (Some(2), Some(1)));
        assert!(t.add_bos(), "SentencePiece adds BOS by default");
        // <eos> (EOS) and <end_of_turn> (found by its text) end generation.
        let eog: Vec<u32> = (0..t.vocab_size() as u32).filter(|&i| t.is_eog(i)).collect();
        assert_eq!(eog, [1, 5]);
    }

    #[test]
    fn space_prefix() {
        let t = with_prefix();
        // A fragment at the start, or after a special token, gets a leading `▁`.
        assert_eq!(t.encode("ab", false), [id("▁ab")]);
        assert_eq!(t.encode("ab<end_of_turn>ab", true), [id("▁ab"), 5, id("▁ab")]);
        assert_eq!(t.encode("a\nb", false), [id("▁a"), 6, id("▁b")]);
        // Decoding drops the first token's leading space only (as llama.cpp's
        // detokenize does); a stream decoder keeps it.
        assert_eq!(t.decode(&[id("▁ab"), 5, id("▁ab")]), "ab ab");
        assert_eq!(t.decode_special(&[id("▁ab"), 5, id("▁ab")]), "ab<end_of_turn> ab");
        assert_eq!(t.decode(&t.encode("ab ab", false)), "ab ab");
        let mut dec = StreamDecoder::new();
        assert_eq!(dec.push(&t, id("▁ab")), " ab");
    }

    #[test]
    fn default_special_ids() {
        // llama.cpp's SentencePiece defaults: BOS 1, EOS 2, UNK 0.
        let t = build(false, |m| m.0.retain(|(k, _)| !k.ends_with("_token_id"))).unwrap();
        assert_eq!((t.bos_id(), t.eos_id()), (Some(1), Some(2)));
        assert_eq!(t.encode("€", false), [0]);
    }

    #[test]
    fn bad_metadata() {
        let err = |edit: fn(&mut Meta)| build(true, edit).unwrap_err();
        assert!(matches!(
            err(|m| m.remove("tokenizer.ggml.scores")),
            TokenizerError::MissingKey(k) if k == "tokenizer.ggml.scores"
        ));
        assert!(matches!(
            err(|m| { m.set("tokenizer.ggml.scores", Value::Array(ValueType::F32, vec![Value::F32(0.0); 5])); }),
            TokenizerError::Invalid(m) if m.contains("scores")
        ));
        assert!(matches!(
            err(|m| {
                m.set("tokenizer.ggml.scores", Value::F32(0.0));
            }),
            TokenizerError::WrongType { .. }
        ));
        assert!(matches!(
            err(|m| {
                m.set("tokenizer.ggml.scores", Value::Array(ValueType::String, vec![Value::String("x".into()); 300]));
            }),
            TokenizerError::WrongType { .. }
        ));
        assert!(matches!(
            err(|m| { m.set("tokenizer.ggml.scores", Value::Array(ValueType::F32, vec![Value::F32(f32::NAN); 300])); }),
            TokenizerError::Invalid(m) if m.contains("NaN")
        ));
        assert!(matches!(
            err(|m| { m.set("tokenizer.ggml.token_type", Value::Array(ValueType::I32, vec![Value::I32(1); 5])); }),
            TokenizerError::Invalid(m) if m.contains("token_type")
        ));
        assert!(matches!(
            err(|m| {
                m.set("tokenizer.ggml.add_space_prefix", Value::U32(1));
            }),
            TokenizerError::WrongType { .. }
        ));
        // Integer scores are accepted, as llama.cpp does.
        let n = SPECIALS.len() + 256 + NORMALS.len();
        let t = build(true, |m| {
            m.set("tokenizer.ggml.scores", Value::Array(ValueType::I32, vec![Value::I32(0); 300]));
        })
        .unwrap();
        assert_eq!(t.vocab_size(), n);
    }

    #[test]
    fn fallback_template_is_gemma() {
        let t = tiny();
        let out = ChatTemplate::fallback(&t).render(&[ChatMessage::new("user", "Hi")], true, "", "").unwrap();
        assert_eq!(out, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
        let ids = t.encode(&out, true);
        assert_eq!(ids.iter().filter(|&&i| i == 4).count(), 2);
    }
}
