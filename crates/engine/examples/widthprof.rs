//! Repeat one target forward of W rows at a context of 128, for `perf`.
//!
//! With SWEEP_MB > 0, a buffer of that size is read between forwards (not
//! timed), as a drafter's weights are read between two verify passes: the
//! forward's time then shows what the drafter's memory traffic costs the
//! target.
//!
//! W may be a comma-separated list (e.g. `1,5`): the widths then take turns,
//! one forward each, so that the machine's drift falls on all of them alike.
//!
//! cargo run --release -p tandem-engine --example widthprof -- W[,W…] [reps] [SWEEP_MB]
use std::sync::Arc;
use std::time::Instant;

use tandem_engine::fetch::{ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::{Engine, Session};
use tandem_model::{ForwardOutput, LogitRows};

fn main() {
    let widths: Vec<usize> =
        std::env::args().nth(1).map(|s| s.split(',').filter_map(|w| w.parse().ok()).collect()).unwrap_or_else(|| vec![1]);
    let reps: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let sweep_mb: usize = std::env::args().nth(3).and_then(|s| s.parse().ok()).unwrap_or(0);
    // distinct nonzero bytes, so the pages are real
    let sweep: Vec<u64> = (0..sweep_mb * (1 << 17)).map(|i| i as u64 * 0x9E37_79B9 + 1).collect();
    let mut sink = 0u64;
    let path = ensure_model(&DEFAULT_MODEL, &models_dir(), true).unwrap();
    let e = Arc::new(Engine::load(path, 2).unwrap());
    let mut s = Session::new(e.clone(), 300);
    let toks: Vec<u32> = (0..128u32).map(|i| 100 + (i * 7919) % 40000).collect();
    s.feed(&toks).unwrap();
    let base = s.tokens.len();
    let mut out = ForwardOutput::default();
    let mut times = vec![Vec::with_capacity(reps); widths.len()];
    for _ in 0..reps {
        for (wi, &w) in widths.iter().enumerate() {
            let extra: Vec<u32> = (0..w as u32).map(|i| 200 + i * 31).collect();
            if !sweep.is_empty() {
                sink = sink.wrapping_add(sweep.iter().fold(0u64, |a, &x| a ^ x));
            }
            let t0 = Instant::now();
            e.model.forward(&e.pool, &mut s.cache, &extra, &LogitRows::All, &[], &mut out).unwrap();
            times[wi].push(t0.elapsed().as_secs_f64() * 1e3);
            s.cache.truncate(base);
        }
    }
    let mut one = None;
    for (&w, t) in widths.iter().zip(times.iter_mut()) {
        t.sort_by(f64::total_cmp);
        let (p10, med) = (t[reps / 10], t[reps / 2]);
        let ratio = one.map(|o: f64| format!(", {:.2}x width {}", med / o, widths[0])).unwrap_or_default();
        one.get_or_insert(med);
        println!("width {w}, sweep {sweep_mb} MB: p10 {p10:.3} ms, median {med:.3} ms{ratio}");
    }
    std::hint::black_box(sink);
}
