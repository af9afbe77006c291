//! `tandem verify-spec`: speculative generation replayed through plain decoding.

use anyhow::{bail, Result};
use tandem_engine::sampling::argmax;
use tandem_engine::{GenParams, SamplerParams, Session};
use tandem_tokenizer::ChatMessage;

use crate::args::VerifySpecArgs;

pub fn run(a: &VerifySpecArgs) -> Result<()> {
    let engine = crate::load_engine(&a.model)?;
    let ctx = engine.model.cfg.ctx_train;
    let Some(mut spec) = engine.speculator(&a.spec.options(&engine)?, ctx)? else {
        bail!("verify-spec needs a drafter: --lookup or --draft-model FILE");
    };
    let text = if a.raw { a.prompt.clone() } else { engine.render_chat(&[ChatMessage::new("user", a.prompt.clone())])? };
    let prompt = engine.tokenize_prompt(&text);
    let params = GenParams { max_tokens: a.n_predict, sampler: SamplerParams::greedy() };
    let mut s = Session::new(engine.clone(), ctx);
    let (mut toks, mut traced) = (Vec::new(), Vec::new());
    s.generate_with_logits(&prompt, &params, Some(&mut spec), None, |id, _, row| {
        if id != u32::MAX {
            toks.push(id);
            traced.push(row.to_vec());
        }
        true
    })?;
    // replay with plain decoding
    let mut p = Session::new(engine.clone(), ctx);
    p.feed(&prompt)?;
    let mut first_div = None;
    let (mut max_diff, mut rows_differ) = (0f32, 0usize);
    for (i, &t) in toks.iter().enumerate() {
        let plain = p.logits().to_vec();
        if let Some(row) = traced.get(i) {
            let d = row.iter().zip(&plain).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            if row.iter().zip(&plain).any(|(x, y)| x.to_bits() != y.to_bits()) {
                rows_differ += 1;
            }
            max_diff = max_diff.max(d);
        }
        let want = argmax(&plain);
        if want != t && first_div.is_none() {
            first_div = Some((i, t, want));
        }
        p.feed(&[t])?;
    }
    eprintln!("{}", spec.stats.report());
    println!("tokens compared: {}", toks.len());
    println!("logit rows that differ in any bit: {rows_differ}; max |Δ logit| {max_diff:e}");
    match first_div {
        None => println!("no divergence: speculative output equals plain greedy decoding"),
        Some((i, got, want)) => {
            println!("FIRST DIVERGENCE at generated token {i}: speculative {got}, plain {want}");
            std::process::exit(2);
        }
    }
    Ok(())
}
