//! AVX2 + FMA kernels.
//!
//! # Safety contract
//! Every `unsafe fn` here requires that the running CPU supports AVX2, FMA and
//! F16C (the caller checks [`super::simd_level`]). Pointer arguments must point
//! to a whole block of the format (`F::BYTES` readable bytes); the safe wrappers
//! in `matmul` guarantee this by slicing rows whose lengths were validated when
//! the weight was created. All loads are unaligned loads.
//!
//! Each kernel mirrors its scalar twin in `quant::dot` lane for lane, so the
//! results are bit-identical to it.

use std::arch::x86_64::*;

use super::{prefetch_stream, STREAM_AHEAD};

use crate::quant::dot::FloatKind;
use crate::quant::formats::{Format, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0};
use crate::quant::ActBlock;

/// SIMD decode of sub-block `s` into 32 int8 lanes, equal to `Format::values`.
pub(crate) trait Unpack: Format {
    /// # Safety
    /// AVX2, FMA and F16C available (the module's safety contract); `b` points to a whole block of the format (`BYTES` readable bytes) and `s` is one of its sub-blocks.
    unsafe fn unpack(b: *const u8, s: usize) -> __m256i;
}

/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `p` is valid for 16 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let qs = _mm_loadu_si128(p as *const __m128i);
        let m4 = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(qs, m4);
        let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), m4);
        _mm256_set_m128i(hi, lo)
    }
}

/// Byte j = 0xFF where bit j of `x` is set.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bytes_from_bits32(x: u32) -> __m256i {
    let v = _mm256_set1_epi32(x as i32);
    let shuf = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
    let bytes = _mm256_shuffle_epi8(v, shuf);
    let mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, mask), _mm256_set1_epi64x(-1))
}

impl Unpack for Q4_0 {
    /// # Safety
    /// AVX2, FMA and F16C available (the module's safety contract); `b` points to a whole block of the format (`BYTES` readable bytes) and `s` is one of its sub-blocks.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn unpack(b: *const u8, _s: usize) -> __m256i {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { _mm256_sub_epi8(nibbles16(b.add(2)), _mm256_set1_epi8(8)) }
    }
}
impl Unpack for Q4_1 {
    /// # Safety
    /// AVX2, FMA and F16C available (the module's safety contract); `b` points to a whole block of the format (`BYTES` readable bytes) and `s` is one of its sub-blocks.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn unpack(b: *const u8, _s: usize) -> __m256i {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { nibbles16(b.add(4)) }
    }
}
impl Unpack for Q5_0 {
    /// # Safety
    /// AVX2, FMA and F16C available (the module's safety contract); `b` points to a whole block of the format (`BYTES` readable bytes) and `s` is one of its sub-blocks.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn unpack(b: *const u8, _s: usize) -> __m256i {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            let qh = (b.add(2) as *const u32).read_unaligned();
            let hi = _mm256_and_si256(bytes_from_bits32(qh), _mm256_set1_epi8(0x10));
            _mm256_sub_epi8(_mm256_or_si256(nibbles16(b.add(6)), hi), _mm256_set1_epi8(16))
        }
    }
}
impl Unpack for Q5_1 {
    /// # Safety
    /// AVX2, FMA and F16C available (the module's safety contract); `b` points to a whole block of the format (`BYTES` readable bytes) and `s` is one of its sub-blocks.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn unpack(b: *const u8, _s: usize) -> __m256i {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            let qh = (b.add(4) as *const u32).read_unaligned();
            let hi = _mm256_and_si256(bytes_from_bits32(qh), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles16(b.add(8)), hi)
        }
    }
}
impl Unpack for Q8_0 {
    /// # Safety
    /// AVX2, FMA and F16C available (the module's safety contract); `b` points to a whole block of the format (`BYTES` readable bytes) and `s` is one of its sub-blocks.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn unpack(b: *const u8, _s: usize) -> __m256i {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { _mm256_loadu_si256(b.add(2) as *const __m256i) }
    }
}
impl Unpack for Q4K {
    /// # Safety
    /// AVX2, FMA and F16C available (the module's safety contract); `b` points to a whole block of the format (`BYTES` readable bytes) and `s` is one of its sub-blocks.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn unpack(b: *const u8, s: usize) -> __m256i {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            let q = _mm256_loadu_si256(b.add(16 + 32 * (s / 2)) as *const __m256i);
            let sh = _mm_cvtsi32_si128((4 * (s % 2)) as i32);
            _mm256_and_si256(_mm256_srl_epi16(q, sh), _mm256_set1_epi8(0x0F))
        }
    }
}
impl Unpack for Q5K {
    /// # Safety
    /// AVX2, FMA and F16C available (the module's safety contract); `b` points to a whole block of the format (`BYTES` readable bytes) and `s` is one of its sub-blocks.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn unpack(b: *const u8, s: usize) -> __m256i {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            let ql = _mm256_loadu_si256(b.add(48 + 32 * (s / 2)) as *const __m256i);
            let qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
            let lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128((4 * (s % 2)) as i32)), _mm256_set1_epi8(0x0F));
            let hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s as i32)), _mm256_set1_epi8(1));
            _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4))
        }
    }
}
impl Unpack for Q6K {
    /// # Safety
    /// AVX2, FMA and F16C available (the module's safety contract); `b` points to a whole block of the format (`BYTES` readable bytes) and `s` is one of its sub-blocks.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn unpack(b: *const u8, s: usize) -> __m256i {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            let (n, t) = (s / 4, s % 4);
            let ql = _mm256_loadu_si256(b.add(64 * n + 32 * (t % 2)) as *const __m256i);
            let qh = _mm256_loadu_si256(b.add(128 + 32 * n) as *const __m256i);
            let lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128((4 * (t / 2)) as i32)), _mm256_set1_epi8(0x0F));
            let hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128((2 * t) as i32)), _mm256_set1_epi8(3));
            _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32))
        }
    }
}

/// The fixed horizontal sum of `quant::dot::hsum8`.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn hsum8(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let t = _mm_add_ps(lo, hi); // t0..t3
    let u = _mm_add_ps(t, _mm_movehl_ps(t, t)); // t0+t2, t1+t3
    let r = _mm_add_ss(u, _mm_shuffle_ps(u, u, 1));
    _mm_cvtss_f32(r)
}

/// [`hsum8`] of four vectors at once, lane i of the result for `v[i]`: the
/// same pairings in the same order (halves, then lanes 0+2 and 1+3, then
/// those two), done on a transposed 4×4 block.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum8x4(v: [__m256; 4]) -> __m128 {
    let t: [__m128; 4] = std::array::from_fn(|i| _mm_add_ps(_mm256_castps256_ps128(v[i]), _mm256_extractf128_ps(v[i], 1)));
    // transpose: c[l] holds lane l of t[0..4]
    let a01 = _mm_unpacklo_ps(t[0], t[1]); // t0_0 t1_0 t0_1 t1_1
    let a23 = _mm_unpacklo_ps(t[2], t[3]);
    let b01 = _mm_unpackhi_ps(t[0], t[1]); // t0_2 t1_2 t0_3 t1_3
    let b23 = _mm_unpackhi_ps(t[2], t[3]);
    let c0 = _mm_movelh_ps(a01, a23);
    let c1 = _mm_movehl_ps(a23, a01);
    let c2 = _mm_movelh_ps(b01, b23);
    let c3 = _mm_movehl_ps(b23, b01);
    _mm_add_ps(_mm_add_ps(c0, c2), _mm_add_ps(c1, c3))
}

/// MR activation rows × NR weight rows of format F.
/// `w[n]` is a whole weight row (nb · F::BYTES bytes), `a[m]` a whole activation row
/// (nb · F::SUBS blocks). Writes `out[m][n]`.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); every `w[n]` and `a[m]` cover the same number of blocks, `w[n]` whole blocks of the format.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_tile<F: Unpack, const MR: usize, const NR: usize>(
    w: [&[u8]; NR],
    a: [&[ActBlock]; MR],
    out: &mut [[f32; NR]; MR],
) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let nb = a[0].len() / F::SUBS;
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); NR]; MR];
        let mut summ = [[0f32; NR]; MR];
        for b in 0..nb {
            for s in 0..F::SUBS {
                for n in 0..NR {
                    let blk = w[n].get_unchecked(b * F::BYTES..(b + 1) * F::BYTES);
                    let wv = F::unpack(blk.as_ptr(), s);
                    let sc = F::scales(blk, s);
                    let wabs = if F::SIGNED { _mm256_sign_epi8(wv, wv) } else { wv };
                    let hmul = if F::HALF_SCALES {
                        _mm256_setr_epi32(sc.h[0], sc.h[0], sc.h[0], sc.h[0], sc.h[1], sc.h[1], sc.h[1], sc.h[1])
                    } else {
                        ones
                    };
                    for m in 0..MR {
                        let ab = a[m].get_unchecked(b * F::SUBS + s);
                        let av = _mm256_loadu_si256(ab.qs.as_ptr() as *const __m256i);
                        let p = if F::SIGNED { _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(av, wv)) } else { _mm256_maddubs_epi16(wv, av) };
                        let mut l = _mm256_madd_epi16(p, ones);
                        if F::HALF_SCALES {
                            l = _mm256_mullo_epi32(l, hmul);
                        }
                        acc[m][n] = _mm256_fmadd_ps(_mm256_set1_ps(sc.d * ab.d), _mm256_cvtepi32_ps(l), acc[m][n]);
                        if F::HAS_MIN {
                            summ[m][n] += sc.m * ab.s;
                        }
                    }
                }
            }
        }
        for m in 0..MR {
            for n in 0..NR {
                out[m][n] = hsum8(acc[m][n]) + summ[m][n];
            }
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `w` is valid for elements `i..i + 8` of `kind`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load8(kind: FloatKind, w: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        match kind {
            FloatKind::F32 => _mm256_loadu_ps((w as *const f32).add(i)),
            FloatKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128((w as *const u16).add(i) as *const __m128i)),
            FloatKind::BF16 => {
                let h = _mm_loadu_si128((w as *const u16).add(i) as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            }
        }
    }
}

/// MR f32 activation rows × NR float weight rows; mirrors `dot_f_scalar`.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); every `w[n]` holds `x[m].len()` elements of `kind`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_tile_f<const MR: usize, const NR: usize>(
    kind: FloatKind,
    w: [&[u8]; NR],
    x: [&[f32]; MR],
    out: &mut [[f32; NR]; MR],
) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let k = x[0].len();
        let full = k / 8 * 8;
        let mut acc = [[_mm256_setzero_ps(); NR]; MR];
        let mut c = 0;
        while c < full {
            for n in 0..NR {
                let wv = load8(kind, w[n].as_ptr(), c);
                for m in 0..MR {
                    let xv = _mm256_loadu_ps(x[m].as_ptr().add(c));
                    acc[m][n] = _mm256_fmadd_ps(wv, xv, acc[m][n]);
                }
            }
            c += 8;
        }
        for m in 0..MR {
            for n in 0..NR {
                let mut r = hsum8(acc[m][n]);
                for i in full..k {
                    r = kind.load(w[n], i).mul_add(x[m][i], r);
                }
                out[m][n] = r;
            }
        }
    }
}

/// f32 dot product with the 8-lane structure of `ops::dot_f32_scalar`.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `a.len() == b.len()`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let k = a.len();
        let full = k / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        let mut c = 0;
        while c < full {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(c)), _mm256_loadu_ps(b.as_ptr().add(c)), acc);
            c += 8;
        }
        let mut r = hsum8(acc);
        for i in full..k {
            r = a[i].mul_add(b[i], r);
        }
        r
    }
}

/// y[i] = fma(a, x[i], y[i]) for all i (exactly like the scalar loop with mul_add).
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `y.len() == x.len()`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let n = y.len().min(x.len());
        let full = n / 8 * 8;
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        while i < full {
            let yv = _mm256_loadu_ps(y.as_ptr().add(i));
            let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(x.as_ptr().add(i)), yv);
            _mm256_storeu_ps(y.as_mut_ptr().add(i), r);
            i += 8;
        }
        for j in full..n {
            y[j] = a.mul_add(x[j], y[j]);
        }
    }
}

/// How many cached rows ahead the attention kernels prefetch. The key and
/// value rows of a layer were written a step ago and have since been pushed
/// out by the weights, so without a hint every head row (256 bytes at stride
/// `kv_dim`) waits on L3 or memory.
pub(crate) const PREFETCH_ROWS: usize = 12;

/// What a cached K/V row holds: f32, or f16 bits widened (exactly) as
/// they are loaded. The attention kernels below are written once over it,
/// so both kinds of row go through the same lanes, chains and sums.
///
/// # Safety
/// Implementations load or prefetch through raw pointers; callers uphold
/// each method's contract.
pub(crate) unsafe trait HeadValue: Copy {
    /// Eight values at `p` as f32.
    ///
    /// # Safety
    /// AVX2 and F16C available; 8 values readable at `p`.
    unsafe fn load8(p: *const Self) -> __m256;

    /// Prefetch the cache lines of a 64-wide head row at `p` (a hint: it
    /// cannot fault, so `p` may point anywhere).
    ///
    /// # Safety
    /// SSE available (always, with AVX2).
    unsafe fn prefetch_head(p: *const Self);
}

// SAFETY: loads read exactly 8 f32 values; prefetches are hints.
unsafe impl HeadValue for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn prefetch_head(p: *const f32) {
        // SAFETY: a prefetch is a hint and cannot fault.
        unsafe {
            for l in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(16 * l) as *const i8);
            }
        }
    }
}

// SAFETY: loads read exactly 8 u16 values (16 bytes); prefetches are hints.
unsafe impl HeadValue for u16 {
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> __m256 {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }

    #[inline(always)]
    unsafe fn prefetch_head(p: *const u16) {
        // SAFETY: a prefetch is a hint and cannot fault.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(32) as *const i8);
        }
    }
}

/// `ops::dot_rows`: a [`dot_f32`] per row (same lanes, same horizontal sum),
/// with a 64-wide query (the usual head size) held in registers.
///
/// # Safety
/// AVX2/FMA available; `rows` holds `(out.len() − 1)·stride + offset + q.len()`
/// values (the safe wrapper asserts it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows(q: &[f32], rows: &[f32], stride: usize, offset: usize, scale: f32, out: &mut [f32]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        if q.len() == 64 {
            dot_rows_64(q, rows, stride, offset, scale, out);
        } else {
            let base = rows.as_ptr().add(offset);
            for (j, o) in out.iter_mut().enumerate() {
                *o = dot_f32(q, std::slice::from_raw_parts(base.add(j * stride), q.len())) * scale;
            }
        }
    }
}

/// [`dot_rows`] for a 64-wide query held in registers, over rows of f32 or
/// of f16 (`ops::dot_rows_f16`, the same bits as `dot_rows` on the widened
/// rows).
///
/// # Safety
/// AVX2, FMA and F16C available; `q.len() == 64`; `rows` holds
/// `(out.len() − 1)·stride + offset + 64` values (the safe wrappers assert it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows_64<T: HeadValue>(q: &[f32], rows: &[T], stride: usize, offset: usize, scale: f32, out: &mut [f32]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let base = rows.as_ptr().add(offset);
        let qv: [__m256; 8] = std::array::from_fn(|c| _mm256_loadu_ps(q.as_ptr().add(8 * c)));
        // four rows at a time: four independent FMA chains instead of one
        // (each row's chain and horizontal sum are unchanged)
        let quads = out.len() / 4;
        let sv = _mm_set1_ps(scale);
        for g in 0..quads {
            let r: [*const T; 4] = std::array::from_fn(|i| base.add((4 * g + i) * stride));
            for i in 0..4 {
                T::prefetch_head(base.wrapping_add((4 * g + i + PREFETCH_ROWS) * stride));
            }
            let mut acc = [_mm256_setzero_ps(); 4];
            for (c, qc) in qv.iter().enumerate() {
                for i in 0..4 {
                    acc[i] = _mm256_fmadd_ps(*qc, T::load8(r[i].add(8 * c)), acc[i]);
                }
            }
            _mm_storeu_ps(out.as_mut_ptr().add(4 * g), _mm_mul_ps(hsum8x4(acc), sv));
        }
        for (j, o) in out.iter_mut().enumerate().skip(4 * quads) {
            let r = base.add(j * stride);
            let mut acc = _mm256_setzero_ps();
            for (c, qc) in qv.iter().enumerate() {
                acc = _mm256_fmadd_ps(*qc, T::load8(r.add(8 * c)), acc);
            }
            *o = hsum8(acc) * scale;
        }
    }
}

/// `ops::axpy_rows`: an [`axpy`] per row in order, with a 64-wide `y` held
/// in registers (each element sees the same fused multiply-adds in the same
/// order).
///
/// # Safety
/// AVX2/FMA available; `rows` holds `(p.len() − 1)·stride + offset + y.len()`
/// values (the safe wrapper asserts it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_rows(y: &mut [f32], p: &[f32], rows: &[f32], stride: usize, offset: usize) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        if y.len() == 64 {
            axpy_rows_64(y, p, rows, stride, offset);
        } else {
            let base = rows.as_ptr().add(offset);
            let n = y.len();
            for (j, &pj) in p.iter().enumerate() {
                axpy(y, pj, std::slice::from_raw_parts(base.add(j * stride), n));
            }
        }
    }
}

/// [`axpy_rows`] for a 64-wide `y` held in registers, over rows of f32 or
/// of f16 (`ops::axpy_rows_f16`).
///
/// # Safety
/// AVX2, FMA and F16C available; `y.len() == 64`; `rows` holds
/// `(p.len() − 1)·stride + offset + 64` values (the safe wrappers assert it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_rows_64<T: HeadValue>(y: &mut [f32], p: &[f32], rows: &[T], stride: usize, offset: usize) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let base = rows.as_ptr().add(offset);
        let mut acc: [__m256; 8] = std::array::from_fn(|c| _mm256_loadu_ps(y.as_ptr().add(8 * c)));
        for (j, &pj) in p.iter().enumerate() {
            let r = base.add(j * stride);
            T::prefetch_head(base.wrapping_add((j + PREFETCH_ROWS) * stride));
            let pv = _mm256_set1_ps(pj);
            for (c, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(pv, T::load8(r.add(8 * c)), *a);
            }
        }
        for (c, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(y.as_mut_ptr().add(8 * c), *a);
        }
    }
}

/// f32 → f16 bits, rounding to nearest even (`ops::f32_to_f16_scalar`'s
/// result for every input).
///
/// # Safety
/// AVX2 and F16C available; `dst.len() == src.len()`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f32_to_f16(src: &[f32], dst: &mut [u16]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let n = src.len().min(dst.len());
        let full = n / 8 * 8;
        let mut i = 0;
        while i < full {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            i += 8;
        }
        for j in full..n {
            dst[j] = _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(src[j]))) as u16;
        }
    }
}

/// Sum with the 8-lane structure of `ops::sum_f32_scalar`.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn sum_f32(a: &[f32]) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let k = a.len();
        let full = k / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        let mut c = 0;
        while c < full {
            acc = _mm256_add_ps(acc, _mm256_loadu_ps(a.as_ptr().add(c)));
            c += 8;
        }
        let mut r = hsum8(acc);
        for v in &a[full..] {
            r += v;
        }
        r
    }
}

/// exp(x) for 8 lanes, the same operations as `ops::exp_scalar`.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
    use crate::ops::exp_consts::*;
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LO)), _mm256_set1_ps(HI));
    let n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(P[0]);
    for &c in &P[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let e = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    let bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    _mm256_mul_ps(e, _mm256_castsi256_ps(bits))
}

/// x[i] = exp(x[i] - sub), returns nothing; tail lanes use the scalar twin.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_sub_inplace(x: &mut [f32], sub: f32) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let n = x.len();
        let full = n / 8 * 8;
        let s = _mm256_set1_ps(sub);
        let mut i = 0;
        while i < full {
            let v = _mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), s);
            _mm256_storeu_ps(x.as_mut_ptr().add(i), exp8(v));
            i += 8;
        }
        for v in &mut x[full..] {
            *v = crate::ops::exp_scalar(*v - sub);
        }
    }
}

/// The parts of `ops::softmax_scalar` in one kernel: the row's max, then
/// `x[i] = exp(x[i] − max)` added to the sum as it is stored (the lanes and
/// order of [`sum_f32`], so the sum has its bits), then `x[i] · (1 / sum)`.
/// The max is exact in any order, and every other step is the scalar twin's
/// operation per element. A NaN is passed over by the max, as `f32::max`
/// does. Returns the max and the sum.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn softmax_inplace(x: &mut [f32]) -> (f32, f32) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let n = x.len();
        let full = n / 8 * 8;
        let p = x.as_mut_ptr();
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut c = 0;
        while c < full {
            // `max_ps` returns its second operand where either is NaN
            m = _mm256_max_ps(_mm256_loadu_ps(p.add(c)), m);
            c += 8;
        }
        let mut mx = f32::NEG_INFINITY;
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        for v in lanes.iter().chain(&x[full..]) {
            mx = v.max(mx);
        }
        let sub = _mm256_set1_ps(mx);
        let mut acc = _mm256_setzero_ps();
        let mut c = 0;
        while c < full {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(c)), sub));
            _mm256_storeu_ps(p.add(c), e);
            acc = _mm256_add_ps(acc, e);
            c += 8;
        }
        let mut s = hsum8(acc);
        for v in &mut x[full..] {
            *v = crate::ops::exp_scalar(*v - mx);
            s += *v;
        }
        let inv = 1.0 / s;
        let iv = _mm256_set1_ps(inv);
        let mut c = 0;
        while c < full {
            _mm256_storeu_ps(p.add(c), _mm256_mul_ps(_mm256_loadu_ps(p.add(c)), iv));
            c += 8;
        }
        for v in &mut x[full..] {
            *v *= inv;
        }
        (mx, s)
    }
}

/// g[i] = silu(g[i]) · u[i] = g / (1 + exp(-g)) · u
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `g.len() == u.len()`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let n = g.len().min(u.len());
        let full = n / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        let zero = _mm256_setzero_ps();
        let mut i = 0;
        while i < full {
            let gv = _mm256_loadu_ps(g.as_ptr().add(i));
            let e = exp8(_mm256_sub_ps(zero, gv));
            let s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(g.as_mut_ptr().add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(i))));
            i += 8;
        }
        for j in full..n {
            g[j] = g[j] / (1.0 + crate::ops::exp_scalar(-g[j])) * u[j];
        }
    }
}

/// g = gelu(g) · u with gelu's tanh approximation written as a sigmoid
/// (see `ops::gelu_mul_scalar`, the twin); tail lanes use the twin.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `g.len() == u.len()`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gelu_mul(g: &mut [f32], u: &[f32]) {
    use crate::ops::{GELU_A, GELU_B};
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let n = g.len().min(u.len());
        let full = n / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        let zero = _mm256_setzero_ps();
        let (ca, cb) = (_mm256_set1_ps(GELU_A), _mm256_set1_ps(GELU_B));
        let mut i = 0;
        while i < full {
            let gv = _mm256_loadu_ps(g.as_ptr().add(i));
            let z = _mm256_mul_ps(gv, _mm256_fmadd_ps(cb, _mm256_mul_ps(gv, gv), ca));
            let e = exp8(_mm256_sub_ps(zero, z));
            let s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(g.as_mut_ptr().add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(i))));
            i += 8;
        }
        for j in full..n {
            g[j] = crate::ops::gelu_mul_scalar(g[j], u[j]);
        }
    }
}

/// Packed Q4x8 kernel: MR activation rows × the 8 columns of group `grp`
/// (see `pack`); mirrors `pack::dot_q4x8_scalar` lane for lane.
///
/// AVX2 has 16 vector registers, so the kernel keeps few values live: each
/// 32-byte chunk of quants is unpacked where it is used (low nibbles, then
/// high), the rows' int16 sums and scaled accumulators stay in registers, and
/// the mins (`m · a.s`, a sum of their own) run in a second pass over the
/// blocks. Each accumulator sees the same fused multiply-adds in block order
/// as the twin; the integer sums are exact in any order (eight pairs of at
/// most 2·15·127 fit in i16).
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `grp` holds `a[0].len()` group blocks and every `a[m]` as many activation blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4x8<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        use crate::pack::Q4X8_BLOCK;
        let nb = a[0].len();
        debug_assert!(grp.len() >= nb * Q4X8_BLOCK);
        let m4 = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); MR];
        for b in 0..nb {
            let p = grp.as_ptr().add(b * Q4X8_BLOCK);
            prefetch_stream(p.wrapping_add(STREAM_AHEAD), Q4X8_BLOCK);
            let q: [*const i32; MR] = std::array::from_fn(|m| a[m].get_unchecked(b).qs.as_ptr() as *const i32);
            let mut s = [_mm256_setzero_si256(); MR];
            // chunk j holds bytes 4j..4j+4 of each column: its low nibbles are
            // elements 4j.. (activation word j), its high nibbles elements 16+4j..
            // (activation word j + 4)
            for j in 0..4 {
                let pj = _mm256_loadu_si256(p.add(32 + 32 * j) as *const __m256i);
                let lo = _mm256_and_si256(pj, m4);
                for m in 0..MR {
                    let av = _mm256_set1_epi32(q[m].add(j).read_unaligned());
                    s[m] = _mm256_add_epi16(s[m], _mm256_maddubs_epi16(lo, av));
                }
                let hi = _mm256_and_si256(_mm256_srli_epi16(pj, 4), m4);
                for m in 0..MR {
                    let av = _mm256_set1_epi32(q[m].add(j + 4).read_unaligned());
                    s[m] = _mm256_add_epi16(s[m], _mm256_maddubs_epi16(hi, av));
                }
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            for m in 0..MR {
                let isum = _mm256_madd_epi16(s[m], ones);
                let dd = _mm256_mul_ps(dv, _mm256_set1_ps(a[m].get_unchecked(b).d));
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[m]);
            }
        }
        let mut summ = [_mm256_setzero_ps(); MR];
        for b in 0..nb {
            let mv = _mm256_cvtph_ps(_mm_loadu_si128(grp.as_ptr().add(b * Q4X8_BLOCK + 16) as *const __m128i));
            for m in 0..MR {
                summ[m] = _mm256_fmadd_ps(mv, _mm256_set1_ps(a[m].get_unchecked(b).s), summ[m]);
            }
        }
        for m in 0..MR {
            _mm256_storeu_ps(out[m].as_mut_ptr(), _mm256_add_ps(acc[m], summ[m]));
        }
    }
}

/// Packed Q8x8 kernel: MR activation rows × the 8 columns of group `grp`
/// (see `pack`); mirrors `pack::dot_q8x8_scalar` lane for lane.
///
/// The integer part is exact: `maddubs(|w|, sign(a, w))` forms w·a pairs
/// (|w| ≤ 128, |a| ≤ 127, so a pair is at most 32512 and never saturates),
/// and each chunk is widened to i32 before it is summed (two chunks could
/// overflow i16). The float part is one fma per block per (row, column), in
/// block order, like the twin.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `grp` holds `a[0].len()` group blocks and every `a[m]` as many activation blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q8x8<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        use crate::pack::Q8X8_BLOCK;
        let nb = a[0].len();
        debug_assert!(grp.len() >= nb * Q8X8_BLOCK);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); MR];
        for b in 0..nb {
            prefetch_stream(grp.as_ptr().wrapping_add(b * Q8X8_BLOCK + STREAM_AHEAD), Q8X8_BLOCK);
            let p = grp.as_ptr().add(b * Q8X8_BLOCK);
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            let q: [*const i32; MR] = std::array::from_fn(|m| a[m].get_unchecked(b).qs.as_ptr() as *const i32);
            let mut isum = [_mm256_setzero_si256(); MR];
            // chunk j holds elements 4j..4j+4 of each column, i.e. activation word j;
            // the chunk and its absolute value are shared by the MR rows
            for j in 0..8 {
                let r = _mm256_loadu_si256(p.add(16 + 32 * j) as *const __m256i);
                let ar = _mm256_sign_epi8(r, r);
                for m in 0..MR {
                    let av = _mm256_set1_epi32(q[m].add(j).read_unaligned());
                    let s = _mm256_maddubs_epi16(ar, _mm256_sign_epi8(av, r));
                    isum[m] = _mm256_add_epi32(isum[m], _mm256_madd_epi16(s, ones));
                }
            }
            for m in 0..MR {
                let dd = _mm256_mul_ps(dv, _mm256_set1_ps(a[m].get_unchecked(b).d));
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]), dd, acc[m]);
            }
        }
        for m in 0..MR {
            _mm256_storeu_ps(out[m].as_mut_ptr(), acc[m]);
        }
    }
}

/// Packed Q4Kx8 kernel: MR activation rows × the 8 columns of group `grp`
/// (see `pack`); mirrors `pack::dot_q4kx8_scalar` lane for lane.
///
/// Per sub-block, the integer part of [`dot_q4x8`] (nibbles by activations,
/// exact in i16: 8 · 2 · 15 · 127 < 2¹⁵), then the sub-block's scale and min
/// as the f32 products `d · sc` and `−(dmin · m)`, and the twin's two fmas.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `a[0].len()` is a multiple of 8, `grp` holds `a[0].len() / 8` group super-blocks and every `a[m]` `a[0].len()` activation blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4kx8<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        use crate::pack::Q4KX8_SUPER;
        let nb = a[0].len();
        debug_assert!(nb.is_multiple_of(8) && grp.len() >= nb / 8 * Q4KX8_SUPER);
        let m4 = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let neg = _mm256_set1_ps(-0.0);
        let mut acc = [_mm256_setzero_ps(); MR];
        let mut summ = [_mm256_setzero_ps(); MR];
        for sb in 0..nb / 8 {
            let p = grp.as_ptr().add(sb * Q4KX8_SUPER);
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            let mv = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
            for s in 0..8 {
                let b = 8 * sb + s;
                let q4 = p.add(160 + 128 * s);
                prefetch_stream(q4.wrapping_add(STREAM_AHEAD), 128);
                let scv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(32 + 8 * s) as *const __m128i)));
                let mnv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(96 + 8 * s) as *const __m128i)));
                let dsc = _mm256_mul_ps(dv, scv);
                let dmn = _mm256_xor_ps(_mm256_mul_ps(mv, mnv), neg);
                let q: [*const i32; MR] = std::array::from_fn(|m| a[m].get_unchecked(b).qs.as_ptr() as *const i32);
                let mut sum16 = [_mm256_setzero_si256(); MR];
                for j in 0..4 {
                    let pj = _mm256_loadu_si256(q4.add(32 * j) as *const __m256i);
                    let lo = _mm256_and_si256(pj, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(pj, 4), m4);
                    for m in 0..MR {
                        let al = _mm256_set1_epi32(q[m].add(j).read_unaligned());
                        let ah = _mm256_set1_epi32(q[m].add(j + 4).read_unaligned());
                        sum16[m] = _mm256_add_epi16(sum16[m], _mm256_maddubs_epi16(lo, al));
                        sum16[m] = _mm256_add_epi16(sum16[m], _mm256_maddubs_epi16(hi, ah));
                    }
                }
                for m in 0..MR {
                    let ab = a[m].get_unchecked(b);
                    let isum = _mm256_madd_epi16(sum16[m], ones);
                    let dd = _mm256_mul_ps(dsc, _mm256_set1_ps(ab.d));
                    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[m]);
                    summ[m] = _mm256_fmadd_ps(dmn, _mm256_set1_ps(ab.s), summ[m]);
                }
            }
        }
        for m in 0..MR {
            _mm256_storeu_ps(out[m].as_mut_ptr(), _mm256_add_ps(acc[m], summ[m]));
        }
    }
}

/// Packed Q5x8 kernel: MR activation rows × the 8 columns of group `grp`
/// (see `pack`); mirrors `pack::dot_q5x8_scalar` lane for lane.
///
/// The integer part is exact: `maddubs` of the unsigned 5-bit values (≤ 31)
/// by the activations (|a| ≤ 127) forms pairs of at most 7874, four of which
/// still fit i16, so each half block is widened to i32 once; subtracting
/// `16 · Σ a` leaves Σ q·a. The float part is one fma per block per
/// (row, column), in block order, like the twin.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `grp` holds `a[0].len()` group blocks and every `a[m]` as many activation blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5x8<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        use crate::pack::Q5X8_BLOCK;
        let nb = a[0].len();
        debug_assert!(grp.len() >= nb * Q5X8_BLOCK);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); MR];
        for b in 0..nb {
            let p = grp.as_ptr().add(b * Q5X8_BLOCK);
            prefetch_stream(p.wrapping_add(STREAM_AHEAD), Q5X8_BLOCK);
            let (dv, r) = unpack_q5x8_block!(p);
            for m in 0..MR {
                let ab = a[m].get_unchecked(b);
                let q = ab.qs.as_ptr() as *const i32;
                let mut s = [_mm256_setzero_si256(); 2];
                for j in 0..8 {
                    let av = _mm256_set1_epi32(q.add(j).read_unaligned());
                    s[j / 4] = _mm256_add_epi16(s[j / 4], _mm256_maddubs_epi16(r[j], av));
                }
                let isum = _mm256_add_epi32(_mm256_madd_epi16(s[0], ones), _mm256_madd_epi16(s[1], ones));
                let exact = _mm256_sub_epi32(isum, _mm256_set1_epi32(16 * ab.sum));
                let dd = _mm256_mul_ps(dv, _mm256_set1_ps(ab.d));
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), dd, acc[m]);
            }
        }
        for m in 0..MR {
            _mm256_storeu_ps(out[m].as_mut_ptr(), acc[m]);
        }
    }
}

/// Packed Q6x8 kernel: MR activation rows × the 8 columns of group `grp`
/// (see `pack`); mirrors `pack::dot_q6x8_scalar` lane for lane.
///
/// The integer part is that of [`dot_q8x8`] (|q| ≤ 32), kept as two sums, of
/// elements 0..16 and 16..32, which are multiplied by their sub-scales and
/// added as exact i32 (at most 2 · 16 · 32 · 127 · 128 < 2³¹). The float part
/// is one fma per block per (row, column), in block order, like the twin.
///
/// # Safety
/// AVX2, FMA and F16C available (the module's safety contract); `grp` holds `a[0].len()` group blocks and every `a[m]` as many activation blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6x8<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        use crate::pack::Q6X8_BLOCK;
        let nb = a[0].len();
        debug_assert!(grp.len() >= nb * Q6X8_BLOCK);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); MR];
        for b in 0..nb {
            prefetch_stream(grp.as_ptr().wrapping_add(b * Q6X8_BLOCK + STREAM_AHEAD), Q6X8_BLOCK);
            let p = grp.as_ptr().add(b * Q6X8_BLOCK);
            let q: [*const i32; MR] = std::array::from_fn(|m| a[m].get_unchecked(b).qs.as_ptr() as *const i32);
            let mut half = [[_mm256_setzero_si256(); MR]; 2];
            for j in 0..8 {
                let r = _mm256_loadu_si256(p.add(32 + 32 * j) as *const __m256i);
                let ar = _mm256_sign_epi8(r, r);
                for m in 0..MR {
                    let av = _mm256_set1_epi32(q[m].add(j).read_unaligned());
                    let s = _mm256_maddubs_epi16(ar, _mm256_sign_epi8(av, r));
                    half[j / 4][m] = _mm256_add_epi32(half[j / 4][m], _mm256_madd_epi16(s, ones));
                }
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            let slo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(16) as *const __m128i));
            let shi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(24) as *const __m128i));
            for m in 0..MR {
                let isum = _mm256_add_epi32(_mm256_mullo_epi32(half[0][m], slo), _mm256_mullo_epi32(half[1][m], shi));
                let dd = _mm256_mul_ps(dv, _mm256_set1_ps(a[m].get_unchecked(b).d));
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[m]);
            }
        }
        for m in 0..MR {
            _mm256_storeu_ps(out[m].as_mut_ptr(), acc[m]);
        }
    }
}

/// Activation quantization into 32-element int8 blocks; the same operations as
/// `quant::quantize_act_row_scalar` (max of |x|, one multiply by 127/amax,
/// round half to even, clamp to ±127, integer sum), so the same bits.
///
/// # Safety
/// AVX2/FMA/F16C available; `x.len() == 32 · out.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_act_row(x: &[f32], out: &mut [ActBlock]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        debug_assert_eq!(x.len(), out.len() * 32);
        let sign = _mm256_set1_ps(-0.0);
        let lo = _mm256_set1_ps(-127.0);
        let hi = _mm256_set1_ps(127.0);
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (b, blk) in out.iter_mut().enumerate() {
            let p = x.as_ptr().add(32 * b);
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            let a01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
            let a23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
            let a = _mm256_max_ps(a01, a23);
            let m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let idv = _mm256_set1_ps(id);
            let q: [__m256i; 4] = std::array::from_fn(|i| {
                let r = _mm256_round_ps(_mm256_mul_ps(v[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
            });
            let s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s2 = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b01_00_11_10));
            let sum = _mm_cvtsi128_si32(_mm_add_epi32(s1, _mm_shuffle_epi32(s1, 0b10_11_00_01)));
            let w16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256(blk.qs.as_mut_ptr() as *mut __m256i, _mm256_permutevar8x32_epi32(w16, perm));
            // F16C's round-to-nearest-even conversion: the same bits as
            // `quant::round_f16` for every finite value (and `d` is finite)
            blk.d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d))));
            blk.s = blk.d * sum as f32;
            blk.sum = sum;
        }
    }
}
