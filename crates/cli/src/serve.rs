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
    cfg.spec = a.spec.options(&engine)?;
    let auth = if cfg.api_key.is_some() { "API key required" } else { "no API key" };
    let model = cfg.model_id.clone();
    tandem_server::run(engine, cfg, |addr| {
        // tests and scripts read this line for the port
        eprintln!("tandem serve: listening on http://{addr} (model {model}, context {ctx}, {auth})");
    })
    .context("server")
}
