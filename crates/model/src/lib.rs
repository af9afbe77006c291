//! Models: configuration from GGUF metadata, weights borrowed from the map,
//! a batched forward pass and a truncatable KV cache.
//!
//! One [`Model::forward`] call evaluates a batch of consecutive positions and
//! returns logits for the rows asked for and hidden states at the layers asked
//! for. Because every kernel is batch-invariant, a row's results do not depend
//! on how many positions were evaluated with it: speculative verification can
//! use them directly and roll back by truncating the cache.

#![forbid(unsafe_code)]

mod config;
pub mod dspark;
mod error;
mod kv;
pub mod mtp;
pub mod shard;
pub mod support;
pub mod synthetic;
mod transformer;
mod weights;

pub use config::{Activation, Config, RopeStyle};
pub use dspark::{DSparkConfig, DSparkModel, DSparkWeights};
pub use error::ModelError;
pub use kv::{KvCache, KvSnapshot, KvType};
pub use mtp::MtpHead;
pub use support::{SupportError, SupportKind, TargetId};
pub use transformer::{ForwardOutput, HiddenTap, LogitRows, Model, Segment, SegmentLogits};
pub use weights::WeightRef;
