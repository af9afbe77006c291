//! Perplexity within 1% of llama.cpp's figure on the same text and context:
//! SmolLM2 on the shared GPL text, Qwen2.5-Coder on a Python source, Gemma 3
//! on the Apache 2.0 license text (reference figures in tests/data). All are
//! ignored by default (about 30 s, and downloads of 491 and 253 MB);
//! `.ci/run` runs them.

use std::path::PathBuf;
use std::sync::Arc;

use tandem_engine::fetch::{ensure_model, models_dir, ModelSpec, DEFAULT_MODEL, GEMMA3_270M, QWEN25_CODER_05B};
use tandem_engine::Engine;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data").join(name)
}

fn engine(spec: &ModelSpec) -> Arc<Engine> {
    let path = ensure_model(spec, &models_dir(), false).unwrap_or_else(|e| panic!("fetch {}: {e}", spec.name));
    Arc::new(Engine::load(path, 2).expect("load the model"))
}

/// Perplexity of `spec` on the text its reference names, against llama.cpp's.
fn check(spec: &ModelSpec, reference: &str) {
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(data(reference)).unwrap()).unwrap();
    let text = std::fs::read_to_string(data(meta["text_file"].as_str().unwrap())).unwrap();
    let n_ctx = meta["n_ctx"].as_u64().unwrap_or(512) as usize;
    let r = tandem_tools::perplexity::perplexity(&engine(spec), &text, n_ctx, |_, _, _| {}).unwrap();
    let want = meta["ppl"].as_f64().unwrap();
    println!("{}: {} tokens, {} chunks, ppl {:.4} against llama.cpp's {want}", spec.name, r.tokens, r.chunks, r.ppl);
    if let Some(n) = meta["tokens_in_text"].as_u64() {
        assert_eq!(r.tokens as u64, n, "tokens in the text");
    }
    assert!((r.ppl / want - 1.0).abs() < 0.01, "ppl {} vs llama.cpp {want}", r.ppl);
}

#[test]
#[ignore = "slow: about 30 s on two cores"]
fn smollm2_perplexity_within_one_percent_of_llamacpp() {
    check(&DEFAULT_MODEL, "perplexity_smollm2.json");
}

#[test]
#[ignore = "fetches and runs the 491 MB coder model"]
fn qwen25_coder_perplexity_within_one_percent_of_llamacpp() {
    check(&QWEN25_CODER_05B, "perplexity_qwen25coder.json");
}

#[test]
#[ignore = "fetches and runs the 253 MB Gemma 3 model"]
fn gemma3_perplexity_within_one_percent_of_llamacpp() {
    check(&GEMMA3_270M, "perplexity_gemma3.json");
}
