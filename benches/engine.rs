//! The batch engine's decode step on the default model (SmolLM2-135M-Instruct, Q4_1 run on
//! its blocks): `engine/q4_1/step_b{1,4,8,16,64}` times one step of B sequences that each
//! decode one token, after 128-token prompts read untimed (the context grows from 128 to at
//! most ~800 positions during a measurement; no sequence ends within it). Criterion's
//! throughput is in generated tokens, so its elements/s are aggregate tokens per second.
//!
//! Ceilings for a step: the weights are read once per step (98 MB, at the memory bandwidth
//! of `cargo run --release -p qkv-kernels --example roofline`), and the matrix products take
//! 2 · 135 M · B FLOP (at the FMA peak of the same probe).
//!
//! `engine/q4_1/prefix/{cold,cached}`: time to the first token of a request whose 512-token
//! prompt starts with the 480 tokens of a finished request (a long system prompt, or the
//! previous turn of a chat): `cold` on a fresh engine reads all 512, `cached` reuses the
//! finished sequence's cache and reads the last 32.
//!
//! `engine/summary` (printed after criterion's groups, and alone with the filter
//! `summary`): for B = 1, 4, 16 and 64, the fastest of 15 timed steps, as aggregate
//! tokens/s, as a share of the FMA peak (2 FLOP per weight of every matrix product, each
//! sequence's token once, over the best of 5 [`qkv_kernels::probe::fma_gflops`] in the same
//! run) and as a fraction of the same file's prefill tokens/s (one 512-token prompt read
//! in one step, the fastest of 5). Fastest, not median: on a shared host other jobs (and
//! benchmarks that stop niced processes) only ever slow a sample down. Attention, norms and sampling are not counted as FLOP, so the share
//! is of useful matrix work only. A step's tokens each go through the output head; a
//! prompt's only once, for its last token, and prefill's share counts it so. `QKV_ENGINE_MODEL=FILE` runs the summary on another GGUF
//! (criterion's groups stay on the default model); `QKV_ENGINE_BATCHES=16,64` takes other
//! values of B, and `QKV_ENGINE_STEPS=N` times N steps instead of 15 (to profile the steps).
//!
//! Run: `cargo bench --bench engine [-- FILTER]`.

use criterion::{criterion_group, Criterion, Throughput};
use qkv::engine::{Engine, EngineOptions, GenRequest};
use qkv::load::{Model, ModelOptions};
use qkv::sample::SamplerConfig;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn bench(c: &mut Criterion) {
    let path = qkv_fetch::default_model().expect("the default model");
    let model = Arc::new(Model::load(&path, &ModelOptions::default()).unwrap());
    let mut g = c.benchmark_group("engine/q4_1");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for b in [1usize, 4, 8, 16, 64] {
        let mut engine = Engine::new(
            model.clone(),
            EngineOptions {
                max_sequences: b,
                context: 1024,
                step_tokens: 8192,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        for i in 0..b {
            let prompt: Vec<u32> = (0..128u32)
                .map(|t| 200 + (t * 37 + i as u32 * 101) % 40000)
                .collect();
            let request = GenRequest {
                ignore_eos: true,
                ..GenRequest::new(prompt, SamplerConfig::greedy(), 896)
            };
            engine.submit(request).unwrap();
        }
        let mut events = Vec::new();
        // Read the prompts and take the first tokens, untimed.
        for _ in 0..3 {
            engine.step(&mut events).unwrap();
        }
        assert_eq!(engine.running(), b);
        g.throughput(Throughput::Elements(b as u64));
        g.bench_function(format!("step_b{b}"), |bch| {
            bch.iter(|| {
                events.clear();
                engine.step(&mut events).unwrap();
            })
        });
    }

    // Prefix reuse.
    let shared: Vec<u32> = (0..480u32).map(|t| 300 + (t * 53) % 30000).collect();
    let first = [shared.clone(), (0..32u32).map(|t| 7000 + t).collect()].concat();
    let second = [shared, (0..32u32).map(|t| 9000 + t).collect()].concat();
    let options = EngineOptions {
        max_sequences: 1,
        context: 1024,
        step_tokens: 512,
        ..EngineOptions::default()
    };
    let first_token =
        |engine: &mut Engine, prompt: &[u32], events: &mut Vec<qkv::engine::Event>| {
            engine
                .submit(GenRequest::new(prompt.to_vec(), SamplerConfig::greedy(), 1))
                .unwrap();
            while !engine.is_idle() {
                engine.step(events).unwrap();
            }
        };
    let mut events = Vec::new();
    g.throughput(Throughput::Elements(1));
    g.bench_function("prefix/cold", |bch| {
        bch.iter_batched(
            || Engine::new(model.clone(), options.clone()).unwrap(),
            |mut engine| first_token(&mut engine, &second, &mut events),
            criterion::BatchSize::PerIteration,
        )
    });
    g.bench_function("prefix/cached", |bch| {
        bch.iter_batched(
            || {
                let mut engine = Engine::new(model.clone(), options.clone()).unwrap();
                first_token(&mut engine, &first, &mut Vec::new());
                engine
            },
            |mut engine| first_token(&mut engine, &second, &mut events),
            criterion::BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);

/// FLOP of the matrix products for one token: 2 per weight of the attention projections,
/// the feed-forward block (the routed experts' share for a mixture) and the output head.
fn flop_per_token(model: &Model) -> f64 {
    let c = model.config();
    let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let ffn = match &c.moe {
        Some(m) => 3 * c.dim * (m.used * m.expert_ffn + m.shared_ffn.unwrap_or(0)),
        None => 3 * c.dim * c.ffn_dim,
    };
    let per_layer = c.dim * (q + 2 * kv) + q * c.dim + ffn;
    2.0 * (c.layers * per_layer + c.vocab * c.dim) as f64
}

fn max(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::NAN, f64::max)
}

fn min(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::NAN, f64::min)
}

/// A prompt of `n` tokens that differs per `seed`.
fn prompt(n: u32, seed: u32) -> Vec<u32> {
    (0..n)
        .map(|t| 200 + (t * 37 + seed * 101) % 40000)
        .collect()
}

/// The comma-separated numbers in the variable `name`, or `default` when it is unset.
fn env_list(name: &str, default: &[u32]) -> Vec<u32> {
    match std::env::var(name) {
        Ok(v) => v
            .split(',')
            .map(|t| {
                t.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: not a number: {t}"))
            })
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// `engine/summary`: decode steps at B = 1, 4, 16, 64 against the FMA peak and prefill.
fn summary() {
    let path = match std::env::var_os("QKV_ENGINE_MODEL") {
        Some(p) => std::path::PathBuf::from(p),
        None => qkv_fetch::default_model().expect("the default model"),
    };
    let model = Arc::new(Model::load(&path, &ModelOptions::default()).unwrap());
    let flop = flop_per_token(&model);
    // A prompt's positions skip the output head but for the last one.
    let head = 2.0 * (model.config().vocab * model.config().dim) as f64;
    let prefill_flop = flop - head + head / 512.0;
    let isa = qkv_kernels::probe::FmaIsa::widest();
    let peak = |rounds| {
        max((0..5)
            .map(|_| isa.and_then(|i| qkv_kernels::probe::fma_gflops(i, rounds)))
            .map(|g| g.unwrap_or(f64::NAN))
            .collect())
    };
    let gflops = peak(20_000_000);
    // Prefill: one 512-token prompt in one step.
    let prefill = max((0..5)
        .map(|i| {
            let mut engine = Engine::new(
                model.clone(),
                EngineOptions {
                    max_sequences: 1,
                    context: 1024,
                    step_tokens: 512,
                    ..EngineOptions::default()
                },
            )
            .unwrap();
            engine
                .submit(GenRequest::new(prompt(512, i), SamplerConfig::greedy(), 1))
                .unwrap();
            let mut events = Vec::new();
            let t = Instant::now();
            engine.step(&mut events).unwrap();
            512.0 / t.elapsed().as_secs_f64()
        })
        .collect());
    println!(
        "engine/summary: {} ({:.2} GFLOP/token in matrix products), FMA peak {gflops:.1} GFLOP/s \
         ({}), prefill {prefill:.0} tok/s ({:.1}% of the peak)",
        path.display(),
        flop / 1e9,
        isa.map_or("none", |i| i.name()),
        100.0 * prefill * prefill_flop / (gflops * 1e9)
    );
    println!("| B | step ms | tok/s | share of FMA peak | tok/s / prefill tok/s |");
    println!("|---|---|---|---|---|");
    for b in env_list("QKV_ENGINE_BATCHES", &[1, 4, 16, 64]) {
        let mut engine = Engine::new(
            model.clone(),
            EngineOptions {
                max_sequences: b as usize,
                context: 1024,
                step_tokens: 8192,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        for i in 0..b {
            let request = GenRequest {
                ignore_eos: true,
                ..GenRequest::new(prompt(128, i), SamplerConfig::greedy(), 896)
            };
            engine.submit(request).unwrap();
        }
        let mut events = Vec::new();
        for _ in 0..3 {
            engine.step(&mut events).unwrap();
        }
        assert_eq!(engine.running(), b as usize);
        let steps = env_list("QKV_ENGINE_STEPS", &[15])[0].max(1);
        let secs = min((0..steps)
            .map(|_| {
                events.clear();
                let t = Instant::now();
                engine.step(&mut events).unwrap();
                t.elapsed().as_secs_f64()
            })
            .collect());
        let tok_s = f64::from(b) / secs;
        println!(
            "| {b} | {:.2} | {tok_s:.0} | {:.1}% | {:.2} |",
            secs * 1e3,
            100.0 * tok_s * flop / (gflops * 1e9),
            tok_s / prefill
        );
    }
    println!(
        "engine/summary: FMA peak after the steps {:.1} GFLOP/s",
        peak(20_000_000)
    );
}

fn main() {
    // Criterion's filters are the arguments without a leading '-'; the summary runs when
    // there are none or one of them matches its name.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let only_summary = !filters.is_empty() && filters.iter().all(|f| f.contains("summary"));
    if !only_summary {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
    if filters.is_empty()
        || filters
            .iter()
            .any(|f| "engine/summary".contains(f.as_str()))
    {
        summary();
    }
}
