//! llama-server's native API on the same engine as the OpenAI one: `POST /completion` (and
//! `/completions`, as llama-server routes it), `POST /apply-template`, `GET /props`,
//! `GET /slots`, and `POST /chat/completions/input_tokens`. The request fields are read by
//! [`qkv_server::native_fields`]; the generation is [`generation::start`]'s run, answered in
//! llama-server's shapes: `content`, `tokens`, `stop`, `stop_type`, `timings`,
//! `tokens_predicted`, `tokens_evaluated`, `completion_probabilities`, and its stream (one
//! `data:` event per token, the last with `stop: true`, no `[DONE]`).

use crate::generation::{self, Kind, Piece, Run, TokenLogprob};
use crate::openai::FINGERPRINT;
use crate::{body, chat, counted, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use qkv::speculative::Speculation;
use qkv::tokenizer::{EncodeOptions, Tokenizer};
use qkv_server::body::Body;
use qkv_server::error::ApiError;
use qkv_server::native_fields::{self as fields, Fields, PromptPart};
use qkv_server::request::Params;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The token ids of one prompt sequence: text parts encoded (the first with the special
/// tokens the model adds, as llama-server does), ids checked against the vocabulary.
pub fn encode(
    tokenizer: &Tokenizer,
    parts: &[PromptPart],
    vocab: usize,
) -> Result<Vec<u32>, ApiError> {
    let mut ids = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        match part {
            PromptPart::Id(t) if (*t as usize) < vocab => ids.push(*t),
            PromptPart::Id(t) => {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token {t} is past the vocabulary ({vocab} tokens)"),
                ))
            }
            PromptPart::Text(s) => ids.extend(tokenizer.encode_with(
                s,
                EncodeOptions {
                    add_special: i == 0,
                    parse_special: true,
                },
            )?),
        }
    }
    Ok(ids)
}

/// The text of token `id` as the model spells it, special tokens included.
fn piece(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer
        .token_bytes(id)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

/// The sampling parameters of a native request: the shared ones, with the native
/// `n_predict`, `n_probs` and any number of stop strings.
fn native_params(state: &AppState, b: &Body, f: &Fields) -> Result<Params, ApiError> {
    let rest = b.without(&[
        "stop",
        "n_predict",
        "max_tokens",
        "logprobs",
        "top_logprobs",
        "n",
    ]);
    let mut p = crate::params(state, &rest, false)?;
    p.stop = f.stop.clone();
    p.max_tokens = crate::cap_tokens(state, f.n_predict);
    p.logprobs = f.n_probs > 0;
    p.top_logprobs = f.n_probs;
    Ok(p)
}

/// `POST /completion` and `POST /completions`.
pub async fn completion(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let b = body(&state.shared, raw)?;
        let f = fields::fields(&b)?;
        native_params(&state, &b, &f)?;
        let prompts = fields::prompts(&b)?;
        let tokenizer = state.model.tokenizer().expect("checked at start");
        let vocab = state.model.vocab_size();
        let ids = prompts
            .iter()
            .map(|parts| encode(tokenizer, parts, vocab))
            .collect::<Result<Vec<_>, _>>()?;
        answer(&state, &b, ids).await
    }
    .await;
    counted(&state.shared, r)
}

/// Generates from each of `ids` with the native fields and sampling parameters of `b`, and
/// answers in llama-server's shapes (one object, a list of them, or a stream).
pub async fn answer(
    state: &Arc<AppState>,
    b: &Body,
    ids: Vec<Vec<u32>>,
) -> Result<Response, ApiError> {
    {
        let f = fields::fields(b)?;
        let p = native_params(state, b, &f)?;
        if ids.len() > 1 && p.stream {
            return Err(ApiError::invalid(
                "prompt",
                "a batch of prompts is answered whole only: set `stream` to false",
            ));
        }
        let mut runs = Vec::with_capacity(ids.len());
        for prompt in ids {
            let post = chat::completion_post(state, b)?;
            runs.push(
                generation::start(state.clone(), Kind::Completion, prompt, p.clone(), post).await?,
            );
        }
        if p.stream {
            let run = runs.pop().expect("one prompt at least");
            return Ok(stream(run, f).into_response());
        }
        let done = futures_util::future::join_all(runs.into_iter().map(|r| whole(r, &f))).await;
        let mut answers = done.into_iter().collect::<Result<Vec<_>, _>>()?;
        for (i, a) in answers.iter_mut().enumerate() {
            if a.get("index").is_some() {
                a["index"] = json!(i);
            }
        }
        Ok(if answers.len() == 1 {
            Json(answers.remove(0)).into_response()
        } else {
            Json(Value::Array(answers)).into_response()
        })
    }
}

/// One `completion_probabilities` entry (llama-server's shape; with
/// `post_sampling_probs`, probabilities instead of log-probabilities).
fn probability(tokenizer: &Tokenizer, t: &TokenLogprob, post: bool) -> Value {
    let entry = |id: u32, lp: f32| {
        let bytes = tokenizer
            .token_bytes(id)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        let mut e = json!({"id": id, "token": String::from_utf8_lossy(&bytes), "bytes": bytes});
        if post {
            e["prob"] = json!(lp.exp());
        } else {
            e["logprob"] = json!(lp);
        }
        e
    };
    let (id, lp, top) = t;
    let mut e = entry(*id, *lp);
    let alts: Vec<Value> = top.iter().map(|(a, l)| entry(*a, *l)).collect();
    e[if post { "top_probs" } else { "top_logprobs" }] = json!(alts);
    e
}

/// llama-server's `generation_settings` for `run`'s request.
fn settings(run: &Run, f: &Fields) -> Value {
    let p = &run.p;
    let s = &p.sampler;
    let tokenizer = run.state.model.tokenizer().expect("checked at start");
    let mut bias: Vec<Value> = Vec::new();
    for b in &p.logit_bias {
        let tokens = match &b.key {
            fields::BiasKey::Token(t) => vec![*t],
            fields::BiasKey::Text(t) => tokenizer
                .encode_with(
                    t,
                    EncodeOptions {
                        add_special: false,
                        parse_special: true,
                    },
                )
                .unwrap_or_default(),
        };
        bias.extend(
            tokens
                .into_iter()
                .map(|t| json!({"token": t, "bias": b.bias})),
        );
    }
    if p.ignore_eos {
        // qkv's engine skips the end-of-text token: what a ban of it would do.
        if let Some(eos) = tokenizer.eos_id() {
            bias.push(json!({"token": eos, "bias": null}));
        }
    }
    let n_predict = p.max_tokens.map_or(-1, |n| n as i64);
    json!({
        "n_predict": n_predict, "max_tokens": n_predict, "seed": s.seed,
        "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
        "repeat_penalty": s.repeat_penalty, "repeat_last_n": s.repeat_last_n,
        "ignore_eos": p.ignore_eos, "stream": p.stream, "n_probs": f.n_probs,
        "post_sampling_probs": f.post_sampling_probs, "logit_bias": bias,
        "samplers": if f.samplers.is_empty() {
            json!(["penalties", "top_k", "top_p", "min_p", "temperature"])
        } else {
            json!(f.samplers)
        },
        "stop": p.stop, "cache_prompt": f.cache_prompt, "id_slot": f.id_slot,
        // Samplers llama-server has and qkv has not: reported as absent values.
        "adaptive_target": null, "adaptive_decay": null,
        "timings_per_token": f.timings_per_token,
    })
}

/// The last object of a generation (whole, or the stream's last event with `content` the
/// text not yet sent).
fn final_object(run: &Run, content: &str, f: &Fields, stream: bool) -> Value {
    let tokenizer = run.state.model.tokenizer().expect("checked at start");
    let stop_type = if run.stop_word.is_some() {
        "word"
    } else if run.eos || run.finished == Some("stop") {
        "eos"
    } else if run.finished == Some("length") {
        "limit"
    } else {
        "none"
    };
    let mut v = json!({
        "index": 0,
        "content": content,
        "tokens": if f.return_tokens && !stream { json!(run.tokens) } else { json!([]) },
        "id_slot": f.id_slot.max(0),
        "stop": true,
        "model": run.state.model_name,
        "tokens_predicted": run.tokens.len(),
        "tokens_evaluated": run.prompt_tokens,
        "generation_settings": settings(run, f),
        "prompt": run.prompt_text(),
        "has_new_line": run.text.contains('\n'),
        "truncated": run.truncated,
        "stop_type": stop_type,
        "stopping_word": run.stop_word.clone().unwrap_or_default(),
        "tokens_cached": run.prompt_tokens + run.tokens.len(),
        "timings": run.timings(),
    });
    if !stream && f.n_probs > 0 {
        v["completion_probabilities"] = json!(run
            .logprobs
            .iter()
            .map(|t| probability(tokenizer, t, f.post_sampling_probs))
            .collect::<Vec<_>>());
    }
    if f.response_fields.is_empty() {
        v
    } else {
        fields::select_fields(&v, &f.response_fields)
    }
}

/// The whole answer of one prompt.
async fn whole(mut run: Run, f: &Fields) -> Result<Value, ApiError> {
    let content = run.read_whole().await;
    if run.finished == Some("error") {
        return Err(ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("generation failed: {content}"),
        ));
    }
    Ok(final_object(&run, &content, f, false))
}

/// The native stream: one event per token (`content`, `tokens`, `stop: false`, the token's
/// probabilities when asked), then the final object with `stop: true`.
fn stream(
    run: Run,
    f: Fields,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    enum Phase {
        Running(Box<Run>, Fields, String),
        End,
    }
    let data = |v: &Value| Ok(SseEvent::default().data(v.to_string()));
    let events = futures_util::stream::unfold(
        Phase::Running(Box::new(run), f, String::new()),
        move |phase| async move {
            let Phase::Running(mut run, f, mut tail) = phase else {
                return None;
            };
            loop {
                match run.next().await {
                    // llama-server's `return_progress`: the prompt's progress and its
                    // timings, with no content.
                    Some(Piece {
                        progress: Some(p), ..
                    }) => {
                        let mut v = json!({
                            "index": 0, "content": "", "tokens": [], "stop": false,
                            "id_slot": f.id_slot.max(0), "tokens_predicted": 0,
                            "tokens_evaluated": run.prompt_tokens,
                        });
                        v["prompt_progress"] = p["prompt_progress"].clone();
                        v["timings"] = p["timings"].clone();
                        return Some((data(&v), Phase::Running(run, f, tail)));
                    }
                    Some(Piece {
                        text,
                        token: Some(t),
                        ..
                    }) => {
                        let tokenizer = run.state.model.tokenizer().expect("checked at start");
                        let mut v = json!({
                            "index": 0, "content": text, "tokens": [t.0], "stop": false,
                            "id_slot": f.id_slot.max(0), "tokens_predicted": run.tokens.len(),
                            "tokens_evaluated": run.prompt_tokens,
                        });
                        if f.n_probs > 0 {
                            v["completion_probabilities"] =
                                json!([probability(tokenizer, &t, f.post_sampling_probs)]);
                        }
                        if f.timings_per_token {
                            v["timings"] = run.timings();
                        }
                        return Some((data(&v), Phase::Running(run, f, tail)));
                    }
                    Some(Piece {
                        text, token: None, ..
                    }) => tail.push_str(&text),
                    None => {
                        run.drain().await;
                        let v = final_object(&run, &tail, &f, true);
                        return Some((data(&v), Phase::End));
                    }
                }
            }
        },
    );
    Sse::new(events)
}

/// `POST /apply-template`: the chat prompt the messages render to, as `prompt`.
pub async fn apply_template(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let b = body(&state.shared, raw)?;
        let text = chat::render(&state, &b)?;
        Ok(Json(json!({ "prompt": text })).into_response())
    })();
    counted(&state.shared, r)
}

/// `POST /chat/completions/input_tokens`: how many tokens the chat prompt takes.
pub async fn input_tokens(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let b = body(&state.shared, raw)?;
        let (ids, _) = chat::prepare(&state, &b)?;
        Ok(Json(json!({ "input_tokens": ids.len() })).into_response())
    })();
    counted(&state.shared, r)
}

/// The default sampling settings, as `/props` and `/slots` report them.
fn default_params(state: &AppState) -> Value {
    let d = qkv::sample::SamplerConfig::default();
    let o = &state.options;
    json!({
        "n_predict": o.n_predict.map_or(-1, |n| n as i64),
        "seed": o.seed.map_or(json!(u32::MAX), |s| json!(s)),
        "temperature": o.temperature.unwrap_or(d.temperature),
        "top_k": d.top_k, "top_p": d.top_p, "min_p": d.min_p,
        "repeat_penalty": d.repeat_penalty, "repeat_last_n": d.repeat_last_n,
        "stream": false, "n_probs": 0, "ignore_eos": false,
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
        "speculative.n_max": o.speculation.max_draft(),
        "speculative.n_min": o.speculation.min_draft(),
    })
}

/// `GET /props`: the server's settings.
pub async fn props(State(state): State<Arc<AppState>>) -> Response {
    let tokenizer = state.model.tokenizer().expect("checked at start");
    let token = |id: Option<u32>| id.map(|i| piece(tokenizer, i)).unwrap_or_default();
    let o = &state.options;
    Json(json!({
        "default_generation_settings": {
            "id": 0, "id_task": -1, "n_ctx": state.context,
            "speculative": o.speculation != Speculation::Off,
            "is_processing": false, "params": default_params(&state),
        },
        "total_slots": o.max_sequences,
        "model_alias": state.model_name,
        "model_path": o.model_path,
        "modalities": {"vision": false, "audio": false},
        "chat_template": chat::template_source(&state).unwrap_or_default(),
        "bos_token": token(tokenizer.bos_id()),
        "eos_token": token(tokenizer.eos_id()),
        "build_info": FINGERPRINT,
        "endpoint_slots": o.slots,
        "endpoint_metrics": o.metrics,
        "is_sleeping": state.shared.metrics.sleeping.load(Ordering::SeqCst),
    }))
    .into_response()
}

/// `GET /slots`: one entry per sequence the engine runs at once (the first `running` of
/// them shown busy: qkv's engine does not pin requests to slots); 501 with `--no-slots`.
pub async fn slots(State(state): State<Arc<AppState>>) -> Response {
    if !state.options.slots {
        return not_supported("the slots endpoint is off (--no-slots)");
    }
    let running = state.shared.metrics.running.load(Ordering::Relaxed) as usize;
    let speculative = state.options.speculation != Speculation::Off;
    let list: Vec<Value> = (0..state.options.max_sequences)
        .map(|i| {
            json!({"id": i, "id_task": -1, "n_ctx": state.context, "speculative": speculative,
                   "is_processing": i < running})
        })
        .collect();
    Json(Value::Array(list)).into_response()
}

/// A 501 in llama-server's shape (`not_supported_error`).
pub fn not_supported(message: &str) -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        Json(json!({"error": {"code": 501, "message": message, "type": "not_supported_error"}})),
    )
        .into_response()
}
