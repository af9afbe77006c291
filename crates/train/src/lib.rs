//! Trainers for support models. The target generates its own training data
//! ([`data`]) from a prompt corpus written here ([`corpus`]); the drafter is
//! trained with candle ([`mtp`]) and exported as a support GGUF that the
//! engine loads with `--mtp`.

pub mod code_corpus;
pub mod column_add;
pub mod corpus;
pub mod data;
pub mod dist_loss;
pub mod dspark;
pub mod mtp;
mod nn;
pub mod runtime;
