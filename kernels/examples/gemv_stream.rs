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
use qkv_kernels::quant::testing::{weight_blocks, Rng};
use qkv_kernels::quant::x8;
use qkv_kernels::{f16, linear, linear_many, Projection, QuantFormat, Weights};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One layer's matrices as (rows, columns): Q, K, V, output, gate, up, down.
fn layer(shape: &str) -> [(usize, usize); 7] {
    let (d, kv, ff) = match shape {
        "1b" => (2048, 512, 8192),
        "8b" => (4096, 1024, 14336),
        other => {
            eprintln!("unknown shape {other:?}: 1b or 8b");
            std::process::exit(2)
        }
    };
    [(d, d), (kv, d), (kv, d), (d, d), (ff, d), (ff, d), (d, ff)]
}

#[path = "common/act_bits.rs"]
mod act_bits;
use act_bits::act_precision;

/// A layer's matrices stored in one format, each on huge pages as qkv holds the weights
/// it streams ([`Pages`]): f16 values or quantized blocks.
enum Stored {
    F16(Vec<Pages>),
    Quant(QuantFormat, Vec<Pages>),
    QuantX8(QuantFormat, Vec<Pages>),
}

/// `bytes` copied onto huge pages.
fn on_pages(bytes: &[u8]) -> Pages {
    let mut p = Pages::zeroed(bytes.len()).expect("memory for the weights");
    p.copy_from_slice(bytes);
    p
}

impl Stored {
    fn make(format: &str, shapes: &[(usize, usize); 7], rng: &mut Rng) -> Stored {
        if format == "f16" {
            return Stored::F16(
                shapes
                    .iter()
                    .map(|&(n, k)| {
                        let bytes: Vec<u8> = (0..n * k)
                            .flat_map(|_| f16::from_f32(rng.uniform()).to_le_bytes())
                            .collect();
                        on_pages(&bytes)
                    })
                    .collect(),
            );
        }
        let (format, x8) = match format.strip_suffix("x8") {
            Some(f) => (f, true),
            None => (format, false),
        };
        let q = QuantFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(format))
            .unwrap_or_else(|| {
                eprintln!("unknown format {format:?}");
                std::process::exit(2)
            });
        let blocks = shapes.iter().map(|&(n, k)| {
            let w = weight_blocks(q, n, k, rng);
            if !x8 {
                return on_pages(&w);
            }
            let mut p = Pages::zeroed(w.len()).expect("memory for the weights");
            x8::pack(q, &w, n, k, &mut p).unwrap_or_else(|e| {
                eprintln!("{e}");
                std::process::exit(2)
            });
            p
        });
        match x8 {
            true => Stored::QuantX8(q, blocks.collect()),
            false => Stored::Quant(q, blocks.collect()),
        }
    }

    fn matrices(&self) -> &[Pages] {
        match self {
            Stored::F16(m) | Stored::Quant(_, m) | Stored::QuantX8(_, m) => m,
        }
    }

    fn bytes(&self) -> usize {
        self.matrices().iter().map(|m| m.len()).sum()
    }

    fn copy(&self) -> Stored {
        let m = self.matrices().iter().map(|m| on_pages(m)).collect();
        match self {
            Stored::F16(_) => Stored::F16(m),
            Stored::Quant(f, _) => Stored::Quant(*f, m),
            Stored::QuantX8(f, _) => Stored::QuantX8(*f, m),
        }
    }

    fn weights(&self, i: usize) -> Weights<'_> {
        match self {
            Stored::F16(m) => {
                // SAFETY: the pages start on a 2 MiB boundary (aligned for f16) and hold
                // whole f16 values (two plain bytes, any pattern valid), only read here.
                Weights::F16(unsafe {
                    std::slice::from_raw_parts(m[i].as_ptr().cast::<f16>(), m[i].len() / 2)
                })
            }
            Stored::Quant(f, m) => Weights::Quant(*f, &m[i]),
            Stored::QuantX8(f, m) => Weights::QuantX8(*f, act_precision(), &m[i]),
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let shape = args.next().unwrap_or_else(|| "1b".into());
    let formats = args
        .next()
        .unwrap_or_else(|| "f16,q8_0,q4_0x8,q4_kx8,q6_k".into());
    let reps: usize = args.next().map_or(7, |s| s.parse().unwrap_or(7)).max(1);
    let shapes = layer(&shape);
    let (d, ff) = (shapes[0].1, shapes[4].0);
    let (q_n, kv_n) = (shapes[0].0, shapes[1].0);
    let mut rng = Rng(0x5EED);
    let x: Vec<f32> = (0..ff).map(|_| rng.uniform()).collect();
    let mut out = [
        vec![0.0f32; q_n],
        vec![0.0; kv_n],
        vec![0.0; kv_n],
        vec![0.0; ff],
        vec![0.0; ff],
    ];
    println!(
        "shape {shape}, {} threads, {reps} rounds; GB/s of weight bytes (medians)",
        rayon::current_num_threads()
    );
    for format in formats.split(',') {
        let one = Stored::make(format, &shapes, &mut rng);
        let copies = (768usize << 20).div_ceil(one.bytes());
        // Distinct copies, so that every step streams all of them from memory.
        let layers: Vec<Stored> = (0..copies).map(|_| one.copy()).collect();
        let bytes = copies * one.bytes();
        let mut read = Pages::zeroed(bytes / 8 * 8).expect("memory for the read");
        read.fill(1);
        // SAFETY: the pages start on a 2 MiB boundary (aligned for u64) and hold exactly
        // `bytes / 8` words, any bit pattern valid, only read from here on.
        let words: &[u64] =
            unsafe { std::slice::from_raw_parts(read.as_ptr().cast::<u64>(), bytes / 8) };
        let step = |out: &mut [Vec<f32>; 5]| {
            for l in &layers {
                let [q, k, v, g, u] = out;
                #[rustfmt::skip]
                let mut qkv = [
                    Projection { w: l.weights(0), bias: None, n: q_n, y: &mut q[..] },
                    Projection { w: l.weights(1), bias: None, n: kv_n, y: &mut k[..] },
                    Projection { w: l.weights(2), bias: None, n: kv_n, y: &mut v[..] },
                ];
                linear_many(&x[..d], 1, d, &mut qkv).expect("shapes agree");
                linear(&mut q[..d], &x[..d], l.weights(3), None, 1, d, d).expect("shapes");
                #[rustfmt::skip]
                let mut gate_up = [
                    Projection { w: l.weights(4), bias: None, n: ff, y: &mut g[..] },
                    Projection { w: l.weights(5), bias: None, n: ff, y: &mut u[..] },
                ];
                linear_many(&x[..d], 1, d, &mut gate_up).expect("shapes agree");
                linear(&mut q[..d], &x, l.weights(6), None, 1, ff, d).expect("shapes");
            }
        };
        let (mut ts, mut tr) = (Vec::new(), Vec::new());
        for round in 0..=reps {
            let t = Instant::now();
            step(&mut out);
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
