//! Perplexity on the shared text at context 512 must be within 1% of
//! llama.cpp's figure (tests/data/perplexity_smollm2.json).
//! Slow (~30 s on two cores): runs with TANDEM_SLOW_TESTS=1.

mod common;

#[test]
fn perplexity_within_one_percent_of_llamacpp() {
    if !common::slow_tests() {
        eprintln!("SKIP: set TANDEM_SLOW_TESTS=1 to run the perplexity test");
        return;
    }
    let dir = common::data_dir();
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("perplexity_smollm2.json")).unwrap()).unwrap();
    let text = std::fs::read_to_string(dir.join(meta["text_file"].as_str().unwrap())).unwrap();
    let n_ctx = meta["n_ctx"].as_u64().unwrap() as usize;
    let engine = common::engine(2);
    let r = tandem_engine::perplexity::perplexity(&engine, &text, n_ctx, |_, _, _| {}).unwrap();
    let want = meta["ppl"].as_f64().unwrap();
    println!("tokens {} (llama.cpp {}), chunks {}, ppl {:.4} vs llama.cpp {want}", r.tokens, meta["tokens_in_text"], r.chunks, r.ppl);
    assert_eq!(r.tokens as u64, meta["tokens_in_text"].as_u64().unwrap());
    assert!((r.ppl / want - 1.0).abs() < 0.01, "ppl {} vs {want}", r.ppl);
}
