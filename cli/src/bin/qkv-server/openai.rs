//! The OpenAI-compatible answers: the generation turned into `chat.completion` /
//! `text_completion` objects or their SSE chunks, with stop strings cut exactly,
//! log-probabilities and usage. The request bodies are read by [`qkv_cli::request`].

use crate::chat::{Post, ReplyParse};
use crate::worker::{Out, Worker};
use crate::AppState;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use qkv::engine::{FinishReason, GenRequest, SeqId};
use qkv_cli::request::{ApiError, Params};
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// Which route a generation answers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// Runs `prompt` with `params` and answers with the whole response or an SSE stream.
pub async fn generate(
    state: Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    p: Params,
    post: Post,
) -> Result<Response, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            "prompt",
            "the prompt encodes to no tokens",
        ));
    }
    let room = state.context.saturating_sub(prompt.len()) + 1;
    let max_tokens = match p.max_tokens {
        Some(n) => n,
        None => room.max(1),
    };
    let request = GenRequest {
        prompt,
        sampler: p.sampler.clone(),
        max_tokens,
        ignore_eos: p.ignore_eos,
        top_logprobs: if p.logprobs { p.top_logprobs } else { 0 },
    };
    let (seq, rx) = state.worker.submit(request, post.constraint).await?;
    let run = Run {
        state: state.clone(),
        kind,
        seq,
        rx,
        text: String::new(),
        text_held: String::new(),
        parse: post.parse,
        sent: 0,
        pending: Vec::new(),
        p,
        id: format!(
            "{}-{}",
            if kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            seq.0
        ),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        finished: None,
        usage: None,
        logprobs: Vec::new(),
        started: false,
        guard: CancelOnDrop {
            worker: state.worker.clone(),
            seq,
            armed: true,
        },
    };
    if run.p.stream {
        Ok(stream(run).into_response())
    } else {
        whole(run).await.map(IntoResponse::into_response)
    }
}

/// Cancels its sequence when dropped before the end (a client that went away, a stop
/// string reached): the engine frees the slot at once instead of at the next failed send.
struct CancelOnDrop {
    worker: Worker,
    seq: SeqId,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.worker.cancel(self.seq);
        }
    }
}

/// One generation being turned into a response.
struct Run {
    state: Arc<AppState>,
    kind: Kind,
    seq: SeqId,
    rx: UnboundedReceiver<Out>,
    /// All text generated so far, and how much of it went to the client.
    text: String,
    sent: usize,
    /// Bytes of a character split across tokens.
    pending: Vec<u8>,
    p: Params,
    /// How the whole reply is split into content, reasoning and tool calls; `None`: the
    /// text is the content, streamed as it comes.
    parse: Option<ReplyParse>,
    /// A streamed reply read with its parse: its text so far.
    text_held: String,
    id: String,
    created: u64,
    finished: Option<&'static str>,
    usage: Option<Value>,
    /// Per token, for the whole response: (token, logprob, top alternatives).
    logprobs: Vec<TokenLogprob>,
    started: bool,
    guard: CancelOnDrop,
}

/// A generated token, its log-probability and the most likely alternatives.
type TokenLogprob = (u32, f32, Vec<(u32, f32)>);

/// What one engine event adds to the response.
struct Piece {
    text: String,
    token: Option<TokenLogprob>,
}

impl Run {
    /// Waits for the next event; `None` once finished.
    async fn next(&mut self) -> Option<Piece> {
        if self.finished.is_some() {
            return None;
        }
        let tokenizer = self.state.model.tokenizer()?;
        match self.rx.recv().await {
            Some(Out::Token {
                token,
                logprob,
                top,
            }) => {
                let markup = self.parse.is_some()
                    && tokenizer
                        .token_str(token)
                        .is_ok_and(|t| qkv_cli::tools::MARKUP_TOKENS.contains(&t));
                if !tokenizer.is_special(token) || markup {
                    if let Ok(bytes) = tokenizer.token_bytes(token) {
                        self.pending.extend_from_slice(bytes);
                    }
                    self.text
                        .push_str(&qkv::tokenizer::take_complete_utf8(&mut self.pending));
                }
                let text = self.release();
                Some(Piece {
                    text,
                    token: Some((token, logprob, top)),
                })
            }
            Some(Out::Done {
                reason,
                prompt_tokens,
                cached_tokens,
                generated,
            }) => {
                self.guard.armed = false;
                self.text.push_str(&String::from_utf8_lossy(&self.pending));
                self.pending.clear();
                let text = self.release();
                if self.finished.is_none() {
                    self.finished = Some(match reason {
                        FinishReason::Eos | FinishReason::Complete => "stop",
                        FinishReason::Length | FinishReason::Cancelled => "length",
                    });
                }
                self.usage = Some(usage(prompt_tokens, cached_tokens, generated));
                Some(Piece { text, token: None })
            }
            Some(Out::Failed(e)) => {
                self.guard.armed = false;
                self.finished = Some("error");
                Some(Piece {
                    text: format!("[qkv: {e}]"),
                    token: None,
                })
            }
            None => {
                self.finished = Some("error");
                None
            }
        }
    }

    /// The text that can go to the client now: everything up to the earliest stop string
    /// (which ends the run), else everything but a tail that may still become one. What was
    /// sent never ends with the start of a stop string, so a match starts in the unsent part.
    fn release(&mut self) -> String {
        let start = self.sent;
        let hit = self
            .p
            .stop
            .iter()
            .filter_map(|s| self.text[start..].find(s.as_str()))
            .min();
        let end = match hit {
            Some(at) => {
                self.finished = Some("stop");
                self.text.truncate(start + at);
                start + at
            }
            None => {
                let hold = self
                    .p
                    .stop
                    .iter()
                    .map(|s| held_back(&self.text[start..], s))
                    .max()
                    .unwrap_or(0);
                self.text.len() - hold
            }
        };
        self.sent = end;
        self.text[start..end].to_owned()
    }

    /// After the last piece: waits for the sequence's end (cancelling it first when a stop
    /// string ended the run early) so that the usage is known.
    async fn drain(&mut self) {
        if self.guard.armed {
            self.guard.worker.cancel(self.seq);
        }
        while self.usage.is_none() {
            match self.rx.recv().await {
                Some(Out::Done {
                    prompt_tokens,
                    cached_tokens,
                    generated,
                    ..
                }) => {
                    self.guard.armed = false;
                    self.usage = Some(usage(prompt_tokens, cached_tokens, generated));
                }
                Some(Out::Failed(_)) | None => break,
                Some(Out::Token { .. }) => {}
            }
        }
    }

    /// A streamed chunk carrying `piece`.
    fn chunk(&mut self, piece: &Piece) -> Value {
        let tokenizer = self.state.model.tokenizer();
        let logprobs = match (&piece.token, self.p.logprobs) {
            (Some(t), true) => Some(logprob_entries(
                self.kind,
                tokenizer,
                std::slice::from_ref(t),
            )),
            _ => None,
        };
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = Map::new();
                if !self.started {
                    delta.insert("role".into(), json!("assistant"));
                }
                delta.insert("content".into(), json!(piece.text));
                json!({"index": 0, "delta": delta, "logprobs": logprobs,
                       "finish_reason": self.finished})
            }
            Kind::Completion => json!({"index": 0, "text": piece.text, "logprobs": logprobs,
                                       "finish_reason": self.finished}),
        };
        self.started = true;
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.state.model_name,
            "choices": [choice],
        })
    }
}

/// The `usage` object.
fn usage(prompt_tokens: usize, cached_tokens: usize, generated: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": prompt_tokens + generated,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    })
}

/// How many bytes at the end of `text` could be the start of `stop` (and so must wait).
fn held_back(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// The `logprobs` object of a choice for `tokens`.
fn logprob_entries(
    kind: Kind,
    tokenizer: Option<&qkv::tokenizer::Tokenizer>,
    tokens: &[TokenLogprob],
) -> Value {
    let piece = |id: u32| -> String {
        tokenizer
            .and_then(|t| t.token_bytes(id).ok())
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    let bytes = |id: u32| -> Vec<u8> {
        tokenizer
            .and_then(|t| t.token_bytes(id).ok())
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    };
    match kind {
        Kind::Chat => json!({"content": tokens.iter().map(|(t, lp, top)| json!({
            "token": piece(*t), "logprob": lp, "bytes": bytes(*t),
            "top_logprobs": top.iter().map(|(a, l)| json!({
                "token": piece(*a), "logprob": l, "bytes": bytes(*a)})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>()}),
        Kind::Completion => json!({
            "tokens": tokens.iter().map(|t| piece(t.0)).collect::<Vec<_>>(),
            "token_logprobs": tokens.iter().map(|t| t.1).collect::<Vec<_>>(),
            "top_logprobs": tokens.iter().map(|(_, _, top)| {
                top.iter().map(|(a, l)| (piece(*a), json!(l))).collect::<Map<String, Value>>()
            }).collect::<Vec<_>>(),
        }),
    }
}

/// A chat reply's `message` and its finish reason (`tool_calls` when it calls tools).
fn message(run: &Run, content: &str) -> (Value, Option<&'static str>) {
    let Some(parse) = &run.parse else {
        return (
            json!({"role": "assistant", "content": content}),
            run.finished,
        );
    };
    let reply = qkv_cli::tools::parse_reply(parse.format, content, &parse.names);
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    let calls = !reply.calls.is_empty();
    m.insert(
        "content".into(),
        if calls && reply.content.is_empty() {
            Value::Null
        } else {
            json!(reply.content)
        },
    );
    if let Some(r) = &reply.reasoning {
        m.insert("reasoning_content".into(), json!(r));
    }
    let mut finished = run.finished;
    if calls {
        m.insert(
            "tool_calls".into(),
            json!(qkv_cli::tools::openai_calls(&reply.calls, &run.id)),
        );
        if finished != Some("error") {
            finished = Some("tool_calls");
        }
    }
    (Value::Object(m), finished)
}

/// The chunks of a reply read with `parse` that the text so far adds (the role alone
/// first): reasoning and content as they become certain, each call as OpenAI streams it
/// (its `index`, `id`, `type` and name first, then its arguments in fragments as they are
/// generated); once the run has finished, what the whole reply's parse adds, and a last chunk
/// with the finish reason (`tool_calls` when it calls tools).
fn parsed_chunks(run: &mut Run) -> std::collections::VecDeque<Value> {
    use qkv_cli::tool_stream::Piece;
    let mut deltas = Vec::new();
    if !run.started {
        run.started = true;
        deltas.push(json!({"role": "assistant", "content": null}));
    }
    let Some(parse) = run.parse.as_mut() else {
        return Default::default();
    };
    let (pieces, finished) = match run.finished {
        Some(f) => {
            let (pieces, reply) = parse.stream.finish(&run.text_held);
            let calls = !reply.calls.is_empty() && f != "error";
            (pieces, Some(if calls { "tool_calls" } else { f }))
        }
        None => (parse.stream.update(&run.text_held), None),
    };
    for p in pieces {
        deltas.push(match p {
            Piece::Reasoning(r) => json!({"reasoning_content": r}),
            Piece::Content(c) => json!({"content": c}),
            Piece::CallStart { index, name } => {
                json!({"tool_calls": [{"index": index, "id": format!("call_{}_{index}", run.id),
                    "type": "function", "function": {"name": name, "arguments": ""}}]})
            }
            Piece::CallArgs { index, fragment } => {
                json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
            }
        });
    }
    let mut out: std::collections::VecDeque<Value> = deltas
        .into_iter()
        .map(|delta| {
            json!({
                "id": run.id,
                "object": "chat.completion.chunk",
                "created": run.created,
                "model": run.state.model_name,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}],
            })
        })
        .collect();
    if let Some(f) = finished {
        out.push_back(json!({
            "id": run.id,
            "object": "chat.completion.chunk",
            "created": run.created,
            "model": run.state.model_name,
            "choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": f}],
        }));
    }
    out
}

/// The whole response at once.
async fn whole(mut run: Run) -> Result<axum::Json<Value>, ApiError> {
    let mut content = String::new();
    while let Some(piece) = run.next().await {
        content.push_str(&piece.text);
        if let Some(t) = piece.token {
            run.logprobs.push(t);
        }
    }
    run.drain().await;
    if run.finished == Some("error") && run.usage.is_none() {
        return Err(ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("generation failed: {content}"),
        ));
    }
    let tokenizer = run.state.model.tokenizer();
    let logprobs = run
        .p
        .logprobs
        .then(|| logprob_entries(run.kind, tokenizer, &run.logprobs));
    let choice = match run.kind {
        Kind::Chat => {
            let (message, finished) = message(&run, &content);
            json!({"index": 0, "message": message, "logprobs": logprobs,
                   "finish_reason": finished})
        }
        Kind::Completion => json!({"index": 0, "text": content, "logprobs": logprobs,
            "finish_reason": run.finished}),
    };
    Ok(axum::Json(json!({
        "id": run.id,
        "object": if run.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
        "created": run.created,
        "model": run.state.model_name,
        "choices": [choice],
        "usage": run.usage,
    })))
}

/// The SSE stream: one chunk per event, a usage chunk when asked, then `[DONE]`.
fn stream(run: Run) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    enum Phase {
        Running(Box<Run>),
        /// Chunks of a reply read whole, still to send.
        Queued(Box<Run>, std::collections::VecDeque<Value>),
        Usage(Box<Run>),
        Done,
        End,
    }
    let events = futures_util::stream::unfold(Phase::Running(Box::new(run)), |phase| async move {
        let data = |v: &Value| Ok(SseEvent::default().data(v.to_string()));
        match phase {
            Phase::Running(run) => running(run).await,
            Phase::Queued(run, mut chunks) => match chunks.pop_front() {
                Some(c) => Some((data(&c), Phase::Queued(run, chunks))),
                None if run.finished.is_some() => usage_phase(run).await,
                None => running(run).await,
            },
            Phase::Usage(run) => usage_phase(run).await,
            Phase::Done => Some((Ok(SseEvent::default().data("[DONE]")), Phase::End)),
            Phase::End => None,
        }
    });
    /// The next events of a running generation.
    async fn running(mut run: Box<Run>) -> Option<(Result<SseEvent, Infallible>, Phase)> {
        let data = |v: &Value| Ok(SseEvent::default().data(v.to_string()));
        loop {
            match run.next().await {
                // A reply read with its parse: pieces sent as they become certain.
                Some(piece) if run.parse.is_some() => {
                    run.text_held.push_str(&piece.text);
                    let mut chunks = parsed_chunks(&mut run);
                    if let Some(first) = chunks.pop_front() {
                        return Some((data(&first), Phase::Queued(run, chunks)));
                    }
                }
                Some(piece) => {
                    let chunk = run.chunk(&piece);
                    let next = if run.finished.is_some() {
                        Phase::Usage(run)
                    } else {
                        Phase::Running(run)
                    };
                    return Some((data(&chunk), next));
                }
                None => return Some((Ok(SseEvent::default().data("[DONE]")), Phase::End)),
            }
        }
    }
    /// After the last chunk: the usage chunk when asked, else `[DONE]`.
    async fn usage_phase(mut run: Box<Run>) -> Option<(Result<SseEvent, Infallible>, Phase)> {
        run.drain().await;
        if run.p.include_usage {
            let chunk = json!({
                "id": run.id,
                "object": if run.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
                "created": run.created,
                "model": run.state.model_name,
                "choices": [],
                "usage": run.usage,
            });
            Some((Ok(SseEvent::default().data(chunk.to_string())), Phase::Done))
        } else {
            Some((Ok(SseEvent::default().data("[DONE]")), Phase::End))
        }
    }
    Sse::new(events)
}
