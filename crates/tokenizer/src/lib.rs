//! tandem-tokenizer
