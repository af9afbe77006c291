//! The generation engine: a loaded model with its tokenizer and thread pool,
//! sessions that own a KV cache, sampling, and the measurement jobs (bench,
//! perplexity). The CLI and (later) the server and the speculative decoder are
//! built on [`Session`].

#![forbid(unsafe_code)]

pub mod bench;
pub mod fetch;
pub mod perplexity;
pub mod prompts;
pub mod requantize;
mod session;
pub mod speculation;

pub use session::{Engine, EngineError, GenParams, GenStats, Session, StopReason};
pub use speculation::SpecOptions;
/// Sampling lives with speculation (exact acceptance needs the final distribution).
pub use tandem_speculative::sampling;
pub use tandem_speculative::sampling::{Sampler, SamplerParams};
pub use tandem_speculative::{CycleRecord, SpecLog, SpecStats, Speculator};
