#![allow(dead_code)]
//! Shared helpers for tests that run the default model.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use tandem_engine::fetch::{ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::Engine;

/// The reference data tests read (tests/data; its README says where each file comes from).
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data")
}

/// The default model, fetched on first use (tests work on a fresh machine).
pub fn model_path() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| ensure_model(&DEFAULT_MODEL, &models_dir(), false).expect("fetch the default model")).clone()
}

/// The committed MTP head for the default model.
pub fn mtp_head_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/support/smollm2-135m-instruct-mtp.gguf")
}

/// The committed DSpark drafter for the default model.
pub fn dspark_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/support/smollm2-135m-instruct-dspark.gguf")
}

pub fn engine(threads: usize) -> Arc<Engine> {
    Arc::new(Engine::load(model_path(), threads).expect("load default model"))
}

pub fn read_jsonl(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v.get("_about").is_none())
        .collect()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn slow_tests() -> bool {
    std::env::var("TANDEM_SLOW_TESTS").map(|v| v == "1").unwrap_or(false)
}

/// Re-write a GGUF image, letting `f` edit the metadata and tensor list.
pub fn rewrite(bytes: &[u8], f: impl FnOnce(&mut Vec<(String, tandem_gguf::Value)>, &mut Vec<tandem_gguf::TensorData>)) -> Vec<u8> {
    tandem_gguf::rewrite(bytes, f).unwrap()
}

/// Every token a fresh session of `ctx` positions emits for `prompt` under
/// `params`, with the speculator if one is given.
pub fn generate(
    engine: &Arc<Engine>,
    ctx: usize,
    prompt: &[u32],
    params: &tandem_engine::GenParams,
    sp: Option<&mut tandem_engine::Speculator>,
) -> Vec<u32> {
    let mut s = tandem_engine::Session::new(engine.clone(), ctx);
    let mut out = vec![];
    s.generate_with(prompt, params, sp, None, |t, _| {
        out.push(t);
        true
    })
    .unwrap();
    out
}

/// Write `bytes` to `path` under a private name, then rename it into place.
/// Loaders map their files: a test that rewrote a file in place (truncate,
/// then write) while another test thread still had it mapped killed the
/// whole test process with SIGBUS. A rename leaves the mapped file intact.
pub fn write_atomically(path: &std::path::Path, bytes: &[u8]) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().expect("a file name").to_os_string();
    name.push(format!(".{}-{n}.tmp", std::process::id()));
    let tmp = path.with_file_name(name);
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
