//! Measuring tools built on the engine: plain-decoding benchmarks (frontiers
//! and batch costs), the prompt-set benchmark of plain against speculative
//! decoding with its CSV and SVG reports, perplexity, and requantizing a
//! GGUF file. The `tandem` CLI runs them (`bench`, `perplexity`, `quantize`).

#![forbid(unsafe_code)]

pub mod bench;
pub mod perplexity;
pub mod prompt_bench;
pub mod requantize;
