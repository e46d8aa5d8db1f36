//! `qkv-server`: an OpenAI-compatible HTTP server over one model and the batch engine.
//!
//! ```text
//! qkv-server [--model PATH] [--dtype f16|f32] [--host 127.0.0.1[,::1]] [--port 8080]
//!            [--threads N] [--max-sequences 16] [--kv-budget MB] [--ctx 2048] [--queue 64]
//!            [--step-tokens 128] [--prefill-step-tokens 2048] [--body-limit KB]
//!            [--model-name NAME]... [--grace SECONDS]
//!            [--api-key KEY]... [--api-key-file PATH] [--metrics-public]
//!            [--metrics-vllm-names] [--no-metrics] [--no-slots] [--temp T] [--seed N]
//!            [--n-predict N] [--chat-template-file PATH] [--reasoning on|off|auto]
//!            [--lora FILE]... [--lora-scaled FILE SCALE]... [--lora-init-without-apply]
//! ```
//!
//! Routes: `POST /v1/chat/completions` and `/chat/completions` (the model's chat template;
//! SSE with `stream`), `POST /v1/completions`, `GET /v1/models` and `/models`,
//! `GET /health`, `GET /metrics` (Prometheus), `POST /tokenize`, `POST /detokenize`;
//! llama-server's own (native.rs): `POST /completion` and `/completions`,
//! `POST /apply-template`, `GET /props`, `GET /slots`, `POST /chat/completions/input_tokens`;
//! Anthropic's `POST /v1/messages` and `POST /v1/messages/count_tokens` (anthropic.rs) and
//! OpenAI's `POST /v1/responses` (responses.rs), both translated onto the chat route;
//! llama-server's `GET` and `POST /lora-adapters` for the `--lora` adapters (lora.rs).
//! The model runs on one engine thread (and rayon's
//! pool), never on the async runtime. A sentence-transformers directory (an encoder such as
//! all-MiniLM-L6-v2) is served with `POST /v1/embeddings` instead of the generation routes
//! (embed.rs). With API keys, every route but `/health` (and `/metrics` with
//! `--metrics-public`) needs `Authorization: Bearer KEY`. SIGTERM or SIGINT: new requests
//! get 503, running ones finish (cancelled after `--grace` seconds), then the process exits 0.
//!
//! The request bodies are read by the `qkv_server` library. This file holds the program's
//! course ([`serve`]) and what every route shares ([`AppState`], [`Shared`], reading a body,
//! counting an answer, the sampling defaults); the route table is routes.rs, and what the
//! flags make of a model is startup.rs. Its modules import only downward, from the bottom:
//! `llama_flags`, `args`, `cors`, `listen`, `named_templates`, `metrics`, `worker`, `lora`,
//! `models`, `chat`, `generation`, `openai`, `native`, `infill`, `slot_files`,
//! `embed_decoder`, `rerank`, `translate`, `anthropic`, `responses`, `embed`, `routes`,
//! `router`, `startup` (`tests/layering.rs` checks it). With `--models-dir` or
//! `--models-preset` and no model, the process is a router over instances of its models
//! instead (router/mod.rs).

#![forbid(unsafe_code)]

mod anthropic;
mod args;
mod chat;
mod cors;
mod embed;
mod embed_decoder;
mod generation;
mod infill;
mod listen;
mod llama_flags;
mod lora;
mod metrics;
mod models;
mod named_templates;
mod native;
mod openai;
mod rerank;
mod responses;
mod router;
mod routes;
mod slot_files;
mod startup;
mod translate;
mod worker;

use args::Args;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use metrics::Metrics;
use qkv::load::Model;
use qkv::tokenizer::Tokenizer;
use qkv_server::body::Body;
use qkv_server::error::ApiError;
use qkv_server::request;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use worker::Worker;

/// What the handlers of either kind of model see.
pub struct Shared {
    /// The name responses report (the first `--model-name`, or the first `--alias` in
    /// sorted order).
    pub model_name: String,
    /// Every name, and what `/v1/models` lists.
    pub names: models::Names,
    pub metrics: Arc<Metrics>,
    /// Set by SIGTERM: new requests get 503.
    pub draining: AtomicBool,
    /// Export the gauges under vLLM's names too.
    pub vllm_names: bool,
    /// Export llama-server's `llamacpp:…` counters and gauges too.
    pub llamacpp_names: bool,
    /// When the process started, in seconds since the Unix epoch.
    pub started: u64,
}

/// What the generation handlers (openai.rs) see.
pub struct AppState {
    pub model: Arc<Model>,
    /// The name responses report; the same as `shared.model_name`.
    pub model_name: String,
    pub context: usize,
    pub worker: Worker,
    pub shared: Arc<Shared>,
    /// The grammar compiler over the model's vocabulary (`None` when it could not be built:
    /// constrained requests then get a 400 saying why).
    pub grammars: Result<qkv_server::constraint::Grammars, String>,
    /// The flags the handlers read (template, defaults, `/props`, `/slots`).
    pub options: chat::ServeOptions,
    /// The LoRA adapters and their server-wide scales.
    pub lora: lora::Adapters,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse_llama();
    match serve(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qkv-server: error: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The program's course: the flags checked, then a router over models (`--models-dir`,
/// `--models-preset`) or one model loaded and served until a signal stops it.
fn serve(args: Args) -> AnyResult<()> {
    router::watch_router();
    startup::set_up_process(&args)?;
    // The keys first: a bad key file stops the server before any model is fetched or loaded.
    let auth = startup::auth(&args)?;
    startup::check_sampling_flags(&args)?;
    // `--pooling rank` is llama-server's way of saying `--reranking`.
    let rank = args.pooling == "rank";
    let pooling = qkv_server::embedding::Pooling::parse(if rank { "last" } else { &args.pooling })?;
    let template = startup::chat_template(&args)?;
    let hosts = startup::hosts(&args)?;
    if router::wanted(&args)? {
        return router::serve(args, auth, hosts);
    }
    let path = match &args.model {
        Some(p) => p.clone(),
        None => qkv_fetch::default_model()?,
    };
    let names = models::names(
        &args.model_names,
        args.alias.as_deref(),
        args.tags.as_deref(),
        &path,
    )?;
    let metrics = Arc::new(Metrics::default());
    let shared = Arc::new(Shared {
        model_name: names.served.clone(),
        names,
        metrics: metrics.clone(),
        draining: AtomicBool::new(false),
        vllm_names: args.metrics_vllm_names,
        llamacpp_names: args.metrics_on(),
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let decoder_only = |what: &str| -> AnyResult<()> {
        match args.lora_adapters()?.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "--lora: {} is {what}; LoRA adapters apply to decoder models",
                path.display()
            )
            .into()),
        }
    };
    let served = if qkv::models::bert::CrossEncoder::is_cross_encoder(&path) {
        decoder_only("a cross-encoder")?;
        startup::serve_cross_encoder(&args, &path, &shared)?
    } else if startup::is_sentence_transformers(&path) {
        if args.reranking || rank {
            return Err(format!(
                "--reranking: {} is a sentence-transformers encoder; qkv-server reranks with a \
                 decoder that answers yes or no (as Qwen3-Reranker)",
                path.display()
            )
            .into());
        }
        decoder_only("a sentence-transformers encoder")?;
        startup::serve_encoder(&args, &path, &shared)?
    } else {
        let reranking = args.reranking || rank;
        startup::serve_decoder(
            &args,
            &path,
            &shared,
            metrics,
            template,
            (pooling, reranking),
        )?
    };
    let app = routes::router(
        served.routes,
        shared.clone(),
        auth.clone(),
        Arc::new(cors::Cors::parse(Some(
            args.cors_origins.as_deref().unwrap_or("*"),
        ))),
        args.body_limit.saturating_mul(1024),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let about = startup::about(&path, &shared, &served.what, &auth);
    runtime.block_on(startup::listen_until_stopped(
        &args,
        &hosts,
        app,
        &about,
        &shared,
        served.worker,
    ))
}

/// The body of a POST, or the error of reading it (413 past the limit), in OpenAI's shape;
/// counts the request, and refuses new work while shutting down.
fn body(shared: &Shared, body: Result<Bytes, BytesRejection>) -> Result<Body, ApiError> {
    shared.metrics.requests.fetch_add(1, Ordering::Relaxed);
    if shared.draining.load(Ordering::SeqCst) {
        return Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        ));
    }
    let bytes = body.map_err(|e| ApiError::status(e.status(), e.body_text()))?;
    Body::parse(&bytes)
}

/// Counts an error on its way out.
fn counted(shared: &Shared, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(r) => r,
        Err(e) => {
            shared.metrics.errors.fetch_add(1, Ordering::Relaxed);
            e.into_response()
        }
    }
}

/// A route the served model's kind cannot answer: the body is read as on every route (a
/// malformed one is its own error), then a 400 `model_not_supported` saying `why`.
fn unsupported(shared: &Shared, raw: Result<Bytes, BytesRejection>, why: String) -> Response {
    let r = body(shared, raw).and_then(|_| {
        Err(ApiError {
            code: Some("model_not_supported"),
            ..ApiError::invalid("model", why)
        })
    });
    counted(shared, r)
}

/// The sampling and output fields of a completion request, with the server's defaults
/// (`--temp`, `--seed`, `--n-predict`) where the request gives none; a request that fixes
/// no seed, on a server without `--seed`, gets a different one each time.
fn params(state: &AppState, b: &Body, chat: bool) -> Result<request::Params, ApiError> {
    let o = &state.options;
    let mut p = request::params(b, chat, || {
        o.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ state
                .shared
                .metrics
                .requests
                .load(Ordering::Relaxed)
                .rotate_left(32)
        })
    })?;
    if let (Some(t), None) = (o.temperature, b.field("temperature")) {
        p.sampler.temperature = t;
    }
    p.max_tokens = cap_tokens(state, p.max_tokens);
    Ok(p)
}

/// A request's token limit: its own, else the server's `--n-predict`, as llama-server
/// takes them.
fn cap_tokens(state: &AppState, asked: Option<usize>) -> Option<usize> {
    asked.or(state.options.n_predict)
}

/// `POST /tokenize` with `tokenizer`, for a decoder's server and an encoder's alike.
fn tokenize_with(
    shared: &Shared,
    tokenizer: &Tokenizer,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let b = body(shared, raw)?;
        let (content, options) = request::tokenize_fields(&b)?;
        let ids = tokenizer.encode_with(content, options)?;
        if !b.bool("with_pieces", false)? {
            return Ok(Json(json!({"tokens": ids})).into_response());
        }
        // Each token with its text; a token that is not whole UTF-8 (part of a character)
        // gives its bytes instead, as llama-server does.
        let tokens: Vec<Value> = ids
            .iter()
            .map(|&id| {
                let bytes = tokenizer.token_bytes(id).unwrap_or_default();
                let piece = match std::str::from_utf8(bytes) {
                    Ok(s) => json!(s),
                    Err(_) => json!(bytes),
                };
                json!({"id": id, "piece": piece})
            })
            .collect();
        Ok(Json(json!({ "tokens": tokens })).into_response())
    })();
    counted(shared, r)
}

/// `POST /detokenize` with `tokenizer`, for a decoder's server and an encoder's alike.
fn detokenize_with(
    shared: &Shared,
    tokenizer: &Tokenizer,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let b = body(shared, raw)?;
        let tokens = request::detokenize_tokens(&b)?;
        let content = tokenizer.decode(&tokens)?;
        Ok(Json(json!({"content": content})).into_response())
    })();
    counted(shared, r)
}
