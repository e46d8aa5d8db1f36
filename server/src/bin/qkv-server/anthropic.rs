//! Anthropic's Messages API over the chat route: `POST /v1/messages` (whole, or streamed
//! with Anthropic's events: `message_start`, `content_block_start` / `_delta` / `_stop`,
//! `message_delta`, `message_stop`) and `POST /v1/messages/count_tokens`. The request is
//! rewritten as a chat-completion body ([`qkv_server::compat::anthropic_to_chat`]) and run
//! through the chat route's own path; its answer is read back into content blocks: `thinking`
//! (the reply's reasoning), `text`, and `tool_use` (the calls the chat path parsed, their
//! arguments streamed as `input_json_delta` as they are generated). Errors are in Anthropic's
//! shape, `{"type": "error", "error": {"type", "message"}}`.

use crate::generation::StopWord;
use crate::translate::{self, Delta};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::{Stream, StreamExt};
use qkv_server::compat::{anthropic_param, anthropic_to_chat};
use qkv_server::error::ApiError;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// An error in Anthropic's shape, its parameter (if any) renamed into the request's spelling.
pub fn error_response(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    let message = match &e.param {
        Some(p) => format!("{}: {}", anthropic_param(p), e.message),
        None => e.message.clone(),
    };
    let body = json!({"type": "error", "error": {"type": kind, "message": message}});
    (e.status, Json(body)).into_response()
}

/// Counts an error on its way out, in Anthropic's shape.
fn answered(state: &AppState, r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(|e| {
        state.shared.metrics.errors.fetch_add(1, Ordering::Relaxed);
        error_response(e)
    })
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let b = crate::body(&state.shared, raw)?;
        let chat = anthropic_to_chat(&b)?;
        let stream = chat["stream"] == true;
        let (prompt_tokens, response) = translate::run_chat(&state, &chat).await?;
        let id = format!(
            "msg_{:x}{:04x}",
            translate::now(),
            state.shared.metrics.requests.load(Ordering::Relaxed) & 0xffff
        );
        let model = state.model_name.clone();
        let stop = response
            .extensions()
            .get::<StopWord>()
            .cloned()
            .unwrap_or_default();
        if stream {
            let events = events(id, model, prompt_tokens, translate::stream(response), stop);
            Ok(Sse::new(events).into_response())
        } else {
            let whole = translate::whole(response).await?;
            Ok(Json(message(
                &id,
                &model,
                &whole,
                stop.0.get().map(String::as_str),
            ))
            .into_response())
        }
    }
    .await;
    answered(&state, r)
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as the model's template renders the
/// request (`{"input_tokens": n}`); no `max_tokens` is needed.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let b = crate::body(&state.shared, raw)?;
        let chat = anthropic_to_chat(&b)?;
        let b = qkv_server::body::Body::parse(chat.to_string().as_bytes())?;
        let (ids, _) = crate::chat::prepare(&state, &b)?;
        Ok(Json(json!({"input_tokens": ids.len()})).into_response())
    })();
    answered(&state, r)
}

/// Anthropic's `stop_reason` for the chat route's finish reason and the stop sequence that
/// ended the reply, if one did (`stop_sequence` then).
fn stop_reason(finish: Option<&str>, stop: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "max_tokens",
        Some("tool_calls") => "tool_use",
        Some("stop") if stop.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

/// Anthropic's `usage`.
fn usage(prompt: u64, cached: u64, output: u64) -> Value {
    json!({
        "input_tokens": prompt.saturating_sub(cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output,
    })
}

/// The whole message from the chat route's whole answer.
fn message(id: &str, model: &str, chat: &Value, stop: Option<&str>) -> Value {
    let choice = &chat["choices"][0];
    let m = &choice["message"];
    let mut content = Vec::new();
    if let Some(r) = m["reasoning_content"].as_str() {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if let Some(t) = m["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": t}));
    }
    for call in m["tool_calls"].as_array().into_iter().flatten() {
        let f = &call["function"];
        let input = f["arguments"]
            .as_str()
            .and_then(|a| serde_json::from_str::<Value>(a).ok())
            .unwrap_or_else(|| json!({}));
        content.push(
            json!({"type": "tool_use", "id": call["id"], "name": f["name"],
            "input": input}),
        );
    }
    if !content.iter().any(|b| b["type"] != "thinking") {
        content.push(json!({"type": "text", "text": ""}));
    }
    let (prompt, cached, output) = translate::usage_counts(&chat["usage"]);
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice["finish_reason"].as_str(), stop),
        "stop_sequence": stop,
        "usage": usage(prompt, cached, output),
    })
}

/// The kind of the content block being streamed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    /// The tool call of this index in the chat answer.
    Tool(usize),
}

/// Anthropic's events for a streamed chat answer.
struct Events {
    upstream: Pin<Box<dyn Stream<Item = Delta> + Send>>,
    /// The stop sequence that ended the reply, once the chat answer has ended.
    stop: StopWord,
    ready: VecDeque<Event>,
    /// The block being streamed and its index.
    open: Option<(Block, usize)>,
    blocks: usize,
    finish: Option<String>,
    usage: Option<Value>,
    ended: bool,
}

fn event(kind: &str, data: Value) -> Event {
    Event::default().event(kind).data(data.to_string())
}

impl Events {
    fn close(&mut self) {
        if let Some((kind, index)) = self.open.take() {
            if kind == Block::Thinking {
                self.ready.push_back(event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "signature_delta", "signature": ""}}),
                ));
            }
            self.ready.push_back(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    /// Opens a block of `kind` (closing the one before) unless it is the open one.
    fn open(&mut self, kind: Block, start: Value) -> usize {
        if let Some((k, index)) = self.open {
            if k == kind {
                return index;
            }
        }
        self.close();
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((kind, index));
        self.ready.push_back(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        index
    }

    fn delta(&mut self, index: usize, delta: Value) {
        self.ready.push_back(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    fn feed(&mut self, d: Delta) {
        match d {
            Delta::Reasoning(r) => {
                let i = self.open(
                    Block::Thinking,
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                );
                self.delta(i, json!({"type": "thinking_delta", "thinking": r}));
            }
            Delta::Text(t) => {
                let i = self.open(Block::Text, json!({"type": "text", "text": ""}));
                self.delta(i, json!({"type": "text_delta", "text": t}));
            }
            Delta::CallStart { index, id, name } => {
                self.open(
                    Block::Tool(index),
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                );
            }
            Delta::CallArgs { index, args } => {
                if let Some((Block::Tool(k), i)) = self.open {
                    if k == index {
                        self.delta(i, json!({"type": "input_json_delta", "partial_json": args}));
                    }
                }
            }
            Delta::Finish(f) => self.finish = Some(f),
            Delta::Usage(u) => self.usage = Some(u),
        }
    }

    /// After the last delta: the open block closed (an empty text block when there was
    /// none), the stop reason and output tokens, and `message_stop`.
    fn end(&mut self) {
        if self.blocks == 0 {
            self.open(Block::Text, json!({"type": "text", "text": ""}));
        }
        self.close();
        let (_, _, output) = translate::usage_counts(self.usage.as_ref().unwrap_or(&Value::Null));
        let stop = self.stop.0.get().map(String::as_str);
        self.ready.push_back(event(
            "message_delta",
            json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(self.finish.as_deref(), stop),
                    "stop_sequence": stop},
                "usage": {"output_tokens": output}}),
        ));
        self.ready
            .push_back(event("message_stop", json!({"type": "message_stop"})));
        self.ended = true;
    }
}

/// The SSE events of a streamed message.
fn events(
    id: String,
    model: String,
    prompt_tokens: usize,
    upstream: Pin<Box<dyn Stream<Item = Delta> + Send>>,
    stop: StopWord,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut st = Events {
        upstream,
        stop,
        ready: VecDeque::new(),
        open: None,
        blocks: 0,
        finish: None,
        usage: None,
        ended: false,
    };
    st.ready.push_back(event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage(prompt_tokens as u64, 0, 0)}}),
    ));
    futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(e) = st.ready.pop_front() {
                return Some((Ok(e), st));
            }
            if st.ended {
                return None;
            }
            match st.upstream.next().await {
                Some(d) => st.feed(d),
                None => st.end(),
            }
        }
    })
}
