//! 512-bit VNNI kernels for the packed layouts: two adjacent 8-column groups
//! per call, one in each 256-bit half of a `zmm` register.
//!
//! The per-row work of a packed tile (an activation broadcast and a
//! `vpdpbusd` per 4-byte word, the scale multiply, two fmas) is the part of a
//! verify pass that grows with its width. Doing it for 16 columns per
//! instruction halves it where the CPU has full-width 512-bit units, and
//! costs nothing where it splits them (AMD Zen 4).
//!
//! Each lane computes the same integer sum and then the same float operations
//! in the same order as the 8-column kernels (`avx2`, `vnni`) and the scalar
//! twins in `pack`, so every column gets the same bits whichever kernel, tile
//! or thread split computes it.
//!
//! Q8x8 uses unsigned weights: `vpdpbusd` multiplies unsigned by signed
//! bytes, so the kernel feeds it `w + 128` (the stored byte with its top bit
//! flipped, one xor per weight vector shared by the rows) and subtracts
//! `128 · Σ a` (the activation block's `sum`) afterwards. No step overflows
//! (a 4-product group is at most 4·255·127), so the integer is exactly Σ w·a,
//! as in the sign-trick kernels, with one instruction per row and word
//! instead of two.
//!
//! # Safety contract
//! Every `unsafe fn` here requires AVX2, FMA, F16C, AVX512F, AVX512BW and
//! AVX512-VNNI (the caller checks [`super::wide`]) and group slices that each
//! hold `a[0].len()` group blocks.

use std::arch::x86_64::*;

use crate::pack::{Q4KX8_SUPER, Q4X8_BLOCK, Q5X8_BLOCK, Q6X8_BLOCK, Q8X8_BLOCK};
use crate::quant::ActBlock;
use crate::simd::{prefetch_stream, STREAM_AHEAD};

/// Two 16-byte halves (group 0's, group 1's) as one 256-bit vector.
///
/// # Safety
/// `p0` and `p1` are valid for 16 bytes each.
#[inline(always)]
unsafe fn pair128(p0: *const u8, p1: *const u8) -> __m256i {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_loadu_si128(p0 as *const __m128i)), _mm_loadu_si128(p1 as *const __m128i))
    }
}

/// Two 32-byte halves (group 0's, group 1's) as one 512-bit vector.
///
/// # Safety
/// AVX512F available; `p0` and `p1` are valid for 32 bytes each.
#[inline(always)]
unsafe fn pair256(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_loadu_si256(p0 as *const __m256i)), _mm256_loadu_si256(p1 as *const __m256i))
    }
}

/// The 32 nibbles of each of 4 pairs of 32-byte runs at `p0`, `p1`:
/// `r[j]` the low nibbles of run j, `r[j + 4]` the high ones (the order of
/// the 8-column kernels' `r`).
///
/// # Safety
/// AVX512F and AVX512BW available; `p0` and `p1` valid for 128 bytes each.
#[inline(always)]
unsafe fn nibbles(p0: *const u8, p1: *const u8) -> [__m512i; 8] {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let mut r = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            let pj = pair256(p0.add(32 * j), p1.add(32 * j));
            r[j] = _mm512_and_si512(pj, m4);
            r[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(pj), m4);
        }
        r
    }
}

/// Σ over the 8 words of an activation block of `vpdpbusd(r[j], q[j])`, in
/// two chains (even and odd words) added at the end: the integer sums of
/// the 8-column kernels, for 16 columns.
///
/// # Safety
/// AVX512F and AVX512-VNNI available; `q` valid for 8 `i32` reads.
#[inline(always)]
unsafe fn dot_words(r: &[__m512i; 8], q: *const i32) -> __m512i {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let mut s0 = _mm512_setzero_si512();
        let mut s1 = _mm512_setzero_si512();
        for j in (0..8).step_by(2) {
            s0 = _mm512_dpbusd_epi32(s0, r[j], _mm512_set1_epi32(q.add(j).read_unaligned()));
            s1 = _mm512_dpbusd_epi32(s1, r[j + 1], _mm512_set1_epi32(q.add(j + 1).read_unaligned()));
        }
        _mm512_add_epi32(s0, s1)
    }
}

/// Q4x8 groups `g0` and `g1` (columns 0..8 and 8..16 of `out`) × MR rows;
/// per lane the same operations as `vnni::dot_q4x8`.
///
/// # Safety
/// The module's features available (`simd::wide`); `g0` and `g1` hold `a[0].len()` group blocks each and every `a[m]` as many activation blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_q4x16<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let nb = a[0].len();
        debug_assert!(g0.len() >= nb * Q4X8_BLOCK && g1.len() >= nb * Q4X8_BLOCK);
        let mut acc = [_mm512_setzero_ps(); MR];
        let mut summ = [_mm512_setzero_ps(); MR];
        for b in 0..nb {
            let p0 = g0.as_ptr().add(b * Q4X8_BLOCK);
            let p1 = g1.as_ptr().add(b * Q4X8_BLOCK);
            prefetch_stream(p0.wrapping_add(STREAM_AHEAD), Q4X8_BLOCK);
            prefetch_stream(p1.wrapping_add(STREAM_AHEAD), Q4X8_BLOCK);
            let dv = _mm512_cvtph_ps(pair128(p0, p1));
            let mv = _mm512_cvtph_ps(pair128(p0.add(16), p1.add(16)));
            let r = nibbles(p0.add(32), p1.add(32));
            for m in 0..MR {
                let ab = a[m].get_unchecked(b);
                let q = ab.qs.as_ptr() as *const i32;
                let isum = dot_words(&r, q);
                let dd = _mm512_mul_ps(dv, _mm512_set1_ps(ab.d));
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, acc[m]);
                summ[m] = _mm512_fmadd_ps(mv, _mm512_set1_ps(ab.s), summ[m]);
            }
        }
        for m in 0..MR {
            _mm512_storeu_ps(out[m].as_mut_ptr(), _mm512_add_ps(acc[m], summ[m]));
        }
    }
}

/// Q5x8 groups `g0` and `g1` (columns 0..8 and 8..16 of `out`) × MR rows;
/// per lane the unpacking of `unpack_q5x8_block` and the operations of
/// `vnni::dot_q5x8`.
///
/// # Safety
/// The module's features available (`simd::wide`); `g0` and `g1` hold `a[0].len()` group blocks each and every `a[m]` as many activation blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_q5x16<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let nb = a[0].len();
        debug_assert!(g0.len() >= nb * Q5X8_BLOCK && g1.len() >= nb * Q5X8_BLOCK);
        let m4 = _mm512_set1_epi8(0x0F);
        let b4 = _mm512_set1_epi8(0x10);
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..nb {
            let p0 = g0.as_ptr().add(b * Q5X8_BLOCK);
            let p1 = g1.as_ptr().add(b * Q5X8_BLOCK);
            prefetch_stream(p0.wrapping_add(STREAM_AHEAD), Q5X8_BLOCK);
            prefetch_stream(p1.wrapping_add(STREAM_AHEAD), Q5X8_BLOCK);
            let dv = _mm512_cvtph_ps(pair128(p0, p1));
            let hv = pair256(p0.add(16), p1.add(16));
            let fifth = [
                _mm512_slli_epi16::<4>(hv),
                _mm512_slli_epi16::<3>(hv),
                _mm512_slli_epi16::<2>(hv),
                _mm512_slli_epi16::<1>(hv),
                hv,
                _mm512_srli_epi16::<1>(hv),
                _mm512_srli_epi16::<2>(hv),
                _mm512_srli_epi16::<3>(hv),
            ];
            let mut r = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let pj = pair256(p0.add(48 + 32 * j), p1.add(48 + 32 * j));
                let lo = _mm512_and_si512(pj, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(pj), m4);
                r[j] = _mm512_or_si512(lo, _mm512_and_si512(fifth[j], b4));
                r[j + 4] = _mm512_or_si512(hi, _mm512_and_si512(fifth[j + 4], b4));
            }
            for m in 0..MR {
                let ab = a[m].get_unchecked(b);
                let q = ab.qs.as_ptr() as *const i32;
                let exact = _mm512_sub_epi32(dot_words(&r, q), _mm512_set1_epi32(16 * ab.sum));
                let dd = _mm512_mul_ps(dv, _mm512_set1_ps(ab.d));
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), dd, acc[m]);
            }
        }
        for m in 0..MR {
            _mm512_storeu_ps(out[m].as_mut_ptr(), acc[m]);
        }
    }
}

/// Q8x8 groups `g0` and `g1` (columns 0..8 and 8..16 of `out`) × MR rows;
/// the integer sums of `vnni::dot_q8x8` by the unsigned-weight route (see
/// the module docs), then its float operations.
///
/// # Safety
/// The module's features available (`simd::wide`); `g0` and `g1` hold `a[0].len()` group blocks each and every `a[m]` as many activation blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_q8x16<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let nb = a[0].len();
        debug_assert!(g0.len() >= nb * Q8X8_BLOCK && g1.len() >= nb * Q8X8_BLOCK);
        let flip = _mm512_set1_epi8(0x80u8 as i8);
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..nb {
            let p0 = g0.as_ptr().add(b * Q8X8_BLOCK);
            let p1 = g1.as_ptr().add(b * Q8X8_BLOCK);
            prefetch_stream(p0.wrapping_add(STREAM_AHEAD), Q8X8_BLOCK);
            prefetch_stream(p1.wrapping_add(STREAM_AHEAD), Q8X8_BLOCK);
            let dv = _mm512_cvtph_ps(pair128(p0, p1));
            let q: [*const i32; MR] = std::array::from_fn(|m| a[m].get_unchecked(b).qs.as_ptr() as *const i32);
            let mut isum = [_mm512_setzero_si512(); MR];
            for j in 0..8 {
                let u = _mm512_xor_si512(pair256(p0.add(16 + 32 * j), p1.add(16 + 32 * j)), flip);
                for m in 0..MR {
                    isum[m] = _mm512_dpbusd_epi32(isum[m], u, _mm512_set1_epi32(q[m].add(j).read_unaligned()));
                }
            }
            for m in 0..MR {
                let ab = a[m].get_unchecked(b);
                let exact = _mm512_sub_epi32(isum[m], _mm512_set1_epi32(128 * ab.sum));
                let dd = _mm512_mul_ps(dv, _mm512_set1_ps(ab.d));
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), dd, acc[m]);
            }
        }
        for m in 0..MR {
            _mm512_storeu_ps(out[m].as_mut_ptr(), acc[m]);
        }
    }
}

/// Two 8-byte halves (group 0's, group 1's) as one 128-bit vector.
///
/// # Safety
/// `p0` and `p1` are valid for 8 bytes each.
#[inline(always)]
unsafe fn pair64(p0: *const u8, p1: *const u8) -> __m128i {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe { _mm_unpacklo_epi64(_mm_loadl_epi64(p0 as *const __m128i), _mm_loadl_epi64(p1 as *const __m128i)) }
}

/// Q4Kx8 groups `g0` and `g1` (columns 0..8 and 8..16 of `out`) × MR rows;
/// per lane the operations of `vnni::dot_q4kx8`.
///
/// # Safety
/// The module's features available (`simd::wide`); `a[0].len()` is a
/// multiple of 8, `g0` and `g1` hold `a[0].len() / 8` super-blocks each and
/// every `a[m]` as many activation blocks as `a[0]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_q4kx16<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let nb = a[0].len();
        debug_assert!(nb.is_multiple_of(8) && g0.len() >= nb / 8 * Q4KX8_SUPER && g1.len() >= nb / 8 * Q4KX8_SUPER);
        let sign = _mm512_set1_epi32(i32::MIN);
        let mut acc = [_mm512_setzero_ps(); MR];
        let mut summ = [_mm512_setzero_ps(); MR];
        for sb in 0..nb / 8 {
            let p0 = g0.as_ptr().add(sb * Q4KX8_SUPER);
            let p1 = g1.as_ptr().add(sb * Q4KX8_SUPER);
            let dv = _mm512_cvtph_ps(pair128(p0, p1));
            let mv = _mm512_cvtph_ps(pair128(p0.add(16), p1.add(16)));
            for s in 0..8 {
                let b = 8 * sb + s;
                let (q0, q1) = (p0.add(160 + 128 * s), p1.add(160 + 128 * s));
                prefetch_stream(q0.wrapping_add(STREAM_AHEAD), 128);
                prefetch_stream(q1.wrapping_add(STREAM_AHEAD), 128);
                let scv = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(pair64(p0.add(32 + 8 * s), p1.add(32 + 8 * s))));
                let mnv = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(pair64(p0.add(96 + 8 * s), p1.add(96 + 8 * s))));
                let dsc = _mm512_mul_ps(dv, scv);
                // −(mv · mnv): the sign bit flipped, as the 8-lane kernel's xor with −0.0
                let dmn = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(mv, mnv)), sign));
                let r = nibbles(q0, q1);
                for m in 0..MR {
                    let ab = a[m].get_unchecked(b);
                    let q = ab.qs.as_ptr() as *const i32;
                    let isum = dot_words(&r, q);
                    let dd = _mm512_mul_ps(dsc, _mm512_set1_ps(ab.d));
                    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, acc[m]);
                    summ[m] = _mm512_fmadd_ps(dmn, _mm512_set1_ps(ab.s), summ[m]);
                }
            }
        }
        for m in 0..MR {
            _mm512_storeu_ps(out[m].as_mut_ptr(), _mm512_add_ps(acc[m], summ[m]));
        }
    }
}

/// Q6x8 groups `g0` and `g1` (columns 0..8 and 8..16 of `out`) × MR rows;
/// per lane the operations of `vnni::dot_q6x8`. AVX-512 has no byte
/// `sign`: the activations are negated under the mask of the weights' sign
/// bits instead. Where a weight is 0 its magnitude is 0, so the product is
/// 0 either way, and every 4-product group sums to the same integer.
///
/// # Safety
/// The module's features available (`simd::wide`); `g0` and `g1` hold
/// `a[0].len()` group blocks each and every `a[m]` as many activation blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_q6x16<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let nb = a[0].len();
        debug_assert!(g0.len() >= nb * Q6X8_BLOCK && g1.len() >= nb * Q6X8_BLOCK);
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..nb {
            let p0 = g0.as_ptr().add(b * Q6X8_BLOCK);
            let p1 = g1.as_ptr().add(b * Q6X8_BLOCK);
            prefetch_stream(p0.wrapping_add(STREAM_AHEAD), Q6X8_BLOCK);
            prefetch_stream(p1.wrapping_add(STREAM_AHEAD), Q6X8_BLOCK);
            let q: [*const i32; MR] = std::array::from_fn(|m| a[m].get_unchecked(b).qs.as_ptr() as *const i32);
            let mut half = [[_mm512_setzero_si512(); MR]; 2];
            for j in 0..8 {
                let r = pair256(p0.add(32 + 32 * j), p1.add(32 + 32 * j));
                let ar = _mm512_abs_epi8(r);
                let negative = _mm512_movepi8_mask(r);
                for m in 0..MR {
                    let av = _mm512_set1_epi32(q[m].add(j).read_unaligned());
                    let sv = _mm512_mask_sub_epi8(av, negative, zero, av);
                    half[j / 4][m] = _mm512_dpbusd_epi32(half[j / 4][m], ar, sv);
                }
            }
            let dv = _mm512_cvtph_ps(pair128(p0, p1));
            let slo = _mm512_cvtepi8_epi32(pair64(p0.add(16), p1.add(16)));
            let shi = _mm512_cvtepi8_epi32(pair64(p0.add(24), p1.add(24)));
            for m in 0..MR {
                let isum = _mm512_add_epi32(_mm512_mullo_epi32(half[0][m], slo), _mm512_mullo_epi32(half[1][m], shi));
                let dd = _mm512_mul_ps(dv, _mm512_set1_ps(a[m].get_unchecked(b).d));
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, acc[m]);
            }
        }
        for m in 0..MR {
            _mm512_storeu_ps(out[m].as_mut_ptr(), acc[m]);
        }
    }
}

/// `avx2::softmax_inplace` with the max, the exponentials and the scaling
/// 16 lanes at a time: per element the same operations, and the sum in the
/// same 8 lanes and order (each 16 values' low half added, then the high
/// half), so the result has the same bits.
///
/// # Safety
/// The module's features available (`simd::wide`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn softmax_inplace(x: &mut [f32]) -> (f32, f32) {
    use super::avx2::{exp8, hsum8};
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let n = x.len();
        let (full8, full16) = (n / 8 * 8, n / 16 * 16);
        let p = x.as_mut_ptr();
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut c = 0;
        while c < full16 {
            // `max_ps` returns its second operand where either is NaN
            m = _mm512_max_ps(_mm512_loadu_ps(p.add(c)), m);
            c += 16;
        }
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), m);
        let mx = lanes.iter().chain(&x[full16..]).fold(f32::NEG_INFINITY, |a, &v| v.max(a));
        let mut acc = _mm256_setzero_ps();
        let mut c = 0;
        while c < full16 {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(c)), _mm512_set1_ps(mx)));
            _mm512_storeu_ps(p.add(c), e);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e)));
            acc = _mm256_add_ps(_mm256_add_ps(acc, _mm512_castps512_ps256(e)), hi);
            c += 16;
        }
        if c < full8 {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(c)), _mm256_set1_ps(mx)));
            _mm256_storeu_ps(p.add(c), e);
            acc = _mm256_add_ps(acc, e);
        }
        let mut s = hsum8(acc);
        for v in &mut x[full8..] {
            *v = crate::ops::exp_scalar(*v - mx);
            s += *v;
        }
        let inv = 1.0 / s;
        let iv = _mm512_set1_ps(inv);
        let mut c = 0;
        while c < full16 {
            _mm512_storeu_ps(p.add(c), _mm512_mul_ps(_mm512_loadu_ps(p.add(c)), iv));
            c += 16;
        }
        for v in &mut x[full16..] {
            *v *= inv;
        }
        (mx, s)
    }
}

/// exp(x) for 16 lanes: per lane the operations of `avx2::exp8` and of
/// `ops::exp_scalar`, for half the instructions.
///
/// # Safety
/// AVX512F available.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn exp16(x: __m512) -> __m512 {
    use crate::ops::exp_consts::*;
    let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(LO)), _mm512_set1_ps(HI));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut q = _mm512_set1_ps(P[0]);
    for &c in &P[1..] {
        q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let e = _mm512_add_ps(_mm512_fmadd_ps(q, r2, r), _mm512_set1_ps(1.0));
    let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)));
    _mm512_mul_ps(e, _mm512_castsi512_ps(bits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::{pack_q4x8, pack_q8x8};
    use crate::simd::testutil::{acts, blocks, Rng};

    fn check<const MR: usize>(rng: &mut Rng) {
        let nb = 5;
        let a = acts(rng, MR, nb);
        let ar: [&[ActBlock]; MR] = std::array::from_fn(|i| a[i].as_slice());
        let q4 = pack_q4x8(tandem_gguf::GgmlType::Q4_1, 16, nb * 32, &blocks(rng, 16, nb, 20, 2)).unwrap();
        let q8 = pack_q8x8(16, nb * 32, &blocks(rng, 16, nb, 34, 1)).unwrap();
        let (h4, h8) = (nb * Q4X8_BLOCK, nb * Q8X8_BLOCK);
        let mut x = [[0f32; 16]; MR];
        // SAFETY: features checked by the caller; each group slice holds nb blocks.
        unsafe { dot_q4x16::<MR>(&q4[..h4], &q4[h4..], ar, &mut x) };
        for m in 0..MR {
            for c in 0..16 {
                let want = crate::pack::dot_q4x8_scalar(&q4, nb * 32, c, &a[m]);
                assert_eq!(x[m][c].to_bits(), want.to_bits(), "q4x16 MR={MR} row {m} col {c}");
            }
        }
        let q5 = crate::pack::pack_q5x8(16, nb * 32, &blocks(rng, 16, nb, 22, 1)).unwrap();
        let h5 = nb * Q5X8_BLOCK;
        unsafe { dot_q5x16::<MR>(&q5[..h5], &q5[h5..], ar, &mut x) };
        for m in 0..MR {
            for c in 0..16 {
                let want = crate::pack::dot_q5x8_scalar(&q5, nb * 32, c, &a[m]);
                assert_eq!(x[m][c].to_bits(), want.to_bits(), "q5x16 MR={MR} row {m} col {c}");
            }
        }
        unsafe { dot_q8x16::<MR>(&q8[..h8], &q8[h8..], ar, &mut x) };
        for m in 0..MR {
            for c in 0..16 {
                let want = crate::pack::dot_q8x8_scalar(&q8, nb * 32, c, &a[m]);
                assert_eq!(x[m][c].to_bits(), want.to_bits(), "q8x16 MR={MR} row {m} col {c}");
            }
        }
        // Q6_K and Q4_K need whole 256-element super-blocks
        let nsb = 2;
        let ak = acts(rng, MR, nsb * 8);
        let akr: [&[ActBlock]; MR] = std::array::from_fn(|i| ak[i].as_slice());
        let mut q6raw = blocks(rng, 16, nsb, 210, 0);
        for blk in q6raw.chunks_exact_mut(210) {
            blk[208..210].copy_from_slice(&half::f16::from_f32(rng.f() * 0.1).to_le_bytes());
        }
        let q6 = crate::pack::pack_q6x8(16, nsb * 256, &q6raw).unwrap();
        let h6 = nsb * 8 * Q6X8_BLOCK;
        unsafe { dot_q6x16::<MR>(&q6[..h6], &q6[h6..], akr, &mut x) };
        for m in 0..MR {
            for c in 0..16 {
                let want = crate::pack::dot_q6x8_scalar(&q6, nsb * 256, c, &ak[m]);
                assert_eq!(x[m][c].to_bits(), want.to_bits(), "q6x16 MR={MR} row {m} col {c}");
            }
        }
        let q4k = crate::pack::pack_q4kx8(16, nsb * 256, &blocks(rng, 16, nsb, 144, 2)).unwrap();
        let h4k = nsb * Q4KX8_SUPER;
        unsafe { dot_q4kx16::<MR>(&q4k[..h4k], &q4k[h4k..], akr, &mut x) };
        for m in 0..MR {
            for c in 0..16 {
                let want = crate::pack::dot_q4kx8_scalar(&q4k, nsb * 256, c, &ak[m]);
                assert_eq!(x[m][c].to_bits(), want.to_bits(), "q4kx16 MR={MR} row {m} col {c}");
            }
        }
    }

    #[test]
    fn wide_kernels_equal_the_scalar_twins() {
        if !crate::simd::wide_available() {
            eprintln!("skipped: no AVX512F/BW/VNNI on this CPU");
            return;
        }
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        for _ in 0..50 {
            check::<1>(&mut rng);
            check::<2>(&mut rng);
            check::<3>(&mut rng);
            check::<4>(&mut rng);
            check::<5>(&mut rng);
            check::<6>(&mut rng);
        }
    }

    /// Weight bytes of −128 and activations of ±127 (the extremes the
    /// unsigned route must carry without overflow).
    #[test]
    fn wide_q8_kernel_is_exact_at_the_extremes() {
        if !crate::simd::wide_available() {
            return;
        }
        let nb = 3;
        let mut raw = Vec::new();
        for r in 0..16 {
            for _ in 0..nb {
                raw.extend_from_slice(&half::f16::from_f32(0.01 * (r + 1) as f32).to_le_bytes());
                raw.extend((0..32).map(|e| if (e + r) % 3 == 0 { 0x80u8 } else { 127 }));
            }
        }
        let q8 = pack_q8x8(16, nb * 32, &raw).unwrap();
        let x: Vec<f32> = (0..nb * 32).map(|e| if e % 2 == 0 { 1.0 } else { -1.0 }).collect();
        let mut a = vec![ActBlock::default(); nb];
        crate::quant::quantize_act_row_scalar(&x, &mut a);
        let mut out = [[0f32; 16]; 1];
        let h8 = nb * Q8X8_BLOCK;
        unsafe { dot_q8x16::<1>(&q8[..h8], &q8[h8..], [&a], &mut out) };
        for c in 0..16 {
            assert_eq!(out[0][c].to_bits(), crate::pack::dot_q8x8_scalar(&q8, nb * 32, c, &a).to_bits(), "col {c}");
        }
    }
}
