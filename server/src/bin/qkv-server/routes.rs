//! The route table: a decoder's routes, the routes every server has (`/health`,
//! `/metrics`), the API-key check, CORS and the body limit around them, and the handlers of
//! the OpenAI chat and completion routes and of `/tokenize` and `/detokenize`.

use crate::generation::Kind;
use crate::{
    anthropic, body, chat, cors, counted, detokenize_with, embed_decoder, infill, lora, models,
    native, openai, params, responses, slot_files, tokenize_with, AppState, Shared,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use qkv_server::auth::ApiKeys;
use qkv_server::error::ApiError;
use qkv_server::request::{self, Prompt};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Who may call which route.
pub struct Auth {
    /// The accepted keys (`--api-key`, `--api-key-file`); none: every route is open.
    pub keys: ApiKeys,
    /// `/metrics` needs no key (`--metrics-public`).
    pub metrics_public: bool,
    /// `/metrics` is served (not `--no-metrics`).
    pub metrics: bool,
}

/// The routes of a decoder.
pub fn decoder_routes(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completion", post(native::completion))
        .route("/completions", post(native::completion))
        .route("/apply-template", post(native::apply_template))
        .route("/chat/completions/input_tokens", post(native::input_tokens))
        .route(
            "/v1/chat/completions/input_tokens",
            post(native::input_tokens),
        )
        .route("/props", get(native::props))
        .route("/slots", get(native::slots))
        .route("/slots/{id}", post(slot_files::post))
        .route("/infill", post(infill::infill))
        .route("/v1/embeddings", post(embed_decoder::openai))
        .route("/embeddings", post(embed_decoder::native))
        .route("/v1/models", get(models::models))
        .route("/models", get(models::models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/responses", post(responses::create))
        .route("/lora-adapters", get(lora::list).post(lora::set))
        .with_state(state)
}

/// `routes` with the routes every server has, the key check, CORS and the body limit.
pub fn router(
    routes: Router,
    shared: Arc<Shared>,
    auth: Arc<Auth>,
    cors_origins: Arc<cors::Cors>,
    body_limit: usize,
) -> Router {
    let mut common = Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health));
    common = if auth.metrics {
        common.route("/metrics", get(metrics))
    } else {
        common.route(
            "/metrics",
            get(|| async { native::not_supported("/metrics is off (--no-metrics)") }),
        )
    };
    let common = common.with_state(shared);
    routes
        .merge(common)
        .fallback(|| async { ApiError::status(StatusCode::NOT_FOUND, "no such route") })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(auth, authorize))
        .layer(middleware::from_fn_with_state(cors_origins, cors::cors))
}

/// Lets a request through when no key is set, when it carries an accepted key, or when its
/// route is open (`/health`, and `/metrics` with `--metrics-public`); else a 401 in OpenAI's
/// shape. The key is never logged or echoed.
pub async fn authorize(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let open =
        path == "/health" || path == "/v1/health" || (path == "/metrics" && auth.metrics_public);
    if open || auth.keys.is_empty() {
        return next.run(request).await;
    }
    // `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY`.
    let given = request.headers().get(header::AUTHORIZATION);
    let header = match (given, request.headers().get("x-api-key")) {
        (Some(v), _) => v.to_str().ok().map(str::to_owned),
        (None, Some(k)) => k.to_str().ok().map(|k| format!("Bearer {k}")),
        (None, None) => None,
    };
    let given = given.or(request.headers().get("x-api-key"));
    if auth.keys.allows(header.as_deref()) {
        return next.run(request).await;
    }
    let message = if given.is_none() {
        "no API key: send it as `Authorization: Bearer KEY`"
    } else {
        "the API key is not valid"
    };
    let mut response = ApiError::unauthorized(message).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        "Bearer".parse().expect("a valid header value"),
    );
    response
}

async fn chat(State(state): State<Arc<AppState>>, raw: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let b = body(&state.shared, raw)?;
        let p = params(&state, &b, true)?;
        let (ids, post) = chat::prepare(&state, &b)?;
        openai::generate(state.clone(), Kind::Chat, ids, p, post).await
    }
    .await;
    counted(&state.shared, r)
}

async fn completions(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let b = body(&state.shared, raw)?;
        let p = params(&state, &b, false)?;
        let prompt = request::completion_prompt(&b)?;
        let tokenizer = state.model.tokenizer().expect("checked at start");
        let ids = match prompt {
            Prompt::Text(s) => tokenizer.encode(&s)?,
            Prompt::Ids(ids) => ids,
        };
        let post = chat::completion_post(&state, &b)?;
        openai::generate(state.clone(), Kind::Completion, ids, p, post).await
    }
    .await;
    counted(&state.shared, r)
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    if shared.draining.load(Ordering::SeqCst) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting down"})),
        )
            .into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let vllm = shared.vllm_names.then_some(shared.model_name.as_str());
    let mut text = shared.metrics.render(vllm);
    if shared.llamacpp_names {
        text.push_str(&shared.metrics.render_llamacpp());
    }
    (
        [
            ("content-type", "text/plain; version=0.0.4".to_owned()),
            ("process-start-time-unix", shared.started.to_string()),
        ],
        text,
    )
        .into_response()
}

async fn tokenize(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let tokenizer = state.model.tokenizer().expect("checked at start");
    tokenize_with(&state.shared, tokenizer, raw)
}

async fn detokenize(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let tokenizer = state.model.tokenizer().expect("checked at start");
    detokenize_with(&state.shared, tokenizer, raw)
}
