//! One generation on its way to a client: the request submitted to the engine's worker, then
//! its events read one by one into text, with stop strings cut exactly, tokens held back
//! while they may still start one, log-probabilities, llama-server's timings and the usage.
//! How the text is dressed for a route is the route's own (openai.rs, native.rs).

use crate::chat::{Post, ReplyParse};
use crate::worker::{Out, Worker};
use crate::AppState;
use qkv::engine::{FinishReason, GenRequest, SeqId};
use qkv::speculative::SpecStats;
use qkv_server::error::ApiError;
use qkv_server::request::Params;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// Which route a generation answers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// The stop string that ended a run, set when it matches: a response extension of
/// the OpenAI answer (`openai::generate`, never sent), read by the routes that translate the chat answer
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
    /// The route it answers.
    pub kind: Kind,
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
    pub parse: Option<ReplyParse>,
    /// A streamed reply read with its parse: its text so far.
    pub text_held: String,
    /// A streamed reply read with its parse has sent its first chunk (the role alone).
    pub started: bool,
    /// The answer's `id` (`chatcmpl-…` or `cmpl-…`, after the sequence).
    pub id: String,
    /// When it was submitted, in seconds since the Unix epoch (the answer's `created`).
    pub created: u64,
    /// The finish reason once known (`stop`, `length`, `error`).
    pub finished: Option<&'static str>,
    pub usage: Option<Value>,
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
    pub stop_cell: StopWord,
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
