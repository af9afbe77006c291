//! Scalar decoding of every supported block format.
//!
//! Each quantized format is described by [`Format`]: how to decode sub-block `s`
//! (32 consecutive elements) of a block into exact integers, and which float
//! scales apply. Dequantization, the scalar dot twin and the SIMD kernels are all
//! written against this one description.

use tandem_gguf::GgmlType;

/// f16 → f32 bit conversion, usable in const context (exact, handles subnormals, inf, NaN).
const fn f16_bits_to_f32_bits(h: u16) -> u32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    if exp == 0 {
        if man == 0 {
            return sign;
        }
        // subnormal: value = man · 2^-24; normalise around its highest set bit p.
        let p = 31 - man.leading_zeros();
        sign | ((p + 103) << 23) | ((man << (23 - p)) & 0x7f_ffff)
    } else if exp == 31 {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 112) << 23) | (man << 13)
    }
}

const fn build_f16_table() -> [f32; 65536] {
    let mut t = [0f32; 65536];
    let mut i = 0;
    while i < 65536 {
        t[i] = f32::from_bits(f16_bits_to_f32_bits(i as u16));
        i += 1;
    }
    t
}

/// All 65536 f16 values as f32, built at compile time: one load per conversion,
/// identical on the scalar and SIMD paths.
static F16_TABLE: [f32; 65536] = build_f16_table();

/// f16 bits → f32 (exact).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    F16_TABLE[bits as usize]
}

#[inline(always)]
pub(crate) fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Scales that apply to one 32-element sub-block.
/// value[i] = d · h[i / 16] · q[i] + m   (h is all ones except for Q6_K).
#[derive(Debug, Clone, Copy)]
pub struct SubScales {
    pub d: f32,
    pub m: f32,
    pub h: [i32; 2],
}

/// A quantized block format, decoded 32 elements at a time.
pub trait Format: 'static + Send + Sync {
    const TY: GgmlType;
    const BYTES: usize;
    /// 32-element sub-blocks per block.
    const SUBS: usize;
    /// Values are signed (else unsigned, 0..=63).
    const SIGNED: bool;
    /// Has an additive min term.
    const HAS_MIN: bool;
    /// Has per-16-element integer scales (`SubScales::h`).
    const HALF_SCALES: bool;
    /// Exact integer values of sub-block `s` of block `b`.
    fn values(b: &[u8], s: usize, out: &mut [i8; 32]);
    fn scales(b: &[u8], s: usize) -> SubScales;
}

pub struct Q4_0;
pub struct Q4_1;
pub struct Q5_0;
pub struct Q5_1;
pub struct Q8_0;
pub struct Q4K;
pub struct Q5K;
pub struct Q6K;

const ONE: [i32; 2] = [1, 1];

impl Format for Q4_0 {
    const TY: GgmlType = GgmlType::Q4_0;
    const BYTES: usize = 18;
    const SUBS: usize = 1;
    const SIGNED: bool = true;
    const HAS_MIN: bool = false;
    const HALF_SCALES: bool = false;
    fn values(b: &[u8], _s: usize, out: &mut [i8; 32]) {
        for j in 0..16 {
            out[j] = (b[2 + j] & 0x0F) as i8 - 8;
            out[j + 16] = (b[2 + j] >> 4) as i8 - 8;
        }
    }
    fn scales(b: &[u8], _s: usize) -> SubScales {
        SubScales { d: rd_f16(b, 0), m: 0.0, h: ONE }
    }
}

impl Format for Q4_1 {
    const TY: GgmlType = GgmlType::Q4_1;
    const BYTES: usize = 20;
    const SUBS: usize = 1;
    const SIGNED: bool = false;
    const HAS_MIN: bool = true;
    const HALF_SCALES: bool = false;
    fn values(b: &[u8], _s: usize, out: &mut [i8; 32]) {
        for j in 0..16 {
            out[j] = (b[4 + j] & 0x0F) as i8;
            out[j + 16] = (b[4 + j] >> 4) as i8;
        }
    }
    fn scales(b: &[u8], _s: usize) -> SubScales {
        SubScales { d: rd_f16(b, 0), m: rd_f16(b, 2), h: ONE }
    }
}

impl Format for Q5_0 {
    const TY: GgmlType = GgmlType::Q5_0;
    const BYTES: usize = 22;
    const SUBS: usize = 1;
    const SIGNED: bool = true;
    const HAS_MIN: bool = false;
    const HALF_SCALES: bool = false;
    fn values(b: &[u8], _s: usize, out: &mut [i8; 32]) {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) as u8;
            let h1 = ((qh >> (j + 16)) & 1) as u8;
            out[j] = ((b[6 + j] & 0x0F) | (h0 << 4)) as i8 - 16;
            out[j + 16] = ((b[6 + j] >> 4) | (h1 << 4)) as i8 - 16;
        }
    }
    fn scales(b: &[u8], _s: usize) -> SubScales {
        SubScales { d: rd_f16(b, 0), m: 0.0, h: ONE }
    }
}

impl Format for Q5_1 {
    const TY: GgmlType = GgmlType::Q5_1;
    const BYTES: usize = 24;
    const SUBS: usize = 1;
    const SIGNED: bool = false;
    const HAS_MIN: bool = true;
    const HALF_SCALES: bool = false;
    fn values(b: &[u8], _s: usize, out: &mut [i8; 32]) {
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) as u8;
            let h1 = ((qh >> (j + 16)) & 1) as u8;
            out[j] = ((b[8 + j] & 0x0F) | (h0 << 4)) as i8;
            out[j + 16] = ((b[8 + j] >> 4) | (h1 << 4)) as i8;
        }
    }
    fn scales(b: &[u8], _s: usize) -> SubScales {
        SubScales { d: rd_f16(b, 0), m: rd_f16(b, 2), h: ONE }
    }
}

impl Format for Q8_0 {
    const TY: GgmlType = GgmlType::Q8_0;
    const BYTES: usize = 34;
    const SUBS: usize = 1;
    const SIGNED: bool = true;
    const HAS_MIN: bool = false;
    const HALF_SCALES: bool = false;
    fn values(b: &[u8], _s: usize, out: &mut [i8; 32]) {
        for j in 0..32 {
            out[j] = b[2 + j] as i8;
        }
    }
    fn scales(b: &[u8], _s: usize) -> SubScales {
        SubScales { d: rd_f16(b, 0), m: 0.0, h: ONE }
    }
}

/// 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block (`q` = the 12 scale bytes).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

#[inline(always)]
fn k4_scales(b: &[u8], s: usize) -> SubScales {
    let (sc, m) = scale_min_k4(s, &b[4..16]);
    SubScales { d: rd_f16(b, 0) * sc as f32, m: -(rd_f16(b, 2) * m as f32), h: ONE }
}

impl Format for Q4K {
    const TY: GgmlType = GgmlType::Q4K;
    const BYTES: usize = 144;
    const SUBS: usize = 8;
    const SIGNED: bool = false;
    const HAS_MIN: bool = true;
    const HALF_SCALES: bool = false;
    fn values(b: &[u8], s: usize, out: &mut [i8; 32]) {
        let qs = &b[16 + 32 * (s / 2)..16 + 32 * (s / 2) + 32];
        let shift = 4 * (s % 2);
        for l in 0..32 {
            out[l] = ((qs[l] >> shift) & 0x0F) as i8;
        }
    }
    fn scales(b: &[u8], s: usize) -> SubScales {
        k4_scales(b, s)
    }
}

impl Format for Q5K {
    const TY: GgmlType = GgmlType::Q5K;
    const BYTES: usize = 176;
    const SUBS: usize = 8;
    const SIGNED: bool = false;
    const HAS_MIN: bool = true;
    const HALF_SCALES: bool = false;
    fn values(b: &[u8], s: usize, out: &mut [i8; 32]) {
        let qh = &b[16..48];
        let ql = &b[48 + 32 * (s / 2)..48 + 32 * (s / 2) + 32];
        let shift = 4 * (s % 2);
        for l in 0..32 {
            out[l] = (((ql[l] >> shift) & 0x0F) | (((qh[l] >> s) & 1) << 4)) as i8;
        }
    }
    fn scales(b: &[u8], s: usize) -> SubScales {
        k4_scales(b, s)
    }
}

impl Format for Q6K {
    const TY: GgmlType = GgmlType::Q6K;
    const BYTES: usize = 210;
    const SUBS: usize = 8;
    const SIGNED: bool = true;
    const HAS_MIN: bool = false;
    const HALF_SCALES: bool = true;
    fn values(b: &[u8], s: usize, out: &mut [i8; 32]) {
        let (n, t) = (s / 4, s % 4);
        let ql = &b[64 * n + 32 * (t % 2)..];
        let qh = &b[128 + 32 * n..];
        let lshift = 4 * (t / 2);
        let hshift = 2 * t;
        for l in 0..32 {
            let lo = (ql[l] >> lshift) & 0x0F;
            let hi = (qh[l] >> hshift) & 3;
            out[l] = (lo | (hi << 4)) as i8 - 32;
        }
    }
    fn scales(b: &[u8], s: usize) -> SubScales {
        let (n, t) = (s / 4, s % 4);
        let sc = &b[192 + 8 * n + 2 * t..];
        SubScales { d: rd_f16(b, 208), m: 0.0, h: [sc[0] as i8 as i32, sc[1] as i8 as i32] }
    }
}

fn dequant_fmt<F: Format>(src: &[u8], out: &mut [f32]) {
    let mut q = [0i8; 32];
    for (bi, blk) in src.chunks_exact(F::BYTES).enumerate() {
        for s in 0..F::SUBS {
            F::values(blk, s, &mut q);
            let sc = F::scales(blk, s);
            let o = &mut out[(bi * F::SUBS + s) * 32..][..32];
            for i in 0..32 {
                let d = if F::HALF_SCALES { sc.d * sc.h[i / 16] as f32 } else { sc.d };
                o[i] = d * q[i] as f32 + sc.m;
            }
        }
    }
}

/// Dequantize `n = out.len()` elements of type `ty` from `src`.
/// `src` must hold exactly `ty.row_bytes(n)` bytes.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert_eq!(Some(src.len() as u64), ty.row_bytes(n as u64), "dequantize_row: size mismatch");
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        // integer tensors convert value by value (index maps are small)
        GgmlType::I32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
            }
        }
        GgmlType::I64 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(8)) {
                *o = i64::from_le_bytes(c.try_into().unwrap()) as f32;
            }
        }
        GgmlType::Q4_0 => dequant_fmt::<Q4_0>(src, out),
        GgmlType::Q4_1 => dequant_fmt::<Q4_1>(src, out),
        GgmlType::Q5_0 => dequant_fmt::<Q5_0>(src, out),
        GgmlType::Q5_1 => dequant_fmt::<Q5_1>(src, out),
        GgmlType::Q8_0 => dequant_fmt::<Q8_0>(src, out),
        GgmlType::Q4K => dequant_fmt::<Q4K>(src, out),
        GgmlType::Q5K => dequant_fmt::<Q5K>(src, out),
        GgmlType::Q6K => dequant_fmt::<Q6K>(src, out),
        GgmlType::Q8_1 => {
            // d (f16), s (f16), 32 × i8
            for (bi, blk) in src.chunks_exact(36).enumerate() {
                let d = rd_f16(blk, 0);
                for i in 0..32 {
                    out[bi * 32 + i] = d * (blk[4 + i] as i8) as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_table_matches_half_crate() {
        for i in 0..=u16::MAX {
            let a = f16_to_f32(i);
            let b = half::f16::from_bits(i).to_f32();
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{i:#x}: {a} vs {b}");
        }
    }
}
