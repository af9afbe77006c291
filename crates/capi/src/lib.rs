//! The C API of tandem (`include/tandem.h`, `libtandem.so`, `libtandem.a`).
//!
//! An engine is a loaded model with its speculation settings; a session is a
//! conversation with its own KV cache and drafter state. Generation through a
//! session is the engine's own (`tandem -p` gives the same bits for the same
//! tokens and settings).
//!
//! Layout: [`api`] holds the exported functions and types, [`handles`] what
//! handles stand for, [`status`] the status codes and the thread's last
//! error, and [`raw`] — the one module that touches caller memory — reading
//! and writing it under written contracts.

pub mod api;
mod handles;
mod raw;
mod status;

pub use api::*;
pub use status::{tandem_status, tandem_stop};
