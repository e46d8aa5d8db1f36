//! The two ceilings of a SmolLM2-135M step on this machine (read bandwidth and FMA peak),
//! and two figures that show how close a decode step's GEMVs come to the first, measured
//! together and printed as one JSON line for `tools/bench_vs_llamacpp.py` to turn into
//! tokens per second:
//!
//! - `read_gbs`: one parallel read of the f16 weights a decode step streams (per layer the
//!   Q/K/V, output, gate/up and down matrices, then the 49152-row LM head: 269 MB, on huge
//!   pages as qkv holds its weights), the fastest any engine can read them;
//! - `regions_gbs`: the same bytes read in the step's 121 groups, one parallel region each
//!   (what splitting the step into hand-offs costs by itself);
//! - `step_gbs`: the step's GEMVs themselves (`linear_many`/`linear` on those matrices, back
//!   to back, nothing else);
//! - `fma_gflops`: the FMA peak of all pool threads with the widest vectors the CPU has
//!   ([`qkv_kernels::probe::fma_spin`]);
//! - `fma_isa`: which those are, `"avx512"` or `"avx2"` (`"none"` without AVX2: then both
//!   FMA figures are 0); `QKV_ISA=avx2` measures AVX2 only;
//! - `fma_avx2_gflops`: the AVX2 peak (the same measurement as `fma_gflops` when that is
//!   AVX2's), to compare the two widths.
//!
//! Each figure is the median of `REPS` rounds; within a round they run back to back, so
//! a noisy minute moves them together.
//!
//! `cargo run --release -p qkv-kernels --example roofline [REPS]`

use qkv_kernels::pages::Pages;
use qkv_kernels::probe::{fma_spin_with, read_sum, FmaIsa};
use qkv_kernels::{f16, linear, linear_many, Projection, Weights};
use std::time::Instant;

const D: usize = 576;
const KVD: usize = 192;
const FF: usize = 1536;
const LAYERS: usize = 30;
const VOCAB: usize = 49152;
/// Weight matrices of one layer, in the order a step reads them, as (rows, columns).
const LAYER: [(usize, usize); 7] = [
    (D, D),
    (KVD, D),
    (KVD, D),
    (D, D),
    (FF, D),
    (FF, D),
    (D, FF),
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let reps: usize = match std::env::args().nth(1) {
        None => 11,
        Some(s) => s.parse().unwrap_or_else(|_| {
            eprintln!("usage: roofline [REPS]");
            std::process::exit(2)
        }),
    }
    .max(1);
    let per_layer: usize = LAYER.iter().map(|(n, k)| n * k).sum();
    let total = LAYERS * per_layer + VOCAB * D;
    // Held as u64 words (8-byte aligned, a plain vector sum to read) on huge pages, as qkv
    // holds the weights it streams (`qkv_kernels::pages`); viewed as f16 below.
    let mut pages = Pages::zeroed(total.div_ceil(4) * 8).expect("memory for the probe");
    // SAFETY: the pages start on a 2 MiB boundary (aligned for u64), hold exactly that many
    // words, any bit pattern is a u64, and they are reached only through this slice.
    let words: &mut [u64] =
        unsafe { std::slice::from_raw_parts_mut(pages.as_mut_ptr().cast(), total.div_ceil(4)) };
    for (i, w) in words.iter_mut().enumerate() {
        // Four small f16 values per word (bits of 0.001..0.004), so the GEMVs see numbers.
        let h =
            |j: u64| u64::from(f16::from_f32(((i as u64 * 4 + j) % 7 + 1) as f32 * 1e-3).to_bits());
        *w = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
    }
    // SAFETY: f16 is two plain bytes with no invalid patterns and u64's alignment is larger;
    // the view covers `total` ≤ 4·words.len() halves and `words` is only read from here on.
    let w: &[f16] = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<f16>(), total) };

    let x = vec![0.01f32; FF];
    let mut out = [
        vec![0.0; D],
        vec![0.0; KVD],
        vec![0.0; KVD],
        vec![0.0; FF],
        vec![0.0; FF],
    ];
    let mut logits = vec![0.0; VOCAB];
    let step = |out: &mut [Vec<f32>; 5], logits: &mut [f32]| {
        let mut at = 0;
        let mut next = |(n, k): (usize, usize)| {
            at += n * k;
            Weights::F16(&w[at - n * k..at])
        };
        let [q, k, v, g, u] = out;
        for _ in 0..LAYERS {
            let [wq, wk, wv, wo, wg, wu, wd] = LAYER.map(&mut next);
            let xd = &x[..D];
            #[rustfmt::skip]
            let mut qkv = [
                Projection { w: wq, bias: None, n: D, y: &mut q[..] },
                Projection { w: wk, bias: None, n: KVD, y: &mut k[..] },
                Projection { w: wv, bias: None, n: KVD, y: &mut v[..] },
            ];
            linear_many(xd, 1, D, &mut qkv).expect("shapes agree");
            linear(q, xd, wo, None, 1, D, D).expect("shapes agree");
            #[rustfmt::skip]
            let mut gate_up = [
                Projection { w: wg, bias: None, n: FF, y: &mut g[..] },
                Projection { w: wu, bias: None, n: FF, y: &mut u[..] },
            ];
            linear_many(xd, 1, D, &mut gate_up).expect("shapes agree");
            linear(q, &x, wd, None, 1, FF, D).expect("shapes agree");
        }
        let head = next((VOCAB, D));
        linear(logits, &x[..D], head, None, 1, D, VOCAB).expect("shapes agree");
    };
    // The step's groups in u64 words: Q/K/V, output, gate/up, down per layer, then the head.
    let mut groups = Vec::new();
    for _ in 0..LAYERS {
        groups.extend([D * (D + 2 * KVD), D * D, 2 * FF * D, D * FF].map(|e| e / 4));
    }
    groups.push(VOCAB * D / 4);
    let regions = || {
        let mut at = 0;
        groups.iter().fold(0u64, |s, &g| {
            at += g;
            s.wrapping_add(read_sum(&words[at - g..at], g.div_ceil(8)))
        })
    };
    const FMA_ROUNDS: usize = 1 << 19;

    let isa = FmaIsa::widest();
    // The AVX2 peak is timed on its own only when it is not the widest.
    let avx2_apart = isa.is_some_and(|i| i != FmaIsa::Avx2);
    let mut t = [(); 5].map(|_| Vec::with_capacity(reps));
    let (mut flops, mut flops_avx2) = (0.0, 0.0);
    // Inside the pool, as a session runs its steps; one untimed round first.
    rayon::scope(|_| {
        for round in 0..=reps {
            let mut time = |i: usize, f: &mut dyn FnMut()| {
                let start = Instant::now();
                f();
                if round > 0 {
                    t[i].push(start.elapsed().as_secs_f64());
                }
            };
            time(0, &mut || {
                std::hint::black_box(read_sum(words, 1 << 13));
            });
            time(1, &mut || {
                std::hint::black_box(regions());
            });
            time(2, &mut || step(&mut out, &mut logits));
            time(3, &mut || {
                flops = isa
                    .and_then(|i| fma_spin_with(i, FMA_ROUNDS))
                    .unwrap_or(0.0)
            });
            if avx2_apart {
                time(4, &mut || {
                    flops_avx2 = fma_spin_with(FmaIsa::Avx2, FMA_ROUNDS).unwrap_or(0.0)
                });
            }
        }
    });
    let [read, reg, stp, fma, fma_avx2] = t.map(|v| if v.is_empty() { 0.0 } else { median(v) });
    let gflops = flops / fma / 1e9;
    let gflops_avx2 = match isa {
        Some(FmaIsa::Avx2) => gflops,
        Some(_) => flops_avx2 / fma_avx2 / 1e9,
        None => 0.0,
    };
    let bytes = (total * 2) as f64;
    println!(
        "{{\"threads\":{},\"weight_bytes\":{},\"read_gbs\":{:.2},\"regions_gbs\":{:.2},\"step_gbs\":{:.2},\"fma_gflops\":{:.1},\"fma_isa\":\"{}\",\"fma_avx2_gflops\":{:.1}}}",
        rayon::current_num_threads(),
        total * 2,
        bytes / read / 1e9,
        bytes / reg / 1e9,
        bytes / stp / 1e9,
        gflops,
        isa.map_or("none", FmaIsa::name),
        gflops_avx2
    );
}
