//! Throughput measurements: prefill and decode at context frontiers, and the cost
//! of evaluating a batch of W positions relative to one (what speculative
//! verification pays).

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tandem_model::LogitRows;

use tandem_engine::sampling::argmax;
use tandem_engine::{Engine, EngineError, Session};

#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    pub ctx_tokens: usize,
    pub prefill_tokens: usize,
    pub prefill_tps: f64,
    pub gen_tokens: usize,
    pub gen_tps: f64,
    pub kv_bytes: usize,
}

impl BenchRow {
    pub const CSV_HEADER: &'static str = "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kv_bytes";
    pub fn csv(&self) -> String {
        format!(
            "{},{},{:.2},{},{:.2},{}",
            self.ctx_tokens, self.prefill_tokens, self.prefill_tps, self.gen_tokens, self.gen_tps, self.kv_bytes
        )
    }
}

/// Deterministic pseudo-text token ids (avoids the special tokens at the start of the vocab).
pub fn synthetic_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = tandem_engine::sampling::Rng::new(seed);
    (0..n).map(|_| 100 + (rng.next_u64() % (vocab as u64 - 100)) as u32).collect()
}

/// Prefill `ctx_tokens` tokens from an empty cache, then decode `gen_tokens`
/// greedily (end-of-generation ignored). Best of `reps` runs for each phase.
pub fn bench_frontier(engine: &Arc<Engine>, ctx_tokens: usize, gen_tokens: usize, reps: usize) -> Result<BenchRow, EngineError> {
    let vocab = engine.model.cfg.vocab;
    let prompt = synthetic_tokens(ctx_tokens.max(1), vocab, 1);
    let mut s = Session::new(engine.clone(), ctx_tokens.max(1) + gen_tokens + 1);
    let (mut best_pp, mut best_tg) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps.max(1) {
        s.reset();
        let t0 = Instant::now();
        s.feed(&prompt)?;
        best_pp = best_pp.min(t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        for _ in 0..gen_tokens {
            let next = argmax(s.logits());
            s.feed(&[next])?;
        }
        best_tg = best_tg.min(t1.elapsed().as_secs_f64());
    }
    Ok(BenchRow {
        ctx_tokens,
        prefill_tokens: prompt.len(),
        prefill_tps: prompt.len() as f64 / best_pp,
        gen_tokens,
        gen_tps: gen_tokens as f64 / best_tg,
        kv_bytes: s.cache.bytes_used(),
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct BatchCost {
    pub width: usize,
    /// Median seconds of one forward call of `width` positions (logits for all rows).
    pub seconds: f64,
    /// `seconds` divided by the width-1 time.
    pub ratio: f64,
}

/// Time one forward of W positions (all rows' logits, as a verifier needs) at a
/// context of `ctx` tokens, for each W in `widths`; the cache is truncated back
/// after every call so each measures the same state.
pub fn batch_costs(engine: &Arc<Engine>, ctx: usize, widths: &[usize], reps: usize) -> Result<Vec<BatchCost>, EngineError> {
    let vocab = engine.model.cfg.vocab;
    let maxw = widths.iter().copied().max().unwrap_or(1);
    let mut s = Session::new(engine.clone(), ctx + maxw + 1);
    s.feed(&synthetic_tokens(ctx.max(1), vocab, 2))?;
    let base = s.tokens.len();
    let extra = synthetic_tokens(maxw, vocab, 3);
    let mut out = tandem_model::ForwardOutput::default();
    let mut res = Vec::new();
    for &w in widths {
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            let t0 = Instant::now();
            engine.model.forward(&engine.pool, &mut s.cache, &extra[..w], &LogitRows::All, &[], &mut out)?;
            times.push(t0.elapsed().as_secs_f64());
            s.cache.truncate(base);
        }
        times.sort_by(f64::total_cmp);
        res.push(BatchCost { width: w, seconds: times[times.len() / 2], ratio: 0.0 });
    }
    let one = res.iter().find(|c| c.width == 1).map(|c| c.seconds).unwrap_or(res[0].seconds);
    for c in &mut res {
        c.ratio = c.seconds / one;
    }
    Ok(res)
}
