//! `tandem bench` and `tandem perplexity`.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use tandem_engine::bench::{batch_costs, bench_frontier, BenchRow};
use tandem_engine::perplexity::perplexity;

use crate::args::{BenchArgs, PerplexityArgs};

pub fn run(a: &BenchArgs) -> Result<()> {
    let engine = crate::load_engine(&a.model)?;
    // warm up: page in the weights, spin up the pool
    bench_frontier(&engine, 8, 4, 1)?;
    let mut rows = Vec::new();
    if !a.json {
        println!("{}", BenchRow::CSV_HEADER);
    }
    for &c in &a.ctx {
        let r = bench_frontier(&engine, c, a.gen, a.reps)?;
        if !a.json {
            println!("{}", r.csv());
        } else {
            eprintln!("{}", r.csv());
        }
        rows.push(r);
    }
    let costs = batch_costs(&engine, 128, &a.widths, 7 * a.reps.max(1))?;
    for c in &costs {
        eprintln!("batch width {:>2}: {:.3} ms ({:.2}x one row)", c.width, c.seconds * 1e3, c.ratio);
    }
    if a.json {
        let summary = serde_json::json!({
            "model": engine.model.cfg.arch,
            "threads": engine.pool.threads(),
            "simd": format!("{:?}", tandem_kernels::simd_level()),
            "frontiers": rows,
            "batch_costs_at_ctx128": costs,
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
    }
    Ok(())
}

pub fn perplexity_cmd(a: &PerplexityArgs) -> Result<()> {
    let engine = crate::load_engine(&a.model)?;
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let pb = ProgressBar::new(0);
    pb.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} chunks {msg} [{elapsed_precise}<{eta_precise}]").unwrap());
    let r = perplexity(&engine, &text, a.ctx, |done, total, ppl| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
        pb.set_message(format!("ppl {ppl:.4}"));
    })?;
    pb.finish_and_clear();
    eprintln!(
        "{} tokens, {} chunks of {}, {} scored, {:.1} s; running: {}",
        r.tokens,
        r.chunks,
        a.ctx,
        r.scored,
        r.seconds,
        r.running.iter().map(|p| format!("{p:.4}")).collect::<Vec<_>>().join(" ")
    );
    println!("perplexity = {:.4} +/- {:.4}", r.ppl, r.ppl_stderr);
    Ok(())
}

