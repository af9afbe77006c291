//! What suffix speculation costs outside the forward passes, on real text:
//! Python standard library sources tokenized by the default model's
//! tokenizer stand in for outputs. Measures, with the global cache at its
//! default bound (so evictions run):
//!
//! - appending committed tokens to the global cache (per token, in commits
//!   of a few tokens as a speculative cycle makes them);
//! - a proposal (matching in both trees and walking);
//! - taking in a 2,000-token prompt at the start of a generation.
//!
//! usage: cargo run --release -p tandem-engine --example suffix-cost [-- MODEL]

use std::path::PathBuf;
use std::time::Instant;

use tandem_engine::{Engine, SUFFIX_DEFAULT_CACHE_TOKENS};
use tandem_speculative::{FreeDraft, FreeSource, SuffixDrafter, SuffixOptions};

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args().nth(1).map(PathBuf::from);
    let path = tandem_engine::fetch::resolve(model.as_deref(), true)?;
    let engine = Engine::load(&path, 1)?;
    let stdlib = PathBuf::from(
        std::process::Command::new("python3")
            .args(["-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"])
            .output()?
            .stdout
            .iter()
            .map(|&b| b as char)
            .collect::<String>()
            .trim(),
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(&stdlib)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "py"));
    files.sort();
    let mut text = Vec::new();
    for f in &files {
        text.extend(engine.tokenizer.encode(&std::fs::read_to_string(f).unwrap_or_default(), false));
        // enough outputs (a fifth of the text) to fill the cache and evict from it
        if text.len() > 8 * SUFFIX_DEFAULT_CACHE_TOKENS {
            break;
        }
    }
    let cache = engine.suffix_cache(None, SUFFIX_DEFAULT_CACHE_TOKENS)?;
    let mut d = SuffixDrafter::new(cache.clone(), SuffixOptions::default())?;
    println!(
        "{} tokens of {} ({} files), cache bound {} tokens, tree depth {}",
        text.len(),
        stdlib.display(),
        files.len(),
        cache.capacity(),
        cache.depth()
    );

    // outputs of 512 tokens after prompts of 2,000; commits of 3 tokens
    let (prompt_len, out_len, commit) = (2000, 512, 3);
    let (mut begin, mut append, mut propose) = (Vec::new(), Vec::new(), Vec::new());
    let mut draft = FreeDraft::default();
    let mut proposed = 0usize;
    let mut at = 0;
    while at + prompt_len + out_len < text.len() {
        let seq = &text[at..at + prompt_len + out_len];
        let t0 = Instant::now();
        d.begin(&seq[..prompt_len])?;
        begin.push(t0.elapsed().as_secs_f64());
        let mut len = prompt_len;
        while len + commit < seq.len() {
            let t0 = Instant::now();
            d.propose(&seq[..len], seq[len], 16, &mut draft)?;
            propose.push(t0.elapsed().as_secs_f64());
            proposed += draft.tokens.len();
            len += commit;
            let t0 = Instant::now();
            d.sync(&seq[..len])?;
            append.push(t0.elapsed().as_secs_f64() / commit as f64);
        }
        at += prompt_len + out_len;
    }
    let us = |v: &mut Vec<f64>, p: f64| percentile(v, p) * 1e6;
    println!("| step | median µs | p99 µs | max µs | count |\n|---|---:|---:|---:|---:|");
    for (name, v) in
        [("append one committed token", &mut append), ("proposal", &mut propose), ("begin on a 2,000-token prompt", &mut begin)]
    {
        println!("| {name} | {:.2} | {:.2} | {:.2} | {} |", us(v, 0.5), us(v, 0.99), us(v, 1.0), v.len());
    }
    println!(
        "cache after the run: {} tokens, {} sequences, {} nodes, {:.1} MiB; mean proposal {:.1} tokens",
        cache.tokens(),
        cache.sequences(),
        cache.nodes(),
        cache.bytes() as f64 / (1 << 20) as f64,
        proposed as f64 / propose.len() as f64
    );
    Ok(())
}
