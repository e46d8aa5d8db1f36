//! The router's instances: one `qkv-server` child process per loaded model, started on a
//! model's first request, stopped when a request for another model needs its place.
//!
//! At most `--models-max` instances run or start at once. A request for a model that is not
//! running joins the queue of models waiting for a place: one entry per model however many
//! requests wait for it, served in arrival order. A place is free while fewer instances run
//! than the limit; otherwise the least recently used instance that serves no request and
//! that no request waits for is stopped. An instance serving a request is never stopped to
//! make room: the queue waits for it to finish. A request whose client leaves while queued
//! takes its model out of the queue when no other request waits for it.
//!
//! Every state change happens under one lock and wakes every waiter, which then looks again;
//! nothing is awaited while the lock is held.

use super::catalog::Spec;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{oneshot, Notify};

/// Where a model is.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    /// Not running; `failed` holds why its last start or run ended in failure.
    Unloaded { failed: Option<Failure> },
    /// Its instance is starting.
    Loading,
    /// Its instance listens on this loopback port.
    Loaded { port: u16 },
}

/// How an instance ended when it should not have.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The process's exit code, when it exited with one.
    pub exit_code: Option<i32>,
    /// Its last line on stderr, or what stopped it from starting.
    pub message: String,
}

/// One model of the catalog and its instance.
struct Entry {
    spec: Spec,
    status: Status,
    /// The instance's command line, once started.
    args: Vec<String>,
    /// Requests being served by it.
    in_flight: usize,
    /// Requests waiting for it to load.
    waiters: usize,
    /// When it last took a request, on the pool's clock.
    last_used: u64,
    /// Starts so far: a waiter tells a failure of the start it waited for from an older one.
    attempt: u64,
    /// Dropping it stops the instance.
    stop: Option<oneshot::Sender<()>>,
    /// Held by each request the instance serves: a stopping instance waits for the last.
    busy: Arc<()>,
}

struct State {
    entries: BTreeMap<String, Entry>,
    /// Models waiting for a place, oldest first, each once.
    queue: VecDeque<String>,
    clock: u64,
}

/// The instances and their queue.
pub struct Pool {
    state: Mutex<State>,
    changed: Notify,
    /// Most instances at once (0: no limit).
    max: usize,
    /// The `qkv-server` executable the instances run.
    exe: PathBuf,
    /// The router's own flags every instance gets (after its preset's).
    base: Vec<OsString>,
}

/// Why a request gets no instance.
#[derive(Debug, PartialEq)]
pub enum AcquireError {
    /// No model of that name.
    NotFound,
    /// The model is not running and the request may not load it.
    NotLoaded,
    /// Its instance failed to start.
    Failed(Failure),
}

/// A request's hold on a running instance: it is not stopped to make room while held.
pub struct Lease {
    pool: Arc<Pool>,
    id: String,
    /// The instance's loopback port.
    pub port: u16,
    _busy: Arc<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        if let Some(e) = st.entries.get_mut(&self.id) {
            e.in_flight = e.in_flight.saturating_sub(1);
        }
        self.pool.schedule(&mut st);
        drop(st);
        self.pool.changed.notify_waiters();
    }
}

/// A request waiting for a model; leaving (its client gone) takes the model out of the queue
/// when nobody else waits for it.
struct Waiting {
    pool: Arc<Pool>,
    id: String,
    armed: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut st = self.pool.lock();
        Pool::unwait(&mut st, &self.id);
        self.pool.schedule(&mut st);
        drop(st);
        self.pool.changed.notify_waiters();
    }
}

/// What `/models` shows of one model.
pub struct View {
    pub spec: Spec,
    pub status: Status,
    pub args: Vec<String>,
}

impl Pool {
    /// A pool over `models`, starting at most `max` instances at once (0: any number) of
    /// `exe` with `base` after each model's own flags.
    pub fn new(
        models: BTreeMap<String, Spec>,
        max: usize,
        exe: PathBuf,
        base: Vec<OsString>,
    ) -> Arc<Pool> {
        let entries = models
            .into_iter()
            .map(|(id, spec)| (id, Entry::new(spec)))
            .collect();
        Arc::new(Pool {
            state: Mutex::new(State {
                entries,
                queue: VecDeque::new(),
                clock: 0,
            }),
            changed: Notify::new(),
            max,
            exe,
            base,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves plain bookkeeping behind, still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most instances at once (0: no limit).
    pub fn max(&self) -> usize {
        self.max
    }

    /// Every model with its status, by name.
    pub fn views(&self) -> Vec<View> {
        self.lock()
            .entries
            .values()
            .map(|e| View {
                spec: e.spec.clone(),
                status: e.status.clone(),
                args: e.args.clone(),
            })
            .collect()
    }

    /// Whether a model of that name exists.
    pub fn has(&self, id: &str) -> bool {
        self.lock().entries.contains_key(id)
    }

    /// A running instance of `id` for one request: at once when it runs, else after it has
    /// been started (when `autoload`) and found its place. Cancel-safe: a dropped future
    /// leaves the queue as if it never came.
    pub async fn acquire(
        self: &Arc<Self>,
        id: &str,
        autoload: bool,
    ) -> Result<Lease, AcquireError> {
        let mut waiting: Option<Waiting> = None;
        // The start this request waits for: a failure of an older one is not its answer.
        let mut waits_for: Option<u64> = None;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut guard = self.lock();
                let st = &mut *guard;
                st.clock += 1;
                let clock = st.clock;
                let Some(e) = st.entries.get_mut(id) else {
                    if let Some(mut w) = waiting.take() {
                        w.armed = false;
                    }
                    return Err(AcquireError::NotFound);
                };
                match &e.status {
                    Status::Loaded { port } => {
                        let port = *port;
                        if let Some(mut w) = waiting.take() {
                            w.armed = false;
                            e.waiters -= 1;
                        }
                        e.in_flight += 1;
                        e.last_used = clock;
                        return Ok(Lease {
                            pool: self.clone(),
                            id: id.to_owned(),
                            port,
                            _busy: e.busy.clone(),
                        });
                    }
                    Status::Loading => {
                        if waiting.is_none() {
                            e.waiters += 1;
                            waits_for = Some(e.attempt);
                            waiting = Some(self.waiting(id));
                        }
                    }
                    Status::Unloaded { failed } => {
                        if let (Some(f), Some(a)) = (failed, waits_for) {
                            if e.attempt >= a {
                                let f = f.clone();
                                if let Some(mut w) = waiting.take() {
                                    w.armed = false;
                                    Pool::unwait(st, id);
                                }
                                return Err(AcquireError::Failed(f));
                            }
                        }
                        if !autoload && waiting.is_none() {
                            return Err(AcquireError::NotLoaded);
                        }
                        if waiting.is_none() {
                            e.waiters += 1;
                            waits_for = Some(e.attempt + 1);
                            waiting = Some(self.waiting(id));
                        }
                        if !st.queue.iter().any(|q| q == id) {
                            st.queue.push_back(id.to_owned());
                        }
                        self.schedule(st);
                    }
                }
            }
            notified.await;
        }
    }

    fn waiting(self: &Arc<Self>, id: &str) -> Waiting {
        Waiting {
            pool: self.clone(),
            id: id.to_owned(),
            armed: true,
        }
    }

    /// One waiter of `id` fewer; with none left, a model not yet starting leaves the queue.
    fn unwait(st: &mut State, id: &str) {
        let Some(e) = st.entries.get_mut(id) else {
            return;
        };
        e.waiters = e.waiters.saturating_sub(1);
        if e.waiters == 0 && matches!(e.status, Status::Unloaded { .. }) {
            st.queue.retain(|q| q != id);
        }
    }

    /// Starts the queue's models while places are free or can be freed, oldest first.
    fn schedule(self: &Arc<Self>, st: &mut State) {
        while let Some(id) = st.queue.front().cloned() {
            let waiting = st
                .entries
                .get(&id)
                .is_some_and(|e| matches!(e.status, Status::Unloaded { .. }) && e.waiters > 0);
            if !waiting {
                st.queue.pop_front();
                continue;
            }
            let running = st
                .entries
                .values()
                .filter(|e| !matches!(e.status, Status::Unloaded { .. }))
                .count();
            if self.max != 0 && running >= self.max {
                let idle = st
                    .entries
                    .values()
                    .filter(|e| {
                        matches!(e.status, Status::Loaded { .. })
                            && e.in_flight == 0
                            && e.waiters == 0
                    })
                    .min_by_key(|e| e.last_used)
                    .map(|e| e.spec.id.clone());
                let Some(victim) = idle else {
                    break;
                };
                Pool::stop(st, &victim);
            }
            st.queue.pop_front();
            self.start(st, &id);
        }
    }

    /// Marks `id` unloaded and stops its instance (after its last request, within the
    /// preset's stop timeout).
    fn stop(st: &mut State, id: &str) {
        if let Some(e) = st.entries.get_mut(id) {
            e.status = Status::Unloaded { failed: None };
            e.stop = None;
            e.busy = Arc::new(());
        }
    }

    /// Stops `id`'s instance on request; false when it was not running.
    pub fn unload(self: &Arc<Self>, id: &str) -> bool {
        let mut st = self.lock();
        let running = st
            .entries
            .get(id)
            .is_some_and(|e| !matches!(e.status, Status::Unloaded { .. }));
        if running {
            Pool::stop(&mut st, id);
            self.schedule(&mut st);
        }
        drop(st);
        self.changed.notify_waiters();
        running
    }

    /// Replaces the catalog: a model gone or changed is stopped if it runs; the others keep
    /// their instances.
    pub fn reload(self: &Arc<Self>, models: BTreeMap<String, Spec>) {
        let mut st = self.lock();
        let old: Vec<String> = st.entries.keys().cloned().collect();
        for id in old {
            let same = models.get(&id).is_some_and(|s| *s == st.entries[&id].spec);
            if !same {
                let busy = st.entries[&id].in_flight > 0 || st.entries[&id].waiters > 0;
                Pool::stop(&mut st, &id);
                if busy && models.contains_key(&id) {
                    // Requests hold it: keep the entry, with the new options for its next start.
                    let e = st.entries.get_mut(&id).expect("listed above");
                    e.spec = models[&id].clone();
                } else {
                    st.entries.remove(&id);
                }
            }
        }
        for (id, spec) in models {
            st.entries.entry(id).or_insert_with(|| Entry::new(spec));
        }
        self.schedule(&mut st);
        drop(st);
        self.changed.notify_waiters();
    }

    /// Starts an instance of `id` (its place already found).
    fn start(self: &Arc<Self>, st: &mut State, id: &str) {
        let Some(e) = st.entries.get_mut(id) else {
            return;
        };
        e.attempt += 1;
        e.status = Status::Loading;
        let (stop_tx, stop_rx) = oneshot::channel();
        e.stop = Some(stop_tx);
        e.busy = Arc::new(());
        let mut args: Vec<OsString> = vec![
            "--model".into(),
            e.spec.path.clone().into(),
            "--model-name".into(),
            id.into(),
        ];
        args.extend(super::catalog::dedupe(&e.spec.flags, &self.base));
        args.extend(["--host", "127.0.0.1", "--port", "0"].map(OsString::from));
        e.args = std::iter::once("qkv-server".to_owned())
            .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect();
        let launch = Launch {
            pool: self.clone(),
            id: id.to_owned(),
            attempt: e.attempt,
            args,
            env: e.spec.env.clone(),
            stop_timeout: e.spec.stop_timeout,
            busy: Arc::downgrade(&e.busy),
        };
        tokio::spawn(launch.run(stop_rx));
    }

    /// Records how instance `attempt` of `id` ended or came up, if it is still the current one.
    fn report(self: &Arc<Self>, id: &str, attempt: u64, status: Status) {
        let mut st = self.lock();
        if let Some(e) = st.entries.get_mut(id) {
            let current = e.attempt == attempt && !matches!(e.status, Status::Unloaded { .. });
            if current {
                if matches!(status, Status::Unloaded { .. }) {
                    e.stop = None;
                }
                e.status = status;
            }
        }
        self.schedule(&mut st);
        drop(st);
        self.changed.notify_waiters();
    }
}

impl Entry {
    fn new(spec: Spec) -> Entry {
        Entry {
            spec,
            status: Status::Unloaded { failed: None },
            args: Vec::new(),
            in_flight: 0,
            waiters: 0,
            last_used: 0,
            attempt: 0,
            stop: None,
            busy: Arc::new(()),
        }
    }
}

/// The longest an instance may take to load its model and listen.
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// One start of one instance, run as a task until the instance ends.
struct Launch {
    pool: Arc<Pool>,
    id: String,
    attempt: u64,
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    stop_timeout: Duration,
    /// Alive while requests hold the instance.
    busy: std::sync::Weak<()>,
}

impl Launch {
    async fn run(self, mut stop: oneshot::Receiver<()>) {
        let failed = |exit_code, message: String| Status::Unloaded {
            failed: Some(Failure { exit_code, message }),
        };
        let spawned = tokio::process::Command::new(&self.pool.exe)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(super::ROUTER_PID, std::process::id().to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let why = format!("could not start {}: {e}", self.pool.exe.display());
                return self.pool.report(&self.id, self.attempt, failed(None, why));
            }
        };
        let Some(stderr) = child.stderr.take() else {
            return self
                .pool
                .report(&self.id, self.attempt, failed(None, "no stderr".into()));
        };
        let mut lines = BufReader::new(stderr).lines();
        let mut last = String::new();
        let deadline = tokio::time::sleep(START_TIMEOUT);
        tokio::pin!(deadline);
        let port = loop {
            tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(l)) => {
                        eprintln!("[{}] {l}", self.id);
                        if let Some(p) = listening_port(&l) {
                            break Some(p);
                        }
                        last = l;
                    }
                    _ => break None,
                },
                _ = &mut stop => {
                    child.kill().await.ok();
                    return;
                }
                _ = &mut deadline => {
                    child.kill().await.ok();
                    let why = format!("did not listen within {} s", START_TIMEOUT.as_secs());
                    return self.pool.report(&self.id, self.attempt, failed(None, why));
                }
            }
        };
        let Some(port) = port else {
            let code = child.wait().await.ok().and_then(|s| s.code());
            return self.pool.report(&self.id, self.attempt, failed(code, last));
        };
        self.pool
            .report(&self.id, self.attempt, Status::Loaded { port });
        let id = self.id.clone();
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                eprintln!("[{id}] {l}");
            }
        });
        tokio::select! {
            status = child.wait() => {
                let status = match status {
                    Ok(s) if s.success() => Status::Unloaded { failed: None },
                    Ok(s) => failed(s.code(), format!("the instance exited ({s})")),
                    Err(e) => failed(None, format!("the instance was lost: {e}")),
                };
                self.pool.report(&self.id, self.attempt, status);
            }
            _ = &mut stop => {
                // Requests still held finish first, within the stop timeout.
                let waited = tokio::time::Instant::now();
                while self.busy.strong_count() > 0 && waited.elapsed() < self.stop_timeout {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                child.kill().await.ok();
            }
        }
    }
}

/// The port of a `qkv-server` line saying where it listens.
fn listening_port(line: &str) -> Option<u16> {
    let (_, addr) = line.split_once(" listening on http://")?;
    addr.trim().rsplit(':').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_read_from_the_listening_line() {
        let l = "qkv-server: /m.gguf as `m` (16 sequences; no API key) listening on http://127.0.0.1:41234";
        assert_eq!(listening_port(l), Some(41234));
        assert_eq!(listening_port("qkv-server: loading"), None);
    }
}
