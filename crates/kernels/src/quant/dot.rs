//! Scalar twins of the SIMD dot kernels.
//!
//! These reproduce the SIMD lane structure exactly: the integer product of a
//! 32-element sub-block is split into 8 lanes of 4 consecutive elements (as
//! `vpmaddubsw` + `vpmaddwd` produce), each lane is accumulated with a fused
//! multiply-add, and the 8 lanes are summed in the fixed tree of [`hsum8`].
//! Integer sums are exact, so the scalar and SIMD paths give the same bits.

use super::formats::Format;
use super::ActBlock;

/// Horizontal sum of 8 lanes in the order every kernel uses:
/// (l0+l4, l1+l5, l2+l6, l3+l7) → (t0+t2, t1+t3) → u0+u1.
#[inline(always)]
pub fn hsum8(a: [f32; 8]) -> f32 {
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let u = [t[0] + t[2], t[1] + t[3]];
    u[0] + u[1]
}

/// lane k = Σ_{i=4k}^{4k+3} w[i]·a[i]
#[inline(always)]
fn lanes(w: &[i8; 32], a: &[i8; 32]) -> [i32; 8] {
    let mut l = [0i32; 8];
    for (k, lk) in l.iter_mut().enumerate() {
        let mut s = 0i32;
        for i in 4 * k..4 * k + 4 {
            s += w[i] as i32 * a[i] as i32;
        }
        *lk = s;
    }
    l
}

/// Dot product of one quantized weight row with one quantized activation row.
pub fn dot_q_scalar<F: Format>(w: &[u8], a: &[ActBlock]) -> f32 {
    let nb = a.len() / F::SUBS;
    debug_assert_eq!(w.len(), nb * F::BYTES);
    let mut acc = [0f32; 8];
    let mut summ = 0f32;
    let mut q = [0i8; 32];
    for b in 0..nb {
        let blk = &w[b * F::BYTES..(b + 1) * F::BYTES];
        for s in 0..F::SUBS {
            F::values(blk, s, &mut q);
            let sc = F::scales(blk, s);
            let ab = &a[b * F::SUBS + s];
            let mut l = lanes(&q, &ab.qs);
            if F::HALF_SCALES {
                for (k, v) in l.iter_mut().enumerate() {
                    *v *= sc.h[k / 4];
                }
            }
            let dd = sc.d * ab.d;
            for k in 0..8 {
                acc[k] = dd.mul_add(l[k] as f32, acc[k]);
            }
            if F::HAS_MIN {
                summ += sc.m * ab.s;
            }
        }
    }
    hsum8(acc) + summ
}

/// How a float weight row is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatKind {
    F32,
    F16,
    BF16,
}

impl FloatKind {
    #[inline(always)]
    pub(crate) fn load(self, w: &[u8], i: usize) -> f32 {
        match self {
            FloatKind::F32 => f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]),
            FloatKind::F16 => super::f16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])),
            FloatKind::BF16 => f32::from_bits((u16::from_le_bytes([w[2 * i], w[2 * i + 1]]) as u32) << 16),
        }
    }
}

/// Dot product of a float weight row with an f32 activation row: 8 FMA lanes over
/// chunks of 8, the fixed [`hsum8`], then any tail added in order.
pub fn dot_f_scalar(kind: FloatKind, w: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    let mut acc = [0f32; 8];
    let full = k / 8 * 8;
    for c in (0..full).step_by(8) {
        for l in 0..8 {
            acc[l] = kind.load(w, c + l).mul_add(x[c + l], acc[l]);
        }
    }
    let mut r = hsum8(acc);
    for i in full..k {
        r = kind.load(w, i).mul_add(x[i], r);
    }
    r
}
