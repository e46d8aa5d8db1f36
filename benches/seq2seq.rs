//! Seq2seq benches: the seed-004 Transformer at d_model 512, 8 heads, 6 + 6 layers, FFN 2048,
//! random weights made here (f32).
//!
//! - `seq2seq/encoder_forward_b8_t128`: the encoder over an embedded `[8, 128, 512]` batch,
//!   its buffers kept in one [`Workspace`] across calls.
//! - `seq2seq/decoder_step_src128/b{1,8}`: one decoder step (self-attention with the KV
//!   cache, cross-attention over kept K/V of a 128-token source, FFN, a 1000-word output
//!   projection), averaged over target positions 0–63: whole 64-step runs from a fresh state
//!   are timed, the state's first touches included, as in the PyTorch peer.
//!
//! Peer: `python3 tools/seq2seq_torch_bench.py` (PyTorch, 2 threads, same shapes).

use criterion::{criterion_group, criterion_main, Criterion};
use qkv::models::seq2seq::{Seq2Seq, Seq2SeqConfig, TokenBatch, Workspace};
use qkv::nn::{KeyPadding, Seq};
use qkv::weights::{Tensor, TensorSource};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// An in-memory state_dict of random weights.
struct RandomDict(HashMap<String, (Vec<usize>, Vec<f32>)>);

impl TensorSource for RandomDict {
    fn tensor(&self, name: &str) -> qkv::Result<Tensor> {
        let (shape, data) = self.0.get(name).ok_or_else(|| qkv::Error::MissingTensor {
            name: name.to_owned(),
        })?;
        Tensor::from_f32(name, shape.clone(), data.clone())
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
    fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }
}

/// xorshift, uniform in [-a, a).
struct Rng(u64);
impl Rng {
    fn next(&mut self, a: f32) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
    }
}

fn config() -> Seq2SeqConfig {
    Seq2SeqConfig {
        d_model: 512,
        heads: 8,
        encoder_layers: 6,
        decoder_layers: 6,
        ffn_scale: 4,
        src_vocab: 1000,
        tgt_vocab: 1000,
        max_src_len: 256,
        max_tgt_len: 256,
        norm_eps: 1e-5,
    }
}

fn random_model(cfg: &Seq2SeqConfig) -> Seq2Seq {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut dict = HashMap::new();
    let d = cfg.d_model;
    let f = d * cfg.ffn_scale;
    let mut put = |name: String, shape: Vec<usize>, rng: &mut Rng| {
        let fan_in = *shape.last().unwrap() as f32;
        let n = shape.iter().product();
        let data = (0..n).map(|_| rng.next(1.0 / fan_in.sqrt())).collect();
        dict.insert(name, (shape, data));
    };
    let mut linear = |p: String, o: usize, i: usize, rng: &mut Rng| {
        put(format!("{p}.weight"), vec![o, i], rng);
        put(format!("{p}.bias"), vec![o], rng);
    };
    let attn = ["wq", "wk", "wv", "output_layer"];
    for l in 0..cfg.encoder_layers {
        let p = format!("Encoder.Layers.{l}");
        for a in attn {
            linear(format!("{p}.attn.{a}"), d, d, &mut rng);
        }
        linear(format!("{p}.FFN.linear1"), f, d, &mut rng);
        linear(format!("{p}.FFN.linear2"), d, f, &mut rng);
        for n in ["norm1", "norm2"] {
            linear(format!("{p}.{n}"), d, 1, &mut rng);
        }
    }
    for l in 0..cfg.decoder_layers {
        let p = format!("Decoder.Layers.{l}");
        for s in ["self_attn", "cross_attn"] {
            for a in attn {
                linear(format!("{p}.{s}.{a}"), d, d, &mut rng);
            }
        }
        linear(format!("{p}.FFN.linear1"), f, d, &mut rng);
        linear(format!("{p}.FFN.linear2"), d, f, &mut rng);
        for n in ["norm1", "norm2", "norm3"] {
            linear(format!("{p}.{n}"), d, 1, &mut rng);
        }
    }
    linear("generator".into(), cfg.tgt_vocab, d, &mut rng);
    let mut dict = RandomDict(dict);
    // LayerNorm weights and biases are [d]: reshape the [d, 1] ones made above.
    for (name, (shape, _)) in dict.0.iter_mut() {
        if name.contains(".norm") && name.ends_with(".weight") {
            *shape = vec![d];
        }
    }
    for (name, vocab) in [
        ("src_embedding.weight", cfg.src_vocab),
        ("tgt_embedding.weight", cfg.tgt_vocab),
    ] {
        let data = (0..vocab * d).map(|_| rng.next(1.0)).collect();
        dict.0.insert(name.into(), (vec![vocab, d], data));
    }
    Seq2Seq::load(&dict, cfg.clone()).expect("random model loads")
}

fn bench(c: &mut Criterion) {
    let cfg = config();
    let model = random_model(&cfg);
    let mut rng = Rng(42);
    let mut g = c.benchmark_group("seq2seq");
    g.sample_size(10).measurement_time(Duration::from_secs(8));

    let (b, t, d) = (8, 128, cfg.d_model);
    let x: Vec<f32> = (0..b * t * d).map(|_| rng.next(1.0)).collect();
    let pads = KeyPadding::all(b, t).unwrap();
    // One workspace for every call, as a server encoding batch after batch keeps it (PyTorch's
    // caching allocator does the same for the peer).
    let mut ws = Workspace::default();
    g.bench_function("encoder_forward_b8_t128", |bch| {
        bch.iter(|| {
            model
                .encode_embedded_in(Seq::new(&x, b, t, d).unwrap(), &pads, &mut ws)
                .unwrap()
                .data()[0]
        })
    });

    for batch in [1usize, 8] {
        let src: Vec<u32> = (0..batch * 128).map(|i| (i * 31 % 1000) as u32).collect();
        let lengths = vec![128; batch];
        let src = TokenBatch::new(&src, batch, 128, &lengths).unwrap();
        let cap = 64;
        let tokens: Vec<u32> = (0..batch as u32).map(|i| 5 + i).collect();
        g.bench_function(format!("decoder_step_src128/b{batch}"), |bch| {
            // Whole runs of `cap` steps from a fresh state (made untimed), so that every
            // position weighs the same; the time is scaled back to the `iters` steps asked for.
            bch.iter_custom(|iters| {
                let runs = iters.div_ceil(cap as u64).max(1);
                let mut total = Duration::ZERO;
                for _ in 0..runs {
                    let mut state = model.start(model.encode(&src).unwrap(), cap).unwrap();
                    let t0 = Instant::now();
                    for _ in 0..cap {
                        model.step(&mut state, &tokens).unwrap();
                    }
                    total += t0.elapsed();
                }
                total.mul_f64(iters as f64 / (runs * cap as u64) as f64)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
