//! What one MTP draft step costs, hot and cold.
//!
//! The head's weights (about 9.5 MB for the committed file, with its draft
//! vocabulary's output rows) fit in the last-level cache, but every target
//! forward streams the whole model (about 94 MB) through it, so in a real
//! speculative cycle the head reads them from memory. This times one
//! one-row draft step at a context of 128: repeated alone (cache-hot), and
//! each right after a two-row target forward (as in a cycle).
//!
//! cargo run --release -p tandem-engine --example headprof -- [reps] [head.gguf]

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tandem_engine::fetch::{ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::{Engine, Session};
use tandem_model::{ForwardOutput, LogitRows};

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(500);
    let head_path = std::env::args().nth(2).unwrap_or_else(|| "models/support/smollm2-135m-instruct-mtp.gguf".into());
    let path = ensure_model(&DEFAULT_MODEL, &models_dir(), true).unwrap();
    let e = Arc::new(Engine::load(path, 2).unwrap());
    let head = e.load_mtp_head(Path::new(&head_path)).unwrap();
    let ctx = 128u32;
    let mut s = Session::new(e.clone(), 300);
    let toks: Vec<u32> = (0..ctx).map(|i| 100 + (i * 7919) % 40000).collect();
    s.feed(&toks).unwrap();
    let base = s.tokens.len();
    // any hidden row will do for timing
    let d = e.model.cfg.d_model;
    let hid: Vec<f32> = (0..d).map(|i| ((i * 37) % 17) as f32 * 0.1 - 0.8).collect();
    // a fused head also reads its target layers' rows (`fc` and their norms)
    let feats = vec![0.5f32; head.fused_layers().len() * d];
    let feats = (!feats.is_empty()).then_some(&feats[..]);
    let mut cache = head.new_cache(300);
    let (mut oh, mut lg) = (Vec::new(), Vec::new());
    for t in 0..ctx {
        head.forward_fused(&e.pool, &mut cache, &[t + 5], &hid, feats, &mut oh, &mut lg).unwrap();
    }
    let head_base = cache.len();
    let mut out = ForwardOutput::default();
    for cold in [false, true] {
        let mut ts = Vec::with_capacity(reps);
        for _ in 0..reps {
            if cold {
                e.model.forward(&e.pool, &mut s.cache, &[300, 301], &LogitRows::All, &[], &mut out).unwrap();
                s.cache.truncate(base);
            }
            let t0 = Instant::now();
            head.forward_fused(&e.pool, &mut cache, &[77], &hid, feats, &mut oh, &mut lg).unwrap();
            ts.push(t0.elapsed().as_secs_f64() * 1e3);
            cache.truncate(head_base);
        }
        ts.sort_by(f64::total_cmp);
        let what = if cold { "each after a 2-row target forward" } else { "repeated alone" };
        println!("{head_path}: draft step {what}: p10 {:.3} ms, median {:.3} ms", ts[ts.len() / 10], ts[ts.len() / 2]);
    }
}
