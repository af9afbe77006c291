//! CPU kernels for tandem.
//!
//! The central promise of this crate is **batch invariance**: every output row of
//! every kernel is computed with one fixed reduction order that does not depend on
//! how many rows are in the call or how many threads run it. Speculative
//! verification relies on it: the row of a k+1-row verify pass is bit-identical
//! to the row of a single-token decode step.
//!
//! Layout:
//! - [`quant`]: block formats (scalar decode, dequantize, quantize) and the int8
//!   activation blocks that quantized matmuls consume.
//! - [`simd`]: `std::arch` kernels, one module per ISA, each mirrored by a scalar
//!   twin in [`quant::dot`] that produces the *same bits*.
//! - [`matmul`]: M-row × N-column products, split over output columns only.
//! - [`ops`]: row-wise operations (RMSNorm, RoPE, softmax, SwiGLU, attention).
//! - [`pool`]: a persistent spin-then-park worker pool.

// Kernels index several arrays (weights, activations, accumulators) by one
// element or lane index; written as index loops, the reduction order the twins
// must share is plain to read.
#![allow(clippy::needless_range_loop)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod matmul;
pub mod ops;
pub mod pack;
pub mod pool;
pub mod quant;
pub mod simd;

pub use matmul::{matmul, Weight, WeightError};
pub use pool::ThreadPool;
pub use simd::{simd_level, vnni, vnni_kind, wide, wide_min_rows, SimdLevel, Vnni};
