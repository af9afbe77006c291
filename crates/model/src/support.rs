//! Support files: small GGUFs that hold a drafter for one target model (an
//! MTP head or a DSpark block drafter). They share the target's embedding and
//! output head, so they must be refused when they do not fit the target. This
//! module names the metadata that binds a file to its target and tells the
//! kinds apart by their tensors. The layout is documented in
//! `docs/support-format.md`.

use tandem_gguf::{Gguf, GgufError, Value};

use crate::{Config, ModelError};

/// Metadata keys binding a support file to its target.
pub mod keys {
    pub const KIND: &str = "tandem.support.kind";
    pub const TARGET_ARCH: &str = "tandem.support.target.architecture";
    pub const TARGET_LAYERS: &str = "tandem.support.target.block_count";
    pub const TARGET_WIDTH: &str = "tandem.support.target.embedding_length";
    pub const TARGET_FFN: &str = "tandem.support.target.feed_forward_length";
    pub const TARGET_HEADS: &str = "tandem.support.target.head_count";
    pub const TARGET_KV_HEADS: &str = "tandem.support.target.head_count_kv";
    pub const TARGET_VOCAB: &str = "tandem.support.target.vocab_size";
    /// FNV-1a 64 of the token list, as 16 hex digits (see the tokenizer's `vocab_hash`).
    pub const TARGET_VOCAB_HASH: &str = "tandem.support.target.vocab_hash";
}

/// What a support file holds, decided by its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SupportKind {
    /// One next-token-prediction module (`blk.N.nextn.*`).
    Mtp,
    /// A DFlash/DSpark block drafter (`fc`, `enc.output_norm`, …).
    DSpark,
}

impl std::fmt::Display for SupportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SupportKind::Mtp => "MTP",
            SupportKind::DSpark => "DSpark",
        })
    }
}

/// Why a support file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SupportError {
    #[error("cannot read support file: {0}")]
    Gguf(#[from] GgufError),
    #[error("not a support model: no MTP (`blk.N.nextn.eh_proj.weight`) or DSpark (`fc.weight`) tensors")]
    UnknownKind,
    #[error("{kind} metadata error: {msg}")]
    Metadata { kind: SupportKind, msg: String },
    #[error("support file was made for another model: {what} is {file} in the file but {target} in the target")]
    TargetMismatch { what: &'static str, file: String, target: String },
    #[error("{kind} tensor missing: {name}")]
    MissingTensor { kind: SupportKind, name: String },
    #[error("{kind} tensor {name} has type {ty}, expected {want}")]
    BadType { kind: SupportKind, name: String, ty: String, want: &'static str },
    #[error("{0} tensor error: {1}")]
    Tensor(SupportKind, #[source] ModelError),
}

/// An integer-array metadata key of a `kind` file (None: absent).
pub(crate) fn int_array(g: &Gguf, key: &str, kind: SupportKind) -> Result<Option<Vec<i64>>, SupportError> {
    let meta = |msg: String| SupportError::Metadata { kind, msg };
    match g.get(key) {
        None => Ok(None),
        Some(tandem_gguf::Value::Array(_, items)) => items
            .iter()
            .map(|v| v.as_i64().ok_or_else(|| meta(format!("{key} holds a non-integer"))))
            .collect::<Result<Vec<i64>, _>>()
            .map(Some),
        Some(_) => Err(meta(format!("{key} is not an array"))),
    }
}

/// Decide the kind of a support file by its tensors.
pub fn detect_kind(g: &Gguf) -> Result<SupportKind, SupportError> {
    if g.tensors.iter().any(|t| t.name.ends_with(".nextn.eh_proj.weight")) {
        Ok(SupportKind::Mtp)
    } else if g.tensor_info("fc.weight").is_some() {
        Ok(SupportKind::DSpark)
    } else {
        Err(SupportError::UnknownKind)
    }
}

/// What identifies a target: its shapes and the hash of its token list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetId {
    pub arch: String,
    pub n_layer: usize,
    pub d_model: usize,
    pub ffn: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub vocab: usize,
    pub vocab_hash: u64,
}

impl TargetId {
    pub fn new(cfg: &Config, vocab_hash: u64) -> Self {
        TargetId {
            arch: cfg.arch.clone(),
            n_layer: cfg.n_layer,
            d_model: cfg.d_model,
            ffn: cfg.ffn,
            n_head: cfg.n_head,
            n_kv_head: cfg.n_kv_head,
            vocab: cfg.vocab,
            vocab_hash,
        }
    }

    /// The metadata a support file for this target carries.
    pub fn metadata(&self, kind: &str) -> Vec<(&'static str, Value)> {
        vec![
            (keys::KIND, Value::String(kind.into())),
            (keys::TARGET_ARCH, Value::String(self.arch.clone())),
            (keys::TARGET_LAYERS, Value::U32(self.n_layer as u32)),
            (keys::TARGET_WIDTH, Value::U32(self.d_model as u32)),
            (keys::TARGET_FFN, Value::U32(self.ffn as u32)),
            (keys::TARGET_HEADS, Value::U32(self.n_head as u32)),
            (keys::TARGET_KV_HEADS, Value::U32(self.n_kv_head as u32)),
            (keys::TARGET_VOCAB, Value::U32(self.vocab as u32)),
            (keys::TARGET_VOCAB_HASH, Value::String(format!("{:016x}", self.vocab_hash))),
        ]
    }

    /// Check a DSpark file's binding against this target. Files written
    /// by llama.cpp's converter carry no `tandem.support.*` key, only the
    /// target's tokenizer: when the file has no key of that prefix, its
    /// `tokenizer.ggml.tokens` stand in for the binding (their count and
    /// hash must be the target's; the width and layer checks of the format
    /// still bind the rest), and the returned warning says so. A file with
    /// any binding key gets the full [`Self::check`].
    pub fn check_or_derive(&self, g: &Gguf, kind: SupportKind) -> Result<Option<String>, SupportError> {
        if g.metadata.iter().any(|(k, _)| k.starts_with("tandem.support.")) {
            return self.check(g, kind).map(|()| None);
        }
        let meta = |msg: String| SupportError::Metadata { kind, msg };
        let tokens = match g.get("tokenizer.ggml.tokens") {
            Some(Value::Array(_, items)) => items,
            Some(_) => return Err(meta("tokenizer.ggml.tokens is not an array".into())),
            None => {
                return Err(meta(format!(
                    "no binding metadata: the file has neither {} (and the other tandem.support.* keys) nor tokenizer.ggml.tokens",
                    keys::TARGET_VOCAB
                )))
            }
        };
        let mismatch = |what: &'static str, file: String, target: String| SupportError::TargetMismatch { what, file, target };
        if tokens.len() != self.vocab {
            return Err(mismatch("vocabulary size", tokens.len().to_string(), self.vocab.to_string()));
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for t in tokens {
            let Value::String(s) = t else {
                return Err(meta("tokenizer.ggml.tokens holds a value that is not a string".into()));
            };
            for &b in s.as_bytes().iter().chain(&[0u8]) {
                h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        if h != self.vocab_hash {
            return Err(mismatch("the token list hash", format!("{h:016x}"), format!("{:016x}", self.vocab_hash)));
        }
        Ok(Some(format!(
            "{kind} file carries no tandem binding (tandem.support.*): bound to the target by its own token list ({} tokens, hash {h:016x}) only",
            tokens.len()
        )))
    }

    /// Check a support file's binding metadata against this target. The
    /// vocabulary comes first: it is what another model's file gets wrong.
    pub fn check(&self, g: &Gguf, kind: SupportKind) -> Result<(), SupportError> {
        let meta = |msg: String| SupportError::Metadata { kind, msg };
        let num = |key: &'static str| -> Result<u64, SupportError> {
            match g.get(key) {
                None => Err(meta(format!("missing key {key}"))),
                Some(v) => v.as_u64().ok_or_else(|| meta(format!("{key} is not an integer"))),
            }
        };
        let mismatch = |what: &'static str, file: String, target: String| SupportError::TargetMismatch { what, file, target };
        let vocab = num(keys::TARGET_VOCAB)?;
        if vocab != self.vocab as u64 {
            return Err(mismatch("vocabulary size", vocab.to_string(), self.vocab.to_string()));
        }
        let hash = match g.get(keys::TARGET_VOCAB_HASH) {
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(meta(format!("{} is not a string", keys::TARGET_VOCAB_HASH))),
            None => return Err(meta(format!("missing key {}", keys::TARGET_VOCAB_HASH))),
        };
        let want = format!("{:016x}", self.vocab_hash);
        if hash != want {
            return Err(mismatch("the token list hash", hash, want));
        }
        match g.get(keys::TARGET_ARCH) {
            Some(Value::String(a)) if *a == self.arch => {}
            Some(Value::String(a)) => return Err(mismatch("architecture", a.clone(), self.arch.clone())),
            _ => return Err(meta(format!("missing key {}", keys::TARGET_ARCH))),
        }
        for (key, what, have) in [
            (keys::TARGET_LAYERS, "block count", self.n_layer),
            (keys::TARGET_WIDTH, "embedding length", self.d_model),
            (keys::TARGET_FFN, "feed-forward length", self.ffn),
            (keys::TARGET_HEADS, "head count", self.n_head),
            (keys::TARGET_KV_HEADS, "KV head count", self.n_kv_head),
        ] {
            let v = num(key)?;
            if v != have as u64 {
                return Err(mismatch(what, v.to_string(), have.to_string()));
            }
        }
        Ok(())
    }
}
