//! Runtime selection of the SIMD implementation.
//!
//! Every SIMD kernel has a scalar twin with the same lane structure, so the
//! choice changes speed only, never results. `TANDEM_SIMD=scalar` forces the
//! scalar path (used by tests and for A/B checks).

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
}

static LEVEL: OnceLock<SimdLevel> = OnceLock::new();

fn detect() -> SimdLevel {
    if std::env::var("TANDEM_SIMD").map(|v| v == "scalar").unwrap_or(false) {
        return SimdLevel::Scalar;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Scalar
}

/// The SIMD level in use for this process.
pub fn simd_level() -> SimdLevel {
    *LEVEL.get_or_init(detect)
}
