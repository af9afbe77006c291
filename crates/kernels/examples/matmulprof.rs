//! Time one packed matmul at M = 1…6 rows, for the per-row cost of the tile
//! kernels (the verify pass's extra rows).
//!
//! cargo run --release -p tandem-kernels --example matmulprof -- [threads] [reps]
use std::time::Instant;

use tandem_gguf::GgmlType;
use tandem_kernels::matmul::{matmul, Weight};
use tandem_kernels::pack::{pack_q4x8, pack_q8x8};
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

fn main() {
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
