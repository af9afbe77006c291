//! `tandem bench` and `tandem perplexity`.

use std::path::Path;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use tandem_tools::bench::{batch_costs, bench_frontier, BenchRow};
use tandem_tools::perplexity::perplexity;
use tandem_tools::prompt_bench::{load_prompts, run_prompt_bench, PromptBenchReport, RoundsReport};

use crate::args::{BenchArgs, PerplexityArgs};

pub fn run(a: &BenchArgs) -> Result<()> {
    if let Some(path) = &a.prompts {
        return run_prompts(a, path);
    }
    let engine = crate::load_engine(&a.model)?;
    // warm up: page in the weights, spin up the pool, and decode long enough
    // (about a second) that the first frontier is not measured colder than
    // the rest: with 4 tokens the first frontier read ~10% slow
    bench_frontier(&engine, 8, 128, 1)?;
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
            "vnni": tandem_kernels::vnni(),
            "wide512": tandem_kernels::wide(),
            "wide512_min_rows": tandem_kernels::wide_min_rows(),
            "frontiers": rows,
            "batch_costs_at_ctx128": costs,
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
    }
    Ok(())
}

/// `tandem bench --prompts FILE`: plain vs speculative decoding per prompt.
fn run_prompts(a: &BenchArgs, path: &Path) -> Result<()> {
    let prompts = load_prompts(path)?;
    let engine = crate::load_engine(&a.model)?;
    let opts = a.spec.options(&engine)?;
    let model = crate::model_path(&a.model)?.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    if !opts.enabled() {
        eprintln!("no drafter (--lookup, --draft-model or --mtp): measuring plain decoding only");
    }
    let rounds = a.rounds as usize;
    eprintln!(
        "{} prompts from {}, {} tokens each, greedy{}",
        prompts.len(),
        path.display(),
        a.n_predict,
        if rounds > 1 { format!(", {rounds} rounds") } else { String::new() }
    );
    let mut reports = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let pb = ProgressBar::new(prompts.len() as u64);
        pb.set_style(ProgressStyle::with_template("{prefix}{bar:30} {pos}/{len} prompts {msg} [{elapsed_precise}<{eta_precise}]").unwrap());
        if rounds > 1 {
            pb.set_prefix(format!("round {}/{rounds} ", round + 1));
        }
        let report = run_prompt_bench(&engine, &prompts, a.n_predict, &opts, None, round, |i, _, r| {
            pb.set_position(i as u64 + 1);
            let spd = r.speedup.map(|x| format!(" {x:.2}x")).unwrap_or_default();
            pb.set_message(format!("{}{spd}", r.id));
            if r.identical == Some(false) {
                pb.suspend(|| {
                    eprintln!("MISMATCH: prompt {} speculative output differs from plain at token {}", r.id, r.first_mismatch.unwrap_or(0))
                });
            }
        })?;
        pb.finish_and_clear();
        let dir = if rounds > 1 { a.out_dir.join(format!("round-{}", round + 1)) } else { a.out_dir.clone() };
        let (written, json) = write_round(&report, &dir, &model, path, &engine)?;
        if rounds > 1 {
            eprintln!("round {}/{rounds}: {}", round + 1, report.overall_line());
            if let Some(c) = report.cost_line() {
                eprintln!("round {}/{rounds}: {c}", round + 1);
            }
            eprintln!("wrote {}", written.join(", "));
        } else {
            let drafter = report.drafter.clone().unwrap_or_else(|| "none".into());
            if a.json {
                eprint!("{}", report.table());
                println!("{json}");
            } else {
                println!(
                    "model {model}, drafter {drafter}, {} threads, {} tokens per prompt, ctx {}\n",
                    report.threads, report.n_predict, report.ctx
                );
                print!("{}", report.table());
            }
            if let Some(st) = &report.spec_stats {
                eprintln!("{}", st.report());
            }
            if let Some(c) = report.cost_line() {
                eprintln!("{c}");
            }
            eprintln!("wrote {}", written.join(", "));
        }
        reports.push(report);
    }
    let all = RoundsReport::new(reports);
    if rounds > 1 {
        let r0 = &all.rounds[0];
        let drafter = r0.drafter.clone().unwrap_or_else(|| "none".into());
        let json_path = a.out_dir.join("rounds.json");
        let json = serde_json::to_string_pretty(&serde_json::json!({ "model": model, "prompts_file": path, "rounds": all }))?;
        std::fs::write(&json_path, &json).with_context(|| format!("writing {}", json_path.display()))?;
        if a.json {
            eprint!("{}", all.table());
            println!("{json}");
        } else {
            println!(
                "model {model}, drafter {drafter}, {} threads, {} tokens per prompt, ctx {}, {rounds} rounds\n",
                r0.threads, r0.n_predict, r0.ctx
            );
            print!("{}", all.table());
        }
        if let Some(st) = all.spec_stats() {
            eprintln!("all rounds: {}", st.report());
        }
        if let Some(c) = all.cost_line() {
            eprintln!("all rounds: {c}");
        }
        eprintln!("wrote {}", json_path.display());
    }
    let bad = all.mismatches();
    if !bad.is_empty() {
        let ids: Vec<String> = bad.iter().map(|r| format!("{}@{}", r.id, r.first_mismatch.unwrap_or(0))).collect();
        let total: usize = all.rounds.iter().map(|r| r.rows.len()).sum();
        let msg = format!(
            "!!! EXACTNESS FAILURE: speculative output differs from plain on {}/{} prompts: {} !!!",
            bad.len(),
            total,
            ids.join(" ")
        );
        println!("{msg}");
        anyhow::bail!("{msg}");
    }
    Ok(())
}

/// One round's files: prompts.csv, the two SVG charts and prompts.json
/// (whose text is returned with the paths written).
fn write_round(
    report: &PromptBenchReport,
    dir: &Path,
    model: &str,
    prompts_file: &Path,
    engine: &tandem_engine::Engine,
) -> Result<(Vec<String>, String)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let csv_path = dir.join("prompts.csv");
    std::fs::write(&csv_path, report.csv()).with_context(|| format!("writing {}", csv_path.display()))?;
    let mut written = vec![csv_path];
    if let Some(svg) = report.svg(model) {
        let svg_path = dir.join("speedup.svg");
        std::fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))?;
        written.push(svg_path);
    }
    if let Some(svg) = report.acceptance_svg(model) {
        let svg_path = dir.join("acceptance.svg");
        std::fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))?;
        written.push(svg_path);
    }
    let json_path = dir.join("prompts.json");
    let summary = serde_json::json!({
        "model": model,
        "arch": engine.model.cfg.arch,
        "prompts_file": prompts_file,
        "simd": format!("{:?}", tandem_kernels::simd_level()),
        "vnni": tandem_kernels::vnni(),
        "wide512": tandem_kernels::wide(),
        "wide512_min_rows": tandem_kernels::wide_min_rows(),
        "report": report,
    });
    let json = serde_json::to_string_pretty(&summary)?;
    std::fs::write(&json_path, &json).with_context(|| format!("writing {}", json_path.display()))?;
    written.push(json_path);
    Ok((written.iter().map(|p| p.display().to_string()).collect(), json))
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
