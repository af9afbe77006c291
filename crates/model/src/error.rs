#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] tandem_gguf::GgufError),
    #[error(transparent)]
    Weight(#[from] tandem_kernels::WeightError),
    #[error("unsupported architecture '{0}' (supported: llama, qwen2, mistral, gemma3)")]
    UnsupportedArch(String),
    #[error("model metadata: {0}")]
    BadConfig(String),
    #[error("tensor '{name}' has shape {got:?}, expected {want:?}")]
    BadShape { name: String, got: Vec<u64>, want: Vec<u64> },
    #[error("context full: {have} tokens in cache + {add} new > context size {ctx}")]
    ContextFull { have: usize, add: usize, ctx: usize },
    #[error("token id {id} out of range (vocabulary {vocab})")]
    BadToken { id: u32, vocab: usize },
    #[error("hidden-state tap at layer {layer} out of range ({n_layer} layers)")]
    BadTap { layer: usize, n_layer: usize },
    #[error("logit row {row} out of range ({m} rows in batch)")]
    BadRow { row: usize, m: usize },
    /// A split model's ranks disagree or cannot talk.
    #[error("tensor parallel: {0}")]
    Shard(String),
}
