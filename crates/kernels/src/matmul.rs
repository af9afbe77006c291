//! Batch-invariant matrix products: Y[M×N] = X[M×K] · Wᵀ, W stored as N rows of K.
//!
//! Work is split between threads over output columns N (never over K), and every
//! (row, column) output is one call of a tile kernel whose reduction order is
//! fixed by the format alone. So row i of an M-row product has the same bits as
//! the same row computed alone, with any number of threads.

use std::cell::RefCell;
use std::ops::Range;

use tandem_gguf::GgmlType;

use crate::pool::{split_range, DisjointSlice, ThreadPool};
use crate::quant::dot::{dot_f_scalar, dot_q_scalar, FloatKind};
use crate::quant::formats::{Format, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0};
use crate::quant::{dequantize_row, quantize_act_row, ActBlock};
use crate::simd::{simd_level, SimdLevel};

#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error("{name}: type {ty} cannot be used as a matrix")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("{name}: {k} columns is not a multiple of the {ty} block size")]
    BadColumns { name: String, k: usize, ty: GgmlType },
    #[error("{name}: {got} bytes, expected {want} for {n}×{k} {ty}")]
    BadSize { name: String, got: usize, want: usize, n: usize, k: usize, ty: GgmlType },
}

/// A borrowed weight matrix: `n` rows (output features) of `k` elements.
#[derive(Debug, Clone, Copy)]
pub struct Weight<'a> {
    pub ty: GgmlType,
    pub n: usize,
    pub k: usize,
    data: &'a [u8],
    row_bytes: usize,
    layout: Layout,
}

/// How a weight's bytes are arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// GGUF's own layout: N rows of K elements in the type's blocks.
    Rows,
    /// Q4_0/Q4_1 repacked by [`crate::pack::pack_q4x8`].
    Q4x8,
    /// Q8_0 repacked by [`crate::pack::pack_q8x8`].
    Q8x8,
    /// Q6_K repacked by [`crate::pack::pack_q6x8`].
    Q6x8,
    /// Q5_0 repacked by [`crate::pack::pack_q5x8`].
    Q5x8,
    /// Q4_K repacked by [`crate::pack::pack_q4kx8`].
    Q4Kx8,
}

impl<'a> Weight<'a> {
    /// Validate shape and size; quantized matrices need `k % 32 == 0` (our
    /// activation blocks are 32 wide) on top of the format's own block size.
    pub fn new(name: &str, ty: GgmlType, n: usize, k: usize, data: &'a [u8]) -> Result<Self, WeightError> {
        if matches!(ty, GgmlType::Q8_1 | GgmlType::I32 | GgmlType::I64) {
            return Err(WeightError::UnsupportedType { name: name.into(), ty });
        }
        let rb = ty.row_bytes(k as u64).filter(|_| is_float(ty) || k.is_multiple_of(32)).ok_or_else(|| WeightError::BadColumns {
            name: name.into(),
            k,
            ty,
        })? as usize;
        if data.len() != rb * n {
            return Err(WeightError::BadSize { name: name.into(), got: data.len(), want: rb * n, n, k, ty });
        }
        Ok(Weight { ty, n, k, data, row_bytes: rb, layout: Layout::Rows })
    }

    /// A Q4_0/Q4_1 matrix repacked by [`crate::pack::pack_q4x8`].
    pub fn packed_q4x8(name: &str, ty: GgmlType, n: usize, k: usize, data: &'a [u8]) -> Result<Self, WeightError> {
        if !matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1) {
            return Err(WeightError::UnsupportedType { name: name.into(), ty });
        }
        if !k.is_multiple_of(32) || !n.is_multiple_of(8) {
            return Err(WeightError::BadColumns { name: name.into(), k, ty });
        }
        let want = n / 8 * (k / 32) * crate::pack::Q4X8_BLOCK;
        if data.len() != want {
            return Err(WeightError::BadSize { name: name.into(), got: data.len(), want, n, k, ty });
        }
        Ok(Weight { ty, n, k, data, row_bytes: 0, layout: Layout::Q4x8 })
    }

    /// A Q8_0 matrix repacked by [`crate::pack::pack_q8x8`].
    pub fn packed_q8x8(name: &str, n: usize, k: usize, data: &'a [u8]) -> Result<Self, WeightError> {
        let ty = GgmlType::Q8_0;
        if !k.is_multiple_of(32) || !n.is_multiple_of(8) {
            return Err(WeightError::BadColumns { name: name.into(), k, ty });
        }
        let want = n / 8 * (k / 32) * crate::pack::Q8X8_BLOCK;
        if data.len() != want {
            return Err(WeightError::BadSize { name: name.into(), got: data.len(), want, n, k, ty });
        }
        Ok(Weight { ty, n, k, data, row_bytes: 0, layout: Layout::Q8x8 })
    }

    /// A Q5_0 matrix repacked by [`crate::pack::pack_q5x8`].
    pub fn packed_q5x8(name: &str, n: usize, k: usize, data: &'a [u8]) -> Result<Self, WeightError> {
        let ty = GgmlType::Q5_0;
        if !k.is_multiple_of(32) || !n.is_multiple_of(8) {
            return Err(WeightError::BadColumns { name: name.into(), k, ty });
        }
        let want = n / 8 * (k / 32) * crate::pack::Q5X8_BLOCK;
        if data.len() != want {
            return Err(WeightError::BadSize { name: name.into(), got: data.len(), want, n, k, ty });
        }
        Ok(Weight { ty, n, k, data, row_bytes: 0, layout: Layout::Q5x8 })
    }

    /// A Q4_K matrix repacked by [`crate::pack::pack_q4kx8`].
    pub fn packed_q4kx8(name: &str, n: usize, k: usize, data: &'a [u8]) -> Result<Self, WeightError> {
        let ty = GgmlType::Q4K;
        if !k.is_multiple_of(256) || !n.is_multiple_of(8) {
            return Err(WeightError::BadColumns { name: name.into(), k, ty });
        }
        let want = n / 8 * (k / 256) * crate::pack::Q4KX8_SUPER;
        if data.len() != want {
            return Err(WeightError::BadSize { name: name.into(), got: data.len(), want, n, k, ty });
        }
        Ok(Weight { ty, n, k, data, row_bytes: 0, layout: Layout::Q4Kx8 })
    }

    /// A Q6_K matrix repacked by [`crate::pack::pack_q6x8`].
    pub fn packed_q6x8(name: &str, n: usize, k: usize, data: &'a [u8]) -> Result<Self, WeightError> {
        let ty = GgmlType::Q6K;
        if !k.is_multiple_of(256) || !n.is_multiple_of(8) {
            return Err(WeightError::BadColumns { name: name.into(), k, ty });
        }
        let want = n / 8 * (k / 32) * crate::pack::Q6X8_BLOCK;
        if data.len() != want {
            return Err(WeightError::BadSize { name: name.into(), got: data.len(), want, n, k, ty });
        }
        Ok(Weight { ty, n, k, data, row_bytes: 0, layout: Layout::Q6x8 })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Raw bytes of row `i` (row layout only).
    pub fn row(&self, i: usize) -> &'a [u8] {
        debug_assert_eq!(self.layout, Layout::Rows);
        &self.data[i * self.row_bytes..(i + 1) * self.row_bytes]
    }

    /// Dequantize row `i` into `out` (len k).
    pub fn row_f32(&self, i: usize, out: &mut [f32]) {
        match self.layout {
            Layout::Rows => dequantize_row(self.ty, self.row(i), out),
            Layout::Q4x8 => crate::pack::q4x8_row_f32(self.data, self.k, i, out),
            Layout::Q8x8 => crate::pack::q8x8_row_f32(self.data, self.k, i, out),
            Layout::Q6x8 => crate::pack::q6x8_row_f32(self.data, self.k, i, out),
            Layout::Q5x8 => crate::pack::q5x8_row_f32(self.data, self.k, i, out),
            Layout::Q4Kx8 => crate::pack::q4kx8_row_f32(self.data, self.k, i, out),
        }
    }
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

fn float_kind(ty: GgmlType) -> FloatKind {
    match ty {
        GgmlType::F32 => FloatKind::F32,
        GgmlType::F16 => FloatKind::F16,
        _ => FloatKind::BF16,
    }
}

/// One output of a region, `n` columns per row; each thread writes its own
/// columns.
#[derive(Clone, Copy)]
struct Out<'a> {
    cells: DisjointSlice<'a>,
    n: usize,
}

impl Out<'_> {
    /// # Safety
    /// Cell (`m`, `col`) lies in the output, and no other thread writes it
    /// during the region.
    #[inline(always)]
    unsafe fn put(&self, m: usize, col: usize, v: f32) {
        // SAFETY: the caller's contract: in bounds and exclusive.
        unsafe { self.cells.write(m * self.n + col, v) }
    }
}

thread_local! {
    static ACTS: RefCell<Vec<ActBlock>> = const { RefCell::new(Vec::new()) };
}

/// Y = X · Wᵀ for one weight. `x` is M×K row-major, `y` is M×N row-major.
pub fn matmul(pool: &ThreadPool, w: &Weight, x: &[f32], m: usize, y: &mut [f32]) {
    matmul_many(pool, &[w], x, m, &mut [y]);
}

/// Several weights sharing the same input (e.g. Q, K and V): the input is
/// quantized once and all outputs are computed in one parallel region.
pub fn matmul_many(pool: &ThreadPool, ws: &[&Weight], x: &[f32], m: usize, ys: &mut [&mut [f32]]) {
    assert_eq!(ws.len(), ys.len());
    if m == 0 || ws.is_empty() {
        return;
    }
    let k = ws[0].k;
    assert!(ws.iter().all(|w| w.k == k), "matmul_many: weights differ in K");
    assert_eq!(x.len(), m * k, "matmul: X is not M×K");
    for (w, y) in ws.iter().zip(ys.iter()) {
        assert_eq!(y.len(), m * w.n, "matmul: Y is not M×N");
    }
    if debug_exact() {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            let mut row = vec![0f32; k];
            for c in 0..w.n {
                w.row_f32(c, &mut row);
                for r in 0..m {
                    let xr = &x[r * k..(r + 1) * k];
                    y[r * w.n + c] = row.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() as f32;
                }
            }
        }
        return;
    }
    let mut base = 0;
    for w in ws {
        assert!(w.layout == Layout::Rows || base % 8 == 0, "matmul_many: a packed weight must start on a multiple of 8 columns");
        base += w.n;
    }
    let any_q = ws.iter().any(|w| !is_float(w.ty));
    ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        if any_q {
            let nb = k / 32;
            acts.resize(m * nb, ActBlock::default());
            for r in 0..m {
                quantize_act_row(&x[r * k..(r + 1) * k], &mut acts[r * nb..(r + 1) * nb]);
            }
        }
        let acts: &[ActBlock] = &acts;
        let outs: Vec<Out> = ys.iter_mut().map(|y| Out { n: y.len() / m, cells: DisjointSlice::new(y) }).collect();
        let total: usize = ws.iter().map(|w| w.n).sum();
        let level = simd_level();
        pool.run(|t, nt| {
            let r = split_range(total, nt, t, 8);
            let mut base = 0;
            for (w, out) in ws.iter().zip(&outs) {
                let lo = r.start.max(base);
                let hi = r.end.min(base + w.n);
                if lo < hi {
                    let cols = lo - base..hi - base;
                    // SAFETY: `cols` ⊂ 0..w.n, disjoint between threads.
                    unsafe { run_cols(level, w, x, acts, m, cols, *out) };
                }
                base += w.n;
            }
        });
    });
}

/// Compute columns `cols` of all M rows.
///
/// # Safety
/// The SIMD features `level` names are available; `cols` lies in `0..w.n`; no other thread writes these columns of `out`, which holds `m` rows of `w.n`; `acts` holds `m` quantized rows of `w.k / 32` blocks (quantized weights) and `x` `m` rows of `w.k` (float weights).
unsafe fn run_cols(level: SimdLevel, w: &Weight, x: &[f32], acts: &[ActBlock], m: usize, cols: Range<usize>, out: Out) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        match w.layout {
            Layout::Q4x8 => return cols_packed::<PackedQ4>(level, w, acts, m, cols, out),
            Layout::Q8x8 => return cols_packed::<PackedQ8>(level, w, acts, m, cols, out),
            Layout::Q6x8 => return cols_packed::<PackedQ6>(level, w, acts, m, cols, out),
            Layout::Q5x8 => return cols_packed::<PackedQ5>(level, w, acts, m, cols, out),
            Layout::Q4Kx8 => return cols_packed::<PackedQ4K>(level, w, acts, m, cols, out),
            Layout::Rows => {}
        }
        match w.ty {
            GgmlType::Q4_0 => cols_q::<Q4_0>(level, w, acts, m, cols, out),
            GgmlType::Q4_1 => cols_q::<Q4_1>(level, w, acts, m, cols, out),
            GgmlType::Q5_0 => cols_q::<Q5_0>(level, w, acts, m, cols, out),
            GgmlType::Q5_1 => cols_q::<Q5_1>(level, w, acts, m, cols, out),
            GgmlType::Q8_0 => cols_q::<Q8_0>(level, w, acts, m, cols, out),
            GgmlType::Q4K => cols_q::<Q4K>(level, w, acts, m, cols, out),
            GgmlType::Q5K => cols_q::<Q5K>(level, w, acts, m, cols, out),
            GgmlType::Q6K => cols_q::<Q6K>(level, w, acts, m, cols, out),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => cols_f(level, w, x, m, cols, out),
            GgmlType::Q8_1 | GgmlType::I32 | GgmlType::I64 => unreachable!("rejected by Weight::new"),
        }
    }
}

#[cfg(target_arch = "x86_64")]
use crate::simd::avx2::Unpack;
#[cfg(not(target_arch = "x86_64"))]
pub(crate) trait Unpack: Format {}
#[cfg(not(target_arch = "x86_64"))]
impl<T: Format> Unpack for T {}

/// # Safety
/// As [`run_cols`], for a row-layout quantized weight.
unsafe fn cols_q<F: Format + Unpack>(level: SimdLevel, w: &Weight, acts: &[ActBlock], m: usize, cols: Range<usize>, out: Out) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let nb = w.k / 32;
        let arow = |r: usize| &acts[r * nb..(r + 1) * nb];
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                let mut c = cols.start;
                while c < cols.end {
                    if c + 2 <= cols.end {
                        tiles_q::<F, 2>(w, &arow, m, c, out);
                        c += 2;
                    } else {
                        tiles_q::<F, 1>(w, &arow, m, c, out);
                        c += 1;
                    }
                }
            }
            _ => {
                for c in cols {
                    let wr = w.row(c);
                    for r in 0..m {
                        out.put(r, c, dot_q_scalar::<F>(wr, arow(r)));
                    }
                }
            }
        }
    }
}

/// # Safety
/// As [`run_cols`]; `c + NR <= w.n` and AVX2, FMA and F16C available.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tiles_q<'a, F: Unpack, const NR: usize>(w: &Weight<'a>, arow: &impl Fn(usize) -> &'a [ActBlock], m: usize, c: usize, out: Out) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        use crate::simd::avx2::dot_tile;
        let wr: [&[u8]; NR] = std::array::from_fn(|i| w.row(c + i));
        let mut r = 0;
        while r < m {
            match m - r {
                1 => {
                    let mut o = [[0f32; NR]; 1];
                    dot_tile::<F, 1, NR>(wr, [arow(r)], &mut o);
                    emit(out, r, c, &o);
                    r += 1;
                }
                2 => {
                    let mut o = [[0f32; NR]; 2];
                    dot_tile::<F, 2, NR>(wr, [arow(r), arow(r + 1)], &mut o);
                    emit(out, r, c, &o);
                    r += 2;
                }
                3 => {
                    let mut o = [[0f32; NR]; 3];
                    dot_tile::<F, 3, NR>(wr, [arow(r), arow(r + 1), arow(r + 2)], &mut o);
                    emit(out, r, c, &o);
                    r += 3;
                }
                _ => {
                    let mut o = [[0f32; NR]; 4];
                    dot_tile::<F, 4, NR>(wr, [arow(r), arow(r + 1), arow(r + 2), arow(r + 3)], &mut o);
                    emit(out, r, c, &o);
                    r += 4;
                }
            }
        }
    }
}

/// A repacked layout whose groups of 8 columns are computed by one SIMD tile
/// kernel (8 columns × MR rows) and mirrored by a scalar twin.
trait Packed {
    /// Bytes of one 8-column group block.
    const BLOCK: usize;
    /// # Safety
    /// AVX2/FMA/F16C (and the VNNI encoding `simd::vnni_kind()` names) available; `grp` holds `a[0].len()` group blocks.
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]);
    /// Two groups at once on 512-bit registers (the same bits per column).
    /// # Safety
    /// `simd::wide()`; `g0` and `g1` hold `a[0].len()` group blocks each.
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile2<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]);
    fn scalar(data: &[u8], k: usize, col: usize, a: &[ActBlock]) -> f32;
}

struct PackedQ4;
struct PackedQ8;
struct PackedQ6;
struct PackedQ5;
struct PackedQ4K;

impl Packed for PackedQ4 {
    const BLOCK: usize = crate::pack::Q4X8_BLOCK;
    /// # Safety
    /// As [`Packed::tile`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            match crate::simd::vnni_kind() {
                crate::simd::Vnni::Avx => crate::simd::vnni::avx::dot_q4x8::<MR>(grp, a, out),
                crate::simd::Vnni::Evex => crate::simd::vnni::evex::dot_q4x8::<MR>(grp, a, out),
                crate::simd::Vnni::None => crate::simd::avx2::dot_q4x8::<MR>(grp, a, out),
            }
        }
    }
    /// # Safety
    /// As [`Packed::tile2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile2<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { crate::simd::avx512::dot_q4x16::<MR>(g0, g1, a, out) }
    }
    fn scalar(data: &[u8], k: usize, col: usize, a: &[ActBlock]) -> f32 {
        crate::pack::dot_q4x8_scalar(data, k, col, a)
    }
}

impl Packed for PackedQ8 {
    const BLOCK: usize = crate::pack::Q8X8_BLOCK;
    /// # Safety
    /// As [`Packed::tile`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            match crate::simd::vnni_kind() {
                crate::simd::Vnni::Avx => crate::simd::vnni::avx::dot_q8x8::<MR>(grp, a, out),
                crate::simd::Vnni::Evex => crate::simd::vnni::evex::dot_q8x8::<MR>(grp, a, out),
                crate::simd::Vnni::None => crate::simd::avx2::dot_q8x8::<MR>(grp, a, out),
            }
        }
    }
    /// # Safety
    /// As [`Packed::tile2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile2<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { crate::simd::avx512::dot_q8x16::<MR>(g0, g1, a, out) }
    }
    fn scalar(data: &[u8], k: usize, col: usize, a: &[ActBlock]) -> f32 {
        crate::pack::dot_q8x8_scalar(data, k, col, a)
    }
}

impl Packed for PackedQ5 {
    const BLOCK: usize = crate::pack::Q5X8_BLOCK;
    /// # Safety
    /// As [`Packed::tile`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            match crate::simd::vnni_kind() {
                crate::simd::Vnni::Avx => crate::simd::vnni::avx::dot_q5x8::<MR>(grp, a, out),
                crate::simd::Vnni::Evex => crate::simd::vnni::evex::dot_q5x8::<MR>(grp, a, out),
                crate::simd::Vnni::None => crate::simd::avx2::dot_q5x8::<MR>(grp, a, out),
            }
        }
    }
    /// # Safety
    /// As [`Packed::tile2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile2<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { crate::simd::avx512::dot_q5x16::<MR>(g0, g1, a, out) }
    }
    fn scalar(data: &[u8], k: usize, col: usize, a: &[ActBlock]) -> f32 {
        crate::pack::dot_q5x8_scalar(data, k, col, a)
    }
}

impl Packed for PackedQ4K {
    const BLOCK: usize = crate::pack::Q4KX8_BLOCK;
    /// # Safety
    /// As [`Packed::tile`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            match crate::simd::vnni_kind() {
                crate::simd::Vnni::Avx => crate::simd::vnni::avx::dot_q4kx8::<MR>(grp, a, out),
                crate::simd::Vnni::Evex => crate::simd::vnni::evex::dot_q4kx8::<MR>(grp, a, out),
                crate::simd::Vnni::None => crate::simd::avx2::dot_q4kx8::<MR>(grp, a, out),
            }
        }
    }
    /// # Safety
    /// As [`Packed::tile2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile2<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { crate::simd::avx512::dot_q4kx16::<MR>(g0, g1, a, out) }
    }
    fn scalar(data: &[u8], k: usize, col: usize, a: &[ActBlock]) -> f32 {
        crate::pack::dot_q4kx8_scalar(data, k, col, a)
    }
}

impl Packed for PackedQ6 {
    const BLOCK: usize = crate::pack::Q6X8_BLOCK;
    /// # Safety
    /// As [`Packed::tile`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile<const MR: usize>(grp: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 8]; MR]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            match crate::simd::vnni_kind() {
                crate::simd::Vnni::Avx => crate::simd::vnni::avx::dot_q6x8::<MR>(grp, a, out),
                crate::simd::Vnni::Evex => crate::simd::vnni::evex::dot_q6x8::<MR>(grp, a, out),
                crate::simd::Vnni::None => crate::simd::avx2::dot_q6x8::<MR>(grp, a, out),
            }
        }
    }
    /// # Safety
    /// As [`Packed::tile2`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile2<const MR: usize>(g0: &[u8], g1: &[u8], a: [&[ActBlock]; MR], out: &mut [[f32; 16]; MR]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe { crate::simd::avx512::dot_q6x16::<MR>(g0, g1, a, out) }
    }
    fn scalar(data: &[u8], k: usize, col: usize, a: &[ActBlock]) -> f32 {
        crate::pack::dot_q6x8_scalar(data, k, col, a)
    }
}

/// Columns of a repacked weight; `cols` starts and ends on multiples of 8 (the
/// split aligns to 8 and packed weights have n % 8 == 0).
///
/// # Safety
/// As [`run_cols`], for a packed weight; `cols` starts and ends on multiples of 8.
unsafe fn cols_packed<P: Packed>(level: SimdLevel, w: &Weight, acts: &[ActBlock], m: usize, cols: Range<usize>, out: Out) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let nb = w.k / 32;
        let arow = |r: usize| &acts[r * nb..(r + 1) * nb];
        debug_assert!(cols.start.is_multiple_of(8) && cols.end.is_multiple_of(8));
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                let wide = crate::simd::wide() && m >= crate::simd::wide_min_rows();
                let group = |g: usize| &w.data[g * nb * P::BLOCK..(g + 1) * nb * P::BLOCK];
                let (mut g, end) = (cols.start / 8, cols.end / 8);
                while g < end {
                    // two groups per tile where 512-bit kernels run, else one
                    let pair = wide && g + 1 < end;
                    let (g0, g1) = (group(g), group(g + pair as usize));
                    let mut r = 0;
                    while r < m {
                        macro_rules! tile {
                            ($mr:literal) => {{
                                let rows: [&[ActBlock]; $mr] = std::array::from_fn(|i| arow(r + i));
                                if pair {
                                    let mut o = [[0f32; 16]; $mr];
                                    P::tile2::<$mr>(g0, g1, rows, &mut o);
                                    emit(out, r, g * 8, &o);
                                } else {
                                    let mut o = [[0f32; 8]; $mr];
                                    P::tile::<$mr>(g0, rows, &mut o);
                                    emit(out, r, g * 8, &o);
                                }
                                r += $mr;
                            }};
                        }
                        match m - r {
                            1 => tile!(1),
                            2 => tile!(2),
                            3 => tile!(3),
                            4 => tile!(4),
                            5 => tile!(5),
                            _ => tile!(6),
                        }
                    }
                    g += 1 + pair as usize;
                }
            }
            _ => {
                for c in cols {
                    for r in 0..m {
                        out.put(r, c, P::scalar(w.data, w.k, c, arow(r)));
                    }
                }
            }
        }
    }
}

/// # Safety
/// `out` holds rows `r..r + MR` and columns `c..c + NR`, which no other thread writes.
#[inline(always)]
unsafe fn emit<const MR: usize, const NR: usize>(out: Out, r: usize, c: usize, o: &[[f32; NR]; MR]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        for (i, row) in o.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                out.put(r + i, c + j, *v);
            }
        }
    }
}

/// # Safety
/// As [`run_cols`], for a float weight.
unsafe fn cols_f(level: SimdLevel, w: &Weight, x: &[f32], m: usize, cols: Range<usize>, out: Out) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let kind = float_kind(w.ty);
        let k = w.k;
        let xrow = |r: usize| &x[r * k..(r + 1) * k];
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                use crate::simd::avx2::dot_tile_f;
                for c in cols {
                    let wr = [w.row(c)];
                    let mut r = 0;
                    while r < m {
                        if m - r >= 4 {
                            let mut o = [[0f32; 1]; 4];
                            dot_tile_f::<4, 1>(kind, wr, [xrow(r), xrow(r + 1), xrow(r + 2), xrow(r + 3)], &mut o);
                            emit(out, r, c, &o);
                            r += 4;
                        } else {
                            let mut o = [[0f32; 1]; 1];
                            dot_tile_f::<1, 1>(kind, wr, [xrow(r)], &mut o);
                            emit(out, r, c, &o);
                            r += 1;
                        }
                    }
                }
            }
            _ => {
                for c in cols {
                    let wr = w.row(c);
                    for r in 0..m {
                        out.put(r, c, dot_f_scalar(kind, wr, xrow(r)));
                    }
                }
            }
        }
    }
}

/// Scalar reference: the same result as [`matmul`], computed on one thread with
/// the scalar twins (the same driver, forced to [`SimdLevel::Scalar`]). Tests
/// compare the two bit for bit.
pub fn matmul_reference(w: &Weight, x: &[f32], m: usize) -> Vec<f32> {
    let k = w.k;
    let mut y = vec![0f32; m * w.n];
    let nb = k / 32;
    let mut acts = vec![ActBlock::default(); if is_float(w.ty) { 0 } else { m * nb }];
    if !is_float(w.ty) {
        for r in 0..m {
            quantize_act_row(&x[r * k..(r + 1) * k], &mut acts[r * nb..(r + 1) * nb]);
        }
    }
    let out = Out { cells: DisjointSlice::new(&mut y), n: w.n };
    // SAFETY: one thread writes all of 0..w.n into `y`, which outlives the call.
    unsafe { run_cols(SimdLevel::Scalar, w, x, &acts, m, 0..w.n, out) };
    y
}

fn debug_exact() -> bool {
    static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F.get_or_init(|| std::env::var("TANDEM_DEBUG_EXACT_MATMUL").is_ok())
}
