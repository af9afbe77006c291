//! Generating training data several answers at a time (`parallel`) must give
//! the same data as one at a time: each row of a multi-sequence forward has the
//! bits of decoding that sequence alone, and every sequence's sampling seed is
//! drawn in prompt order. The same holds for prompts written by the target.

use std::sync::Arc;

use tandem_engine::fetch::{ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::Engine;
use tandem_train::data::{target_prompts, Dataset, GenConfig};

#[test]
fn data_and_target_prompts_do_not_depend_on_parallel() {
    let path = ensure_model(&DEFAULT_MODEL, &models_dir(), false).expect("fetch the default model");
    let engine = Arc::new(Engine::load(path, 2).expect("load"));
    let p1 = target_prompts(&engine, 4, 7, 0.8, 1, &[]).unwrap();
    let p3 = target_prompts(&engine, 4, 7, 0.8, 3, &[]).unwrap();
    assert_eq!(p1, p3);
    assert_eq!(p1.len(), 4);
    let mut prompts = p1;
    prompts.push("Name three colours.".into());
    let gen = |parallel| {
        // half sampled, half greedy, short answers of different lengths
        let cfg = GenConfig { max_new: 12, sampled_share: 0.5, temp: 0.8, seed: 3, parallel };
        Dataset::generate(&engine, &prompts, &cfg).unwrap()
    };
    let (a, b) = (gen(1), gen(4));
    assert_eq!(a.seqs.len(), prompts.len());
    for (x, y) in a.seqs.iter().zip(&b.seqs) {
        assert_eq!((&x.tokens, &x.argmax, x.prompt_len), (&y.tokens, &y.argmax, y.prompt_len));
        assert!(x.hidden.iter().zip(&y.hidden).all(|(p, q)| p.to_bits() == q.to_bits()));
        assert!(x.tokens.len() > x.prompt_len);
    }
}

/// Prompts seeded with request openers start with one of them and, like the
/// unseeded ones, do not depend on `parallel`.
#[test]
fn opener_seeded_prompts_start_with_an_opener_and_do_not_depend_on_parallel() {
    let path = ensure_model(&DEFAULT_MODEL, &models_dir(), false).expect("fetch the default model");
    let engine = Arc::new(Engine::load(path, 2).expect("load"));
    let openers = tandem_train::corpus::REQUEST_OPENERS;
    let p1 = target_prompts(&engine, 4, 11, 0.8, 1, openers).unwrap();
    let p3 = target_prompts(&engine, 4, 11, 0.8, 3, openers).unwrap();
    assert_eq!(p1, p3);
    assert_eq!(p1.len(), 4);
    for p in &p1 {
        assert!(openers.iter().any(|o| p.starts_with(o)), "{p:?} starts with no opener");
    }
}
