//! The prompts of held-out sequences, as a prompt file for `tandem bench`:
//! decoding measured on prompts the drafter never trained on but drawn
//! like its training prompts, to set against the trainer's held-out walk
//! (docs/experiments/004-scheduler.md §7l). Sequences are numbered over the token files in the
//! order given (as `--data` then `--also-data`), split as the trainers split
//! them; every k-th held-out sequence is taken so the files are covered.
//! Each prompt is written raw (chat template included, special tokens as
//! text); its id names the sequence and its prompt length in tokens.
//!
//! cargo run --release -p tandem-train --example heldout_prompts -- N SEED HOLDOUT FILE.tokens.gz... > heldout.jsonl

use std::path::Path;

use tandem_engine::fetch::{ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::Engine;
use tandem_train::corpus::split_ids;
use tandem_train::data::TokenFile;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        anyhow::bail!("usage: heldout_prompts N SEED HOLDOUT FILE.tokens.gz...");
    }
    let n: usize = args[0].parse()?;
    let seed: u64 = args[1].parse()?;
    let holdout: f32 = args[2].parse()?;
    let mut seqs = Vec::new();
    for f in &args[3..] {
        let stem = Path::new(f).file_name().unwrap_or_default().to_string_lossy().trim_end_matches(".tokens.gz").to_string();
        for s in TokenFile::load(Path::new(f))?.seqs {
            seqs.push((stem.clone(), s));
        }
    }
    let (_, held, _) = split_ids(seqs.len(), seed, holdout);
    let engine = Engine::load(ensure_model(&DEFAULT_MODEL, &models_dir(), true)?, 1)?;
    let step = (held.len() / n.max(1)).max(1);
    for &i in held.iter().step_by(step).take(n) {
        let (file, (toks, prompt_len)) = &seqs[i];
        let raw = engine.tokenizer.decode_special(&toks[..*prompt_len]);
        let line = serde_json::json!({ "id": format!("h{i}-p{prompt_len}"), "category": file, "raw": raw });
        println!("{line}");
    }
    eprintln!("{} sequences, {} held out, {} written (every {step}th)", seqs.len(), held.len(), n.min(held.len().div_ceil(step)));
    Ok(())
}
