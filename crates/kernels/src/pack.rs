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
//! `Q5x8` does the same for Q5_0 at its own 5.5 bits per weight (per 8 rows,
//! per 32-element block, 176 bytes — the same size as 8 Q5_0 blocks):
//! - `d[8]`: f16 scales of the 8 rows
//! - `H[8][4]`: for column c and byte t, bit h of `H[c][t]` is the fifth bit of
//!   element 4h+t (h < 4) or 16+4(h−4)+t (h ≥ 4), so one shift and one mask
//!   put the fifth bits of a whole nibble vector in place
//! - `P[4][8][4]`: the low nibbles, arranged as in Q4x8
//!
//! The kernels read the unsigned 5-bit values u = q + 16 and subtract
//! `16 · Σ a` per block, which leaves exactly the integer Σ q·a of the Q8_0
//! form of the same block: Q5x8 and Q5_0 rewritten as Q8x8 give the same bits.
//!
//! `Q4Kx8` does the same for Q4_K, per 8 rows and per 256-element
//! super-block, 1,184 bytes (4.625 bits per weight; the 8 Q4_K super-blocks
//! take 1,152):
//! - `d[8]`, `dmin[8]`: the f16 super-block scales of the 8 rows
//! - `sc[8][8]`, `m[8][8]`: for sub-block s and column c, the 6-bit scale and
//!   min, unpacked to a byte each
//! - `P[8][4][8][4]`: for sub-block s, its nibbles arranged as one Q4x8 block
//!
//! A sub-block's scale is `d · sc` and its min `−(dmin · m)`, the products of
//! the row layout, so the values are the same numbers.
//!
//! `Q8x8` does the same for Q8_0 (per 8 rows, per 32-element block, 272 bytes —
//! the same size as 8 Q8_0 blocks):
//! - `d[8]`: f16 scales of the 8 rows
//! - `Q[8][8][4]`: for j in 0..8 and column c, the signed quants
//!   `qs_c[4j..4j+4]` (elements 4j..4j+3).

use tandem_gguf::GgmlType;

use crate::quant::formats::{scale_min_k4, Format, Q4K, Q6K};

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
    if !n.is_multiple_of(8) || !k.is_multiple_of(32) || data.len() != n * (k / 32) * bb {
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

/// The exact integer Σ q·a of column `c` of a Q4x8-arranged block.
#[inline(always)]
fn q4x8_isum(blk: &[u8], c: usize, qs: &[i8; 32]) -> i32 {
    (0..32).map(|e| q4x8_value(blk, c, e) as i32 * qs[e] as i32).sum()
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
        let isum = q4x8_isum(blk, c, &ab.qs);
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
    if !n.is_multiple_of(8) || !k.is_multiple_of(32) || data.len() != n * (k / 32) * BB {
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
    if !n.is_multiple_of(8) || !k.is_multiple_of(256) || data.len() != n * (k / 256) * Q6K::BYTES {
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

/// Bytes of one Q4Kx8 group super-block (8 rows × 256 elements).
pub const Q4KX8_SUPER: usize = 1184;
/// Bytes per 32-element block of a Q4Kx8 group (for sizing group slices).
pub const Q4KX8_BLOCK: usize = Q4KX8_SUPER / 8;

/// Repack a Q4_K matrix of `n` rows × `k` columns (n % 8 == 0, k % 256 == 0)
/// into Q4Kx8. None when the shape does not qualify.
pub fn pack_q4kx8(n: usize, k: usize, data: &[u8]) -> Option<Vec<u8>> {
    if !n.is_multiple_of(8) || !k.is_multiple_of(256) || data.len() != n * (k / 256) * Q4K::BYTES {
        return None;
    }
    let nsb = k / 256;
    let mut out = vec![0u8; n / 8 * nsb * Q4KX8_SUPER];
    let mut q = [0i8; 32];
    for g in 0..n / 8 {
        for sb in 0..nsb {
            let dst = &mut out[(g * nsb + sb) * Q4KX8_SUPER..][..Q4KX8_SUPER];
            for c in 0..8 {
                let src = &data[((g * 8 + c) * nsb + sb) * Q4K::BYTES..][..Q4K::BYTES];
                dst[2 * c..2 * c + 2].copy_from_slice(&src[0..2]);
                dst[16 + 2 * c..16 + 2 * c + 2].copy_from_slice(&src[2..4]);
                for s in 0..8 {
                    let (sc, m) = scale_min_k4(s, &src[4..16]);
                    dst[32 + 8 * s + c] = sc;
                    dst[96 + 8 * s + c] = m;
                    Q4K::values(src, s, &mut q);
                    for j in 0..4 {
                        for t in 0..4 {
                            let (lo, hi) = (q[4 * j + t] as u8, q[16 + 4 * j + t] as u8);
                            dst[160 + 128 * s + 32 * j + 4 * c + t] = lo | (hi << 4);
                        }
                    }
                }
            }
        }
    }
    Some(out)
}

/// (scale, min) of column `c`, sub-block `s` of a Q4Kx8 super-block: the
/// products of the row layout, `d · sc` and `−(dmin · m)`.
#[inline(always)]
fn q4kx8_scales(sup: &[u8], c: usize, s: usize) -> (f32, f32) {
    let d = crate::quant::f16_to_f32(u16::from_le_bytes([sup[2 * c], sup[2 * c + 1]]));
    let dmin = crate::quant::f16_to_f32(u16::from_le_bytes([sup[16 + 2 * c], sup[17 + 2 * c]]));
    (d * sup[32 + 8 * s + c] as f32, -(dmin * sup[96 + 8 * s + c] as f32))
}

/// Dequantize row `r` of a Q4Kx8-packed matrix (`scale · q + min`, as the
/// row layout does).
pub fn q4kx8_row_f32(data: &[u8], k: usize, r: usize, out: &mut [f32]) {
    let nsb = k / 256;
    let (g, c) = (r / 8, r % 8);
    for sb in 0..nsb {
        let sup = &data[(g * nsb + sb) * Q4KX8_SUPER..][..Q4KX8_SUPER];
        for s in 0..8 {
            let (d, m) = q4kx8_scales(sup, c, s);
            let blk = &sup[160 + 128 * s - 32..];
            for e in 0..32 {
                out[sb * 256 + s * 32 + e] = d * q4x8_value(blk, c, e) as f32 + m;
            }
        }
    }
}

/// Scalar twin of the packed Q4Kx8 kernel for one (activation row, column):
/// per sub-block, an exact integer dot, then `acc = fma(isum, scale·a.d,
/// acc)` and `summ = fma(min, a.s, summ)`, in block order; the result is
/// `acc + summ` (the operations of [`dot_q4x8_scalar`]).
pub fn dot_q4kx8_scalar(data: &[u8], k: usize, col: usize, a: &[crate::quant::ActBlock]) -> f32 {
    let nsb = k / 256;
    let (g, c) = (col / 8, col % 8);
    let (mut acc, mut summ) = (0f32, 0f32);
    for (b, ab) in a.iter().enumerate().take(nsb * 8) {
        let sup = &data[(g * nsb + b / 8) * Q4KX8_SUPER..][..Q4KX8_SUPER];
        let s = b % 8;
        let (d, m) = q4kx8_scales(sup, c, s);
        let blk = &sup[160 + 128 * s - 32..];
        let isum = q4x8_isum(blk, c, &ab.qs);
        acc = (isum as f32).mul_add(d * ab.d, acc);
        summ = m.mul_add(ab.s, summ);
    }
    acc + summ
}

/// Bytes of one 8-row Q5x8 group block.
pub const Q5X8_BLOCK: usize = 176;

/// Repack a Q5_0 matrix of `n` rows × `k` columns (n % 8 == 0, k % 32 == 0)
/// into Q5x8. None when the shape or size does not qualify.
pub fn pack_q5x8(n: usize, k: usize, data: &[u8]) -> Option<Vec<u8>> {
    const BB: usize = 22;
    if !n.is_multiple_of(8) || !k.is_multiple_of(32) || data.len() != n * (k / 32) * BB {
        return None;
    }
    let nb = k / 32;
    let mut out = vec![0u8; n / 8 * nb * Q5X8_BLOCK];
    for g in 0..n / 8 {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * Q5X8_BLOCK..][..Q5X8_BLOCK];
            for c in 0..8 {
                let src = &data[((g * 8 + c) * nb + b) * BB..][..BB];
                dst[2 * c..2 * c + 2].copy_from_slice(&src[0..2]);
                let qh = u32::from_le_bytes([src[2], src[3], src[4], src[5]]);
                for t in 0..4 {
                    let mut byte = 0u8;
                    for h in 0..8 {
                        let e = if h < 4 { 4 * h + t } else { 16 + 4 * (h - 4) + t };
                        byte |= (((qh >> e) & 1) as u8) << h;
                    }
                    dst[16 + 4 * c + t] = byte;
                }
                for j in 0..4 {
                    dst[48 + 32 * j + 4 * c..][..4].copy_from_slice(&src[6 + 4 * j..6 + 4 * j + 4]);
                }
            }
        }
    }
    Some(out)
}

/// Unsigned 5-bit value (q + 16) of column `c`, element `e` of a Q5x8 block.
#[inline(always)]
fn q5x8_value(blk: &[u8], c: usize, e: usize) -> u8 {
    let (h, t) = if e < 16 { (e / 4, e % 4) } else { (4 + (e - 16) / 4, e % 4) };
    let hi = (blk[16 + 4 * c + t] >> h) & 1;
    let byte = blk[48 + 32 * (h % 4) + 4 * c + t];
    let nib = if e < 16 { byte & 0x0F } else { byte >> 4 };
    nib | (hi << 4)
}

/// Dequantize row `r` of a Q5x8-packed matrix with the row layout's
/// expression (`d · q + 0.0`), so the values are identical.
pub fn q5x8_row_f32(data: &[u8], k: usize, r: usize, out: &mut [f32]) {
    let nb = k / 32;
    let (g, c) = (r / 8, r % 8);
    for b in 0..nb {
        let blk = &data[(g * nb + b) * Q5X8_BLOCK..][..Q5X8_BLOCK];
        let d = crate::quant::f16_to_f32(u16::from_le_bytes([blk[2 * c], blk[2 * c + 1]]));
        let m = 0.0f32;
        for e in 0..32 {
            out[b * 32 + e] = d * (q5x8_value(blk, c, e) as i32 - 16) as f32 + m;
        }
    }
}

/// Scalar twin of the packed Q5x8 kernels for one (activation row, column):
/// per block, the exact integer Σ (u − 16)·a, then `acc = fma(isum, d·a.d,
/// acc)` in block order — the operations of [`dot_q8x8_scalar`] on the Q8_0
/// form of the block, so the same bits.
pub fn dot_q5x8_scalar(data: &[u8], k: usize, col: usize, a: &[crate::quant::ActBlock]) -> f32 {
    let nb = k / 32;
    let (g, c) = (col / 8, col % 8);
    let mut acc = 0f32;
    for (b, ab) in a.iter().enumerate().take(nb) {
        let blk = &data[(g * nb + b) * Q5X8_BLOCK..][..Q5X8_BLOCK];
        let d = crate::quant::f16_to_f32(u16::from_le_bytes([blk[2 * c], blk[2 * c + 1]]));
        let mut isum = 0i32;
        for e in 0..32 {
            isum += (q5x8_value(blk, c, e) as i32 - 16) * ab.qs[e] as i32;
        }
        acc = (isum as f32).mul_add(d * ab.d, acc);
    }
    acc
}

/// A Q5_0 matrix rewritten as Q8_0 blocks: each block's 32 values (−16…15)
/// as int8 beside the same f16 scale. Exact (both formats mean d·q); the
/// tests use it to show that Q5x8 gives the bits of this Q8_0 form run as
/// Q8x8. None when `data` is not whole Q5_0 blocks.
pub fn q5_0_to_q8_0(data: &[u8]) -> Option<Vec<u8>> {
    use crate::quant::formats::{Format, Q5_0};
    if !data.len().is_multiple_of(Q5_0::BYTES) {
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
