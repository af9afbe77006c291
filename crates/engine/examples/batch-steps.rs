//! Wall time of Batch steps against the time of their forwards, with n
//! sequences decoding together: what a step costs outside the model.
//!
//!     cargo run --release -p tandem-engine --example batch-steps [-- MODEL]
use std::time::Instant;
use tandem_engine::{Batch, BatchConfig, GenParams, Request, SamplerParams, SpecOptions};

fn main() {
    let name = std::env::args().nth(1).map(std::path::PathBuf::from);
    let path = tandem_engine::fetch::resolve(name.as_deref(), true).expect("model");
    let e = std::sync::Arc::new(tandem_engine::Engine::load(&path, 2).expect("load"));
    for n in [1, 2, 4, 8] {
        let cfg = BatchConfig { slots: n, ctx: 1024, prefill_chunk: 64, kv_budget: 1 << 30 };
        let mut b = Batch::new(e.clone(), cfg, &SpecOptions::default()).unwrap();
        for j in 0..n {
            let msg = tandem_tokenizer::ChatMessage::new("user", format!("Write a long story number {j} about a cat."));
            let p = e.tokenize_prompt(&e.render_chat(&[msg]).unwrap());
            b.admit(Request { prompt: p, params: GenParams { max_tokens: 150, sampler: SamplerParams::greedy() }, with_rows: false })
                .unwrap();
        }
        let (mut wall, mut fwd, mut steps, mut toks) = (0.0, 0.0, 0, 0);
        while !b.is_idle() {
            let t0 = Instant::now();
            let r = b.step(&mut |_, ev| {
                if let tandem_engine::SlotEvent::Token { .. } = ev {
                    toks += 1;
                }
                true
            });
            if r.prefill_rows == 0 && r.rows > 0 {
                wall += t0.elapsed().as_secs_f64();
                fwd += r.secs;
                steps += 1;
            }
        }
        println!(
            "{n} sequences: {steps} decode steps, {:.2} ms per step, {:.2} ms of it the forward; {:.0} tok/s",
            wall / steps as f64 * 1e3,
            fwd / steps as f64 * 1e3,
            toks as f64 / wall
        );
    }
}
