//! `tandem serve`: load the model and run the OpenAI-compatible server.

use std::time::Duration;

use anyhow::{Context, Result};
use tandem_server::{ServerConfig, API_KEY_ENV};

use crate::args::ServeArgs;

pub fn run(a: &ServeArgs) -> Result<()> {
    let path = crate::model_path(&a.model)?;
    let engine = crate::load_engine(&a.model)?;
    let ctx = a.ctx.unwrap_or(engine.model.cfg.ctx_train);
    let id = a.alias.clone().unwrap_or_else(|| path.file_stem().unwrap_or_default().to_string_lossy().into_owned());
    let mut cfg = ServerConfig::new(ctx, id);
    cfg.host = a.host.clone();
    cfg.port = a.port;
    cfg.max_queue = a.max_queue;
    cfg.max_body_bytes = a.max_body_bytes;
    cfg.default_max_tokens = a.n_predict;
    cfg.api_key = a.api_key.clone().or_else(|| std::env::var(API_KEY_ENV).ok()).filter(|k| !k.is_empty());
    cfg.cors = a.cors;
    anyhow::ensure!(a.keepalive > 0.0 && a.keepalive.is_finite(), "--keepalive must be a positive number of seconds");
    anyhow::ensure!(a.shutdown_timeout >= 0.0 && a.shutdown_timeout.is_finite(), "--shutdown-timeout must be >= 0");
    cfg.keepalive = Duration::from_secs_f64(a.keepalive);
    cfg.shutdown_grace = Duration::from_secs_f64(a.shutdown_timeout);
    anyhow::ensure!(a.max_connections >= 1, "--max-connections must be at least 1");
    anyhow::ensure!(a.header_timeout > 0.0 && a.header_timeout.is_finite(), "--header-timeout must be a positive number of seconds");
    anyhow::ensure!(a.body_timeout > 0.0 && a.body_timeout.is_finite(), "--body-timeout must be a positive number of seconds");
    cfg.limits.max_connections = a.max_connections;
    cfg.limits.header_timeout = Duration::from_secs_f64(a.header_timeout);
    cfg.body_timeout = Duration::from_secs_f64(a.body_timeout);
    cfg.spec = a.spec.options(&engine)?;
    // one slot's K/V rows with its context full (prompts go in chunks of
    // at most the session's prefill chunk)
    let per_slot = engine.model.kv_bytes_full(ctx, tandem_engine::PREFILL_CHUNK);
    cfg.kv_budget = a.kv_budget.map(|b| b as usize).unwrap_or_else(|| available_memory() / 4);
    let fit = cfg.kv_budget / per_slot.max(1);
    cfg.parallel = match a.parallel {
        Some(n) => n as usize,
        None => fit.clamp(1, 8),
    };
    if cfg.parallel > fit {
        eprintln!(
            "tandem serve: warning: {} slots of {ctx} positions need {} of K/V rows when full; the budget is {}",
            cfg.parallel,
            gib(cfg.parallel * per_slot),
            gib(cfg.kv_budget)
        );
    }
    cfg.prefill_chunk = a.prefill_chunk as usize;
    eprintln!(
        "tandem serve: {} slot{} of {ctx} positions, K/V budget {} ({} per full slot), prompt chunks of {} tokens beside decoding",
        cfg.parallel,
        if cfg.parallel == 1 { "" } else { "s" },
        gib(cfg.kv_budget),
        gib(per_slot),
        cfg.prefill_chunk
    );
    let auth = if cfg.api_key.is_some() { "API key required" } else { "no API key" };
    let model = cfg.model_id.clone();
    tandem_server::run(engine, cfg, |addr| {
        // tests and scripts read this line for the port
        eprintln!("tandem serve: listening on http://{addr} (model {model}, context {ctx}, {auth})");
    })
    .context("server")
}

fn gib(bytes: usize) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Memory available now (MemAvailable), or 4 GiB where it cannot be read.
fn available_memory() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<usize>().ok())
        })
        .map(|kib| kib * 1024)
        .unwrap_or(4 << 30)
}
