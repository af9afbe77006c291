//! The runtime: a loaded model (from a file or fetched by name) with its
//! tokenizer and thread pool, and sessions that own a KV cache and decode
//! plainly or speculatively. The CLI, the server and the measuring tools
//! (crates/tools) are built on [`Session`].

#![forbid(unsafe_code)]

pub mod batch;
pub mod distributed;
pub mod fetch;
mod session;
pub mod speculation;

pub use batch::{Batch, BatchConfig, PrefixStats, Request, SlotEvent, StepReport};
pub use session::{
    Conflict, Engine, EngineError, GenParams, GenStats, Session, SessionSnapshot, StopReason, SupportProblem, PREFILL_CHUNK,
};
pub use speculation::SpecOptions;
/// Worker threads by default: the physical cores.
pub use tandem_kernels::pool::physical_cores;
pub use tandem_model::ModelError;
/// Sampling, below plain and speculative decoding alike.
pub use tandem_sampling as sampling;
pub use tandem_sampling::{Sampler, SamplerParams};
pub use tandem_speculative::suffix::{DEFAULT_CACHE_TOKENS as SUFFIX_DEFAULT_CACHE_TOKENS, DEFAULT_DRAFT as SUFFIX_DEFAULT_DRAFT};
pub use tandem_speculative::{CycleRecord, Setting, SpecError, SpecLog, SpecStats, Speculator, SuffixCache, SuffixCacheError};
