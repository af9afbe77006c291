//! Time the attention row kernels the way a verify pass uses them: `rows`
//! queries of one head against `ctx` cached positions (64-wide heads at
//! SmolLM2's stride, f32 rows), block by block, one query at a time
//! (`dot_rows`, `axpy_rows`) or in pairs (`dot_rows2`, `axpy_rows2`), on
//! one thread. Prints the best of `reps` passes, per row and position:
//! scores and value sums together, and the scores alone. At 256 positions
//! the rows stay in L2 and the figure is the arithmetic; at 2,400 the first
//! query of each block also waits on L3.
//!
//! cargo run --release -p tandem-kernels --example attnprof -- [ctx] [rows] [reps]
use std::time::Instant;

use tandem_kernels::ops;

fn main() {
    let arg = |i: usize, d: usize| std::env::args().nth(i).map_or(d, |s| s.parse().expect("a number"));
    let (ctx, m, reps) = (arg(1, 2400), arg(2, 16), arg(3, 200));
    let (hd, stride, block) = (64, 192, 64);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let k: Vec<f32> = (0..ctx * stride).map(|_| rnd()).collect();
    let v: Vec<f32> = (0..ctx * stride).map(|_| rnd()).collect();
    let q: Vec<f32> = (0..m * hd).map(|_| rnd()).collect();
    let mut sc = vec![0f32; m * ctx];
    let mut o = vec![0f32; m * hd];
    for paired in [false, true, false, true] {
        let (mut best, mut best_dot) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..reps {
            let t0 = Instant::now();
            for p0 in (0..ctx).step_by(block) {
                let b = (p0 + block).min(ctx);
                let (kk, n) = (&k[p0 * stride..], b - p0);
                for (pair, sp) in sc.chunks_mut(2 * ctx).enumerate() {
                    let i = 2 * pair;
                    if paired && sp.len() == 2 * ctx {
                        let (s0, s1) = sp.split_at_mut(ctx);
                        ops::dot_rows2(
                            [&q[i * hd..][..hd], &q[(i + 1) * hd..][..hd]],
                            kk,
                            stride,
                            0,
                            0.125,
                            [&mut s0[p0..b], &mut s1[p0..b]],
                        );
                    } else {
                        for (j, s) in sp.chunks_mut(ctx).enumerate() {
                            ops::dot_rows(&q[(i + j) * hd..][..hd], kk, stride, 0, 0.125, &mut s[p0..p0 + n]);
                        }
                    }
                }
            }
            let t_dot = t0.elapsed().as_secs_f64();
            best_dot = best_dot.min(t_dot);
            for p0 in (0..ctx).step_by(block) {
                let b = (p0 + block).min(ctx);
                let vv = &v[p0 * stride..];
                for (pair, op) in o.chunks_mut(2 * hd).enumerate() {
                    let i = 2 * pair;
                    if paired && op.len() == 2 * hd {
                        let (o0, o1) = op.split_at_mut(hd);
                        ops::axpy_rows2(
                            [o0, o1],
                            [&sc[i * ctx + p0..i * ctx + b], &sc[(i + 1) * ctx + p0..(i + 1) * ctx + b]],
                            vv,
                            stride,
                            0,
                        );
                    } else {
                        for (j, oj) in op.chunks_mut(hd).enumerate() {
                            ops::axpy_rows(oj, &sc[(i + j) * ctx + p0..(i + j) * ctx + b], vv, stride, 0);
                        }
                    }
                }
            }
            best = best.min(t0.elapsed().as_secs_f64());
        }
        let per = best / (m * ctx) as f64 * 1e9;
        println!(
            "{}: {:.3} ms for {m} rows × {ctx} positions ({per:.2} ns per row and position; scores {:.2} ns)",
            if paired { "pairs " } else { "single" },
            best * 1e3,
            best_dot / (m * ctx) as f64 * 1e9
        );
    }
}
