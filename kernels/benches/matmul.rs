//! Matmul benchmarks: `linear` for m ∈ {1, 32, 512} on the default model's shapes, f32 and f16
//! weights, beside the raw gemm-crate call on the same shapes and a memory-read probe that
//! measures this machine's bandwidth in the same run; `fma_peak` measures its FMA ceiling and
//! `handoff` the fixed cost each parallel GEMV pays to split.
//!
//! `linear_quant_m1` runs the quantized decode GEMV (m = 1) for every GGUF block format on
//! the LM head (k = 576, n = 49152) and the FFN shapes (576 → 1536, 1536 → 576); the
//! K-formats, whose rows are whole 256-element super-blocks, take k = 768 where the model
//! has 576. Its throughput is in bytes of weights read (`GB/s`).
//!
//! Throughput is reported per second as *elements*: for m = 1 the element is a byte of
//! weights read (so `Gelem/s` reads as GB/s); for m ≥ 32 it is a floating-point operation
//! (`Gelem/s` reads as GFLOP/s).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qkv_kernels::quant::testing::{weight_blocks, Rng};
use qkv_kernels::{f16, linear, QuantFormat, Weights};
use rayon::prelude::*;
use std::time::Duration;

/// (k, n): input features, output features — the linear layers of SmolLM2-135M.
const SHAPES: [(usize, usize); 5] = [
    (576, 576),
    (576, 192),
    (576, 1536),
    (1536, 576),
    (576, 49152),
];

fn filled(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32
                / (1u32 << 24) as f32
                - 0.5
        })
        .collect()
}

/// Sums a buffer far larger than the caches on every thread: the machine's read bandwidth.
fn memory_read(c: &mut Criterion) {
    let words: Vec<u64> = (0..32u64 << 20).collect(); // 256 MiB
    let mut g = c.benchmark_group("memory");
    g.throughput(Throughput::Bytes((words.len() * 8) as u64));
    g.sample_size(20);
    g.bench_function("read_256MiB", |b| {
        b.iter(|| black_box(qkv_kernels::probe::read_sum(black_box(&words), 1 << 13)))
    });
    g.finish();
}

#[allow(clippy::too_many_arguments)]
fn raw_gemm<T: 'static + Copy>(
    y: &mut [T],
    x: &[T],
    w: &[T],
    m: usize,
    k: usize,
    n: usize,
    one: T,
    zero: T,
) {
    // SAFETY: y is m·n, x is m·k, w is n·k, all row-major; w is read as its k×n transpose.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            zero,
            one,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(rayon::current_num_threads()),
        )
    }
}

fn matmul(c: &mut Criterion) {
    for &m in &[1usize, 32, 512] {
        let mut g = c.benchmark_group(format!("linear_m{m}"));
        g.sample_size(if m == 512 { 10 } else { 30 });
        for &(k, n) in &SHAPES {
            let x = filled(m * k, 2);
            let w32 = filled(n * k, 3);
            let w16: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
            let mut y = vec![0.0f32; m * n];
            let shape = format!("{k}x{n}");
            for (dtype, w) in [("f32", Weights::F32(&w32)), ("f16", Weights::F16(&w16))] {
                let units = if m == 1 {
                    w.bytes() as u64
                } else {
                    (2 * m * n * k) as u64
                };
                g.throughput(Throughput::Elements(units));
                g.bench_with_input(
                    BenchmarkId::new(format!("qkv_{dtype}"), &shape),
                    &(),
                    |b, _| {
                        rayon::scope(|_| {
                            b.iter(|| linear(&mut y, black_box(&x), w, None, m, k, n).unwrap())
                        })
                    },
                );
            }
            // The peer: the gemm crate called raw on the same shape, f32 and f16 operands.
            let units32 = if m == 1 {
                (n * k * 4) as u64
            } else {
                (2 * m * n * k) as u64
            };
            g.throughput(Throughput::Elements(units32));
            g.bench_with_input(BenchmarkId::new("gemm_raw_f32", &shape), &(), |b, _| {
                rayon::scope(|_| {
                    b.iter(|| raw_gemm(&mut y, black_box(&x), &w32, m, k, n, 1.0f32, 0.0f32))
                })
            });
            let x16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            let mut y16 = vec![f16::ZERO; m * n];
            let units16 = if m == 1 {
                (n * k * 2) as u64
            } else {
                (2 * m * n * k) as u64
            };
            g.throughput(Throughput::Elements(units16));
            g.bench_with_input(BenchmarkId::new("gemm_raw_f16", &shape), &(), |b, _| {
                rayon::scope(|_| {
                    b.iter(|| {
                        raw_gemm(
                            &mut y16,
                            black_box(&x16),
                            &w16,
                            m,
                            k,
                            n,
                            f16::ONE,
                            f16::ZERO,
                        )
                    })
                })
            });
        }
        g.finish();
    }
}

/// The quantized decode GEMV (m = 1), in bytes of weights read per second.
fn linear_quant(c: &mut Criterion) {
    let mut g = c.benchmark_group("linear_quant_m1");
    g.sample_size(30);
    for format in QuantFormat::ALL {
        // The K-formats need k to be a multiple of 256: 768 stands in for 576.
        let k_model = if format.block_elems() == 256 {
            768
        } else {
            576
        };
        for (k, n) in [(k_model, 49152), (k_model, 1536), (1536, 576)] {
            let w = weight_blocks(format, n, k, &mut Rng(0x5EED ^ (n * k) as u64));
            let w = Weights::Quant(format, &w);
            let x = filled(k, 2);
            let mut y = vec![0.0f32; n];
            g.throughput(Throughput::Elements(w.bytes() as u64));
            g.bench_with_input(
                BenchmarkId::new(format.name(), format!("{k}x{n}")),
                &(),
                |b, _| {
                    rayon::scope(|_| {
                        b.iter(|| linear(&mut y, black_box(&x), w, None, 1, k, n).unwrap())
                    })
                },
            );
        }
    }
    g.finish();
}

/// The quantized prefill product (m = 512), in FLOPs (2·m·n·k) per second: the integer
/// GEMM where the CPU has AVX-512 VNNI, else f32 panels through gemm (`QKV_ISA=avx2`
/// measures the latter on such a CPU).
fn linear_quant_prefill(c: &mut Criterion) {
    let mut g = c.benchmark_group("linear_quant_m512");
    g.sample_size(10);
    let m = 512;
    for format in QuantFormat::ALL {
        let k_model = if format.block_elems() == 256 {
            768
        } else {
            576
        };
        for (k, n) in [(k_model, 1536), (1536, 576)] {
            let w = weight_blocks(format, n, k, &mut Rng(0x5EED ^ (n * k) as u64));
            let w = Weights::Quant(format, &w);
            let x = filled(m * k, 2);
            let mut y = vec![0.0f32; m * n];
            g.throughput(Throughput::Elements((2 * m * n * k) as u64));
            g.bench_with_input(
                BenchmarkId::new(format.name(), format!("{k}x{n}")),
                &(),
                |b, _| {
                    rayon::scope(|_| {
                        b.iter(|| linear(&mut y, black_box(&x), w, None, m, k, n).unwrap())
                    })
                },
            );
        }
    }
    g.finish();
}

/// What one parallel GEMV pays to hand its row ranges to the pool and join them: the split a
/// decode step makes ~150 times per token (4 GEMV groups and one attention call per layer,
/// then the LM head), run from inside a pool worker as `Session` runs its passes.
///
/// Each of the `4·threads` pieces spins for 2.5 µs (a small GEMV's share of rows), so the
/// ideal time is `4 · 2.5 µs = 10 µs`; the excess over that is the hand-off cost. The
/// `serial` case runs the same pieces on one thread (`10 · threads` µs, 20 µs for 2 threads)
/// as a check of the spin.
fn handoff(c: &mut Criterion) {
    let mut g = c.benchmark_group("handoff");
    let pieces = rayon::current_num_threads() * 4;
    let spin = |_| {
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_nanos(2500) {
            std::hint::spin_loop();
        }
    };
    g.bench_function(format!("split_{pieces}x2.5us"), |b| {
        rayon::scope(|_| b.iter(|| (0..pieces).into_par_iter().for_each(spin)))
    });
    g.bench_function(format!("serial_{pieces}x2.5us"), |b| {
        b.iter(|| (0..pieces).for_each(spin))
    });
    g.finish();
}

/// The FMA peak of this machine, measured: every pool thread runs 12 independent chains of
/// 8-lane fused multiply-adds on registers (no memory), enough to cover the FMA latency on
/// two pipes. Reported as FLOP/s (2 per lane per FMA), the ceiling the prefill and attention
/// figures are compared with.
fn fma_peak(c: &mut Criterion) {
    const ROUNDS: usize = 1 << 18;
    let Some(flops) = qkv_kernels::probe::fma_spin(1) else {
        return;
    };
    let mut g = c.benchmark_group("fma_peak");
    g.throughput(Throughput::Elements(flops as u64 * ROUNDS as u64));
    g.bench_function(format!("{}_threads", rayon::current_num_threads()), |b| {
        b.iter(|| qkv_kernels::probe::fma_spin(black_box(ROUNDS)))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = memory_read, fma_peak, matmul, linear_quant, linear_quant_prefill, handoff
}
criterion_main!(benches);
