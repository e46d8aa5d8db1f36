//! OpenAI's Responses API over the chat route: `POST /v1/responses` (and `/responses`),
//! whole or streamed with its typed events (`response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta` / `.done`, `response.content_part.done`,
//! `response.output_item.done`, `response.completed`; a tool call's
//! `response.function_call_arguments.delta` / `.done`). The request is rewritten as a chat
//! body ([`qkv_server::compat::responses_to_chat`]) and run through the chat route's path; the
//! output is a `message` item of `output_text`, and a `function_call` item per tool call.
//! Nothing is stored: `previous_response_id` is refused. Errors keep OpenAI's shape.
//!
//! llama-server's telemetry is answered too: with `return_progress`, a
//! `response.in_progress` event carries `prompt_progress` (`total`, `processed`, `cache`,
//! `time_ms`) once the prompt has run (the engine reports no finer steps; the tokens reused
//! from the cache are known only at the end, in `usage`, so `cache` is 0 there); with
//! `timings_per_token`, each text delta carries `timings`, and `response.completed` has the
//! final ones. Timings are measured here, from the request's arrival.

use crate::translate::{self, Delta};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::{Stream, StreamExt};
use qkv_server::compat::{responses_param, responses_to_chat};
use qkv_server::error::ApiError;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The parts of a response object that do not depend on the output.
#[derive(Clone)]
struct Head {
    id: String,
    model: String,
    created: u64,
    max_output_tokens: Value,
    temperature: Value,
    top_p: Value,
}

impl Head {
    /// The response object with `status`, `output` and `usage`.
    fn object(&self, status: &str, output: &[Value], usage: Option<&Value>) -> Value {
        let usage = usage.map(|u| {
            let (prompt, cached, completion) = translate::usage_counts(u);
            json!({
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            })
        });
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "tool_choice": "auto",
            "tools": [],
            "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "text": {"format": {"type": "text"}},
            "usage": usage,
            "metadata": {},
        })
    }
}

/// The status a finish reason gives.
fn status(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "incomplete",
        Some("error") => "failed",
        _ => "completed",
    }
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
        "arguments": arguments, "status": status})
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r: Result<Response, ApiError> = async {
        let b = crate::body(&state.shared, raw)?;
        let chat = responses_to_chat(&b)?;
        let stream = chat["stream"] == true;
        let telemetry = Telemetry {
            arrived: std::time::Instant::now(),
            first: None,
            progress: b.bool("return_progress", false)?,
            per_token: b.bool("timings_per_token", false)?,
            prompt_tokens: 0,
            deltas: 0,
        };
        let (prompt_tokens, response) = translate::run_chat(&state, &chat).await?;
        let telemetry = Telemetry {
            prompt_tokens,
            ..telemetry
        };
        let tag = format!(
            "{:x}{:04x}",
            translate::now(),
            state.shared.metrics.requests.load(Ordering::Relaxed) & 0xffff
        );
        let head = Head {
            id: format!("resp_{tag}"),
            model: state.model_name.clone(),
            created: translate::now(),
            max_output_tokens: b.field("max_output_tokens").cloned().unwrap_or(Value::Null),
            temperature: b.field("temperature").cloned().unwrap_or(json!(1.0)),
            top_p: b.field("top_p").cloned().unwrap_or(json!(1.0)),
        };
        if stream {
            let events = events(head, tag, telemetry, translate::stream(response));
            Ok(Sse::new(events).into_response())
        } else {
            let whole = translate::whole(response).await?;
            Ok(Json(whole_response(&head, &tag, &whole)).into_response())
        }
    }
    .await;
    match r {
        Ok(r) => r,
        Err(mut e) => {
            state.shared.metrics.errors.fetch_add(1, Ordering::Relaxed);
            e.param = e.param.map(|p| responses_param(&p));
            e.into_response()
        }
    }
}

/// The response object from the chat route's whole answer.
fn whole_response(head: &Head, tag: &str, chat: &Value) -> Value {
    let choice = &chat["choices"][0];
    let m = &choice["message"];
    let mut output = Vec::new();
    let text = m["content"].as_str().unwrap_or("");
    let calls = m["tool_calls"].as_array().cloned().unwrap_or_default();
    if !text.is_empty() || calls.is_empty() {
        output.push(message_item(&format!("msg_{tag}"), text, "completed"));
    }
    for (i, c) in calls.iter().enumerate() {
        output.push(call_item(
            &format!("fc_{tag}_{i}"),
            c["id"].as_str().unwrap_or(""),
            c["function"]["name"].as_str().unwrap_or(""),
            c["function"]["arguments"].as_str().unwrap_or(""),
            "completed",
        ));
    }
    head.object(
        status(choice["finish_reason"].as_str()),
        &output,
        Some(&chat["usage"]),
    )
}

/// What llama-server's telemetry fields need: when the request arrived and its first token
/// came, and how many deltas came since.
struct Telemetry {
    arrived: std::time::Instant,
    first: Option<std::time::Instant>,
    /// `return_progress`.
    progress: bool,
    /// `timings_per_token`.
    per_token: bool,
    prompt_tokens: usize,
    deltas: usize,
}

impl Telemetry {
    /// llama-server's `timings`, with `predicted` tokens so far.
    fn timings(&self, predicted: usize) -> Value {
        let now = std::time::Instant::now();
        let first = self.first.unwrap_or(now);
        let prompt_ms = (first - self.arrived).as_secs_f64() * 1e3;
        let predicted_ms = (now - first).as_secs_f64() * 1e3;
        let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        json!({
            "prompt_n": self.prompt_tokens,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": if self.prompt_tokens > 0 { prompt_ms / self.prompt_tokens as f64 } else { 0.0 },
            "prompt_per_second": rate(self.prompt_tokens, prompt_ms),
            "predicted_n": predicted,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": if predicted > 0 { predicted_ms / predicted as f64 } else { 0.0 },
            "predicted_per_second": rate(predicted, predicted_ms),
        })
    }
}

/// The output item being streamed.
enum Open {
    /// The message item, with its text so far.
    Message(String),
    /// The function call of this index in the chat answer: its call id, name and arguments.
    Call(usize, String, String, String),
}

/// The Responses events of a streamed chat answer.
struct Events {
    upstream: Pin<Box<dyn Stream<Item = Delta> + Send>>,
    head: Head,
    tag: String,
    telemetry: Telemetry,
    ready: VecDeque<Event>,
    seq: u64,
    output: Vec<Value>,
    open: Option<Open>,
    finish: Option<String>,
    usage: Option<Value>,
    ended: bool,
}

impl Events {
    fn push(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.ready
            .push_back(Event::default().event(kind).data(data.to_string()));
    }

    fn message_id(&self) -> String {
        format!("msg_{}", self.tag)
    }

    fn call_id(&self, index: usize) -> String {
        format!("fc_{}_{index}", self.tag)
    }

    fn open_message(&mut self) {
        if matches!(self.open, Some(Open::Message(_))) {
            return;
        }
        self.close();
        let id = self.message_id();
        let n = self.output.len();
        self.push(
            "response.output_item.added",
            json!({"output_index": n, "item": {"type": "message", "id": id,
                "status": "in_progress", "role": "assistant", "content": []}}),
        );
        self.push(
            "response.content_part.added",
            json!({"item_id": id, "output_index": n, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}),
        );
        self.open = Some(Open::Message(String::new()));
    }

    fn close(&mut self) {
        let n = self.output.len();
        match self.open.take() {
            None => {}
            Some(Open::Message(text)) => {
                let id = self.message_id();
                self.push(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": n, "content_index": 0,
                        "text": text, "logprobs": []}),
                );
                self.push(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": n, "content_index": 0,
                        "part": {"type": "output_text", "text": text, "annotations": []}}),
                );
                let item = message_item(&id, &text, "completed");
                self.push(
                    "response.output_item.done",
                    json!({"output_index": n, "item": item}),
                );
                self.output.push(item);
            }
            Some(Open::Call(index, call_id, name, args)) => {
                let id = self.call_id(index);
                self.push(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": n, "arguments": args}),
                );
                let item = call_item(&id, &call_id, &name, &args, "completed");
                self.push(
                    "response.output_item.done",
                    json!({"output_index": n, "item": item}),
                );
                self.output.push(item);
            }
        }
    }

    fn feed(&mut self, d: Delta) {
        if self.telemetry.first.is_none() && !matches!(d, Delta::Finish(_) | Delta::Usage(_)) {
            self.telemetry.first = Some(std::time::Instant::now());
            if self.telemetry.progress {
                let t = &self.telemetry;
                let ms = t.first.map_or(0.0, |f| (f - t.arrived).as_secs_f64() * 1e3);
                let response = self.head.object("in_progress", &self.output, None);
                self.push(
                    "response.in_progress",
                    json!({"response": response, "prompt_progress": {
                        "total": t.prompt_tokens, "processed": t.prompt_tokens, "cache": 0,
                        "time_ms": ms}}),
                );
            }
        }
        self.telemetry.deltas += 1;
        match d {
            // Reasoning is not part of this API's basic text output.
            Delta::Reasoning(_) => {}
            Delta::Text(t) => {
                self.open_message();
                let n = self.output.len();
                let id = self.message_id();
                if let Some(Open::Message(text)) = &mut self.open {
                    text.push_str(&t);
                }
                let mut event = json!({"item_id": id, "output_index": n, "content_index": 0,
                    "delta": t, "logprobs": []});
                if self.telemetry.per_token {
                    event["timings"] = self.telemetry.timings(self.telemetry.deltas);
                }
                self.push("response.output_text.delta", event);
            }
            Delta::CallStart { index, id, name } => {
                self.close();
                let n = self.output.len();
                let item = call_item(&self.call_id(index), &id, &name, "", "in_progress");
                self.push(
                    "response.output_item.added",
                    json!({"output_index": n, "item": item}),
                );
                self.open = Some(Open::Call(index, id, name, String::new()));
            }
            Delta::CallArgs { index, args } => {
                let n = self.output.len();
                let id = self.call_id(index);
                if let Some(Open::Call(k, _, _, so_far)) = &mut self.open {
                    if *k == index {
                        so_far.push_str(&args);
                        self.push(
                            "response.function_call_arguments.delta",
                            json!({"item_id": id, "output_index": n, "delta": args}),
                        );
                    }
                }
            }
            Delta::Finish(f) => self.finish = Some(f),
            Delta::Usage(u) => self.usage = Some(u),
        }
    }

    fn end(&mut self) {
        if self.output.is_empty() && self.open.is_none() {
            self.open_message();
        }
        self.close();
        let object = self.head.object(
            status(self.finish.as_deref()),
            &self.output,
            self.usage.as_ref(),
        );
        let mut event = json!({"response": object});
        if self.telemetry.per_token || self.telemetry.progress {
            let (_, _, generated) =
                translate::usage_counts(self.usage.as_ref().unwrap_or(&Value::Null));
            event["timings"] = self.telemetry.timings(generated as usize);
        }
        self.push("response.completed", event);
        self.ended = true;
    }
}

/// The SSE events of a streamed response.
fn events(
    head: Head,
    tag: String,
    telemetry: Telemetry,
    upstream: Pin<Box<dyn Stream<Item = Delta> + Send>>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut st = Events {
        upstream,
        head,
        tag,
        telemetry,
        ready: VecDeque::new(),
        seq: 0,
        output: Vec::new(),
        open: None,
        finish: None,
        usage: None,
        ended: false,
    };
    let start = st.head.object("in_progress", &[], None);
    st.push("response.created", json!({"response": start}));
    st.push("response.in_progress", json!({"response": start}));
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
