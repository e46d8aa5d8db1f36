//! The accept loop: each connection is served by hyper's HTTP/1 server with header names
//! written in Title-Case (`Access-Control-Allow-Origin`, `Content-Type`), as llama-server and
//! most HTTP/1 servers write them. Header names are case-insensitive by the standard, but
//! some clients compare them as written (llama.cpp's own tests copy the headers into a plain
//! dict); `axum::serve` would send them lowercased.
//!
//! Graceful shutdown as `axum::serve` does it: once `stop` resolves, no new connection is
//! accepted, each open one finishes the request it is on (keep-alive is turned off), and
//! [`serve`] returns when the last has closed. [`serve_all`] does the same on every address
//! of `--host`, for a model's server and a router alike.

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
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

/// Binds every address of `hosts` on `port` (the first's, with port 0 the one the system
/// picked for it), says so on stderr (`qkv-server: {about} listening on http://…`, then a line
/// for each other address), and serves `app` on all of them until `stop` resolves; returns
/// once every open connection has finished.
pub async fn serve_all(
    hosts: &[String],
    port: u16,
    app: Router,
    about: &str,
    stop: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let Some((first, rest)) = hosts.split_first() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no address to listen on",
        ));
    };
    let listener = TcpListener::bind((first.as_str(), port)).await?;
    let port = listener.local_addr()?.port();
    let mut more = Vec::with_capacity(rest.len());
    for host in rest {
        more.push(TcpListener::bind((host.as_str(), port)).await?);
    }
    eprintln!(
        "qkv-server: {about} listening on http://{}",
        listener.local_addr()?
    );
    // The first address's `stop` stops the others too.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut others = Vec::with_capacity(more.len());
    for other in more {
        eprintln!(
            "qkv-server: also listening on http://{}",
            other.local_addr()?
        );
        let mut stopped = stop_rx.clone();
        others.push(tokio::spawn(serve(other, app.clone(), async move {
            stopped.wait_for(|stop| *stop).await.ok();
        })));
    }
    serve(listener, app, async move {
        stop.await;
        stop_tx.send(true).ok();
    })
    .await?;
    for other in others {
        other.await.map_err(io::Error::other)??;
    }
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    ctrl_c.await.ok();
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.ok();
}
