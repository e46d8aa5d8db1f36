//! The Session API on the real default model: prefix reuse, errors at the edges, sessions in
//! parallel, generation, and a decode step that allocates nothing.
//!
//! The tests are named `network_…`: without the model they print why they skipped
//! (tests/synthetic.rs runs the same paths offline on a synthetic model).
//! Run in release mode: `cargo test --release --test session`. The tests in this file run
//! one at a time (they share a lock) because one of them counts allocations process-wide.

mod common;

use qkv::load::{Model, ModelOptions};
use qkv::sample::{argmax, SamplerConfig};
use qkv::session::{Session, SessionOptions};
use qkv::weights::FloatType;
use qkv::Error;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Counts allocations while `COUNTING` is set.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The default model, or `None` (a skip printed) when it cannot be had.
fn model() -> Option<Arc<Model>> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    let path = common::default_gguf()?;
    let m = M.get_or_init(|| Arc::new(Model::load(&path, &ModelOptions::default()).unwrap()));
    Some(m.clone())
}

/// A session of `context` positions on [`model`], which the caller has checked is there.
fn session(context: usize) -> Session {
    let options = SessionOptions {
        context: Some(context),
        kv_dtype: Some(FloatType::F32.into()),
        ..SessionOptions::default()
    };
    Session::new(model().expect("checked by the test"), options).unwrap()
}

const A: [u32; 5] = [504, 3575, 282, 4649, 314]; // "The capital of France is"
const B: [u32; 4] = [7042, 30, 198, 198]; // " Paris.\n\n"
const C: [u32; 3] = [1350, 3575, 282]; // something else

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn network_truncate_reuses_a_shared_prefix() {
    let _g = serial();
    let Some(_) = model() else { return };
    let mut s = session(64);
    s.prefill(&A).unwrap();
    s.prefill(&B).unwrap();
    assert_eq!(s.position(), 9);
    s.truncate(A.len()).unwrap();
    let reused = s.prefill(&C).unwrap().to_vec();
    let mut fresh = session(64);
    fresh.prefill(&A).unwrap();
    let direct = fresh.prefill(&C).unwrap().to_vec();
    assert!(max_diff(&reused, &direct) < 1e-4);
    assert_eq!(s.tokens(), [&A[..], &C[..]].concat());
    assert!(matches!(s.truncate(100), Err(Error::Shape(_))));
}

#[test]
fn network_generating_after_a_truncate_continues_the_kept_tokens() {
    let _g = serial();
    let Some(_) = model() else { return };
    let greedy = SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    };
    let first = |s: &mut Session| {
        let mut g = s
            .generate_tokens(&[], greedy.clone())
            .unwrap()
            .max_tokens(3);
        let ids: Vec<u32> = g.by_ref().map(|p| p.unwrap().id).collect();
        ids
    };
    let mut s = session(64);
    s.prefill(&A).unwrap();
    s.prefill(&C).unwrap();
    s.truncate(A.len()).unwrap();
    // The logits there are C's last position's; the continuation must be A's.
    let after_truncate = first(&mut s);
    let mut fresh = session(64);
    fresh.prefill(&A).unwrap();
    assert_eq!(after_truncate, first(&mut fresh));
    assert_eq!(&after_truncate[..2], &B[..2], "\" Paris\" after A");
    assert_eq!(s.tokens().len(), A.len() + 3);
}

#[test]
fn network_reset_starts_over() {
    let _g = serial();
    let Some(_) = model() else { return };
    let mut s = session(64);
    s.prefill(&B).unwrap();
    s.reset();
    assert_eq!(s.position(), 0);
    let again = s.prefill(&A).unwrap().to_vec();
    let fresh = session(64).prefill(&A).unwrap().to_vec();
    assert!(max_diff(&again, &fresh) < 1e-5);
    assert_eq!(argmax(&again), 7042); // " Paris"
}

#[test]
fn network_a_full_context_is_an_error_and_changes_nothing() {
    let _g = serial();
    let Some(model) = model() else { return };
    let mut s = session(8);
    s.prefill(&A).unwrap();
    match s.prefill(&B) {
        Err(Error::ContextFull { needed, capacity }) => assert_eq!((needed, capacity), (9, 8)),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.position(), 5);
    s.prefill(&B[..3]).unwrap();
    assert!(matches!(s.step(1), Err(Error::ContextFull { .. })));
    assert_eq!(s.position(), 8);
    // Bigger than the model's context: refused up front.
    let too_big = SessionOptions {
        context: Some(1 << 20),
        ..SessionOptions::default()
    };
    assert!(matches!(
        Session::new(model.clone(), too_big),
        Err(Error::Config(_))
    ));
}

#[test]
fn network_bad_token_ids_are_errors_and_change_nothing() {
    let _g = serial();
    let Some(model) = model() else { return };
    let mut s = session(16);
    s.prefill(&A).unwrap();
    let vocab = model.vocab_size() as u32;
    assert!(matches!(s.step(vocab), Err(Error::TokenOutOfRange { id, .. }) if id == vocab));
    assert!(matches!(
        s.prefill(&[1, u32::MAX]),
        Err(Error::TokenOutOfRange { .. })
    ));
    assert!(matches!(s.prefill(&[]), Err(Error::Shape(_))));
    assert_eq!(s.position(), 5);
    assert_eq!(argmax(s.step(7042).unwrap()), 30); // "."
}

#[test]
fn network_sessions_in_parallel_match_serial_runs() {
    let _g = serial();
    let Some(_) = model() else { return };
    // Short prompts take the GEMV path, prompts of more than 8 tokens the gemm one, whose
    // f16 panels once collided when one session's job ran inside another's on a pool thread.
    let prompts: Vec<Vec<u32>> = vec![
        A.to_vec(),
        C.to_vec(),
        [&B[..], &A[..]].concat(),
        [&A[..], &B[..], &C[..]].concat(),
        [&C[..], &A[..], &B[..], &A[..]].concat(),
        [&A[..], &C[..], &A[..]].concat(),
    ];
    let run = |prompt: &[u32], s: &mut Session| -> Vec<u32> {
        let mut next = argmax(s.prefill(prompt).unwrap());
        let mut out = vec![];
        for _ in 0..12 {
            out.push(next);
            next = argmax(s.step(next).unwrap());
        }
        out
    };
    let serial: Vec<Vec<u32>> = prompts.iter().map(|p| run(p, &mut session(64))).collect();
    let parallel: Vec<Vec<u32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| scope.spawn(move || run(p, &mut session(64))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(serial, parallel);
}

/// Allocations made while `f` runs.
fn allocations_in(f: impl FnOnce()) -> usize {
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    f();
    COUNTING.store(false, Ordering::SeqCst);
    ALLOCATIONS.load(Ordering::SeqCst)
}

#[test]
fn network_a_decode_step_allocates_nothing_after_warm_up() {
    let _g = serial();
    let Some(model) = model() else { return };
    for kv in [FloatType::F16, FloatType::F32] {
        let options = SessionOptions {
            context: Some(128),
            kv_dtype: Some(kv.into()),
            ..SessionOptions::default()
        };
        let mut s = Session::new(model.clone(), options).unwrap();
        let mut next = argmax(s.prefill(&A).unwrap());
        for _ in 0..3 {
            next = argmax(s.step(next).unwrap());
        }
        // Called from a rayon worker (as a server running sessions on the pool would): none.
        // Each worker thread sizes its kernels' thread-local scratch the first time it takes
        // a share of that kernel, which on a loaded host may come after the warm-up: a window
        // of 16 steps may see those first touches (a handful, once per thread), never an
        // allocation per step; the next window then sees none.
        let mut windows = Vec::new();
        for _ in 0..3 {
            let n = allocations_in(|| {
                rayon::scope(|_| {
                    for _ in 0..16 {
                        next = argmax(s.step(next).unwrap());
                    }
                })
            });
            windows.push(n);
            if n == 0 {
                break;
            }
        }
        assert_eq!(
            windows.last(),
            Some(&0),
            "allocations in windows of 16 decode steps with a {kv} cache: {windows:?}"
        );
        assert!(windows[0] < 16, "{windows:?}");
        // Called from outside the pool, each step hands one job to rayon's global queue,
        // which allocates a new block once per 63 jobs: at most one block here, none of it
        // ours.
        let mut windows = Vec::new();
        for _ in 0..3 {
            let n = allocations_in(|| {
                for _ in 0..16 {
                    next = argmax(s.step(next).unwrap());
                }
            });
            windows.push(n);
            if n <= 1 {
                break;
            }
        }
        assert!(
            windows.last() <= Some(&1) && windows[0] < 16,
            "allocations in windows of 16 decode steps with a {kv} cache: {windows:?}"
        );
    }
}

/// The batch engine's steady state: once every sequence runs (its cache made, its prompt
/// read), a step of 4 decoding sequences allocates nothing but its events, which this
/// caller's vector already has room for.
#[test]
fn network_an_engine_step_allocates_nothing_after_warm_up() {
    use qkv::engine::{Engine, EngineOptions, GenRequest};
    let _g = serial();
    let Some(model) = model() else { return };
    let mut engine = Engine::new(
        model.clone(),
        EngineOptions {
            max_sequences: 4,
            context: 256,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    for salt in 0..4u32 {
        let prompt: Vec<u32> = A.iter().map(|&t| t + salt).collect();
        let request = GenRequest {
            ignore_eos: true,
            ..GenRequest::new(prompt, SamplerConfig::greedy(), 200)
        };
        engine.submit(request).unwrap();
    }
    let mut events = Vec::with_capacity(64);
    for _ in 0..4 {
        events.clear();
        engine.step(&mut events).unwrap();
    }
    assert_eq!(engine.running(), 4);
    // As for sessions: a window may see the worker threads' first touches of their kernel
    // scratch, never an allocation per step.
    let mut windows = Vec::new();
    for _ in 0..3 {
        let n = allocations_in(|| {
            for _ in 0..16 {
                events.clear();
                engine.step(&mut events).unwrap();
            }
        });
        windows.push(n);
        if n <= 1 {
            break;
        }
    }
    assert!(
        windows.last() <= Some(&1) && windows[0] < 16,
        "allocations in windows of 16 engine steps: {windows:?}"
    );
}

#[test]
fn network_generate_streams_paris_and_stops_at_eos() {
    let _g = serial();
    let Some(model) = model() else { return };
    let mut s = session(256);
    let eos = model.tokenizer().unwrap().eos_id();
    let pieces: Vec<_> = s
        .generate("The capital of France is", SamplerConfig::greedy())
        .unwrap()
        .max_tokens(2)
        .collect::<Result<_, _>>()
        .unwrap();
    let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(text, " Paris.");
    assert!(pieces.iter().all(|p| p.logprob <= 0.0 && p.logprob > -20.0));
    assert_eq!(s.position(), 5 + 2);

    // The chat turn ends with <|im_end|>, the EOS token: generation stops there.
    s.reset();
    let prompt =
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let pieces: Vec<_> = s
        .generate(prompt, SamplerConfig::greedy())
        .unwrap()
        .max_tokens(64)
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(pieces.len() < 64, "no EOS in {pieces:?}");
    assert_eq!(Some(pieces.last().unwrap().id), eos);
    let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
    assert!(text.contains("Paris"), "{text:?}");
}

#[test]
fn network_generate_is_reproducible_per_seed() {
    let _g = serial();
    let Some(_) = model() else { return };
    let text = |seed| -> String {
        let mut s = session(128);
        let config = SamplerConfig {
            temperature: 1.0,
            seed,
            ..SamplerConfig::default()
        };
        s.generate("Once upon a time", config)
            .unwrap()
            .max_tokens(24)
            .ignore_eos(true)
            .map(|p| p.unwrap().text)
            .collect()
    };
    assert_eq!(text(5), text(5));
    assert_ne!(text(5), text(6));
}

#[test]
fn network_generate_reports_a_full_context_then_ends() {
    let _g = serial();
    let Some(_) = model() else { return };
    let mut s = session(12);
    let items: Vec<_> = s
        .generate("The capital of France is", SamplerConfig::greedy())
        .unwrap()
        .ignore_eos(true)
        .collect();
    assert_eq!(items.len(), 8);
    assert!(items[..7].iter().all(|r| r.is_ok()));
    assert!(matches!(items[7], Err(Error::ContextFull { .. })));
    assert_eq!(s.position(), 12);
}
