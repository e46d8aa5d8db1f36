//! Load a seq2seq Transformer exported from PyTorch and greedy-decode a batch of sources.
//!
//! ```text
//! python3 tools/seq2seq_fixtures.py             # writes tests/fixtures/seq2seq/seq2seq.safetensors
//! cargo run --release --example seq2seq -- [model.safetensors] [bos] [eos] [max_len]
//! ```
//!
//! The model file is `safetensors.torch.save_file(model.state_dict(), path, metadata=config)`
//! of the seed-004 Transformer with `src_embedding`, `tgt_embedding` and `generator` added,
//! the configuration (`d_model`, `heads`, …) as string metadata; see
//! `qkv::models::seq2seq`.

use qkv::models::seq2seq::{Seq2Seq, Seq2SeqConfig, TokenBatch};
use qkv::weights::safetensors::SafeTensorsFile;

fn main() -> qkv::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().cloned().unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/seq2seq/seq2seq.safetensors"
        )
        .into()
    });
    let num = |i: usize, default: usize| -> usize {
        args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
    };
    let (bos, eos, max_len) = (num(1, 1) as u32, num(2, 2) as u32, num(3, 10));

    let file = SafeTensorsFile::open(&path)?;
    let config = Seq2SeqConfig::from_metadata(&file.metadata())?;
    println!("{path}: {config:?}");
    let model = Seq2Seq::load(&file, config.clone())?;

    // Three sources of different lengths, padded to 6 (pad id 0).
    let vocab = config.src_vocab as u32;
    let ids: Vec<u32> = (0..18u32).map(|i| (i * 7 + 3) % vocab).collect();
    let lengths = [6, 3, 5];
    let mut padded = ids.clone();
    for (b, &len) in lengths.iter().enumerate() {
        padded[b * 6 + len..(b + 1) * 6].fill(0);
    }
    let src = TokenBatch::new(&padded, 3, 6, &lengths)?;
    let start = std::time::Instant::now();
    let outputs = model.greedy(&src, bos, eos, max_len.min(config.max_tgt_len))?;
    let elapsed = start.elapsed();
    for (b, out) in outputs.iter().enumerate() {
        println!(
            "source {:?} -> {:?}",
            &padded[b * 6..b * 6 + lengths[b]],
            out
        );
    }
    eprintln!("decoded in {elapsed:?}");
    Ok(())
}
