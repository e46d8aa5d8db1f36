//! The engine thread: owns the [`Engine`], takes requests and cancellations from the HTTP
//! tasks over a channel, steps while anything runs, and sends each sequence's tokens to its
//! request's own unbounded channel. A send that fails means the client went away: the
//! sequence is cancelled at once and its cache freed. The async runtime never waits on the
//! model, and a slow reader only grows its own channel (bounded by its `max_tokens`).

use crate::metrics::Metrics;
use qkv::engine::{Engine, Event, FinishReason, GenRequest, SeqId, TokenConstraint};
use qkv::speculative::SpecStats;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc as tmpsc, oneshot};

/// What the engine thread reports to a request.
#[derive(Debug)]
pub enum Out {
    /// A generated token.
    Token {
        token: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
    },
    /// The sequence ended.
    Done {
        reason: FinishReason,
        prompt_tokens: usize,
        cached_tokens: usize,
        generated: usize,
        /// What speculation did for it: tokens drafted, kept, verify passes.
        spec: SpecStats,
    },
    /// The sequence failed.
    Failed(String),
    /// Its context filled and was shifted (the request asked for context shift).
    Shifted,
    /// Its prompt advanced: `read` of `total` tokens in the cache, `cached` of them reused.
    Progress {
        cached: usize,
        read: usize,
        total: usize,
    },
}

/// A command for the engine thread.
enum Cmd {
    Submit {
        request: GenRequest,
        constraint: Option<Box<dyn TokenConstraint>>,
        out: tmpsc::UnboundedSender<Out>,
        reply: oneshot::Sender<qkv::Result<SeqId>>,
    },
    Cancel(SeqId),
    CancelAll,
    /// An operation on a slot's cache, done when no sequence runs in the slot.
    Slot {
        slot: usize,
        op: SlotOp,
        reply: oneshot::Sender<qkv::Result<SlotDone>>,
    },
}

/// What `POST /slots/{id}` asks of a slot.
pub enum SlotOp {
    Save,
    /// The saved bytes to put into it.
    Restore(Vec<u8>),
    Erase,
}

/// What a [`SlotOp`] did.
pub enum SlotDone {
    Saved(qkv::engine::SavedSlot),
    /// Tokens restored.
    Restored(usize),
    /// Tokens forgotten.
    Erased(usize),
}

/// A slot operation waiting for its slot's sequence to end.
type SlotWait = (usize, SlotOp, oneshot::Sender<qkv::Result<SlotDone>>);

/// Does `op` on `slot` now.
fn slot_op(engine: &mut Engine, slot: usize, op: SlotOp) -> qkv::Result<SlotDone> {
    match op {
        SlotOp::Save => engine.save_slot(slot).map(SlotDone::Saved),
        SlotOp::Restore(bytes) => engine.restore_slot(slot, &bytes).map(SlotDone::Restored),
        SlotOp::Erase => engine.erase_slot(slot).map(SlotDone::Erased),
    }
}

/// Does the waiting slot operations whose slots are free now.
fn run_slot_ops(engine: &mut Engine, waiting: &mut Vec<SlotWait>) {
    let mut i = 0;
    while i < waiting.len() {
        if engine.slot_busy(waiting[i].0) {
            i += 1;
            continue;
        }
        let (slot, op, reply) = waiting.remove(i);
        reply.send(slot_op(engine, slot, op)).ok();
    }
}

/// A handle on the engine thread; cheap to clone.
#[derive(Clone)]
pub struct Worker {
    cmd: mpsc::Sender<Cmd>,
    pub metrics: Arc<Metrics>,
}

impl Worker {
    /// Starts the engine thread, which keeps `metrics`; after `sleep_after` without work
    /// (`--sleep-idle-seconds`) it frees the idle KV caches and says so in
    /// `metrics.sleeping` until the next request.
    pub fn spawn(engine: Engine, metrics: Arc<Metrics>, sleep_after: Option<Duration>) -> Worker {
        let (tx, rx) = mpsc::channel();
        let m = metrics.clone();
        std::thread::Builder::new()
            .name("qkv-engine".into())
            .spawn(move || run(engine, rx, &m, sleep_after))
            .expect("spawning the engine thread");
        Worker { cmd: tx, metrics }
    }

    /// Queues a request, with its constraint if any; its events arrive on the returned
    /// receiver. Errors as [`Engine::submit`], or [`qkv::Error::Unsupported`] when the
    /// engine thread is gone.
    pub async fn submit(
        &self,
        request: GenRequest,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> qkv::Result<(SeqId, tmpsc::UnboundedReceiver<Out>)> {
        let (out, rx) = tmpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        let gone = || qkv::Error::Unsupported("the engine thread has stopped".into());
        self.cmd
            .send(Cmd::Submit {
                request,
                constraint,
                out,
                reply,
            })
            .map_err(|_| gone())?;
        let seq = answer.await.map_err(|_| gone())??;
        Ok((seq, rx))
    }

    /// Ends a sequence (a no-op when it already ended).
    pub fn cancel(&self, seq: SeqId) {
        self.cmd.send(Cmd::Cancel(seq)).ok();
    }

    /// Ends every sequence, running or waiting.
    pub fn cancel_all(&self) {
        self.cmd.send(Cmd::CancelAll).ok();
    }

    /// Saves, restores or erases a slot's cache, once no sequence runs in it.
    pub async fn slot(&self, slot: usize, op: SlotOp) -> qkv::Result<SlotDone> {
        let (reply, answer) = oneshot::channel();
        let gone = || qkv::Error::Unsupported("the engine thread has stopped".into());
        self.cmd
            .send(Cmd::Slot { slot, op, reply })
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// A sequence the thread serves.
struct Client {
    out: tmpsc::UnboundedSender<Out>,
    submitted: Instant,
    last_token: Option<Instant>,
}

/// The engine thread: takes the commands, steps the engine while it has work, and sends each
/// step's events to their clients, until the last sender of commands is gone.
fn run(mut engine: Engine, rx: mpsc::Receiver<Cmd>, m: &Metrics, sleep_after: Option<Duration>) {
    let mut clients: HashMap<SeqId, Client> = HashMap::new();
    let mut events = Vec::new();
    let mut slot_ops: Vec<SlotWait> = Vec::new();
    loop {
        run_slot_ops(&mut engine, &mut slot_ops);
        // Idle: wait for work (and, with `--sleep-idle-seconds`, go to sleep when none comes
        // in time). Busy: take what arrived and keep stepping.
        if engine.is_idle() {
            let cmd = match sleep_after.filter(|_| !m.sleeping.load(Ordering::SeqCst)) {
                Some(after) => match rx.recv_timeout(after) {
                    Ok(cmd) => cmd,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let freed = engine.release_caches();
                        m.sleeping.store(true, Ordering::SeqCst);
                        eprintln!("qkv-server: idle: sleeping ({freed} KV caches freed)");
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                },
                None => match rx.recv() {
                    Ok(cmd) => cmd,
                    Err(_) => return,
                },
            };
            if matches!(cmd, Cmd::Submit { .. }) {
                m.sleeping.store(false, Ordering::SeqCst);
            }
            handle(&mut engine, &mut clients, &mut slot_ops, cmd);
        }
        while let Ok(cmd) = rx.try_recv() {
            handle(&mut engine, &mut clients, &mut slot_ops, cmd);
        }
        run_slot_ops(&mut engine, &mut slot_ops);
        m.set_gauges(&engine);
        if engine.is_idle() {
            continue;
        }
        let started = Instant::now();
        if let Err(e) = engine.step(&mut events) {
            // A failure of the pass itself: every sequence fails with it.
            let msg = e.to_string();
            for (seq, c) in clients.drain() {
                c.out.send(Out::Failed(msg.clone())).ok();
                engine.cancel(seq);
            }
            events.clear();
            continue;
        }
        let now = Instant::now();
        m.steps.fetch_add(1, Ordering::Relaxed);
        m.step_seconds.observe(now - started);
        let mut batch = 0u64;
        for event in events.drain(..) {
            if matches!(event, Event::Token { .. }) {
                batch += 1;
            }
            deliver(&mut engine, &mut clients, m, now, event);
        }
        m.batch.observe_count(batch);
        m.max_batch.fetch_max(batch, Ordering::Relaxed);
        m.set_gauges(&engine);
    }
}

/// Sends one event of a step, which ended at `now`, to its client and counts it; a client
/// that is gone has its sequence cancelled at its next token.
fn deliver(
    engine: &mut Engine,
    clients: &mut HashMap<SeqId, Client>,
    m: &Metrics,
    now: Instant,
    event: Event,
) {
    match event {
        Event::Token {
            seq,
            token,
            logprob,
            top,
        } => {
            m.generated_tokens.fetch_add(1, Ordering::Relaxed);
            let Some(c) = clients.get_mut(&seq) else {
                return;
            };
            match c.last_token {
                None => {
                    m.ttft.observe(now - c.submitted);
                    m.ttft_recent.observe(now - c.submitted);
                }
                Some(t) => {
                    m.inter_token.observe(now - t);
                    m.inter_token_recent.observe(now - t);
                }
            }
            c.last_token = Some(now);
            if c.out
                .send(Out::Token {
                    token,
                    logprob,
                    top,
                })
                .is_err()
            {
                // The client is gone: free its slot now.
                engine.cancel(seq);
                clients.remove(&seq);
                m.disconnects.fetch_add(1, Ordering::Relaxed);
            }
        }
        Event::Done {
            seq,
            reason,
            prompt_tokens,
            cached_tokens,
            generated,
            spec,
        } => {
            m.spec_draft_tokens
                .fetch_add(spec.draft_tokens as u64, Ordering::Relaxed);
            m.spec_accepted_tokens
                .fetch_add(spec.accepted_tokens as u64, Ordering::Relaxed);
            m.spec_drafts
                .fetch_add(spec.verify_passes as u64, Ordering::Relaxed);
            m.prompt_tokens
                .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
            if reason == FinishReason::Cancelled {
                m.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            m.cached_tokens
                .fetch_add(cached_tokens as u64, Ordering::Relaxed);
            if let Some(c) = clients.remove(&seq) {
                c.out
                    .send(Out::Done {
                        reason,
                        prompt_tokens,
                        cached_tokens,
                        generated,
                        spec,
                    })
                    .ok();
            }
        }
        Event::Shifted { seq, .. } => {
            if let Some(c) = clients.get(&seq) {
                c.out.send(Out::Shifted).ok();
            }
        }
        Event::Failed { seq, error } => {
            if let Some(c) = clients.remove(&seq) {
                c.out.send(Out::Failed(error)).ok();
            }
        }
        Event::Prompt {
            seq,
            cached,
            read,
            total,
        } => {
            // A client that is gone is noticed at its next token.
            if let Some(c) = clients.get(&seq) {
                c.out
                    .send(Out::Progress {
                        cached,
                        read,
                        total,
                    })
                    .ok();
            }
        }
    }
}

fn handle(
    engine: &mut Engine,
    clients: &mut HashMap<SeqId, Client>,
    slot_ops: &mut Vec<SlotWait>,
    cmd: Cmd,
) {
    match cmd {
        Cmd::Slot { slot, op, reply } => slot_ops.push((slot, op, reply)),
        Cmd::Submit {
            request,
            constraint,
            out,
            reply,
        } => {
            let result = engine.submit_constrained(request, constraint);
            if let Ok(seq) = &result {
                clients.insert(
                    *seq,
                    Client {
                        out,
                        submitted: Instant::now(),
                        last_token: None,
                    },
                );
            }
            if let Err(Ok(seq)) = reply.send(result) {
                // The request went away while waiting for its id.
                engine.cancel(seq);
                clients.remove(&seq);
            }
        }
        Cmd::Cancel(seq) => {
            engine.cancel(seq);
        }
        Cmd::CancelAll => {
            for seq in clients.keys() {
                engine.cancel(*seq);
            }
        }
    }
}
