//! tandem-model
