//! How close the decode GEMV comes to the read bandwidth on matrices far larger than the
//! caches: a decode step's products at the layer shapes of Llama 3.2 1B or Llama 3.1 8B,
//! for each weight format, against a plain parallel read of the same bytes in the same
//! round, both on huge pages as qkv holds its weights ([`qkv_kernels::pages`]).
//!
//! `cargo run --release -p qkv-kernels --example gemv_stream [1b|8b] [FORMATS] [REPS]`
//!
//! FORMATS is a comma list of `f16`, `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `q2_k`, `q3_k`,
//! `q4_k`, `q5_k`, `q6_k`, `iq4_nl`, `iq4_xs`, `iq2_xxs`, `iq2_xs`, `iq2_s`, `iq3_xxs`,
//! `iq3_s`, `iq1_s`, `iq1_m`, `tq1_0`, `tq2_0`, and `q4_0x8`, `q4_kx8` for those formats with their rows interleaved
//! ([`qkv_kernels::quant::x8`]; default `f16,q8_0,q4_0x8,q4_kx8,q6_k`). For each format the example builds as many
//! copies of one layer's seven matrices (Q, K, V, output, gate, up, down) as make at least
//! 768 MB, then times, REPS times (default 7), a whole step of them on rayon's pool (Q/K/V
//! and gate/up through `linear_many`, as the decoder calls them) and a `read_sum` over a
//! separate buffer of the same size. It prints one line per format: the medians in GB/s of
//! weight bytes and their ratio. Run with `RAYON_NUM_THREADS=1` for the one-thread figure;
//! [`gemv_cached`](gemv_cached.rs) gives the kernels' rate with the weights in cache.
//! `QKV_ACT_BITS=8|16` sets the activations' precision for the interleaved layouts.

use qkv_kernels::pages::Pages;
use qkv_kernels::probe::read_sum;
use qkv_kernels::quant::testing::Rng;
use std::time::Instant;

#[path = "common/act_bits.rs"]
mod act_bits;
use act_bits::act_precision;
#[path = "common/layers.rs"]
mod layers;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let shape = args.next().unwrap_or_else(|| "1b".into());
    let formats = args
        .next()
        .unwrap_or_else(|| "f16,q8_0,q4_0x8,q4_kx8,q6_k".into());
    let reps: usize = args.next().map_or(7, |s| s.parse().unwrap_or(7)).max(1);
    let Some(shapes) = layers::layer(&shape) else {
        eprintln!("unknown shape {shape:?}: 1b or 8b");
        std::process::exit(2)
    };
    let precision = act_precision();
    let mut rng = Rng(0x5EED);
    let x: Vec<f32> = (0..shapes[4].0).map(|_| rng.uniform()).collect();
    let mut out = layers::Outputs::new(&shapes, 1);
    println!(
        "shape {shape}, {} threads, {reps} rounds; GB/s of weight bytes (medians)",
        rayon::current_num_threads()
    );
    for format in formats.split(',') {
        let one = layers::Stored::make(format, &shapes, &mut rng).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        });
        let all = layers::copies(one, 768 << 20);
        let bytes: usize = all.iter().map(layers::Stored::bytes).sum();
        let mut read = Pages::zeroed(bytes / 8 * 8).expect("memory for the read");
        read.fill(1);
        // SAFETY: the pages start on a 2 MiB boundary (aligned for u64) and hold exactly
        // `bytes / 8` words, any bit pattern valid, only read from here on.
        let words: &[u64] =
            unsafe { std::slice::from_raw_parts(read.as_ptr().cast::<u64>(), bytes / 8) };
        let (mut ts, mut tr) = (Vec::new(), Vec::new());
        for round in 0..=reps {
            let t = Instant::now();
            layers::step(&all, &shapes, precision, &x, 1, &mut out);
            let s = t.elapsed().as_secs_f64();
            let t = Instant::now();
            std::hint::black_box(read_sum(words, 1 << 13));
            let r = t.elapsed().as_secs_f64();
            if round > 0 {
                ts.push(bytes as f64 / s / 1e9);
                tr.push(bytes as f64 / r / 1e9);
            }
        }
        let (s, r) = (median(ts), median(tr));
        println!(
            "{format:>5}: {:>6.0} MB, gemv {s:6.2} GB/s, read {r:6.2} GB/s, gemv/read {:.0}%",
            bytes as f64 / 1e6,
            100.0 * s / r
        );
    }
}
