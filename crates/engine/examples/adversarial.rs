//! Worst case for the scheduler: a drafter whose every proposal is wrong.
//! Measures plain vs speculative decode tok/s in one run (alternating, best of
//! several repetitions) on the default model.
//!
//! cargo run --release -p tandem-engine --example adversarial -- [threads] [tokens] [reps]

use std::sync::Arc;
use std::time::Instant;

use tandem_engine::fetch::{ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::{Engine, GenParams, SamplerParams, Session};
use tandem_speculative::drafter::{Drafter, Proposal};
use tandem_speculative::sampling::{Rng, SamplerParams as Sp};
use tandem_speculative::{SpecConfig, SpecError, Speculator};
use tandem_tokenizer::ChatMessage;

/// Proposes tokens that are never the target's choice (a rarely used id).
struct AlwaysWrong;

impl Drafter for AlwaysWrong {
    fn name(&self) -> String {
        "always-wrong".into()
    }
    fn max_draft(&self) -> usize {
        8
    }
    fn sync(&mut self, _h: &[u32]) -> Result<(), SpecError> {
        Ok(())
    }
    fn propose(&mut self, _h: &[u32], _n: u32, max: usize, _p: &Sp, _r: &mut Rng, out: &mut Proposal) -> Result<(), SpecError> {
        out.clear();
        out.tokens.extend(std::iter::repeat_n(49000u32, max));
        Ok(())
    }
}

fn main() {
    let arg = |i: usize, d: usize| std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (threads, n, reps) = (arg(1, 2), arg(2, 256), arg(3, 5));
    let path = ensure_model(&DEFAULT_MODEL, &models_dir(), true).unwrap();
    let e = Arc::new(Engine::load(path, threads).unwrap());
    let text = e.render_chat(&[ChatMessage::new("user", "Write a long story about a lighthouse keeper.")]).unwrap();
    let prompt = e.tokenize_prompt(&text);
    let params = GenParams { max_tokens: n, sampler: SamplerParams::greedy() };
    let mut sp = Speculator::new(Box::new(AlwaysWrong), SpecConfig::default()).unwrap();
    let run = |spec: Option<&mut Speculator>| {
        let mut s = Session::new(e.clone(), 2048);
        s.feed(&prompt).unwrap();
        let t0 = Instant::now();
        let st = s.generate_with(&prompt, &params, spec, None, |_, _| true).unwrap();
        (st.gen_tokens as f64 / t0.elapsed().as_secs_f64(), st.gen_tokens)
    };
    let (mut best_p, mut best_s) = (0f64, 0f64);
    for _ in 0..reps {
        let (p, np) = run(None);
        let (s, ns) = run(Some(&mut sp));
        assert_eq!(np, ns);
        best_p = best_p.max(p);
        best_s = best_s.max(s);
    }
    println!(
        "threads {threads}, {n} tokens, best of {reps}: plain {best_p:.2} tok/s, always-wrong drafter {best_s:.2} tok/s, ratio {:.4}",
        best_s / best_p
    );
    println!("{}", sp.stats.report());
}
