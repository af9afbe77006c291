//! Time one packed matmul at M = 1…6 rows, for the per-row cost of the tile
//! kernels (the verify pass's extra rows); with `stream`, the weight bytes per
//! second each layout reaches at M rows (default 1) on matrices of Qwen2.5-Coder-0.5B's
//! FFN shape, cycling through more of them than the last-level cache holds
//! (what one decode step does).
//!
//! cargo run --release -p tandem-kernels --example matmulprof -- [threads] [reps]
//! cargo run --release -p tandem-kernels --example matmulprof -- stream [threads] [rows]
use std::time::Instant;

use tandem_gguf::GgmlType;
use tandem_kernels::matmul::{matmul, Weight};
use tandem_kernels::pack::{pack_q4kx8, pack_q4x8, pack_q5x8, pack_q6x8, pack_q8x8, q5_0_to_q8_0};
use tandem_kernels::ThreadPool;

/// Deterministic pseudo-random bytes with f16 scales of a sane size.
fn blocks(n: usize, k: usize, bb: usize, scales: usize) -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut v = vec![0u8; n * (k / 32) * bb];
    for (i, b) in v.iter_mut().enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = if i % bb < scales { 0 } else { x as u8 };
    }
    for blk in v.chunks_exact_mut(bb) {
        for s in 0..scales / 2 {
            blk[2 * s..2 * s + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    v
}

/// Weight bytes per second at M rows for each layout, over `copies` distinct
/// 896 × 4864 / 4864 × 896 matrices (Qwen2.5-Coder-0.5B's FFN).
fn stream(threads: usize, m: usize) {
    let pool = ThreadPool::new(threads);
    let (d, f, copies) = (896, 4864, 24);
    let q5: Vec<Vec<u8>> = (0..copies).map(|_| blocks(f, d, 22, 2)).collect();
    let q6k: Vec<Vec<u8>> = (0..copies)
        .map(|i| {
            let mut v = vec![(i as u8).wrapping_mul(37); d * (f / 256) * 210];
            for sb in v.chunks_exact_mut(210) {
                sb[208..210].copy_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
            }
            v
        })
        .collect();
    let q4k: Vec<Vec<u8>> = (0..copies)
        .map(|i| {
            let mut v = vec![(i as u8).wrapping_mul(53); d * (f / 256) * 144];
            for sb in v.chunks_exact_mut(144) {
                sb[0..2].copy_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
                sb[2..4].copy_from_slice(&half::f16::from_f32(0.001).to_le_bytes());
            }
            v
        })
        .collect();
    let q5x8: Vec<Vec<u8>> = q5.iter().map(|b| pack_q5x8(f, d, b).unwrap()).collect();
    let q5as8: Vec<Vec<u8>> = q5.iter().map(|b| pack_q8x8(f, d, &q5_0_to_q8_0(b).unwrap()).unwrap()).collect();
    let q6x8: Vec<Vec<u8>> = q6k.iter().map(|b| pack_q6x8(d, f, b).unwrap()).collect();
    let q4kx8: Vec<Vec<u8>> = q4k.iter().map(|b| pack_q4kx8(d, f, b).unwrap()).collect();
    let cases: Vec<(&str, Vec<Weight>)> = vec![
        ("q5_0 as q5x8 4864x896", q5x8.iter().map(|b| Weight::packed_q5x8("w", f, d, b).unwrap()).collect()),
        ("q5_0 as q8x8 4864x896", q5as8.iter().map(|b| Weight::packed_q8x8("w", f, d, b).unwrap()).collect()),
        ("q5_0 rows 4864x896", q5.iter().map(|b| Weight::new("w", GgmlType::Q5_0, f, d, b).unwrap()).collect()),
        ("q6_k as q6x8 896x4864", q6x8.iter().map(|b| Weight::packed_q6x8("w", d, f, b).unwrap()).collect()),
        ("q6_k rows 896x4864", q6k.iter().map(|b| Weight::new("w", GgmlType::Q6K, d, f, b).unwrap()).collect()),
        ("q4_k as q4kx8 896x4864", q4kx8.iter().map(|b| Weight::packed_q4kx8("w", d, f, b).unwrap()).collect()),
        ("q4_k rows 896x4864", q4k.iter().map(|b| Weight::new("w", GgmlType::Q4K, d, f, b).unwrap()).collect()),
    ];
    for (name, ws) in &cases {
        let bytes: usize = ws.iter().map(|w| w.data().len()).sum();
        let mut t = Vec::new();
        for _ in 0..15 {
            let t0 = Instant::now();
            for w in ws {
                let x: Vec<f32> = (0..m * w.k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
                let mut y = vec![0f32; m * w.n];
                matmul(&pool, w, &x, m, &mut y);
            }
            t.push(t0.elapsed().as_secs_f64());
        }
        t.sort_by(f64::total_cmp);
        let med = t[t.len() / 2];
        println!(
            "{name:>24} {threads}t M{m}: {:.2} bits/weight, {:.1} MB in {:.2} ms = {:.1} GB/s, {:.0} M weights/ms",
            bytes as f64 * 8.0 / (copies * d * f) as f64,
            bytes as f64 / 1e6,
            med * 1e3,
            bytes as f64 / med / 1e9,
            (copies * d * f) as f64 / med / 1e9
        );
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("stream") {
        let threads = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(2);
        let rows = std::env::args().nth(3).and_then(|s| s.parse().ok()).unwrap_or(1);
        return stream(threads, rows);
    }
    let threads: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let reps: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(200);
    let pool = ThreadPool::new(threads);
    let (d, f, vocab) = (576, 1536, 49152);
    let gate = pack_q4x8(GgmlType::Q4_1, f, d, &blocks(f, d, 20, 4)).unwrap();
    let down = pack_q4x8(GgmlType::Q4_1, d, f, &blocks(d, f, 20, 4)).unwrap();
    let head = pack_q8x8(vocab, d, &blocks(vocab, d, 34, 2)).unwrap();
    let cases = [
        ("q4_1 1536x576", Weight::packed_q4x8("gate", GgmlType::Q4_1, f, d, &gate).unwrap()),
        ("q4_1 576x1536", Weight::packed_q4x8("down", GgmlType::Q4_1, d, f, &down).unwrap()),
        ("q8_0 49152x576", Weight::packed_q8x8("head", vocab, d, &head).unwrap()),
    ];
    for (name, w) in &cases {
        let mut line = format!("{name:>15} {threads}t:");
        let mut base = 0.0;
        for m in 1..=6 {
            let x: Vec<f32> = (0..m * w.k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
            let mut y = vec![0f32; m * w.n];
            let r = if w.n > 10000 { reps / 10 } else { reps };
            let mut t = Vec::with_capacity(r);
            for _ in 0..r {
                let t0 = Instant::now();
                matmul(&pool, w, &x, m, &mut y);
                t.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            t.sort_by(f64::total_cmp);
            let med = t[r / 2];
            if m == 1 {
                base = med;
            }
            line += &format!("  M{m} {med:.1}us ({:.2}x)", med / base);
        }
        println!("{line}");
    }
}
