//! The server of an encoder (a sentence-transformers directory): `POST /v1/embeddings`
//! through [`qkv::models::bert::Embedder`], the library code `decode embed` runs, on an
//! embedding thread of its own. The requests waiting when a pass starts are embedded
//! together (one [`SentenceEncoder::embed_sorted`] call, which sorts and packs the sequences
//! as `decode embed` does), so concurrent clients share the matrix products.

use crate::metrics::Metrics;
use crate::{body, counted, Shared};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use qkv::models::bert::{Embedder, SentenceEncoder};
use qkv_server::embedding::{self, Format, Input};
use qkv_server::error::ApiError;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;

/// Most tokens one embedding pass takes from the waiting requests (a request longer than
/// this runs alone).
const PASS_TOKENS: usize = 16384;

/// Sequences of one request, and where their embeddings go.
struct Job {
    seqs: Vec<Vec<u32>>,
    reply: oneshot::Sender<qkv::Result<Vec<Vec<f32>>>>,
}

impl Job {
    fn tokens(&self) -> usize {
        self.seqs.iter().map(Vec::len).sum()
    }
}

/// What the encoder's handlers see.
pub struct EmbedState {
    pub shared: Arc<Shared>,
    pub embedder: Arc<Embedder>,
    /// The model's positions (`max_position_embeddings`): longer inputs are refused.
    pub max_positions: usize,
    jobs: mpsc::Sender<Job>,
    /// Requests submitted and not yet taken into a pass.
    waiting: Arc<AtomicUsize>,
    queue: usize,
}

impl EmbedState {
    /// Starts the embedding thread over `embedder`; at most `queue` requests wait (more get
    /// 429).
    pub fn spawn(shared: Arc<Shared>, embedder: Embedder, queue: usize) -> std::io::Result<Self> {
        let embedder = Arc::new(embedder);
        let (tx, rx) = mpsc::channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let (e, w, m) = (embedder.clone(), waiting.clone(), shared.metrics.clone());
        std::thread::Builder::new()
            .name("qkv-embed".into())
            .spawn(move || run(e.encoder(), e.batch_size(), &rx, &w, &m))?;
        Ok(EmbedState {
            max_positions: embedder.encoder().bert().config().max_positions,
            shared,
            embedder,
            jobs: tx,
            waiting,
            queue,
        })
    }

    /// Embeds `seqs` (already checked) with whatever else is waiting.
    async fn embed(&self, seqs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, ApiError> {
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(qkv::Error::QueueFull {
                capacity: self.queue,
            }
            .into());
        }
        let (reply, answer) = oneshot::channel();
        let gone = || {
            ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the embedding thread has stopped",
            )
        };
        if self.jobs.send(Job { seqs, reply }).is_err() {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(gone());
        }
        answer.await.map_err(|_| gone())?.map_err(ApiError::from)
    }
}

/// The embedding thread: takes every job waiting (up to [`PASS_TOKENS`] tokens, at least
/// one job), embeds their sequences in one call, and answers each job with its own.
fn run(
    encoder: &SentenceEncoder,
    batch_size: usize,
    rx: &mpsc::Receiver<Job>,
    waiting: &AtomicUsize,
    m: &Metrics,
) {
    let mut backlog: VecDeque<Job> = VecDeque::new();
    loop {
        if backlog.is_empty() {
            match rx.recv() {
                Ok(job) => backlog.push_back(job),
                Err(_) => return,
            }
        }
        backlog.extend(rx.try_iter());
        let mut pass = Vec::new();
        let mut tokens = 0;
        let mut taken = 0;
        let fits = |job: &Job, pass: &[Job], tokens: usize| {
            pass.is_empty() || tokens + job.tokens() <= PASS_TOKENS
        };
        while let Some(job) = backlog.pop_front() {
            if !fits(&job, &pass, tokens) {
                backlog.push_front(job);
                break;
            }
            taken += 1;
            // A client that went away while waiting costs no pass.
            if !job.reply.is_closed() {
                tokens += job.tokens();
                pass.push(job);
            }
        }
        waiting.fetch_sub(taken, Ordering::SeqCst);
        if pass.is_empty() {
            continue;
        }
        m.running.store(pass.len() as u64, Ordering::Relaxed);
        m.queued
            .store(waiting.load(Ordering::SeqCst) as u64, Ordering::Relaxed);
        let seqs: Vec<&[u32]> = pass
            .iter()
            .flat_map(|j| j.seqs.iter().map(Vec::as_slice))
            .collect();
        let started = std::time::Instant::now();
        let result = encoder.embed_sorted(&seqs, batch_size);
        m.step_seconds.observe(started.elapsed());
        m.steps.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(vectors) => {
                m.prompt_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
                let mut vectors = vectors.into_iter();
                for job in pass {
                    let n = job.seqs.len();
                    job.reply.send(Ok(vectors.by_ref().take(n).collect())).ok();
                }
            }
            Err(e) => {
                // The requests were checked, so this is the pass's own failure: every one
                // of them gets it.
                let msg = e.to_string();
                for job in pass {
                    job.reply
                        .send(Err(qkv::Error::Unsupported(msg.clone())))
                        .ok();
                }
            }
        }
        m.running.store(0, Ordering::Relaxed);
        m.queued
            .store(waiting.load(Ordering::SeqCst) as u64, Ordering::Relaxed);
    }
}

/// The encoder's routes (those common to both kinds of model are added by the caller).
pub fn routes(state: Arc<EmbedState>) -> Router {
    Router::new()
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/chat/completions", post(not_a_decoder))
        .route("/v1/completions", post(not_a_decoder))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .with_state(state)
}

/// Checks and tokenizes the input: every sequence non-empty, at most the model's positions
/// long before truncation (longer sequences are cut to `max_seq_length` as
/// sentence-transformers cuts them), and every id in the vocabulary. Errors name
/// `input[i]` (or `input` for a single item).
fn sequences(state: &EmbedState, input: Input) -> Result<Vec<Vec<u32>>, ApiError> {
    let e = &state.embedder;
    let single = input.len() == 1;
    let field = |i: usize| {
        if single {
            "input".to_owned()
        } else {
            format!("input[{i}]")
        }
    };
    let untruncated: Vec<Vec<u32>> = match input {
        Input::Texts(texts) => texts
            .iter()
            .map(|t| e.untruncated_ids(t))
            .collect::<qkv::Result<_>>()?,
        Input::Ids(seqs) => seqs,
    };
    let vocab = e.encoder().bert().config().vocab_size;
    let mut out = Vec::with_capacity(untruncated.len());
    for (i, ids) in untruncated.into_iter().enumerate() {
        if ids.is_empty() {
            return Err(ApiError::invalid(
                &field(i),
                format!("`{}` encodes to no tokens", field(i)),
            ));
        }
        if ids.len() > state.max_positions {
            return Err(ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::invalid(
                    &field(i),
                    format!(
                        "`{}` is {} tokens long, past the model's {} positions",
                        field(i),
                        ids.len(),
                        state.max_positions
                    ),
                )
            });
        }
        if let Some(&id) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid(
                &field(i),
                format!(
                    "`{}` holds the token id {id}, outside the vocabulary of {vocab}",
                    field(i)
                ),
            ));
        }
        out.push(e.truncate(ids));
    }
    Ok(out)
}

/// `POST /v1/embeddings`.
async fn embeddings(
    State(state): State<Arc<EmbedState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let b = body(&state.shared, raw)?;
        let f = embedding::fields(&b)?;
        let dim = state.embedder.dim();
        if f.dimensions.is_some_and(|d| d != dim) {
            return Err(ApiError::invalid(
                "dimensions",
                format!("this model's embeddings have {dim} dimensions, and cannot be cut"),
            ));
        }
        // Tokenizing a long list takes a while: not on the async runtime.
        let st = state.clone();
        let seqs = tokio::task::spawn_blocking(move || sequences(&st, f.input))
            .await
            .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
        let tokens: usize = seqs.iter().map(Vec::len).sum();
        let vectors = state.embed(seqs).await?;
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let embedding = match f.format {
                    Format::Float => json!(v),
                    Format::Base64 => json!(embedding::base64_f32(v)),
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        Ok(Json(json!({
            "object": "list",
            "data": data,
            "model": state.shared.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
        .into_response())
    }
    .await;
    counted(&state.shared, r)
}

/// The generation routes on an encoder: a 400 that says why.
async fn not_a_decoder(
    State(state): State<Arc<EmbedState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let why = format!(
        "`{}` is an embedding model (a sentence-transformers encoder), which generates no \
         text: use POST /v1/embeddings",
        state.shared.model_name
    );
    crate::unsupported(&state.shared, raw, why)
}

/// `GET /v1/models`.
async fn models(State(state): State<Arc<EmbedState>>) -> Json<Value> {
    let cfg = state.embedder.encoder().config();
    crate::models::model_list(
        &state.shared,
        json!({
            "n_ctx": cfg.max_seq_length,
            "n_vocab": state.embedder.encoder().bert().config().vocab_size,
            "n_embd": state.embedder.dim(),
        }),
    )
}

async fn tokenize(
    State(state): State<Arc<EmbedState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    crate::tokenize_with(&state.shared, state.embedder.tokenizer(), raw)
}

async fn detokenize(
    State(state): State<Arc<EmbedState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    crate::detokenize_with(&state.shared, state.embedder.tokenizer(), raw)
}
