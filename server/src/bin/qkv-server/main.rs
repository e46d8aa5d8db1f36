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
//! The request bodies are read by the `qkv_server` library. This file holds what every
//! route shares ([`AppState`], [`Shared`], reading a body, counting an answer) and the
//! router; its modules import only downward, from the bottom: `llama_flags`, `args`, `cors`,
//! `listen`, `named_templates`, `metrics`, `worker`, `lora`, `models`, `chat`, `openai`, `native`,
//! `infill`, `slot_files`, `embed_decoder`, `rerank`, `translate`, `anthropic`, `responses`,
//! `embed`, `router` (`tests/layering.rs` checks it). With `--models-dir` or
//! `--models-preset` and no model, the process is a router over instances of its models
//! instead (router/mod.rs).

#![forbid(unsafe_code)]

mod anthropic;
mod args;
mod chat;
mod cors;
mod embed;
mod embed_decoder;
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
mod slot_files;
mod translate;
mod worker;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics::Metrics;
use openai::Kind;
use qkv::engine::{Engine, EngineOptions};
use qkv::load::{Model, ModelOptions};
use qkv::tokenizer::Tokenizer;
use qkv_server::auth::ApiKeys;
use qkv_server::body::Body;
use qkv_server::error::ApiError;
use qkv_server::request::{self, Prompt};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use worker::Worker;

use args::Args;

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

/// Who may call which route.
struct Auth {
    keys: ApiKeys,
    metrics_public: bool,
    /// `/metrics` is served (not `--no-metrics`).
    metrics: bool,
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

/// What a model becomes in the server: its routes, a line saying what it serves, and the
/// batch engine's worker (none for an encoder).
type Served = (Router, String, Option<Worker>);

fn serve(args: Args) -> AnyResult<()> {
    router::watch_router();
    set_up_process(&args)?;
    // The keys first: a bad key file stops the server before any model is fetched or loaded.
    let auth = auth(&args)?;
    check_sampling_flags(&args)?;
    // `--pooling rank` is llama-server's way of saying `--reranking`.
    let rank = args.pooling == "rank";
    let pooling = qkv_server::embedding::Pooling::parse(if rank { "last" } else { &args.pooling })?;
    let template = chat_template(&args)?;
    let hosts = hosts(&args)?;
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
    let (routes, what, worker) = if qkv::models::bert::CrossEncoder::is_cross_encoder(&path) {
        decoder_only("a cross-encoder")?;
        serve_cross_encoder(&args, &path, &shared)?
    } else if is_sentence_transformers(&path) {
        if args.reranking || rank {
            return Err(format!(
                "--reranking: {} is a sentence-transformers encoder; qkv-server reranks with a \
                 decoder that answers yes or no (as Qwen3-Reranker)",
                path.display()
            )
            .into());
        }
        decoder_only("a sentence-transformers encoder")?;
        serve_encoder(&args, &path, &shared)?
    } else {
        let reranking = args.reranking || rank;
        serve_decoder(
            &args,
            &path,
            &shared,
            metrics,
            template,
            (pooling, reranking),
        )?
    };
    let app = router(
        routes,
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
    runtime.block_on(listen_until_stopped(
        &args, &hosts, app, &auth, &path, &shared, &what, worker,
    ))
}

/// `--threads`: the process's pool.
fn set_up_process(args: &Args) -> AnyResult<()> {
    match args.threads {
        None | Some(-1) => {}
        Some(n @ 1..=1024) => rayon::ThreadPoolBuilder::new()
            .num_threads(n as usize)
            .build_global()?,
        Some(n) => return Err(format!("--threads {n}: give 1 to 1024, or -1").into()),
    }
    Ok(())
}

/// The API keys (`--api-key`, `--api-key-file`) and who may read `/metrics`.
fn auth(args: &Args) -> AnyResult<Arc<Auth>> {
    // llama-server's form: several keys in one `--api-key`, comma-separated. An empty
    // `--api-key` stays, to be refused: it must not turn the key check off unnoticed.
    let mut keys: Vec<String> = args
        .api_keys
        .iter()
        .flat_map(|k| {
            let mut parts: Vec<&str> = k.split(',').filter(|p| !p.is_empty()).collect();
            if parts.is_empty() {
                parts.push(k);
            }
            parts
        })
        .map(str::to_owned)
        .collect();
    if let Some(file) = &args.api_key_file {
        keys.extend(
            qkv_server::auth::read_key_file(file).map_err(|e| format!("--api-key-file {e}"))?,
        );
    }
    Ok(Arc::new(Auth {
        keys: ApiKeys::new(keys).map_err(|e| format!("--api-key: {e}"))?,
        metrics_public: args.metrics_public,
        metrics: args.metrics_on(),
    }))
}

/// `--reasoning` and `--temp` within their ranges.
fn check_sampling_flags(args: &Args) -> AnyResult<()> {
    if !["on", "off", "auto"].contains(&args.reasoning.as_str()) {
        return Err(format!("--reasoning {}: give on, off or auto", args.reasoning).into());
    }
    if args.temp.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        return Err("--temp: give a temperature in [0, 2]".into());
    }
    args.seed()?;
    args.sequences()?;
    args.kv_cache_type()?;
    Ok(())
}

/// `--chat-template-file` (its name and text) or a named `--chat-template`.
fn chat_template(args: &Args) -> AnyResult<Option<(String, String)>> {
    Ok(match &args.chat_template_file {
        Some(p) => Some((
            p.display().to_string(),
            std::fs::read_to_string(p)
                .map_err(|e| format!("--chat-template-file {}: {e}", p.display()))?,
        )),
        None => args.chat_template.as_deref().map(named_templates::resolve),
    })
}

/// The addresses of `--host`, comma-separated, brackets taken off IPv6 ones.
fn hosts(args: &Args) -> AnyResult<Vec<String>> {
    let hosts: Vec<String> = args
        .host
        .split(',')
        .map(|h| {
            h.trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned()
        })
        .filter(|h| !h.is_empty())
        .collect();
    if hosts.is_empty() {
        return Err("--host: give at least one address".into());
    }
    Ok(hosts)
}

/// A sentence-transformers directory: the embedding routes over its encoder.
fn serve_encoder(args: &Args, path: &Path, shared: &Arc<Shared>) -> AnyResult<Served> {
    let embedder = qkv::models::bert::Embedder::load(path)?;
    let what = format!(
        "an encoder of {} dimensions, inputs up to {} tokens",
        embedder.dim(),
        embedder.encoder().config().max_seq_length
    );
    let state = embed::EmbedState::spawn(shared.clone(), embedder, args.queue)?;
    Ok((embed::routes(Arc::new(state)), what, None))
}

/// A BERT cross-encoder: the rerank routes, with or without `--reranking`.
fn serve_cross_encoder(args: &Args, path: &Path, shared: &Arc<Shared>) -> AnyResult<Served> {
    let cross = qkv::models::bert::CrossEncoder::load(path)?;
    let positions = cross.bert().config().max_positions;
    let context = args.ctx.unwrap_or(positions).min(positions);
    let what = format!("a cross-encoder reranking pairs of up to {context} tokens");
    let state = Arc::new(rerank::RerankState {
        shared: shared.clone(),
        scorer: Some(rerank::Scorer::Cross(Arc::new(cross))),
        context,
        model_name: shared.model_name.clone(),
    });
    Ok((rerank::cross_routes(state), what, None))
}

/// A decoder: the batch engine's worker and the chat, completion and native routes.
fn serve_decoder(
    args: &Args,
    path: &Path,
    shared: &Arc<Shared>,
    metrics: Arc<Metrics>,
    template: Option<(String, String)>,
    (pooling, reranking): (qkv_server::embedding::Pooling, bool),
) -> AnyResult<Served> {
    let options = ModelOptions {
        dtype: args.dtype,
        act_precision: args
            .act_bits
            .unwrap_or(qkv::kernels::quant::x8::DEFAULT_ACT_PRECISION),
        interleave: std::env::var_os("QKV_NO_INTERLEAVE").is_none_or(|v| v == "0"),
    };
    let model = Arc::new(Model::load(path, &options)?);
    let Some(tokenizer) = model.tokenizer() else {
        return Err(format!("{}: the model has no tokenizer", path.display()).into());
    };
    let lora = lora::Adapters::load(&model, &args.lora_adapters()?)?;
    let reranker = match reranking {
        true => Some(rerank::Reranker::new(tokenizer, model.vocab_size())?),
        false => None,
    };
    let ctx = args.context(model.config().context)?;
    let (step_tokens, prefill_step_tokens) = args.step_tokens();
    let engine = Engine::new(
        model.clone(),
        EngineOptions {
            max_sequences: args.sequences()?,
            context: ctx,
            kv_budget: args.kv_budget.map(|mb| mb.saturating_mul(1 << 20)),
            step_tokens,
            prefill_step_tokens,
            queue: args.queue,
            kv_dtype: args.kv_cache_type()?,
        },
    )?;
    let mut engine = engine;
    if let Some(draft) = &args.model_draft {
        // The draft model is loaded as the model is; one of another vocabulary is refused
        // with an error naming both files.
        engine.set_draft_model(Arc::new(Model::load(draft, &options)?))?;
    }
    let has_draft = engine.draft_model().is_some();
    let what = format!("{} sequences of {ctx} positions", engine.max_running());
    let max_sequences = engine.max_running();
    let sleep_after = match args.sleep_idle_seconds {
        None | Some(-1) => None,
        Some(s) => Some(Duration::from_secs(u64::try_from(s).map_err(|_| {
            format!("--sleep-idle-seconds {s}: give a number of seconds, or -1")
        })?)),
    };
    if let Some(dir) = &args.slot_save_path {
        // As llama-server: the directory is made when missing.
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("--slot-save-path {}: {e}", dir.display()))?;
    }
    let worker = Worker::spawn(engine, metrics, sleep_after);
    let grammars = qkv_server::constraint::Grammars::new(model.clone());
    if let Err(e) = &grammars {
        eprintln!("qkv-server: no constrained output: {e}");
    }
    let options = chat::ServeOptions {
        template,
        no_reasoning: args.reasoning == "off",
        n_predict: args
            .n_predict
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0),
        temperature: args.temp,
        verbose: args.verbose,
        seed: args.seed()?,
        slots: !args.no_slots,
        metrics: args.metrics_on(),
        model_path: path.display().to_string(),
        max_sequences,
        pooling: args.embeddings.then_some(pooling),
        speculation: qkv_server::speculative::server_default(
            args.spec.as_deref(),
            args.spec_max,
            args.spec_min,
            has_draft,
        )?,
        draft_model: has_draft,
        slot_save_path: args.slot_save_path.clone(),
        context_shift: args.context_shift && !args.no_context_shift,
        n_keep: args.keep,
        spm_infill: args.spm_infill,
        n_batch: args.batch_size.unwrap_or(2048).max(1),
    };
    let rerank = Arc::new(rerank::RerankState {
        shared: shared.clone(),
        scorer: reranker.map(|r| rerank::Scorer::Decoder(model.clone(), r)),
        context: ctx,
        model_name: shared.model_name.clone(),
    });
    let state = Arc::new(AppState {
        options,
        grammars,
        model,
        model_name: shared.model_name.clone(),
        context: ctx,
        worker: worker.clone(),
        shared: shared.clone(),
        lora,
    });
    Ok((
        decoder_routes(state).merge(rerank::routes(rerank)),
        what,
        Some(worker),
    ))
}

/// Binds every address, serves `app` until SIGTERM or Ctrl-C, then drains: running
/// requests get `--grace` seconds before the worker cancels what still runs.
#[allow(clippy::too_many_arguments)]
async fn listen_until_stopped(
    args: &Args,
    hosts: &[String],
    app: Router,
    auth: &Auth,
    path: &Path,
    shared: &Arc<Shared>,
    what: &str,
    worker: Option<Worker>,
) -> AnyResult<()> {
    let listener = tokio::net::TcpListener::bind((hosts[0].as_str(), args.port)).await?;
    // The other addresses on the same port (the one picked for the first, with port 0).
    let port = listener.local_addr()?.port();
    let mut more = Vec::new();
    for h in &hosts[1..] {
        more.push(tokio::net::TcpListener::bind((h.as_str(), port)).await?);
    }
    let keys = match auth.keys.len() {
        0 => "no API key".to_owned(),
        n => format!(
            "{n} API key{}{}",
            if n == 1 { "" } else { "s" },
            if auth.metrics_public {
                ", /metrics public"
            } else {
                ""
            }
        ),
    };
    eprintln!(
        "qkv-server: {} as `{}` ({what}; {keys}) listening on http://{}",
        path.display(),
        shared.model_name,
        listener.local_addr()?
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut others = Vec::new();
    for l in more {
        eprintln!("qkv-server: also listening on http://{}", l.local_addr()?);
        let mut rx = stop_rx.clone();
        let app = app.clone();
        others.push(tokio::spawn(async move {
            listen::serve(l, app, async move {
                rx.wait_for(|stop| *stop).await.ok();
            })
            .await
        }));
    }
    let grace = Duration::from_secs(args.grace);
    let st = shared.clone();
    listen::serve(listener, app, async move {
        shutdown_signal().await;
        stop_tx.send(true).ok();
        eprintln!("qkv-server: shutting down: finishing the running requests");
        st.draining.store(true, Ordering::SeqCst);
        if let Some(worker) = worker {
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                eprintln!("qkv-server: grace period over: cancelling what still runs");
                worker.cancel_all();
            });
        }
    })
    .await?;
    for o in others {
        o.await??;
    }
    eprintln!("qkv-server: stopped");
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
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

/// Whether `path` is a sentence-transformers directory (served as an encoder).
fn is_sentence_transformers(path: &Path) -> bool {
    path.is_dir() && path.join("modules.json").is_file()
}

/// The routes of a decoder.
fn decoder_routes(state: Arc<AppState>) -> Router {
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
fn router(
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
async fn authorize(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
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
