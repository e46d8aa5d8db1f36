//! The precise errors of issue 18, each on the public API and without the network: a state
//! made by another model, a tensor past the end of its file, an allocation the machine
//! refuses, and logits that are not finite wherever a token is chosen or scored.

use qkv::engine::{Engine, EngineOptions, Event, GenRequest};
use qkv::kernels::QuantFormat;
use qkv::load::Model;
use qkv::models::decoder::{Decoder, DecoderConfig, Segment, WeightLayout, MAX_CONTEXT};
use qkv::perplexity::{evaluate, Scoring};
use qkv::sample::{Sampler, SamplerConfig};
use qkv::session::{Session, SessionOptions};
use qkv::tokenizer::Tokenizer;
use qkv::weights::{map_file, FloatType, Tensor, TensorSource};
use qkv::Error;
use std::sync::Arc;

/// dim 16, 2 layers, 4 heads over 2 KV heads, FFN 32, vocabulary 40, context 64.
fn small() -> DecoderConfig {
    DecoderConfig::llama(16, 2, 4, 2, 32, 40, 64, WeightLayout::Gguf)
}

fn synthetic(seed: u64) -> Decoder {
    Decoder::synthetic(small(), seed, FloatType::F32).unwrap()
}

#[test]
fn a_state_made_by_another_model_is_refused() {
    let (a, b) = (synthetic(1), synthetic(1));
    let mut state = a.new_state(16, FloatType::F32, 4).unwrap();
    a.forward(&mut state, &[1, 2, 3], 0, None).unwrap();
    // The same configuration and weights, but another model: its cache is not this one's.
    let mut logits = vec![0.0; 40];
    match b.forward(&mut state, &[4], 3, Some(&mut logits)) {
        Err(
            e @ Error::ForeignState {
                state: "KV cache",
                made_by,
                used_with,
            },
        ) => {
            assert_ne!(made_by, used_with);
            assert!(e.to_string().contains("another model"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // Nothing ran: the owner goes on from where it was.
    assert_eq!(state.cache().filled(), 3);
    a.forward(&mut state, &[4], 3, Some(&mut logits)).unwrap();

    // A bare cache in a batched pass, next to one of the model's own.
    let mut own = b.new_cache(16, FloatType::F32).unwrap();
    let mut foreign = a.new_cache(16, FloatType::F32).unwrap();
    let mut scratch = b.new_scratch(8).unwrap();
    let mut segments = [
        Segment {
            cache: &mut own,
            tokens: &[1, 2],
            pos0: 0,
            logits: 1,
            lora: &[],
        },
        Segment {
            cache: &mut foreign,
            tokens: &[3],
            pos0: 0,
            logits: 1,
            lora: &[],
        },
    ];
    let mut logits = vec![0.0; 2 * 40];
    let err = b
        .forward_batch(&mut segments, &mut scratch, &mut logits)
        .unwrap_err();
    assert!(matches!(err, Error::ForeignState { .. }), "{err}");
    assert_eq!(own.filled(), 0, "a refused batch runs none of its segments");
}

#[test]
fn a_tensor_past_the_end_of_its_file_names_it_with_its_numbers() {
    let dir = std::env::temp_dir().join(format!("qkv-errors-map-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("raw.bin");
    let bytes: Vec<u8> = (0..10u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let map = map_file(&path).unwrap();
    match Tensor::from_mapped("w", vec![2, 2], map.clone(), 4, FloatType::F16) {
        Err(Error::TensorPastEnd {
            path: p,
            tensor,
            offset,
            length,
            file_size,
        }) => {
            assert_eq!(p, path);
            assert_eq!(
                (tensor.as_str(), offset, length, file_size),
                ("w", 4, 8, 10)
            );
        }
        other => panic!("{other:?}"),
    }
    match Tensor::from_mapped_quant("q", vec![1, 32], map.clone(), 0, QuantFormat::Q8_0) {
        Err(Error::TensorPastEnd { length: 34, .. }) => {}
        other => panic!("{other:?}"),
    }
    // In the file but misaligned for f16: copied, not refused.
    let t = Tensor::from_mapped("w", vec![4], map.clone(), 1, FloatType::F16).unwrap();
    assert!(!t.is_mapped());
    let aligned = Tensor::from_mapped("w", vec![4], map, 2, FloatType::F16).unwrap();
    assert!(aligned.is_mapped());
    assert_eq!(t.to_f32_vec().unwrap().len(), 4);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_absurd_cache_or_scratch_is_an_allocation_error_not_an_abort() {
    // Small weights, a huge cache: 4096 layers × 2^20 positions × 64 values × 4 bytes is a
    // TiB for the keys alone, which the allocator refuses (Linux's default overcommit
    // heuristic refuses an allocation larger than RAM and swap).
    let mut config = DecoderConfig::llama(2, 4096, 1, 1, 2, 8, MAX_CONTEXT, WeightLayout::Gguf);
    config.head_dim = 64;
    let model = Arc::new(Model::from_parts(
        Decoder::synthetic(config, 3, FloatType::F32).unwrap(),
        None,
    ));
    match Session::new(model.clone(), SessionOptions::default()) {
        Err(Error::AllocationRefused { what, bytes }) => {
            assert!(what.contains("KV cache of 1048576 positions"), "{what}");
            assert_eq!(bytes, 4096 << 20 << 6 << 2);
        }
        other => panic!("{:?}", other.map(|s| s.capacity())),
    }
    // A step of 2^48 tokens needs scratch past any address space.
    let options = EngineOptions {
        context: 16,
        step_tokens: 1 << 48,
        ..EngineOptions::default()
    };
    match Engine::new(Arc::new(Model::from_parts(synthetic(2), None)), options) {
        Err(Error::AllocationRefused { what, bytes }) => {
            assert!(what.contains("scratch"), "{what}");
            assert_eq!(bytes, (1usize << 48) * 16 * 4);
        }
        other => panic!("{other:?}"),
    }
    // Padding flags for 2^60 positions.
    match qkv::nn::KeyPadding::all(1 << 40, 1 << 20) {
        Err(Error::AllocationRefused { what, bytes }) => {
            assert!(what.contains("key padding"), "{what}");
            assert_eq!(bytes, 1 << 60);
        }
        other => panic!("{:?}", other.map(|p| p.batch())),
    }
    // One whose size overflows is refused the same way.
    let err = synthetic(2).new_scratch(usize::MAX / 2).unwrap_err();
    assert!(
        matches!(
            err,
            Error::AllocationRefused {
                bytes: usize::MAX,
                ..
            }
        ),
        "{err}"
    );
}

/// The weights of [`small`]'s model, made up, except for a NaN in row `POISONED` of the
/// (tied) embedding: the logit of that token is NaN, every other one finite, as long as the
/// token is never fed to the model.
struct Poisoned(DecoderConfig);

const POISONED: usize = 7;

impl Poisoned {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let c = &self.0;
        let (d, kvd, ff) = (c.dim, c.kv_dim(), c.ffn_dim);
        if name == "token_embd.weight" {
            return Some(vec![c.vocab, d]);
        }
        if name == "output_norm.weight" {
            return Some(vec![d]);
        }
        let part = name.strip_prefix("blk.")?.split_once('.')?.1;
        Some(match part {
            "attn_norm.weight" | "ffn_norm.weight" => vec![d],
            "attn_q.weight" | "attn_output.weight" => vec![d, d],
            "attn_k.weight" | "attn_v.weight" => vec![kvd, d],
            "ffn_gate.weight" | "ffn_up.weight" => vec![ff, d],
            "ffn_down.weight" => vec![d, ff],
            _ => return None,
        })
    }
}

impl TensorSource for Poisoned {
    fn tensor(&self, name: &str) -> qkv::Result<Tensor> {
        let shape = self.shape(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
        })?;
        let n: usize = shape.iter().product();
        let mut data: Vec<f32> = if shape.len() == 1 {
            vec![1.0; n]
        } else {
            (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 200.0)
                .collect()
        };
        if name == "token_embd.weight" {
            data[POISONED * self.0.dim] = f32::NAN;
        }
        Tensor::from_f32(name, shape, data)
    }

    fn contains(&self, name: &str) -> bool {
        self.shape(name).is_some()
    }

    fn names(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The poisoned model, with a tokenizer of one token per letter (`a` = 0 … `z` = 25,
/// `A` = 26 … `N` = 39): `h` is the poisoned token.
fn poisoned_model() -> Arc<Model> {
    let decoder = Decoder::load(small(), &Poisoned(small()), None, &Default::default()).unwrap();
    let letters = ('a'..='z').chain('A'..='N');
    let vocab: serde_json::Map<String, serde_json::Value> = letters
        .enumerate()
        .map(|(i, c)| (c.to_string(), i.into()))
        .collect();
    let json = serde_json::json!({ "model": { "type": "BPE", "vocab": vocab, "merges": [] } });
    let dir = std::env::temp_dir().join(format!("qkv-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    let tokenizer = Tokenizer::from_tokenizer_json(&path).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(tokenizer.encode("bcd").unwrap(), [1, 2, 3]);
    Arc::new(Model::from_parts(decoder, Some(tokenizer)))
}

#[test]
fn non_finite_logits_are_never_sampled() {
    let model = poisoned_model();
    let mut session = Session::new(model.clone(), SessionOptions::default()).unwrap();
    let logits = session.prefill(&[1, 2, 3]).unwrap().to_vec();
    assert!(logits[POISONED].is_nan());
    assert!(logits
        .iter()
        .enumerate()
        .all(|(i, x)| i == POISONED || x.is_finite()));
    // Greedy, and sampled: both refuse, naming the token.
    for config in [SamplerConfig::greedy(), SamplerConfig::default()] {
        match Sampler::new(config).unwrap().sample(&logits, &[1, 2, 3]) {
            Err(Error::NonFiniteLogits {
                token: POISONED,
                value,
                ..
            }) => assert!(value.is_nan()),
            other => panic!("{other:?}"),
        }
    }

    // Generation yields the error, naming the position, and ends.
    let mut generate = session
        .generate("d", SamplerConfig::greedy())
        .unwrap()
        .max_tokens(3);
    match generate.next() {
        Some(Err(Error::NonFiniteLogits {
            sequence: None,
            position: Some(3),
            token: POISONED,
            value,
        })) => assert!(value.is_nan()),
        other => panic!("{other:?}"),
    }
    assert!(generate.next().is_none());
    drop(generate);
    assert_eq!(session.tokens(), &[1, 2, 3, 3]);

    // The engine fails that sequence alone, saying where.
    let mut engine = Engine::new(
        model.clone(),
        EngineOptions {
            context: 32,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let seq = engine
        .submit(GenRequest::new(vec![1, 2, 3], SamplerConfig::greedy(), 4))
        .unwrap();
    let mut events = Vec::new();
    while !engine.is_idle() {
        engine.step(&mut events).unwrap();
    }
    // Progress reports aside, the one event is the failure.
    events.retain(|e| !matches!(e, Event::Prompt { .. }));
    match &events[..] {
        [Event::Failed { seq: s, error }] => {
            assert_eq!(*s, seq);
            let want = Error::NonFiniteLogits {
                sequence: None,
                position: Some(2),
                token: POISONED,
                value: f32::NAN,
            };
            assert_eq!(error, &want.to_string());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn perplexity_names_the_window_and_position_of_a_non_finite_logit() {
    let model = poisoned_model();
    // No token is the poisoned one, so only its logit is NaN, at every position.
    let tokens: Vec<u32> = (0..32).map(|i| 1 + i % 5).collect();
    match evaluate(&model, &tokens, 16, Scoring::Perplexity, |_, _| {}) {
        Err(Error::NonFiniteLogits {
            sequence: Some(0),
            position: Some(8),
            token: POISONED,
            value,
        }) => assert!(value.is_nan()),
        other => panic!("{other:?}"),
    }
    // The same text on a model with finite logits is scored.
    let healthy = Arc::new(Model::from_parts(synthetic(5), None));
    let report = evaluate(&healthy, &tokens, 16, Scoring::Perplexity, |_, _| {}).unwrap();
    assert!(report.ppl.is_finite() && report.ppl > 1.0, "{report:?}");
}
