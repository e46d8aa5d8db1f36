//! The OpenAI-compatible answers: a generation (generation.rs) turned into
//! `chat.completion` / `text_completion` objects or their SSE chunks, with log-probabilities,
//! tool calls and usage. The request bodies are read by [`qkv_server::request`].

use crate::chat::Post;
use crate::generation::{start, Kind, Piece, Run, TokenLogprob};
use crate::AppState;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use qkv_server::error::ApiError;
use qkv_server::request::Params;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;

/// What responses report as `system_fingerprint` (llama-server's start with `b` and its
/// build number; this is qkv's version).
pub const FINGERPRINT: &str = concat!("b", env!("CARGO_PKG_VERSION"), "-qkv");

/// Runs `prompt` with `params` and answers with the whole response or an SSE stream; with
/// `n` > 1, as many sequences run (seeds `seed`, `seed + 1`, …) and answer as choices.
pub async fn generate(
    state: Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    p: Params,
    post: Post,
) -> Result<Response, ApiError> {
    if p.n > 1 {
        if p.stream {
            return Err(ApiError::invalid(
                "n",
                "`n` > 1 is served whole only: set `stream` to false",
            ));
        }
        if post.constraint.is_some() || post.parse.is_some() {
            return Err(ApiError::invalid(
                "n",
                "`n` > 1 cannot be combined with a constrained output or tools",
            ));
        }
        let mut runs = Vec::with_capacity(p.n);
        for i in 0..p.n {
            let mut pi = p.clone();
            pi.sampler.seed = p.sampler.seed.wrapping_add(i as u64);
            let post = Post::default();
            runs.push(start(state.clone(), kind, prompt.clone(), pi, post).await?);
        }
        let answers = futures_util::future::join_all(runs.into_iter().map(whole)).await;
        let mut answers = answers.into_iter().collect::<Result<Vec<_>, _>>()?;
        let mut first = answers.remove(0).0;
        let mut choices = vec![first["choices"][0].take()];
        for a in answers {
            let mut a = a.0;
            choices.push(a["choices"][0].take());
        }
        for (i, c) in choices.iter_mut().enumerate() {
            c["index"] = json!(i);
        }
        first["choices"] = Value::Array(choices);
        return Ok(axum::Json(first).into_response());
    }
    let run = start(state, kind, prompt, p, post).await?;
    let stop = run.stop_cell.clone();
    let mut response = if run.p.stream {
        stream(run).into_response()
    } else {
        whole(run).await?.into_response()
    };
    response.extensions_mut().insert(stop);
    Ok(response)
}

impl Run {
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
            // The role went alone in the first chunk; the finish reason goes alone in the
            // last.
            Kind::Chat => json!({"index": 0, "delta": {"content": piece.text},
                "logprobs": logprobs, "finish_reason": null}),
            Kind::Completion => json!({"index": 0, "text": piece.text, "logprobs": logprobs,
                                       "finish_reason": self.finished}),
        };
        self.envelope(json!([choice]))
    }

    /// A chunk (or, with `choices` of one, a whole object's frame) around `choices`.
    fn envelope(&self, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.state.model_name,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        })
    }

    /// The chunk of a streamed piece: a completion's text and finish reason; a chat
    /// reply's content, none when empty (its finish reason goes in a last chunk of its own).
    fn chunks(&mut self, piece: &Piece) -> Option<Value> {
        let empty = piece.text.is_empty() && !(piece.token.is_some() && self.p.logprobs);
        (self.kind == Kind::Completion || !empty).then(|| self.chunk(piece))
    }
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
    let reply = qkv_server::tools::parse_reply(parse.format, content, &parse.names);
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
            json!(qkv_server::tools::openai_calls(&reply.calls, &run.id)),
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
    use qkv_server::tool_stream::Piece;
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
            run.envelope(json!([{"index": 0, "delta": delta, "logprobs": null,
                "finish_reason": null}]))
        })
        .collect();
    if let Some(f) = finished {
        out.push_back(
            run.envelope(json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": f}])),
        );
    }
    out
}

/// The whole response at once.
async fn whole(mut run: Run) -> Result<axum::Json<Value>, ApiError> {
    let content = run.read_whole().await;
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
    let mut out = run.envelope(json!([choice]));
    out["object"] = json!(if run.kind == Kind::Chat {
        "chat.completion"
    } else {
        "text_completion"
    });
    out["usage"] = json!(run.usage);
    out["timings"] = run.timings();
    if run.p.verbose || run.state.options.verbose {
        out["__verbose"] = json!({"prompt": run.prompt_text(), "content": content,
            "tokens_predicted": run.tokens.len(), "tokens_evaluated": run.prompt_tokens});
    }
    Ok(axum::Json(out))
}

/// The SSE stream: for chat, a first chunk with the role alone; then one chunk per event
/// (a chat reply's finish reason in a last chunk of its own), a usage chunk when asked, and
/// `[DONE]`. The last chunk before `[DONE]` carries llama-server's `timings`.
fn stream(run: Run) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    use std::collections::VecDeque;
    enum Phase {
        /// Chunks still to send, then more events to read (or the end).
        Running(Box<Run>, VecDeque<Value>),
        /// The last chunks, already drained (usage known): the final one gets `timings`.
        Closing(VecDeque<Value>),
        End,
    }
    let mut first = VecDeque::new();
    if run.kind == Kind::Chat && run.parse.is_none() {
        first.push_back(run.envelope(json!([{"index": 0,
            "delta": {"role": "assistant", "content": null}, "logprobs": null,
            "finish_reason": null}])));
    }
    let data = |v: &Value| Ok(SseEvent::default().data(v.to_string()));
    let events = futures_util::stream::unfold(
        Phase::Running(Box::new(run), first),
        move |phase| async move {
            match phase {
                Phase::Running(mut run, mut queue) => loop {
                    if let Some(c) = queue.pop_front() {
                        return Some((data(&c), Phase::Running(run, queue)));
                    }
                    if run.finished.is_some() {
                        return Some(closing(run).await);
                    }
                    match run.next().await {
                        // llama-server's `return_progress`: an envelope without choices.
                        Some(Piece {
                            progress: Some(p), ..
                        }) => {
                            let mut c = run.envelope(json!([]));
                            c["prompt_progress"] = p["prompt_progress"].clone();
                            c["timings"] = p["timings"].clone();
                            queue.push_back(c);
                        }
                        // A reply read with its parse: pieces sent as they become certain.
                        Some(piece) if run.parse.is_some() => {
                            run.text_held.push_str(&piece.text);
                            queue.extend(parsed_chunks(&mut run));
                        }
                        Some(piece) => queue.extend(run.chunks(&piece)),

                        None => return Some((Ok(SseEvent::default().data("[DONE]")), Phase::End)),
                    }
                },
                Phase::Closing(mut queue) => match queue.pop_front() {
                    Some(c) => Some((data(&c), Phase::Closing(queue))),
                    None => Some((Ok(SseEvent::default().data("[DONE]")), Phase::End)),
                },
                Phase::End => None,
            }
        },
    );
    /// After the run's last piece: drains it for the usage; then a chat reply's finish
    /// chunk (empty delta) and the usage chunk when asked. The last of them carries the
    /// timings, as llama-server's last chunk does.
    async fn closing(mut run: Box<Run>) -> (Result<SseEvent, Infallible>, Phase) {
        run.drain().await;
        let mut q = VecDeque::new();
        if run.kind == Kind::Chat && run.parse.is_none() {
            q.push_back(
                run.envelope(json!([{"index": 0, "delta": {}, "logprobs": null,
                "finish_reason": run.finished}])),
            );
        }
        if run.p.include_usage {
            let mut c = run.envelope(json!([]));
            c["usage"] = json!(run.usage);
            q.push_back(c);
        }
        if let Some(last) = q.back_mut() {
            last["timings"] = run.timings();
        }
        match q.pop_front() {
            Some(c) => (
                Ok(SseEvent::default().data(c.to_string())),
                Phase::Closing(q),
            ),
            None => (Ok(SseEvent::default().data("[DONE]")), Phase::End),
        }
    }
    Sse::new(events)
}
