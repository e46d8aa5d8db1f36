//! Attention benchmarks: causal prefill (tq = tk ∈ {512, 2048, 4096}) and decode (tq = 1,
//! tk ∈ {512, 2048, 8192}), 9 query heads over 3 KV heads, head_dim 64, K/V in f32 and f16,
//! position-major (`[tk][kv_head][d]`, the layout of a prompt's own projections). The Llama
//! KV cache is head-major; `examples/attention_time.rs … head` times decode on that layout.
//! Calls run on a rayon worker, as a `Session` makes them. Compare with
//! `tools/sdpa_bench.py` (PyTorch SDPA, same shapes, same machine; run both with the same
//! thread count, e.g. `RAYON_NUM_THREADS=2`).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qkv_kernels::{attention, f16, AttentionMask, KvView, QueryView};
use std::time::Duration;

const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const D: usize = 64;

fn filled(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32
                / (1u32 << 24) as f32
                - 0.5
        })
        .collect()
}

fn run(c: &mut Criterion, name: &str, tq: usize, tks: &[usize], samples: usize) {
    let mut g = c.benchmark_group(name);
    g.sample_size(samples);
    for &tk in tks {
        let tq = if tq == 0 { tk } else { tq };
        let q = filled(tq * HEADS * D, 1);
        let k = filled(tk * KV_HEADS * D, 2);
        let v = filled(tk * KV_HEADS * D, 3);
        let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
        let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        let mut out = vec![0.0f32; tq * HEADS * D];
        let qv = QueryView::contiguous(&q, tq, HEADS, D);
        // Query i sits at absolute position tk − tq + i (decode: the newest token).
        let mask = AttentionMask::causal(tk - tq);
        // Useful FLOPs: 4·d per visible (query, key) pair and head.
        let pairs: usize = (0..tq).map(|i| tk - tq + i + 1).sum();
        g.throughput(Throughput::Elements((4 * D * HEADS * pairs) as u64));
        for (dtype, kv, vv) in [
            (
                "f32",
                KvView::contiguous_f32(&k, tk, KV_HEADS, D),
                KvView::contiguous_f32(&v, tk, KV_HEADS, D),
            ),
            (
                "f16",
                KvView::contiguous_f16(&k16, tk, KV_HEADS, D),
                KvView::contiguous_f16(&v16, tk, KV_HEADS, D),
            ),
        ] {
            g.bench_with_input(BenchmarkId::new(dtype, tk), &(), |b, _| {
                // On a pool worker, as a `Session` calls it: from outside the pool every call
                // would also pay for waking the workers.
                rayon::scope(|_| {
                    b.iter(|| attention(black_box(&qv), &kv, &vv, &mask, None, &mut out).unwrap())
                })
            });
        }
    }
    g.finish();
}

fn prefill(c: &mut Criterion) {
    run(c, "attention_prefill_causal", 0, &[512, 2048, 4096], 10);
}

fn decode(c: &mut Criterion) {
    run(c, "attention_decode", 1, &[512, 2048, 8192], 50);
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = prefill, decode
}
criterion_main!(benches);
