//! `tandem serve`: an OpenAI-compatible HTTP server (axum/tokio).
//!
//! - `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`,
//!   `GET /health`, `GET /metrics` (Prometheus text).
//! - One engine worker thread decodes up to `parallel` requests together, one
//!   forward per step (continuous batching: requests join and leave at any
//!   step); the others wait in a bounded queue (`max_queue`, then 503 with
//!   `Retry-After`). Greedy output of a request is the same bits whatever
//!   else is in the batch.
//! - Prompt prefixes are kept across requests within `kv_budget`: a prompt
//!   that extends or shares an earlier one only evaluates its new tokens
//!   (`usage.prompt_tokens_details.cached_tokens`).
//! - SSE streaming with keep-alive comments; a client that goes away cancels
//!   its generation at the next token.
//! - Errors in OpenAI's JSON shape ([`ApiError`]); the request-field rule is in
//!   [`request`].
//! - Responses carry a `tandem` extension object: timings, prefix reuse and the
//!   request's speculative figures (drafted / accepted tokens).

#![forbid(unsafe_code)]

mod error;
mod http;
mod listen;
mod metrics;
pub mod request;
pub mod stop;
mod worker;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use tandem_engine::{Engine, SpecOptions};

pub use error::{ApiError, ServerError};
pub use listen::ConnectionLimits;

/// Environment variable read for the API key when none is configured.
pub const API_KEY_ENV: &str = "TANDEM_API_KEY";

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks a free port (the bound address is logged and returned).
    pub port: u16,
    /// Context size of the session.
    pub ctx: usize,
    /// Name the model is listed under (default: the file's stem).
    pub model_id: String,
    /// Requests that may wait for the engine beyond the one running.
    pub max_queue: usize,
    pub max_body_bytes: usize,
    /// max_tokens when a request gives none (capped by the room left in the context).
    pub default_max_tokens: usize,
    /// Require `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Answer CORS preflights and add permissive CORS headers.
    pub cors: bool,
    /// SSE keep-alive comment interval while nothing else is sent (queue, prefill).
    pub keepalive: Duration,
    /// After SIGINT/SIGTERM: how long in-flight requests may run before they are cancelled.
    pub shutdown_grace: Duration,
    pub spec: SpecOptions,
    /// Sequences decoded together (slots), each with its own KV cache.
    pub parallel: usize,
    /// Most prompt tokens evaluated per step while other sequences decode.
    pub prefill_chunk: usize,
    /// Bytes of K/V rows held in all: the slots' plus kept prompt prefixes.
    pub kv_budget: usize,
    /// Open connections, header deadline and header size.
    pub limits: ConnectionLimits,
    /// Time a client has to send a request body once its headers arrived.
    pub body_timeout: Duration,
}

impl ServerConfig {
    pub fn new(ctx: usize, model_id: impl Into<String>) -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            ctx,
            model_id: model_id.into(),
            max_queue: 16,
            max_body_bytes: 4 << 20,
            default_max_tokens: 1024,
            api_key: None,
            cors: false,
            keepalive: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(10),
            spec: SpecOptions::default(),
            parallel: 1,
            prefill_chunk: tandem_engine::batch::DEFAULT_PREFILL_CHUNK,
            kv_budget: 2 << 30,
            limits: ConnectionLimits { max_connections: 512, header_timeout: Duration::from_secs(10), max_header_bytes: 64 << 10 },
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// Run the server on `listener` until `shutdown` resolves, then stop accepting,
/// let in-flight requests finish for `shutdown_grace`, cancel what is left, and
/// return (at the latest a few seconds after the grace period).
pub async fn serve(
    engine: Arc<Engine>,
    cfg: ServerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    if cfg.ctx < 2 {
        return Err(ServerError::Config(format!("context of {} tokens is too small", cfg.ctx)));
    }
    let shared = Arc::new(worker::Shared { metrics: Default::default(), abort: AtomicBool::new(false), exit: AtomicBool::new(false) });
    if cfg.parallel == 0 {
        return Err(ServerError::Config("--parallel must be at least 1".into()));
    }
    let settings = worker::BatchSettings { slots: cfg.parallel, ctx: cfg.ctx, prefill_chunk: cfg.prefill_chunk, kv_budget: cfg.kv_budget };
    let (jobs, worker, drafter) = worker::spawn(engine.clone(), settings, cfg.spec.clone(), cfg.max_queue, shared.clone())?;
    if let Some(d) = &drafter {
        tracing::info!("speculative decoding: {d}");
    }
    let key_hash = cfg.api_key.as_ref().filter(|k| !k.is_empty()).map(|k| Sha256::digest(k.as_bytes()).into());
    let grace = cfg.shutdown_grace;
    let limits = cfg.limits;
    let state = Arc::new(http::AppState {
        engine,
        created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        model_id: cfg.model_id.clone(),
        cfg,
        jobs,
        shared: shared.clone(),
        shutting_down: AtomicBool::new(false),
        drafter,
        key_hash,
    });
    let app = http::router(state.clone());
    let (hard_tx, hard_rx) = tokio::sync::oneshot::channel::<()>();
    let st2 = state.clone();
    let signal = async move {
        shutdown.await;
        tracing::info!("shutting down: no new connections; in-flight requests have {:.1} s", grace.as_secs_f64());
        st2.shutting_down.store(true, Ordering::Relaxed);
        let shared = st2.shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            tracing::warn!("grace period over: cancelling in-flight generations");
            shared.abort.store(true, Ordering::Relaxed);
            // connections that still do not finish (a client that stops reading) are cut
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = hard_tx.send(());
        });
    };
    let counted = shared.clone();
    let rejected = move || {
        counted.metrics.rejected_connections.fetch_add(1, Ordering::Relaxed);
    };
    let server = listen::serve_connections(listener, app, limits, signal, rejected);
    tokio::select! {
        r = server => r?,
        _ = hard_rx => tracing::warn!("connections still open after the grace period; closing them"),
    }
    // cancel whatever still runs; the worker answers queued jobs and leaves
    shared.abort.store(true, Ordering::Relaxed);
    shared.exit.store(true, Ordering::Relaxed);
    drop(state);
    let join = tokio::task::spawn_blocking(move || {
        let _ = worker.join();
    });
    if tokio::time::timeout(Duration::from_secs(5), join).await.is_err() {
        tracing::warn!("the engine worker did not stop within 5 s");
    }
    Ok(())
}

/// Bind `host:port`.
pub async fn bind(cfg: &ServerConfig) -> Result<tokio::net::TcpListener, ServerError> {
    let addr = format!("{}:{}", cfg.host, cfg.port);
    tokio::net::TcpListener::bind(&addr).await.map_err(|source| ServerError::Bind { addr, source })
}

/// A future that resolves on SIGINT (Ctrl-C) or SIGTERM. The handlers are
/// installed here, before the future is first polled (call it inside the
/// runtime, before announcing the server), so no signal is missed.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => {},
                _ = term.recv() => {},
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async move {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

/// Run until SIGINT/SIGTERM (what `tandem serve` calls). `on_listening` gets
/// the bound address (with the real port when 0 was asked).
pub fn run(engine: Arc<Engine>, cfg: ServerConfig, on_listening: impl FnOnce(SocketAddr)) -> Result<(), ServerError> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let r = rt.block_on(async move {
        let signal = shutdown_signal()?;
        let listener = bind(&cfg).await?;
        on_listening(listener.local_addr()?);
        serve(engine, cfg, listener, signal).await
    });
    // connection tasks of clients that never went away are not waited for
    rt.shutdown_timeout(Duration::from_secs(1));
    r
}

/// A server running on its own thread and runtime (for tests and embedding).
pub struct Running {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
}

impl Running {
    /// Start serving; returns once the port is bound.
    pub fn spawn(engine: Arc<Engine>, cfg: ServerConfig) -> Result<Running, ServerError> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let listener = rt.block_on(bind(&cfg))?;
        let addr = listener.local_addr()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("tandem-server".into()).spawn(move || {
            let r = rt.block_on(serve(engine, cfg, listener, async move {
                let _ = rx.await;
            }));
            rt.shutdown_timeout(Duration::from_secs(1));
            r
        })?;
        Ok(Running { addr, stop: Some(tx), thread: Some(thread) })
    }

    /// Begin a graceful shutdown and wait for it.
    pub fn stop(mut self) -> Result<(), ServerError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), ServerError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| Err(ServerError::Config("server thread panicked".into()))),
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}
