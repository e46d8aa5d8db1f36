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
//! Run: `cargo bench --bench engine [-- FILTER]`.

use criterion::{criterion_group, Criterion, Throughput};
use qkv::engine::{Engine, EngineOptions, GenRequest};
use qkv::model::{Model, ModelOptions};
use qkv::sample::SamplerConfig;
use std::sync::Arc;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let path = qkv_cli::fetch::default_model().expect("the default model");
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

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
