//! CORS for browser clients (`--cors-origins`): preflights answered before the key check,
//! allowed origins echoed back; an origin not allowed gets no CORS header.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Which browser origins may call the server (`--cors-origins`).
#[derive(Default)]
pub struct Cors {
    /// `*`: every origin.
    any: bool,
    /// `localhost`: `localhost`, `127.0.0.1` and `[::1]`, on any port and scheme.
    localhost: bool,
    /// Origins allowed as written.
    exact: Vec<String>,
}

impl Cors {
    /// Reads `--cors-origins` (comma-separated: `*`, `localhost`, or origins).
    pub fn parse(list: Option<&str>) -> Cors {
        let mut c = Cors::default();
        for o in list
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
        {
            match o {
                "*" => c.any = true,
                "localhost" => c.localhost = true,
                o => c.exact.push(o.to_owned()),
            }
        }
        c
    }

    fn allows(&self, origin: &str) -> bool {
        if self.any || self.exact.iter().any(|o| o == origin) {
            return true;
        }
        if !self.localhost {
            return false;
        }
        let rest = origin.split_once("://").map_or(origin, |(_, r)| r);
        let host = if let Some(v6) = rest.strip_prefix('[') {
            v6.split(']').next().unwrap_or("")
        } else {
            rest.split([':', '/']).next().unwrap_or("")
        };
        matches!(host, "localhost" | "127.0.0.1" | "::1")
    }
}

/// CORS: a preflight (`OPTIONS`) is answered here, before the key check, and an allowed
/// origin is echoed in `Access-Control-Allow-Origin` on every answer; an origin not allowed
/// gets no CORS header (the browser then refuses the call).
pub async fn cors(State(c): State<Arc<Cors>>, request: Request, next: Next) -> Response {
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .filter(|o| c.allows(o))
        .and_then(|o| header::HeaderValue::from_str(o).ok());
    let mut response = if request.method() == axum::http::Method::OPTIONS {
        StatusCode::OK.into_response()
    } else {
        next.run(request).await
    };
    if let Some(o) = origin {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            header::HeaderValue::from_static("true"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            header::HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            header::HeaderValue::from_static("*"),
        );
    }
    response
}
