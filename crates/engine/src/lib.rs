//! The generation engine: a loaded model with its tokenizer and thread pool,
//! sessions that own a KV cache, sampling, and the measurement jobs (bench,
//! perplexity). The CLI and (later) the server and the speculative decoder are
//! built on [`Session`].

pub mod bench;
pub mod fetch;
pub mod perplexity;
pub mod sampling;
mod session;

pub use sampling::{Sampler, SamplerParams};
pub use session::{Engine, EngineError, GenParams, GenStats, Session, StopReason};
