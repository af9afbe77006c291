//! tandem-kernels
