//! Unit tests of the decoder: names, RoPE scaling, validation, state checks.

use super::state::kv_cache;
use super::*;
use crate::alloc::{zeroed, zeroed_for};
use half::f16;

#[test]
fn hf_names_follow_transformers() {
    let hf = DecoderConfig {
        layout: WeightLayout::HuggingFace,
        ..tiny(1)
    };
    assert_eq!(
        layer_name(&hf, 3, "attn_q", "weight"),
        "model.layers.3.self_attn.q_proj.weight"
    );
    assert_eq!(
        layer_name(&hf, 0, "ffn_norm", "weight"),
        "model.layers.0.post_attention_layernorm.weight"
    );
    // Gemma's sandwich: the same HF name is the norm after attention.
    let gemma = DecoderConfig {
        sandwich_norms: true,
        ..hf.clone()
    };
    assert_eq!(
        layer_name(&gemma, 0, "ffn_norm", "weight"),
        "model.layers.0.pre_feedforward_layernorm.weight"
    );
    assert_eq!(
        layer_name(&gemma, 0, "post_attention_norm", "weight"),
        "model.layers.0.post_attention_layernorm.weight"
    );
    assert_eq!(
        layer_name(&tiny(1), 7, "attn_q", "bias"),
        "blk.7.attn_q.bias"
    );
}

#[test]
fn llama3_scaling_follows_transformers() {
    // transformers' llama3 frequencies for head_dim 16, base 10000, factor 8, low 1,
    // high 4, original context 256 (printed by `_compute_llama3_parameters`): pairs 0-2
    // kept, pair 3 smoothed, pairs 4-7 divided by 8.
    let rope = Rope {
        base: 10000.0,
        scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context: 256.0,
        },
    };
    let plain = inv_freq(16, 10000.0).unwrap();
    let table = rope_table(&rope, 16, 2, None).unwrap();
    let sin1 = table.sin(1).unwrap();
    for i in 0..8 {
        let want = match i {
            0..=2 => plain[i],
            3 => {
                let wl = 2.0 * std::f32::consts::PI / plain[3];
                let s = (256.0 / wl - 1.0) / 3.0;
                (1.0 - s) * plain[3] / 8.0 + s * plain[3]
            }
            _ => plain[i] / 8.0,
        };
        assert!(
            (sin1[i] - (want as f64).sin() as f32).abs() < 1e-7,
            "pair {i}"
        );
    }
}

#[test]
// The frequencies as transformers prints them (f32 values written out in full).
#[allow(clippy::excessive_precision, clippy::type_complexity)]
fn yarn_scaling_follows_transformers() {
    // transformers' `_compute_yarn_parameters` for head_dim 32 (printed): base 10000,
    // factor 4, original context 32, default betas and attention factor; then base 1e6,
    // factor 8, original 4096, betas 16 and 2, no truncation, attention factor 1.25.
    let cases: [(f32, f32, f32, f32, f32, bool, [f32; 16]); 2] = [
        (
            10000.0,
            4.0,
            32.0,
            32.0,
            1.0,
            true,
            [
                1.0,
                0.421_755_97,
                0.158_113_88,
                0.044_456_985,
                0.025,
                0.014_058_532,
                0.007_905_695,
                0.004_445_698_6,
                0.0025,
                0.001_405_853_3,
                0.000_790_569_47,
                0.000_444_569_86,
                0.000_250_000_01,
                0.000_140_585_33,
                7.905_694_7e-5,
                4.445_698_5e-5,
            ],
        ),
        (
            1e6,
            8.0,
            4096.0,
            16.0,
            2.0,
            false,
            [
                1.0,
                0.421_696_51,
                0.177_827_94,
                0.074_989_416,
                0.031_622_78,
                0.009_912_078,
                0.002_136_700_6,
                0.000_296_421_73,
                0.000_125_000_01,
                5.271_206e-5,
                2.222_849_3e-5,
                9.373_678e-6,
                3.952_846_8e-6,
                1.666_901_8e-6,
                7.029_267e-7,
                2.964_217_2e-7,
            ],
        ),
    ];
    for (base, factor, original, fast, slow, truncate, want) in cases {
        let mut freqs = inv_freq(32, base).unwrap();
        yarn_inv_freq(
            &mut freqs,
            base,
            32,
            factor,
            original,
            (fast, slow),
            truncate,
        );
        for (i, (g, w)) in freqs.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 2.0 * f32::EPSILON * w,
                "pair {i}: {g} vs {w}"
            );
        }
    }
    let scaling = RopeScaling::Yarn {
        factor: 4.0,
        original_context: 32.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: config::yarn_mscale(4.0, 1.0) as f32,
        truncate: true,
    };
    assert!((scaling.attention_factor() - 1.138_629_4).abs() < 1e-7);
}

#[test]
fn config_validation_names_the_fault() {
    let good = tiny(1);
    good.validate().unwrap();
    let bad = DecoderConfig {
        kv_heads: 3,
        ..good.clone()
    };
    assert!(bad.validate().unwrap_err().to_string().contains("KV heads"));
    let bad = DecoderConfig {
        head_dim: 3,
        ..good.clone()
    };
    assert!(bad.validate().unwrap_err().to_string().contains("odd"));
    let bad = DecoderConfig {
        windows: vec![Some(0)],
        ..good.clone()
    };
    assert!(matches!(bad.validate(), Err(Error::Config(_))));
    let bad = DecoderConfig {
        attn_softcap: Some(f32::NAN),
        ..good.clone()
    };
    assert!(bad.validate().unwrap_err().to_string().contains("soft-cap"));
    let bad = DecoderConfig {
        rms_eps: 0.0,
        ..good.clone()
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("RMS epsilon"));
    let bad = DecoderConfig {
        context: MAX_CONTEXT + 1,
        ..good
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("context length"));
}

fn tiny(layers: usize) -> DecoderConfig {
    DecoderConfig {
        head_dim: 4,
        ..DecoderConfig::llama(8, layers, 2, 1, 16, 10, 32, WeightLayout::Gguf)
    }
}

/// A source with no tensors at all.
struct Empty;

impl TensorSource for Empty {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        Err(Error::MissingTensor { name: name.into() })
    }
    fn contains(&self, _: &str) -> bool {
        false
    }
    fn names(&self) -> Vec<String> {
        Vec::new()
    }
}

#[test]
fn an_absurd_block_count_is_refused_before_any_allocation() {
    let err = Decoder::load(
        tiny(u32::MAX as usize),
        &Empty,
        Some(FloatType::F32),
        &Default::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("blocks"), "{err}");
    // A plausible count: the first missing tensor is named.
    let err = Decoder::load(
        tiny(MAX_LAYERS),
        &Empty,
        Some(FloatType::F32),
        &Default::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::MissingTensor { .. }), "{err}");
}

#[test]
fn a_cache_the_allocator_refuses_is_an_allocation_error() {
    assert_eq!(zeroed::<f16>(5, || kv_cache(1)).unwrap(), [f16::ZERO; 5]);
    assert!(zeroed::<f32>(0, || kv_cache(1)).unwrap().is_empty());
    // Past the address space: the layout itself overflows, or the allocator says no.
    // (black_box: an allocation nobody reads may be optimised away, failure included.)
    for len in [usize::MAX / 2, 1 << 60] {
        match std::hint::black_box(zeroed::<f32>(len, || kv_cache(12345))) {
            Err(Error::AllocationRefused { what, bytes }) => {
                assert!(what.contains("12345 positions"), "{what}");
                assert_eq!(bytes, len.saturating_mul(4));
            }
            other => panic!("{len} elements: {:?}", other.map(|v| v.len())),
        }
    }
    match zeroed_for::<f32>(&[usize::MAX, 2], || "a product that overflows".into()) {
        Err(Error::AllocationRefused { bytes, .. }) => assert_eq!(bytes, usize::MAX),
        other => panic!("{:?}", other.map(|v| v.len())),
    }
}

#[test]
fn forward_refuses_a_foreign_state_and_a_gap_in_the_cache() {
    let small = Decoder::synthetic(tiny(1), 1, FloatType::F32).unwrap();
    let big = Decoder::synthetic(tiny(2), 1, FloatType::F32).unwrap();
    let mut state = small.new_state(16, FloatType::F32, 4).unwrap();
    let err = big.forward(&mut state, &[1, 2], 0, None).unwrap_err();
    assert!(err.to_string().contains("made by another model"), "{err}");
    assert!(
        matches!(err, Error::ForeignState { state: "KV cache", made_by, used_with }
            if made_by == small.id && used_with == big.id),
        "{err}"
    );
    // The same shape, other weights: its cache would be wrong for this model.
    let twin = Decoder::synthetic(tiny(1), 2, FloatType::F32).unwrap();
    let err = twin.forward(&mut state, &[1, 2], 0, None).unwrap_err();
    assert!(matches!(err, Error::ForeignState { .. }), "{err}");

    let mut logits = vec![0.0; 10];
    let err = small.forward(&mut state, &[1], 1, None).unwrap_err();
    assert!(
        err.to_string().contains("holds only positions 0..0"),
        "{err}"
    );
    small.forward(&mut state, &[1, 2, 3], 0, None).unwrap();
    small
        .forward(&mut state, &[4], 3, Some(&mut logits))
        .unwrap();
    assert!(small.forward(&mut state, &[5], 5, None).is_err());
    // Rewinding is allowed, and forgets what came after.
    small.forward(&mut state, &[6], 1, None).unwrap();
    assert!(small.forward(&mut state, &[7], 3, None).is_err());
    small
        .forward(&mut state, &[7], 2, Some(&mut logits))
        .unwrap();
    assert!(logits.iter().all(|x| x.is_finite()));
}

#[test]
fn a_batched_pass_gives_each_sequence_its_own_logits() {
    // Gemma 3's shape exercises windows, QK-norm and the local RoPE in the batched pass.
    let config = DecoderConfig {
        family: Family::Gemma3,
        qk_norm: true,
        sandwich_norms: true,
        norm_plus_one: true,
        activation: Activation::GeluTanh,
        embed_scale: Some(4.0),
        rope_local: Some(Rope {
            base: 100.0,
            scaling: RopeScaling::None,
        }),
        windows: vec![Some(3), None],
        ..DecoderConfig::llama(16, 2, 4, 2, 32, 50, 64, WeightLayout::Gguf)
    };
    let model = Decoder::synthetic(config, 3, FloatType::F32).unwrap();
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5, 6, 7], &[8], &[9, 10, 11]];
    let vocab = 50;
    // Alone: each prompt, then two steps.
    let alone: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .map(|p| {
            let mut st = model.new_state(32, FloatType::F32, 8).unwrap();
            let mut out = vec![vec![0.0; vocab]; 3];
            model.forward(&mut st, p, 0, Some(&mut out[0])).unwrap();
            for (i, tok) in [20u32, 21].into_iter().enumerate() {
                model
                    .forward(&mut st, &[tok], p.len() + i, Some(&mut out[i + 1]))
                    .unwrap();
            }
            out
        })
        .collect();
    // Together: the prompts in one pass, then the steps.
    let mut caches: Vec<KvCache> = (0..3)
        .map(|_| model.new_cache(32, FloatType::F32).unwrap())
        .collect();
    let mut scratch = model.new_scratch(16).unwrap();
    let mut logits = vec![0.0; 3 * vocab];
    for step in 0..3 {
        let toks = [20u32, 21];
        let mut segs: Vec<Segment<'_>> = caches
            .iter_mut()
            .zip(prompts)
            .map(|(cache, p)| Segment {
                cache,
                tokens: if step == 0 { p } else { &toks[step - 1..step] },
                pos0: if step == 0 { 0 } else { p.len() + step - 1 },
                logits: 1,
                lora: &[],
            })
            .collect();
        model
            .forward_batch(&mut segs, &mut scratch, &mut logits)
            .unwrap();
        for (i, want) in alone.iter().enumerate() {
            let got = &logits[i * vocab..(i + 1) * vocab];
            for (g, w) in got.iter().zip(&want[step]) {
                assert!((g - w).abs() < 1e-5, "sequence {i} step {step}: {g} vs {w}");
            }
        }
    }
    // Too many rows for the scratch, or a logits buffer of the wrong size: refused.
    let long = [1u32; 17];
    let err = model
        .forward_batch(
            &mut [Segment {
                cache: &mut caches[0],
                tokens: &long,
                pos0: 0,
                logits: 0,
                lora: &[],
            }],
            &mut scratch,
            &mut [],
        )
        .unwrap_err();
    assert!(err.to_string().contains("scratch holds 16"), "{err}");
    let err = model
        .forward_batch(
            &mut [Segment {
                cache: &mut caches[0],
                tokens: &[1],
                pos0: 0,
                logits: 1,
                lora: &[],
            }],
            &mut scratch,
            &mut [0.0; 3],
        )
        .unwrap_err();
    assert!(matches!(err, Error::Shape(_)), "{err}");
}
