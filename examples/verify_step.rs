//! What a whole verify pass of speculative decoding costs against a decode step, on a model
//! file: the forward pass over `m` positions after a prompt (with the logits of every one
//! of them, as a pass that checks `m - 1` drafted tokens asks for) against the pass over
//! one position, back to back in one process.
//!
//! ```text
//! cargo run --release --example verify_step -- [MODEL] [ROUNDS] [-- ROWS]
//! ```
//!
//! MODEL defaults to `$QKV_CACHE/shapes/llama-1b.Q4_K_M.gguf` (`~/.cache/qkv` without
//! `QKV_CACHE`); ROUNDS to 7 (after one to warm up); ROWS to 1 to 9. `QKV_VERIFY_PROMPT=N`
//! sets the prompt's length (default 256: the positions each row attends to), and
//! `QKV_ACT_BITS=8|16` the activations' precision for the interleaved matrices.
//!
//! Each round runs every height once, in an order that turns by one each round, at the
//! position right after the prompt (each pass forgets the one before it), and divides each
//! pass's time by the round's one-row pass. It prints the one-row pass's median time and,
//! per height, the median of those ratios: ratios of passes taken back to back survive a
//! loaded host far better than absolute times.

use qkv::load::{Model, ModelOptions};
use std::path::PathBuf;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A number from the environment, or `default` when unset.
fn env_number<T: std::str::FromStr>(name: &str, default: T) -> qkv::Result<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v
            .parse()
            .map_err(|e| qkv::Error::Config(format!("{name}={v:?}: {e}"))),
    }
}

fn main() -> qkv::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let (named, heights) = args.split_at(split);
    let path = match named.first() {
        Some(p) => PathBuf::from(p),
        None => {
            let cache = std::env::var_os("QKV_CACHE")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/qkv")));
            let Some(cache) = cache else {
                return Err(qkv::Error::Config(
                    "no model given, and neither QKV_CACHE nor HOME is set".into(),
                ));
            };
            cache.join("shapes/llama-1b.Q4_K_M.gguf")
        }
    };
    let rounds: usize = match named.get(1) {
        None => 7,
        Some(r) => r
            .parse()
            .map_err(|e| qkv::Error::Config(format!("rounds {r:?}: {e}")))?,
    };
    let rounds = rounds.max(1);
    let mut rows = Vec::new();
    for r in heights.iter().skip(1) {
        match r.parse::<usize>() {
            Ok(m) if m > 0 => rows.push(m),
            _ => {
                return Err(qkv::Error::Config(format!(
                    "rows {r:?}: give a positive count"
                )))
            }
        }
    }
    if rows.is_empty() {
        rows = (1..=9).collect();
    }
    if !rows.contains(&1) {
        rows.insert(0, 1);
    }
    let prompt_len: usize = env_number("QKV_VERIFY_PROMPT", 256)?;
    let mut options = ModelOptions::default();
    if let Ok(bits) = std::env::var("QKV_ACT_BITS") {
        options.act_precision = bits
            .parse()
            .map_err(|e| qkv::Error::Config(format!("QKV_ACT_BITS={bits:?}: {e}")))?;
    }
    let model = Model::load(&path, &options)?;
    let decoder = model.decoder();
    let vocab = model.vocab_size();
    let most = rows.iter().copied().max().unwrap_or(1);
    let capacity = prompt_len + most;
    let mut state = decoder.new_state(capacity, decoder.kv_dtype(), prompt_len.max(most))?;
    // Token ids spread over the vocabulary; the cost does not depend on which they are.
    let ids: Vec<u32> = (0..capacity)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    let (prompt, after) = ids.split_at(prompt_len);
    if !prompt.is_empty() {
        qkv::kernels::on_pool(|| decoder.forward(&mut state, prompt, 0, None))?;
    }
    let mut logits = vec![0.0f32; most * vocab];
    println!(
        "{}: {} threads, prompt of {prompt_len}, {rounds} rounds; a pass of m positions over \
         a pass of one (medians of the ratios within a round)",
        path.display(),
        rayon::current_num_threads()
    );
    let mut times = vec![Vec::new(); rows.len()];
    for round in 0..=rounds {
        let mut secs = vec![0.0; rows.len()];
        for turn in 0..rows.len() {
            let at = (turn + round) % rows.len();
            let m = rows[at];
            let (state, logits) = (&mut state, &mut logits[..m * vocab]);
            let t = Instant::now();
            qkv::kernels::on_pool(|| {
                decoder.forward_tail(state, &after[..m], prompt_len, m, logits)
            })?;
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
    println!("one position: {:.2} ms", 1e3 * median(times[base].clone()));
    for (i, &m) in rows.iter().enumerate().filter(|&(_, &m)| m > 1) {
        let ratios: Vec<f64> = times[i]
            .iter()
            .zip(&times[base])
            .map(|(t, b)| t / b)
            .collect();
        println!("m={m}: {:.3}×", median(ratios));
    }
    Ok(())
}
