//! How often the MTP copy hint (`tandem_model::mtp::copy_hint`) names the
//! target's next greedy token, per matched suffix length and category, on a
//! prompt file: what a head with copy hints can learn from (BENCHMARKS.md §6n).
//!
//! For every generated position q ≥ 1 (the head drafts t[q+1] from the text
//! t[..=q]) the hint over t[..=q] is compared with t[q+1].
//!
//! Given an MTP support file with a reduced draft vocabulary, it also counts
//! the positions whose token the head cannot draft (outside that vocabulary),
//! and how many of those the hint names.
//!
//! cargo run --release -p tandem-engine --example copyhints -- ../shared/bench/prompts-dev.jsonl [n_predict] [nmax] [MTP.gguf]

use std::collections::BTreeMap;
use std::sync::Arc;

use tandem_engine::fetch::{ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::prompts::load_prompts;
use tandem_engine::{Engine, GenParams, Session};
use tandem_model::mtp::copy_hint;

fn main() {
    let mut args = std::env::args().skip(1);
    let file = args.next().expect("usage: copyhints PROMPTS.jsonl [n_predict] [nmax]");
    let n_predict: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(128);
    let nmax: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(4);
    let support = args.next();
    let path = ensure_model(&DEFAULT_MODEL, &models_dir(), true).unwrap();
    let e = Arc::new(Engine::load(path, 2).unwrap());
    // target id → inside the draft vocabulary
    let in_vocab: Option<Vec<bool>> = support.map(|f| {
        let g = tandem_gguf::Gguf::open(&f).unwrap();
        let w = tandem_model::mtp::MtpWeights::from_gguf(&g, &e.model.cfg).unwrap();
        let mut v = vec![w.d2t.is_none(); e.model.cfg.vocab];
        for &t in w.d2t.iter().flatten() {
            v[t as usize] = true;
        }
        v
    });
    // category → (positions, outside the draft vocabulary, of those named by the hint)
    let mut oov: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    // category → per n: (positions, hint right)
    let mut stats: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for p in load_prompts(&file).unwrap() {
        let prompt = p.tokenize(&e).unwrap();
        let mut s = Session::new(e.clone(), prompt.len() + n_predict + 8);
        let mut text = prompt.clone();
        let params = GenParams { max_tokens: n_predict, sampler: Default::default() };
        s.generate(&prompt, &params, None, |id, _| {
            if id != u32::MAX {
                text.push(id);
            }
            true
        })
        .unwrap();
        for q in prompt.len()..text.len() - 1 {
            let (hint, n) = copy_hint(&text[..=q], nmax);
            let right = hint == Some(text[q + 1]);
            for cat in [p.category.clone(), "all".into()] {
                let v = stats.entry(cat.clone()).or_insert_with(|| vec![(0, 0); nmax + 1]);
                v[n].0 += 1;
                v[n].1 += right as u64;
                if let Some(iv) = &in_vocab {
                    let o = oov.entry(cat).or_default();
                    o.0 += 1;
                    if !iv[text[q + 1] as usize] {
                        o.1 += 1;
                        o.2 += right as u64;
                    }
                }
            }
        }
    }
    println!("category    positions   hint found   right when found   by suffix length n: positions (right)");
    for (cat, v) in &stats {
        let total: u64 = v.iter().map(|x| x.0).sum();
        let found: u64 = v[1..].iter().map(|x| x.0).sum();
        let right: u64 = v[1..].iter().map(|x| x.1).sum();
        let by_n: Vec<String> =
            (1..=nmax).map(|n| format!("{n}: {} ({:.0}%)", v[n].0, 100.0 * v[n].1 as f64 / v[n].0.max(1) as f64)).collect();
        println!(
            "{cat:<10} {total:>10} {:>11.1}% {:>17.1}%   {}",
            100.0 * found as f64 / total.max(1) as f64,
            100.0 * right as f64 / found.max(1) as f64,
            by_n.join(", ")
        );
    }
    if !oov.is_empty() {
        println!("\ncategory    positions   outside the draft vocabulary   of those, named by the hint");
        for (cat, (n, out, named)) in &oov {
            println!(
                "{cat:<10} {n:>10} {out:>10} ({:.1}%) {named:>24} ({:.1}% of all)",
                100.0 * *out as f64 / *n as f64,
                100.0 * *named as f64 / *n as f64
            );
        }
    }
}
