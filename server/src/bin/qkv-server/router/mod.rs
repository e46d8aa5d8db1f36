//! Router mode: one endpoint over many models. Started with `--models-dir DIR` or
//! `--models-preset FILE` and no `--model`, the server runs no model itself; each request
//! goes to a `qkv-server` instance of the model it names (its `model` field, or `?model=`
//! on a GET), started on the first request for it (unless `--no-models-autoload`, or
//! `?autoload=false`) and stopped when others need its place (`--models-max`; pool.rs says
//! which). Instances are child processes listening on loopback ports; they get the router's
//! flags, the preset's for their model, and inherit its environment, as llama-server's
//! router does.
//!
//! The router's own routes: `GET /models` and `/v1/models` (every model and its status;
//! `?reload=1` reads the directory and preset again, as does `POST /models/reload`),
//! `POST /models/load` and `/models/unload` (`{"model": …}`), `GET /props` without a model
//! (the router's role and limits), and `/health`. API keys, CORS and the body limit apply
//! here; the instances listen on loopback only, without keys.

mod catalog;
mod pool;
mod proxy;

use crate::args::Args;
use crate::routes::{authorize, Auth};
use crate::{cors, listen, AnyResult};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pool::{AcquireError, Pool, Status};
use qkv_server::error::ApiError;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

/// What the router's handlers see.
struct RouterState {
    pool: Arc<Pool>,
    /// Start a model on its first request.
    autoload: bool,
    dir: Option<PathBuf>,
    preset: Option<PathBuf>,
    body_limit: usize,
    /// When the router started, in seconds since the Unix epoch.
    started: u64,
    /// llama-server's test hook `LLAMA_SERVER_DEBUG_FAKE_TIMING`: each request holds its
    /// instance 2 s before it is passed on, so that its tests can see a model busy.
    fake_timing: bool,
}

impl RouterState {
    /// The catalog read again.
    fn catalog(&self) -> Result<BTreeMap<String, catalog::Spec>, String> {
        catalog::list(self.dir.as_deref(), self.preset.as_deref(), &expand)
    }
}

/// Whether `args` ask for router mode (a models directory or preset, and no model); both
/// a model and a models source is an error.
pub fn wanted(args: &Args) -> AnyResult<bool> {
    let source = args.models_dir.is_some() || args.models_preset.is_some();
    if source && args.model.is_some() {
        return Err(
            "--model with --models-dir or --models-preset: give one model, or the \
                    models of a router, not both"
                .into(),
        );
    }
    Ok(source)
}

/// A preset's flags as the server's parser will read them (llama-server's spellings to
/// qkv-server's long names), or the error naming a refused one.
fn expand(flags: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let argv = std::iter::once(OsString::from("qkv-server")).chain(flags);
    let takes_value = crate::args::takes_value();
    let e = crate::llama_flags::expand(argv, &|_| None, &takes_value)?;
    Ok(e.args.into_iter().skip(1).collect())
}

/// The router's flags that are its own, with whether each takes a value: an instance does
/// not get them (it has its model, its port and no keys).
const ROUTER_FLAGS: &[(&str, bool)] = &[
    ("--models-dir", true),
    ("--models-preset", true),
    ("--models-max", true),
    ("--models-autoload", false),
    ("--no-models-autoload", false),
    ("--host", true),
    ("--port", true),
    ("--api-key", true),
    ("--api-key-file", true),
    ("--model-name", true),
    ("--alias", true),
    ("--metrics-public", false),
];

/// The router's command line (as parsed, program name first) without its own flags.
fn instance_flags(argv: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut i = 1;
    while i < argv.len() {
        let a = argv[i].to_string_lossy();
        i += 1;
        let name = a.split('=').next().unwrap_or_default();
        match ROUTER_FLAGS.iter().find(|(f, _)| *f == name) {
            Some(&(_, valued)) => {
                if valued && !a.contains('=') {
                    i += 1;
                }
            }
            None => out.push(argv[i - 1].clone()),
        }
    }
    out
}

/// Serves the models of the directory or preset until SIGTERM or Ctrl-C.
pub fn serve(args: Args, auth: Arc<Auth>, hosts: Vec<String>) -> AnyResult<()> {
    let models = catalog::list(
        args.models_dir.as_deref(),
        args.models_preset.as_deref(),
        &expand,
    )?;
    let exe = std::env::current_exe()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let startup: Vec<String> = models
            .values()
            .filter(|s| s.load_on_startup)
            .map(|s| s.id.clone())
            .collect();
        let count = models.len();
        let pool = Pool::new(models, args.models_max, exe, instance_flags(&args.argv));
        let state = Arc::new(RouterState {
            pool: pool.clone(),
            autoload: !args.no_models_autoload,
            dir: args.models_dir.clone(),
            preset: args.models_preset.clone(),
            body_limit: args.body_limit.saturating_mul(1024),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            fake_timing: std::env::var_os("LLAMA_SERVER_DEBUG_FAKE_TIMING")
                .is_some_and(|v| !v.is_empty()),
        });
        for id in startup {
            load_in_background(&pool, id);
        }
        let app = routes(state.clone(), auth.clone(), &args);
        let limit = match args.models_max {
            0 => "no limit".to_owned(),
            n => format!("at most {n} at once"),
        };
        let about = format!(
            "router of {count} models ({limit}; {} API keys)",
            auth.keys.len()
        );
        listen::serve_all(&hosts, args.port, app, &about, async {
            listen::shutdown_signal().await;
            eprintln!("qkv-server: shutting down the router and its instances");
        })
        .await?;
        eprintln!("qkv-server: stopped");
        Ok(())
    })
}

/// The variable by which a router names itself to its instances.
const ROUTER_PID: &str = "QKV_ROUTER_PID";

/// In an instance, a thread that ends the process once its router is gone (killed without
/// the chance to stop it), so that no instance outlives its router: it checks each second
/// that its parent is still the process named by `QKV_ROUTER_PID`.
pub fn watch_router() {
    #[cfg(unix)]
    if let Some(pid) = std::env::var(ROUTER_PID)
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
    {
        std::thread::spawn(move || loop {
            if std::os::unix::process::parent_id() != pid {
                // Not `eprintln!`: stderr was the router's pipe, and writing to it now fails.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "qkv-server: the router is gone: stopping"
                );
                std::process::exit(1);
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        });
    }
}

/// Starts `id` without a request waiting on it (`POST /models/load`, `load-on-startup`).
fn load_in_background(pool: &Arc<Pool>, id: String) {
    let pool = pool.clone();
    tokio::spawn(async move {
        if let Err(e) = pool.acquire(&id, true).await {
            eprintln!("qkv-server: {id}: {}", describe(&e));
        }
    });
}

fn routes(state: Arc<RouterState>, auth: Arc<Auth>, args: &Args) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/models", get(models))
        .route("/v1/models", get(models))
        .route("/models/load", post(load))
        .route("/models/unload", post(unload))
        .route("/models/reload", post(reload))
        .fallback(forward)
        .with_state(state.clone())
        .layer(DefaultBodyLimit::max(state.body_limit))
        .layer(middleware::from_fn_with_state(auth, authorize))
        .layer(middleware::from_fn_with_state(
            Arc::new(cors::Cors::parse(Some(
                args.cors_origins.as_deref().unwrap_or("*"),
            ))),
            cors::cors,
        ))
}

async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// One query parameter of `uri`, percent-decoded.
fn query_param(uri: &axum::http::Uri, key: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k) == key).then(|| decode(v))
    })
}

/// `%XX` and `+` of a query string.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn truthy(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

/// `GET /models`: every model, its file and status (`?reload=1` reads the sources again).
async fn models(State(state): State<Arc<RouterState>>, request: Request) -> Response {
    if query_param(request.uri(), "reload")
        .as_deref()
        .and_then(truthy)
        == Some(true)
    {
        if let Err(e) = reload_catalog(&state) {
            return ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e).into_response();
        }
    }
    let data: Vec<Value> = state
        .pool
        .views()
        .into_iter()
        .map(|v| {
            let mut status = json!({"value": match &v.status {
                Status::Unloaded { .. } => "unloaded",
                Status::Loading => "loading",
                Status::Loaded { .. } => "loaded",
            }});
            if !v.args.is_empty() {
                status["args"] = json!(v.args);
            }
            if let Status::Unloaded { failed: Some(f) } = &v.status {
                status["failed"] = json!(true);
                status["exit_code"] = json!(f.exit_code);
                status["message"] = json!(f.message);
            }
            json!({
                "id": v.spec.id,
                "object": "model",
                "owned_by": "qkv",
                "created": state.started,
                "path": v.spec.path.display().to_string(),
                "status": status,
            })
        })
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

fn reload_catalog(state: &RouterState) -> Result<(), String> {
    let models = state.catalog()?;
    state.pool.reload(models);
    Ok(())
}

/// `POST /models/reload`.
async fn reload(State(state): State<Arc<RouterState>>) -> Response {
    match reload_catalog(&state) {
        Ok(()) => Json(json!({"success": true})).into_response(),
        Err(e) => ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}

/// The `model` of a JSON body, or the error saying what is wrong with it.
fn body_model(body: &Bytes) -> Result<Option<String>, ApiError> {
    if body.is_empty() {
        return Ok(None);
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("body", format!("the body is not JSON: {e}")))?;
    match v.get("model") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::invalid("model", "`model` must be a string")),
    }
}

/// The model a `POST /models/load|unload` names, known to the pool.
fn named(state: &RouterState, body: &Bytes) -> Result<String, ApiError> {
    let id = body_model(body)?
        .ok_or_else(|| ApiError::invalid("model", "model name is missing from the request"))?;
    if !state.pool.has(&id) {
        return Err(not_found(&id));
    }
    Ok(id)
}

fn not_found(id: &str) -> ApiError {
    ApiError {
        code: Some("model_not_found"),
        ..ApiError::status(StatusCode::NOT_FOUND, format!("model `{id}` not found"))
    }
}

/// `POST /models/load`: starts the model (queued as a request would be), answering at once.
async fn load(State(state): State<Arc<RouterState>>, body: Bytes) -> Response {
    match named(&state, &body) {
        Ok(id) => {
            load_in_background(&state.pool, id);
            Json(json!({"success": true})).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `POST /models/unload`: stops the model's instance (after its running requests).
async fn unload(State(state): State<Arc<RouterState>>, body: Bytes) -> Response {
    match named(&state, &body) {
        Ok(id) if state.pool.unload(&id) => Json(json!({"success": true})).into_response(),
        Ok(id) => ApiError::invalid("model", format!("model `{id}` is not loaded")).into_response(),
        Err(e) => e.into_response(),
    }
}

fn describe(e: &AcquireError) -> String {
    match e {
        AcquireError::NotFound => "no such model".into(),
        AcquireError::NotLoaded => "the model is not loaded".into(),
        AcquireError::Failed(f) => match f.exit_code {
            Some(c) => format!("the model failed to load (exit code {c}): {}", f.message),
            None => format!("the model failed to load: {}", f.message),
        },
    }
}

/// Any other route: to the instance of the model the request names.
async fn forward(State(state): State<Arc<RouterState>>, request: Request) -> Response {
    match route(&state, request).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn route(state: &Arc<RouterState>, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, state.body_limit)
        .await
        .map_err(|e| ApiError::status(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()))?;
    let from_query = query_param(&parts.uri, "model");
    let model = if parts.method == Method::GET || parts.method == Method::HEAD {
        from_query
    } else {
        body_model(&bytes)?.or(from_query)
    };
    let Some(model) = model else {
        if parts.uri.path() == "/props" {
            return Ok(router_props(state));
        }
        return Err(ApiError::invalid(
            "model",
            "model name is missing from the request",
        ));
    };
    let autoload = match query_param(&parts.uri, "autoload") {
        Some(v) => truthy(&v).ok_or_else(|| {
            ApiError::invalid("autoload", format!("autoload={v}: give true or false"))
        })?,
        None => state.autoload,
    };
    let lease = match state.pool.acquire(&model, autoload).await {
        Ok(l) => l,
        Err(AcquireError::NotFound) => return Err(not_found(&model)),
        Err(e @ AcquireError::NotLoaded) => return Err(ApiError::invalid("model", describe(&e))),
        Err(e) => {
            return Err(ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{model}: {}", describe(&e)),
            ))
        }
    };
    if state.fake_timing {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    let request = Request::from_parts(parts, Body::from(bytes));
    proxy::send(lease, request).await
}

/// `GET /props` without a model: what the router is.
fn router_props(state: &RouterState) -> Response {
    Json(json!({
        "role": "router",
        "max_instances": state.pool.max(),
        "models_autoload": state.autoload,
        "build_info": crate::openai::FINGERPRINT,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_gets_the_flags_that_are_not_the_routers() {
        let argv: Vec<OsString> = [
            "qkv-server",
            "--models-dir",
            "/m",
            "--ctx-size",
            "4096",
            "--port=9",
            "--no-models-autoload",
            "--api-key",
            "k",
            "--jinja",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let kept: Vec<OsString> = ["--ctx-size", "4096", "--jinja"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(instance_flags(&argv), kept);
    }

    #[test]
    fn query_parameters_are_decoded() {
        let uri: axum::http::Uri = "/props?model=ggml-org%2Fm%3AQ8_0&autoload=false"
            .parse()
            .unwrap();
        assert_eq!(
            query_param(&uri, "model").as_deref(),
            Some("ggml-org/m:Q8_0")
        );
        assert_eq!(query_param(&uri, "autoload").as_deref(), Some("false"));
        assert_eq!(query_param(&uri, "x"), None);
        assert_eq!(decode("a%2"), "a%2");
    }
}
