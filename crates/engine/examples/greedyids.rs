//! Throwaway: greedy ids of the dev prompts (JSON lines).
use std::sync::Arc;
use tandem_engine::fetch::{ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::prompts::load_prompts;
use tandem_engine::{Engine, GenParams, Session};
fn main() {
    let file = std::env::args().nth(1).unwrap();
    let path = ensure_model(&DEFAULT_MODEL, &models_dir(), true).unwrap();
    let e = Arc::new(Engine::load(path, 2).unwrap());
    for p in load_prompts(&file).unwrap() {
        let ids = p.tokenize(&e).unwrap();
        let mut s = Session::new(e.clone(), 1024);
        let mut out = Vec::new();
        let params = GenParams { max_tokens: 128, sampler: Default::default() };
        s.generate(&ids, &params, None, |id, _| { if id != u32::MAX { out.push(id); } true }).unwrap();
        println!("{{\"id\":\"{}\",\"cat\":\"{}\",\"prompt\":{:?},\"gen\":{:?}}}", p.id, p.category, ids, out);
    }
}
