//! The vocabulary both tokenizer models share: token texts and attributes,
//! special and end-of-generation tokens, splitting special tokens out of text,
//! and decoding. The models themselves are in `bpe.rs` and `spm.rs`.

use std::collections::HashMap;

use tandem_gguf::Gguf;

use crate::bpe::{self, Bpe};
use crate::hash::FastMap;
use crate::pretok::PreTokenizer;
use crate::special::{Frag, Specials};
use crate::spm::{self, Spm};
use crate::unicode::char_to_byte;
use crate::TokenizerError;

// Token attributes, as llama.cpp derives them from `tokenizer.ggml.token_type`.
pub(crate) const ATTR_UNKNOWN: u16 = 1 << 0;
pub(crate) const ATTR_UNUSED: u16 = 1 << 1;
pub(crate) const ATTR_NORMAL: u16 = 1 << 2;
pub(crate) const ATTR_CONTROL: u16 = 1 << 3;
pub(crate) const ATTR_USER_DEFINED: u16 = 1 << 4;
pub(crate) const ATTR_BYTE: u16 = 1 << 5;

/// Tokens hidden from plain decoding and, without `parse_special`, never matched in text.
pub(crate) const ATTR_HIDDEN: u16 = ATTR_UNKNOWN | ATTR_CONTROL;

/// Marks "no id" in the per-byte tables and symbol lists.
pub(crate) const NO_ID: u32 = u32::MAX;

/// The tokenizer model named by `tokenizer.ggml.model` (boxed: both hold
/// per-byte tables).
enum Model {
    /// `gpt2`: byte-level BPE.
    Bpe(Box<Bpe>),
    /// `llama`: SentencePiece.
    Spm(Box<Spm>),
}

/// A tokenizer reproducing llama.cpp's: byte-level BPE (`gpt2`) or
/// SentencePiece (`llama`), chosen by the model file.
pub struct Tokenizer {
    /// Token texts as llama.cpp holds them (an empty GGUF string becomes `[EMPTY_<id>]`).
    tokens: Vec<String>,
    attrs: Vec<u16>,
    /// Text -> id; with duplicate texts the last id wins, as in llama.cpp.
    text_to_id: FastMap<String, u32>,
    model: Model,
    /// Tokens split out of raw text before the model encodes it.
    specials: Specials,
    /// Concatenated pieces (bytes each token renders to with specials shown).
    pieces: Vec<u8>,
    piece_off: Vec<u32>,
    eog: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    chat_template: Option<String>,
    vocab_hash: u64,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Tokenizer");
        d.field("vocab_size", &self.tokens.len());
        match &self.model {
            Model::Bpe(m) => d.field("model", m),
            Model::Spm(m) => d.field("model", m),
        };
        d.field("specials", &self.specials).field("bos", &self.bos).field("eos", &self.eos).field("eog", &self.eog).finish_non_exhaustive()
    }
}

// The engine shares one tokenizer across threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
};

pub(crate) fn string_array<'a>(g: &'a Gguf, key: &str) -> Result<Option<Vec<&'a str>>, TokenizerError> {
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

pub(crate) fn opt_str<'a>(g: &'a Gguf, key: &str) -> Result<Option<&'a str>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => {
            v.as_str().map(Some).ok_or_else(|| TokenizerError::WrongType { key: key.into(), expected: "string", found: v.type_name() })
        }
    }
}

pub(crate) fn opt_u64(g: &Gguf, key: &str) -> Result<Option<u64>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| TokenizerError::WrongType {
            key: key.into(),
            expected: "unsigned integer",
            found: v.type_name(),
        }),
    }
}

pub(crate) fn opt_bool(g: &Gguf, key: &str) -> Result<Option<bool>, TokenizerError> {
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

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.*` metadata, deriving token
    /// attributes, special ids and end-of-generation tokens the way llama.cpp does.
    pub fn from_gguf(g: &Gguf) -> Result<Self, TokenizerError> {
        let model = opt_str(g, "tokenizer.ggml.model")?.ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.model".into()))?;
        let spm = match model {
            "gpt2" => false,
            "llama" => true,
            _ => return Err(TokenizerError::UnsupportedModel(model.into())),
        };
        // SentencePiece has no pre-tokenizer: llama.cpp ignores `tokenizer.ggml.pre`
        // there. For BPE, llama.cpp falls back to a "default" pre-tokenizer we do
        // not implement.
        let pre = if spm {
            None
        } else {
            let pre_name = opt_str(g, "tokenizer.ggml.pre")?.unwrap_or("default");
            Some(PreTokenizer::from_name(pre_name).ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.into()))?)
        };

        let raw_tokens =
            string_array(g, "tokenizer.ggml.tokens")?.ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.tokens".into()))?;
        let n = raw_tokens.len();
        if n == 0 || n >= NO_ID as usize / 2 {
            return Err(TokenizerError::Invalid(format!("vocabulary has {n} tokens")));
        }
        let vocab_hash = fnv1a_vocab(raw_tokens.iter().copied());

        // An empty token text would match everywhere when splitting out specials.
        let tokens: Vec<String> =
            raw_tokens.iter().enumerate().map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { (*t).to_owned() }).collect();
        drop(raw_tokens);

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

        let mut text_to_id: FastMap<String, u32> = FastMap::with_capacity_and_hasher(n, Default::default());
        for (i, t) in tokens.iter().enumerate() {
            text_to_id.insert(t.clone(), i as u32);
        }

        // --- special ids: model defaults, then metadata, then detection by text ---
        let valid = |id: u64| (id < n as u64).then_some(id as u32);
        let mut special_ids: HashMap<&str, u32> = HashMap::new();
        // llama.cpp's defaults when the metadata has no ids (dropped when out of range).
        let defaults: &[(&str, u64)] = if spm {
            &[("tokenizer.ggml.bos_token_id", 1), ("tokenizer.ggml.eos_token_id", 2), ("tokenizer.ggml.unknown_token_id", 0)]
        } else {
            &[("tokenizer.ggml.bos_token_id", 11), ("tokenizer.ggml.eos_token_id", 11)]
        };
        for &(key, id) in defaults {
            if let Some(id) = valid(id) {
                special_ids.insert(key, id);
            }
        }
        let keys = [
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.unknown_token_id",
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
        // gemma4 / plamo: `</s>` is an ordinary token. (Not in Gemma 3, whose
        // user-defined `</s>` llama.cpp makes a control and end-of-generation token.)
        if let Some(s) = has(&eog, "</s>") {
            if has(&eog, "<|tool_response>").is_some() || has(&eog, "<|plamo:eos|>").is_some() {
                eog.retain(|&i| i != s);
                attrs[s as usize] = ATTR_NORMAL;
            }
        }

        let model = match pre {
            Some(pre) => Model::Bpe(Box::new(Bpe::from_gguf(g, pre, &text_to_id, n)?)),
            None => {
                let unk = special_ids.get("tokenizer.ggml.unknown_token_id").copied();
                Model::Spm(Box::new(Spm::from_gguf(g, &tokens, &text_to_id, unk)?))
            }
        };

        let specials = Specials::new(&tokens, &attrs);

        // --- pieces ---
        let mut pieces = Vec::with_capacity(tokens.iter().map(String::len).sum());
        let mut piece_off = Vec::with_capacity(n + 1);
        piece_off.push(0u32);
        for (t, &a) in tokens.iter().zip(&attrs) {
            render_piece(t, a, spm, &mut pieces);
            piece_off.push(u32::try_from(pieces.len()).map_err(|_| TokenizerError::Invalid("vocabulary text too large".into()))?);
        }

        // llama.cpp: SentencePiece vocabularies add BOS unless told otherwise.
        let add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token")?.unwrap_or(spm);
        let chat_template = opt_str(g, "tokenizer.chat_template")?.map(str::to_owned);

        Ok(Self {
            bos: special_ids.get("tokenizer.ggml.bos_token_id").copied(),
            eos: special_ids.get("tokenizer.ggml.eos_token_id").copied(),
            tokens,
            attrs,
            text_to_id,
            model,
            specials,
            pieces,
            piece_off,
            eog,
            add_bos,
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
        let frags = self.specials.partition(text, &self.tokens, parse_special);
        match &self.model {
            Model::Bpe(bpe) => {
                let mut scratch = bpe::Scratch::default();
                for frag in frags {
                    match frag {
                        Frag::Token(id) => out.push(id),
                        Frag::Text(a, b) => bpe.encode(&text[a..b], &mut out, &mut scratch),
                    }
                }
            }
            Model::Spm(spm) => {
                let mut scratch = spm::Scratch::default();
                // As in llama.cpp, the start of the text counts as following a
                // special token (whether or not a BOS will precede it).
                let mut after_special = true;
                for frag in frags {
                    match frag {
                        Frag::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Frag::Text(a, b) => {
                            spm.encode(&text[a..b], after_special, &self.text_to_id, &mut out, &mut scratch);
                            after_special = false;
                        }
                    }
                }
            }
        }
        out
    }

    #[inline]
    fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_off.len() {
            return &[];
        }
        &self.pieces[self.piece_off[i] as usize..self.piece_off[i + 1] as usize]
    }

    /// Whether detokenizing drops one leading space of the first token: llama.cpp
    /// does so for vocabularies that add a space prefix when encoding, so that
    /// decoding a whole encoded text gives it back.
    fn strip_first_space(&self) -> bool {
        matches!(&self.model, Model::Spm(m) if m.add_space_prefix())
    }

    fn detokenize(&self, ids: &[u32], special: bool) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let mut p = if special { self.piece(id) } else { self.token_bytes(id) };
            if i == 0 && self.strip_first_space() {
                p = p.strip_prefix(b" ").unwrap_or(p);
            }
            bytes.extend_from_slice(p);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Decodes ids to text; control and unknown tokens render as nothing.
    /// Invalid UTF-8 is replaced only once, over the whole byte string, so a
    /// character split across tokens survives. For a SentencePiece vocabulary
    /// with `add_space_prefix`, the first token's leading space is dropped
    /// (llama.cpp's `llama_detokenize`); [`crate::StreamDecoder`] keeps it.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.detokenize(ids, false)
    }

    /// Like [`Tokenizer::decode`] but control tokens render as their text
    /// (llama.cpp's `special = true`), e.g. for showing a full prompt.
    pub fn decode_special(&self, ids: &[u32]) -> String {
        self.detokenize(ids, true)
    }

    /// The raw bytes token `id` decodes to; empty for control/unknown tokens and
    /// for ids outside the vocabulary. A piece may be part of a UTF-8 character
    /// (byte-level BPE tokens and SentencePiece's `<0xXX>` byte tokens).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        match self.attrs.get(id as usize) {
            Some(&a) if a & ATTR_HIDDEN == 0 => self.piece(id),
            _ => &[],
        }
    }

    /// The vocabulary text of `id` as stored (byte-level characters such as `Ġ`,
    /// or SentencePiece's `▁`, included); empty for ids outside the vocabulary.
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

    /// Whether prompts should start with BOS (`tokenizer.ggml.add_bos_token`;
    /// llama.cpp defaults it to true for SentencePiece and false for BPE).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// End-of-generation: EOS, EOT/EOM and the tokens llama.cpp recognises by
    /// text (`<|im_end|>`, `<end_of_turn>`, `<|endoftext|>`, ... and the FIM
    /// pad/repo/sep tokens).
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
fn render_piece(text: &str, attr: u16, spm: bool, out: &mut Vec<u8>) {
    if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED) != 0 {
        out.extend_from_slice(text.as_bytes());
    } else if attr & ATTR_NORMAL != 0 && spm {
        // SentencePiece: `▁` stands for a space.
        for c in text.chars() {
            match c {
                '▁' => out.push(b' '),
                c => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
            }
        }
    } else if attr & ATTR_NORMAL != 0 {
        // Byte-level BPE: each character stands for one byte.
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
        out.push(byte_token_value(text));
    }
}

/// The byte of a `<0xAB>` byte token. llama.cpp reads it with
/// `strtol(text.substr(3, 2), NULL, 16)`, truncated to a char: on malformed
/// texts that gives leading whitespace skipped, a sign honoured, an optional
/// `0x` prefix, as many hex digits as there are, and 0 when there are none.
fn byte_token_value(text: &str) -> u8 {
    let s = text.as_bytes().get(3..).unwrap_or(&[]);
    let s = &s[..s.len().min(2)];
    let mut i = 0;
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        i += 1;
    }
    let neg = i < s.len() && s[i] == b'-';
    if i < s.len() && (s[i] == b'-' || s[i] == b'+') {
        i += 1;
    }
    // A "0x" prefix counts only when a hex digit follows it.
    if i + 2 < s.len() && s[i] == b'0' && (s[i + 1] | 0x20) == b'x' && s[i + 2].is_ascii_hexdigit() {
        i += 2;
    }
    let mut v: i64 = 0;
    while i < s.len() {
        let Some(d) = (s[i] as char).to_digit(16) else { break };
        v = v * 16 + d as i64;
        i += 1;
    }
    (if neg { -v } else { v }) as u8
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
                w.set("tokenizer.ggml.model", Value::String("bert".into()));
            }),
            Err(TokenizerError::UnsupportedModel(m)) if m == "bert"
        ));
        // `llama` is SentencePiece, which needs scores this vocabulary lacks.
        assert!(matches!(
            tiny(|w| {
                w.set("tokenizer.ggml.model", Value::String("llama".into()));
            }),
            Err(TokenizerError::MissingKey(k)) if k == "tokenizer.ggml.scores"
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
    fn byte_token_values_follow_strtol() {
        assert_eq!(byte_token_value("<0x41>"), 0x41);
        assert_eq!(byte_token_value("<0xff>"), 0xff);
        // Malformed texts, read the way llama.cpp's strtol reads them.
        assert_eq!(byte_token_value("<0x4G>"), 4);
        assert_eq!(byte_token_value("<0xG4>"), 0);
        assert_eq!(byte_token_value("<0x 7>"), 7);
        assert_eq!(byte_token_value("<0x-1>"), 0xff);
        assert_eq!(byte_token_value("<0x0x>"), 0);
        assert_eq!(byte_token_value("<0xA"), 0xa);
        assert_eq!(byte_token_value("<0"), 0);
        assert_eq!(byte_token_value("<0xé>"), 0);
    }

    #[test]
    fn fallback_template_is_chatml_without_gemma_turns() {
        let t = tiny(|_| {}).unwrap();
        let out = crate::ChatTemplate::fallback(&t).render(&[crate::ChatMessage::new("user", "Hi")], true, "", "").unwrap();
        assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
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
