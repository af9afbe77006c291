//! Repacked weight layouts, built once at load.
//!
//! `Q4x8` interleaves 8 output rows of a Q4_0/Q4_1 matrix so that one 256-bit
//! register holds 4 consecutive quants of 8 different columns. The kernel then
//! puts *columns* in SIMD lanes: each 4-byte activation group is broadcast and
//! multiplied against 8 columns at once, and the per-block scales of 8 columns
//! load as one vector. Compared with the row-major layout this removes the
//! horizontal sums and most of the per-row scalar work, which is what makes an
//! M-row verify pass cost little more than one row.
//!
//! Group layout (per 8 rows, per 32-element block, 160 bytes — the same size as
//! 8 Q4_1 blocks):
//! - `d[8]`: f16 scales of the 8 rows
//! - `m[8]`: f16 additive mins (Q4_0 is stored as Q4_1 with m = −8·d, exact)
//! - `P[4][8][4]`: for j in 0..4 and column c, the original quant bytes
//!   `qs_c[4j..4j+4]`; their low nibbles are elements 4j..4j+3, their high
//!   nibbles elements 16+4j..16+4j+3.
//!
//! `Q6x8` does the same for Q6_K, whose scales apply to 16 elements: per 8
//! rows and per 32-element sub-block, 288 bytes (the same 8 Q6_K sub-blocks
//! take 210 bytes; the quants are widened to int8 so the kernel reads them as
//! Q8x8 does):
//! - `d[8]`: f16 super-block scales of the 8 rows
//! - `slo[8]`, `shi[8]`: the int8 sub-scales of elements 0..16 and 16..32
//! - `Q[8][8][4]`: for j in 0..8 and column c, the values q − 32 of elements
//!   4j..4j+4, as in Q8x8
//!
//! `Q8x8` does the same for Q8_0 (per 8 rows, per 32-element block, 272 bytes —
//! the same size as 8 Q8_0 blocks):
//! - `d[8]`: f16 scales of the 8 rows
//! - `Q[8][8][4]`: for j in 0..8 and column c, the signed quants
//!   `qs_c[4j..4j+4]` (elements 4j..4j+3).

use tandem_gguf::GgmlType;

use crate::quant::formats::{Format, Q6K};

/// Bytes of one 8-row group block.
pub const Q4X8_BLOCK: usize = 160;

/// Repack a Q4_0 or Q4_1 matrix of `n` rows × `k` columns (n % 8 == 0).
/// Returns None when the type or shape does not qualify, or when a Q4_0 scale
/// cannot be turned into an exact f16 min.
pub fn pack_q4x8(ty: GgmlType, n: usize, k: usize, data: &[u8]) -> Option<Vec<u8>> {
    let (bb, off) = match ty {
        GgmlType::Q4_0 => (18, 2),
        GgmlType::Q4_1 => (20, 4),
        _ => return None,
    };
    if n % 8 != 0 || k % 32 != 0 || data.len() != n * (k / 32) * bb {
        return None;
    }
    let nb = k / 32;
    let mut out = vec![0u8; n / 8 * nb * Q4X8_BLOCK];
    for g in 0..n / 8 {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * Q4X8_BLOCK..][..Q4X8_BLOCK];
            for c in 0..8 {
                let src = &data[((g * 8 + c) * nb + b) * bb..][..bb];
                dst[2 * c..2 * c + 2].copy_from_slice(&src[0..2]);
                let m = if ty == GgmlType::Q4_1 {
                    [src[2], src[3]]
                } else {
                    let d = half::f16::from_le_bytes([src[0], src[1]]);
                    let m = half::f16::from_f32(-8.0 * d.to_f32());
                    if m.to_f32() != -8.0 * d.to_f32() {
                        return None;
                    }
                    m.to_le_bytes()
                };
                dst[16 + 2 * c..16 + 2 * c + 2].copy_from_slice(&m);
                for j in 0..4 {
                    dst[32 + 32 * j + 4 * c..][..4].copy_from_slice(&src[off + 4 * j..off + 4 * j + 4]);
                }
            }
        }
    }
    Some(out)
}

/// Quant value of column `c`, element `e` (0..32) of a packed group block.
#[inline(always)]
pub(crate) fn q4x8_value(blk: &[u8], c: usize, e: usize) -> u8 {
    let (j, t, hi) = if e < 16 { (e / 4, e % 4, false) } else { ((e - 16) / 4, e % 4, true) };
    let byte = blk[32 + 32 * j + 4 * c + t];
    if hi {
        byte >> 4
    } else {
        byte & 0x0F
    }
}

/// Dequantize row `r` of a packed matrix.
pub fn q4x8_row_f32(data: &[u8], k: usize, r: usize, out: &mut [f32]) {
    let nb = k / 32;
    let (g, c) = (r / 8, r % 8);
    for b in 0..nb {
        let blk = &data[(g * nb + b) * Q4X8_BLOCK..][..Q4X8_BLOCK];
        let d = crate::quant::f16_to_f32(u16::from_le_bytes([blk[2 * c], blk[2 * c + 1]]));
        let m = crate::quant::f16_to_f32(u16::from_le_bytes([blk[16 + 2 * c], blk[17 + 2 * c]]));
        for e in 0..32 {
            out[b * 32 + e] = d * q4x8_value(blk, c, e) as f32 + m;
        }
    }
}

/// Scalar twin of the packed kernel for one (activation row, column):
/// per block, an exact integer dot, then `acc = fma(isum, d·a.d, acc)` and
/// `summ = fma(m, a.s, summ)`, in block order; the result is `acc + summ`.
pub fn dot_q4x8_scalar(data: &[u8], k: usize, col: usize, a: &[crate::quant::ActBlock]) -> f32 {
    let nb = k / 32;
    let (g, c) = (col / 8, col % 8);
    let (mut acc, mut summ) = (0f32, 0f32);
    for (b, ab) in a.iter().enumerate().take(nb) {
        let blk = &data[(g * nb + b) * Q4X8_BLOCK..][..Q4X8_BLOCK];
        let d = crate::quant::f16_to_f32(u16::from_le_bytes([blk[2 * c], blk[2 * c + 1]]));
        let m = crate::quant::f16_to_f32(u16::from_le_bytes([blk[16 + 2 * c], blk[17 + 2 * c]]));
        let mut isum = 0i32;
        for e in 0..32 {
            isum += q4x8_value(blk, c, e) as i32 * ab.qs[e] as i32;
        }
        acc = (isum as f32).mul_add(d * ab.d, acc);
        summ = m.mul_add(ab.s, summ);
    }
    acc + summ
}

/// Bytes of one 8-row Q8x8 group block.
pub const Q8X8_BLOCK: usize = 272;

/// Repack a Q8_0 matrix of `n` rows × `k` columns (n % 8 == 0, k % 32 == 0).
/// Returns None when the shape or size does not qualify.
pub fn pack_q8x8(n: usize, k: usize, data: &[u8]) -> Option<Vec<u8>> {
    const BB: usize = 34;
    if n % 8 != 0 || k % 32 != 0 || data.len() != n * (k / 32) * BB {
        return None;
    }
    let nb = k / 32;
    let mut out = vec![0u8; n / 8 * nb * Q8X8_BLOCK];
    for g in 0..n / 8 {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * Q8X8_BLOCK..][..Q8X8_BLOCK];
            for c in 0..8 {
                let src = &data[((g * 8 + c) * nb + b) * BB..][..BB];
                dst[2 * c..2 * c + 2].copy_from_slice(&src[0..2]);
                for j in 0..8 {
                    dst[16 + 32 * j + 4 * c..][..4].copy_from_slice(&src[2 + 4 * j..2 + 4 * j + 4]);
                }
            }
        }
    }
    Some(out)
}

/// Bytes of one Q6x8 group block.
pub const Q6X8_BLOCK: usize = 288;

/// Repack a Q6_K matrix of `n` rows × `k` columns (n % 8 == 0, k % 256 == 0)
/// into Q6x8. None when the shape does not qualify.
pub fn pack_q6x8(n: usize, k: usize, data: &[u8]) -> Option<Vec<u8>> {
    if n % 8 != 0 || k % 256 != 0 || data.len() != n * (k / 256) * Q6K::BYTES {
        return None;
    }
    let (nsb, nb) = (k / 256, k / 32);
    let mut out = vec![0u8; n / 8 * nb * Q6X8_BLOCK];
    let mut q = [0i8; 32];
    for g in 0..n / 8 {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * Q6X8_BLOCK..][..Q6X8_BLOCK];
            for c in 0..8 {
                let src = &data[((g * 8 + c) * nsb + b / 8) * Q6K::BYTES..][..Q6K::BYTES];
                let s = b % 8;
                dst[2 * c..2 * c + 2].copy_from_slice(&src[208..210]);
                let h = Q6K::scales(src, s).h;
                dst[16 + c] = h[0] as i8 as u8;
                dst[24 + c] = h[1] as i8 as u8;
                Q6K::values(src, s, &mut q);
                for j in 0..8 {
                    for t in 0..4 {
                        dst[32 + 32 * j + 4 * c + t] = q[4 * j + t] as u8;
                    }
                }
            }
        }
    }
    Some(out)
}

/// (f16 scale bits, low and high sub-scale) of column `c` in a Q6x8 group block.
#[inline(always)]
fn q6x8_scales(blk: &[u8], c: usize) -> (f32, i32, i32) {
    let d = crate::quant::f16_to_f32(u16::from_le_bytes([blk[2 * c], blk[2 * c + 1]]));
    (d, blk[16 + c] as i8 as i32, blk[24 + c] as i8 as i32)
}

/// Dequantize row `r` of a Q6x8-packed matrix with the row layout's
/// expression (`(d · sc) · q + 0.0`), so the values are identical.
pub fn q6x8_row_f32(data: &[u8], k: usize, r: usize, out: &mut [f32]) {
    let nb = k / 32;
    let (g, c) = (r / 8, r % 8);
    for b in 0..nb {
        let blk = &data[(g * nb + b) * Q6X8_BLOCK..][..Q6X8_BLOCK];
        let (d, lo, hi) = q6x8_scales(blk, c);
        let m = 0.0f32;
        for e in 0..32 {
            let sd = d * if e < 16 { lo } else { hi } as f32;
            out[b * 32 + e] = sd * blk[32 + 32 * (e / 4) + 4 * c + e % 4] as i8 as f32 + m;
        }
    }
}

/// Scalar twin of the packed Q6x8 kernel for one (activation row, column):
/// per sub-block, the exact integer `Σ₀..₁₆ q·a · slo + Σ₁₆..₃₂ q·a · shi`,
/// then `acc = fma(isum, d·a.d, acc)` in block order; the result is `acc`.
pub fn dot_q6x8_scalar(data: &[u8], k: usize, col: usize, a: &[crate::quant::ActBlock]) -> f32 {
    let nb = k / 32;
    let (g, c) = (col / 8, col % 8);
    let mut acc = 0f32;
    for (b, ab) in a.iter().enumerate().take(nb) {
        let blk = &data[(g * nb + b) * Q6X8_BLOCK..][..Q6X8_BLOCK];
        let (d, lo, hi) = q6x8_scales(blk, c);
        let (mut slo, mut shi) = (0i32, 0i32);
        for e in 0..32 {
            let p = blk[32 + 32 * (e / 4) + 4 * c + e % 4] as i8 as i32 * ab.qs[e] as i32;
            if e < 16 {
                slo += p;
            } else {
                shi += p;
            }
        }
        acc = ((slo * lo + shi * hi) as f32).mul_add(d * ab.d, acc);
    }
    acc
}

/// A Q5_0 matrix rewritten as Q8_0 blocks: each block's 32 values (−16…15)
/// as int8 beside the same f16 scale. Exact (both formats mean d·q), so the
/// result can go through [`pack_q8x8`] and the packed Q8 kernels, which read
/// 8.5 bits per weight instead of 5.5 but run several times faster than the
/// row-layout Q5_0 tiles. None when `data` is not whole Q5_0 blocks.
pub fn q5_0_to_q8_0(data: &[u8]) -> Option<Vec<u8>> {
    use crate::quant::formats::{Format, Q5_0};
    if data.len() % Q5_0::BYTES != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(data.len() / Q5_0::BYTES * 34);
    let mut q = [0i8; 32];
    for blk in data.chunks_exact(Q5_0::BYTES) {
        Q5_0::values(blk, 0, &mut q);
        out.extend_from_slice(&blk[0..2]);
        out.extend(q.iter().map(|&v| v as u8));
    }
    Some(out)
}

/// Quant of column `c`, element `e` (0..32) of a packed Q8x8 group block.
#[inline(always)]
pub(crate) fn q8x8_value(blk: &[u8], c: usize, e: usize) -> i8 {
    blk[16 + 32 * (e / 4) + 4 * c + e % 4] as i8
}

/// Dequantize row `r` of a Q8x8-packed matrix; the same expression as the
/// row layout's dequantization (`d · q + 0.0`), so the values are identical.
pub fn q8x8_row_f32(data: &[u8], k: usize, r: usize, out: &mut [f32]) {
    let nb = k / 32;
    let (g, c) = (r / 8, r % 8);
    for b in 0..nb {
        let blk = &data[(g * nb + b) * Q8X8_BLOCK..][..Q8X8_BLOCK];
        let d = crate::quant::f16_to_f32(u16::from_le_bytes([blk[2 * c], blk[2 * c + 1]]));
        let m = 0.0f32;
        for e in 0..32 {
            out[b * 32 + e] = d * q8x8_value(blk, c, e) as f32 + m;
        }
    }
}

/// Scalar twin of the packed Q8x8 kernel for one (activation row, column):
/// per block, an exact integer dot, then `acc = fma(isum, d·a.d, acc)` in
/// block order; the result is `acc`.
pub fn dot_q8x8_scalar(data: &[u8], k: usize, col: usize, a: &[crate::quant::ActBlock]) -> f32 {
    let nb = k / 32;
    let (g, c) = (col / 8, col % 8);
    let mut acc = 0f32;
    for (b, ab) in a.iter().enumerate().take(nb) {
        let blk = &data[(g * nb + b) * Q8X8_BLOCK..][..Q8X8_BLOCK];
        let d = crate::quant::f16_to_f32(u16::from_le_bytes([blk[2 * c], blk[2 * c + 1]]));
        let mut isum = 0i32;
        for e in 0..32 {
            isum += q8x8_value(blk, c, e) as i32 * ab.qs[e] as i32;
        }
        acc = (isum as f32).mul_add(d * ab.d, acc);
    }
    acc
}
