//! [`DecoderConfig::from_hf_json`]: a decoder's configuration from a Hugging Face
//! `config.json`, one function per group of keys; what the family implies comes from
//! [`super::FAMILIES`].

use super::{
    in_file, yarn_mscale, DecoderConfig, Experts, Family, FamilyTraits, HfQkvBias, Moe, Rope,
    RopeScaling, Sizes, WeightLayout, WindowTraits, HF_MODEL_TYPES, MAX_LAYERS,
};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::models::bert::config::JsonFile;
use std::path::Path;

impl DecoderConfig {
    /// Reads a Hugging Face `config.json`. [`Error::Unsupported`] names the file, key and
    /// value of anything qkv does not run: another `model_type`, activation, RoPE type or
    /// partial rotation, MLP biases, bidirectional attention. [`Error::Format`] for a
    /// missing or mistyped key; [`Error::InFile`] around [`Error::Config`] for sizes that do
    /// not fit together.
    pub fn from_hf_json(path: &Path) -> Result<DecoderConfig> {
        let json = JsonFile::open(path)?;
        let model_type = json.opt_str("model_type")?.unwrap_or("");
        let family = Family::from_model_type(model_type).ok_or_else(|| {
            json.unsupported(
                "model_type",
                &json.value()["model_type"],
                &format!("qkv's decoder runs {}", HF_MODEL_TYPES.join(", ")),
            )
        })?;
        let traits = family.traits();
        hf_refuse_variants(&json, traits)?;
        let (qkv_bias, out_bias) = hf_biases(&json, traits)?;
        let sizes = hf_sizes(&json)?;
        let mut config = traits.config(sizes, WeightLayout::HuggingFace);
        (config.rope, config.rope_local) = hf_ropes(&json, traits, sizes.context)?;
        config.windows = hf_windows(&json, traits, sizes.layers)?;
        (config.qkv_bias, config.out_bias) = (qkv_bias, out_bias);
        if traits.softcaps {
            config.attn_softcap =
                hf_number(&json, "attn_logit_softcapping")?.or(traits.default_attn_softcap);
            config.final_softcap = hf_number(&json, "final_logit_softcapping")?;
        }
        if traits.query_pre_attn_scalar {
            if let Some(s) = hf_f64(&json, "query_pre_attn_scalar")? {
                config.attn_scale = s.powf(-0.5) as f32;
            }
        }
        config.moe = hf_moe(&json, family, model_type)?;
        config.validate().map_err(|e| in_file(path, e))?;
        Ok(config)
    }
}

/// Refuses another activation than the family's, MLP biases and bidirectional attention,
/// by key.
fn hf_refuse_variants(json: &JsonFile, traits: &FamilyTraits) -> Result<()> {
    let act_key = traits.hf_activation_key;
    if json
        .opt_str(act_key)?
        .is_some_and(|a| a != traits.activation.hf_name())
    {
        return Err(json.unsupported(
            act_key,
            &json.value()[act_key],
            "qkv runs SwiGLU with silu, GeGLU with gelu_pytorch_tanh for Gemma",
        ));
    }
    if json.bool_or("mlp_bias", false)? {
        return Err(json.unsupported("mlp_bias", &json.value()["mlp_bias"], "MLP biases"));
    }
    if json.bool_or("use_bidirectional_attention", false)? {
        return Err(json.unsupported(
            "use_bidirectional_attention",
            &json.value()["use_bidirectional_attention"],
            "qkv's decoder is causal",
        ));
    }
    Ok(())
}

/// The Q/K/V and output projection biases: `attention_bias` where the family allows it,
/// and the family's own rule for Q/K/V.
fn hf_biases(json: &JsonFile, traits: &FamilyTraits) -> Result<(bool, bool)> {
    let attention_bias = json.bool_or("attention_bias", false)?;
    if attention_bias && !traits.attention_bias {
        return Err(json.unsupported(
            "attention_bias",
            &json.value()["attention_bias"],
            "attention biases outside the Llama family",
        ));
    }
    let qkv_bias = match traits.hf_qkv_bias {
        HfQkvBias::Always => true,
        HfQkvBias::QkvBiasKey => json.bool_or("qkv_bias", true)?,
        HfQkvBias::AttentionBias => attention_bias,
    };
    Ok((qkv_bias, attention_bias))
}

/// The sizes.
fn hf_sizes(json: &JsonFile) -> Result<Sizes> {
    let dim = json.usize("hidden_size")?;
    let heads = json.usize("num_attention_heads")?;
    let layers = json.usize("num_hidden_layers")?;
    let kv_heads = json.opt_usize("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = match json.opt_usize("head_dim")? {
        Some(h) => h,
        None => dim.checked_div(heads).unwrap_or(0),
    };
    Ok(Sizes {
        dim,
        layers,
        heads,
        kv_heads,
        head_dim,
        ffn_dim: json.usize("intermediate_size")?,
        vocab: json.usize("vocab_size")?,
        context: json.usize("max_position_embeddings")?,
        rms_eps: json.f64_or("rms_norm_eps", 1e-6)? as f32,
    })
}

/// A number that may be missing; [`Error::Format`] for anything else than a number.
fn hf_f64(json: &JsonFile, k: &str) -> Result<Option<f64>> {
    match json.get(k) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| json.format_error(format!("`{k}` = {v} is not a number"))),
    }
}

/// As [`hf_f64`], rounded to f32.
fn hf_number(json: &JsonFile, k: &str) -> Result<Option<f32>> {
    Ok(hf_f64(json, k)?.map(|x| x as f32))
}

/// The global and local RoPE. transformers 5 nests them in `rope_parameters` (per layer
/// type for Gemma 3); older files have `rope_theta`, `rope_scaling` and
/// `rope_local_base_freq` at the top. A family with a local RoPE of its own gets base 10000
/// when the file gives none. Partial rotation is refused.
fn hf_ropes(
    json: &JsonFile,
    traits: &FamilyTraits,
    context: usize,
) -> Result<(Rope, Option<Rope>)> {
    let params = json
        .get("rope_parameters")
        .or_else(|| json.get("rope_scaling"))
        .cloned()
        .unwrap_or(serde_json::Value::Object(Default::default()));
    let nested =
        params.get("full_attention").is_some() || params.get("sliding_attention").is_some();
    let global = if nested {
        params.get("full_attention").cloned().unwrap_or_default()
    } else {
        params.clone()
    };
    let default_theta = json
        .get("rope_theta")
        .and_then(|v| v.as_f64())
        .unwrap_or(10000.0);
    let rope = hf_rope(json, &global, default_theta, context)?;
    let plain = |base: f64| Rope {
        base: base as f32,
        scaling: RopeScaling::None,
    };
    let rope_local = match params.get("sliding_attention") {
        Some(local) if nested => Some(hf_rope(json, local, 10000.0, context)?),
        _ => json
            .get("rope_local_base_freq")
            .and_then(|v| v.as_f64())
            .map(plain),
    };
    let rope_local = rope_local.or_else(|| traits.local_rope.then(|| plain(10000.0)));
    let partial = json
        .get("partial_rotary_factor")
        .or_else(|| global.get("partial_rotary_factor"));
    if let Some(p) = partial.filter(|p| p.as_f64() != Some(1.0)) {
        return Err(json.unsupported(
            "partial_rotary_factor",
            p,
            "partial rotary embedding: qkv rotates whole heads",
        ));
    }
    Ok((rope, rope_local))
}

/// Per layer, its sliding window: `sliding_window` (else the family's default) on the
/// `sliding_attention` layers of `layer_types`; without that list, on the layers the
/// family's period (or `sliding_window_pattern`) makes local, every layer for a family
/// without one (Mistral, Phi-3).
fn hf_windows(json: &JsonFile, traits: &FamilyTraits, layers: usize) -> Result<Vec<Option<usize>>> {
    let window = json.opt_usize("sliding_window")?.or(traits.windows.default);
    let use_sw = json.bool_or("use_sliding_window", true)?;
    let Some(types) = json.get("layer_types") else {
        if traits.hf_window_needs_layer_types && use_sw && window.is_some() {
            return Err(json.unsupported(
                "use_sliding_window",
                &json.value()["use_sliding_window"],
                "Qwen2's per-layer window without `layer_types`",
            ));
        }
        let period = match json.opt_usize("sliding_window_pattern")? {
            Some(p) if traits.windows.period != 0 => p,
            _ => traits.windows.period,
        };
        let local = WindowTraits::local_layers(period, layers.min(MAX_LAYERS));
        let window = window.filter(|_| use_sw);
        return Ok(local.into_iter().map(|l| window.filter(|_| l)).collect());
    };
    let types = types
        .as_array()
        .ok_or_else(|| json.format_error(format!("`layer_types` = {types} is not a list")))?;
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(None),
            Some("sliding_attention") => window.map(Some).ok_or_else(|| {
                json.format_error(
                    "`layer_types` has sliding_attention layers but `sliding_window` is \
                     missing"
                        .into(),
                )
            }),
            _ => Err(json.unsupported(
                "layer_types",
                t,
                "qkv runs full_attention and sliding_attention layers",
            )),
        })
        .collect()
}

/// One rope of a Hugging Face config: `rope_type` default, linear, llama3 or yarn.
/// `context` is `max_position_embeddings` (YaRN's factor when it gives none).
fn hf_rope(
    json: &JsonFile,
    p: &serde_json::Value,
    default_theta: f64,
    context: usize,
) -> Result<Rope> {
    let num = |k: &str, default: Option<f64>| -> Result<f32> {
        match p.get(k).filter(|v| !v.is_null()) {
            Some(v) => v
                .as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| json.format_error(format!("rope `{k}` = {v} is not a number"))),
            None => default
                .map(|d| d as f32)
                .ok_or_else(|| json.format_error(format!("rope `{k}` is missing"))),
        }
    };
    let base = num("rope_theta", Some(default_theta))?;
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: num("factor", None)?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: num("factor", None)?,
            low_freq_factor: num("low_freq_factor", None)?,
            high_freq_factor: num("high_freq_factor", None)?,
            original_context: num("original_max_position_embeddings", None)?,
        },
        "yarn" => hf_yarn(json, p, context)?,
        _ => {
            return Err(json.unsupported(
                "rope_type",
                p.get("rope_type").or_else(|| p.get("type")).unwrap_or(p),
                "qkv runs default, linear, llama3 and yarn RoPE",
            ))
        }
    };
    Ok(Rope { base, scaling })
}

/// YaRN's parameters as transformers' `_compute_yarn_parameters` reads them: `factor`
/// (else `max_position_embeddings / original_max_position_embeddings`), the attention factor
/// given or derived from `factor` (and `mscale`/`mscale_all_dim` when both are set), `beta_fast`
/// and `beta_slow` (32 and 1 when missing or 0), `truncate` (true when missing).
fn hf_yarn(json: &JsonFile, p: &serde_json::Value, context: usize) -> Result<RopeScaling> {
    let num = |k: &str| -> Result<Option<f64>> {
        match p.get(k).filter(|v| !v.is_null()) {
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| json.format_error(format!("rope `{k}` = {v} is not a number"))),
            None => Ok(None),
        }
    };
    let original = num("original_max_position_embeddings")?.ok_or_else(|| {
        json.format_error("yarn rope `original_max_position_embeddings` is missing".into())
    })?;
    let factor = match num("factor")? {
        Some(f) => f,
        None => context as f64 / original,
    };
    let attention_factor = match num("attention_factor")? {
        Some(a) => a,
        None => match (num("mscale")?, num("mscale_all_dim")?) {
            (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                yarn_mscale(factor, m) / yarn_mscale(factor, all)
            }
            _ => yarn_mscale(factor, 1.0),
        },
    };
    let beta = |k: &str, default: f64| -> Result<f32> {
        Ok(num(k)?.filter(|&b| b != 0.0).unwrap_or(default) as f32)
    };
    let truncate = match p.get("truncate").filter(|v| !v.is_null()) {
        None => true,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| json.format_error(format!("rope `truncate` = {v} is not a boolean")))?,
    };
    Ok(RopeScaling::Yarn {
        factor: factor as f32,
        original_context: original as f32,
        beta_fast: beta("beta_fast", 32.0)?,
        beta_slow: beta("beta_slow", 1.0)?,
        attention_factor: attention_factor as f32,
        truncate,
    })
}

/// The mixture of experts of a Hugging Face config: `num_experts` (or `num_local_experts`),
/// `num_experts_per_tok`, the experts' width (`moe_intermediate_size`, Mixtral's
/// `intermediate_size`), `norm_topk_prob` (always on for Mixtral) and Qwen2-MoE's
/// `shared_expert_intermediate_size`. Layers without experts (`mlp_only_layers`,
/// `decoder_sparse_step` above 1) and other routers are refused by key.
fn hf_moe(json: &JsonFile, family: Family, model_type: &str) -> Result<Option<Moe>> {
    let traits = family.traits().moe;
    // Experts are optional in the Llama family: a Hugging Face config says so by its type.
    let mixtral = traits.experts == Experts::Optional && model_type == "mixtral";
    if !(mixtral || traits.experts == Experts::Required) {
        for k in ["num_experts", "num_local_experts"] {
            if json.opt_usize(k).ok().flatten().unwrap_or(0) > 0 {
                return Err(json.unsupported(
                    k,
                    &json.value()[k],
                    &format!("a mixture of experts in `{model_type}`"),
                ));
            }
        }
        return Ok(None);
    }
    for k in [
        "scoring_func",
        "topk_method",
        "n_group",
        "topk_group",
        "routed_scaling_factor",
        "n_shared_experts",
        "first_k_dense_replace",
    ] {
        if let Some(v) = json.get(k) {
            return Err(json.unsupported(k, v, "a router qkv does not run"));
        }
    }
    if let Some(v) = json
        .get("mlp_only_layers")
        .filter(|v| v.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(json.unsupported("mlp_only_layers", v, "layers without experts"));
    }
    if json.opt_usize("decoder_sparse_step")?.unwrap_or(1) != 1 {
        return Err(json.unsupported(
            "decoder_sparse_step",
            &json.value()["decoder_sparse_step"],
            "layers without experts",
        ));
    }
    let experts = match json.opt_usize("num_experts")? {
        Some(n) => n,
        None => json.usize("num_local_experts")?,
    };
    let expert_ffn = if mixtral {
        json.usize("intermediate_size")?
    } else {
        json.usize("moe_intermediate_size")?
    };
    let shared_ffn = match traits.shared_expert {
        true => Some(json.usize("shared_expert_intermediate_size")?),
        false => None,
    };
    Ok(Some(Moe {
        experts,
        used: json.usize("num_experts_per_tok")?,
        expert_ffn,
        norm_topk: mixtral || json.bool_or("norm_topk_prob", false)?,
        shared_ffn,
    }))
}
