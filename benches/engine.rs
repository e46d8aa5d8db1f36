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
//! Run: `cargo bench --bench engine [-- FILTER]`.

use criterion::{criterion_group, Criterion, Throughput};
use qkv::engine::{Engine, EngineOptions, GenRequest};
use qkv::model::{Model, ModelOptions};
use qkv::sample::SamplerConfig;
use std::sync::Arc;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let path = qkv::fetch::default_model().expect("the default model");
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
            let prompt: Vec<u32> = (0..128u32).map(|t| 200 + (t * 37 + i as u32 * 101) % 40000).collect();
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
    g.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
