//! Time of one forward of w rows (w = 1, 2, 4, 8, 16) at a short context:
//! what batching several sequences costs per step.
//!
//!     cargo run --release -p tandem-engine --example width-cost [-- MODEL [CONTEXT [f32|f16]]]
//!
//! CONTEXT is the number of cached positions the rows attend over (100 by
//! default); the last argument is the K/V cache type.
use std::time::Instant;
use tandem_model::{ForwardOutput, LogitRows};

fn main() {
    // an empty MODEL ("") is the default model, so CONTEXT can follow it
    let name = std::env::args().nth(1).filter(|s| !s.is_empty()).map(std::path::PathBuf::from);
    let path = tandem_engine::fetch::resolve(name.as_deref(), true).expect("model");
    let ctx: usize = std::env::args().nth(2).map_or(100, |s| s.parse().expect("CONTEXT: a number"));
    let ty: tandem_model::KvType = std::env::args().nth(3).map_or(Ok(Default::default()), |s| s.parse()).expect("f32 or f16");
    let e = std::sync::Arc::new(tandem_engine::Engine::load(&path, 2).expect("load"));
    e.model.set_kv_type(ty);
    let mut out = ForwardOutput::default();
    let mut c = e.model.new_cache(ctx + 64);
    let prompt: Vec<u32> = (0..ctx as u32).map(|i| 100 + i % 1000).collect();
    e.model.forward(&e.pool, &mut c, &prompt, &LogitRows::None, &[], &mut out).unwrap();
    let mut base = 0.0;
    for w in [1, 2, 4, 8, 16] {
        let toks = vec![200u32; w];
        let mut best = f64::INFINITY;
        for _ in 0..20 {
            let t0 = Instant::now();
            e.model.forward(&e.pool, &mut c, &toks, &LogitRows::All, &[], &mut out).unwrap();
            best = best.min(t0.elapsed().as_secs_f64());
            c.truncate(ctx);
        }
        if w == 1 {
            base = best;
        }
        // the same width as one row of each of w sequences
        let mut caches: Vec<_> = (0..w).map(|_| c.clone()).collect();
        let mut multi = f64::INFINITY;
        for _ in 0..20 {
            let mut refs: Vec<&mut tandem_model::KvCache> = caches.iter_mut().collect();
            let t0 = Instant::now();
            e.model.forward_multi(&e.pool, &mut refs, &toks, &[], &mut out).unwrap();
            multi = multi.min(t0.elapsed().as_secs_f64());
            for c in caches.iter_mut() {
                c.truncate(ctx);
            }
        }
        println!(
            "width {w:2}: {:.2} ms ({:.2}x one row, {:.2} ms per row); as rows of {w} sequences {:.2} ms",
            best * 1e3,
            best / base,
            best * 1e3 / w as f64,
            multi * 1e3
        );
    }
}
