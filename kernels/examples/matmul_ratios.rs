//! Same-moment ratios for the matmul targets, robust to a noisy machine: each pair of calls
//! runs back to back and the medians are compared.
//!
//! `cargo run --release -p qkv-kernels --example matmul_ratios`
//!
//! - m = 512, SmolLM2-135M shapes: `linear` with f16 weights against `linear` with f32
//!   weights (f16 panels must stay within 10% of f32).
//! - m = 1, the 576×49152 LM head in f16: our GEMV against the raw gemm-crate call, in GB/s
//!   of weights read.

use qkv_kernels::{f16, linear, Weights};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn filled(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// Times `a` and `b` alternately `reps` times, in ABBA order (whichever runs first in a pair
/// meets a different cache and clock state); returns their median seconds.
fn alternate(reps: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };
    for i in 0..reps {
        if i % 2 == 0 {
            ta.push(time(&mut a));
            tb.push(time(&mut b));
        } else {
            tb.push(time(&mut b));
            ta.push(time(&mut a));
        }
    }
    (median(ta), median(tb))
}

fn main() {
    let m = 512;
    println!("m = {m}: f16 weights vs f32 weights (GFLOP/s, median of alternating calls)");
    for (k, n) in [
        (576, 576),
        (576, 192),
        (576, 1536),
        (1536, 576),
        (576, 49152),
    ] {
        let reps = if n > 10_000 { 7 } else { 31 };
        let x = filled(m * k);
        let w = filled(n * k);
        let w16: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
        let mut y = vec![0.0; m * n];
        let mut y2 = vec![0.0; m * n];
        let (t32, t16) = alternate(
            reps,
            || linear(&mut y, &x, Weights::F32(&w), None, m, k, n).expect("shapes agree"),
            || linear(&mut y2, &x, Weights::F16(&w16), None, m, k, n).expect("shapes agree"),
        );
        let gflops = |t: f64| 2.0 * (m * n * k) as f64 / t / 1e9;
        println!(
            "  {k}x{n}: f32 {:.1}, f16 {:.1}, f16/f32 {:.3}",
            gflops(t32),
            gflops(t16),
            t32 / t16
        );
    }

    let (k, n) = (576, 49152);
    let x = filled(k);
    let x16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let w16: Vec<f16> = filled(n * k).iter().map(|&v| f16::from_f32(v)).collect();
    let mut y = vec![0.0f32; n];
    let mut y16 = vec![f16::ZERO; n];
    let threads = rayon::current_num_threads();
    let (ours, raw) = alternate(
        31,
        || linear(&mut y, &x, Weights::F16(&w16), None, 1, k, n).expect("shapes agree"),
        // SAFETY: y16 is 1×n, x16 1×k, w16 n×k row-major and read as its k×n transpose.
        || unsafe {
            gemm::gemm(
                1,
                n,
                k,
                y16.as_mut_ptr(),
                1,
                n as isize,
                false,
                x16.as_ptr(),
                1,
                k as isize,
                w16.as_ptr(),
                k as isize,
                1,
                f16::ZERO,
                f16::ONE,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(threads),
            )
        },
    );
    let gbs = |t: f64| (n * k * 2) as f64 / t / 1e9;
    println!(
        "m = 1, {k}x{n} f16: qkv GEMV {:.1} GB/s, raw gemm {:.1} GB/s ({threads} threads)",
        gbs(ours),
        gbs(raw)
    );
}
