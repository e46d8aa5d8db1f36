//! [`Engine`]: qkv's batch engine on a thread of its own. Requests are submitted from any
//! Python thread; the engine thread runs one pass per step for all of them and posts what
//! each step produced (tokens with their text, ends, failures) to an outbox, which
//! `Engine.poll` drains with the GIL released. The Python side (`qkv.Engine`) hands the
//! events to each request's iterator or asyncio queue.

use crate::errors::{self, from_qkv};
use crate::model::{Model, Plan};
use pyo3::prelude::*;
use qkv::engine::{EngineOptions, Event, FinishReason, GenRequest, SeqId, TokenConstraint};
use qkv_server::token_text::TokenText;
use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the engine thread is asked to do.
enum Cmd {
    Submit {
        id: u64,
        request: GenRequest,
        constraint: Option<Box<dyn TokenConstraint>>,
        markup: bool,
    },
    Cancel(u64),
    Stop,
}

/// An event for the Python side: `(request id, kind, a, b, c, d)` where kind is
/// `"token"` (a = token id, b = text, c = logprob, d = top alternatives), `"done"` (a =
/// finish reason, b = the text held back, c = prompt tokens, d = (cached, generated)) or
/// `"error"` (a = exception class name, b = message).
type PyEvent = (u64, &'static str, PyObject);

/// Events as the engine thread makes them (no GIL there).
enum Out {
    Token {
        id: u64,
        token: u32,
        text: String,
        logprob: f32,
        top: Vec<(u32, f32)>,
    },
    Done {
        id: u64,
        reason: &'static str,
        rest: String,
        prompt_tokens: usize,
        cached: usize,
        generated: usize,
    },
    Error {
        id: u64,
        kind: &'static str,
        message: String,
    },
}

#[derive(Default)]
struct Outbox {
    events: Vec<Out>,
    /// Set when the engine thread has ended (the reason).
    closed: Option<String>,
}

struct Shared {
    out: Mutex<Outbox>,
    ready: Condvar,
}

impl Shared {
    fn post(&self, events: impl IntoIterator<Item = Out>) {
        if let Ok(mut o) = self.out.lock() {
            let before = o.events.len();
            o.events.extend(events);
            if o.events.len() > before {
                self.ready.notify_all();
            }
        }
    }

    fn close(&self, why: String) {
        if let Ok(mut o) = self.out.lock() {
            o.closed.get_or_insert(why);
            self.ready.notify_all();
        }
    }
}

/// The engine thread: takes commands, steps the engine while it has work, posts events.
fn run(mut engine: qkv::engine::Engine, rx: Receiver<Cmd>, shared: Arc<Shared>) {
    let model = engine.model().clone();
    let Some(tokenizer) = model.tokenizer() else {
        shared.close("the model has no tokenizer".into());
        return;
    };
    let mut seqs: HashMap<SeqId, (u64, TokenText)> = HashMap::new();
    let mut ids: HashMap<u64, SeqId> = HashMap::new();
    let mut events = Vec::new();
    let mut out = Vec::new();
    loop {
        // Block for a command while idle; otherwise take what is waiting and step.
        let mut first = if engine.is_idle() {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => break,
            }
        } else {
            None
        };
        loop {
            let cmd = match first.take() {
                Some(c) => c,
                None => match rx.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        shared.close("the engine was closed".into());
                        return;
                    }
                },
            };
            match cmd {
                Cmd::Submit {
                    id,
                    request,
                    constraint,
                    markup,
                } => match engine.submit_constrained(request, constraint) {
                    Ok(seq) => {
                        seqs.insert(seq, (id, TokenText::new(markup)));
                        ids.insert(id, seq);
                    }
                    Err(e) => {
                        let (kind, message) = errors::classify(e);
                        out.push(Out::Error { id, kind, message });
                    }
                },
                Cmd::Cancel(id) => {
                    if let Some(seq) = ids.get(&id) {
                        engine.cancel(*seq);
                    }
                }
                Cmd::Stop => {
                    shared.close("the engine was closed".into());
                    return;
                }
            }
        }
        if !engine.is_idle() {
            events.clear();
            if let Err(e) = engine.step(&mut events) {
                // A step that fails leaves the engine unusable: every request fails.
                for (id, _) in seqs.values() {
                    out.push(Out::Error {
                        id: *id,
                        kind: "QkvError",
                        message: e.to_string(),
                    });
                }
                shared.post(out.drain(..));
                shared.close(format!("the engine failed: {e}"));
                return;
            }
            for ev in events.drain(..) {
                match ev {
                    Event::Token {
                        seq,
                        token,
                        logprob,
                        top,
                    } => {
                        if let Some((id, text)) = seqs.get_mut(&seq) {
                            let text = text.push(tokenizer, token);
                            out.push(Out::Token {
                                id: *id,
                                token,
                                text,
                                logprob,
                                top,
                            });
                        }
                    }
                    Event::Done {
                        seq,
                        reason,
                        prompt_tokens,
                        cached_tokens,
                        generated,
                        ..
                    } => {
                        if let Some((id, mut text)) = seqs.remove(&seq) {
                            ids.remove(&id);
                            out.push(Out::Done {
                                id,
                                reason: match reason {
                                    FinishReason::Length => "length",
                                    FinishReason::Cancelled => "cancelled",
                                    FinishReason::Eos | FinishReason::Complete => "stop",
                                },
                                rest: text.finish(),
                                prompt_tokens,
                                cached: cached_tokens,
                                generated,
                            });
                        }
                    }
                    Event::Failed { seq, error } => {
                        if let Some((id, _)) = seqs.remove(&seq) {
                            ids.remove(&id);
                            out.push(Out::Error {
                                id,
                                kind: "QkvError",
                                message: error,
                            });
                        }
                    }
                    Event::Prompt { .. } | Event::Shifted { .. } => {}
                }
            }
        }
        shared.post(out.drain(..));
    }
    shared.close("the engine was closed".into());
}

/// qkv's batch engine over one model, on its own thread: many requests at once, one pass
/// per step for all of them.
#[pyclass(module = "qkv._native", frozen)]
pub struct Engine {
    tx: Mutex<Option<Sender<Cmd>>>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    next_id: std::sync::atomic::AtomicU64,
    context: usize,
    max_sequences: usize,
}

impl Engine {
    fn send(&self, cmd: Cmd) -> PyResult<()> {
        let tx = self
            .tx
            .lock()
            .map_err(|_| errors::err("EngineClosedError", "the engine is closed"))?;
        match tx.as_ref() {
            Some(tx) => tx
                .send(cmd)
                .map_err(|_| errors::err("EngineClosedError", "the engine thread has ended")),
            None => Err(errors::err("EngineClosedError", "the engine is closed")),
        }
    }
}

#[pymethods]
impl Engine {
    /// An engine over `model`: at most `max_sequences` run at once, each with a KV cache of
    /// `n_ctx` positions; at most `queue` wait for a slot (more are refused with an
    /// `OverloadedError`, which a client may retry).
    #[new]
    #[pyo3(signature = (model, n_ctx = 2048, max_sequences = 16, queue = 256, kv_type = None))]
    fn new(
        py: Python<'_>,
        model: &Model,
        n_ctx: usize,
        max_sequences: usize,
        queue: usize,
        kv_type: Option<&str>,
    ) -> PyResult<Engine> {
        let kv_dtype = match kv_type {
            None => None,
            Some(k) => Some(
                k.parse::<qkv::models::decoder::KvType>()
                    .map_err(|e| errors::invalid(format!("kv_type {k:?}: {e}")))?,
            ),
        };
        let context = n_ctx.min(model.inner.config().context);
        let options = EngineOptions {
            max_sequences,
            context,
            queue,
            kv_dtype,
            ..EngineOptions::default()
        };
        let inner = model.inner.clone();
        let engine = py
            .allow_threads(|| qkv::engine::Engine::new(inner, options))
            .map_err(from_qkv)?;
        let shared = Arc::new(Shared {
            out: Mutex::new(Outbox::default()),
            ready: Condvar::new(),
        });
        let (tx, rx) = mpsc::channel();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("qkv-engine".into())
            .spawn(move || run(engine, rx, s))
            .map_err(|e| errors::err("QkvError", format!("starting the engine thread: {e}")))?;
        Ok(Engine {
            tx: Mutex::new(Some(tx)),
            shared,
            thread: Mutex::new(Some(thread)),
            next_id: std::sync::atomic::AtomicU64::new(1),
            context,
            max_sequences,
        })
    }

    /// Positions of each sequence's KV cache.
    #[getter]
    fn n_ctx(&self) -> usize {
        self.context
    }

    /// Most sequences running at once.
    #[getter]
    fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    /// Submits `plan` and returns the request's id; its events come from
    /// [`poll`](Self::poll). A prompt that does not fit a sequence's cache is a
    /// `ContextLengthError` now; a full queue is reported as the request's error event.
    fn submit(&self, plan: &Plan) -> PyResult<u64> {
        if plan.prompt.len() >= self.context {
            return Err(from_qkv(qkv::Error::ContextFull {
                needed: plan.prompt.len() + 1,
                capacity: self.context,
            }));
        }
        let room = self.context - plan.prompt.len();
        let mut request = GenRequest::new(
            plan.prompt.clone(),
            plan.sampler.clone(),
            plan.max_tokens.unwrap_or(room).min(room),
        );
        request.ignore_eos = plan.ignore_eos;
        request.top_logprobs = plan.top_logprobs;
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.send(Cmd::Submit {
            id,
            request,
            constraint: plan.take_constraint(),
            markup: plan.parse.is_some(),
        })?;
        Ok(id)
    }

    /// Cancels request `id` (its `done` event says `"cancelled"`); unknown ids are ignored.
    fn cancel(&self, id: u64) -> PyResult<()> {
        self.send(Cmd::Cancel(id))
    }

    /// The events posted since the last call, waiting up to `timeout` seconds for one (the
    /// GIL released meanwhile): tuples `(request id, kind, payload)`, kind `"token"`
    /// (payload `(token, text, logprob, top)`), `"done"` (payload `(finish reason, text held
    /// back, prompt tokens, cached tokens, generated tokens)`) or `"error"` (payload
    /// `(exception class name, message)`). Raises `EngineClosedError` once the engine has
    /// ended and every event was taken.
    #[pyo3(signature = (timeout = 0.1))]
    fn poll(&self, py: Python<'_>, timeout: f64) -> PyResult<Vec<PyEvent>> {
        let wait = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        let taken = py.allow_threads(|| {
            let Ok(mut o) = self.shared.out.lock() else {
                return Err("the engine's outbox is poisoned".to_string());
            };
            if o.events.is_empty() && o.closed.is_none() && !wait.is_zero() {
                o = match self.shared.ready.wait_timeout(o, wait) {
                    Ok((o, _)) => o,
                    Err(_) => return Err("the engine's outbox is poisoned".to_string()),
                };
            }
            if o.events.is_empty() {
                if let Some(why) = &o.closed {
                    return Err(why.clone());
                }
            }
            Ok(std::mem::take(&mut o.events))
        });
        let taken = taken.map_err(|e| errors::err("EngineClosedError", e))?;
        let mut events = Vec::with_capacity(taken.len());
        for e in taken {
            events.push(match e {
                Out::Token {
                    id,
                    token,
                    text,
                    logprob,
                    top,
                } => (
                    id,
                    "token",
                    (token, text, logprob, top)
                        .into_pyobject(py)?
                        .into_any()
                        .unbind(),
                ),
                Out::Done {
                    id,
                    reason,
                    rest,
                    prompt_tokens,
                    cached,
                    generated,
                } => (
                    id,
                    "done",
                    (reason, rest, prompt_tokens, cached, generated)
                        .into_pyobject(py)?
                        .into_any()
                        .unbind(),
                ),
                Out::Error { id, kind, message } => (
                    id,
                    "error",
                    (kind, message).into_pyobject(py)?.into_any().unbind(),
                ),
            });
        }
        Ok(events)
    }

    /// Stops the engine thread (requests still running get no more events) and waits for it.
    fn close(&self, py: Python<'_>) {
        if let Ok(mut tx) = self.tx.lock() {
            if let Some(tx) = tx.take() {
                let _ = tx.send(Cmd::Stop);
            }
        }
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            py.allow_threads(|| {
                let _ = t.join();
            });
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            if let Some(tx) = tx.take() {
                let _ = tx.send(Cmd::Stop);
            }
        }
    }
}
