//! 512-bit attention kernels for two 64-wide query heads at once: head 0 in
//! the low 256 bits of a `zmm` register, head 1 in the high 256 bits.
//!
//! A verify pass (or a batch step's heads that share a key/value head) dots
//! several queries against the same cached positions. The 8-lane kernels of
//! `avx2` issue one fused multiply-add per query, position and 8 values;
//! these issue one per *pair* of queries: the cached row's 8 values are
//! loaded once and broadcast to both halves, each half multiplies them by its
//! own query. At 2,400 cached positions that arithmetic is most of what a
//! verify row costs (docs/experiments/009 §9).
//!
//! Each half runs exactly the lanes, chains and horizontal sums of the
//! 8-lane kernels (`avx2::dot_rows_64`, `avx2::axpy_rows_64`) and of the
//! scalar twins in `ops`: lane l of a half accumulates values l, l+8, …, l+56
//! of the row in that order, and the sum pairs lanes as `hsum8` does. So a
//! query gets the same bits whichever head it is paired with, or alone.
//!
//! # Safety contract
//! Every `unsafe fn` here requires AVX2, FMA, F16C and AVX512F (the caller
//! checks [`super::wide`], which implies them) and rows as described in each
//! function.

use std::arch::x86_64::*;

use super::avx2::{hsum8, HeadValue, PREFETCH_ROWS};

/// A cached row's values loaded for both halves of a `zmm` register.
///
/// # Safety
/// Implementations load through raw pointers; callers uphold the method's
/// contract.
pub(crate) unsafe trait PairValue: HeadValue {
    /// Eight values at `p` as f32, in lanes 0..8 and again in lanes 8..16.
    ///
    /// # Safety
    /// AVX512F and F16C available; 8 values readable at `p`.
    unsafe fn load8_twice(p: *const Self) -> __m512;
}

// SAFETY: reads exactly 8 f32 values (32 bytes).
unsafe impl PairValue for f32 {
    #[inline(always)]
    unsafe fn load8_twice(p: *const f32) -> __m512 {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p as *const f64))) }
    }
}

// SAFETY: reads exactly 8 u16 values (16 bytes).
unsafe impl PairValue for u16 {
    #[inline(always)]
    unsafe fn load8_twice(p: *const u16) -> __m512 {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i))) }
    }
}

/// `lo` in lanes 0..8, `hi` in lanes 8..16.
///
/// # Safety
/// AVX512F available.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn join(lo: __m256, hi: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi)))
}

/// Lanes 8..16.
///
/// # Safety
/// AVX512F available.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn high(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

/// `hsum8` of each half of four vectors: lane i of the first result is the
/// low half of `v[i]` summed, of the second the high half. The pairings and
/// their order are `avx2::hsum8x4`'s (128-bit halves, then lanes 0+2 and
/// 1+3, then those two), done within each 128-bit quarter of the register.
///
/// # Safety
/// AVX512F available.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn hsum8x4_halves(v: [__m512; 4]) -> (__m128, __m128) {
    // quarter 0: low half's lanes 0..4 + 4..8; quarter 2: the high half's
    let t: [__m512; 4] = std::array::from_fn(|i| _mm512_add_ps(v[i], _mm512_shuffle_f32x4::<0b10_11_00_01>(v[i], v[i])));
    let a01 = _mm512_unpacklo_ps(t[0], t[1]);
    let a23 = _mm512_unpacklo_ps(t[2], t[3]);
    let b01 = _mm512_unpackhi_ps(t[0], t[1]);
    let b23 = _mm512_unpackhi_ps(t[2], t[3]);
    let pd = _mm512_castps_pd;
    let c0 = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(a01), pd(a23)));
    let c1 = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(a01), pd(a23)));
    let c2 = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(b01), pd(b23)));
    let c3 = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(b01), pd(b23)));
    let s = _mm512_add_ps(_mm512_add_ps(c0, c2), _mm512_add_ps(c1, c3));
    (_mm512_castps512_ps128(s), _mm512_extractf32x4_ps::<2>(s))
}

/// `dot_rows_64` for two queries over the same rows:
/// `out[h][j] = dot(q[h], row_j) · scale`, each with the bits of the 8-lane
/// kernel and of `ops::dot_rows_scalar`.
///
/// # Safety
/// The module's features available; `q[0].len() == q[1].len() == 64`;
/// `out[0].len() == out[1].len()`; `rows` holds
/// `(out[0].len() − 1)·stride + offset + 64` values (the safe wrappers
/// assert it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(crate) unsafe fn dot_rows2_64<T: PairValue>(
    q: [&[f32]; 2],
    rows: &[T],
    stride: usize,
    offset: usize,
    scale: f32,
    out: [&mut [f32]; 2],
) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let [o0, o1] = out;
        let n = o0.len();
        let base = rows.as_ptr().add(offset);
        let qv: [__m512; 8] =
            std::array::from_fn(|c| join(_mm256_loadu_ps(q[0].as_ptr().add(8 * c)), _mm256_loadu_ps(q[1].as_ptr().add(8 * c))));
        let sv = _mm_set1_ps(scale);
        // four positions at a time: four independent chains per half
        let quads = n / 4;
        for g in 0..quads {
            let r: [*const T; 4] = std::array::from_fn(|i| base.add((4 * g + i) * stride));
            for i in 0..4 {
                T::prefetch_head(base.wrapping_add((4 * g + i + PREFETCH_ROWS) * stride));
            }
            let mut acc = [_mm512_setzero_ps(); 4];
            for (c, qc) in qv.iter().enumerate() {
                for i in 0..4 {
                    acc[i] = _mm512_fmadd_ps(*qc, T::load8_twice(r[i].add(8 * c)), acc[i]);
                }
            }
            let (s0, s1) = hsum8x4_halves(acc);
            _mm_storeu_ps(o0.as_mut_ptr().add(4 * g), _mm_mul_ps(s0, sv));
            _mm_storeu_ps(o1.as_mut_ptr().add(4 * g), _mm_mul_ps(s1, sv));
        }
        for j in 4 * quads..n {
            let r = base.add(j * stride);
            let mut acc = _mm512_setzero_ps();
            for (c, qc) in qv.iter().enumerate() {
                acc = _mm512_fmadd_ps(*qc, T::load8_twice(r.add(8 * c)), acc);
            }
            o0[j] = hsum8(_mm512_castps512_ps256(acc)) * scale;
            o1[j] = hsum8(high(acc)) * scale;
        }
    }
}

/// `axpy_rows_64` for two outputs over the same rows:
/// `y[h] = fma(p[h][j], row_j, y[h])` for j in order, each with the bits of
/// the 8-lane kernel and of `ops::axpy_rows_scalar`.
///
/// # Safety
/// The module's features available; `y[0].len() == y[1].len() == 64`;
/// `p[0].len() == p[1].len()`; `rows` holds
/// `(p[0].len() − 1)·stride + offset + 64` values (the safe wrappers
/// assert it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(crate) unsafe fn axpy_rows2_64<T: PairValue>(y: [&mut [f32]; 2], p: [&[f32]; 2], rows: &[T], stride: usize, offset: usize) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let [y0, y1] = y;
        let base = rows.as_ptr().add(offset);
        let mut acc: [__m512; 8] =
            std::array::from_fn(|c| join(_mm256_loadu_ps(y0.as_ptr().add(8 * c)), _mm256_loadu_ps(y1.as_ptr().add(8 * c))));
        for (j, (&p0, &p1)) in p[0].iter().zip(p[1]).enumerate() {
            let r = base.add(j * stride);
            T::prefetch_head(base.wrapping_add((j + PREFETCH_ROWS) * stride));
            let pv = join(_mm256_set1_ps(p0), _mm256_set1_ps(p1));
            for (c, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(pv, T::load8_twice(r.add(8 * c)), *a);
            }
        }
        for (c, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(y0.as_mut_ptr().add(8 * c), _mm512_castps512_ps256(*a));
            _mm256_storeu_ps(y1.as_mut_ptr().add(8 * c), high(*a));
        }
    }
}
