//! GGUF container format: a bounds-checked, zero-copy reader and a writer.
//!
//! The reader never trusts a count, offset or size from the file: every one is
//! checked against the bytes that are actually there before it is used, so a
//! malformed file yields a [`GgufError`], never a panic or an out-of-bounds read.
//! Tensor data is borrowed straight from the memory map.

mod error;
mod reader;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use reader::{Gguf, TensorInfo};
pub use types::GgmlType;
pub use value::{Value, ValueType};
pub use writer::{rewrite, GgufWriter, TensorData};

/// Default alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The four magic bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
