//! What the Anthropic and Responses routes (anthropic.rs, responses.rs) share: a translated
//! request run through the chat route's own path (`params`, `chat::prepare`,
//! `openai::generate`), and the chat route's answer read back, whole as JSON or streamed as
//! [`Delta`]s parsed from its SSE chunks.

use crate::generation::Kind;
use crate::openai;
use crate::AppState;
use axum::response::Response;
use futures_util::{Stream, StreamExt};
use qkv_server::body::Body;
use qkv_server::error::ApiError;
use serde_json::Value;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;

/// A chat-completion body (from a translation) run as the chat route runs it: the number of
/// prompt tokens, and the chat route's response (whole JSON, or SSE when `stream`).
pub async fn run_chat(state: &Arc<AppState>, chat: &Value) -> Result<(usize, Response), ApiError> {
    let b = Body::parse(chat.to_string().as_bytes())?;
    let p = crate::params(state, &b, true)?;
    let (ids, post) = crate::chat::prepare(state, &b)?;
    let prompt_tokens = ids.len();
    let response = openai::generate(state.clone(), Kind::Chat, ids, p, post).await?;
    Ok((prompt_tokens, response))
}

/// The JSON body of a whole chat response.
pub async fn whole(response: Response) -> Result<Value, ApiError> {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .map_err(|e| internal(format!("reading the chat answer: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| internal(format!("the chat answer: {e}")))
}

fn internal(message: String) -> ApiError {
    ApiError::status(axum::http::StatusCode::INTERNAL_SERVER_ERROR, message)
}

/// One piece of a streamed chat answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    /// Reasoning text (`delta.reasoning_content`).
    Reasoning(String),
    /// Reply text (`delta.content`).
    Text(String),
    /// A tool call begins: its index in the reply, id and function name.
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// A fragment of call `index`'s JSON arguments.
    CallArgs { index: usize, args: String },
    /// The chat route's finish reason (`stop`, `length`, `tool_calls`, `error`).
    Finish(String),
    /// The usage object (`prompt_tokens`, `completion_tokens`, …).
    Usage(Value),
}

/// The deltas of one chat chunk.
pub fn deltas(chunk: &Value) -> Vec<Delta> {
    let mut out = Vec::new();
    if let Some(c) = chunk["choices"].get(0) {
        let d = &c["delta"];
        if let Some(r) = d["reasoning_content"].as_str().filter(|r| !r.is_empty()) {
            out.push(Delta::Reasoning(r.to_owned()));
        }
        if let Some(t) = d["content"].as_str().filter(|t| !t.is_empty()) {
            out.push(Delta::Text(t.to_owned()));
        }
        for call in d["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(0) as usize;
            if let Some(name) = call["function"]["name"].as_str() {
                out.push(Delta::CallStart {
                    index,
                    id: call["id"].as_str().unwrap_or("").to_owned(),
                    name: name.to_owned(),
                });
            }
            if let Some(a) = call["function"]["arguments"]
                .as_str()
                .filter(|a| !a.is_empty())
            {
                out.push(Delta::CallArgs {
                    index,
                    args: a.to_owned(),
                });
            }
        }
        if let Some(f) = c["finish_reason"].as_str() {
            out.push(Delta::Finish(f.to_owned()));
        }
    }
    if chunk["usage"].is_object() {
        out.push(Delta::Usage(chunk["usage"].clone()));
    }
    out
}

/// The chat route's SSE answer as deltas, in order, until `[DONE]`.
pub fn stream(response: Response) -> Pin<Box<dyn Stream<Item = Delta> + Send>> {
    struct St {
        body: Pin<Box<dyn Stream<Item = Result<axum::body::Bytes, axum::Error>> + Send>>,
        buf: String,
        ready: VecDeque<Delta>,
        done: bool,
    }
    let st = St {
        body: Box::pin(response.into_body().into_data_stream()),
        buf: String::new(),
        ready: VecDeque::new(),
        done: false,
    };
    Box::pin(futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(d) = st.ready.pop_front() {
                return Some((d, st));
            }
            if st.done {
                return None;
            }
            match st.body.next().await {
                Some(Ok(bytes)) => {
                    st.buf.push_str(&String::from_utf8_lossy(&bytes));
                    while let Some(end) = st.buf.find("\n\n") {
                        let event: String = st.buf.drain(..end + 2).collect();
                        for line in event.lines() {
                            let Some(data) = line.strip_prefix("data:") else {
                                continue;
                            };
                            let data = data.trim();
                            if data == "[DONE]" {
                                st.done = true;
                            } else if let Ok(v) = serde_json::from_str::<Value>(data) {
                                st.ready.extend(deltas(&v));
                            }
                        }
                    }
                }
                Some(Err(_)) | None => st.done = true,
            }
        }
    }))
}

/// `usage` fields as numbers: (prompt, cached, completion) tokens.
pub fn usage_counts(u: &Value) -> (u64, u64, u64) {
    (
        u["prompt_tokens"].as_u64().unwrap_or(0),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap_or(0),
    )
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
