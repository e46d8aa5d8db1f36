//! [`DecoderConfig::from_gguf`]: a decoder's configuration from GGUF metadata, one function
//! per group of `{arch}.*` keys; what the family implies comes from [`super::FAMILIES`].

use super::{
    in_file, yarn_mscale, DecoderConfig, Experts, Family, FamilyTraits, Moe, Rope, RopeScaling,
    Sizes, WeightLayout, WindowTraits, GGUF_ARCHITECTURES, MAX_LAYERS,
};
use crate::error::{Error, Result};
use crate::weights::gguf::{GgufFile, MetaValue};

impl DecoderConfig {
    /// Reads the configuration from a GGUF file's `general.architecture` and `{arch}.*` keys
    /// (and, for Llama 3.1 scaling, the presence of `rope_freqs.weight`; for biases, of
    /// `blk.0.attn_q.bias`). [`Error::Unsupported`] names an architecture or a key qkv does
    /// not run, with its value.
    pub fn from_gguf(file: &GgufFile) -> Result<DecoderConfig> {
        let keys = Keys::new(file)?;
        let traits = keys.family.traits();
        let moe = keys.moe()?;
        let sizes = keys.sizes(moe.as_ref())?;
        let mut config = traits.config(sizes, WeightLayout::Gguf);
        config.rope = keys.rope()?;
        config.rope_local = keys.rope_local(traits, config.rope.base)?;
        config.windows = keys.windows(traits, config.layers)?;
        config.qkv_bias = file.tensor_info("blk.0.attn_q.bias").is_some();
        config.out_bias = file.tensor_info("blk.0.attn_output.bias").is_some();
        (config.attn_softcap, config.final_softcap) = keys.softcaps(traits)?;
        // llama.cpp's one exception to 1/√head_dim: the 27B Gemmas scale by
        // 1/√(dim / heads), as Google's reference does.
        if traits.gguf_dim_scaled_layers == Some(config.layers) {
            config.attn_scale = 1.0 / ((config.dim / config.heads.max(1)).max(1) as f32).sqrt();
        }
        config.moe = moe;
        config.validate().map_err(|e| in_file(file.path(), e))?;
        Ok(config)
    }
}

/// A GGUF file's `{arch}.*` keys, once the architecture is known and every key is one qkv
/// knows.
struct Keys<'f> {
    file: &'f GgufFile,
    family: Family,
    arch: &'f str,
    /// `{arch}.`
    prefix: String,
}

/// Zero means "off" for llama.cpp's optional numbers.
fn nonzero(v: Option<f32>) -> Option<f32> {
    v.filter(|&v| v != 0.0)
}

impl<'f> Keys<'f> {
    /// The family of `general.architecture`; refuses another architecture, and any
    /// `{arch}.` key qkv does not know.
    fn new(file: &'f GgufFile) -> Result<Keys<'f>> {
        let arch = file.get_str("general.architecture")?;
        let family = Family::from_gguf_arch(arch).ok_or_else(|| {
            Error::Unsupported(format!(
                "{}: architecture `{}` (qkv runs {})",
                file.path().display(),
                arch.escape_debug(),
                GGUF_ARCHITECTURES.join(", ")
            ))
        })?;
        let keys = Keys {
            file,
            family,
            arch,
            prefix: format!("{arch}."),
        };
        for (key, value) in file.metadata_entries() {
            let Some(rest) = key.strip_prefix(&keys.prefix) else {
                continue;
            };
            if !KNOWN_GGUF_KEYS.contains(&rest) {
                return Err(keys.refuse_full(
                    key,
                    value,
                    "a key qkv does not know, which may change the network",
                ));
            }
        }
        Ok(keys)
    }

    fn key(&self, k: &str) -> String {
        format!("{}{k}", self.prefix)
    }

    fn opt(&self, k: &str) -> Option<&'f MetaValue> {
        self.file.metadata(&self.key(k))
    }

    fn u(&self, k: &str) -> Result<usize> {
        Ok(self.file.get_u32(&self.key(k))? as usize)
    }

    fn opt_u(&self, k: &str) -> Result<Option<usize>> {
        self.opt(k).map(|_| self.u(k)).transpose()
    }

    fn opt_f(&self, k: &str) -> Result<Option<f32>> {
        self.opt(k)
            .map(|_| self.file.get_f32(&self.key(k)))
            .transpose()
    }

    /// [`Error::Unsupported`] naming the full key `key` and its value.
    fn refuse_full(&self, key: &str, value: &MetaValue, why: &str) -> Error {
        Error::Unsupported(format!(
            "{}: `{key}` = {value} ({why})",
            self.file.path().display()
        ))
    }

    /// [`Error::Unsupported`] naming `{arch}.k`, which is present, and its value.
    fn refuse(&self, k: &str, why: &str) -> Error {
        self.refuse_full(&self.key(k), self.opt(k).expect("present"), why)
    }

    /// The sizes; values of another width than keys and partial rotation are refused.
    fn sizes(&self, moe: Option<&Moe>) -> Result<Sizes> {
        let dim = self.u("embedding_length")?;
        let heads = self.u("attention.head_count")?;
        let head_dim = match self.opt_u("attention.key_length")? {
            Some(k) => k,
            None => dim.checked_div(heads).unwrap_or(0),
        };
        if self
            .opt_u("attention.value_length")?
            .is_some_and(|v| v != head_dim)
        {
            return Err(self.refuse(
                "attention.value_length",
                "values of another width than keys",
            ));
        }
        if self
            .opt_u("rope.dimension_count")?
            .is_some_and(|n| n != head_dim)
        {
            return Err(self.refuse(
                "rope.dimension_count",
                "partial rotary embedding: qkv rotates whole heads",
            ));
        }
        Ok(Sizes {
            dim,
            layers: self.u("block_count")?,
            heads,
            kv_heads: self.opt_u("attention.head_count_kv")?.unwrap_or(heads),
            head_dim,
            ffn_dim: match (moe, self.opt_u("feed_forward_length")?) {
                // A mixture of experts needs no dense width; Qwen3-MoE files carry one anyway.
                (Some(m), None) => m.expert_ffn,
                _ => self.u("feed_forward_length")?,
            },
            vocab: match self.opt_u("vocab_size")? {
                Some(v) => v,
                None => self.file.get_array("tokenizer.ggml.tokens")?.len(),
            },
            context: self.u("context_length")?,
            rms_eps: self
                .file
                .get_f32(&self.key("attention.layer_norm_rms_epsilon"))?,
        })
    }

    /// The global layers' RoPE: `rope.freq_base` and `rope.scaling.*`, or the per-frequency
    /// factors of `rope_freqs.weight`.
    fn rope(&self) -> Result<Rope> {
        let base = self.opt_f("rope.freq_base")?.unwrap_or(10000.0);
        let kind = self.opt("rope.scaling.type");
        let scaling = match kind.map(|v| v.as_str()) {
            None | Some(Some("none")) => RopeScaling::None,
            Some(Some("linear")) => match nonzero(self.opt_f("rope.scaling.factor")?) {
                Some(factor) if factor != 1.0 => RopeScaling::Linear { factor },
                _ => RopeScaling::None,
            },
            Some(Some("yarn")) => gguf_yarn(self.file, &self.prefix)?,
            Some(_) => {
                return Err(self.refuse(
                    "rope.scaling.type",
                    "qkv runs plain, linear, YaRN and Llama 3.1 RoPE",
                ))
            }
        };
        if let Some(v) = kind.filter(|v| v.as_str() == Some("none")) {
            if nonzero(self.opt_f("rope.scaling.factor")?).is_some_and(|f| f != 1.0) {
                return Err(self.refuse(
                    "rope.scaling.factor",
                    &format!("a factor with rope.scaling.type {v}"),
                ));
            }
        }
        if self.file.tensor_info("rope_freqs.weight").is_none() {
            return Ok(Rope { base, scaling });
        }
        if scaling != RopeScaling::None {
            return Err(self.refuse(
                "rope.scaling.type",
                "rope_freqs.weight and another scaling at once",
            ));
        }
        Ok(Rope {
            base,
            scaling: RopeScaling::FileFactors,
        })
    }

    /// The local layers' RoPE: the family's own (base `rope.freq_base_swa`, else 10000; no
    /// scaling), else none; a local base in another family is refused unless it equals the
    /// global one.
    fn rope_local(&self, traits: &FamilyTraits, base: f32) -> Result<Option<Rope>> {
        match self.opt_f("rope.freq_base_swa")? {
            swa if traits.local_rope => Ok(Some(Rope {
                base: swa.unwrap_or(10000.0),
                scaling: RopeScaling::None,
            })),
            Some(swa) if swa != base => Err(self.refuse(
                "rope.freq_base_swa",
                &format!("a local RoPE base for {}", self.arch),
            )),
            _ => Ok(None),
        }
    }

    /// Per layer, its sliding window: `attention.sliding_window` (else the family's
    /// default) on the layers `attention.sliding_window_pattern` (else the family's
    /// period) makes local.
    fn windows(&self, traits: &FamilyTraits, layers: usize) -> Result<Vec<Option<usize>>> {
        let window = self.opt_u("attention.sliding_window")?.filter(|&w| w > 0);
        let Some(w) = window.or(traits.windows.default) else {
            return Ok(vec![None; layers.min(MAX_LAYERS)]);
        };
        let local = gguf_window_layers(
            self.file,
            &self.key("attention.sliding_window_pattern"),
            traits.windows.period,
            layers,
        )?;
        Ok(local.into_iter().map(|l| l.then_some(w)).collect())
    }

    /// The attention and final soft-caps; 0 turns one off, a missing attention soft-cap is
    /// the family's default.
    fn softcaps(&self, traits: &FamilyTraits) -> Result<(Option<f32>, Option<f32>)> {
        let attn = match self.opt_f("attn_logit_softcapping")? {
            None => traits.default_attn_softcap,
            some => nonzero(some),
        };
        Ok((attn, nonzero(self.opt_f("final_logit_softcapping")?)))
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

impl Keys<'_> {
    /// [`Error::Unsupported`] naming `{arch}.k` and its value, or `(missing)`.
    fn refuse_moe(&self, k: &str, why: &str) -> Error {
        let value = self
            .opt(k)
            .map_or_else(|| "(missing)".to_owned(), |v| v.to_string());
        Error::Unsupported(format!(
            "{}: `{}` = {value} ({why})",
            self.file.path().display(),
            self.key(k)
        ))
    }

    /// The mixture of experts the `{arch}.expert_*` keys describe, as llama.cpp runs the
    /// family: a softmax router, top-k, the top-k weights renormalised for `qwen3moe` and
    /// Mixtral-style `llama` files but not for `qwen2moe`, whose shared expert is gated by
    /// a sigmoid. A family without experts that declares some, or one that needs experts
    /// and declares none, is refused by key; so is a router qkv does not run
    /// ([`Keys::check_router`]).
    fn moe(&self) -> Result<Option<Moe>> {
        let arch = self.family.gguf_arch();
        let experts = self.opt_u("expert_count")?.unwrap_or(0);
        let used = self.opt_u("expert_used_count")?.unwrap_or(0);
        let traits = self.family.traits().moe;
        if traits.experts == Experts::None {
            for k in ["expert_count", "expert_used_count"] {
                if self.opt_u(k)?.unwrap_or(0) != 0 {
                    return Err(self.refuse_moe(k, &format!("a mixture of experts in {arch}")));
                }
            }
            return Ok(None);
        }
        if experts == 0 {
            if traits.experts == Experts::Required {
                return Err(self.refuse_moe("expert_count", &format!("{arch} needs experts")));
            }
            if used != 0 {
                return Err(self.refuse_moe("expert_used_count", "experts used without experts"));
            }
            return Ok(None);
        }
        if used == 0 {
            return Err(self.refuse_moe("expert_used_count", "a mixture of experts must use some"));
        }
        self.check_router(traits.gguf_norm_topk)?;
        let expert_ffn = match self.opt_u("expert_feed_forward_length")? {
            Some(n) => n,
            None => self.u("feed_forward_length")?,
        };
        let shared_ffn = self.opt_u("expert_shared_feed_forward_length")?;
        if shared_ffn.is_some() != traits.shared_expert {
            let want = if traits.shared_expert {
                "required"
            } else {
                "not run"
            };
            return Err(self.refuse_moe(
                "expert_shared_feed_forward_length",
                &format!("a shared expert is {want} in {arch}"),
            ));
        }
        Ok(Some(Moe {
            experts,
            used,
            expert_ffn,
            norm_topk: traits.gguf_norm_topk,
            shared_ffn,
        }))
    }

    /// Refuses by key another router function, expert groups, scaled expert weights, and
    /// top-k weights normalised otherwise than llama.cpp does for the family (`norm_topk`).
    fn check_router(&self, norm_topk: bool) -> Result<()> {
        let gating = self.opt_u("expert_gating_func")?;
        if let Some(g) = gating.filter(|&g| g != GATING_SOFTMAX as usize) {
            return Err(self.refuse_moe(
                "expert_gating_func",
                &format!("router function {g}: qkv runs the softmax router ({GATING_SOFTMAX})"),
            ));
        }
        for k in ["expert_group_count", "expert_group_used_count"] {
            if self.opt_u(k)?.unwrap_or(0) > 1 {
                return Err(self.refuse_moe(k, "expert groups"));
            }
        }
        if let Some(s) = self.opt_f("expert_weights_scale")? {
            if s != 0.0 && s != 1.0 {
                return Err(self.refuse_moe("expert_weights_scale", "scaled expert weights"));
            }
        }
        let norm = self.opt("expert_weights_norm");
        if norm.is_some_and(|v| v.as_bool() != Some(norm_topk)) {
            let how = if norm_topk {
                "renormalised"
            } else {
                "as they are"
            };
            return Err(self.refuse_moe(
                "expert_weights_norm",
                &format!(
                    "llama.cpp runs {} with the top-k weights {how}",
                    self.family.gguf_arch()
                ),
            ));
        }
        Ok(())
    }
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
    Ok(WindowTraits::local_layers(pattern, layers))
}
