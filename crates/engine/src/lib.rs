//! The generation engine: a loaded model with its tokenizer and thread pool,
//! sessions that own a KV cache and decode plainly or speculatively, and the
//! measurement jobs (bench, perplexity). The CLI and the server are built on
//! [`Session`].

#![forbid(unsafe_code)]

pub mod bench;
pub mod fetch;
pub mod perplexity;
pub mod prompts;
pub mod requantize;
mod session;
pub mod speculation;

pub use session::{Conflict, Engine, EngineError, GenParams, GenStats, Session, StopReason, SupportProblem};
pub use speculation::SpecOptions;
/// Sampling, below plain and speculative decoding alike.
pub use tandem_sampling as sampling;
pub use tandem_sampling::{Sampler, SamplerParams};
pub use tandem_speculative::{CycleRecord, Setting, SpecError, SpecLog, SpecStats, Speculator};
