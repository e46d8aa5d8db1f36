//! The configuration readers: what each family's keys become, and what is refused by name.

use super::*;
use crate::weights::gguf::{write_gguf, GgufFile, MetaValue};
use std::path::PathBuf;

/// A scratch file named `name` in a directory of this test process.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-decoder-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn hf(name: &str, json: &str) -> Result<DecoderConfig> {
    let path = scratch(name);
    std::fs::write(&path, json).unwrap();
    DecoderConfig::from_hf_json(&path)
}

const SMOLLM: &str = r#"{"model_type":"llama","hidden_size":576,"num_hidden_layers":30,
    "num_attention_heads":9,"num_key_value_heads":3,"intermediate_size":1536,
    "vocab_size":49152,"max_position_embeddings":8192,"rope_theta":100000.0,
    "rms_norm_eps":1e-5,"tie_word_embeddings":true}"#;

#[test]
fn hf_config_reads_smollm_style_json() {
    let c = hf("smollm.json", SMOLLM).unwrap();
    assert_eq!((c.dim, c.heads, c.kv_heads, c.head_dim), (576, 9, 3, 64));
    assert_eq!(
        (c.layout, c.family),
        (WeightLayout::HuggingFace, Family::Llama)
    );
    assert_eq!(c.rope.base, 100000.0);
    assert_eq!(c.windows, vec![None; 30]);
    // transformers 5 nests the RoPE parameters.
    let v5 = SMOLLM.replace(
        r#""rope_theta":100000.0"#,
        r#""rope_parameters":{"rope_theta":50000.0,"rope_type":"default"}"#,
    );
    assert_eq!(hf("v5.json", &v5).unwrap().rope.base, 50000.0);
    let scaled = SMOLLM.replace(
        r#""rope_theta":100000.0"#,
        r#""rope_parameters":{"rope_theta":50000.0,"rope_type":"llama3","factor":32.0,
            "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}"#,
    );
    assert!(matches!(
        hf("llama3.json", &scaled).unwrap().rope.scaling,
        RopeScaling::Llama3 { factor: 32.0, .. }
    ));
    // Attention biases run in the Llama family; Mistral's window applies to every layer.
    let c = hf(
        "bias.json",
        &SMOLLM.replacen('}', r#","attention_bias":true}"#, 1),
    )
    .unwrap();
    assert!(c.qkv_bias && c.out_bias);
    let mistral =
        SMOLLM
            .replace(r#""llama""#, r#""mistral""#)
            .replacen('}', r#","sliding_window":4096}"#, 1);
    assert_eq!(
        hf("mistral.json", &mistral).unwrap().windows,
        vec![Some(4096); 30]
    );
}

#[test]
fn hf_config_refuses_what_it_cannot_run_by_key_and_value() {
    for (what, from, to, key) in [
        ("activation", "}", r#","hidden_act":"gelu"}"#, "hidden_act"),
        ("MLP bias", "}", r#","mlp_bias":true}"#, "mlp_bias"),
        (
            "LongRoPE",
            r#""rope_theta":100000.0"#,
            r#""rope_parameters":{"rope_type":"longrope","factor":4.0}"#,
            "rope_type",
        ),
        (
            "partial rotation",
            "}",
            r#","partial_rotary_factor":0.5}"#,
            "partial_rotary_factor",
        ),
        ("architecture", r#""llama""#, r#""falcon""#, "model_type"),
        (
            "layer type",
            "}",
            r#","layer_types":["chunked_attention"]}"#,
            "layer_types",
        ),
        (
            "bidirectional",
            "}",
            r#","use_bidirectional_attention":true}"#,
            "use_bidirectional_attention",
        ),
    ] {
        let e = hf("bad.json", &SMOLLM.replacen(from, to, 1)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Unsupported(_)), "{what}: {msg}");
        assert!(
            msg.contains(key) && msg.contains("bad.json"),
            "{what}: {msg}"
        );
    }
    let e = hf("broken.json", "{").unwrap_err();
    assert!(e.to_string().contains("broken.json"), "{e}");
    let e = hf("short.json", r#"{"model_type":"llama"}"#).unwrap_err();
    assert!(e.to_string().contains("hidden_size"), "{e}");
    let e = hf(
        "zero.json",
        &SMOLLM.replace(r#""num_key_value_heads":3"#, r#""num_key_value_heads":2"#),
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::InFile { source, .. } if matches!(**source, Error::Config(_))),
        "{e}"
    );
}

/// A vocabulary-only GGUF of architecture `arch` with `keys` (under `arch.`) and no tensors.
fn gguf(name: &str, arch: &str, keys: &[(&str, MetaValue)]) -> Result<DecoderConfig> {
    let mut meta = vec![(
        "general.architecture".to_owned(),
        MetaValue::String(arch.into()),
    )];
    let base = [
        ("embedding_length", MetaValue::U32(64)),
        ("block_count", MetaValue::U32(6)),
        ("feed_forward_length", MetaValue::U32(128)),
        ("context_length", MetaValue::U32(512)),
        ("vocab_size", MetaValue::U32(100)),
        ("attention.head_count", MetaValue::U32(4)),
        ("attention.head_count_kv", MetaValue::U32(2)),
        ("attention.layer_norm_rms_epsilon", MetaValue::F32(1e-6)),
    ];
    for (k, v) in base.into_iter().chain(keys.iter().cloned()) {
        meta.retain(|(old, _)| *old != format!("{arch}.{k}"));
        meta.push((format!("{arch}.{k}"), v));
    }
    let path = scratch(name);
    write_gguf(&path, &meta, &[]).unwrap();
    DecoderConfig::from_gguf(&GgufFile::open(&path)?)
}

#[test]
fn gguf_families_read_their_keys() {
    let g2 = gguf("g2.gguf", "gemma2", &[]).unwrap();
    // Gemma 2 defaults: 4096-wide window on even layers, soft-capped scores.
    assert_eq!(g2.windows[..2], [Some(4096), None]);
    assert_eq!(g2.attn_softcap, Some(50.0));
    assert!(g2.sandwich_norms && !g2.norm_plus_one && g2.embed_scale == Some(8.0));
    assert_eq!(g2.rope_style, RopeStyle::SplitHalf);
    let g3 = gguf(
        "g3.gguf",
        "gemma3",
        &[
            ("attention.sliding_window", MetaValue::U32(16)),
            ("rope.scaling.type", MetaValue::String("linear".into())),
            ("rope.scaling.factor", MetaValue::F32(8.0)),
        ],
    )
    .unwrap();
    assert_eq!(
        g3.windows,
        [Some(16), Some(16), Some(16), Some(16), Some(16), None]
    );
    assert_eq!(g3.rope.scaling, RopeScaling::Linear { factor: 8.0 });
    assert_eq!(g3.rope_local.as_ref().unwrap().scaling, RopeScaling::None);
    assert!(g3.qk_norm && g3.attn_softcap.is_none());
    let llama = gguf("llama.gguf", "llama", &[]).unwrap();
    assert_eq!(llama.rope_style, RopeStyle::AdjacentPairs);
    assert_eq!(llama.windows, vec![None; 6]);
    // An explicit pattern of flags wins over the family's period.
    let flags = MetaValue::Array(
        crate::weights::gguf::MetaValueType::Bool,
        [true, false, true, false, true, false]
            .map(MetaValue::Bool)
            .to_vec(),
    );
    let p = gguf(
        "pattern.gguf",
        "gemma3",
        &[
            ("attention.sliding_window", MetaValue::U32(8)),
            ("attention.sliding_window_pattern", flags),
        ],
    )
    .unwrap();
    assert_eq!(p.windows, [Some(8), None, Some(8), None, Some(8), None]);
}

#[test]
fn gguf_refuses_unknown_architectures_and_keys_by_name() {
    for (arch, key, value, named) in [
        ("falcon", "", MetaValue::U32(0), "`falcon`"),
        (
            "llama",
            "attention.clamp_kqv",
            MetaValue::F32(8.0),
            "llama.attention.clamp_kqv",
        ),
        (
            "llama",
            "rope.scaling.type",
            MetaValue::String("longrope".into()),
            "\"longrope\"",
        ),
        (
            "qwen3",
            "rope.scaling.type",
            MetaValue::String("yarn".into()),
            "qwen3.rope.scaling.factor",
        ),
        (
            "qwen2",
            "rope.dimension_count",
            MetaValue::U32(8),
            "partial rotary",
        ),
        (
            "qwen3",
            "expert_count",
            MetaValue::U32(8),
            "mixture of experts",
        ),
        (
            "llama",
            "expert_count",
            MetaValue::U32(8),
            "expert_used_count",
        ),
        ("qwen3moe", "", MetaValue::U32(0), "qwen3moe.expert_count"),
        (
            "llama",
            "attention.value_length",
            MetaValue::U32(32),
            "value_length",
        ),
    ] {
        let keys: Vec<(&str, MetaValue)> = if key.is_empty() {
            vec![]
        } else {
            vec![(key, value)]
        };
        let e = gguf("refused.gguf", arch, &keys).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Unsupported(_)), "{arch} {key}: {msg}");
        assert!(msg.contains(named) && msg.contains("refused.gguf"), "{msg}");
    }
}

/// A qwen3moe GGUF's keys with 8 experts, 2 used, experts 32 wide, and `extra`.
fn qwen3moe(name: &str, extra: &[(&str, MetaValue)]) -> Result<DecoderConfig> {
    let mut keys = vec![
        ("expert_count", MetaValue::U32(8)),
        ("expert_used_count", MetaValue::U32(2)),
        ("expert_feed_forward_length", MetaValue::U32(32)),
    ];
    keys.extend(extra.iter().cloned());
    gguf(name, "qwen3moe", &keys)
}

#[test]
fn gguf_mixtures_of_experts_and_yarn_read_their_keys() {
    let c = qwen3moe("moe.gguf", &[]).unwrap();
    let m = c.moe.as_ref().unwrap();
    assert_eq!((m.experts, m.used, m.expert_ffn), (8, 2, 32));
    assert!(m.norm_topk && m.shared_ffn.is_none() && c.qk_norm);
    assert_eq!(c.rope_style, RopeStyle::SplitHalf);
    let q2 = gguf(
        "q2moe.gguf",
        "qwen2moe",
        &[
            ("expert_count", MetaValue::U32(4)),
            ("expert_used_count", MetaValue::U32(4)),
            ("expert_feed_forward_length", MetaValue::U32(16)),
            ("expert_shared_feed_forward_length", MetaValue::U32(48)),
        ],
    )
    .unwrap();
    let m = q2.moe.unwrap();
    assert!(!m.norm_topk && m.shared_ffn == Some(48));
    // Mixtral: the llama architecture, experts as wide as feed_forward_length.
    let mixtral = gguf(
        "mixtral.gguf",
        "llama",
        &[
            ("expert_count", MetaValue::U32(8)),
            ("expert_used_count", MetaValue::U32(2)),
        ],
    )
    .unwrap();
    let m = mixtral.moe.unwrap();
    assert!(m.norm_topk && m.expert_ffn == 128);
    assert_eq!(mixtral.rope_style, RopeStyle::AdjacentPairs);
    let yarn = gguf(
        "yarn.gguf",
        "qwen3",
        &[
            ("rope.scaling.type", MetaValue::String("yarn".into())),
            ("rope.scaling.factor", MetaValue::F32(4.0)),
            (
                "rope.scaling.original_context_length",
                MetaValue::U32(32768),
            ),
            ("rope.scaling.yarn_beta_fast", MetaValue::F32(16.0)),
        ],
    )
    .unwrap();
    let RopeScaling::Yarn {
        factor,
        original_context,
        beta_fast,
        beta_slow,
        attention_factor,
        truncate,
    } = yarn.rope.scaling
    else {
        panic!("{:?}", yarn.rope.scaling)
    };
    assert_eq!(
        (factor, original_context, beta_fast, beta_slow, truncate),
        (4.0, 32768.0, 16.0, 1.0, true)
    );
    assert!((attention_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
}

#[test]
fn gguf_refuses_other_routers_and_expert_groups_by_key() {
    for (key, value, named) in [
        (
            "expert_gating_func",
            MetaValue::U32(2),
            "qwen3moe.expert_gating_func",
        ),
        (
            "expert_group_count",
            MetaValue::U32(4),
            "qwen3moe.expert_group_count",
        ),
        (
            "expert_weights_scale",
            MetaValue::F32(2.5),
            "qwen3moe.expert_weights_scale",
        ),
        (
            "expert_weights_norm",
            MetaValue::Bool(false),
            "qwen3moe.expert_weights_norm",
        ),
        (
            "expert_shared_feed_forward_length",
            MetaValue::U32(8),
            "qwen3moe.expert_shared_feed_forward_length",
        ),
        (
            "expert_shared_count",
            MetaValue::U32(1),
            "qwen3moe.expert_shared_count",
        ),
        ("expert_used_count", MetaValue::U32(9), "9 experts used"),
    ] {
        let e = qwen3moe("router.gguf", &[(key, value)]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(named) && msg.contains("router.gguf"),
            "{key}: {msg}"
        );
    }
    // A softmax router and a norm flag that agrees with llama.cpp's are fine.
    qwen3moe(
        "softmax.gguf",
        &[
            ("expert_gating_func", MetaValue::U32(1)),
            ("expert_weights_norm", MetaValue::Bool(true)),
        ],
    )
    .unwrap();
    let e = gguf(
        "ext.gguf",
        "qwen3",
        &[
            ("rope.scaling.type", MetaValue::String("yarn".into())),
            ("rope.scaling.factor", MetaValue::F32(4.0)),
            ("rope.scaling.original_context_length", MetaValue::U32(64)),
            ("rope.scaling.yarn_log_multiplier", MetaValue::F32(0.1)),
        ],
    )
    .unwrap_err();
    assert!(e.to_string().contains("yarn_log_multiplier"), "{e}");
}

const QWEN3_MOE: &str = r#"{"model_type":"qwen3_moe","hidden_size":64,"num_hidden_layers":2,
    "num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"intermediate_size":128,
    "moe_intermediate_size":32,"num_experts":8,"num_experts_per_tok":2,
    "norm_topk_prob":true,"decoder_sparse_step":1,"mlp_only_layers":[],
    "vocab_size":100,"max_position_embeddings":512,"rope_theta":1000000.0,
    "rms_norm_eps":1e-6}"#;

#[test]
fn hf_mixtures_of_experts_and_yarn_read_their_keys() {
    let c = hf("q3moe.json", QWEN3_MOE).unwrap();
    assert_eq!(c.family, Family::Qwen3Moe);
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (m.experts, m.used, m.expert_ffn, m.norm_topk),
        (8, 2, 32, true)
    );
    let mixtral = SMOLLM.replace(r#""llama""#, r#""mixtral""#).replacen(
        '}',
        r#","num_local_experts":8,"num_experts_per_tok":2}"#,
        1,
    );
    let c = hf("mixtral.json", &mixtral).unwrap();
    let m = c.moe.as_ref().unwrap();
    assert_eq!((m.experts, m.expert_ffn, m.norm_topk), (8, 1536, true));
    let yarn = QWEN3_MOE.replace(
        r#""rope_theta":1000000.0"#,
        r#""rope_scaling":{"type":"yarn","factor":4.0,"original_max_position_embeddings":128,
            "mscale":1.0,"mscale_all_dim":0.5}"#,
    );
    let c = hf("yarn.json", &yarn).unwrap();
    let RopeScaling::Yarn {
        attention_factor,
        original_context,
        ..
    } = c.rope.scaling
    else {
        panic!("{:?}", c.rope.scaling)
    };
    let want = (0.1 * 4f64.ln() + 1.0) / (0.05 * 4f64.ln() + 1.0);
    assert!((f64::from(attention_factor) - want).abs() < 1e-6);
    assert_eq!(original_context, 128.0);
}

#[test]
fn hf_refuses_dense_layers_and_other_routers_by_key() {
    for (from, to, key) in [
        (
            r#""mlp_only_layers":[]"#,
            r#""mlp_only_layers":[0]"#,
            "mlp_only_layers",
        ),
        (
            r#""decoder_sparse_step":1"#,
            r#""decoder_sparse_step":2"#,
            "decoder_sparse_step",
        ),
        ("}", r#","scoring_func":"sigmoid"}"#, "scoring_func"),
        ("}", r#","n_group":4}"#, "n_group"),
    ] {
        let e = hf("moe-bad.json", &QWEN3_MOE.replacen(from, to, 1)).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Unsupported(_)) && msg.contains(key),
            "{key}: {msg}"
        );
    }
    let e = hf(
        "dense-experts.json",
        &SMOLLM.replacen('}', r#","num_experts":4}"#, 1),
    )
    .unwrap_err();
    assert!(e.to_string().contains("num_experts"), "{e}");
}

/// A Hugging Face config of the family of `t` with the sizes of [`gguf`]'s base keys, a
/// window of 16 where the family runs one without `layer_types`, and experts where the
/// family needs them.
fn hf_for(t: &FamilyTraits) -> String {
    let mut json = format!(
        r#"{{"model_type":"{}","hidden_size":64,"num_hidden_layers":6,
        "num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":128,
        "vocab_size":100,"max_position_embeddings":512,"rms_norm_eps":1e-6"#,
        t.hf_model_types[0]
    );
    if !t.hf_window_needs_layer_types {
        json += r#","sliding_window":16"#;
    }
    if t.moe.experts == Experts::Required {
        json += &format!(
            r#","num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":128,
            "norm_topk_prob":{}"#,
            t.moe.gguf_norm_topk
        );
    }
    if t.moe.shared_expert {
        json += r#","shared_expert_intermediate_size":48"#;
    }
    json + "}"
}

/// The same for a GGUF file.
fn gguf_for(t: &FamilyTraits) -> Result<DecoderConfig> {
    let mut keys = Vec::new();
    if !t.hf_window_needs_layer_types {
        keys.push(("attention.sliding_window", MetaValue::U32(16)));
    }
    if t.moe.experts == Experts::Required {
        keys.push(("expert_count", MetaValue::U32(4)));
        keys.push(("expert_used_count", MetaValue::U32(2)));
    }
    if t.moe.shared_expert {
        keys.push(("expert_shared_feed_forward_length", MetaValue::U32(48)));
    }
    gguf(&format!("{}.gguf", t.gguf_arch), t.gguf_arch, &keys)
}

#[test]
fn the_family_table_and_both_readers_agree() {
    assert_eq!(
        FAMILIES.iter().map(|t| t.gguf_arch).collect::<Vec<_>>(),
        GGUF_ARCHITECTURES
    );
    let mut types: Vec<_> = FAMILIES.iter().flat_map(|t| t.hf_model_types).collect();
    let mut listed = HF_MODEL_TYPES.to_vec();
    types.sort_unstable();
    listed.sort_unstable();
    assert_eq!(types.iter().map(|t| **t).collect::<Vec<_>>(), listed);
    for t in FAMILIES {
        let f = t.family;
        assert_eq!(f.traits(), t);
        assert_eq!(Family::from_gguf_arch(t.gguf_arch), Some(f));
        for ty in t.hf_model_types {
            assert_eq!(Family::from_model_type(ty), Some(f));
        }
        let g = gguf_for(t).unwrap_or_else(|e| panic!("{f:?} from GGUF: {e}"));
        let h = hf(&format!("{}.json", t.gguf_arch), &hf_for(t))
            .unwrap_or_else(|e| panic!("{f:?} from HF: {e}"));
        for c in [&g, &h] {
            let what = format!("{f:?} {:?}", c.layout);
            assert_eq!(c.family, f, "{what}");
            assert_eq!(c.qk_norm, t.qk_norm, "{what}");
            assert_eq!(c.sandwich_norms, t.sandwich_norms, "{what}");
            assert_eq!(c.activation, t.activation, "{what}");
            assert_eq!(
                c.embed_scale,
                t.embed_scale_sqrt_dim.then_some(8.0),
                "{what}"
            );
            assert_eq!(c.attn_softcap, t.default_attn_softcap, "{what}");
            assert_eq!(c.rope_local.is_some(), t.local_rope, "{what}");
            assert_eq!(
                c.moe.is_some(),
                t.moe.experts == Experts::Required,
                "{what}"
            );
            // A window of 16 on the family's local layers.
            let local = WindowTraits::local_layers(t.windows.period, 6);
            let want: Vec<_> = match t.hf_window_needs_layer_types {
                true => vec![None; 6],
                false => local.iter().map(|&l| l.then_some(16)).collect(),
            };
            assert_eq!(c.windows, want, "{what}");
        }
        // What differs by layout: the 1 of Gemma's norms is in the GGUF weights, and
        // llama.cpp permutes the `llama` architecture's Q and K.
        assert_eq!(
            (g.norm_plus_one, h.norm_plus_one),
            (false, t.hf_norm_plus_one)
        );
        assert_eq!(
            (g.rope_style, h.rope_style),
            (t.gguf_rope_style, RopeStyle::SplitHalf)
        );
        // Everything else the two files give alike is alike.
        let layout_free = |c: &DecoderConfig| DecoderConfig {
            layout: WeightLayout::Gguf,
            norm_plus_one: false,
            rope_style: RopeStyle::SplitHalf,
            qkv_bias: false,
            ..c.clone()
        };
        assert_eq!(layout_free(&g), layout_free(&h), "{f:?}");
        assert_eq!(
            h.qkv_bias,
            t.hf_qkv_bias != HfQkvBias::AttentionBias,
            "{f:?}"
        );
    }
}

#[test]
fn gemma_configs_without_layer_types_take_the_family_pattern() {
    // Older Gemma configs carry no `layer_types`: transformers derives them from the
    // family's period (or `sliding_window_pattern`), as llama.cpp does for GGUF.
    let g2 = hf(
        "g2-old.json",
        &hf_for(Family::Gemma2.traits()).replace(r#","sliding_window":16"#, ""),
    )
    .unwrap();
    assert_eq!(g2.windows[..3], [Some(4096), None, Some(4096)]);
    let g3 = hf(
        "g3-old.json",
        &hf_for(Family::Gemma3.traits()).replacen('}', r#","sliding_window_pattern":3}"#, 1),
    )
    .unwrap();
    assert_eq!(
        g3.windows,
        [Some(16), Some(16), None, Some(16), Some(16), None]
    );
    assert_eq!(g3.rope_local.unwrap().base, 10000.0);
}
