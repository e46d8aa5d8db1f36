//! [`DecoderConfig::from_gguf`]: a decoder's configuration from GGUF metadata.

use super::{
    default_attn_scale, in_file, Activation, DecoderConfig, Family, Rope, RopeScaling,
    WeightLayout, GGUF_ARCHITECTURES, MAX_LAYERS,
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
        for k in ["expert_count", "expert_used_count"] {
            if opt_u(k)?.unwrap_or(0) != 0 {
                return Err(unsupported(
                    &key(k),
                    opt(k).expect("present"),
                    "mixture of experts",
                ));
            }
        }
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
                _ => {
                    return Err(unsupported(
                        &key("rope.scaling.type"),
                        v,
                        "qkv runs plain, linear and Llama 3.1 RoPE",
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
            ffn_dim: u("feed_forward_length")?,
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
            qk_norm: matches!(family, Family::Qwen3 | Family::Gemma3),
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
    // Only meaningful with YaRN or LongRoPE scaling, which are refused.
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "expert_count",
    "expert_used_count",
];

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
