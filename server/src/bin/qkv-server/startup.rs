//! What the flags make of a model before it is served: the process's thread pool, the API
//! keys, the checked sampling flags, the chat template and the addresses; then the model
//! loaded as an encoder, a cross-encoder or a decoder with its batch engine's worker, and
//! its routes served on every address until SIGTERM or Ctrl-C.

use crate::args::Args;
use crate::metrics::Metrics;
use crate::routes::{decoder_routes, Auth};
use crate::worker::Worker;
use crate::{chat, embed, listen, lora, named_templates, rerank};
use crate::{AnyResult, AppState, Shared};
use axum::Router;
use qkv::engine::{Engine, EngineOptions};
use qkv::load::{Model, ModelOptions};
use qkv_server::auth::ApiKeys;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// What a model becomes in the server.
pub struct Served {
    /// The routes of its kind (without those every server has).
    pub routes: Router,
    /// What it serves, for the line that says the server listens.
    pub what: String,
    /// The batch engine's worker (none for an encoder).
    pub worker: Option<Worker>,
}

/// `--threads`: the process's pool.
pub fn set_up_process(args: &Args) -> AnyResult<()> {
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
pub fn auth(args: &Args) -> AnyResult<Arc<Auth>> {
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
pub fn check_sampling_flags(args: &Args) -> AnyResult<()> {
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
pub fn chat_template(args: &Args) -> AnyResult<Option<(String, String)>> {
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
pub fn hosts(args: &Args) -> AnyResult<Vec<String>> {
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
pub fn serve_encoder(args: &Args, path: &Path, shared: &Arc<Shared>) -> AnyResult<Served> {
    let embedder = qkv::models::bert::Embedder::load(path)?;
    let what = format!(
        "an encoder of {} dimensions, inputs up to {} tokens",
        embedder.dim(),
        embedder.encoder().config().max_seq_length
    );
    let state = embed::EmbedState::spawn(shared.clone(), embedder, args.queue)?;
    Ok(Served {
        routes: embed::routes(Arc::new(state)),
        what,
        worker: None,
    })
}

/// A BERT cross-encoder: the rerank routes, with or without `--reranking`.
pub fn serve_cross_encoder(args: &Args, path: &Path, shared: &Arc<Shared>) -> AnyResult<Served> {
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
    Ok(Served {
        routes: rerank::cross_routes(state),
        what,
        worker: None,
    })
}

/// A decoder: the batch engine's worker and the chat, completion and native routes.
pub fn serve_decoder(
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
    Ok(Served {
        routes: decoder_routes(state).merge(rerank::routes(rerank)),
        what,
        worker: Some(worker),
    })
}

/// The start of the line that says the server listens: the model, the name it is served
/// as, what it serves and who may call it.
pub fn about(path: &Path, shared: &Shared, what: &str, auth: &Auth) -> String {
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
    format!(
        "{} as `{}` ({what}; {keys})",
        path.display(),
        shared.model_name
    )
}

/// Serves `app` on every address until SIGTERM or Ctrl-C, then drains: running requests
/// get `--grace` seconds before the worker cancels what still runs.
pub async fn listen_until_stopped(
    args: &Args,
    hosts: &[String],
    app: Router,
    about: &str,
    shared: &Arc<Shared>,
    worker: Option<Worker>,
) -> AnyResult<()> {
    let grace = Duration::from_secs(args.grace);
    let st = shared.clone();
    listen::serve_all(hosts, args.port, app, about, async move {
        listen::shutdown_signal().await;
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
    eprintln!("qkv-server: stopped");
    Ok(())
}

/// Whether `path` is a sentence-transformers directory (served as an encoder).
pub fn is_sentence_transformers(path: &Path) -> bool {
    path.is_dir() && path.join("modules.json").is_file()
}
