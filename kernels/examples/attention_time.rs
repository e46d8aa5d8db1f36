//! Times the attention kernel on one shape and prints the median and minimum in ms, for
//! side-by-side runs against PyTorch (`tools/attention_vs_sdpa.py`).
//!
//! `cargo run --release -p qkv-kernels --example attention_time -- TQ TK f32|f16 [REPS [LAYERS [pos|head]]]`
//!
//! 9 query heads over 3 KV heads, head_dim 64, causal with query `i` at position `tk−tq+i`.
//! The calls run on one of rayon's workers, as a `Session` runs its passes.
//! With `LAYERS > 1` every repetition runs the call once on each of `LAYERS` separate K/V
//! buffers, as a decode step does across a model's layers, so that K and V come from memory
//! rather than cache once the buffers outgrow it; the times printed are per call. The last
//! argument picks the K/V layout: `pos` (position-major `[tk, kv_heads, d]`, the default) or
//! `head` (head-major `[kv_heads, tk, d]`, the layout of qkv's Llama KV cache).

use qkv_kernels::{attention, f16, AttentionMask, KvView, QueryView};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: attention_time TQ TK f32|f16 [REPS [LAYERS [pos|head]]]");
        std::process::exit(2);
    }
    let parse = |s: &str| -> usize {
        s.parse().unwrap_or_else(|_| {
            eprintln!("not a number: {s}");
            std::process::exit(2)
        })
    };
    let (tq, tk) = (parse(&args[0]), parse(&args[1]));
    let reps = args.get(3).map_or(11, |s| parse(s)).max(1);
    let layers = args.get(4).map_or(1, |s| parse(s)).max(1);
    if tq == 0 || tk < tq {
        eprintln!("need 0 < TQ ≤ TK");
        std::process::exit(2);
    }
    let (heads, kv_heads, d) = (9, 3, 64);
    let fill = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    };
    let q = fill(tq * heads * d, 1);
    let n = tk * kv_heads * d;
    let k = fill(n * layers, 2);
    let v = fill(n * layers, 3);
    let (k16, v16): (Vec<f16>, Vec<f16>) = (
        k.iter().map(|&x| f16::from_f32(x)).collect(),
        v.iter().map(|&x| f16::from_f32(x)).collect(),
    );
    let head_major = match args.get(5).map(String::as_str) {
        None | Some("pos") => false,
        Some("head") => true,
        Some(other) => {
            eprintln!("layout must be pos or head, not {other}");
            std::process::exit(2)
        }
    };
    let views: Vec<(KvView, KvView)> = (0..layers)
        .map(|l| {
            let r = l * n..(l + 1) * n;
            fn hm(mut v: KvView<'_>, on: bool, tk: usize, d: usize) -> KvView<'_> {
                if on {
                    v.row_stride = d;
                    v.head_stride = tk * d;
                }
                v
            }
            let (a, b) = match args[2].as_str() {
                "f32" => (
                    KvView::contiguous_f32(&k[r.clone()], tk, kv_heads, d),
                    KvView::contiguous_f32(&v[r], tk, kv_heads, d),
                ),
                "f16" => (
                    KvView::contiguous_f16(&k16[r.clone()], tk, kv_heads, d),
                    KvView::contiguous_f16(&v16[r], tk, kv_heads, d),
                ),
                other => {
                    eprintln!("dtype must be f32 or f16, not {other}");
                    std::process::exit(2)
                }
            };
            (hm(a, head_major, tk, d), hm(b, head_major, tk, d))
        })
        .collect();
    let qv = QueryView::contiguous(&q, tq, heads, d);
    let mask = AttentionMask::causal(tk - tq);
    let mut out = vec![0.0f32; tq * heads * d];
    let mut times = Vec::with_capacity(reps);
    // Calls run on a pool worker, as `qkv::session::Session` runs its passes: from outside
    // the pool every call would pay for injecting its jobs and waking the workers (at tk =
    // 2048 that doubled a decode call's time here).
    let pass = |out: &mut [f32]| {
        rayon::scope(|_| {
            for (kv, vv) in &views {
                attention(&qv, kv, vv, &mask, None, out).expect("valid shapes");
            }
        })
    };
    pass(&mut out); // warm-up
    for _ in 0..reps {
        let t = Instant::now();
        pass(&mut out);
        times.push(t.elapsed().as_secs_f64() * 1e3 / layers as f64);
    }
    times.sort_by(f64::total_cmp);
    println!("median_ms {:.4} min_ms {:.4}", times[reps / 2], times[0]);
}
