//! Runtime selection of the SIMD implementation.
//!
//! Every SIMD kernel has a scalar twin with the same lane structure, so the
//! choice changes speed only, never results. `TANDEM_SIMD=scalar` forces the
//! scalar path, `TANDEM_SIMD=avx2` turns off the VNNI variants and
//! `TANDEM_SIMD=vnni256` only the 512-bit ones (used by tests and for A/B
//! checks).

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

/// Unpack one Q5x8 group block at byte pointer `$p` (see `pack`): the eight
/// column scales as f32 and the 256 unsigned 5-bit values (q + 16) as eight
/// byte vectors ordered as in [`unpack_q4x8_block`]. The fifth bit of vector
/// h is bit h of each `H` byte, moved to bit 4 by a 16-bit shift that never
/// crosses a byte for the bits kept. Same requirements as
/// `unpack_q4x8_block`, with `$p` valid for `Q5X8_BLOCK` bytes.
#[cfg(target_arch = "x86_64")]
macro_rules! unpack_q5x8_block {
    ($p:expr) => {{
        let p: *const u8 = $p;
        let m4 = _mm256_set1_epi8(0x0F);
        let b4 = _mm256_set1_epi8(0x10);
        let dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let hv = _mm256_loadu_si256(p.add(16) as *const __m256i);
        let fifth = [
            _mm256_slli_epi16::<4>(hv),
            _mm256_slli_epi16::<3>(hv),
            _mm256_slli_epi16::<2>(hv),
            _mm256_slli_epi16::<1>(hv),
            hv,
            _mm256_srli_epi16::<1>(hv),
            _mm256_srli_epi16::<2>(hv),
            _mm256_srli_epi16::<3>(hv),
        ];
        let mut r = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let pj = _mm256_loadu_si256(p.add(48 + 32 * j) as *const __m256i);
            let lo = _mm256_and_si256(pj, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(pj), m4);
            r[j] = _mm256_or_si256(lo, _mm256_and_si256(fifth[j], b4));
            r[j + 4] = _mm256_or_si256(hi, _mm256_and_si256(fifth[j + 4], b4));
        }
        (dv, r)
    }};
}

/// How far ahead (bytes) the packed kernels prefetch their weight stream.
#[cfg(target_arch = "x86_64")]
pub(crate) const STREAM_AHEAD: usize = 2048;

/// Prefetch the cache lines of `len` bytes at `p`. A hint only: it cannot
/// fault, so `p` may point past the end of the weights. One-row decode reads
/// each weight once, and on the machines measured the hardware prefetcher
/// alone left the packed kernels well below the memory stream.
///
/// # Safety
/// SSE available (every x86-64 CPU). A prefetch is a hint and cannot fault, so `p` may point past the end of the weights.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_stream(p: *const u8, len: usize) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let mut o = 0;
        while o < len {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o) as *const i8);
            o += 64;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod heads512;
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
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
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

/// Whether this CPU can run the 512-bit kernels of [`avx512`] (AVX512F,
/// AVX512BW and AVX512-VNNI on top of AVX2/FMA/F16C).
pub(crate) fn wide_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

static WIDE: OnceLock<bool> = OnceLock::new();

/// Whether the packed kernels compute two 8-column groups at a time on
/// 512-bit registers (same bits, fewer instructions per row).
/// `TANDEM_SIMD=vnni256` (or `avx2`, `scalar`) turns this off.
pub fn wide() -> bool {
    *WIDE.get_or_init(|| {
        let off = std::env::var("TANDEM_SIMD").map(|v| v == "vnni256" || v == "avx2").unwrap_or(false);
        !off && simd_level() == SimdLevel::Avx2 && wide_available()
    })
}

static WIDE_MIN_ROWS: OnceLock<usize> = OnceLock::new();

/// The fewest activation rows for which the packed kernels use the 512-bit
/// tiles (where [`wide`] holds); narrower products run the 256-bit tiles,
/// with the same bits. Prefill and verify passes always gain from the shared
/// unpacking, but a one-row product reads each weight once and the two
/// choices differ by CPU: on an Intel Xeon the 512-bit tiles were faster at
/// one row (docs/experiments/001-plain-decode-kernels.md §6p), on an AMD EPYC (family 26) the 256-bit tiles
/// decoded 10–20% faster on both catalogue models (§0b). So one-row products
/// use 512 bits on Intel and 256 bits on AMD; `TANDEM_WIDE_ROWS=N` overrides.
pub fn wide_min_rows() -> usize {
    *WIDE_MIN_ROWS.get_or_init(|| {
        if let Some(n) = std::env::var("TANDEM_WIDE_ROWS").ok().and_then(|v| v.parse().ok()) {
            return n;
        }
        if cpu_vendor() == *b"AuthenticAMD" {
            2
        } else {
            1
        }
    })
}

/// The CPU vendor string from `cpuid` leaf 0 (zeros off x86-64).
fn cpu_vendor() -> [u8; 12] {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `cpuid` exists on every x86-64 CPU; leaf 0 is always valid.
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        let mut v = [0u8; 12];
        v[0..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..12].copy_from_slice(&r.ecx.to_le_bytes());
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    [0u8; 12]
}

/// Random activations and weight blocks for the kernel twin tests.
#[cfg(test)]
pub(crate) mod testutil {
    use crate::quant::{quantize_act_row_scalar, ActBlock};

    pub(crate) struct Rng(pub u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub(crate) fn f(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// `rows` quantized activation rows of `nb` blocks.
    pub(crate) fn acts(rng: &mut Rng, rows: usize, nb: usize) -> Vec<Vec<ActBlock>> {
        (0..rows)
            .map(|_| {
                let x: Vec<f32> = (0..nb * 32).map(|_| rng.f() * 4.0).collect();
                let mut a = vec![ActBlock::default(); nb];
                quantize_act_row_scalar(&x, &mut a);
                a
            })
            .collect()
    }

    /// Random bytes are valid Q4_1 / Q8_0 blocks once the f16 scales are tame:
    /// `n` rows of `nb` blocks of `bb` bytes, the first `scales` f16 of each set.
    pub(crate) fn blocks(rng: &mut Rng, n: usize, nb: usize, bb: usize, scales: usize) -> Vec<u8> {
        let mut v: Vec<u8> = (0..n * nb * bb).map(|_| rng.next() as u8).collect();
        for blk in v.chunks_exact_mut(bb) {
            for s in 0..scales {
                let h = half::f16::from_f32(rng.f() * 0.1).to_le_bytes();
                blk[2 * s..2 * s + 2].copy_from_slice(&h);
            }
        }
        v
    }
}
