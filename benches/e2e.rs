//! End-to-end Llama benches on the default model (SmolLM2-135M-Instruct, fetched into
//! `$QKV_CACHE` on first use), in the `llama-bench` spirit:
//!
//! - `e2e/{q4_1,f16,f32}/pp512`: prefill of a 512-token prompt from an empty cache;
//! - `e2e/{q4_1,f16}/pp512_d2048`: prefill of 512 tokens on top of 2048 cached ones (the cache
//!   is filled once and truncated back to 2048 before every iteration);
//! - `e2e/{q4_1,f16}/tg_d{0,512,2048}`, `e2e/f32/tg_d0`: one decode step at context 0, 512 and
//!   2048 (filled once; each step is undone with `truncate`, so every step sees the same
//!   context);
//! - `e2e/q4_1/ttft_cold16`: time to first token from a cold process start: this bench binary
//!   re-runs itself as a child that maps the model, makes a session, prefills a 16-token prompt
//!   and picks the first token, timed until the child prints that token (process start, mmap
//!   load and page-ins of the weights included, the child's exit not; the file itself stays in
//!   the OS page cache, as it would for a second `decode` run).
//!
//! Tokens per second = 512 / pp512 time, 1 / tg time. q4_1 is the published file run on its
//! own blocks (what `decode` runs); f16 and f32 are the same file widened at load
//! (`--dtype f16`, `--dtype f32`). Run: `cargo bench --bench e2e [-- FILTER]`.

use criterion::{criterion_group, Criterion};
use qkv::load::{Model, ModelOptions};
use qkv::session::{Session, SessionOptions};
use qkv::weights::FloatType;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set in the child process of the cold time-to-first-token bench: the model path.
const CHILD_ENV: &str = "QKV_E2E_TTFT_CHILD";

/// Deterministic, in-vocabulary token ids standing in for a prompt.
fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 200 + (i * 37 + salt * 101) % 40000)
        .collect()
}

fn session(model: &Arc<Model>, context: usize) -> Session {
    let options = SessionOptions {
        context: Some(context),
        ..SessionOptions::default()
    };
    Session::new(model.clone(), options).unwrap()
}

fn bench(c: &mut Criterion) {
    let q4 = qkv_fetch::default_model().expect("default model");
    let mut group = c.benchmark_group("e2e");
    group.sample_size(10).warm_up_time(Duration::from_secs(2));

    let runs = [
        ("q4_1", None),
        ("f16", Some(FloatType::F16)),
        ("f32", Some(FloatType::F32)),
    ];
    for (name, dtype) in runs {
        let model = Arc::new(
            Model::load(
                &q4,
                &ModelOptions {
                    dtype,
                    ..ModelOptions::default()
                },
            )
            .unwrap(),
        );
        let mut s = session(&model, 2048 + 512 + 1);
        let p512 = tokens(512, 0);
        group.throughput(criterion::Throughput::Elements(512));
        group.bench_function(format!("{name}/pp512"), |b| {
            b.iter(|| {
                s.reset();
                s.prefill(&p512).unwrap();
            })
        });
        if dtype != Some(FloatType::F32) {
            // Setup on the closure's first call (criterion calls it once per sample, and not
            // at all when the filter does not match it).
            let mut ready = false;
            group.bench_function(format!("{name}/pp512_d2048"), |b| {
                if !ready {
                    s.reset();
                    s.prefill(&tokens(2048, 1)).unwrap();
                    ready = true;
                }
                b.iter(|| {
                    s.truncate(2048).unwrap();
                    s.prefill(&p512).unwrap();
                })
            });
        }
        group.throughput(criterion::Throughput::Elements(1));
        let depths: &[usize] = if dtype != Some(FloatType::F32) {
            &[0, 512, 2048]
        } else {
            &[0]
        };
        for &depth in depths {
            let (mut k, mut ready) = (0u32, false);
            group.bench_function(format!("{name}/tg_d{depth}"), |b| {
                if !ready {
                    s.reset();
                    if depth > 0 {
                        s.prefill(&tokens(depth, 2)).unwrap();
                    }
                    ready = true;
                }
                b.iter(|| {
                    s.truncate(depth).unwrap();
                    k = (k + 1) % 7;
                    s.step(1000 + k).unwrap();
                })
            });
        }
    }

    group.throughput(criterion::Throughput::Elements(1));
    let exe = std::env::current_exe().unwrap();
    group.bench_function("q4_1/ttft_cold16", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let mut child = Command::new(&exe)
                    .env(CHILD_ENV, &q4)
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("spawning the ttft child");
                // The clock stops when the child's first token arrives, before its exit.
                let mut line = String::new();
                BufReader::new(child.stdout.take().expect("piped stdout"))
                    .read_line(&mut line)
                    .expect("reading the ttft child's token");
                total += start.elapsed();
                let status = child.wait().expect("waiting for the ttft child");
                assert!(status.success(), "ttft child failed: {status}");
                let _first: u32 = line.trim().parse().expect("the child prints a token id");
            }
            total
        })
    });
    group.finish();
}

/// The child of `ttft_cold16`: load, prefill 16 tokens, pick the first token, print its id
/// (the parent's clock stops on that line), exit.
fn ttft_child(path: &Path) {
    let model = Arc::new(Model::load(path, &ModelOptions::default()).unwrap());
    let mut s = session(&model, 64);
    let logits = s.prefill(&tokens(16, 3)).unwrap();
    let first = logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
        .unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{first}").and_then(|()| out.flush()).unwrap();
}

criterion_group!(benches, bench);

fn main() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        ttft_child(Path::new(&path));
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
