//! tandem-tokenizer: llama.cpp's byte-level BPE (`gpt2`) and SentencePiece
//! (`llama`) tokenizers built from GGUF metadata, and chat-template rendering.
//!
//! The goal is token-for-token agreement with llama.cpp, because the model was
//! evaluated (and our reference vectors recorded) with llama.cpp's tokenizer:
//! any divergence changes what the model sees. Where llama.cpp has a quirk, we
//! reproduce it and say so.

#![forbid(unsafe_code)]

mod bpe;
mod chat;
mod hash;
mod pretok;
mod special;
mod spm;
mod stream;
mod template_budget;
mod tokenizer;
mod unicode;

pub use chat::{ChatMessage, ChatTemplate};
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;

/// Everything that can go wrong building a tokenizer or rendering a template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required GGUF metadata key is absent.
    #[error("missing GGUF metadata key `{0}`")]
    MissingKey(String),
    /// A GGUF metadata key holds a value of the wrong type.
    #[error("GGUF metadata key `{key}` has the wrong type: expected {expected}, found {found}")]
    WrongType { key: String, expected: &'static str, found: &'static str },
    /// The metadata is present and typed right but inconsistent (e.g. an empty vocabulary).
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
    /// `tokenizer.ggml.model` names a tokenizer other than byte-level BPE (`gpt2`)
    /// or SentencePiece (`llama`).
    #[error("unsupported tokenizer model `{0}` (supported: `gpt2`, byte-level BPE; `llama`, SentencePiece)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer we have not implemented.
    #[error("unsupported pre-tokenizer `{0}` (supported: `smollm`, `gpt-2`)")]
    UnsupportedPreTokenizer(String),
    /// The chat template failed to compile or to render (including `raise_exception`
    /// and running out of fuel).
    #[error("chat template error: {0}")]
    Template(String),
}
