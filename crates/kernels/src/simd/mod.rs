//! Runtime selection of the SIMD implementation.
//!
//! Every SIMD kernel has a scalar twin with the same lane structure, so the
//! choice changes speed only, never results. `TANDEM_SIMD=scalar` forces the
//! scalar path and `TANDEM_SIMD=avx2` turns off the AVX-VNNI variants (used by
//! tests and for A/B checks).

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni;

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

static VNNI: OnceLock<bool> = OnceLock::new();

/// Whether the packed kernels use their AVX-VNNI variants (`vpdpbusd`), which
/// give the same bits as the AVX2 ones with fewer instructions per row.
pub fn vnni() -> bool {
    *VNNI.get_or_init(|| {
        if simd_level() != SimdLevel::Avx2 || std::env::var("TANDEM_SIMD").map(|v| v == "avx2").unwrap_or(false) {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avxvnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}
