//! Reranking: `POST /rerank`, `/reranking` and `/v1/rerank` score each document against a
//! query, with one of two kinds of model:
//! - a decoder that answers yes or no, as Qwen3-Reranker does (`--reranking`): the query and
//!   the document go into the reranker's prompt, the model reads it, and the score is the
//!   probability of `yes` against `no` at the last position (`σ(logit_yes − logit_no)`), in
//!   [0, 1];
//! - a BERT cross-encoder ([`qkv::models::bert::CrossEncoder`], a Hugging Face directory of
//!   `BertForSequenceClassification`): the pair is read together and the score is the
//!   head's first logit, as llama-server reports it.
//!
//! Requests come in Jina's and Cohere's shape (`query`, `documents`, `top_n`,
//! `return_documents`; answered with `results` of `index` and `relevance_score`, best
//! first, and `usage`) or in Hugging Face TEI's (`texts` for `documents`, `return_text`;
//! answered with a bare list of `index` and `score`). A document is a string or an object
//! with a string `text`. Documents run one at a time off the async runtime, each a fresh
//! sequence; generation goes on beside them on the engine thread.

use crate::native::not_supported;
use crate::{body, counted, Shared};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use qkv::load::Model;
use qkv::models::bert::CrossEncoder;
use qkv::tokenizer::{EncodeOptions, Tokenizer};
use qkv::weights::FloatType;
use qkv_server::body::Body;
use qkv_server::error::ApiError;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The instruction of a request that gives none (Qwen3-Reranker's default).
const DEFAULT_INSTRUCTION: &str =
    "Given a web search query, retrieve relevant passages that answer the query";

/// How a decoder scores a document: the ids of its `yes` and `no` tokens.
#[derive(Clone, Copy, Debug)]
pub struct Reranker {
    yes: u32,
    no: u32,
}

impl Reranker {
    /// The reranker of a model whose vocabulary spells `yes` and `no` as single tokens
    /// (within the `vocab` logits the model gives); an error saying so otherwise.
    pub fn new(tokenizer: &Tokenizer, vocab: usize) -> Result<Reranker, String> {
        let within = |id: u32| (id as usize) < vocab;
        match (tokenizer.token_id("yes"), tokenizer.token_id("no")) {
            (Some(yes), Some(no)) if within(yes) && within(no) => Ok(Reranker { yes, no }),
            _ => Err(
                "--reranking: the model's vocabulary has no single `yes` and `no` \
                 tokens, which a decoder reranker answers with"
                    .into(),
            ),
        }
    }
}

/// What scores the documents.
pub enum Scorer {
    /// A decoder answering yes or no.
    Decoder(Arc<Model>, Reranker),
    /// A BERT cross-encoder.
    Cross(Arc<CrossEncoder>),
}

/// What the rerank routes see.
pub struct RerankState {
    pub shared: Arc<Shared>,
    /// `None`: the server does not rerank (the routes answer 501).
    pub scorer: Option<Scorer>,
    /// Most tokens one document's prompt (or pair) may take.
    pub context: usize,
    /// The name answers report.
    pub model_name: String,
}

/// The prompt the reranker reads for one document (Qwen3-Reranker's).
pub fn prompt(instruction: &str, query: &str, document: &str) -> String {
    format!(
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the \
         Query and the Instruct provided. Note that the answer can only be \"yes\" or \
         \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n\
         <Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
}

/// One reranking pass at a time: they share the cores with the engine as it is.
static PASS: Mutex<()> = Mutex::new(());

/// The fields of a rerank request.
struct Request {
    query: String,
    instruction: String,
    documents: Vec<String>,
    top_n: usize,
    /// TEI's shape (`texts`) rather than Jina's and Cohere's.
    tei: bool,
    /// Return each document's text (`return_text` in TEI's shape, `return_documents` else).
    return_text: bool,
}

/// Reads a rerank request; a 400 naming the field at fault.
fn read(b: &Body) -> Result<Request, ApiError> {
    let query = match b.field("query") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => return Err(ApiError::invalid("query", "`query` is required")),
        Some(_) => return Err(ApiError::invalid("query", "`query` must be a string")),
    };
    let tei = b.field("documents").is_none() && b.field("texts").is_some();
    let field = if tei { "texts" } else { "documents" };
    let list = match b.field(field) {
        Some(Value::Array(a)) if !a.is_empty() => a,
        _ => {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` must be a non-empty array of strings"),
            ))
        }
    };
    let documents = list
        .iter()
        .enumerate()
        .map(|(i, d)| match d {
            Value::String(s) => Ok(s.clone()),
            Value::Object(o) => match o.get("text") {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(ApiError::invalid(
                    &format!("{field}[{i}]"),
                    format!("`{field}[{i}]` must be a string or an object with a string `text`"),
                )),
            },
            _ => Err(ApiError::invalid(
                &format!("{field}[{i}]"),
                format!("`{field}[{i}]` must be a string"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let top_n = match b.field("top_n") {
        None | Some(Value::Null) => documents.len(),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => usize::try_from(n).unwrap_or(usize::MAX),
            _ => {
                return Err(ApiError::invalid(
                    "top_n",
                    "`top_n` must be a positive integer",
                ))
            }
        },
    };
    let instruction = match b.field("instruction") {
        None | Some(Value::Null) => DEFAULT_INSTRUCTION.to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                "instruction",
                "`instruction` must be a string",
            ))
        }
    };
    let flag = if tei {
        "return_text"
    } else {
        "return_documents"
    };
    let return_text = b.bool(flag, false)?;
    b.str("model")?;
    Ok(Request {
        query,
        instruction,
        documents,
        top_n,
        tei,
        return_text,
    })
}

/// A 400 unless the `i`th document's `n` tokens fit in `context`.
fn fits(i: usize, n: usize, context: usize) -> Result<(), ApiError> {
    if n <= context {
        return Ok(());
    }
    let mut e = ApiError::exceeds_context(n, context);
    e.message = format!(
        "document {i} with the query is {n} tokens, more than the context of {context} positions"
    );
    Err(e)
}

/// Each document's score and token count, in the request's order, from a cross-encoder.
async fn score_pairs(
    state: &RerankState,
    cross: &Arc<CrossEncoder>,
    r: &Request,
) -> Result<Vec<(f32, usize)>, ApiError> {
    let mut pairs = Vec::with_capacity(r.documents.len());
    for (i, d) in r.documents.iter().enumerate() {
        let pair = cross.pair(&r.query, d)?;
        fits(i, pair.0.len(), state.context)?;
        pairs.push(pair);
    }
    let cross = cross.clone();
    tokio::task::spawn_blocking(move || -> qkv::Result<Vec<(f32, usize)>> {
        let logits = cross.logits(&pairs)?;
        Ok(logits
            .iter()
            .zip(&pairs)
            .map(|(l, (ids, _))| (l.first().copied().unwrap_or(0.0), ids.len()))
            .collect())
    })
    .await
    .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(ApiError::from)
}

/// Each document's score and its prompt's token count, in the request's order; counts the
/// tokens and passes in the metrics.
async fn score(state: &RerankState, r: &Request) -> Result<Vec<(f32, usize)>, ApiError> {
    let out = match &state.scorer {
        Some(Scorer::Decoder(m, y)) => score_decoder(state, m.clone(), *y, r).await?,
        Some(Scorer::Cross(c)) => score_pairs(state, c, r).await?,
        None => {
            return Err(ApiError::status(
                StatusCode::NOT_IMPLEMENTED,
                "reranking is off",
            ))
        }
    };
    let m = &state.shared.metrics;
    let tokens: usize = out.iter().map(|&(_, n)| n).sum();
    m.prompt_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    m.steps.fetch_add(out.len() as u64, Ordering::Relaxed);
    Ok(out)
}

/// Each document's score and its prompt's token count, from a decoder answering yes or no.
async fn score_decoder(
    state: &RerankState,
    model: Arc<Model>,
    reranker: Reranker,
    r: &Request,
) -> Result<Vec<(f32, usize)>, ApiError> {
    let tokenizer = model.tokenizer().expect("checked at start");
    let options = EncodeOptions {
        add_special: false,
        parse_special: true,
    };
    let mut seqs = Vec::with_capacity(r.documents.len());
    for (i, d) in r.documents.iter().enumerate() {
        let ids = tokenizer.encode_with(&prompt(&r.instruction, &r.query, d), options)?;
        fits(i, ids.len(), state.context)?;
        seqs.push(ids);
    }
    tokio::task::spawn_blocking(move || -> qkv::Result<Vec<(f32, usize)>> {
        let _one = PASS.lock().unwrap_or_else(|p| p.into_inner());
        let decoder = model.decoder();
        let longest = seqs.iter().map(Vec::len).max().unwrap_or(1);
        let mut run = decoder.new_state(longest, FloatType::F32, longest.min(512))?;
        let mut logits = vec![0f32; model.vocab_size()];
        seqs.iter()
            .map(|ids| {
                decoder.forward(&mut run, ids, 0, Some(&mut logits))?;
                let d = logits[reranker.yes as usize] - logits[reranker.no as usize];
                Ok((1.0 / (1.0 + (-d).exp()), ids.len()))
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(ApiError::from)
}

/// `POST /rerank`, `/reranking` and `/v1/rerank`.
pub async fn rerank(
    State(state): State<Arc<RerankState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    if state.scorer.is_none() {
        return counted(
            &state.shared,
            body(&state.shared, raw).map(|_| {
                not_supported(
                    "this server does not rerank: start qkv-server with --reranking on a \
                     reranker",
                )
            }),
        );
    }
    let r = async {
        let b = body(&state.shared, raw)?;
        let r = read(&b)?;
        let scores = score(&state, &r).await?;
        let tokens: usize = scores.iter().map(|&(_, n)| n).sum();
        let mut order: Vec<usize> = (0..scores.len()).collect();
        // Best first; equal scores keep the request's order.
        order.sort_by(|&a, &b| scores[b].0.total_cmp(&scores[a].0));
        order.truncate(r.top_n);
        let label = if r.tei { "score" } else { "relevance_score" };
        let results: Vec<Value> = order
            .iter()
            .map(|&i| {
                let mut e = json!({"index": i, label: scores[i].0});
                if r.return_text && r.tei {
                    e["text"] = json!(r.documents[i]);
                } else if r.return_text {
                    e["document"] = json!({"text": r.documents[i]});
                }
                e
            })
            .collect();
        if r.tei {
            return Ok(Json(Value::Array(results)).into_response());
        }
        Ok(Json(json!({
            "model": b.str("model")?.unwrap_or(&state.model_name),
            "object": "list",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results,
        }))
        .into_response())
    }
    .await;
    counted(&state.shared, r)
}

/// The rerank routes over `state`.
pub fn routes(state: Arc<RerankState>) -> axum::Router {
    use axum::routing::post;
    axum::Router::new()
        .route("/rerank", post(rerank))
        .route("/reranking", post(rerank))
        .route("/v1/rerank", post(rerank))
        .route("/v1/reranking", post(rerank))
        .with_state(state)
}

/// A cross-encoder server's routes: the rerank routes, `/v1/models` (and `/models`),
/// `/tokenize` and `/detokenize`; the generation and embedding routes answer a 400 saying
/// the model is a reranker.
pub fn cross_routes(state: Arc<RerankState>) -> axum::Router {
    use axum::routing::{get, post};
    let models = axum::Router::new()
        .route("/v1/models", get(cross_models))
        .route("/models", get(cross_models))
        .route("/tokenize", post(cross_tokenize))
        .route("/detokenize", post(cross_detokenize))
        .route("/v1/chat/completions", post(not_a_decoder))
        .route("/chat/completions", post(not_a_decoder))
        .route("/v1/completions", post(not_a_decoder))
        .route("/completion", post(not_a_decoder))
        .route("/completions", post(not_a_decoder))
        .route("/v1/embeddings", post(not_a_decoder))
        .route("/embeddings", post(not_a_decoder))
        .with_state(state.clone());
    routes(state).merge(models)
}

fn cross(state: &RerankState) -> Option<&CrossEncoder> {
    match &state.scorer {
        Some(Scorer::Cross(c)) => Some(c),
        _ => None,
    }
}

async fn cross_models(State(state): State<Arc<RerankState>>) -> Json<Value> {
    let meta = cross(&state).map_or(json!({}), |c| {
        let cfg = c.bert().config();
        json!({"n_ctx": state.context, "n_vocab": cfg.vocab_size, "n_embd": cfg.hidden_size})
    });
    crate::models::model_list(&state.shared, meta)
}

async fn cross_tokenize(
    State(state): State<Arc<RerankState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    match cross(&state) {
        Some(c) => crate::tokenize_with(&state.shared, c.tokenizer(), raw),
        None => not_supported("no tokenizer"),
    }
}

async fn cross_detokenize(
    State(state): State<Arc<RerankState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    match cross(&state) {
        Some(c) => crate::detokenize_with(&state.shared, c.tokenizer(), raw),
        None => not_supported("no tokenizer"),
    }
}

/// A route a cross-encoder cannot answer.
async fn not_a_decoder(
    State(state): State<Arc<RerankState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let why = format!(
        "`{}` is a cross-encoder reranker: it serves POST /v1/rerank only",
        state.model_name
    );
    crate::unsupported(&state.shared, raw, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Body {
        Body::parse(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn requests_are_read_in_both_shapes_and_bad_ones_name_their_field() {
        let r = read(&body(
            json!({"query": "q", "documents": ["a", {"text": "b"}],
                                  "top_n": 1, "return_documents": true}),
        ))
        .unwrap();
        assert_eq!(r.documents, ["a", "b"]);
        assert_eq!((r.top_n, r.tei, r.return_text), (1, false, true));
        let r = read(&body(
            json!({"query": "q", "texts": ["a"], "return_text": true}),
        ))
        .unwrap();
        assert_eq!((r.top_n, r.tei, r.return_text), (1, true, true));
        for (v, field) in [
            (json!({"documents": ["a"]}), "query"),
            (json!({"query": 1, "documents": ["a"]}), "query"),
            (json!({"query": "q", "documents": []}), "documents"),
            (json!({"query": "q", "documents": null}), "documents"),
            (json!({"query": "q", "documents": 123}), "documents"),
            (json!({"query": "q", "documents": [1, 2]}), "documents[0]"),
            (
                json!({"query": "q", "documents": ["a", {"t": 1}]}),
                "documents[1]",
            ),
            (
                json!({"query": "q", "documents": ["a"], "top_n": 0}),
                "top_n",
            ),
            (
                json!({"query": "q", "documents": ["a"], "top_n": -2}),
                "top_n",
            ),
        ] {
            let e = read(&body(v.clone()))
                .err()
                .unwrap_or_else(|| panic!("{v}"));
            assert_eq!(e.param.as_deref(), Some(field), "{v}");
        }
    }
}
