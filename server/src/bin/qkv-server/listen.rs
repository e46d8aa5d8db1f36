//! The accept loop: each connection is served by hyper's HTTP/1 server with header names
//! written in Title-Case (`Access-Control-Allow-Origin`, `Content-Type`), as llama-server and
//! most HTTP/1 servers write them. Header names are case-insensitive by the standard, but
//! some clients compare them as written (llama.cpp's own tests copy the headers into a plain
//! dict); `axum::serve` would send them lowercased.
//!
//! Graceful shutdown as `axum::serve` does it: once `stop` resolves, no new connection is
//! accepted, each open one finishes the request it is on (keep-alive is turned off), and
//! [`serve`] returns when the last has closed.

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves `app` on `listener` until `stop` resolves, then waits for the open connections to
/// finish. An accept error (a full file table, a connection reset before it was taken) is
/// logged and retried after a short pause, never fatal.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // `stop_rx` is dropped when `stop` resolves: `closed()` on the sender then wakes.
    let (stop_tx, stop_rx) = watch::channel(());
    tokio::spawn(async move {
        stop.await;
        drop(stop_rx);
    });
    // Every connection task holds a receiver; `closed()` on `done_tx` waits for them all.
    let (done_tx, done_rx) = watch::channel(());
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("qkv-server: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop_tx.closed() => break,
        };
        stream.set_nodelay(true).ok();
        let service = TowerToHyperService::new(app.clone());
        let stop = stop_tx.clone();
        let done = done_rx.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.title_case_headers(true);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            let mut stopping = std::pin::pin!(stop.closed());
            let mut asked = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = &mut stopping, if !asked => {
                        asked = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(done);
        });
    }
    drop(done_rx);
    drop(listener);
    done_tx.closed().await;
    Ok(())
}
