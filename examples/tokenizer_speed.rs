//! Load time and encode speed of qkv's tokenizer on one file, for `tools/tokenizer_speed.py`
//! (which times Hugging Face `tokenizers` on the same files and text).
//!
//! ```text
//! cargo run --release --example tokenizer_speed -- TOKENIZER TEXT [IDS_OUT]
//! ```
//!
//! `TOKENIZER` is what [`Tokenizer::load`] takes (a `tokenizer.json` or a GGUF file); `TEXT`
//! is a UTF-8 file, encoded whole as one string with the special tokens added (as Hugging
//! Face's `encode` does by default). Prints one JSON object: the fastest of a few loads and
//! encodes, in milliseconds, and the counts. `IDS_OUT` receives the ids as a JSON array, for
//! comparing them with the reference's.

use qkv::tokenizer::Tokenizer;
use std::path::Path;
use std::time::{Duration, Instant};

/// Runs `f` at least twice and until `budget` is spent (at most `max` times); the fastest
/// run's time and the last result.
fn fastest<T>(budget: Duration, max: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let start = Instant::now();
    let mut best = Duration::MAX;
    let mut runs = 0;
    loop {
        let t = Instant::now();
        let out = f();
        best = best.min(t.elapsed());
        runs += 1;
        if runs >= max || (runs >= 2 && start.elapsed() > budget) {
            return (best, out);
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(tok_path), Some(text_path)) = (args.first(), args.get(1)) else {
        return Err("usage: tokenizer_speed TOKENIZER TEXT [IDS_OUT]".into());
    };
    let text = std::fs::read_to_string(text_path)?;
    let budget = Duration::from_millis(600);
    let (load, tok) = fastest(budget, 10, || Tokenizer::load(Path::new(tok_path)));
    let tok = tok?;
    let (encode, ids) = fastest(budget, 5, || tok.encode(&text));
    let ids = ids?;
    if let Some(out) = args.get(2) {
        std::fs::write(out, serde_json::to_string(&ids)?)?;
    }
    println!(
        "{}",
        serde_json::json!({
            "load_ms": load.as_secs_f64() * 1e3,
            "encode_ms": encode.as_secs_f64() * 1e3,
            "vocab": tok.vocab_size(),
            "bytes": text.len(),
            "tokens": ids.len(),
        })
    );
    Ok(())
}
