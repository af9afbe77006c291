//! Engine behaviour on the default model: batch invariance of real forward
//! passes across thread counts, seeded sampling, prefix reuse and errors.

mod common;

use tandem_engine::{GenParams, SamplerParams, Session};
use tandem_model::{ForwardOutput, LogitRows};

#[test]
fn verify_rows_equal_decode_steps_on_real_model() {
    for threads in [1, 2] {
        let e = common::engine(threads);
        let prompt = e.tokenize_prompt("The quick brown fox jumps over the lazy dog. It");
        let extra = [253u32, 1345, 30, 1073, 314, 3, 198, 2];
        let mut a = e.model.new_cache(256);
        let mut out = ForwardOutput::default();
        e.model.forward(&e.pool, &mut a, &prompt, &LogitRows::None, &[], &mut out).unwrap();
        let mut b = a.clone();
        e.model.forward(&e.pool, &mut a, &extra, &LogitRows::All, &[], &mut out).unwrap();
        let v = e.model.cfg.vocab;
        let mut one = ForwardOutput::default();
        for (i, t) in extra.iter().enumerate() {
            e.model.forward(&e.pool, &mut b, &[*t], &LogitRows::Last, &[], &mut one).unwrap();
            let same = out.logits[i * v..(i + 1) * v].iter().zip(&one.logits).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "row {i} differs from the single step (threads {threads})");
        }
    }
}

#[test]
fn thread_count_does_not_change_logits() {
    let prompt_text = "Explain photosynthesis in one sentence.";
    let mut results = Vec::new();
    for threads in [1, 2, 3] {
        let e = common::engine(threads);
        let mut s = Session::new(e.clone(), 256);
        s.feed(&e.tokenize_prompt(prompt_text)).unwrap();
        results.push(s.logits().iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn seeded_sampling_is_reproducible_and_prefix_is_reused() {
    let e = common::engine(2);
    let prompt = e.tokenize_prompt(&e.render_chat(&[tandem_tokenizer::ChatMessage::new("user", "Tell me a joke.")]).unwrap());
    let p = GenParams { max_tokens: 24, sampler: SamplerParams { temperature: 0.9, top_k: 40, top_p: 0.95, min_p: 0.05, seed: 1234 } };
    let run = |s: &mut Session| {
        let mut ids = vec![];
        let st = s.generate(&prompt, &p, None, |id, _| {
            ids.push(id);
            true
        });
        (ids, st.unwrap())
    };
    let mut s = Session::new(e.clone(), 512);
    let (a, st1) = run(&mut s);
    let (b, st2) = run(&mut s);
    assert_eq!(a, b);
    assert_eq!(st1.prefill_tokens, prompt.len());
    assert!(st2.prefill_tokens <= 1, "second run reuses the cached prompt (evaluated {})", st2.prefill_tokens);
}

#[test]
fn over_long_prompt_is_an_error() {
    let e = common::engine(1);
    let mut s = Session::new(e.clone(), 16);
    let prompt: Vec<u32> = (0..40).map(|i| 300 + i).collect();
    let err = s.generate(&prompt, &GenParams { max_tokens: 4, sampler: SamplerParams::greedy() }, None, |_, _| true);
    assert!(matches!(err, Err(tandem_engine::EngineError::PromptTooLong { prompt: 40, ctx: 16 })), "{err:?}");
}
