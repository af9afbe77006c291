//! Speculative decoding: a drafter proposes tokens, the target evaluates
//! `[t, d1..dk]` in one batched forward pass, and the longest agreeing prefix is
//! committed. Because the model's kernels are batch-invariant, the verify rows
//! *are* the rows plain decoding would compute: greedy output is bit-identical
//! to plain greedy decoding and rollback is truncating the KV cache.
//!
//! - [`Drafter`]: what n-gram lookup, a draft model, MTP and DSpark implement;
//!   [`HybridDrafter`] puts a free source (lookup, [`SuffixDrafter`]) in
//!   front of one of the others, or runs it alone.
//! - [`verify`]: acceptance rules (greedy; distribution-exact sampling for
//!   point-mass and distribution drafts; ds4's opportunistic mode).
//! - [`Scheduler`]: picks the draft length that maximises expected committed
//!   tokens per second from measured verify costs and acceptance estimates.
//! - [`Speculator`]: runs one cycle on a model and its cache.
//! - [`Decoder`]: plain and speculative decoding behind one interface, which
//!   a session drives.

#![forbid(unsafe_code)]

pub mod cycle;
pub mod decoder;
pub mod draft_model;
pub mod drafter;
pub mod dspark;
pub mod hybrid;
pub mod mtp;
pub mod ngram;
pub mod scheduler;
pub mod speculator;
pub mod stats;
pub mod suffix;
pub mod verify;

pub use cycle::{Ask, BatchLoad, CyclePlan, CycleRecord, FreeOffer, SpecLog, Verification};
pub use decoder::{Decoder, PlainDecoder, Step, Target};
pub use draft_model::DraftModel;
pub use drafter::{Drafter, Proposal};
pub use dspark::{DSparkDrafter, DSparkOptions};
pub use hybrid::{FreeDraft, FreeSource, HybridDrafter};
pub use mtp::MtpDrafter;
pub use ngram::NgramDrafter;
pub use scheduler::{Budget, Calibration, CostModel, Policy, Scheduler, SchedulerConfig};
pub use speculator::{PendingCycle, Prepared, Setting, SpecConfig, SpecError, Speculator};
pub use stats::SpecStats;
pub use suffix::{SuffixCache, SuffixCacheError, SuffixDrafter, SuffixOptions, VocabId};

/// Upper bound on tokens drafted per cycle.
pub const MAX_DRAFT: usize = 32;
