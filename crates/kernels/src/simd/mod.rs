//! Runtime selection of the SIMD implementation.
//!
//! Every SIMD kernel has a scalar twin with the same lane structure, so the
//! choice changes speed only, never results. `TANDEM_SIMD=scalar` forces the
//! scalar path and `TANDEM_SIMD=avx2` turns off the AVX-VNNI variants (used by
//! tests and for A/B checks).

use std::sync::OnceLock;

/// Unpack one Q4x8 group block at byte pointer `$p` (see `pack`): the eight
/// column scales and mins as f32 and the 256 nibbles as eight byte vectors,
/// `r[j]` holding elements 4j..4j+4 of each column (low nibbles for j < 4,
/// high nibbles, elements 16+4(j−4).., for j ≥ 4). Shared by the AVX2 and VNNI
/// Q4x8 kernels; a macro rather than a function so it expands inside each
/// kernel's own target features. Needs AVX2 and F16C, and `$p` valid for
/// `Q4X8_BLOCK` bytes.
#[cfg(target_arch = "x86_64")]
macro_rules! unpack_q4x8_block {
    ($p:expr, $m4:expr) => {{
        let p: *const u8 = $p;
        let dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let mv = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
        let mut r = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let pj = _mm256_loadu_si256(p.add(32 + 32 * j) as *const __m256i);
            r[j] = _mm256_and_si256(pj, $m4);
            r[j + 4] = _mm256_and_si256(_mm256_srli_epi16(pj, 4), $m4);
        }
        (dv, mv, r)
    }};
}

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

/// Which encoding of `vpdpbusd` the packed kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vnni {
    /// None: the AVX2 kernels (`maddubs` + `madd`).
    None,
    /// AVX-VNNI (VEX).
    Avx,
    /// AVX512-VNNI with AVX512VL, on 256-bit registers (EVEX).
    Evex,
}

static VNNI: OnceLock<Vnni> = OnceLock::new();

/// The VNNI variant of the packed kernels in use; they give the same bits as
/// the AVX2 ones with fewer instructions per row. `TANDEM_SIMD=avx2` turns
/// them off.
pub fn vnni_kind() -> Vnni {
    *VNNI.get_or_init(|| {
        if simd_level() != SimdLevel::Avx2 || std::env::var("TANDEM_SIMD").map(|v| v == "avx2").unwrap_or(false) {
            return Vnni::None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avxvnni") {
                return Vnni::Avx;
            }
            if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                return Vnni::Evex;
            }
        }
        Vnni::None
    })
}

/// Whether the packed kernels use a VNNI variant.
pub fn vnni() -> bool {
    vnni_kind() != Vnni::None
}
