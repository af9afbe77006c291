//! Twin and batch-invariance properties of the matmul kernels.
//!
//! - SIMD result == scalar twin, bit for bit, for every format.
//! - Row i of an M-row product == the same row computed alone, for M in 1..=16
//!   and 1 or 2 threads (compared with `to_bits`, never a tolerance).

#![allow(clippy::needless_range_loop)]

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tandem_gguf::GgmlType;
use tandem_kernels::matmul::{matmul, matmul_reference, Weight};
use tandem_kernels::ThreadPool;

const TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random but finite weight bytes: random payload, sane f16 scales.
fn random_weight(ty: GgmlType, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = ty.row_bytes(k as u64).unwrap() as usize;
    let mut data: Vec<u8> = (0..rb * n).map(|_| rng.next() as u8).collect();
    let h = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
    let bb = ty.block_bytes();
    for blk in data.chunks_exact_mut(bb) {
        let s1 = h(rng.f() * 0.05);
        let s2 = h(rng.f() * 0.05);
        match ty {
            GgmlType::F32 => blk.copy_from_slice(&rng.f().to_le_bytes()),
            GgmlType::F16 => blk.copy_from_slice(&h(rng.f())),
            GgmlType::BF16 => blk.copy_from_slice(&((rng.f().to_bits() >> 16) as u16).to_le_bytes()),
            GgmlType::Q6K => blk[208..210].copy_from_slice(&s1),
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => blk[0..2].copy_from_slice(&s1),
            _ => {
                blk[0..2].copy_from_slice(&s1);
                blk[2..4].copy_from_slice(&s2);
            }
        }
    }
    data
}

/// Row r of an M-row product has the bits of the same row computed alone,
/// with 1 and 2 threads.
fn batch_invariant(w: &Weight, x: &[f32], m: usize) -> Result<(), TestCaseError> {
    let (n, k) = (w.n, w.k);
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        let mut y = vec![0f32; m * n];
        matmul(&pool, w, x, m, &mut y);
        for r in 0..m {
            let mut y1 = vec![0f32; n];
            matmul(&pool, w, &x[r * k..(r + 1) * k], 1, &mut y1);
            for c in 0..n {
                prop_assert_eq!(
                    y[r * n + c].to_bits(),
                    y1[c].to_bits(),
                    "{} {:?} threads={} m={} row={} col={}",
                    w.ty,
                    w.layout(),
                    threads,
                    m,
                    r,
                    c
                );
            }
        }
    }
    Ok(())
}

/// Every dequantized row of `p` (a packed layout) has the bits of `w`'s.
fn same_rows(w: &Weight, p: &Weight) {
    let k = w.k;
    for r in 0..w.n {
        let (mut a, mut b) = (vec![0f32; k], vec![0f32; k]);
        w.row_f32(r, &mut a);
        p.row_f32(r, &mut b);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "{:?} row {r}", p.layout());
    }
}

fn k_for(ty: GgmlType, units: usize) -> usize {
    if ty.block_elems() == 256 {
        256 * units
    } else {
        32 * units
    }
}

#[test]
fn simd_equals_scalar_twin_all_formats() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let mut rng = Rng(0x9E3779B97F4A7C15);
    for ty in TYPES {
        for (n, units, m) in [(1, 1, 1), (7, 2, 3), (16, 3, 5), (33, 1, 9)] {
            let k = k_for(ty, units);
            let data = random_weight(ty, n, k, &mut rng);
            let w = Weight::new("w", ty, n, k, &data).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| rng.f()).collect();
            let want = matmul_reference(&w, &x, m);
            for pool in &pools {
                let mut y = vec![0f32; m * n];
                matmul(pool, &w, &x, m, &mut y);
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{ty} n={n} k={k} m={m} idx={i}: {a} vs {b}");
                }
            }
        }
    }
}

#[test]
fn dequantize_agrees_with_dot() {
    // The integer-dot path and dequantize-then-multiply describe the same numbers.
    let mut rng = Rng(7);
    for ty in TYPES {
        let k = k_for(ty, 2);
        let data = random_weight(ty, 3, k, &mut rng);
        let w = Weight::new("w", ty, 3, k, &data).unwrap();
        let x: Vec<f32> = (0..k).map(|_| rng.f()).collect();
        let y = matmul_reference(&w, &x, 1);
        for c in 0..3 {
            let mut row = vec![0f32; k];
            w.row_f32(c, &mut row);
            let exact: f64 = row.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = row.iter().map(|a| a.abs() as f64).sum::<f64>() + 1e-6;
            let err = (y[c] as f64 - exact).abs() / scale;
            assert!(err < 0.02, "{ty}: dot {} vs dequantized {exact} (rel {err})", y[c]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
    #[test]
    fn rows_are_batch_invariant(ty_i in 0usize..TYPES.len(), m in 1usize..=16, n in 1usize..40, units in 1usize..4, seed in any::<u64>()) {
        let ty = TYPES[ty_i];
        let k = k_for(ty, units);
        let mut rng = Rng(seed | 1);
        let data = random_weight(ty, n, k, &mut rng);
        let w = Weight::new("w", ty, n, k, &data).unwrap();
        let x: Vec<f32> = (0..m * k).map(|_| rng.f() * 3.0).collect();
        batch_invariant(&w, &x, m)?;
    }
}

mod packed {
    use super::*;
    use tandem_kernels::pack::{pack_q4x8, pack_q8x8};

    fn both(ty: GgmlType, n: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
        let data = random_weight(ty, n, k, rng);
        let packed = pack_q4x8(ty, n, k, &data).expect("packable");
        (data, packed)
    }

    /// A random Q5_0 matrix whose first block of each row holds the extremes
    /// (values −16 and 15).
    fn q5_0_weight(n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
        let mut data = random_weight(GgmlType::Q5_0, n, k, rng);
        for row in data.chunks_exact_mut(k / 32 * 22) {
            row[2..6].copy_from_slice(&0x8000_0002u32.to_le_bytes());
            row[6] = 0xF0; // element 0: 0 (−16); element 16: 15 (−1)
            row[7] = 0x0F; // element 1: 15 | 16 = 31 (15)
            row[21] = 0xFF; // element 31: 15 | 16 = 31 (15)
        }
        data
    }

    #[test]
    fn q5x8_rows_dequantize_like_the_original() {
        let mut rng = Rng(17);
        let (n, k) = (24, 160);
        let data = q5_0_weight(n, k, &mut rng);
        let packed = tandem_kernels::pack::pack_q5x8(n, k, &data).unwrap();
        assert_eq!(packed.len(), data.len(), "5.5 bits per weight, like Q5_0");
        let w = Weight::new("w", GgmlType::Q5_0, n, k, &data).unwrap();
        let p = Weight::packed_q5x8("w", n, k, &packed).unwrap();
        same_rows(&w, &p);
        assert!(tandem_kernels::pack::pack_q5x8(12, k, &data[..12 * 5 * 22]).is_none(), "n % 8 != 0");
        assert!(tandem_kernels::pack::pack_q5x8(n, 128, &data).is_none(), "size mismatch");
        assert!(Weight::packed_q5x8("w", n, 128, &packed).is_err(), "size mismatch");
    }

    /// Q5x8 gives the bits of the scalar twin, with 1 and 2 threads, and the
    /// bits of the same blocks rewritten as Q8_0 and run as Q8x8 (both reduce
    /// to the same exact integer per block).
    #[test]
    fn q5x8_simd_equals_scalar_twin_and_the_q8_form() {
        let pools = [ThreadPool::new(1), ThreadPool::new(2)];
        let mut rng = Rng(18);
        for (n, k, m) in [(8, 32, 1), (16, 64, 2), (24, 96, 3), (40, 160, 6), (64, 32, 9), (16, 256, 16)] {
            let data = q5_0_weight(n, k, &mut rng);
            let packed = tandem_kernels::pack::pack_q5x8(n, k, &data).unwrap();
            let q8 = pack_q8x8(n, k, &tandem_kernels::pack::q5_0_to_q8_0(&data).unwrap()).unwrap();
            let p = Weight::packed_q5x8("w", n, k, &packed).unwrap();
            let p8 = Weight::packed_q8x8("w", n, k, &q8).unwrap();
            let x: Vec<f32> = (0..m * k).map(|i| if i % 5 == 0 { rng.f().signum() * 3.0 } else { rng.f() }).collect();
            let want = matmul_reference(&p, &x, m);
            for pool in &pools {
                let (mut y, mut y8) = (vec![0f32; m * n], vec![0f32; m * n]);
                matmul(pool, &p, &x, m, &mut y);
                matmul(pool, &p8, &x, m, &mut y8);
                for i in 0..y.len() {
                    assert_eq!(y[i].to_bits(), want[i].to_bits(), "n={n} k={k} m={m} idx={i}: {} vs {}", y[i], want[i]);
                    assert_eq!(y[i].to_bits(), y8[i].to_bits(), "n={n} k={k} m={m} idx={i}: {} vs {}", y[i], y8[i]);
                }
            }
        }
        assert!(tandem_kernels::pack::q5_0_to_q8_0(&[0u8; 21]).is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]
        #[test]
        fn q5x8_rows_are_batch_invariant(m in 1usize..=16, groups in 1usize..6, units in 1usize..4, seed in any::<u64>()) {
            let (n, k) = (groups * 8, units * 32);
            let mut rng = Rng(seed | 1);
            let data = q5_0_weight(n, k, &mut rng);
            let packed = tandem_kernels::pack::pack_q5x8(n, k, &data).unwrap();
            let w = Weight::packed_q5x8("w", n, k, &packed).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| rng.f() * 3.0).collect();
            batch_invariant(&w, &x, m)?;
        }
    }

    #[test]
    fn packed_rows_dequantize_like_the_original() {
        let mut rng = Rng(11);
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1] {
            let (n, k) = (16, 96);
            let (data, packed) = both(ty, n, k, &mut rng);
            let w = Weight::new("w", ty, n, k, &data).unwrap();
            let p = Weight::packed_q4x8("w", ty, n, k, &packed).unwrap();
            same_rows(&w, &p);
        }
    }

    #[test]
    fn packed_simd_equals_scalar_twin_and_is_close_to_rows() {
        let pools = [ThreadPool::new(1), ThreadPool::new(2)];
        let mut rng = Rng(12);
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1] {
            for (n, k, m) in [(8, 32, 1), (16, 64, 3), (40, 96, 6), (64, 32, 9)] {
                let (data, packed) = both(ty, n, k, &mut rng);
                let w = Weight::new("w", ty, n, k, &data).unwrap();
                let p = Weight::packed_q4x8("w", ty, n, k, &packed).unwrap();
                let x: Vec<f32> = (0..m * k).map(|_| rng.f()).collect();
                let want = matmul_reference(&p, &x, m);
                let rows = matmul_reference(&w, &x, m);
                for pool in &pools {
                    let mut y = vec![0f32; m * n];
                    matmul(pool, &p, &x, m, &mut y);
                    for i in 0..y.len() {
                        assert_eq!(y[i].to_bits(), want[i].to_bits(), "{ty} n={n} k={k} m={m} idx={i}");
                        assert!((y[i] - rows[i]).abs() <= 1e-4 * (1.0 + rows[i].abs()), "{ty}: {} vs {}", y[i], rows[i]);
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]
        #[test]
        fn packed_rows_are_batch_invariant(q40 in any::<bool>(), m in 1usize..=16, groups in 1usize..6, units in 1usize..4, seed in any::<u64>()) {
            let ty = if q40 { GgmlType::Q4_0 } else { GgmlType::Q4_1 };
            let (n, k) = (groups * 8, units * 32);
            let mut rng = Rng(seed | 1);
            let (_, packed) = both(ty, n, k, &mut rng);
            let w = Weight::packed_q4x8("w", ty, n, k, &packed).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| rng.f() * 3.0).collect();
            batch_invariant(&w, &x, m)?;
        }
    }

    /// A random Q6_K matrix whose first super-block of each row holds the
    /// extremes: quants 0 and 63 (−32 and 31), sub-scales −128 and 127.
    fn q6k_weight(n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
        let mut data = random_weight(GgmlType::Q6K, n, k, rng);
        for row in data.chunks_exact_mut(k / 256 * 210) {
            row[0] = 0x00; // element 0: low nibble 0, with qh bits 0 below
            row[1] = 0xFF;
            row[128] &= !0x03;
            row[129] |= 0x03;
            row[192] = 0x80;
            row[193] = 0x7F;
        }
        data
    }

    #[test]
    fn q6x8_rows_dequantize_like_the_original() {
        let mut rng = Rng(31);
        let (n, k) = (16, 512);
        let data = q6k_weight(n, k, &mut rng);
        let packed = tandem_kernels::pack::pack_q6x8(n, k, &data).unwrap();
        let w = Weight::new("w", GgmlType::Q6K, n, k, &data).unwrap();
        let p = Weight::packed_q6x8("w", n, k, &packed).unwrap();
        same_rows(&w, &p);
        assert!(tandem_kernels::pack::pack_q6x8(12, k, &data[..12 * 420]).is_none(), "n % 8 != 0");
        assert!(tandem_kernels::pack::pack_q6x8(n, 256, &data).is_none(), "size mismatch");
        assert!(Weight::packed_q6x8("w", n, 320, &packed).is_err(), "k % 256 != 0");
    }

    #[test]
    fn q6x8_simd_equals_scalar_twin_and_is_close_to_rows() {
        let pools = [ThreadPool::new(1), ThreadPool::new(2)];
        let mut rng = Rng(32);
        for (n, k, m) in [(8, 256, 1), (16, 512, 2), (24, 256, 3), (40, 768, 6), (64, 256, 9), (16, 256, 16)] {
            let data = q6k_weight(n, k, &mut rng);
            let packed = tandem_kernels::pack::pack_q6x8(n, k, &data).unwrap();
            let w = Weight::new("w", GgmlType::Q6K, n, k, &data).unwrap();
            let p = Weight::packed_q6x8("w", n, k, &packed).unwrap();
            let x: Vec<f32> = (0..m * k).map(|i| if i % 7 == 0 { rng.f().signum() * 3.0 } else { rng.f() }).collect();
            let want = matmul_reference(&p, &x, m);
            let rows = matmul_reference(&w, &x, m);
            for pool in &pools {
                let mut y = vec![0f32; m * n];
                matmul(pool, &p, &x, m, &mut y);
                for i in 0..y.len() {
                    assert_eq!(y[i].to_bits(), want[i].to_bits(), "n={n} k={k} m={m} idx={i}: {} vs {}", y[i], want[i]);
                    let tol = 1e-4 * (1.0 + rows[i].abs()) * 64.0;
                    assert!((y[i] - rows[i]).abs() <= tol, "n={n} k={k} m={m} idx={i}: {} vs {}", y[i], rows[i]);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]
        #[test]
        fn q6x8_rows_are_batch_invariant(m in 1usize..=16, groups in 1usize..4, units in 1usize..3, seed in any::<u64>()) {
            let (n, k) = (groups * 8, units * 256);
            let mut rng = Rng(seed | 1);
            let data = q6k_weight(n, k, &mut rng);
            let packed = tandem_kernels::pack::pack_q6x8(n, k, &data).unwrap();
            let w = Weight::packed_q6x8("w", n, k, &packed).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| rng.f() * 3.0).collect();
            batch_invariant(&w, &x, m)?;
        }
    }

    #[test]
    fn q4kx8_rows_dequantize_like_the_original() {
        let mut rng = Rng(41);
        let (n, k) = (16, 512);
        let data = random_weight(GgmlType::Q4K, n, k, &mut rng);
        let packed = tandem_kernels::pack::pack_q4kx8(n, k, &data).unwrap();
        let w = Weight::new("w", GgmlType::Q4K, n, k, &data).unwrap();
        let p = Weight::packed_q4kx8("w", n, k, &packed).unwrap();
        same_rows(&w, &p);
        assert!(tandem_kernels::pack::pack_q4kx8(12, k, &data[..12 * 288]).is_none(), "n % 8 != 0");
        assert!(tandem_kernels::pack::pack_q4kx8(n, 256, &data).is_none(), "size mismatch");
        assert!(Weight::packed_q4kx8("w", n, 320, &packed).is_err(), "k % 256 != 0");
    }

    #[test]
    fn q4kx8_simd_equals_scalar_twin_and_is_close_to_rows() {
        let pools = [ThreadPool::new(1), ThreadPool::new(2)];
        let mut rng = Rng(42);
        for (n, k, m) in [(8, 256, 1), (16, 512, 2), (24, 256, 3), (40, 768, 6), (64, 256, 9), (16, 256, 16)] {
            let data = random_weight(GgmlType::Q4K, n, k, &mut rng);
            let packed = tandem_kernels::pack::pack_q4kx8(n, k, &data).unwrap();
            let w = Weight::new("w", GgmlType::Q4K, n, k, &data).unwrap();
            let p = Weight::packed_q4kx8("w", n, k, &packed).unwrap();
            let x: Vec<f32> = (0..m * k).map(|i| if i % 7 == 0 { rng.f().signum() * 3.0 } else { rng.f() }).collect();
            let want = matmul_reference(&p, &x, m);
            let rows = matmul_reference(&w, &x, m);
            for pool in &pools {
                let mut y = vec![0f32; m * n];
                matmul(pool, &p, &x, m, &mut y);
                for i in 0..y.len() {
                    assert_eq!(y[i].to_bits(), want[i].to_bits(), "n={n} k={k} m={m} idx={i}: {} vs {}", y[i], want[i]);
                    let tol = 1e-4 * (1.0 + rows[i].abs()) * 64.0;
                    assert!((y[i] - rows[i]).abs() <= tol, "n={n} k={k} m={m} idx={i}: {} vs {}", y[i], rows[i]);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]
        #[test]
        fn q4kx8_rows_are_batch_invariant(m in 1usize..=16, groups in 1usize..4, units in 1usize..3, seed in any::<u64>()) {
            let (n, k) = (groups * 8, units * 256);
            let mut rng = Rng(seed | 1);
            let data = random_weight(GgmlType::Q4K, n, k, &mut rng);
            let packed = tandem_kernels::pack::pack_q4kx8(n, k, &data).unwrap();
            let w = Weight::packed_q4kx8("w", n, k, &packed).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| rng.f() * 3.0).collect();
            batch_invariant(&w, &x, m)?;
        }
    }

    fn both_q8(n: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
        let data = random_weight(GgmlType::Q8_0, n, k, rng);
        let packed = pack_q8x8(n, k, &data).expect("packable");
        (data, packed)
    }

    #[test]
    fn q8x8_rejects_bad_shapes() {
        let mut rng = Rng(21);
        let data = random_weight(GgmlType::Q8_0, 12, 64, &mut rng);
        assert!(pack_q8x8(12, 64, &data).is_none(), "n % 8 != 0");
        assert!(pack_q8x8(8, 64, &data).is_none(), "size mismatch");
        assert!(pack_q8x8(16, 48, &data).is_none(), "k % 32 != 0");
        assert!(Weight::packed_q8x8("w", 8, 64, &data[..8 * 2 * 34 - 1]).is_err(), "size mismatch");
        assert!(Weight::packed_q8x8("w", 12, 64, &data).is_err(), "n % 8 != 0");
    }

    #[test]
    fn q8x8_rows_dequantize_like_the_original() {
        let mut rng = Rng(13);
        let (n, k) = (24, 128);
        let (mut data, _) = both_q8(n, k, &mut rng);
        // extremes: q = -128 and 127, and a negative scale with q = 0 (-0.0 · 0)
        data[2] = 0x80;
        data[3] = 0x7F;
        data[34..36].copy_from_slice(&half::f16::from_f32(-0.03).to_bits().to_le_bytes());
        data[36] = 0;
        let packed = pack_q8x8(n, k, &data).unwrap();
        let w = Weight::new("w", GgmlType::Q8_0, n, k, &data).unwrap();
        let p = Weight::packed_q8x8("w", n, k, &packed).unwrap();
        same_rows(&w, &p);
    }

    #[test]
    fn q8x8_simd_equals_scalar_twin_and_is_close_to_rows() {
        let pools = [ThreadPool::new(1), ThreadPool::new(2)];
        let mut rng = Rng(14);
        for (n, k, m) in [(8, 32, 1), (16, 64, 2), (24, 96, 3), (40, 96, 6), (64, 32, 9), (48, 576, 16)] {
            let mut data = random_weight(GgmlType::Q8_0, n, k, &mut rng);
            // saturate some blocks with extreme quants on both signs
            for (i, blk) in data.chunks_exact_mut(34).enumerate().filter(|(i, _)| i % 5 == 0) {
                for q in &mut blk[2..] {
                    *q = if i % 2 == 0 { 0x80 } else { 0x7F };
                }
            }
            let packed = pack_q8x8(n, k, &data).unwrap();
            let w = Weight::new("w", GgmlType::Q8_0, n, k, &data).unwrap();
            let p = Weight::packed_q8x8("w", n, k, &packed).unwrap();
            // large-magnitude activations so that many quants hit ±127
            let x: Vec<f32> = (0..m * k).map(|i| if i % 7 == 0 { rng.f().signum() * 3.0 } else { rng.f() }).collect();
            let want = matmul_reference(&p, &x, m);
            let rows = matmul_reference(&w, &x, m);
            for pool in &pools {
                let mut y = vec![0f32; m * n];
                matmul(pool, &p, &x, m, &mut y);
                for i in 0..y.len() {
                    assert_eq!(y[i].to_bits(), want[i].to_bits(), "n={n} k={k} m={m} idx={i}: {} vs {}", y[i], want[i]);
                    assert!((y[i] - rows[i]).abs() <= 1e-4 * (1.0 + rows[i].abs()), "n={n} k={k} m={m} idx={i}: {} vs {}", y[i], rows[i]);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]
        #[test]
        fn q8x8_rows_are_batch_invariant(m in 1usize..=16, groups in 1usize..6, units in 1usize..4, seed in any::<u64>()) {
            let (n, k) = (groups * 8, units * 32);
            let mut rng = Rng(seed | 1);
            let (_, packed) = both_q8(n, k, &mut rng);
            let w = Weight::packed_q8x8("w", n, k, &packed).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| rng.f() * 3.0).collect();
            batch_invariant(&w, &x, m)?;
        }
    }
}
