//! End-to-end Llama benches on the default model (SmolLM2-135M-Instruct, fetched into
//! `$QKV_CACHE` on first use), in the `llama-bench` spirit:
//!
//! - `e2e/{f16,f32}/pp128`: prefill of a 128-token prompt (matrix path), per prompt;
//! - `e2e/{f16,f32}/tg`: one decode step (GEMV path) at positions 128–255.
//!
//! Tokens per second = 128 / pp128 time, 1 / tg time. f16 is the converted f16 GGUF (mapped);
//! f32 is the Q4_1 source dequantized to f32. Run: `cargo bench --bench e2e`.

use criterion::{criterion_group, criterion_main, Criterion};
use qkv::model::{Model, ModelOptions};
use qkv::session::{Session, SessionOptions};
use qkv::weights::FloatType;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn bench(c: &mut Criterion) {
    let f16 = qkv::fetch::default_model().expect("default model");
    let q4 = qkv::fetch::cache_dir()
        .unwrap()
        .join(qkv::fetch::WHEEL_GGUF);
    let prompt: Vec<u32> = (0..128u32).map(|i| 200 + i * 37 % 40000).collect();
    let mut group = c.benchmark_group("e2e");
    group.sample_size(10).warm_up_time(Duration::from_secs(2));
    for (name, path, dtype) in [("f16", &f16, FloatType::F16), ("f32", &q4, FloatType::F32)] {
        let model = Arc::new(Model::load(path, &ModelOptions { dtype }).unwrap());
        let options = SessionOptions {
            context: Some(512),
            ..SessionOptions::default()
        };
        let mut s = Session::new(model, options).unwrap();
        group.bench_function(format!("{name}/pp128"), |b| {
            b.iter(|| {
                s.reset();
                s.prefill(&prompt).unwrap();
            })
        });
        group.bench_function(format!("{name}/tg"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    s.reset();
                    s.prefill(&prompt).unwrap();
                    let start = Instant::now();
                    while done < iters && s.position() < 256 {
                        s.step(1000 + (done % 7) as u32).unwrap();
                        done += 1;
                    }
                    total += start.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
