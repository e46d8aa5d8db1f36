//! [`DecoderConfig::from_gguf`]: a decoder's configuration from GGUF metadata.

use super::{
    default_attn_scale, in_file, yarn_mscale, Activation, DecoderConfig, Family, Moe, Rope,
    RopeScaling, WeightLayout, GGUF_ARCHITECTURES, MAX_LAYERS,
};
use crate::error::{Error, Result};
use crate::weights::gguf::{GgufFile, MetaValue};
use qkv_kernels::rope::RopeStyle;

impl DecoderConfig {
    /// Reads the configuration from a GGUF file's `general.architecture` and `{arch}.*` keys
    /// (and, for Llama 3.1 scaling, the presence of `rope_freqs.weight`; for biases, of
    /// `blk.0.attn_q.bias`). [`Error::Unsupported`] names an architecture or a key qkv does
    /// not run, with its value.
    pub fn from_gguf(file: &GgufFile) -> Result<DecoderConfig> {
        let arch = file.get_str("general.architecture")?;
        let path = file.path();
        let family = Family::from_gguf_arch(arch).ok_or_else(|| {
            Error::Unsupported(format!(
                "{}: architecture `{}` (qkv runs {})",
                path.display(),
                arch.escape_debug(),
                GGUF_ARCHITECTURES.join(", ")
            ))
        })?;
        let prefix = format!("{arch}.");
        let unsupported = |key: &str, value: &MetaValue, why: &str| {
            Error::Unsupported(format!("{}: `{key}` = {value} ({why})", path.display()))
        };
        for (key, value) in file.metadata_entries() {
            let Some(rest) = key.strip_prefix(&prefix) else {
                continue;
            };
            if !KNOWN_GGUF_KEYS.contains(&rest) {
                return Err(unsupported(
                    key,
                    value,
                    "a key qkv does not know, which may change the network",
                ));
            }
        }
        let key = |k: &str| format!("{prefix}{k}");
        let opt = |k: &str| file.metadata(&key(k));
        let u = |k: &str| -> Result<usize> { Ok(file.get_u32(&key(k))? as usize) };
        let opt_u = |k: &str| -> Result<Option<usize>> { opt(k).map(|_| u(k)).transpose() };
        let opt_f =
            |k: &str| -> Result<Option<f32>> { opt(k).map(|_| file.get_f32(&key(k))).transpose() };
        // Zero means "off" for llama.cpp's optional numbers.
        let nonzero = |v: Option<f32>| v.filter(|&v| v != 0.0);

        let dim = u("embedding_length")?;
        let heads = u("attention.head_count")?;
        let layers = u("block_count")?;
        let kv_heads = opt_u("attention.head_count_kv")?.unwrap_or(heads);
        let head_dim = match opt_u("attention.key_length")? {
            Some(k) => k,
            None => dim.checked_div(heads).unwrap_or(0),
        };
        if let Some(v) = opt_u("attention.value_length")? {
            if v != head_dim {
                return Err(unsupported(
                    &key("attention.value_length"),
                    opt("attention.value_length").expect("present"),
                    "values of another width than keys",
                ));
            }
        }
        if let Some(n) = opt_u("rope.dimension_count")? {
            if n != head_dim {
                return Err(unsupported(
                    &key("rope.dimension_count"),
                    opt("rope.dimension_count").expect("present"),
                    "partial rotary embedding: qkv rotates whole heads",
                ));
            }
        }
        let moe = gguf_moe(file, family, &prefix)?;
        let vocab = match opt_u("vocab_size")? {
            Some(v) => v,
            None => file.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let base = opt_f("rope.freq_base")?.unwrap_or(10000.0);
        let scaling = match opt("rope.scaling.type") {
            None => RopeScaling::None,
            Some(v) => match v.as_str() {
                Some("none") => RopeScaling::None,
                Some("linear") => match nonzero(opt_f("rope.scaling.factor")?) {
                    Some(factor) if factor != 1.0 => RopeScaling::Linear { factor },
                    _ => RopeScaling::None,
                },
                Some("yarn") => gguf_yarn(file, &prefix)?,
                _ => {
                    return Err(unsupported(
                        &key("rope.scaling.type"),
                        v,
                        "qkv runs plain, linear, YaRN and Llama 3.1 RoPE",
                    ))
                }
            },
        };
        if let Some(v) = opt("rope.scaling.type").filter(|v| v.as_str() == Some("none")) {
            if nonzero(opt_f("rope.scaling.factor")?).is_some_and(|f| f != 1.0) {
                return Err(unsupported(
                    &key("rope.scaling.factor"),
                    opt("rope.scaling.factor").expect("present"),
                    &format!("a factor with rope.scaling.type {v}"),
                ));
            }
        }
        let scaling = if file.tensor_info("rope_freqs.weight").is_some() {
            if scaling != RopeScaling::None {
                return Err(unsupported(
                    &key("rope.scaling.type"),
                    opt("rope.scaling.type").expect("present"),
                    "rope_freqs.weight and another scaling at once",
                ));
            }
            RopeScaling::FileFactors
        } else {
            scaling
        };
        let rope = Rope { base, scaling };

        let window = opt_u("attention.sliding_window")?.filter(|&w| w > 0);
        let windows = match (family, window) {
            (_, None) if family != Family::Gemma2 => vec![None; layers.min(MAX_LAYERS)],
            // Gemma 2 without the key: llama.cpp's default window of 4096.
            _ => {
                let w = window.unwrap_or(4096);
                let pattern = match family {
                    Family::Gemma2 => 2,
                    Family::Gemma3 => 6,
                    _ => 0,
                };
                gguf_window_layers(
                    file,
                    &key("attention.sliding_window_pattern"),
                    pattern,
                    layers,
                )?
                .into_iter()
                .map(|local| local.then_some(w))
                .collect()
            }
        };
        let rope_local = match (family, opt_f("rope.freq_base_swa")?) {
            // Gemma 3's local layers: their own base (10000 unless the file says), no scaling.
            (Family::Gemma3, swa) => Some(Rope {
                base: swa.unwrap_or(10000.0),
                scaling: RopeScaling::None,
            }),
            (_, Some(swa)) if swa != base => {
                return Err(unsupported(
                    &key("rope.freq_base_swa"),
                    opt("rope.freq_base_swa").expect("present"),
                    &format!("a local RoPE base for {arch}"),
                ))
            }
            _ => None,
        };
        let gemma = family.is_gemma();
        let mut config = DecoderConfig {
            family,
            dim,
            layers,
            heads,
            kv_heads,
            head_dim,
            ffn_dim: match (&moe, opt_u("feed_forward_length")?) {
                // A mixture of experts needs no dense width; Qwen3-MoE files carry one anyway.
                (Some(m), None) => m.expert_ffn,
                _ => u("feed_forward_length")?,
            },
            vocab,
            context: u("context_length")?,
            rms_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            norm_plus_one: false,
            rope_style: if family == Family::Llama {
                RopeStyle::AdjacentPairs
            } else {
                RopeStyle::SplitHalf
            },
            rope,
            rope_local,
            qkv_bias: file.tensor_info("blk.0.attn_q.bias").is_some(),
            out_bias: file.tensor_info("blk.0.attn_output.bias").is_some(),
            qk_norm: family.has_qk_norm(),
            sandwich_norms: gemma,
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            embed_scale: gemma.then(|| (dim as f64).sqrt() as f32),
            attn_scale: default_attn_scale(head_dim),
            attn_softcap: nonzero(opt_f("attn_logit_softcapping")?),
            final_softcap: nonzero(opt_f("final_logit_softcapping")?),
            windows,
            moe,
            layout: WeightLayout::Gguf,
        };
        // llama.cpp's one exception to 1/√head_dim: the 27B Gemmas (46 and 62 blocks) scale
        // by 1/√(dim / heads), as Google's reference does.
        if (family == Family::Gemma2 && layers == 46) || (family == Family::Gemma3 && layers == 62)
        {
            config.attn_scale = 1.0 / ((dim / heads.max(1)).max(1) as f32).sqrt();
        }
        if family == Family::Gemma2 {
            // Gemma 2 soft-caps its scores unless the file turns it off with a 0.
            config.attn_softcap = match opt_f("attn_logit_softcapping")? {
                None => Some(50.0),
                some => nonzero(some),
            };
        }
        config.validate().map_err(|e| in_file(path, e))?;
        Ok(config)
    }
}

/// The `{arch}.*` GGUF keys qkv reads or knows to be harmless; any other is refused.
const KNOWN_GGUF_KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "vocab_size",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.layer_norm_rms_epsilon",
    "attention.key_length",
    "attention.value_length",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.freq_base_swa",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
    "rope.scaling.attn_factor",
    "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_attn_factor",
    "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow",
    "rope.scaling.yarn_log_multiplier",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_feed_forward_length",
    "expert_weights_norm",
    "expert_weights_scale",
    "expert_gating_func",
    "expert_group_count",
    "expert_group_used_count",
];

/// GGUF's `expert_gating_func` value for a softmax router (llama.cpp's
/// `LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX`).
const GATING_SOFTMAX: u32 = 1;

/// The mixture of experts a file's `{arch}.expert_*` keys describe, as llama.cpp runs the
/// family: a softmax router, top-k, the top-k weights renormalised for `qwen3moe` and
/// Mixtral-style `llama` files but not for `qwen2moe`, whose shared expert is gated by a
/// sigmoid. Anything else (another router function, expert groups, scaled weights, a
/// family without experts that declares some) is refused by key.
fn gguf_moe(file: &GgufFile, family: Family, prefix: &str) -> Result<Option<Moe>> {
    let path = file.path();
    let key = |k: &str| format!("{prefix}{k}");
    let unsupported = |k: &str, why: &str| {
        let value = file
            .metadata(&key(k))
            .map_or_else(|| "(missing)".to_owned(), |v| v.to_string());
        Error::Unsupported(format!(
            "{}: `{}` = {value} ({why})",
            path.display(),
            key(k)
        ))
    };
    let opt_u = |k: &str| -> Result<Option<usize>> {
        file.metadata(&key(k))
            .map(|_| file.get_u32(&key(k)).map(|v| v as usize))
            .transpose()
    };
    let experts = opt_u("expert_count")?.unwrap_or(0);
    let used = opt_u("expert_used_count")?.unwrap_or(0);
    let moe_family = family.is_moe() || family == Family::Llama;
    if !moe_family {
        for k in ["expert_count", "expert_used_count"] {
            if opt_u(k)?.unwrap_or(0) != 0 {
                return Err(unsupported(
                    k,
                    &format!("a mixture of experts in {}", family.gguf_arch()),
                ));
            }
        }
        return Ok(None);
    }
    if experts == 0 {
        if family.is_moe() {
            return Err(unsupported(
                "expert_count",
                &format!("{} needs experts", family.gguf_arch()),
            ));
        }
        if used != 0 {
            return Err(unsupported(
                "expert_used_count",
                "experts used without experts",
            ));
        }
        return Ok(None);
    }
    if used == 0 {
        return Err(unsupported(
            "expert_used_count",
            "a mixture of experts must use some",
        ));
    }
    if let Some(g) = opt_u("expert_gating_func")?.filter(|&g| g != GATING_SOFTMAX as usize) {
        return Err(unsupported(
            "expert_gating_func",
            &format!("router function {g}: qkv runs the softmax router ({GATING_SOFTMAX})"),
        ));
    }
    for k in ["expert_group_count", "expert_group_used_count"] {
        if opt_u(k)?.unwrap_or(0) > 1 {
            return Err(unsupported(k, "expert groups"));
        }
    }
    if file.metadata(&key("expert_weights_scale")).is_some() {
        let s = file.get_f32(&key("expert_weights_scale"))?;
        if s != 0.0 && s != 1.0 {
            return Err(unsupported("expert_weights_scale", "scaled expert weights"));
        }
    }
    let norm_topk = family != Family::Qwen2Moe;
    if let Some(v) = file.metadata(&key("expert_weights_norm")) {
        if v.as_bool() != Some(norm_topk) {
            return Err(unsupported(
                "expert_weights_norm",
                &format!(
                    "llama.cpp runs {} with the top-k weights {}",
                    family.gguf_arch(),
                    if norm_topk {
                        "renormalised"
                    } else {
                        "as they are"
                    }
                ),
            ));
        }
    }
    let expert_ffn = match opt_u("expert_feed_forward_length")? {
        Some(n) => n,
        None => file.get_u32(&key("feed_forward_length"))? as usize,
    };
    let shared_ffn = opt_u("expert_shared_feed_forward_length")?;
    if shared_ffn.is_some() != (family == Family::Qwen2Moe) {
        return Err(unsupported(
            "expert_shared_feed_forward_length",
            &format!(
                "a shared expert is {} in {}",
                if family == Family::Qwen2Moe {
                    "required"
                } else {
                    "not run"
                },
                family.gguf_arch()
            ),
        ));
    }
    Ok(Some(Moe {
        experts,
        used,
        expert_ffn,
        norm_topk,
        shared_ffn,
    }))
}

/// YaRN from `rope.scaling.factor`, `rope.scaling.original_context_length` and the optional
/// `rope.scaling.yarn_*` keys convert_hf_to_gguf.py copies from `rope_scaling`, taken as
/// transformers defines them. An extrapolation factor other than 1, a log multiplier (the
/// `mscale_all_dim` form) or an extra attention factor is refused by key.
fn gguf_yarn(file: &GgufFile, prefix: &str) -> Result<RopeScaling> {
    let key = |k: &str| format!("{prefix}rope.scaling.{k}");
    let opt_f = |k: &str| -> Result<Option<f32>> {
        file.metadata(&key(k))
            .map(|_| file.get_f32(&key(k)))
            .transpose()
    };
    let refuse = |k: &str, why: &str| {
        let value = file
            .metadata(&key(k))
            .map_or_else(|| "(missing)".to_owned(), |v| v.to_string());
        Error::Unsupported(format!(
            "{}: `{}` = {value} ({why})",
            file.path().display(),
            key(k)
        ))
    };
    for (k, neutral) in [
        ("yarn_ext_factor", 1.0),
        ("yarn_log_multiplier", 0.0),
        ("attn_factor", 1.0),
    ] {
        if opt_f(k)?.is_some_and(|v| v != neutral) {
            return Err(refuse(k, "a YaRN variant qkv does not run"));
        }
    }
    let factor = opt_f("factor")?.ok_or_else(|| refuse("factor", "YaRN needs a factor"))?;
    let original_context = match file.metadata(&key("original_context_length")) {
        Some(_) => file.get_u32(&key("original_context_length"))? as f32,
        None => {
            return Err(refuse(
                "original_context_length",
                "YaRN needs the original context",
            ))
        }
    };
    let attention_factor = match opt_f("yarn_attn_factor")? {
        Some(a) => a,
        None => yarn_mscale(f64::from(factor), 1.0) as f32,
    };
    // transformers treats 0 like a missing value (`get("beta_fast") or 32`).
    let beta = |k: &str, default: f32| -> Result<f32> {
        Ok(opt_f(k)?.filter(|&b| b != 0.0).unwrap_or(default))
    };
    Ok(RopeScaling::Yarn {
        factor,
        original_context,
        beta_fast: beta("yarn_beta_fast", 32.0)?,
        beta_slow: beta("yarn_beta_slow", 1.0)?,
        attention_factor,
        truncate: true,
    })
}

/// Per layer, whether it uses the sliding window: the file's
/// `attention.sliding_window_pattern` (a list of flags, or a period `n` whose last layer in
/// each run of `n` is global, as llama.cpp reads it), else `default_pattern` (0: every
/// layer is local).
fn gguf_window_layers(
    file: &GgufFile,
    key: &str,
    default_pattern: usize,
    layers: usize,
) -> Result<Vec<bool>> {
    let layers = layers.min(MAX_LAYERS);
    let pattern = match file.metadata(key) {
        None => default_pattern,
        Some(MetaValue::Array(_, flags)) => {
            let flags: Option<Vec<bool>> = flags.iter().map(MetaValue::as_bool).collect();
            return match flags {
                Some(f) if f.len() == layers => Ok(f),
                _ => Err(Error::Unsupported(format!(
                    "{}: `{key}` is not a list of {layers} booleans",
                    file.path().display()
                ))),
            };
        }
        Some(_) => file.get_u32(key)? as usize,
    };
    Ok((0..layers)
        .map(|l| pattern == 0 || l % pattern < pattern - 1)
        .collect())
}
