//! Row-wise operations. Each works on one row at a time, so batching cannot
//! change a result; reductions (dot, sum) use the fixed 8-lane order shared with
//! their SIMD twins, and `exp` is our own polynomial so the SIMD and scalar paths
//! agree bit for bit.

use crate::quant::dot::hsum8;
use crate::simd::{simd_level, SimdLevel};

pub(crate) mod exp_consts {
    pub const LO: f32 = -87.0;
    pub const HI: f32 = 88.0;
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub const LN2_HI: f32 = 0.693_359_4;
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    /// exp(r) ≈ 1 + r + r²·P(r) on |r| ≤ ln2/2 (Cephes expf coefficients).
    pub const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];
}

/// Scalar twin of the SIMD exp: clamp, split into 2^n · e^r, polynomial, scale.
#[inline]
pub fn exp_scalar(x: f32) -> f32 {
    use exp_consts::*;
    // max then min, not `clamp`: a NaN becomes LO here, as in the SIMD
    // kernel's `max_ps`/`min_ps`, where `clamp` would keep it
    #[allow(clippy::manual_clamp)]
    let x = x.max(LO).min(HI);
    let n = (x * LOG2E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = P[0];
    for &c in &P[1..] {
        p = p.mul_add(r, c);
    }
    let r2 = r * r;
    let e = p.mul_add(r2, r) + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

pub fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    let full = k / 8 * 8;
    let mut acc = [0f32; 8];
    for c in (0..full).step_by(8) {
        for l in 0..8 {
            acc[l] = a[c + l].mul_add(b[c + l], acc[l]);
        }
    }
    let mut r = hsum8(acc);
    for i in full..k {
        r = a[i].mul_add(b[i], r);
    }
    r
}

pub fn sum_f32_scalar(a: &[f32]) -> f32 {
    let full = a.len() / 8 * 8;
    let mut acc = [0f32; 8];
    for c in (0..full).step_by(8) {
        for l in 0..8 {
            acc[l] += a[c + l];
        }
    }
    let mut r = hsum8(acc);
    for v in &a[full..] {
        r += v;
    }
    r
}

/// Dot product (fixed order).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    match simd_level() {
        // SAFETY: AVX2/FMA checked by simd_level.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { crate::simd::avx2::dot_f32(a, b) },
        _ => dot_f32_scalar(a, b),
    }
}

/// Sum (fixed order).
#[inline]
pub fn sum_f32(a: &[f32]) -> f32 {
    match simd_level() {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { crate::simd::avx2::sum_f32(a) },
        _ => sum_f32_scalar(a),
    }
}

/// y += a · x (each element one fused multiply-add).
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    match simd_level() {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { crate::simd::avx2::axpy(y, a, x) },
        _ => axpy_scalar(y, a, x),
    }
}

/// Scalar twin of [`axpy`]: one fused multiply-add per element.
pub fn axpy_scalar(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = a.mul_add(*xi, *yi);
    }
}

/// Attention scores against strided rows: `out[j] = dot_f32(q, row_j) · scale`
/// with `row_j = rows[j·stride + offset ..][..q.len()]` (one key head per
/// cached position). The same bits as that loop of [`dot_f32`] calls, without
/// a call and a dispatch per position.
pub fn dot_rows(q: &[f32], rows: &[f32], stride: usize, offset: usize, scale: f32, out: &mut [f32]) {
    let k = q.len();
    if let Some(last) = out.len().checked_sub(1) {
        assert!(last * stride + offset + k <= rows.len(), "dot_rows: rows too short");
    }
    match simd_level() {
        // SAFETY: AVX2/FMA checked by simd_level; every row is in bounds (asserted above).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { crate::simd::avx2::dot_rows(q, rows, stride, offset, scale, out) },
        _ => dot_rows_scalar(q, rows, stride, offset, scale, out),
    }
}

/// Scalar twin of [`dot_rows`].
pub fn dot_rows_scalar(q: &[f32], rows: &[f32], stride: usize, offset: usize, scale: f32, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_f32_scalar(q, &rows[j * stride + offset..][..q.len()]) * scale;
    }
}

/// Weighted sum of strided rows into `y`: `y = fma(p[j], row_j, y)` for j in
/// order, with `row_j = rows[j·stride + offset ..][..y.len()]` (one value
/// head per cached position). The same bits as that loop of [`axpy`] calls;
/// `y` stays in registers across the rows.
pub fn axpy_rows(y: &mut [f32], p: &[f32], rows: &[f32], stride: usize, offset: usize) {
    if let Some(last) = p.len().checked_sub(1) {
        assert!(last * stride + offset + y.len() <= rows.len(), "axpy_rows: rows too short");
    }
    match simd_level() {
        // SAFETY: AVX2/FMA checked by simd_level; every row is in bounds (asserted above).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { crate::simd::avx2::axpy_rows(y, p, rows, stride, offset) },
        _ => axpy_rows_scalar(y, p, rows, stride, offset),
    }
}

/// Scalar twin of [`axpy_rows`].
pub fn axpy_rows_scalar(y: &mut [f32], p: &[f32], rows: &[f32], stride: usize, offset: usize) {
    let n = y.len();
    for (j, &pj) in p.iter().enumerate() {
        axpy_scalar(y, pj, &rows[j * stride + offset..][..n]);
    }
}

/// f32 → f16 bits with round-to-nearest-even (how K/V rows are kept in a
/// cache of f16 rows).
pub fn f32_to_f16(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len());
    match simd_level() {
        // SAFETY: AVX2/FMA/F16C checked by simd_level; equal lengths asserted.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { crate::simd::avx2::f32_to_f16(src, dst) },
        _ => f32_to_f16_scalar(src, dst),
    }
}

/// Scalar twin of [`f32_to_f16`].
pub fn f32_to_f16_scalar(src: &[f32], dst: &mut [u16]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(*s).to_bits();
    }
}

/// [`dot_rows`] over rows kept as f16: each value is widened to f32
/// (exactly) and then goes through [`dot_f32`]'s lanes and sums, so the
/// result is [`dot_rows`] on the widened rows, bit for bit.
pub fn dot_rows_f16(q: &[f32], rows: &[u16], stride: usize, offset: usize, scale: f32, out: &mut [f32]) {
    let k = q.len();
    if let Some(last) = out.len().checked_sub(1) {
        assert!(last * stride + offset + k <= rows.len(), "dot_rows_f16: rows too short");
    }
    match simd_level() {
        // SAFETY: AVX2/FMA/F16C checked by simd_level; a 64-wide query; every row is in bounds (asserted above).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 if k == 64 => unsafe { crate::simd::avx2::dot_rows_64(q, rows, stride, offset, scale, out) },
        SimdLevel::Avx2 => widened_rows(rows, stride, offset, k, out.len(), |j, row| out[j] = dot_f32(q, row) * scale),
        _ => dot_rows_f16_scalar(q, rows, stride, offset, scale, out),
    }
}

/// Scalar twin of [`dot_rows_f16`].
pub fn dot_rows_f16_scalar(q: &[f32], rows: &[u16], stride: usize, offset: usize, scale: f32, out: &mut [f32]) {
    widened_rows(rows, stride, offset, q.len(), out.len(), |j, row| out[j] = dot_f32_scalar(q, row) * scale);
}

/// [`axpy_rows`] over rows kept as f16 (each widened exactly first).
pub fn axpy_rows_f16(y: &mut [f32], p: &[f32], rows: &[u16], stride: usize, offset: usize) {
    let n = y.len();
    if let Some(last) = p.len().checked_sub(1) {
        assert!(last * stride + offset + n <= rows.len(), "axpy_rows_f16: rows too short");
    }
    match simd_level() {
        // SAFETY: AVX2/FMA/F16C checked by simd_level; a 64-wide `y`; every row is in bounds (asserted above).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 if n == 64 => unsafe { crate::simd::avx2::axpy_rows_64(y, p, rows, stride, offset) },
        SimdLevel::Avx2 => widened_rows(rows, stride, offset, n, p.len(), |j, row| axpy(y, p[j], row)),
        _ => axpy_rows_f16_scalar(y, p, rows, stride, offset),
    }
}

/// Scalar twin of [`axpy_rows_f16`].
pub fn axpy_rows_f16_scalar(y: &mut [f32], p: &[f32], rows: &[u16], stride: usize, offset: usize) {
    let n = y.len();
    widened_rows(rows, stride, offset, n, p.len(), |j, row| axpy_scalar(y, p[j], row));
}

/// [`dot_rows`] (f32 rows) or [`dot_rows_f16`] for two queries over the
/// same rows: `out[h]` gets exactly what `dot_rows(q[h], …, out[h])` gives.
/// Where the CPU has 512-bit registers (`simd::wide`) and heads are 64 wide,
/// both queries share each row's loads and fused multiply-adds, one query in
/// each half of a register; otherwise it is the two calls.
pub fn dot_rows2<T: RowValue>(q: [&[f32]; 2], rows: &[T], stride: usize, offset: usize, scale: f32, out: [&mut [f32]; 2]) {
    let k = q[0].len();
    assert!(q[1].len() == k && out[0].len() == out[1].len(), "dot_rows2: the two queries differ in shape");
    if let Some(last) = out[0].len().checked_sub(1) {
        assert!(last * stride + offset + k <= rows.len(), "dot_rows2: rows too short");
    }
    #[cfg(target_arch = "x86_64")]
    if k == 64 && crate::simd::wide() {
        // SAFETY: AVX2/FMA/F16C/AVX512F implied by `wide`; 64-wide queries of equal shape and rows in bounds (asserted above).
        return unsafe { T::dot_rows2_64(q, rows, stride, offset, scale, out) };
    }
    let [o0, o1] = out;
    T::dot_rows(q[0], rows, stride, offset, scale, o0);
    T::dot_rows(q[1], rows, stride, offset, scale, o1);
}

/// [`axpy_rows`] (f32 rows) or [`axpy_rows_f16`] for two outputs over the
/// same rows: `y[h]` gets exactly what `axpy_rows(y[h], p[h], …)` gives,
/// sharing each row's loads and fused multiply-adds as [`dot_rows2`] does.
pub fn axpy_rows2<T: RowValue>(y: [&mut [f32]; 2], p: [&[f32]; 2], rows: &[T], stride: usize, offset: usize) {
    let n = y[0].len();
    assert!(y[1].len() == n && p[0].len() == p[1].len(), "axpy_rows2: the two outputs differ in shape");
    if let Some(last) = p[0].len().checked_sub(1) {
        assert!(last * stride + offset + n <= rows.len(), "axpy_rows2: rows too short");
    }
    #[cfg(target_arch = "x86_64")]
    if n == 64 && crate::simd::wide() {
        // SAFETY: AVX2/FMA/F16C/AVX512F implied by `wide`; 64-wide outputs of equal shape and rows in bounds (asserted above).
        return unsafe { T::axpy_rows2_64(y, p, rows, stride, offset) };
    }
    let [y0, y1] = y;
    T::axpy_rows(y0, p[0], rows, stride, offset);
    T::axpy_rows(y1, p[1], rows, stride, offset);
}

/// A value type of cached K/V rows: f32, or f16 bits (widened exactly as
/// they are read).
pub trait RowValue: Copy + private::Sealed {
    /// [`dot_rows`] or [`dot_rows_f16`].
    fn dot_rows(q: &[f32], rows: &[Self], stride: usize, offset: usize, scale: f32, out: &mut [f32]);
    /// [`axpy_rows`] or [`axpy_rows_f16`].
    fn axpy_rows(y: &mut [f32], p: &[f32], rows: &[Self], stride: usize, offset: usize);
    /// `heads512::dot_rows2_64` over these rows.
    ///
    /// # Safety
    /// As `heads512::dot_rows2_64`.
    #[doc(hidden)]
    #[cfg(target_arch = "x86_64")]
    unsafe fn dot_rows2_64(q: [&[f32]; 2], rows: &[Self], stride: usize, offset: usize, scale: f32, out: [&mut [f32]; 2]);
    /// `heads512::axpy_rows2_64` over these rows.
    ///
    /// # Safety
    /// As `heads512::axpy_rows2_64`.
    #[doc(hidden)]
    #[cfg(target_arch = "x86_64")]
    unsafe fn axpy_rows2_64(y: [&mut [f32]; 2], p: [&[f32]; 2], rows: &[Self], stride: usize, offset: usize);
}

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
}

impl RowValue for f32 {
    fn dot_rows(q: &[f32], rows: &[f32], stride: usize, offset: usize, scale: f32, out: &mut [f32]) {
        dot_rows(q, rows, stride, offset, scale, out)
    }
    fn axpy_rows(y: &mut [f32], p: &[f32], rows: &[f32], stride: usize, offset: usize) {
        axpy_rows(y, p, rows, stride, offset)
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn dot_rows2_64(q: [&[f32]; 2], rows: &[f32], stride: usize, offset: usize, scale: f32, out: [&mut [f32]; 2]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { crate::simd::heads512::dot_rows2_64(q, rows, stride, offset, scale, out) }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn axpy_rows2_64(y: [&mut [f32]; 2], p: [&[f32]; 2], rows: &[f32], stride: usize, offset: usize) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { crate::simd::heads512::axpy_rows2_64(y, p, rows, stride, offset) }
    }
}

impl RowValue for u16 {
    fn dot_rows(q: &[f32], rows: &[u16], stride: usize, offset: usize, scale: f32, out: &mut [f32]) {
        dot_rows_f16(q, rows, stride, offset, scale, out)
    }
    fn axpy_rows(y: &mut [f32], p: &[f32], rows: &[u16], stride: usize, offset: usize) {
        axpy_rows_f16(y, p, rows, stride, offset)
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn dot_rows2_64(q: [&[f32]; 2], rows: &[u16], stride: usize, offset: usize, scale: f32, out: [&mut [f32]; 2]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { crate::simd::heads512::dot_rows2_64(q, rows, stride, offset, scale, out) }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn axpy_rows2_64(y: [&mut [f32]; 2], p: [&[f32]; 2], rows: &[u16], stride: usize, offset: usize) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { crate::simd::heads512::axpy_rows2_64(y, p, rows, stride, offset) }
    }
}

/// `f(j, row_j)` for rows `j < count`, each row `rows[j·stride + offset..][..k]`
/// widened exactly from f16 into one buffer (on the stack for heads up to
/// 256 wide).
fn widened_rows(rows: &[u16], stride: usize, offset: usize, k: usize, count: usize, mut f: impl FnMut(usize, &[f32])) {
    let mut stack = [0f32; 256];
    let mut heap = Vec::new();
    let buf = if k <= stack.len() {
        &mut stack[..k]
    } else {
        heap.resize(k, 0f32);
        &mut heap[..]
    };
    for j in 0..count {
        for (d, s) in buf.iter_mut().zip(&rows[j * stride + offset..][..k]) {
            *d = crate::quant::formats::f16_to_f32(*s);
        }
        f(j, buf);
    }
}

/// x[i] = exp(x[i] - sub)
#[inline]
pub fn exp_sub_inplace(x: &mut [f32], sub: f32) {
    match simd_level() {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { crate::simd::avx2::exp_sub_inplace(x, sub) },
        _ => x.iter_mut().for_each(|v| *v = exp_scalar(*v - sub)),
    }
}

/// g = silu(g) · u
#[inline]
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len());
    match simd_level() {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { crate::simd::avx2::silu_mul(g, u) },
        _ => g.iter_mut().zip(u).for_each(|(gi, ui)| *gi = *gi / (1.0 + exp_scalar(-*gi)) * ui),
    }
}

/// gelu's tanh approximation as a sigmoid: 0.5·(1 + tanh(u)) = σ(2u), with
/// 2u = x · (GELU_A + GELU_B · x²).
pub(crate) const GELU_A: f32 = 1.595_769; // 2·√(2/π)
pub(crate) const GELU_B: f32 = 0.071_354_82; // 2·√(2/π)·0.044715

/// Scalar twin of the SIMD `gelu_mul` for one element.
#[inline]
pub fn gelu_mul_scalar(g: f32, u: f32) -> f32 {
    let z = g * GELU_B.mul_add(g * g, GELU_A);
    g / (1.0 + exp_scalar(-z)) * u
}

/// g = gelu(g) · u (GeGLU), gelu with its tanh approximation.
#[inline]
pub fn gelu_mul(g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len());
    match simd_level() {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { crate::simd::avx2::gelu_mul(g, u) },
        _ => g.iter_mut().zip(u).for_each(|(gi, ui)| *gi = gelu_mul_scalar(*gi, *ui)),
    }
}

/// out = x / sqrt(mean(x²) + eps) · w
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot_f32(x, x);
    let scale = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, xi), wi) in out.iter_mut().zip(x).zip(w) {
        *o = (xi * scale) * wi;
    }
}

/// In-place softmax of one row; returns the row's max and `Σ exp(x − max)`
/// (for a log-sum-exp).
pub fn softmax_inplace(x: &mut [f32]) -> (f32, f32) {
    match simd_level() {
        // SAFETY: `wide` checked the 512-bit kernels' features.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 if crate::simd::wide() => unsafe { crate::simd::avx512::softmax_inplace(x) },
        // SAFETY: AVX2/FMA checked by simd_level.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => unsafe { crate::simd::avx2::softmax_inplace(x) },
        _ => softmax_scalar(x),
    }
}

/// Scalar twin of [`softmax_inplace`].
pub fn softmax_scalar(x: &mut [f32]) -> (f32, f32) {
    let mx = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    x.iter_mut().for_each(|v| *v = exp_scalar(*v - mx));
    let s = sum_f32_scalar(x);
    let inv = 1.0 / s;
    x.iter_mut().for_each(|v| *v *= inv);
    (mx, s)
}

/// cos/sin of RoPE angles for one position: `cs[i] = (cos θ_i, sin θ_i)`,
/// θ_i = pos · base^(-2i/dim) · 1/scale, computed in f64 then rounded.
pub fn rope_angles(pos: usize, dim: usize, base: f32, freq_scale: f32, cs: &mut [(f32, f32)]) {
    for (i, c) in cs.iter_mut().enumerate().take(dim / 2) {
        let inv = (base as f64).powf(-2.0 * i as f64 / dim as f64);
        let th = pos as f64 * inv * freq_scale as f64;
        *c = (th.cos() as f32, th.sin() as f32);
    }
}

/// Rotate adjacent pairs (x[2i], x[2i+1]) — llama.cpp's "normal" RoPE layout.
pub fn rope_pairs(x: &mut [f32], cs: &[(f32, f32)]) {
    for (i, &(c, s)) in cs.iter().enumerate() {
        let (a, b) = (x[2 * i], x[2 * i + 1]);
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
    }
}

/// Rotate halves (x[i], x[i + d/2]) — the "neox" layout (Qwen2, Gemma).
pub fn rope_halves(x: &mut [f32], cs: &[(f32, f32)]) {
    let h = cs.len();
    for (i, &(c, s)) in cs.iter().enumerate() {
        let (a, b) = (x[i], x[i + h]);
        x[i] = a * c - b * s;
        x[i + h] = a * s + b * c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, scale: f32) -> Vec<f32> {
        let mut s = 0x2545F4914F6CDD1Du64;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    #[test]
    fn exp_is_accurate() {
        for x in data(10000, 80.0) {
            let e = exp_scalar(x);
            let want = (x as f64).exp();
            if x > -86.0 {
                assert!(((e as f64 - want) / want).abs() < 3e-7, "exp({x}) = {e}, want {want}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_ops_match_scalar_twins() {
        if simd_level() != SimdLevel::Avx2 {
            return;
        }
        for n in [1, 7, 8, 31, 64, 577] {
            let a = data(n, 3.0);
            let b = data(n + 1, 2.0)[1..].to_vec();
            unsafe {
                assert_eq!(crate::simd::avx2::dot_f32(&a, &b).to_bits(), dot_f32_scalar(&a, &b).to_bits());
                assert_eq!(crate::simd::avx2::sum_f32(&a).to_bits(), sum_f32_scalar(&a).to_bits());
                let mut x1 = a.clone();
                crate::simd::avx2::exp_sub_inplace(&mut x1, 0.5);
                let x2: Vec<f32> = a.iter().map(|v| exp_scalar(v - 0.5)).collect();
                assert!(x1.iter().zip(&x2).all(|(p, q)| p.to_bits() == q.to_bits()));
                let mut g1 = a.clone();
                crate::simd::avx2::silu_mul(&mut g1, &b);
                let g2: Vec<f32> = a.iter().zip(&b).map(|(g, u)| g / (1.0 + exp_scalar(-g)) * u).collect();
                assert!(g1.iter().zip(&g2).all(|(p, q)| p.to_bits() == q.to_bits()));
                let mut g1 = a.clone();
                crate::simd::avx2::gelu_mul(&mut g1, &b);
                let g2: Vec<f32> = a.iter().zip(&b).map(|(g, u)| gelu_mul_scalar(*g, *u)).collect();
                assert!(g1.iter().zip(&g2).all(|(p, q)| p.to_bits() == q.to_bits()));
                let mut y1 = b.clone();
                crate::simd::avx2::axpy(&mut y1, 0.3, &a);
                let y2: Vec<f32> = b.iter().zip(&a).map(|(y, x)| 0.3f32.mul_add(*x, *y)).collect();
                assert!(y1.iter().zip(&y2).all(|(p, q)| p.to_bits() == q.to_bits()));
            }
        }
    }

    /// The softmax kernels (8 lanes; 16 where the 512-bit kernels run) give
    /// the scalar twin's bits, its max and its sum, for every tail length and
    /// with masked (−∞) and NaN entries.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn softmax_kernels_match_scalar_twin() {
        if simd_level() != SimdLevel::Avx2 {
            return;
        }
        for n in [1, 7, 8, 9, 15, 16, 17, 23, 24, 31, 33, 64, 577, 2400] {
            for case in 0..3 {
                let mut a = data(n, 12.0);
                if case >= 1 {
                    for v in a.iter_mut().step_by(5) {
                        *v = f32::NEG_INFINITY;
                    }
                }
                if case == 2 {
                    a[n / 2] = f32::NAN;
                }
                let mut want = a.clone();
                let (m0, s0) = softmax_scalar(&mut want);
                let same = |got: &[f32], m: f32, s: f32| {
                    m.to_bits() == m0.to_bits()
                        && s.to_bits() == s0.to_bits()
                        && got.iter().zip(&want).all(|(p, q)| p.to_bits() == q.to_bits())
                };
                let mut got = a.clone();
                let (m, s) = unsafe { crate::simd::avx2::softmax_inplace(&mut got) };
                assert!(same(&got, m, s), "avx2 softmax n {n} case {case}");
                if crate::simd::wide_available() {
                    let mut got = a.clone();
                    let (m, s) = unsafe { crate::simd::avx512::softmax_inplace(&mut got) };
                    assert!(same(&got, m, s), "avx512 softmax n {n} case {case}");
                }
            }
        }
    }

    /// The strided attention ops give the bits of their per-row loops, on
    /// the SIMD path (64-wide heads in registers, other widths per row) and
    /// the scalar twins.
    #[test]
    fn row_ops_equal_their_per_row_loops() {
        for (hd, n) in [8, 40, 64, 256].into_iter().flat_map(|hd| [1, 3, 4, 5, 8, 37].map(|n| (hd, n))) {
            let (stride, offset) = (3 * hd + 8, hd + 8);
            let rows = data((n - 1) * stride + offset + hd, 2.0);
            let q = data(hd + 3, 1.5)[3..].to_vec();
            let p = data(n + 5, 1.0)[5..].to_vec();
            let scale = 0.125;
            let want: Vec<f32> = (0..n).map(|j| dot_f32_scalar(&q, &rows[j * stride + offset..][..hd]) * scale).collect();
            let mut got = vec![0f32; n];
            dot_rows(&q, &rows, stride, offset, scale, &mut got);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "dot_rows hd {hd} n {n}");
            dot_rows_scalar(&q, &rows, stride, offset, scale, &mut got);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "dot_rows_scalar hd {hd}");

            let y0 = data(hd + 9, 0.5)[9..].to_vec();
            let mut want = y0.clone();
            for (j, &pj) in p.iter().enumerate() {
                for (yi, xi) in want.iter_mut().zip(&rows[j * stride + offset..][..hd]) {
                    *yi = pj.mul_add(*xi, *yi);
                }
            }
            let mut got = y0.clone();
            axpy_rows(&mut got, &p, &rows, stride, offset);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "axpy_rows hd {hd} n {n}");
            let mut got = y0.clone();
            axpy_rows_scalar(&mut got, &p, &rows, stride, offset);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "axpy_rows_scalar hd {hd}");
        }
    }

    /// Rows kept as f16 give the bits of the f32 ops on the widened rows,
    /// on the SIMD path and the scalar twins; rounding to f16 matches the
    /// `half` crate's round-to-nearest-even for every finite f32 tested.
    #[test]
    fn f16_row_ops_equal_f32_ops_on_widened_rows() {
        let mut specials =
            vec![0.0f32, -0.0, 1.0, 65504.0, 65520.0, 1e9, -1e9, 6.1e-5, 5.96e-8, 2.98e-8, 1e-10, f32::INFINITY, f32::NEG_INFINITY];
        specials.extend(data(1000, 70000.0));
        specials.extend(data(1000, 1e-4));
        for n in [specials.len(), 7, 9] {
            let src = &specials[..n];
            let mut a = vec![0u16; n];
            let mut b = vec![0u16; n];
            f32_to_f16(src, &mut a);
            f32_to_f16_scalar(src, &mut b);
            assert_eq!(a, b, "f32_to_f16 n {n}");
        }
        for (hd, n) in [8, 40, 64, 256].into_iter().flat_map(|hd| [1, 3, 4, 5, 8, 37].map(|n| (hd, n))) {
            let (stride, offset) = (3 * hd + 8, hd + 8);
            let wide = data((n - 1) * stride + offset + hd, 2.0);
            let mut rows = vec![0u16; wide.len()];
            f32_to_f16(&wide, &mut rows);
            let widened: Vec<f32> = rows.iter().map(|&h| crate::quant::formats::f16_to_f32(h)).collect();
            let q = data(hd + 3, 1.5)[3..].to_vec();
            let p = data(n + 5, 1.0)[5..].to_vec();
            let mut want = vec![0f32; n];
            dot_rows_scalar(&q, &widened, stride, offset, 0.125, &mut want);
            for f in [dot_rows_f16, dot_rows_f16_scalar] {
                let mut got = vec![0f32; n];
                f(&q, &rows, stride, offset, 0.125, &mut got);
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "dot_rows_f16 hd {hd} n {n}");
            }
            let y0 = data(hd + 9, 0.5)[9..].to_vec();
            let mut want = y0.clone();
            axpy_rows_scalar(&mut want, &p, &widened, stride, offset);
            for f in [axpy_rows_f16, axpy_rows_f16_scalar] {
                let mut got = y0.clone();
                f(&mut got, &p, &rows, stride, offset);
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "axpy_rows_f16 hd {hd} n {n}");
            }
        }
    }

    /// The paired row ops give each query or output the bits of the single
    /// ops' scalar twins, over f32 and f16 rows, on the 512-bit kernels
    /// (where the CPU has them) and on the fallback.
    #[test]
    fn paired_row_ops_equal_single_ones() {
        for (hd, n) in [8, 40, 64].into_iter().flat_map(|hd| [0, 1, 3, 4, 5, 8, 37].map(|n| (hd, n))) {
            let (stride, offset) = (3 * hd + 8, hd + 8);
            let wide = data(n.max(1) * stride + offset + hd, 2.0);
            let mut half = vec![0u16; wide.len()];
            f32_to_f16(&wide, &mut half);
            let widened: Vec<f32> = half.iter().map(|&h| crate::quant::formats::f16_to_f32(h)).collect();
            let q = [data(hd + 3, 1.5)[3..].to_vec(), data(hd + 7, 1.25)[7..].to_vec()];
            let p = [data(n + 5, 1.0)[5..].to_vec(), data(n + 11, 1.0)[11..].to_vec()];
            let y0 = [data(hd + 9, 0.5)[9..].to_vec(), data(hd + 13, 0.5)[13..].to_vec()];
            for (name, f32_rows) in [("f32", &wide), ("f16", &widened)] {
                let want: Vec<Vec<f32>> = (0..2)
                    .map(|h| {
                        let mut o = vec![0f32; n];
                        dot_rows_scalar(&q[h], f32_rows, stride, offset, 0.125, &mut o);
                        o
                    })
                    .collect();
                let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                if name == "f32" {
                    dot_rows2([&q[0], &q[1]], &wide, stride, offset, 0.125, [&mut a, &mut b]);
                } else {
                    dot_rows2([&q[0], &q[1]], &half, stride, offset, 0.125, [&mut a, &mut b]);
                }
                for (h, got) in [a, b].iter().enumerate() {
                    assert!(got.iter().zip(&want[h]).all(|(x, y)| x.to_bits() == y.to_bits()), "dot_rows2 {name} hd {hd} n {n} query {h}");
                }
                let want: Vec<Vec<f32>> = (0..2)
                    .map(|h| {
                        let mut y = y0[h].clone();
                        axpy_rows_scalar(&mut y, &p[h], f32_rows, stride, offset);
                        y
                    })
                    .collect();
                let (mut a, mut b) = (y0[0].clone(), y0[1].clone());
                if name == "f32" {
                    axpy_rows2([&mut a, &mut b], [&p[0], &p[1]], &wide, stride, offset);
                } else {
                    axpy_rows2([&mut a, &mut b], [&p[0], &p[1]], &half, stride, offset);
                }
                for (h, got) in [a, b].iter().enumerate() {
                    assert!(
                        got.iter().zip(&want[h]).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "axpy_rows2 {name} hd {hd} n {n} output {h}"
                    );
                }
            }
        }
    }
}
