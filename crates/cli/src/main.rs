//! `tandem`: run, chat, inspect, quantize, benchmark and measure models.
//!
//! stdout carries only generated text (so it can be piped); everything else —
//! load messages, statistics, progress — goes to stderr.

#![forbid(unsafe_code)]

mod args;
mod bench;
mod chat;
mod errors;
mod inspect;
mod quantize;
mod serve;
#[cfg(feature = "train")]
mod train;
mod verify;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use tandem_engine::fetch::{self, ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::Engine;

use args::{Cli, Cmd, ModelArgs};

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("TANDEM_LOG").unwrap_or_else(|_| {
        let serving = matches!(cli.cmd, Some(Cmd::Serve(_)));
        tracing_subscriber::EnvFilter::new(if cli.run.verbose || serving { "info" } else { "warn" })
    });
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
    #[cfg(feature = "mpi")]
    let _universe = match start_mpi() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("error: {}", errors::message(&e));
            std::process::exit(1);
        }
    };
    #[cfg(not(feature = "mpi"))]
    if launched_ranks() > 1 {
        eprintln!("error: started as one of {} MPI ranks, but this tandem was built without MPI (cargo build --release -p tandem-cli --features mpi)", launched_ranks());
        std::process::exit(1);
    }
    let result = if tandem_engine::distributed::is_follower() { follow(&cli) } else { run(cli) };
    // rank 0 of several: the other ranks return from their loop
    tandem_engine::distributed::finish();
    if let Err(e) = result {
        match tandem_engine::distributed::group() {
            Some(g) => eprintln!("error (rank {}): {}", g.rank(), errors::message(&e)),
            None => eprintln!("error: {}", errors::message(&e)),
        }
        std::process::exit(1);
    }
}

/// Ranks `mpirun` started (1 when not started by it).
fn launched_ranks() -> usize {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"].iter().find_map(|k| std::env::var(k).ok()?.parse().ok()).unwrap_or(1)
}

/// Under `mpirun` with several ranks: initialize MPI and join its world
/// (the returned universe finalizes MPI when dropped at exit).
#[cfg(feature = "mpi")]
fn start_mpi() -> Result<Option<mpi::environment::Universe>> {
    if launched_ranks() <= 1 {
        return Ok(None);
    }
    let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Serialized).context("initializing MPI")?;
    tandem_engine::distributed::join(std::sync::Arc::new(tandem_engine::distributed::MpiGroup::world()));
    Ok(Some(universe))
}

/// The commands that run split over ranks: generation, chat and serve.
fn split_model_args(cli: &Cli) -> Result<&ModelArgs> {
    match &cli.cmd {
        None => Ok(&cli.run.model),
        Some(Cmd::Serve(s)) => Ok(&s.model),
        Some(_) => {
            anyhow::bail!("under mpirun, tandem runs generation, chat and `serve` split over the ranks; run other commands in one process")
        }
    }
}

/// A rank other than 0: load this rank's share of the model and run the
/// forward passes rank 0 announces until it stops.
fn follow(cli: &Cli) -> Result<()> {
    let engine = load_engine(split_model_args(cli)?)?;
    engine.model.follow(&engine.pool).context("following rank 0")?;
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    if tandem_engine::distributed::group().is_some() {
        split_model_args(&cli)?;
    }
    match cli.cmd {
        None => chat::run(&cli.run),
        Some(Cmd::Inspect { file, all, same_tensors: None }) => inspect::run(&file, all),
        Some(Cmd::Inspect { file, same_tensors: Some(other), .. }) => inspect::same_tensors(&file, &other),
        Some(Cmd::Quantize { input, output, ty, keep }) => quantize::run(&input, &output, &ty, &keep),
        Some(Cmd::Bench(b)) => bench::run(&b),
        Some(Cmd::Perplexity(p)) => bench::perplexity_cmd(&p),
        Some(Cmd::VerifySpec(v)) => verify::run(&v),
        #[cfg(feature = "train")]
        Some(Cmd::Train(t)) => train::run(t),
        #[cfg(not(feature = "train"))]
        Some(Cmd::Train(_)) => anyhow::bail!("this tandem was built without training; rebuild with `--features train` (the default)"),
        Some(Cmd::Serve(s)) => serve::run(&s),
        Some(Cmd::Fetch { name }) => {
            let spec = match name.as_deref() {
                Some(name) => catalogue_entry(name)?,
                None => &DEFAULT_MODEL,
            };
            let p = ensure_model(spec, &models_dir(), true).with_context(|| format!("fetching {}", spec.name))?;
            eprintln!("model ready: {}", p.display());
            Ok(())
        }
        Some(Cmd::Models) => {
            list_models();
            Ok(())
        }
    }
}

/// The catalogue entry called `name`, or an error listing the names.
fn catalogue_entry(name: &str) -> Result<&'static fetch::ModelSpec> {
    fetch::find(name).ok_or_else(|| {
        let names: Vec<_> = fetch::CATALOGUE.iter().map(|m| m.name).collect();
        anyhow::anyhow!("unknown model name '{name}' (known: {})", names.join(", "))
    })
}

/// `tandem models`: the catalogue, and which models are in the models directory.
fn list_models() {
    let dir = models_dir();
    println!("{:<20} {:<8} {:>9}  {:<10} description", "name", "arch", "size", "fetched");
    for m in fetch::CATALOGUE {
        let state = match fetch::fetched(m, &dir) {
            Some(true) => "yes",
            Some(false) => "unverified",
            None => "no",
        };
        let size = format!("{:.0} MB", m.size as f64 / 1e6);
        println!("{:<20} {:<8} {:>9}  {:<10} {}", m.name, m.arch, size, state, m.description);
        for d in m.drafters {
            let here = if dir.join("support").join(d.file_name).exists() { "yes" } else { "no" };
            println!("  --drafter {:<9} {:>19}  {:<10} {}", d.name, "", here, d.description);
        }
    }
    println!("models directory: {} (set {} to change it)", dir.display(), fetch::MODELS_DIR_ENV);
}

/// The model file to use: `-m FILE`, `-m NAME` from the catalogue, or the
/// default model (both fetched on first use). A file wins over a name.
pub fn model_path(m: &ModelArgs) -> Result<PathBuf> {
    let what = match &m.model {
        Some(p) if !p.exists() => format!("fetching {}", p.display()),
        Some(_) => String::new(),
        None => "fetching the default model".to_string(),
    };
    fetch::resolve(m.model.as_deref(), true).map_err(|e| match e {
        fetch::FetchError::UnknownModel { .. } => anyhow::anyhow!("{e} (`tandem models` lists them)"),
        e => anyhow::Error::new(e).context(what),
    })
}

pub fn load_engine(m: &ModelArgs) -> Result<Arc<Engine>> {
    let path = model_path(m)?;
    let t0 = std::time::Instant::now();
    let threads = m.threads.unwrap_or_else(tandem_kernels::pool::physical_cores);
    let engine = Engine::load(&path, threads).with_context(|| format!("loading {}", path.display()))?;
    engine.model.set_kv_type(m.kv_type);
    let cfg = &engine.model.cfg;
    if tandem_engine::distributed::is_follower() {
        return Ok(Arc::new(engine));
    }
    let ranks = tandem_engine::distributed::group().map(|g| format!(", rank 0 of {} (tensor parallel)", g.size())).unwrap_or_default();
    eprintln!(
        "loaded {} ({} layers, width {}, vocab {}) in {:.0} ms; {} threads, SIMD {:?}{}{ranks}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        cfg.n_layer,
        cfg.d_model,
        cfg.vocab,
        t0.elapsed().as_secs_f64() * 1e3,
        threads,
        tandem_kernels::simd_level(),
        match (tandem_kernels::vnni(), tandem_kernels::wide(), tandem_kernels::wide_min_rows()) {
            (_, true, 1) => "+VNNI-512".to_string(),
            (_, true, n) => format!("+VNNI-512 from {n} rows"),
            (true, false, _) => "+VNNI".to_string(),
            _ => String::new(),
        }
    );
    Ok(Arc::new(engine))
}
