//! What a verify pass of speculative decoding costs against a decode step: a whole step's
//! products (`layers::step`: Q/K/V, output, gate/up, down of every layer) for `m` rows of
//! activations against the same step for one row, at the layer shapes of Llama 3.2 1B or
//! Llama 3.1 8B, with the weights streamed from memory (as many distinct copies of one
//! layer as make at least 768 MB, so that no step finds them in a cache).
//!
//! `cargo run --release -p qkv-kernels --example verify_rows [1b|8b] [FORMATS] [ROUNDS] [-- ROWS]`
//!
//! FORMATS is a comma list of interleaved formats (default all of them:
//! `q4_0,q4_k,q6_k,q8_0,q3_k,q5_k,iq4_xs,iq4_nl`); `f16` runs as stored, and a name with
//! `@gguf` appended (`q4_k@gguf`) in GGUF's layout.
//! ROWS are the heights to time (default 1 to 9). `QKV_ACT_BITS=8`, `16` or `8,16` (the
//! default) chooses the activations' precisions.
//!
//! Each round times one step at every height, in an order that turns by one each round, and
//! divides each by the round's one-row step: the ratios of steps taken back to back in one
//! process, which a loaded host disturbs far less than it disturbs absolute times. It
//! prints, per format and precision, the one-row step's median time and the median ratio at
//! each height (ROUNDS rounds, default 7, after one to warm up).

use qkv_kernels::quant::act::ActPrecision;
use qkv_kernels::quant::testing::Rng;
use std::time::Instant;

#[path = "common/layers.rs"]
mod layers;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The layout name for a FORMATS entry: interleaved unless it says otherwise.
fn layout(name: &str) -> String {
    if let Some(gguf) = name.strip_suffix("@gguf") {
        return gguf.into();
    }
    if name == "f16" || name.ends_with("x8") {
        return name.into();
    }
    format!("{name}x8")
}

fn fail(what: String) -> ! {
    eprintln!("verify_rows: {what}");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let (named, heights) = args.split_at(split);
    let shape = named.first().map_or("1b", String::as_str);
    let formats = named.get(1).map_or(
        "q4_0,q4_k,q6_k,q8_0,q3_k,q5_k,iq4_xs,iq4_nl",
        String::as_str,
    );
    let rounds: usize = match named.get(2) {
        None => 7,
        Some(r) => r
            .parse()
            .unwrap_or_else(|e| fail(format!("rounds {r:?}: {e}"))),
    };
    let rounds = rounds.max(1);
    let mut rows: Vec<usize> = heights
        .iter()
        .skip(1)
        .map(|r| {
            r.parse()
                .ok()
                .filter(|&m| m > 0)
                .unwrap_or_else(|| fail(format!("rows {r:?}: give a positive count")))
        })
        .collect();
    if rows.is_empty() {
        rows = (1..=9).collect();
    }
    if !rows.contains(&1) {
        rows.insert(0, 1);
    }
    let bits = std::env::var("QKV_ACT_BITS").unwrap_or_else(|_| "8,16".into());
    let precisions: Vec<ActPrecision> = bits
        .split(',')
        .map(|b| {
            b.parse()
                .unwrap_or_else(|e| fail(format!("QKV_ACT_BITS {b:?}: {e}")))
        })
        .collect();
    let Some(shapes) = layers::layer(shape) else {
        fail(format!("unknown shape {shape:?}: 1b or 8b"))
    };
    let most = rows.iter().copied().max().unwrap_or(1);
    let mut rng = Rng(0x5EED);
    let x: Vec<f32> = (0..most * shapes[4].0).map(|_| rng.uniform()).collect();
    let mut out = layers::Outputs::new(&shapes, most);
    println!(
        "shape {shape}, {} threads, {rounds} rounds; a step of m rows over its one-row step \
         (medians of the ratios within a round)",
        rayon::current_num_threads()
    );
    let mut header = format!("{:>10} {:>4} {:>8}", "format", "bits", "1 row ms");
    for &m in rows.iter().filter(|&&m| m > 1) {
        let label = format!("m={m}");
        header += &format!(" {label:>5}");
    }
    println!("{header}");
    for format in formats.split(',') {
        let name = layout(format);
        let one = match layers::Stored::make(&name, &shapes, &mut rng) {
            Ok(one) => one,
            Err(e) => fail(e),
        };
        let all = layers::copies(one, 768 << 20);
        for &precision in &precisions {
            let mut times = vec![Vec::new(); rows.len()];
            for round in 0..=rounds {
                let mut secs = vec![0.0; rows.len()];
                for turn in 0..rows.len() {
                    let at = (turn + round) % rows.len();
                    let t = Instant::now();
                    // On the pool, as the decoder runs its passes (`on_pool`).
                    let (all, x, out) = (&all, &x, &mut out);
                    qkv_kernels::on_pool(|| {
                        layers::step(all, &shapes, precision, x, rows[at], out)
                    });
                    secs[at] = t.elapsed().as_secs_f64();
                }
                if round > 0 {
                    for (t, s) in times.iter_mut().zip(&secs) {
                        t.push(*s);
                    }
                }
            }
            let base = rows
                .iter()
                .position(|&m| m == 1)
                .expect("1 is among the rows");
            let ratios = |i: usize| -> f64 {
                median(
                    times[i]
                        .iter()
                        .zip(&times[base])
                        .map(|(t, b)| t / b)
                        .collect(),
                )
            };
            let bits = match precision {
                ActPrecision::Byte => 8,
                ActPrecision::Wide => 16,
            };
            let mut line = format!(
                "{name:>10} {bits:>4} {:>8.2}",
                1e3 * median(times[base].clone())
            );
            for (i, _) in rows.iter().enumerate().filter(|&(_, &m)| m > 1) {
                line += &format!(" {:>5.2}", ratios(i));
            }
            println!("{line}");
        }
    }
}
