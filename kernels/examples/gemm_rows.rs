//! The matrix product's rate against the number of rows of `x`: one `linear` call at a 1B
//! model's shapes (2048 → 2048, 2048 → 8192, 8192 → 2048) for 1 to 512 rows, per weight
//! format and layout, on the pool's threads. Reports multiply-adds per second (`m·n·k` over
//! the call's time): decode is the first row, a batched step the middle ones, prefill the
//! last. Weights are random; the rate does not depend on them.
//!
//! `cargo run --release -p qkv-kernels --example gemm_rows [format ...] [-- rows ...]`
//! with formats among `f16`, `q4_0`, `q4_1`, `q4_k`, `q6_k`, `q8_0` (the file's layout)
//! and the same with `x8` appended (interleaved: `q4_0x8`, `q4_1x8`, `q4_kx8`, `q6_kx8`,
//! `q8_0x8`). `GEMM_ROWS_SHAPES=n×k,…` (as `4096x14336`) gives other shapes;
//! `QKV_ACT_BITS=8|16` the activations' precision for the interleaved layouts.

use qkv_kernels::quant::testing::{weight_blocks, Rng};
use qkv_kernels::quant::x8;
use qkv_kernels::{f16, linear, QuantFormat, Weights};
use std::time::Instant;

#[path = "common/act_bits.rs"]
mod act_bits;
use act_bits::act_precision;

/// The fastest of 3 runs lasting at least 0.2 s each, in seconds per call.
fn best(mut call: impl FnMut()) -> f64 {
    call();
    (0..3)
        .map(|_| {
            let t = Instant::now();
            let mut reps = 0;
            while reps == 0 || t.elapsed().as_secs_f64() < 0.2 {
                call();
                reps += 1;
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// The weights of one `[n, k]` matrix in the layout `name` names.
enum Owned {
    F16(Vec<f16>),
    Quant(QuantFormat, Vec<u8>),
    X8(QuantFormat, Vec<u8>),
}

impl Owned {
    fn make(name: &str, n: usize, k: usize, rng: &mut Rng) -> Option<Owned> {
        let format = |f: &str| QuantFormat::ALL.into_iter().find(|q| q.to_string() == f);
        Some(match name {
            "f16" => Owned::F16((0..n * k).map(|_| f16::from_f32(rng.uniform())).collect()),
            _ if name.ends_with("x8") => {
                let f = format(&name[..name.len() - 2].to_uppercase())?;
                let w = weight_blocks(f, n, k, rng);
                let mut p = vec![0; w.len()];
                x8::pack(f, &w, n, k, &mut p).ok()?;
                Owned::X8(f, p)
            }
            _ => {
                let f = format(&name.to_uppercase())?;
                Owned::Quant(f, weight_blocks(f, n, k, rng))
            }
        })
    }

    fn weights(&self) -> Weights<'_> {
        match self {
            Owned::F16(w) => Weights::F16(w),
            Owned::Quant(f, b) => Weights::Quant(*f, b),
            Owned::X8(f, b) => Weights::QuantX8(*f, act_precision(), b),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut names: Vec<&str> = args[..split].iter().map(String::as_str).collect();
    if names.is_empty() {
        names = vec!["f16", "q4_0", "q4_0x8", "q4_k", "q4_kx8", "q6_k", "q8_0"];
    }
    let rows: Vec<usize> = if split < args.len() {
        args[split + 1..]
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect()
    } else {
        vec![1, 4, 16, 64, 512]
    };
    // `GEMM_ROWS_SHAPES=4096x14336,…` (n×k) replaces the 1B shapes.
    let shapes: Vec<(usize, usize)> = match std::env::var("GEMM_ROWS_SHAPES") {
        Ok(list) => list
            .split(',')
            .filter_map(|s| s.split_once('x'))
            .filter_map(|(n, k)| Some((n.parse().ok()?, k.parse().ok()?)))
            .collect(),
        Err(_) => vec![(2048, 2048), (8192, 2048), (2048, 8192)],
    };
    println!(
        "{} threads; GMAC/s (m·n·k per second) per shape n×k",
        rayon::current_num_threads()
    );
    let mut rng = Rng(7);
    for name in names {
        for &(n, k) in &shapes {
            let Some(w) = Owned::make(name, n, k, &mut rng) else {
                eprintln!("unknown format {name}");
                return;
            };
            let mut line = format!("{name:>7} {n:>5}x{k:<5}");
            for &m in &rows {
                let x: Vec<f32> = (0..m * k).map(|_| rng.uniform()).collect();
                let mut y = vec![0.0f32; m * n];
                let s =
                    best(|| linear(&mut y, &x, w.weights(), None, m, k, n).expect("shapes agree"));
                line += &format!("  m={m}: {:6.1}", (m * n * k) as f64 / s / 1e9);
            }
            println!("{line}");
        }
    }
}
