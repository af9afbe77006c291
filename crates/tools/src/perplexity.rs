//! Perplexity with llama.cpp's chunked method: split the tokenized text into
//! `n_ctx` chunks, evaluate each from an empty cache, and score the second half
//! of every chunk (positions n_ctx/2 .. n_ctx-1 predict the next token).
//! A model that adds BOS gets it in front of the text and as every chunk's
//! first token.

use std::sync::Arc;

use tandem_model::{ForwardOutput, LogitRows};

use tandem_engine::{Engine, EngineError};

#[derive(Debug, Clone)]
pub struct PerplexityReport {
    pub tokens: usize,
    pub chunks: usize,
    pub scored: usize,
    pub ppl: f64,
    /// Standard error of the perplexity estimate (delta method, as llama.cpp).
    pub ppl_stderr: f64,
    pub running: Vec<f64>,
    pub seconds: f64,
}

pub fn perplexity(
    engine: &Arc<Engine>,
    text: &str,
    n_ctx: usize,
    mut on_chunk: impl FnMut(usize, usize, f64),
) -> Result<PerplexityReport, EngineError> {
    // as llama.cpp: the text tokenized with BOS where the model adds one,
    // and each chunk's first token replaced by BOS
    let bos = engine.tokenizer.bos_id().filter(|_| engine.tokenizer.add_bos());
    let mut ids: Vec<u32> = bos.into_iter().collect();
    ids.extend(engine.tokenizer.encode(text, false));
    let chunks = ids.len() / n_ctx;
    if chunks == 0 {
        return Err(EngineError::PromptTooLong { prompt: ids.len(), ctx: n_ctx });
    }
    let t0 = std::time::Instant::now();
    let first = n_ctx / 2;
    let (mut nll, mut nll2, mut cnt) = (0f64, 0f64, 0usize);
    let mut running = Vec::new();
    let mut out = ForwardOutput::default();
    let mut cache = engine.model.new_cache(n_ctx);
    for c in 0..chunks {
        let mut chunk = ids[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        let chunk = &chunk[..];
        cache.clear();
        let rows: Vec<usize> = (first..n_ctx - 1).collect();
        engine.model.forward(&engine.pool, &mut cache, chunk, &LogitRows::Rows(rows.clone()), &[], &mut out)?;
        for (j, &i) in rows.iter().enumerate() {
            let l = out.logits_row(j);
            let mx = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = mx as f64 + l.iter().map(|&x| ((x - mx) as f64).exp()).sum::<f64>().ln();
            let v = lse - l[chunk[i + 1] as usize] as f64;
            nll += v;
            nll2 += v * v;
            cnt += 1;
        }
        let ppl = (nll / cnt as f64).exp();
        running.push(ppl);
        on_chunk(c + 1, chunks, ppl);
    }
    let mean = nll / cnt as f64;
    let var = (nll2 / cnt as f64 - mean * mean).max(0.0);
    let ppl = mean.exp();
    let ppl_stderr = ppl * (var / (cnt as f64 - 1.0).max(1.0)).sqrt();
    Ok(PerplexityReport { tokens: ids.len(), chunks, scored: cnt, ppl, ppl_stderr, running, seconds: t0.elapsed().as_secs_f64() })
}
