//! Accepting connections with limits a public server needs: a bound on open
//! connections, a deadline for request headers, a cap on header size, and a
//! graceful shutdown that lets open requests finish.
//!
//! axum's own `serve` sets none of these (hyper's header timeout needs a timer
//! it does not install), so a client sending headers one byte a second, or a
//! few thousand idle sockets, would hold the server's resources forever.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// Connection-level limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Open connections at most; further ones are closed at once.
    pub max_connections: usize,
    /// Time a client has to send a request's headers, counted from the first
    /// wait for them (also closes keep-alive connections idle that long).
    pub header_timeout: Duration,
    /// Bytes of request line and headers at most (larger: 431).
    pub max_header_bytes: usize,
}

/// Serves `app` on `listener` until `shutdown` resolves; then stops
/// accepting, asks every connection to close after its current response, and
/// returns once all have closed. `rejected` counts connections refused at the
/// limit.
pub(crate) async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    rejected: impl Fn() + Send + Sync + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    // out of file descriptors and the like: wait, do not spin
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            rejected();
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("connection closed: {e}");
                    }
                }
                changed = stop.changed() => {
                    if changed.is_ok() && *stop.borrow() {
                        conn.as_mut().graceful_shutdown();
                    }
                    // finish the current request, then the connection closes
                    let _ = conn.as_mut().await;
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // every connection task holds a permit until it ends
    let _all = permits.acquire_many(limits.max_connections as u32).await;
    Ok(())
}
