//! Fuzz harnesses: one function per input format tandem takes from others.
//! Each must return for any input — an `Ok` or a typed error — and never
//! panic, hang or allocate without bound; any panic is a bug. The driver
//! is `fuzz-mutate` (this crate's binary, stable Rust): structured mutation
//! of seed files (`fuzz-seeds`) for a given time, with panics caught and
//! the inputs saved (`scripts/fuzz.sh` runs them all). The functions take
//! bytes, so a coverage-guided driver (cargo-fuzz, AFL) can call them as
//! they are.
//!
//! Crashes found become files under `tests/data/fuzz/regressions/<target>/`,
//! replayed by this crate's tests.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use tandem_gguf::Gguf;
use tandem_model::support::{detect_kind, SupportKind, TargetId};
use tandem_model::{DSparkModel, Model, MtpHead};
use tandem_tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};

/// A harness: one input, any bytes.
pub type Harness = fn(&[u8]);

/// The targets, by name.
pub const TARGETS: &[(&str, Harness)] =
    &[("gguf", gguf), ("support", support), ("tokenizer", tokenizer), ("chat_template", chat_template), ("request", request)];

/// The target called `name`.
pub fn target(name: &str) -> Option<Harness> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// The repository root (seeds and models are found from here).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The GGUF reader: header, metadata, tensor table, data offsets, and
/// every accessor a caller might touch on a file it accepted.
pub fn gguf(data: &[u8]) {
    let Ok(g) = Gguf::from_bytes(data.to_vec()) else { return };
    for (k, v) in &g.metadata {
        let _ = v.display_short(4);
        let _ = (v.as_u64(), v.as_i64(), v.as_f64(), v.as_str(), v.as_array(), v.as_bool());
        let _ = (g.get_u64(k), g.get_f64(k), g.get_str(k), g.get_array(k));
    }
    for t in &g.tensors {
        let bytes = g.tensor_data(t);
        assert!(bytes.len() as u64 == t.size, "{}: {} bytes for a size of {}", t.name, bytes.len(), t.size);
        let _ = (t.n_elements(), t.ne0(), t.n_rows());
    }
    // what the engine builds from a file it opens
    let _ = Tokenizer::from_gguf(&g);
    let _ = tandem_model::Config::from_gguf(&g);
}

/// The default model, when it is in models/ (support files bind to it).
fn smollm2() -> Option<&'static (Arc<Model>, TargetId)> {
    static M: OnceLock<Option<(Arc<Model>, TargetId)>> = OnceLock::new();
    M.get_or_init(|| {
        let path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let g = Arc::new(Gguf::open(&path).ok()?);
        let tok = Tokenizer::from_gguf(&g).ok()?;
        let model = Arc::new(Model::from_gguf(g).ok()?);
        let id = TargetId::new(&model.cfg, tok.vocab_hash());
        Some((model, id))
    })
    .as_ref()
}

/// Support files (MTP heads and DSpark drafters, copy-hint metadata
/// included) validated against the default model and loaded.
pub fn support(data: &[u8]) {
    let Ok(g) = Gguf::from_bytes(data.to_vec()) else { return };
    let g = Arc::new(g);
    let Ok(kind) = detect_kind(&g) else { return };
    let Some((target, id)) = smollm2() else { return };
    match kind {
        SupportKind::Mtp => {
            let _ = MtpHead::load(g, target.clone(), id);
        }
        SupportKind::DSpark => {
            let _ = DSparkModel::load(g, target.clone(), id);
        }
    }
}

/// The tokenizers of the default model (byte-level BPE) and of Gemma 3
/// (SentencePiece), when their files are here; the first input byte picks
/// one. Encoding with and without special tokens, decoding, streaming,
/// and the round trip of text without special tokens.
pub fn tokenizer(data: &[u8]) {
    static TOKS: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    let toks = TOKS.get_or_init(|| {
        ["models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/gemma-3-270m-q4_k_m.gguf"]
            .iter()
            .filter_map(|p| Gguf::open(root().join(p)).ok())
            .filter_map(|g| Tokenizer::from_gguf(&g).ok())
            .collect()
    });
    let Some((&pick, rest)) = data.split_first() else { return };
    let Some(tok) = toks.get(pick as usize % toks.len().max(1)) else { return };
    let text = String::from_utf8_lossy(rest);
    for special in [false, true] {
        let ids = tok.encode(&text, special);
        let back = tok.decode(&ids);
        let _ = tok.decode_special(&ids);
        let mut stream = StreamDecoder::new();
        let mut streamed = Vec::new();
        for &id in &ids {
            streamed.extend_from_slice(stream.push(tok, id).as_bytes());
        }
        streamed.extend_from_slice(stream.flush().as_bytes());
        assert!(std::str::from_utf8(&streamed).is_ok());
        if !special {
            // without special tokens, text comes back, less the bytes the
            // vocabulary cannot spell (SmolLM2 has no token for some bytes;
            // llama.cpp drops them the same way): what each character alone
            // round-trips to
            let spellable: String = text.chars().map(|c| tok.decode(&tok.encode(&c.to_string(), false))).collect();
            assert_eq!(back, spellable, "encode then decode changed the text");
        }
    }
    // arbitrary ids
    let ids: Vec<u32> = rest.chunks(4).map(|c| c.iter().fold(0u32, |a, &b| a << 8 | b as u32) % (tok.vocab_size() as u32 + 2)).collect();
    let _ = tok.decode(&ids);
}

/// Chat templates from hostile files: any source compiles or fails, and a
/// render finishes within the fuel bound (loops, huge outputs, deep
/// recursion) or fails.
pub fn chat_template(data: &[u8]) {
    let src = String::from_utf8_lossy(data);
    let Ok(t) = ChatTemplate::new(&src) else { return };
    let msgs = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi {{ x }}"), ChatMessage::new("assistant", "Hello")];
    let _ = t.render(&msgs, true, "<s>", "</s>");
}

/// The server's request bodies for both endpoints.
pub fn request(data: &[u8]) {
    use tandem_server::request::{parse, Endpoint};
    let _ = parse(Endpoint::Chat, data);
    let _ = parse(Endpoint::Completion, data);
}
