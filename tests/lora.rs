//! LoRA adapters: read from GGUF and checked against the model, applied without merging, per
//! sequence in a batch.
//!
//! The tests named `network_…` compare with transformers+peft on the fixture
//! `tools/lora_fixture.py` makes (a tiny random-weight Llama, two peft adapters with random
//! non-zero `B`, both converted with llama.cpp's converters), read from `QKV_LORA_DIR`, else
//! `$QKV_CACHE/lora`. Without it they skip with a message, except under CI (`CI=true`),
//! where they fail.

use qkv::engine::{Engine, EngineOptions, Event, GenRequest};
use qkv::load::{Model, ModelOptions};
use qkv::models::decoder::{Decoder, DecoderConfig, ScaledLora, Segment, WeightLayout};
use qkv::sample::SamplerConfig;
use qkv::weights::gguf::{write_gguf, MetaValue};
use qkv::weights::{FloatType, WeightFormat};
use qkv::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;

const VOCAB: usize = 100;

fn synthetic() -> Decoder {
    let config = DecoderConfig::llama(64, 2, 4, 2, 128, VOCAB, 256, WeightLayout::Gguf);
    Decoder::synthetic(config, 7, FloatType::F32).unwrap()
}

fn scaled(adapter: &Arc<qkv::models::decoder::LoraAdapter>, scale: f32) -> ScaledLora {
    ScaledLora {
        adapter: adapter.clone(),
        scale,
    }
}

/// The last-token logits of `tokens` run alone, under `lora`.
fn alone(model: &Decoder, tokens: &[u32], lora: &[ScaledLora]) -> Vec<f32> {
    let mut state = model.new_state(64, FloatType::F32, 16).unwrap();
    state.set_lora(lora.to_vec());
    let mut logits = vec![0.0; VOCAB];
    model
        .forward(&mut state, tokens, 0, Some(&mut logits))
        .unwrap();
    logits
}

#[test]
fn a_sequence_gets_the_same_bits_in_a_batch_of_other_adapters() {
    let model = synthetic();
    let a = Arc::new(model.synthetic_lora(4, 8.0, 1).unwrap());
    let b = Arc::new(model.synthetic_lora(2, 0.0, 2).unwrap());
    let sets: [Vec<ScaledLora>; 5] = [
        vec![scaled(&a, 1.0)],
        vec![],
        vec![scaled(&b, 2.0), scaled(&a, 0.5)],
        vec![scaled(&a, 0.0)],
        vec![scaled(&b, -1.0)],
    ];
    let prompts: [&[u32]; 5] = [&[1, 2, 3], &[4, 5, 6, 7], &[8, 9], &[1, 2, 3], &[10]];
    let solo: Vec<Vec<f32>> = prompts
        .iter()
        .zip(&sets)
        .map(|(p, l)| alone(&model, p, l))
        .collect();
    // No adapter, or one at scale 0, is the base model bit for bit; an adapter changes it.
    assert_eq!(solo[3], alone(&model, prompts[3], &[]));
    assert_ne!(solo[0], solo[3]);
    assert_ne!(solo[4], alone(&model, prompts[4], &[]));

    let mut caches: Vec<_> = (0..5)
        .map(|_| model.new_cache(64, FloatType::F32).unwrap())
        .collect();
    let mut scratch = model.new_scratch(32).unwrap();
    let mut logits = vec![0.0; 5 * VOCAB];
    let mut segments: Vec<Segment<'_>> = caches
        .iter_mut()
        .zip(prompts.iter().zip(&sets))
        .map(|(cache, (p, l))| Segment {
            cache,
            tokens: p,
            pos0: 0,
            logits: 1,
            lora: l,
        })
        .collect();
    model
        .forward_batch(&mut segments, &mut scratch, &mut logits)
        .unwrap();
    for (i, want) in solo.iter().enumerate() {
        assert_eq!(
            &logits[i * VOCAB..(i + 1) * VOCAB],
            &want[..],
            "segment {i}"
        );
    }
}

#[test]
fn the_engine_mixes_adapters_and_keeps_their_caches_apart() {
    let decoder = synthetic();
    let a = Arc::new(decoder.synthetic_lora(4, 8.0, 3).unwrap());
    let model = Arc::new(Model::from_parts(decoder, None));
    let options = EngineOptions {
        context: 64,
        max_sequences: 4,
        ..EngineOptions::default()
    };
    let prompt = vec![5u32, 6, 7, 8, 9];
    let request = |lora: Vec<ScaledLora>| GenRequest {
        ignore_eos: true,
        lora,
        ..GenRequest::new(prompt.clone(), SamplerConfig::greedy(), 6)
    };
    let run = |engine: &mut Engine| {
        let mut events = Vec::new();
        while !engine.is_idle() {
            engine.step(&mut events).unwrap();
        }
        events
    };
    let tokens = |events: &[Event], id| -> Vec<(u32, f32)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Token {
                    seq,
                    token,
                    logprob,
                    ..
                } if *seq == id => Some((*token, *logprob)),
                _ => None,
            })
            .collect()
    };
    // Each alone.
    let mut solo = Vec::new();
    for lora in [vec![], vec![scaled(&a, 1.0)], vec![scaled(&a, 0.25)]] {
        let mut e = Engine::new(model.clone(), options.clone()).unwrap();
        let id = e.submit(request(lora)).unwrap();
        solo.push(tokens(&run(&mut e), id));
    }
    assert_ne!(solo[0], solo[1]);
    // Together, then again: the second round finds the first round's caches, and may reuse
    // only the one made under the same adapters.
    let mut e = Engine::new(model.clone(), options).unwrap();
    for round in 0..2 {
        let ids = [
            e.submit(request(vec![])).unwrap(),
            e.submit(request(vec![scaled(&a, 1.0)])).unwrap(),
            e.submit(request(vec![scaled(&a, 0.25)])).unwrap(),
        ];
        let events = run(&mut e);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(tokens(&events, *id), solo[i], "round {round}, request {i}");
        }
    }
    // An adapter of another model is refused.
    let other = synthetic();
    let foreign = Arc::new(other.synthetic_lora(2, 4.0, 1).unwrap());
    let err = e.submit(request(vec![scaled(&foreign, 1.0)])).unwrap_err();
    assert!(matches!(err, Error::ForeignState { .. }), "{err}");
}

/// A GGUF adapter for the synthetic model, with `extra` metadata replacing the defaults and
/// the tensors given as `(name, shape, values)`.
fn write_adapter(
    name: &str,
    meta: &[(&str, MetaValue)],
    tensors: &[(&str, Vec<usize>, Vec<f32>)],
) -> PathBuf {
    let dir = common::temp_dir("lora");
    let path = dir.join(format!("{name}.gguf"));
    let mut metadata: Vec<(String, MetaValue)> = vec![
        (
            "general.architecture".into(),
            MetaValue::String("llama".into()),
        ),
        ("general.type".into(), MetaValue::String("adapter".into())),
        ("adapter.type".into(), MetaValue::String("lora".into())),
        ("adapter.lora.alpha".into(), MetaValue::F32(8.0)),
    ];
    for (k, v) in meta {
        match metadata.iter_mut().find(|(key, _)| key == k) {
            Some(slot) => slot.1 = v.clone(),
            None => metadata.push((k.to_string(), v.clone())),
        }
    }
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let tensors: Vec<(String, Vec<usize>, WeightFormat, &[u8])> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| (n.to_string(), s.clone(), WeightFormat::F32, &b[..]))
        .collect();
    write_gguf(&path, &metadata, &tensors).unwrap();
    path
}

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect()
}

/// The error inside an [`Error::InFile`] naming `path`.
fn inner(e: Error, path: &Path) -> Error {
    match e {
        Error::InFile { path: p, source } if p == path => *source,
        other => panic!("expected an error in {}, got {other}", path.display()),
    }
}

#[test]
fn adapters_are_checked_against_the_model() {
    let model = synthetic();
    let (r, d, kvd) = (4, 64, 32);
    let a = |name: &'static str| (name, vec![r, d], values(r * d));
    let good = write_adapter(
        "good",
        &[],
        &[
            a("blk.0.attn_v.weight.lora_a"),
            ("blk.0.attn_v.weight.lora_b", vec![kvd, r], values(kvd * r)),
            ("blk.1.attn_norm.weight", vec![d], values(d)),
        ],
    );
    let adapter = model.load_lora(&good).unwrap();
    assert_eq!((adapter.matrices(), adapter.alpha()), (1, 8.0));
    assert!(adapter.is_for(&model));

    type Check = Box<dyn Fn(&Error) -> bool>;
    let cases: Vec<(&str, PathBuf, Check)> = vec![
        (
            "not an adapter",
            write_adapter(
                "model",
                &[("general.type", MetaValue::String("model".into()))],
                &[],
            ),
            Box::new(|e| matches!(e, Error::Config(m) if m.contains("general.type"))),
        ),
        (
            "another architecture",
            write_adapter(
                "qwen",
                &[("general.architecture", MetaValue::String("qwen2".into()))],
                &[],
            ),
            Box::new(|e| matches!(e, Error::Config(m) if m.contains("qwen2"))),
        ),
        (
            "a lone A",
            write_adapter("lone", &[], &[a("blk.0.attn_q.weight.lora_a")]),
            Box::new(
                |e| matches!(e, Error::MissingTensor { name } if name == "blk.0.attn_q.weight.lora_b"),
            ),
        ),
        (
            "B of the wrong rows",
            write_adapter(
                "rows",
                &[],
                &[
                    a("blk.0.attn_k.weight.lora_a"),
                    ("blk.0.attn_k.weight.lora_b", vec![d, r], values(d * r)),
                ],
            ),
            Box::new(|e| {
                matches!(e, Error::TensorShape { name, expected, .. }
                    if name == "blk.0.attn_k.weight.lora_b" && expected[..] == [32, 4])
            }),
        ),
        (
            "A of another width",
            write_adapter(
                "width",
                &[],
                &[
                    ("blk.0.ffn_down.weight.lora_a", vec![r, d], values(r * d)),
                    ("blk.0.ffn_down.weight.lora_b", vec![d, r], values(d * r)),
                ],
            ),
            Box::new(
                |e| matches!(e, Error::TensorShape { name, .. } if name == "blk.0.ffn_down.weight.lora_a"),
            ),
        ),
        (
            "a layer the model lacks",
            write_adapter(
                "layer",
                &[],
                &[
                    a("blk.9.attn_q.weight.lora_a"),
                    ("blk.9.attn_q.weight.lora_b", vec![d, r], values(d * r)),
                ],
            ),
            Box::new(
                |e| matches!(e, Error::MissingTensor { name } if name.starts_with("blk.9.attn_q.weight")),
            ),
        ),
        (
            "the embedding",
            write_adapter(
                "embd",
                &[],
                &[
                    a("token_embd.weight.lora_a"),
                    (
                        "token_embd.weight.lora_b",
                        vec![VOCAB, r],
                        values(VOCAB * r),
                    ),
                ],
            ),
            Box::new(|e| matches!(e, Error::Unsupported(m) if m.contains("token_embd.weight"))),
        ),
        (
            "the head of a model whose head is its embedding",
            write_adapter(
                "head",
                &[],
                &[
                    a("output.weight.lora_a"),
                    ("output.weight.lora_b", vec![VOCAB, r], values(VOCAB * r)),
                ],
            ),
            Box::new(
                |e| matches!(e, Error::MissingTensor { name } if name.starts_with("output.weight")),
            ),
        ),
        (
            "a NaN in B",
            write_adapter(
                "nan_b",
                &[],
                &[
                    a("blk.0.attn_output.weight.lora_a"),
                    ("blk.0.attn_output.weight.lora_b", vec![d, r], {
                        let mut v = values(d * r);
                        v[5] = f32::NAN;
                        v
                    }),
                ],
            ),
            Box::new(
                |e| matches!(e, Error::Config(m) if m.contains("blk.0.attn_output.weight.lora_b")),
            ),
        ),
    ];
    for (what, path, ok) in cases {
        let e = inner(model.load_lora(&path).unwrap_err(), &path);
        assert!(ok(&e), "{what}: {e}");
    }
    // An adapter runs only on the model it was checked against.
    let other = synthetic();
    let mut state = other.new_state(16, FloatType::F32, 4).unwrap();
    state.set_lora(vec![scaled(&Arc::new(adapter), 1.0)]);
    let err = other.forward(&mut state, &[1], 0, None).unwrap_err();
    assert!(matches!(err, Error::ForeignState { .. }), "{err}");
}

// ------------------------------------------------------------ against transformers+peft

/// The largest distance from peft's logits `want`, as a share of their range.
fn distance(got: &[f32], want: &[f32]) -> f32 {
    common::share_of_range(got, want, common::range_of(want))
}

/// Allowed distance from peft's f32 logits, as a share of their range.
const TOLERANCE: f32 = 1e-4;

#[test]
fn network_lora_logits_match_peft() {
    let Some(dir) = common::reference_dir(
        "QKV_LORA_DIR",
        "lora",
        "reference.json",
        "tools/lora_fixture.py",
    ) else {
        return;
    };
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let prompt: Vec<u32> = reference["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let model = Model::load(&dir.join("base.gguf"), &ModelOptions::default()).unwrap();
    let decoder = model.decoder();
    let vocab = model.vocab_size();
    let load = |name: &str| Arc::new(decoder.load_lora(&dir.join(name)).unwrap());
    let first = load("first-f32.gguf");
    let second = load("second-f32.gguf");
    // Every projection of both layers and the output head; q, v and down of both layers.
    assert_eq!((first.matrices(), second.matrices()), (15, 6));
    // Every position's logits, the prompt in chunks of 5 (so that passes are cut mid-prompt).
    let logits = |lora: Vec<ScaledLora>| {
        let mut state = decoder.new_state(64, FloatType::F32, 5).unwrap();
        state.set_lora(lora);
        let mut out = vec![0.0; prompt.len() * vocab];
        decoder
            .forward_all(&mut state, &prompt, 0, &mut out)
            .unwrap();
        out
    };
    let base = logits(vec![]);
    let cases = [
        ("base", base.clone()),
        ("base", logits(vec![scaled(&first, 0.0)])),
        ("first_1", logits(vec![scaled(&first, 1.0)])),
        ("first_1_merged", logits(vec![scaled(&first, 1.0)])),
        ("first_0.5", logits(vec![scaled(&first, 0.5)])),
        (
            "first_1_second_2",
            logits(vec![scaled(&second, 2.0), scaled(&first, 1.0)]),
        ),
    ];
    for (case, got) in &cases {
        let want = common::read_f32s(&dir.join(format!("{case}.bin")));
        let d = distance(got, &want);
        eprintln!("{case}: {d:.2e} of the range from peft");
        assert!(d <= TOLERANCE, "{case}: {d:e} of the range from peft");
        if *case != "base" {
            assert!(
                distance(&base, &want) > 100.0 * TOLERANCE,
                "{case} changes nothing"
            );
        }
    }
    // The converter's f16 and q8_0 files, against peft with A and B rounded as they hold them.
    for (name, case) in [
        ("first-f16.gguf", "first_1_f16"),
        ("first-q8_0.gguf", "first_1_q8_0"),
    ] {
        let got = logits(vec![scaled(&load(name), 1.0)]);
        let want = common::read_f32s(&dir.join(format!("{case}.bin")));
        let d = distance(&got, &want);
        eprintln!("{name}: {d:.2e} of the range from peft");
        assert!(d <= TOLERANCE, "{name}: {d:e} of the range from peft");
    }
}
