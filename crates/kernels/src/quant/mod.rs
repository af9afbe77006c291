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
/// `x[i] ≈ d * qs[i]`; `s = d * Σ qs[i]` (what the `min` term of Q4_1/Q5_1/K-quants needs).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct ActBlock {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; 32],
}

/// Quantize one f32 row (length a multiple of 32) into `out` (len / 32 blocks).
/// Rounds half to even, like the AVX2 `round_ps` instruction, with |q| ≤ 127.
pub fn quantize_act_row(x: &[f32], out: &mut [ActBlock]) {
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
    }
}

#[inline]
fn round_f16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}
