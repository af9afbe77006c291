//! The BPE vocabulary, encoder and decoder.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use tandem_gguf::Gguf;

use crate::pretok::PreTokenizer;
use crate::unicode::{byte_to_char_table, char_to_byte};
use crate::TokenizerError;

// Token attributes, as llama.cpp derives them from `tokenizer.ggml.token_type`.
const ATTR_UNKNOWN: u16 = 1 << 0;
const ATTR_UNUSED: u16 = 1 << 1;
const ATTR_NORMAL: u16 = 1 << 2;
const ATTR_CONTROL: u16 = 1 << 3;
const ATTR_USER_DEFINED: u16 = 1 << 4;
const ATTR_BYTE: u16 = 1 << 5;

/// Tokens hidden from plain decoding and, without `parse_special`, never matched in text.
const ATTR_HIDDEN: u16 = ATTR_UNKNOWN | ATTR_CONTROL;

/// Marks "no id" in the per-byte tables and BPE symbols.
const NO_ID: u32 = u32::MAX;

/// Hasher for the `(left, right)` merge key packed into a u64: the default
/// SipHash is needlessly slow for the hot loop of BPE.
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // Fibonacci hashing; the high bits are well mixed, then folded down.
        let h = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

type PairMap = HashMap<u64, Merge, BuildHasherDefault<PairHasher>>;

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

/// A byte-level BPE tokenizer reproducing llama.cpp's `gpt2` tokenizer.
pub struct Tokenizer {
    /// Token texts as llama.cpp holds them (an empty GGUF string becomes `[EMPTY_<id>]`).
    tokens: Vec<String>,
    attrs: Vec<u16>,
    /// Text -> id; with duplicate texts the last id wins, as in llama.cpp.
    text_to_id: HashMap<String, u32>,
    merges: PairMap,
    /// Interned id of the one-character string each byte becomes, or NO_ID.
    byte_sym: [u32; 256],
    /// Token whose text is exactly this ASCII byte, or NO_ID (BPE's last-resort fallback).
    ascii_tok: [u32; 128],
    /// Tokens split out of raw text before BPE, longest text first.
    special: Vec<u32>,
    /// Concatenated pieces (bytes each token renders to with specials shown).
    pieces: Vec<u8>,
    piece_off: Vec<u32>,
    eog: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    pre: PreTokenizer,
    chat_template: Option<String>,
    vocab_hash: u64,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("merges", &self.merges.len())
            .field("pre", &self.pre)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

// The engine shares one tokenizer across threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
};

fn string_array<'a>(g: &'a Gguf, key: &str) -> Result<Option<Vec<&'a str>>, TokenizerError> {
    let Some(v) = g.get(key) else { return Ok(None) };
    let arr =
        v.as_array().ok_or_else(|| TokenizerError::WrongType { key: key.into(), expected: "array of strings", found: v.type_name() })?;
    arr.iter()
        .map(|e| {
            e.as_str().ok_or_else(|| TokenizerError::WrongType { key: key.into(), expected: "array of strings", found: e.type_name() })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn opt_str<'a>(g: &'a Gguf, key: &str) -> Result<Option<&'a str>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => {
            v.as_str().map(Some).ok_or_else(|| TokenizerError::WrongType { key: key.into(), expected: "string", found: v.type_name() })
        }
    }
}

fn opt_u64(g: &Gguf, key: &str) -> Result<Option<u64>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| TokenizerError::WrongType {
            key: key.into(),
            expected: "unsigned integer",
            found: v.type_name(),
        }),
    }
}

fn opt_bool(g: &Gguf, key: &str) -> Result<Option<bool>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => {
            v.as_bool().map(Some).ok_or_else(|| TokenizerError::WrongType { key: key.into(), expected: "bool", found: v.type_name() })
        }
    }
}

/// FNV-1a 64 over every token text followed by a 0 byte.
fn fnv1a_vocab<'a>(tokens: impl Iterator<Item = &'a str>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    for t in tokens {
        for &b in t.as_bytes() {
            eat(b);
        }
        eat(0);
    }
    h
}

/// Token texts llama.cpp treats as end-of-generation (it matches by text because
/// converters rarely record these ids).
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
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Name-based detection of special ids missing from the metadata, in llama.cpp's
/// order: (metadata key, candidate texts). Matching tokens are forced to CONTROL.
const DETECT: &[(&str, &[&str])] = &[
    (
        "tokenizer.ggml.eot_token_id",
        &[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|end_of_text|>",
            "<EOT>",
            "_<EOT>",
            "[EOT]",
            "<｜end▁of▁sentence｜>",
            "<end_of_utterance>",
        ],
    ),
    ("tokenizer.ggml.eom_token_id", &["<|eom_id|>"]),
    (
        "tokenizer.ggml.fim_pre_token_id",
        &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"],
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"],
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"],
    ),
    ("tokenizer.ggml.fim_pad_token_id", &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"]),
    ("tokenizer.ggml.fim_rep_token_id", &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"]),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"]),
];

/// Deprecated spellings of the FIM keys that llama.cpp still reads.
const DEPRECATED_FIM: &[(&str, &str)] = &[
    ("tokenizer.ggml.prefix_token_id", "tokenizer.ggml.fim_pre_token_id"),
    ("tokenizer.ggml.suffix_token_id", "tokenizer.ggml.fim_suf_token_id"),
    ("tokenizer.ggml.middle_token_id", "tokenizer.ggml.fim_mid_token_id"),
];

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
struct Scratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<Bigram>>,
    words: Vec<(usize, usize)>,
}

enum Frag {
    Text(usize, usize),
    Token(u32),
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.*` metadata, deriving token
    /// attributes, special ids and end-of-generation tokens the way llama.cpp does.
    pub fn from_gguf(g: &Gguf) -> Result<Self, TokenizerError> {
        let model = opt_str(g, "tokenizer.ggml.model")?.ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.model".into()))?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.into()));
        }
        // llama.cpp falls back to a "default" pre-tokenizer we do not implement.
        let pre_name = opt_str(g, "tokenizer.ggml.pre")?.unwrap_or("default");
        let pre = PreTokenizer::from_name(pre_name).ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.into()))?;

        let raw_tokens =
            string_array(g, "tokenizer.ggml.tokens")?.ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.tokens".into()))?;
        let n = raw_tokens.len();
        if n == 0 || n >= NO_ID as usize / 2 {
            return Err(TokenizerError::Invalid(format!("vocabulary has {n} tokens")));
        }
        let merges_raw =
            string_array(g, "tokenizer.ggml.merges")?.ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.merges".into()))?;
        let vocab_hash = fnv1a_vocab(raw_tokens.iter().copied());

        // An empty token text would match everywhere when splitting out specials.
        let tokens: Vec<String> =
            raw_tokens.iter().enumerate().map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { (*t).to_owned() }).collect();

        let mut attrs = vec![ATTR_NORMAL; n];
        if let Some(v) = g.get("tokenizer.ggml.token_type") {
            let bad = || TokenizerError::WrongType {
                key: "tokenizer.ggml.token_type".into(),
                expected: "array of integers",
                found: v.type_name(),
            };
            let arr = v.as_array().ok_or_else(bad)?;
            if arr.len() < n {
                return Err(TokenizerError::Invalid(format!("tokenizer.ggml.token_type has {} entries for {n} tokens", arr.len())));
            }
            for (a, t) in attrs.iter_mut().zip(arr) {
                *a = match t.as_i64().ok_or_else(bad)? {
                    1 => ATTR_NORMAL,
                    2 => ATTR_UNKNOWN,
                    3 => ATTR_CONTROL,
                    4 => ATTR_USER_DEFINED,
                    5 => ATTR_UNUSED,
                    6 => ATTR_BYTE,
                    _ => 0,
                };
            }
        }

        let mut text_to_id: HashMap<String, u32> = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            text_to_id.insert(t.clone(), i as u32);
        }

        // --- merges: intern both halves and the result, keyed by id pair ---
        let mut extra: HashMap<String, u32> = HashMap::new();
        let intern = |s: &str, extra: &mut HashMap<String, u32>| -> u32 {
            if let Some(&id) = text_to_id.get(s) {
                return id;
            }
            let next = (n + extra.len()) as u32;
            *extra.entry(s.to_owned()).or_insert(next)
        };
        let mut merges = PairMap::with_capacity_and_hasher(merges_raw.len(), Default::default());
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

        // --- special ids: metadata first, then detection by text ---
        let valid = |id: u64| (id < n as u64).then_some(id as u32);
        let mut special_ids: HashMap<&str, u32> = HashMap::new();
        // A gpt2 vocabulary without explicit ids defaults BOS/EOS to 11 (llama.cpp).
        if let Some(id) = valid(11) {
            special_ids.insert("tokenizer.ggml.bos_token_id", id);
            special_ids.insert("tokenizer.ggml.eos_token_id", id);
        }
        let keys = [
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
            "tokenizer.ggml.fim_pre_token_id",
            "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.fim_mid_token_id",
            "tokenizer.ggml.fim_pad_token_id",
            "tokenizer.ggml.fim_rep_token_id",
            "tokenizer.ggml.fim_sep_token_id",
        ];
        for key in keys {
            if let Some(id) = opt_u64(g, key)?.and_then(valid) {
                special_ids.insert(key, id);
            }
        }
        for (old, new) in DEPRECATED_FIM {
            if let Some(id) = opt_u64(g, old)?.and_then(valid) {
                special_ids.insert(new, id);
            }
        }
        // llama.cpp scans a hash map here, so with several candidate texts its
        // pick is arbitrary; we take the lowest id.
        for (key, texts) in DETECT {
            if special_ids.contains_key(key) {
                continue;
            }
            if let Some(id) = texts.iter().filter_map(|t| text_to_id.get(*t).copied()).min() {
                special_ids.insert(key, id);
                attrs[id as usize] |= ATTR_CONTROL;
            }
        }

        // --- end-of-generation set ---
        let mut eog: Vec<u32> = Vec::new();
        for key in ["tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id"] {
            eog.extend(special_ids.get(key));
        }
        // Looked up through `text_to_id` as llama.cpp does, so with duplicate
        // texts only the last id counts.
        for &i in EOG_TEXTS.iter().filter_map(|t| text_to_id.get(*t)) {
            eog.push(i);
            attrs[i as usize] |= ATTR_CONTROL;
        }
        // gpt-oss: these must always render.
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&i) = text_to_id.get(t) {
                attrs[i as usize] = ATTR_USER_DEFINED;
            }
        }
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            eog.extend(special_ids.get(key));
        }
        eog.sort_unstable();
        eog.dedup();
        let has = |eog: &[u32], s: &str| eog.iter().find(|&&i| tokens[i as usize] == s).copied();
        // Harmony / solar-open: `<|end|>` ends a message, not the generation.
        if let Some(end) = has(&eog, "<|end|>") {
            let ret = has(&eog, "<|return|>").is_some();
            let call = has(&eog, "<|call|>").is_some() || has(&eog, "<|calls|>").is_some();
            let flush = has(&eog, "<|flush|>").is_some();
            if call && (ret || flush) {
                eog.retain(|&i| i != end);
                attrs[end as usize] = ATTR_USER_DEFINED;
            }
        }
        // gemma4 / plamo: `</s>` is an ordinary token.
        if let Some(s) = has(&eog, "</s>") {
            if has(&eog, "<|tool_response>").is_some() || has(&eog, "<|plamo:eos|>").is_some() {
                eog.retain(|&i| i != s);
                attrs[s as usize] = ATTR_NORMAL;
            }
        }

        // --- tokens split out before BPE, longest first ---
        let mut special: Vec<u32> =
            (0..n as u32).filter(|&i| attrs[i as usize] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0).collect();
        special.sort_by_key(|&i| Reverse(tokens[i as usize].len()));

        // --- pieces ---
        let mut pieces = Vec::with_capacity(tokens.iter().map(String::len).sum());
        let mut piece_off = Vec::with_capacity(n + 1);
        piece_off.push(0u32);
        for (t, &a) in tokens.iter().zip(&attrs) {
            render_piece(t, a, &mut pieces);
            piece_off.push(u32::try_from(pieces.len()).map_err(|_| TokenizerError::Invalid("vocabulary text too large".into()))?);
        }

        let add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token")?.unwrap_or(false);
        let chat_template = opt_str(g, "tokenizer.chat_template")?.map(str::to_owned);

        Ok(Self {
            bos: special_ids.get("tokenizer.ggml.bos_token_id").copied(),
            eos: special_ids.get("tokenizer.ggml.eos_token_id").copied(),
            tokens,
            attrs,
            text_to_id,
            merges,
            byte_sym,
            ascii_tok,
            special,
            pieces,
            piece_off,
            eog,
            add_bos,
            pre,
            chat_template,
            vocab_hash,
        })
    }

    /// Tokenizes `text`. With `parse_special`, control tokens written in the text
    /// (e.g. `<|im_start|>`) become their ids; without it they are spelled out,
    /// but user-defined tokens are still matched (llama.cpp / HF behaviour).
    /// No BOS is added; see [`Tokenizer::add_bos`].
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut scratch = Scratch::default();
        for frag in self.partition(text, parse_special) {
            match frag {
                Frag::Token(id) => out.push(id),
                Frag::Text(a, b) => {
                    let mut words = std::mem::take(&mut scratch.words);
                    words.clear();
                    self.pre.split(&text[a..b], &mut words);
                    for &(s, e) in &words {
                        self.bpe_word(&text.as_bytes()[a + s..a + e], &mut out, &mut scratch);
                    }
                    scratch.words = words;
                }
            }
        }
        out
    }

    /// Splits special tokens out of the text, longest token text first, each one
    /// at every occurrence left to right in the still-unsplit text.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Frag::Text(0, text.len()));
        let mut next = Vec::new();
        for &id in &self.special {
            if !parse_special && self.attrs[id as usize] & ATTR_HIDDEN != 0 {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            if !text.contains(needle) {
                continue;
            }
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

        let n_vocab = self.tokens.len() as u32;
        let mut i = if syms.is_empty() { NO_ID } else { 0 };
        while i != NO_ID {
            let s = syms[i as usize];
            if s.id < n_vocab {
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

    #[inline]
    fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_off.len() {
            return &[];
        }
        &self.pieces[self.piece_off[i] as usize..self.piece_off[i + 1] as usize]
    }

    /// Decodes ids to text; control and unknown tokens render as nothing.
    /// Invalid UTF-8 is replaced only once, over the whole byte string, so a
    /// character split across tokens survives.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Like [`Tokenizer::decode`] but control tokens render as their text
    /// (llama.cpp's `special = true`), e.g. for showing a full prompt.
    pub fn decode_special(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.piece(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes token `id` decodes to; empty for control/unknown tokens and
    /// for ids outside the vocabulary. A piece may be part of a UTF-8 character.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        match self.attrs.get(id as usize) {
            Some(&a) if a & ATTR_HIDDEN == 0 => self.piece(id),
            _ => &[],
        }
    }

    /// The vocabulary text of `id` as stored (byte-level characters such as `Ġ`
    /// included); empty for ids outside the vocabulary.
    pub fn token_str(&self, id: u32) -> &str {
        self.tokens.get(id as usize).map_or("", String::as_str)
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether prompts should start with BOS (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// End-of-generation: EOS, EOT/EOM and the tokens llama.cpp recognises by
    /// text (`<|im_end|>`, `<|endoftext|>`, ... and the FIM pad/repo/sep tokens).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The id of a token by its exact vocabulary text.
    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.text_to_id.get(s).copied()
    }

    /// FNV-1a 64 over all token texts, each followed by a 0 byte: ties support
    /// files (e.g. draft models) to the vocabulary they were built for.
    pub fn vocab_hash(&self) -> u64 {
        self.vocab_hash
    }

    /// The Jinja chat template from `tokenizer.chat_template`, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

/// The bytes a token renders to when specials are shown (llama.cpp's
/// `token_to_piece(special = true)`).
fn render_piece(text: &str, attr: u16, out: &mut Vec<u8>) {
    if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED) != 0 {
        out.extend_from_slice(text.as_bytes());
    } else if attr & ATTR_NORMAL != 0 {
        for c in text.chars() {
            match char_to_byte(c) {
                Some(b) => out.push(b),
                None => {
                    // llama.cpp's marker for a character outside the byte map.
                    out.extend_from_slice(b"[UNK_BYTE_0x");
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.extend_from_slice(format!("{b:02x}").as_bytes());
                    }
                    out.extend_from_slice(text.as_bytes());
                    out.push(b']');
                }
            }
        }
    } else if attr & ATTR_BYTE != 0 {
        // `<0xAB>`; llama.cpp's strtol yields 0 on garbage.
        let b = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()).unwrap_or(0);
        out.push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_gguf::{GgufWriter, Value, ValueType};

    fn strs(v: &[&str]) -> Value {
        Value::Array(ValueType::String, v.iter().map(|s| Value::String((*s).into())).collect())
    }

    /// A tiny byte-level vocabulary: 0-2 special, then single characters and merges.
    fn tiny(edit: impl FnOnce(&mut GgufWriter)) -> Result<Tokenizer, TokenizerError> {
        let tokens = [
            "<|endoftext|>", // 0 control
            "<|im_start|>",  // 1 control
            "<tool>",        // 2 user-defined
            "a",
            "b",
            "c",
            "Ġ",
            "ab",
            "abc",
            "Ġa",
            "<",
            ">",
            "|",
            "t",
            "o",
            "l",
            "Ċ", // 3..=16
        ];
        let mut types = vec![1i32; tokens.len()];
        types[0] = 3;
        types[1] = 3;
        types[2] = 4;
        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("gpt2".into()))
            .set("tokenizer.ggml.pre", Value::String("smollm".into()))
            .set("tokenizer.ggml.tokens", strs(&tokens))
            .set("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()))
            // "b c" makes "bc", which is not a token: llama.cpp then falls back to bytes.
            .set("tokenizer.ggml.merges", strs(&["a b", "Ġ a", "ab c", "b c", "malformed"]))
            .set("tokenizer.ggml.eos_token_id", Value::U32(0))
            .set("tokenizer.ggml.bos_token_id", Value::U32(1));
        edit(&mut w);
        let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
        Tokenizer::from_gguf(&g)
    }

    #[test]
    fn bpe_merges_by_rank() {
        let t = tiny(|_| {}).unwrap();
        assert_eq!(t.encode("abc", false), [8]);
        assert_eq!(t.encode("ab a", false), [7, 9]);
        assert_eq!(t.encode("cab", false), [5, 7]);
        // The merge "b c" applies but "bc" is not a token, so, as in llama.cpp,
        // its bytes come out as one-character tokens.
        assert_eq!(t.encode("bc", false), [4, 5]);
        assert_eq!(t.decode(&t.encode("ab a\n", false)), "ab a\n");
        assert_eq!(t.vocab_size(), 17);
    }

    #[test]
    fn special_tokens() {
        let t = tiny(|_| {}).unwrap();
        assert_eq!(t.encode("<|im_start|>a", true), [1, 3]);
        // Control tokens are spelled out without parse_special...
        assert_eq!(t.encode("<|a|>", false), [10, 12, 3, 12, 11]);
        assert!(!t.encode("<|im_start|>", false).contains(&1));
        // ...but user-defined ones are always matched.
        assert_eq!(t.encode("a<tool>b", false), [3, 2, 4]);
        assert_eq!(t.decode(&[2]), "<tool>");
        assert_eq!(t.decode(&[1, 3]), "a");
        assert_eq!(t.decode_special(&[1, 3]), "<|im_start|>a");
        assert!(t.is_eog(0) && !t.is_eog(1));
        assert_eq!((t.bos_id(), t.eos_id()), (Some(1), Some(0)));
    }

    #[test]
    fn missing_and_wrong_metadata() {
        assert!(matches!(
            tiny(|w| {
                w.set("tokenizer.ggml.model", Value::String("llama".into()));
            }),
            Err(TokenizerError::UnsupportedModel(m)) if m == "llama"
        ));
        assert!(matches!(
            tiny(|w| {
                w.set("tokenizer.ggml.pre", Value::String("no-such-pre-tokenizer".into()));
            }),
            Err(TokenizerError::UnsupportedPreTokenizer(_))
        ));
        assert!(matches!(
            tiny(|w| {
                w.set("tokenizer.ggml.merges", Value::U32(3));
            }),
            Err(TokenizerError::WrongType { .. })
        ));
        assert!(matches!(
            tiny(|w| {
                w.set("tokenizer.ggml.tokens", strs(&[]));
            }),
            Err(TokenizerError::Invalid(_))
        ));
        let mut w = GgufWriter::new();
        w.set("tokenizer.ggml.model", Value::String("gpt2".into()));
        w.set("tokenizer.ggml.pre", Value::String("smollm".into()));
        let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
        assert!(matches!(Tokenizer::from_gguf(&g), Err(TokenizerError::MissingKey(k)) if k == "tokenizer.ggml.tokens"));
    }

    #[test]
    fn vocab_hash_is_fnv1a() {
        // FNV-1a 64 of "a\0b\0".
        let mut h: u64 = 0xcbf29ce484222325;
        for b in *b"a\0b\0" {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
        assert_eq!(fnv1a_vocab(["a", "b"].into_iter()), h);
        let t = tiny(|_| {}).unwrap();
        let u = tiny(|w| {
            w.set("tokenizer.ggml.eos_token_id", Value::U32(1));
        })
        .unwrap();
        assert_eq!(t.vocab_hash(), u.vocab_hash());
    }
}
