//! The batch engine, on the synthetic model of src/testing/synthetic.rs (f32, offline) and on
//! the default model (SmolLM2-135M-Instruct, widened to f32; the `network_…` tests, which skip
//! with a printed reason without it). In f32 the one-row and many-row matrix paths differ only
//! in the order of f32 additions, so: sequences
//! joining at different steps, with prompts read in chunks beside other sequences' decode
//! tokens, get the greedy tokens they get alone, and log-probabilities within 1e-3; a
//! cancelled sequence frees its slot; a full queue refuses; a cached prefix is reused; the
//! KV budget bounds the running sequences.

mod common;
#[path = "engine/slots.rs"]
mod slots;
#[path = "engine/speculative.rs"]
mod speculative;

use qkv::engine::{Engine, EngineOptions, Event, FinishReason, GenRequest, SeqId};
use qkv::load::{Model, ModelOptions};
use qkv::sample::SamplerConfig;
use qkv::session::{Session, SessionOptions};
use qkv::weights::FloatType;
use qkv::Error;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// The default model widened to f32, or `None` (a skip printed) without it.
fn real_model() -> Option<Arc<Model>> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    let path = common::default_gguf()?;
    let m = M.get_or_init(|| {
        let options = ModelOptions {
            dtype: Some(FloatType::F32),
            ..ModelOptions::default()
        };
        Arc::new(Model::load(&path, &options).unwrap())
    });
    Some(m.clone())
}

/// The synthetic model in f32.
fn synthetic_model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| {
        let path = common::synthetic::model_file(common::synthetic::Storage::F32);
        Arc::new(Model::load(&path, &ModelOptions::default()).unwrap())
    })
    .clone()
}

fn ids(m: &Arc<Model>, text: &str) -> Vec<u32> {
    m.tokenizer().unwrap().encode(text).unwrap()
}

const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "Write a short poem about the sea. The waves",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "One, two, three, four,",
];

/// Greedy tokens (and their log-probabilities) of `prompt` run alone in a session.
fn alone(m: &Arc<Model>, prompt: &[u32], n: usize) -> Vec<(u32, f32)> {
    let options = SessionOptions {
        context: Some(256),
        kv_dtype: Some(FloatType::F32.into()),
        ..SessionOptions::default()
    };
    let mut s = Session::new(m.clone(), options).unwrap();
    let gen = s
        .generate_tokens(prompt, SamplerConfig::greedy())
        .unwrap()
        .max_tokens(n)
        .ignore_eos(true);
    gen.map(|p| {
        let p = p.unwrap();
        (p.id, p.logprob)
    })
    .collect()
}

fn engine(m: &Arc<Model>, options: EngineOptions) -> Engine {
    Engine::new(
        m.clone(),
        EngineOptions {
            context: 256,
            kv_dtype: Some(FloatType::F32.into()),
            ..options
        },
    )
    .unwrap()
}

fn request(prompt: Vec<u32>, n: usize) -> GenRequest {
    GenRequest {
        ignore_eos: true,
        ..GenRequest::new(prompt, SamplerConfig::greedy(), n)
    }
}

/// Each sequence's (token, log-probability) pairs.
type Tokens = HashMap<SeqId, Vec<(u32, f32)>>;

/// Tokens per sequence, and the Done events, from a list of events.
fn collect(events: &[Event]) -> (Tokens, HashMap<SeqId, Event>) {
    let (mut tokens, mut done) = (Tokens::new(), HashMap::new());
    for e in events {
        match e {
            Event::Token {
                seq,
                token,
                logprob,
                ..
            } => tokens.entry(*seq).or_default().push((*token, *logprob)),
            Event::Done { seq, .. } => {
                assert!(
                    done.insert(*seq, e.clone()).is_none(),
                    "two Done for {seq:?}"
                );
            }
            Event::Failed { seq, error } => panic!("{seq:?} failed: {error}"),
            Event::Prompt { .. } | Event::Shifted { .. } => {}
        }
    }
    (tokens, done)
}

fn check_batched_sequences_get_the_tokens_they_get_alone(m: &Arc<Model>) {
    let n = 12;
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| ids(m, p)).collect();
    let want: Vec<Vec<(u32, f32)>> = prompts.iter().map(|p| alone(m, p, n)).collect();
    // A small token budget: prompts are read in chunks of at most 8 beside decode tokens.
    let mut e = engine(
        m,
        EngineOptions {
            max_sequences: 4,
            step_tokens: 8,
            ..EngineOptions::default()
        },
    );
    let mut events = Vec::new();
    let mut seqs = Vec::new();
    // Sequences join at steps 0, 2, 5 and 9.
    for step in 0.. {
        if let Some(k) = [0, 2, 5, 9].iter().position(|&s| s == step) {
            seqs.push(e.submit(request(prompts[k].clone(), n)).unwrap());
        }
        if seqs.len() == prompts.len() && e.is_idle() {
            break;
        }
        e.step(&mut events).unwrap();
        assert!(step < 500, "the engine does not finish");
    }
    let (tokens, done) = collect(&events);
    for (k, seq) in seqs.iter().enumerate() {
        let got = &tokens[seq];
        let ids = |v: &[(u32, f32)]| v.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(got), ids(&want[k]), "prompt {k}: {:?}", PROMPTS[k]);
        for (g, w) in got.iter().zip(&want[k]) {
            assert!(
                (g.1 - w.1).abs() < 1e-3,
                "prompt {k}: logprob {} vs {}",
                g.1,
                w.1
            );
        }
        match &done[seq] {
            Event::Done {
                reason,
                generated,
                prompt_tokens,
                ..
            } => {
                assert_eq!(*reason, FinishReason::Length);
                assert_eq!((*generated, *prompt_tokens), (n, prompts[k].len()));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn batched_sequences_get_the_tokens_they_get_alone() {
    check_batched_sequences_get_the_tokens_they_get_alone(&synthetic_model());
}

/// The step budget: prompts that arrive while nothing decodes are read together under
/// `prefill_step_tokens`; a prompt that arrives while more sequences decode than read is
/// read in chunks that fill `step_tokens` after their decode tokens, so the running streams
/// keep a token a step.
/// Each sequence reports its prompt's progress: once when it takes a slot (`read` equal to
/// the reused `cached`), then after every chunk with `read` growing, the last at `total`
/// and before its first token; a prompt that shares a finished sequence's prefix starts
/// from the reused tokens.
#[test]
fn prompt_progress_is_reported_chunk_by_chunk() {
    let m = synthetic_model();
    let mut e = engine(
        &m,
        EngineOptions {
            max_sequences: 2,
            step_tokens: 8,
            prefill_step_tokens: 8,
            ..EngineOptions::default()
        },
    );
    let prompt: Vec<u32> = (0..30).map(|t| 32 + (t * 11) % 200).collect();
    let run = |e: &mut Engine, prompt: Vec<u32>| {
        let seq = e.submit(request(prompt, 3)).unwrap();
        let mut events = Vec::new();
        while !e.is_idle() {
            e.step(&mut events).unwrap();
        }
        let mut progress = Vec::new();
        let mut first_token = None;
        for (i, ev) in events.iter().enumerate() {
            match ev {
                Event::Prompt {
                    seq: s,
                    cached,
                    read,
                    total,
                } if *s == seq => progress.push((i, *cached, *read, *total)),
                Event::Token { seq: s, .. } if *s == seq => {
                    first_token.get_or_insert(i);
                }
                _ => {}
            }
        }
        (progress, first_token.expect("a token"))
    };
    let (progress, first_token) = run(&mut e, prompt.clone());
    let reads: Vec<usize> = progress.iter().map(|p| p.2).collect();
    // 30 tokens in chunks of 8: 0, 8, 16, 24, 30.
    assert_eq!(reads, [0, 8, 16, 24, 30]);
    assert!(progress.iter().all(|p| p.1 == 0 && p.3 == 30));
    assert!(progress.last().unwrap().0 < first_token);

    // The same prompt with a new ending reuses the finished sequence's cache.
    let mut second = prompt[..26].to_vec();
    second.extend([7, 9, 11, 13]);
    let (progress, _) = run(&mut e, second);
    let (_, cached, read, total) = progress[0];
    assert!(cached >= 24, "reused {cached}");
    assert_eq!((read, total), (cached, 30));
    assert_eq!(progress.last().unwrap().2, 30);
    assert!(progress.windows(2).all(|w| w[1].2 > w[0].2));
}

#[test]
fn prompts_read_together_when_idle_and_in_small_chunks_beside_decodes() {
    let m = synthetic_model();
    let mut e = engine(
        &m,
        EngineOptions {
            max_sequences: 6,
            step_tokens: 8,
            prefill_step_tokens: 64,
            ..EngineOptions::default()
        },
    );
    let prompt = |k: u32| {
        (0..20)
            .map(|t| 32 + (t * 7 + k * 13) % 200)
            .collect::<Vec<_>>()
    };
    let first: Vec<SeqId> = (0..3)
        .map(|k| e.submit(request(prompt(k), 30)).unwrap())
        .collect();
    let mut events = Vec::new();
    e.step(&mut events).unwrap();
    // 60 prompt tokens in one step: all three have their first token.
    let tokens = |events: &[Event], seq: SeqId| {
        events
            .iter()
            .filter(|ev| matches!(ev, Event::Token { seq: s, .. } if *s == seq))
            .count()
    };
    for &seq in &first {
        assert_eq!(tokens(&events, seq), 1, "{seq:?} after the first step");
    }
    // Now three decode and one prompt arrives: it reads 8 tokens a step (a reading
    // prompt's own share, more than the 8 - 3 left after the decode tokens), so its 20 take
    // 3 steps, while each running sequence still gets one token every step.
    let late = e.submit(request(prompt(3), 4)).unwrap();
    for step in 1..=3 {
        events.clear();
        e.step(&mut events).unwrap();
        for &seq in &first {
            assert_eq!(tokens(&events, seq), 1, "{seq:?} at step {step}");
        }
        let want = usize::from(step == 3);
        assert_eq!(
            tokens(&events, late),
            want,
            "the late prompt at step {step}"
        );
    }
    // Four decode (the late one has 3 tokens to go) and two prompts arrive: fewer read
    // than decode, so the step stays small, but it holds 8 prompt tokens for each of them:
    // 16 a step, in slot order. The first prompt reads 16 and then 4, the second 12 and
    // then its last 8: one has its first token at the second step, and at the third the
    // other has its first and the one its second.
    let pair: Vec<SeqId> = (4..6)
        .map(|k| e.submit(request(prompt(k), 4)).unwrap())
        .collect();
    for (step, want) in [(1, 0), (2, 1), (3, 2)] {
        events.clear();
        e.step(&mut events).unwrap();
        for &seq in &first {
            assert_eq!(
                tokens(&events, seq),
                1,
                "{seq:?} at step {step} of the pair"
            );
        }
        let got: usize = pair.iter().map(|&seq| tokens(&events, seq)).sum();
        assert_eq!(got, want, "the pair's tokens at step {step}");
    }

    // A burst: one sequence decodes and two prompts arrive, so as many read as decode and
    // the next step reads under the larger budget: the decode token and 63 prompt tokens,
    // the first prompt whole (40) and 23 of the second.
    let mut e = engine(
        &m,
        EngineOptions {
            max_sequences: 4,
            step_tokens: 8,
            prefill_step_tokens: 64,
            ..EngineOptions::default()
        },
    );
    let lead = e.submit(request(prompt(0), 30)).unwrap();
    events.clear();
    e.step(&mut events).unwrap();
    assert_eq!(tokens(&events, lead), 1);
    let long = |k: u32| [prompt(k), prompt(k + 5)].concat()[..40].to_vec();
    let burst: Vec<SeqId> = (1..3)
        .map(|k| e.submit(request(long(k), 30)).unwrap())
        .collect();
    events.clear();
    e.step(&mut events).unwrap();
    assert_eq!(
        tokens(&events, lead),
        1,
        "the decoding sequence in the burst's step"
    );
    assert_eq!(tokens(&events, burst[0]), 1, "the first prompt, read whole");
    assert_eq!(
        tokens(&events, burst[1]),
        0,
        "the second prompt, read in part"
    );
    // Now two decode and one reads: back to chunks of 8 (its own share; 8 - 2 = 6 are left
    // after the decode tokens), so its last 17 tokens take 3 steps, and the two running
    // sequences get a token in each.
    for step in 1..=3 {
        events.clear();
        e.step(&mut events).unwrap();
        assert_eq!(
            tokens(&events, lead),
            1,
            "the first sequence, step {step} after"
        );
        assert_eq!(
            tokens(&events, burst[0]),
            1,
            "the first prompt, step {step} after"
        );
        let want = usize::from(step == 3);
        assert_eq!(
            tokens(&events, burst[1]),
            want,
            "the second, step {step} after"
        );
    }
}

#[test]
fn network_batched_sequences_get_the_tokens_they_get_alone() {
    let Some(m) = real_model() else { return };
    check_batched_sequences_get_the_tokens_they_get_alone(&m);
}

fn check_a_cached_prefix_is_reused_and_gives_the_same_tokens(m: &Arc<Model>) {
    let system = ids(
        m,
        "You are a helpful assistant. Answer in one short sentence. Question:",
    );
    let first: Vec<u32> = [system.clone(), ids(m, " What is the capital of France?")].concat();
    let second: Vec<u32> = [system.clone(), ids(m, " How many legs has a spider?")].concat();
    let mut e = engine(
        m,
        EngineOptions {
            max_sequences: 2,
            ..EngineOptions::default()
        },
    );
    let mut events = Vec::new();
    let a = e.submit(request(first.clone(), 4)).unwrap();
    while !e.is_idle() {
        e.step(&mut events).unwrap();
    }
    let b = e.submit(request(second.clone(), 6)).unwrap();
    while !e.is_idle() {
        e.step(&mut events).unwrap();
    }
    let (tokens, done) = collect(&events);
    let shared = first
        .iter()
        .zip(&second)
        .take_while(|(x, y)| x == y)
        .count();
    assert!(shared >= system.len(), "the prompts share the system part");
    match (&done[&a], &done[&b]) {
        (
            Event::Done {
                cached_tokens: 0, ..
            },
            Event::Done { cached_tokens, .. },
        ) => assert_eq!(*cached_tokens, shared),
        other => panic!("{other:?}"),
    }
    let ids_of = |v: &[(u32, f32)]| v.iter().map(|t| t.0).collect::<Vec<_>>();
    assert_eq!(ids_of(&tokens[&b]), ids_of(&alone(m, &second, 6)));
}

#[test]
fn a_cached_prefix_is_reused_and_gives_the_same_tokens() {
    check_a_cached_prefix_is_reused_and_gives_the_same_tokens(&synthetic_model());
}

#[test]
fn network_a_cached_prefix_is_reused_and_gives_the_same_tokens() {
    let Some(m) = real_model() else { return };
    check_a_cached_prefix_is_reused_and_gives_the_same_tokens(&m);
}

fn check_cancelling_frees_the_slot_and_a_full_queue_refuses(m: &Arc<Model>) {
    let mut e = engine(
        m,
        EngineOptions {
            max_sequences: 1,
            queue: 2,
            ..EngineOptions::default()
        },
    );
    let p = ids(m, "Once upon a time");
    let a = e.submit(request(p.clone(), 100)).unwrap();
    let b = e.submit(request(p.clone(), 3)).unwrap();
    let c = e.submit(request(p.clone(), 3)).unwrap_err();
    assert!(matches!(c, Error::QueueFull { capacity: 2 }), "{c}");
    let mut events = Vec::new();
    for _ in 0..3 {
        e.step(&mut events).unwrap();
    }
    assert_eq!((e.running(), e.queued()), (1, 1));
    assert!(e.cancel(a));
    assert!(!e.cancel(SeqId(999)));
    while !e.is_idle() {
        e.step(&mut events).unwrap();
    }
    let (tokens, done) = collect(&events);
    assert!(matches!(
        done[&a],
        Event::Done {
            reason: FinishReason::Cancelled,
            ..
        }
    ));
    assert_eq!(tokens[&b].len(), 3);
    // A waiting sequence can be cancelled too.
    let d = e.submit(request(p.clone(), 100)).unwrap();
    let f = e.submit(request(p, 100)).unwrap();
    assert!(e.cancel(f));
    events.clear();
    e.step(&mut events).unwrap();
    assert!(events.iter().any(
        |ev| matches!(ev, Event::Done { seq, reason: FinishReason::Cancelled, .. } if *seq == f)
    ));
    e.cancel(d);
    while !e.is_idle() {
        e.step(&mut events).unwrap();
    }
}

#[test]
fn cancelling_frees_the_slot_and_a_full_queue_refuses() {
    check_cancelling_frees_the_slot_and_a_full_queue_refuses(&synthetic_model());
}

#[test]
fn network_cancelling_frees_the_slot_and_a_full_queue_refuses() {
    let Some(m) = real_model() else { return };
    check_cancelling_frees_the_slot_and_a_full_queue_refuses(&m);
}

fn check_bad_requests_are_refused_and_the_kv_budget_bounds_the_running(m: &Arc<Model>) {
    let cache_bytes = { m.decoder().new_cache(256, FloatType::F32).unwrap().bytes() };
    let mut e = engine(
        m,
        EngineOptions {
            max_sequences: 8,
            kv_budget: Some(2 * cache_bytes + 1),
            ..EngineOptions::default()
        },
    );
    assert_eq!(e.max_running(), 2);
    let vocab = m.vocab_size() as u32;
    for (req, what) in [
        (request(vec![], 3), "empty prompt"),
        (request(vec![1], 0), "no tokens"),
        (request(vec![vocab], 3), "token out of range"),
        (request(vec![1; 200], 100), "past the context"),
    ] {
        assert!(e.submit(req).is_err(), "{what}");
    }
    let err = e.submit(request(vec![1; 200], 100)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ContextFull {
                needed: 299,
                capacity: 256
            }
        ),
        "{err}"
    );
    let mut hot = request(vec![1, 2, 3], 3);
    hot.sampler.temperature = -1.0;
    assert!(matches!(e.submit(hot), Err(Error::Config(_))));
    let err = Engine::new(
        m.clone(),
        EngineOptions {
            context: 256,
            kv_budget: Some(10),
            ..EngineOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");

    let p = ids(m, "Hello");
    for _ in 0..3 {
        e.submit(request(p.clone(), 5)).unwrap();
    }
    let mut events = Vec::new();
    e.step(&mut events).unwrap();
    assert_eq!((e.running(), e.queued()), (2, 1));
    while !e.is_idle() {
        e.step(&mut events).unwrap();
        assert!(e.running() <= 2);
    }
}
#[test]
fn bad_requests_are_refused_and_the_kv_budget_bounds_the_running() {
    check_bad_requests_are_refused_and_the_kv_budget_bounds_the_running(&synthetic_model());
}

#[test]
fn network_bad_requests_are_refused_and_the_kv_budget_bounds_the_running() {
    let Some(m) = real_model() else { return };
    check_bad_requests_are_refused_and_the_kv_budget_bounds_the_running(&m);
}

/// A constraint that allows only `allowed` and is complete after `len` tokens; counts how
/// often it had to mask.
struct OnlyThese {
    allowed: Vec<u32>,
    len: usize,
    seen: usize,
    masks: Arc<std::sync::atomic::AtomicUsize>,
}

impl qkv::engine::TokenConstraint for OnlyThese {
    fn allows(&mut self, token: u32) -> bool {
        self.allowed.contains(&token)
    }
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        self.masks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (i, l) in logits.iter_mut().enumerate() {
            if !self.allowed.contains(&(i as u32)) {
                *l = f32::MIN;
            }
        }
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        if !self.allowed.contains(&token) {
            return Err(format!("token {token} is not allowed"));
        }
        self.seen += 1;
        Ok(())
    }
    fn is_complete(&self) -> bool {
        self.seen >= self.len
    }
}

#[test]
fn a_constrained_sequence_takes_only_allowed_tokens_and_ends_when_complete() {
    let m = synthetic_model();
    let mut e = engine(&m, EngineOptions::default());
    let masks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sampler = SamplerConfig {
        temperature: 0.8,
        seed: 3,
        ..SamplerConfig::default()
    };
    let constraint = OnlyThese {
        allowed: vec![5, 6],
        len: 4,
        seen: 0,
        masks: masks.clone(),
    };
    let prompt = vec![1, 2, 3];
    let c = e
        .submit_constrained(
            GenRequest::new(prompt.clone(), sampler.clone(), 20),
            Some(Box::new(constraint)),
        )
        .unwrap();
    // A free sequence beside it is not affected.
    let free = e
        .submit(GenRequest {
            ignore_eos: true,
            ..GenRequest::new(prompt, sampler, 6)
        })
        .unwrap();
    let mut events = Vec::new();
    while !e.is_idle() {
        e.step(&mut events).unwrap();
    }
    let (tokens, done) = collect(&events);
    let got: Vec<u32> = tokens[&c].iter().map(|t| t.0).collect();
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(got.iter().all(|t| [5, 6].contains(t)), "{got:?}");
    assert!(matches!(
        done[&c],
        Event::Done {
            reason: FinishReason::Complete,
            generated: 4,
            ..
        }
    ));
    // The synthetic model's samples are rarely 5 or 6: the mask was needed.
    assert!(masks.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert_eq!(tokens[&free].len(), 6);
}
