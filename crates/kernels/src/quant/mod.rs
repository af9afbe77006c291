//! Quantized block formats and the int8 activation blocks used by quantized matmuls.
//!
//! Weights stay in their GGUF block layout (zero-copy from the map). Activations
//! are quantized per row into 32-element int8 blocks ([`ActBlock`]) with one f32
//! scale, so every weight format reduces to the same integer inner product of
//! 32-element sub-blocks. The per-row quantization makes the activation side of a
//! matmul depend only on that row, which keeps batched results row-invariant.

pub mod dot;
pub mod formats;
pub mod quantize;

pub use formats::{dequantize_row, f16_to_f32};

/// One 32-element int8 block of a quantized activation row.
/// `x[i] ≈ d * qs[i]`; `s = d * Σ qs[i]` (what the `min` term of Q4_1/Q5_1/K-quants needs);
/// `sum = Σ qs[i]` (what an unsigned-weight `vpdpbusd` product subtracts, see `simd::avx512`).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct ActBlock {
    pub d: f32,
    pub s: f32,
    pub sum: i32,
    pub qs: [i8; 32],
}

/// Quantize one f32 row (length a multiple of 32) into `out` (len / 32 blocks).
/// Rounds half to even, like the AVX2 `round_ps` instruction, with |q| ≤ 127.
/// Uses the SIMD kernel where available; it gives the same bits as
/// [`quantize_act_row_scalar`].
pub fn quantize_act_row(x: &[f32], out: &mut [ActBlock]) {
    assert_eq!(x.len(), out.len() * 32, "activation row length must be 32 × blocks");
    match crate::simd::simd_level() {
        // SAFETY: AVX2/FMA/F16C checked by simd_level; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        crate::SimdLevel::Avx2 => unsafe { crate::simd::avx2::quantize_act_row(x, out) },
        _ => quantize_act_row_scalar(x, out),
    }
}

/// Scalar twin of [`quantize_act_row`].
pub fn quantize_act_row_scalar(x: &[f32], out: &mut [ActBlock]) {
    assert_eq!(x.len(), out.len() * 32, "activation row length must be 32 × blocks");
    for (blk, xs) in out.iter_mut().zip(x.chunks_exact(32)) {
        let mut amax = 0f32;
        for &v in xs {
            amax = amax.max(v.abs());
        }
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in blk.qs.iter_mut().zip(xs) {
            let r = (v * id).round_ties_even().clamp(-127.0, 127.0) as i32;
            *q = r as i8;
            sum += r;
        }
        // The scale is kept at f16 precision, as llama.cpp stores it, so our
        // numbers track the reference engine's; `s` is then exactly consistent
        // with the stored quants (Σ x ≈ d·Σ q), which the min terms rely on.
        blk.d = round_f16(d);
        blk.s = blk.d * sum as f32;
        blk.sum = sum;
    }
}

#[inline]
pub(crate) fn round_f16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_quantizer_equals_the_scalar_twin() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..400 {
            let nb = 1 + case % 7;
            let x: Vec<f32> = (0..nb * 32)
                .map(|i| {
                    let r = next();
                    match (case + i) % 5 {
                        // exact halves after scaling: ties must round to even in both
                        0 => (r % 255) as f32 * 0.5 - 63.5,
                        1 => 0.0,
                        2 => f32::from_bits((r as u32 & 0x807F_FFFF) | 0x3F00_0000),
                        3 => ((r >> 11) as f64 / (1u64 << 53) as f64 * 2e4 - 1e4) as f32,
                        _ => ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e-3,
                    }
                })
                .collect();
            let mut a = vec![ActBlock::default(); nb];
            let mut b = vec![ActBlock::default(); nb];
            quantize_act_row(&x, &mut a);
            quantize_act_row_scalar(&x, &mut b);
            for (p, q) in a.iter().zip(&b) {
                assert_eq!((p.d.to_bits(), p.s.to_bits(), p.sum, p.qs), (q.d.to_bits(), q.s.to_bits(), q.sum, q.qs), "case {case}");
                assert_eq!(p.sum, p.qs.iter().map(|&v| v as i32).sum::<i32>());
            }
        }
        // whole blocks at one magnitude, so the scale sweeps f16's subnormal
        // range, its normal range and past its largest value
        for e in -40..=40 {
            let x: Vec<f32> = (0..64).map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2f32.powi(e)).collect();
            let mut a = vec![ActBlock::default(); 2];
            let mut b = vec![ActBlock::default(); 2];
            quantize_act_row(&x, &mut a);
            quantize_act_row_scalar(&x, &mut b);
            for (p, q) in a.iter().zip(&b) {
                assert_eq!((p.d.to_bits(), p.s.to_bits(), p.sum, p.qs), (q.d.to_bits(), q.s.to_bits(), q.sum, q.qs), "2^{e}");
            }
        }
        let zeros = vec![0f32; 64];
        let mut a = vec![ActBlock::default(); 2];
        quantize_act_row(&zeros, &mut a);
        assert!(a.iter().all(|b| b.d == 0.0 && b.s == 0.0 && b.sum == 0 && b.qs == [0; 32]));
    }
}
