//! VNNI variants of the packed kernels, in two encodings: AVX-VNNI (VEX,
//! Intel Alder Lake and later, AMD Zen 5) and AVX512-VNNI with AVX512VL on
//! 256-bit registers (EVEX, e.g. AMD Zen 4 and Intel Ice Lake, which lack the
//! VEX form). Both are generated from one body.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes and adds groups of four
//! products straight into i32 lanes, replacing the `maddubs` + `madd` + add
//! sequence of the AVX2 kernels. The integer sums are exact in both (no i16
//! step saturates, see `avx2::dot_q8x8`), and the float part is the same
//! sequence of operations, so these kernels give the same bits as their AVX2
//! versions and the scalar twins in `pack`.
//!
//! # Safety contract
//! Every `unsafe fn` here requires AVX2, FMA, F16C and its module's VNNI
//! encoding (`avx`: AVX-VNNI; `evex`: AVX512-VNNI and AVX512VL; the caller
//! checks [`super::vnni_kind`]) and a group slice holding `a[0].len()` group
//! blocks, as for the AVX2 kernels.

/// The two kernels for one encoding: `$feat` is the target feature list,
/// `$dp` the `vpdpbusd` intrinsic of that encoding.
macro_rules! vnni_kernels {
    ($feat:literal, $dp:ident) => {
        use std::arch::x86_64::*;

        use crate::quant::ActBlock;

        /// Packed Q4x8 kernel; same contract and bits as `avx2::dot_q4x8`.
        ///
        /// # Safety
        /// As `avx2::dot_q4x8`, and this module's VNNI encoding available.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dot_q4x8<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
            // SAFETY: the caller upholds this function's `# Safety` contract.
            unsafe {
                use crate::pack::Q4X8_BLOCK;
                let nb = a[0].len();
                debug_assert!(grp.len() >= nb * Q4X8_BLOCK);
                let m4 = _mm256_set1_epi8(0x0F);
                let mut acc = [_mm256_setzero_ps(); MR];
                let mut summ = [_mm256_setzero_ps(); MR];
                for b in 0..nb {
                    let p = grp.as_ptr().add(b * Q4X8_BLOCK);
                    crate::simd::prefetch_stream(p.wrapping_add(crate::simd::STREAM_AHEAD), Q4X8_BLOCK);
                    let (dv, mv, r) = unpack_q4x8_block!(p, m4);
                    for m in 0..MR {
                        let ab = a[m].get_unchecked(b);
                        let q = ab.qs.as_ptr() as *const i32;
                        // two independent chains (even and odd words), summed exactly
                        let mut s0 = _mm256_setzero_si256();
                        let mut s1 = _mm256_setzero_si256();
                        for j in (0..8).step_by(2) {
                            s0 = $dp(s0, r[j], _mm256_set1_epi32(q.add(j).read_unaligned()));
                            s1 = $dp(s1, r[j + 1], _mm256_set1_epi32(q.add(j + 1).read_unaligned()));
                        }
                        let isum = _mm256_add_epi32(s0, s1);
                        let dd = _mm256_mul_ps(dv, _mm256_set1_ps(ab.d));
                        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[m]);
                        summ[m] = _mm256_fmadd_ps(mv, _mm256_set1_ps(ab.s), summ[m]);
                    }
                }
                for m in 0..MR {
                    _mm256_storeu_ps(out[m].as_mut_ptr(), _mm256_add_ps(acc[m], summ[m]));
                }
            }
        }

        /// Packed Q5x8 kernel; same contract and bits as `avx2::dot_q5x8`:
        /// `vpdpbusd` takes the unsigned 5-bit values as they are, and
        /// `16 · Σ a` is subtracted per block.
        ///
        /// # Safety
        /// As `avx2::dot_q5x8`, and this module's VNNI encoding available.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dot_q5x8<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
            // SAFETY: the caller upholds this function's `# Safety` contract.
            unsafe {
                use crate::pack::Q5X8_BLOCK;
                let nb = a[0].len();
                debug_assert!(grp.len() >= nb * Q5X8_BLOCK);
                let mut acc = [_mm256_setzero_ps(); MR];
                for b in 0..nb {
                    let p = grp.as_ptr().add(b * Q5X8_BLOCK);
                    crate::simd::prefetch_stream(p.wrapping_add(crate::simd::STREAM_AHEAD), Q5X8_BLOCK);
                    let (dv, r) = unpack_q5x8_block!(p);
                    for m in 0..MR {
                        let ab = a[m].get_unchecked(b);
                        let q = ab.qs.as_ptr() as *const i32;
                        let mut s0 = _mm256_setzero_si256();
                        let mut s1 = _mm256_setzero_si256();
                        for j in (0..8).step_by(2) {
                            s0 = $dp(s0, r[j], _mm256_set1_epi32(q.add(j).read_unaligned()));
                            s1 = $dp(s1, r[j + 1], _mm256_set1_epi32(q.add(j + 1).read_unaligned()));
                        }
                        let exact = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_set1_epi32(16 * ab.sum));
                        let dd = _mm256_mul_ps(dv, _mm256_set1_ps(ab.d));
                        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), dd, acc[m]);
                    }
                }
                for m in 0..MR {
                    _mm256_storeu_ps(out[m].as_mut_ptr(), acc[m]);
                }
            }
        }

        /// Packed Q4Kx8 kernel; same contract and bits as `avx2::dot_q4kx8`
        /// (`vpdpbusd` takes the nibbles as they are).
        ///
        /// # Safety
        /// As `avx2::dot_q4kx8`, and this module's VNNI encoding available.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dot_q4kx8<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
            // SAFETY: the caller upholds this function's `# Safety` contract.
            unsafe {
                use crate::pack::Q4KX8_SUPER;
                let nb = a[0].len();
                debug_assert!(nb % 8 == 0 && grp.len() >= nb / 8 * Q4KX8_SUPER);
                let m4 = _mm256_set1_epi8(0x0F);
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
                        crate::simd::prefetch_stream(q4.wrapping_add(crate::simd::STREAM_AHEAD), 128);
                        let scv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(32 + 8 * s) as *const __m128i)));
                        let mnv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(96 + 8 * s) as *const __m128i)));
                        let dsc = _mm256_mul_ps(dv, scv);
                        let dmn = _mm256_xor_ps(_mm256_mul_ps(mv, mnv), neg);
                        let mut r = [_mm256_setzero_si256(); 8];
                        for j in 0..4 {
                            let pj = _mm256_loadu_si256(q4.add(32 * j) as *const __m256i);
                            r[j] = _mm256_and_si256(pj, m4);
                            r[j + 4] = _mm256_and_si256(_mm256_srli_epi16(pj, 4), m4);
                        }
                        for m in 0..MR {
                            let ab = a[m].get_unchecked(b);
                            let q = ab.qs.as_ptr() as *const i32;
                            let mut s0 = _mm256_setzero_si256();
                            let mut s1 = _mm256_setzero_si256();
                            for j in (0..8).step_by(2) {
                                s0 = $dp(s0, r[j], _mm256_set1_epi32(q.add(j).read_unaligned()));
                                s1 = $dp(s1, r[j + 1], _mm256_set1_epi32(q.add(j + 1).read_unaligned()));
                            }
                            let isum = _mm256_add_epi32(s0, s1);
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

        /// Packed Q6x8 kernel; same contract and bits as `avx2::dot_q6x8`:
        /// `vpdpbusd` of |w| by the activations carrying w's sign (|w| ≤ 32,
        /// so a 4-product group is at most 4·32·127), the two half sums kept
        /// apart for their sub-scales.
        ///
        /// # Safety
        /// As `avx2::dot_q6x8`, and this module's VNNI encoding available.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dot_q6x8<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
            // SAFETY: the caller upholds this function's `# Safety` contract.
            unsafe {
                use crate::pack::Q6X8_BLOCK;
                let nb = a[0].len();
                debug_assert!(grp.len() >= nb * Q6X8_BLOCK);
                let mut acc = [_mm256_setzero_ps(); MR];
                for b in 0..nb {
                    let p = grp.as_ptr().add(b * Q6X8_BLOCK);
                    crate::simd::prefetch_stream(p.wrapping_add(crate::simd::STREAM_AHEAD), Q6X8_BLOCK);
                    let q: [*const i32; MR] = std::array::from_fn(|m| a[m].get_unchecked(b).qs.as_ptr() as *const i32);
                    let mut half = [[_mm256_setzero_si256(); MR]; 2];
                    for j in 0..8 {
                        let r = _mm256_loadu_si256(p.add(32 + 32 * j) as *const __m256i);
                        let ar = _mm256_sign_epi8(r, r);
                        for m in 0..MR {
                            let av = _mm256_set1_epi32(q[m].add(j).read_unaligned());
                            half[j / 4][m] = $dp(half[j / 4][m], ar, _mm256_sign_epi8(av, r));
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

        /// Packed Q8x8 kernel; same contract and bits as `avx2::dot_q8x8`.
        /// `vpdpbusd` needs an unsigned operand, so it takes the weights as
        /// `w + 128` (top bit flipped, shared by the rows) and subtracts
        /// `128 · Σ a` per block, as `avx512::dot_q8x16` does; the integer is
        /// exactly Σ w·a.
        ///
        /// # Safety
        /// As `avx2::dot_q8x8`, and this module's VNNI encoding available.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dot_q8x8<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
            // SAFETY: the caller upholds this function's `# Safety` contract.
            unsafe {
                use crate::pack::Q8X8_BLOCK;
                let nb = a[0].len();
                debug_assert!(grp.len() >= nb * Q8X8_BLOCK);
                let flip = _mm256_set1_epi8(0x80u8 as i8);
                let mut acc = [_mm256_setzero_ps(); MR];
                for b in 0..nb {
                    let p = grp.as_ptr().add(b * Q8X8_BLOCK);
                    crate::simd::prefetch_stream(p.wrapping_add(crate::simd::STREAM_AHEAD), Q8X8_BLOCK);
                    let dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                    let q: [*const i32; MR] = std::array::from_fn(|m| a[m].get_unchecked(b).qs.as_ptr() as *const i32);
                    let mut isum = [_mm256_setzero_si256(); MR];
                    for j in 0..8 {
                        let u = _mm256_xor_si256(_mm256_loadu_si256(p.add(16 + 32 * j) as *const __m256i), flip);
                        for m in 0..MR {
                            isum[m] = $dp(isum[m], u, _mm256_set1_epi32(q[m].add(j).read_unaligned()));
                        }
                    }
                    for m in 0..MR {
                        let ab = a[m].get_unchecked(b);
                        let exact = _mm256_sub_epi32(isum[m], _mm256_set1_epi32(128 * ab.sum));
                        let dd = _mm256_mul_ps(dv, _mm256_set1_ps(ab.d));
                        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), dd, acc[m]);
                    }
                }
                for m in 0..MR {
                    _mm256_storeu_ps(out[m].as_mut_ptr(), acc[m]);
                }
            }
        }
    };
}

/// AVX-VNNI (VEX encoding).
pub(crate) mod avx {
    vnni_kernels!("avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32);
}

/// AVX512-VNNI on 256-bit registers (EVEX encoding, needs AVX512VL).
pub(crate) mod evex {
    vnni_kernels!("avx2,fma,f16c,avx512vnni,avx512vl", _mm256_dpbusd_epi32);
}

#[cfg(test)]
mod tests {
    use crate::pack::{pack_q4x8, pack_q8x8, Q4X8_BLOCK, Q8X8_BLOCK};
    use crate::quant::ActBlock;
    use crate::simd::testutil::{acts, blocks, Rng};
    use crate::simd::Vnni;

    fn check<const MR: usize>(rng: &mut Rng, kind: Vnni) {
        let nb = 5;
        let a = acts(rng, MR, nb);
        let ar: [&[ActBlock]; MR] = std::array::from_fn(|i| a[i].as_slice());
        let q4 = pack_q4x8(tandem_gguf::GgmlType::Q4_1, 8, nb * 32, &blocks(rng, 8, nb, 20, 2)).unwrap();
        let q8 = pack_q8x8(8, nb * 32, &blocks(rng, 8, nb, 34, 1)).unwrap();
        assert_eq!((q4.len(), q8.len()), (nb * Q4X8_BLOCK, nb * Q8X8_BLOCK));
        let (mut x, mut y) = ([[0f32; 8]; MR], [[0f32; 8]; MR]);
        // SAFETY: features checked by the caller; the groups hold nb blocks.
        unsafe {
            match kind {
                Vnni::Avx => super::avx::dot_q4x8::<MR>(&q4, ar, &mut x),
                _ => super::evex::dot_q4x8::<MR>(&q4, ar, &mut x),
            }
            crate::simd::avx2::dot_q4x8::<MR>(&q4, ar, &mut y);
        }
        for m in 0..MR {
            for c in 0..8 {
                let want = crate::pack::dot_q4x8_scalar(&q4, nb * 32, c, &a[m]);
                assert_eq!(x[m][c].to_bits(), want.to_bits(), "q4x8 vnni MR={MR} row {m} col {c}");
                assert_eq!(y[m][c].to_bits(), want.to_bits(), "q4x8 avx2 MR={MR} row {m} col {c}");
            }
        }
        // Q6_K and Q4_K need whole 256-element super-blocks
        let nsb = 2;
        let ak = acts(rng, MR, nsb * 8);
        let akr: [&[ActBlock]; MR] = std::array::from_fn(|i| ak[i].as_slice());
        let mut q6raw = blocks(rng, 8, nsb, 210, 0);
        for blk in q6raw.chunks_exact_mut(210) {
            blk[208..210].copy_from_slice(&half::f16::from_f32(rng.f() * 0.1).to_le_bytes());
        }
        let q6 = crate::pack::pack_q6x8(8, nsb * 256, &q6raw).unwrap();
        let q4k = crate::pack::pack_q4kx8(8, nsb * 256, &blocks(rng, 8, nsb, 144, 2)).unwrap();
        unsafe {
            match kind {
                Vnni::Avx => super::avx::dot_q6x8::<MR>(&q6, akr, &mut x),
                _ => super::evex::dot_q6x8::<MR>(&q6, akr, &mut x),
            }
            crate::simd::avx2::dot_q6x8::<MR>(&q6, akr, &mut y);
        }
        for m in 0..MR {
            for c in 0..8 {
                let want = crate::pack::dot_q6x8_scalar(&q6, nsb * 256, c, &ak[m]);
                assert_eq!(x[m][c].to_bits(), want.to_bits(), "q6x8 vnni MR={MR} row {m} col {c}");
                assert_eq!(y[m][c].to_bits(), want.to_bits(), "q6x8 avx2 MR={MR} row {m} col {c}");
            }
        }
        unsafe {
            match kind {
                Vnni::Avx => super::avx::dot_q4kx8::<MR>(&q4k, akr, &mut x),
                _ => super::evex::dot_q4kx8::<MR>(&q4k, akr, &mut x),
            }
            crate::simd::avx2::dot_q4kx8::<MR>(&q4k, akr, &mut y);
        }
        for m in 0..MR {
            for c in 0..8 {
                let want = crate::pack::dot_q4kx8_scalar(&q4k, nsb * 256, c, &ak[m]);
                assert_eq!(x[m][c].to_bits(), want.to_bits(), "q4kx8 vnni MR={MR} row {m} col {c}");
                assert_eq!(y[m][c].to_bits(), want.to_bits(), "q4kx8 avx2 MR={MR} row {m} col {c}");
            }
        }
        let q5 = crate::pack::pack_q5x8(8, nb * 32, &blocks(rng, 8, nb, 22, 1)).unwrap();
        unsafe {
            match kind {
                Vnni::Avx => super::avx::dot_q5x8::<MR>(&q5, ar, &mut x),
                _ => super::evex::dot_q5x8::<MR>(&q5, ar, &mut x),
            }
            crate::simd::avx2::dot_q5x8::<MR>(&q5, ar, &mut y);
        }
        for m in 0..MR {
            for c in 0..8 {
                let want = crate::pack::dot_q5x8_scalar(&q5, nb * 32, c, &a[m]);
                assert_eq!(x[m][c].to_bits(), want.to_bits(), "q5x8 vnni MR={MR} row {m} col {c}");
                assert_eq!(y[m][c].to_bits(), want.to_bits(), "q5x8 avx2 MR={MR} row {m} col {c}");
            }
        }
        unsafe {
            match kind {
                Vnni::Avx => super::avx::dot_q8x8::<MR>(&q8, ar, &mut x),
                _ => super::evex::dot_q8x8::<MR>(&q8, ar, &mut x),
            }
            crate::simd::avx2::dot_q8x8::<MR>(&q8, ar, &mut y);
        }
        for m in 0..MR {
            for c in 0..8 {
                let want = crate::pack::dot_q8x8_scalar(&q8, nb * 32, c, &a[m]);
                assert_eq!(x[m][c].to_bits(), want.to_bits(), "q8x8 vnni MR={MR} row {m} col {c}");
                assert_eq!(y[m][c].to_bits(), want.to_bits(), "q8x8 avx2 MR={MR} row {m} col {c}");
            }
        }
    }

    #[test]
    fn vnni_and_avx2_kernels_equal_the_scalar_twins() {
        let base = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
        let kinds = [
            (Vnni::Avx, is_x86_feature_detected!("avxvnni")),
            (Vnni::Evex, is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")),
        ];
        for (kind, has) in kinds {
            if !(base && has) {
                eprintln!("skipped {kind:?}: not on this CPU");
                continue;
            }
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
            for _ in 0..50 {
                check::<1>(&mut rng, kind);
                check::<2>(&mut rng, kind);
                check::<3>(&mut rng, kind);
                check::<4>(&mut rng, kind);
                check::<5>(&mut rng, kind);
                check::<6>(&mut rng, kind);
            }
        }
    }
}
