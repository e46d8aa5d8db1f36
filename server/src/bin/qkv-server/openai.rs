//! The OpenAI-compatible answers: the generation turned into `chat.completion` /
//! `text_completion` objects or their SSE chunks, with stop strings cut exactly,
//! log-probabilities and usage. The request bodies are read by [`qkv_server::request`].

use crate::chat::{Post, ReplyParse};
use crate::worker::{Out, Worker};
use crate::AppState;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use qkv::engine::{FinishReason, GenRequest, SeqId};
use qkv::speculative::SpecStats;
use qkv_server::error::ApiError;
use qkv_server::request::Params;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// Which route a generation answers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

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

/// The stop string that ended a run, set when it matches: a response extension of
/// [`generate`]'s answer (never sent), read by the routes that translate the chat answer
/// (Anthropic's `stop_sequence`). A streamed answer has it once its stream has ended.
#[derive(Clone, Debug, Default)]
pub struct StopWord(pub Arc<std::sync::OnceLock<String>>);

/// Submits `prompt` (a 400 `exceed_context_size_error` when it leaves no room in the
/// context), with `p`'s logit bias applied around `post`'s constraint, and returns the run
/// that reads its events.
pub async fn start(
    state: Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    p: Params,
    post: Post,
) -> Result<Run, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            "prompt",
            "the prompt encodes to no tokens",
        ));
    }
    if prompt.len() >= state.context {
        return Err(ApiError::exceeds_context(prompt.len(), state.context));
    }
    // As llama-server: without context shift a sequence with no limit stops when its cached
    // tokens and the next one reach the context (prompt + generated = context), and says it
    // was `truncated`; with it, the context shifts as often as the tokens asked for need.
    let room = state.context.saturating_sub(prompt.len()).max(1);
    let shift = state.options.context_shift;
    // A limit past the context is refused (by the engine) unless the context shifts.
    let (max_tokens, context_cut) = match p.max_tokens {
        Some(n) => (n, false),
        None => (room, true),
    };
    let tokenizer = state.model.tokenizer().expect("checked at start");
    let context_shift = shift.then(|| {
        let n_keep = match p.n_keep.unwrap_or(state.options.n_keep) {
            -1 => prompt.len(),
            n => usize::try_from(n).unwrap_or(0).min(prompt.len()),
        };
        // The beginning-of-text token is kept beside the n_keep tokens, as llama-server
        // counts them.
        n_keep + usize::from(tokenizer.adds_bos())
    });
    let bias = resolve_bias(tokenizer, &p.logit_bias, state.model.vocab_size())?;
    let constraint = if bias.is_empty() {
        post.constraint
    } else {
        Some(Box::new(qkv_server::native_fields::Biased::new(
            post.constraint,
            bias,
        )) as Box<dyn qkv::engine::TokenConstraint>)
    };
    let speculation = qkv_server::speculative::resolve(
        state.options.speculation,
        &p.speculative,
        state.options.draft_model,
    )?;
    let prompt_tokens = prompt.len();
    let request = GenRequest {
        prompt: prompt.clone(),
        sampler: p.sampler.clone(),
        max_tokens,
        ignore_eos: p.ignore_eos,
        top_logprobs: if p.logprobs { p.top_logprobs } else { 0 },
        speculation,
        slot: p.id_slot,
        context_shift,
        lora: state.lora.for_request(p.lora.as_deref())?,
    };
    let submitted = Instant::now();
    let (seq, rx) = state.worker.submit(request, constraint).await?;
    Ok(Run {
        state: state.clone(),
        kind,
        seq,
        rx,
        text: String::new(),
        text_held: String::new(),
        started: false,
        pending: qkv_server::token_text::TokenText::new(post.parse.is_some()),
        parse: post.parse,
        sent: 0,
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
        guard: CancelOnDrop {
            worker: state.worker.clone(),
            seq,
            armed: true,
        },
        submitted,
        first_token: None,
        last_token: None,
        stop_word: None,
        stop_cell: StopWord::default(),
        eos: false,
        tokens: Vec::new(),
        prompt_tokens,
        cached_tokens: 0,
        prompt,
        progress_since: None,
        spec: SpecStats::default(),
        context_cut,
        truncated: false,
    })
}

/// The (token, added logit) pairs of `bias`, texts encoded (every token of a text gets its
/// bias); a ban is `f32::NEG_INFINITY`. A token id past the vocabulary is a 400.
fn resolve_bias(
    tokenizer: &qkv::tokenizer::Tokenizer,
    bias: &[qkv_server::native_fields::Bias],
    vocab: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    use qkv_server::native_fields::BiasKey;
    let mut out = Vec::new();
    for b in bias {
        let value = b.bias.unwrap_or(f32::NEG_INFINITY);
        match &b.key {
            BiasKey::Token(t) if (*t as usize) < vocab => out.push((*t, value)),
            BiasKey::Token(t) => {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("token {t} is past the vocabulary ({vocab} tokens)"),
                ))
            }
            BiasKey::Text(s) => {
                let opts = qkv::tokenizer::EncodeOptions {
                    add_special: false,
                    parse_special: true,
                };
                out.extend(
                    tokenizer
                        .encode_with(s, opts)?
                        .into_iter()
                        .map(|t| (t, value)),
                );
            }
        }
    }
    Ok(out)
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
pub struct Run {
    pub state: Arc<AppState>,
    kind: Kind,
    seq: SeqId,
    rx: UnboundedReceiver<Out>,
    /// All text generated so far, and how much of it went to the client.
    pub text: String,
    sent: usize,
    /// Each token's text, bytes of a character split across tokens held back.
    pending: qkv_server::token_text::TokenText,
    pub p: Params,
    /// How the whole reply is split into content, reasoning and tool calls; `None`: the
    /// text is the content, streamed as it comes.
    parse: Option<ReplyParse>,
    /// A streamed reply read with its parse: its text so far.
    text_held: String,
    /// A streamed reply read with its parse has sent its first chunk (the role alone).
    started: bool,
    id: String,
    created: u64,
    /// The finish reason once known (`stop`, `length`, `error`).
    pub finished: Option<&'static str>,
    usage: Option<Value>,
    /// Per token, for the whole response: (token, logprob, top alternatives).
    pub logprobs: Vec<TokenLogprob>,
    guard: CancelOnDrop,
    /// When the request was submitted, and when its first and last tokens came.
    submitted: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// The stop string that ended the run, if one did.
    pub stop_word: Option<String>,
    /// The same, for whoever holds the response ([`StopWord`]).
    stop_cell: StopWord,
    /// Whether the end-of-text token ended it.
    pub eos: bool,
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// The prompt's length, and how much of it came from the prefix cache.
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// When the first report of the prompt's progress came (`return_progress`).
    progress_since: Option<Instant>,
    /// What speculation did for it, once it is done.
    pub spec: SpecStats,
    /// Its token limit is where the context ends (it asked for more, or for no limit).
    context_cut: bool,
    /// llama-server's `truncated`: its context shifted, or it ran to the end of it.
    pub truncated: bool,
}

/// A generated token, its log-probability and the most likely alternatives.
pub type TokenLogprob = (u32, f32, Vec<(u32, f32)>);

/// What one engine event adds to the response.
pub struct Piece {
    /// The text released to the client.
    pub text: String,
    /// The token, when the event was one.
    pub token: Option<TokenLogprob>,
    /// The prompt's progress, when the event was that (only for runs whose request asked
    /// for `return_progress` on a stream; the others never see such events).
    pub progress: Option<Value>,
}

impl Run {
    /// llama-server's `timings` object: prompt and generation token counts, milliseconds
    /// and rates, measured here from submission to the first token (the prompt, queueing
    /// included) and from the first token to the last (the generation; its rate is over
    /// the steps after the first token).
    pub fn timings(&self) -> Value {
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let prompt_ms = ms(self.submitted, first);
        let prompt_n = self.prompt_tokens.saturating_sub(self.cached_tokens);
        let predicted_n = self.tokens.len();
        let predicted_ms = ms(first, self.last_token.unwrap_or(first));
        let per = |ms: f64, n: usize| if n == 0 { 0.0 } else { ms / n as f64 };
        let rate = |ms: f64, n: usize| if ms <= 0.0 { 0.0 } else { n as f64 * 1e3 / ms };
        // The first token comes with the prompt's last pass: the generation's time spans
        // the steps after it, one fewer than the tokens.
        let steps = predicted_n.saturating_sub(1);
        let mut t = json!({
            "cache_n": self.cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": per(prompt_ms, prompt_n),
            "prompt_per_second": rate(prompt_ms, prompt_n),
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": per(predicted_ms, steps),
            "predicted_per_second": rate(predicted_ms, steps),
        });
        // As llama-server: the draft counts only when the request speculated.
        if self.spec.draft_tokens > 0 {
            t["draft_n"] = json!(self.spec.draft_tokens);
            t["draft_n_accepted"] = json!(self.spec.accepted_tokens);
        }
        t
    }

    /// The prompt as text, each token as the model spells it (special tokens included).
    pub fn prompt_text(&self) -> String {
        let Some(t) = self.state.model.tokenizer() else {
            return String::new();
        };
        let bytes: Vec<u8> = self
            .prompt
            .iter()
            .flat_map(|&id| t.token_bytes(id).unwrap_or_default().iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// llama-server's `prompt_progress` object and the `timings` that go with it, for a
    /// prompt with `read` of `total` tokens in the cache, `cached` of them reused: the
    /// milliseconds count from the first report, so the first is at 0.
    fn progress(&mut self, cached: usize, read: usize, total: usize) -> Value {
        let now = Instant::now();
        let since = *self.progress_since.get_or_insert(now);
        let ms = now.saturating_duration_since(since).as_secs_f64() * 1e3;
        let n = read.saturating_sub(cached);
        let (per_token, per_second) = if n == 0 || ms <= 0.0 {
            (0.0, 0.0)
        } else {
            (ms / n as f64, n as f64 * 1e3 / ms)
        };
        json!({
            "prompt_progress": {"total": total, "cache": cached, "processed": read,
                "time_ms": ms},
            "timings": {"cache_n": cached, "prompt_n": n, "prompt_ms": ms,
                "prompt_per_token_ms": per_token, "prompt_per_second": per_second,
                "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_token_ms": 0.0,
                "predicted_per_second": 0.0},
        })
    }

    /// Waits for the next event; `None` once finished. Progress through the prompt is a
    /// piece of its own only when the request streams and asked for `return_progress`.
    pub async fn next(&mut self) -> Option<Piece> {
        if self.finished.is_some() {
            return None;
        }
        let tokenizer = self.state.model.tokenizer()?;
        loop {
            return match self.rx.recv().await {
                Some(Out::Progress {
                    cached,
                    read,
                    total,
                }) => {
                    if !(self.p.return_progress && self.p.stream) {
                        continue;
                    }
                    Some(Piece {
                        text: String::new(),
                        token: None,
                        progress: Some(self.progress(cached, read, total)),
                    })
                }
                Some(Out::Shifted) => {
                    self.truncated = true;
                    continue;
                }
                Some(Out::Token {
                    token,
                    logprob,
                    top,
                }) => {
                    let now = Instant::now();
                    self.first_token.get_or_insert(now);
                    self.last_token = Some(now);
                    self.tokens.push(token);
                    self.text.push_str(&self.pending.push(tokenizer, token));
                    let text = self.release();
                    Some(Piece {
                        text,
                        token: Some((token, logprob, top)),
                        progress: None,
                    })
                }
                Some(Out::Done {
                    reason,
                    prompt_tokens,
                    cached_tokens,
                    generated,
                    spec,
                }) => {
                    self.guard.armed = false;
                    self.spec = spec;
                    self.text.push_str(&self.pending.finish());
                    self.cached_tokens = cached_tokens;
                    let text = self.release();
                    if reason == FinishReason::Length && self.context_cut {
                        self.truncated = true;
                    }
                    if self.finished.is_none() {
                        self.eos = reason == FinishReason::Eos;
                        self.finished = Some(match reason {
                            FinishReason::Eos | FinishReason::Complete => "stop",
                            FinishReason::Length | FinishReason::Cancelled => "length",
                        });
                    }
                    self.usage = Some(usage(prompt_tokens, cached_tokens, generated));
                    Some(Piece {
                        text,
                        token: None,
                        progress: None,
                    })
                }
                Some(Out::Failed(e)) => {
                    self.guard.armed = false;
                    self.finished = Some("error");
                    Some(Piece {
                        text: format!("[qkv: {e}]"),
                        token: None,
                        progress: None,
                    })
                }
                None => {
                    self.finished = Some("error");
                    None
                }
            };
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
                self.stop_word = self
                    .p
                    .stop
                    .iter()
                    .find(|s| self.text[start + at..].starts_with(s.as_str()))
                    .cloned();
                if let Some(w) = &self.stop_word {
                    self.stop_cell.0.set(w.clone()).ok();
                }
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

    /// Reads the run to its end for an answer sent whole: the text, each token's
    /// log-probabilities kept in `logprobs`, and the usage drained.
    pub async fn read_whole(&mut self) -> String {
        let mut content = String::new();
        while let Some(piece) = self.next().await {
            content.push_str(&piece.text);
            if let Some(t) = piece.token {
                self.logprobs.push(t);
            }
        }
        self.drain().await;
        content
    }

    /// After the last piece: waits for the sequence's end (cancelling it first when a stop
    /// string ended the run early) so that the usage is known.
    pub async fn drain(&mut self) {
        if self.guard.armed {
            self.guard.worker.cancel(self.seq);
        }
        while self.usage.is_none() {
            match self.rx.recv().await {
                Some(Out::Done {
                    prompt_tokens,
                    cached_tokens,
                    generated,
                    spec,
                    ..
                }) => {
                    self.guard.armed = false;
                    self.spec = spec;
                    self.cached_tokens = cached_tokens;
                    self.usage = Some(usage(prompt_tokens, cached_tokens, generated));
                }
                Some(Out::Failed(_)) | None => break,
                Some(Out::Shifted) => self.truncated = true,
                Some(Out::Token { .. } | Out::Progress { .. }) => {}
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
