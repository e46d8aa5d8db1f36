//! One request passed to an instance and its answer streamed back. A connection per
//! request: the instance is on loopback, and a closed connection is how it learns that the
//! client left (it then cancels the generation), so none is kept for reuse.

use super::pool::Lease;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
use hyper_util::rt::TokioIo;
use qkv_server::error::ApiError;

/// Headers that belong to one connection, not to the message.
const HOP_BY_HOP: &[header::HeaderName] = &[
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

fn strip(headers: &mut HeaderMap) {
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
    headers.remove("keep-alive");
}

/// Sends `request` to the instance `lease` holds and returns its answer, whose body keeps
/// the lease until it has been read or dropped.
pub async fn send(lease: Lease, request: Request) -> Result<Response, ApiError> {
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::status(
            StatusCode::BAD_GATEWAY,
            format!("the model's instance did not answer: {e}"),
        )
    };
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", lease.port))
        .await
        .map_err(|e| unreachable(&e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(&e))?;
    tokio::spawn(async move {
        // Ends when the answer has been read, or dropped with the client's connection.
        let _ = connection.await;
    });
    let (mut parts, body) = request.into_parts();
    strip(&mut parts.headers);
    // Only the path and query go on the wire; the instance checks no key.
    parts.headers.remove(header::AUTHORIZATION);
    parts.headers.remove("x-api-key");
    parts.headers.insert(
        header::HOST,
        format!("127.0.0.1:{}", lease.port)
            .parse()
            .expect("a valid host header"),
    );
    let answer = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|e| unreachable(&e))?;
    let (mut parts, body) = answer.into_parts();
    strip(&mut parts.headers);
    let chunks = Body::new(body).into_data_stream().map(move |chunk| {
        // The lease lives as long as the body is streamed.
        let _held = &lease;
        chunk
    });
    Ok(Response::from_parts(parts, Body::from_stream(chunks)))
}
