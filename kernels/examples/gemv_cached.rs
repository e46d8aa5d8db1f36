//! The decode GEMV's compute rate with the weights in the core's own L2: one 512 × 2048
//! matrix per format (576 KiB of Q4_0, 2 MiB of f16), multiplied by one row again and again
//! on the calling thread. With memory out of the way, this is the cost of the kernel itself,
//! in ns per 32 weights; [`gemv_stream`](gemv_stream.rs) is the same step from memory.
//!
//! `RAYON_NUM_THREADS=1 cargo run --release -p qkv-kernels --example gemv_cached`
//! (`QKV_ACT_BITS=8|16`: the activations' precision for the interleaved layouts)

use qkv_kernels::quant::testing::{weight_blocks, Rng};
use qkv_kernels::{f16, linear, QuantFormat, Weights};
use std::time::Instant;

#[path = "common/act_bits.rs"]
mod act_bits;
use act_bits::act_precision;

/// The fastest of 5 runs of `reps` calls, in seconds per call.
fn best_of(reps: usize, mut call: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                call();
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let (n, k) = (512usize, 2048usize);
    let groups = (n * k / 32) as f64;
    let mut rng = Rng(1);
    let x: Vec<f32> = (0..k).map(|_| rng.uniform()).collect();
    let mut y = vec![0.0f32; n];
    println!(
        "{} threads; {n} x {k}; ns per 32 weights, GB/s of weights",
        rayon::current_num_threads()
    );
    for format in QuantFormat::ALL {
        let w = weight_blocks(format, n, k, &mut rng);
        let s = best_of(4000, || {
            linear(&mut y, &x, Weights::Quant(format, &w), None, 1, k, n).expect("shapes agree")
        });
        println!(
            "{format:>5}: {:5.2} ns, {:5.1} GB/s",
            s * 1e9 / groups,
            w.len() as f64 / s / 1e9
        );
        if qkv_kernels::quant::x8::supports(format) {
            let mut p = vec![0u8; w.len()];
            qkv_kernels::quant::x8::pack(format, &w, n, k, &mut p).expect("8 | n");
            let s = best_of(4000, || {
                linear(
                    &mut y,
                    &x,
                    Weights::QuantX8(format, act_precision(), &p),
                    None,
                    1,
                    k,
                    n,
                )
                .expect("shapes agree")
            });
            println!(
                "{format:>5} x8: {:5.2} ns, {:5.1} GB/s",
                s * 1e9 / groups,
                p.len() as f64 / s / 1e9
            );
        }
    }
    let w: Vec<f16> = (0..n * k).map(|_| f16::from_f32(rng.uniform())).collect();
    let s = best_of(2000, || {
        linear(&mut y, &x, Weights::F16(&w), None, 1, k, n).expect("shapes agree")
    });
    println!(
        "  f16: {:5.2} ns, {:5.1} GB/s",
        s * 1e9 / groups,
        (2 * n * k) as f64 / s / 1e9
    );
}
