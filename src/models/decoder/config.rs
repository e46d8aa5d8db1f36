//! [`DecoderConfig`]: what distinguishes one decoder-only family from another, as data, read
//! from a GGUF file's `{arch}.*` keys or from a Hugging Face `config.json`.
//!
//! Every key that changes what the network computes is either honoured or refused with
//! [`Error::Unsupported`] naming the file, the key and its value; none is ignored. A GGUF key
//! under `{arch}.` that qkv does not know is refused too, since it may change the network.

mod family;
mod gguf;
mod hf;
#[cfg(test)]
mod tests;

pub(crate) use family::Sizes;
pub use family::{Experts, FamilyTraits, HfQkvBias, MoeTraits, WindowTraits, FAMILIES};

use crate::error::{Error, Result};
use qkv_kernels::rope::RopeStyle;
use std::path::Path;

/// The families of decoder-only transformers qkv runs. Each differs from Llama only in the
/// data of [`DecoderConfig`]; what the family implies, whatever the file, is its row of
/// [`FAMILIES`] ([`Family::traits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama 2, 3, 3.1, 3.2, SmolLM2/3, TinyLlama, and Mistral (GGUF architecture `llama`).
    Llama,
    /// Qwen2 and Qwen2.5: biases on the Q, K and V projections.
    Qwen2,
    /// Qwen3: RMS-normalised queries and keys, a head dimension of its own.
    Qwen3,
    /// Phi-3: fused QKV and gate/up projections, a sliding window.
    Phi3,
    /// Gemma 2: (1 + w) norms around both sub-layers, GeGLU, soft-capping, alternating
    /// sliding-window layers, a scaled embedding.
    Gemma2,
    /// Gemma 3 (text): Gemma 2 with QK-norm, five local layers for each global one, and a
    /// RoPE base (and scaling) of their own for the local layers.
    Gemma3,
    /// Qwen3 with a mixture-of-experts feed-forward block in every layer (Qwen3-30B-A3B).
    Qwen3Moe,
    /// Qwen2 (Q/K/V biases) with a mixture of experts plus a shared expert behind a sigmoid
    /// gate in every layer (Qwen1.5-MoE, Qwen2-57B-A14B).
    Qwen2Moe,
}

/// The GGUF architectures qkv's decoder runs.
pub const GGUF_ARCHITECTURES: &[&str] = &[
    "llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen3moe", "qwen2moe",
];

/// The Hugging Face `model_type`s qkv's decoder runs.
pub const HF_MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "smollm3",
    "qwen2",
    "qwen3",
    "phi3",
    "gemma2",
    "gemma3_text",
    "mixtral",
    "qwen3_moe",
    "qwen2_moe",
];

/// Where a decoder's tensors come from, which fixes their names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// llama.cpp's GGUF names (`blk.N.attn_q.weight`…).
    Gguf,
    /// Hugging Face `transformers` names (`model.layers.N.self_attn.q_proj.weight`…).
    HuggingFace,
}

/// How RoPE frequencies are rescaled for long contexts.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor` (every frequency divided by it).
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's smooth per-frequency scaling (transformers' `llama3` rope type).
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f32,
        /// Wavelengths above `original_context / low_freq_factor` are divided by `factor`.
        low_freq_factor: f32,
        /// Wavelengths below `original_context / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// The context the model was first trained with.
        original_context: f32,
    },
    /// Per-frequency divisors stored in the file (GGUF's `rope_freqs.weight`, which
    /// llama.cpp's converter writes for Llama 3.1 scaling).
    FileFactors,
    /// YaRN (transformers' `yarn` rope type): each frequency a blend of itself and itself
    /// divided by `factor`, by a linear ramp over the pairs between the correction dimensions
    /// of `beta_fast` and `beta_slow` rotations in `original_context` positions; cos and sin
    /// are multiplied by `attention_factor`.
    Yarn {
        /// The context extension factor.
        factor: f32,
        /// The context the model was first trained with.
        original_context: f32,
        /// Rotations over the original context below which a pair is fully extrapolated
        /// (kept); transformers' default 32.
        beta_fast: f32,
        /// Rotations above which a pair is fully interpolated (divided); default 1.
        beta_slow: f32,
        /// The multiplier of cos and sin (default `0.1·ln(factor) + 1`).
        attention_factor: f32,
        /// Round the correction range outwards to whole pairs (transformers' `truncate`,
        /// default true).
        truncate: bool,
    },
}

impl RopeScaling {
    /// The factor cos and sin are multiplied by: YaRN's attention factor, else 1. Scaling
    /// both the rotated queries and keys by it scales their dot products by its square.
    pub fn attention_factor(&self) -> f32 {
        match self {
            RopeScaling::Yarn {
                attention_factor, ..
            } => *attention_factor,
            _ => 1.0,
        }
    }
}

/// transformers' default YaRN attention factor for `factor` (`mscale`): `0.1·mscale·ln(factor)
/// + 1`, or 1 for a factor of at most 1. In f64 as Python computes it.
pub(crate) fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

/// A mixture-of-experts feed-forward block: a router picks `used` of `experts` SwiGLU
/// experts for each token, weighted by their softmax probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    /// Experts per layer.
    pub experts: usize,
    /// Experts each token runs through (top-k).
    pub used: usize,
    /// Hidden width of each expert.
    pub expert_ffn: usize,
    /// The top-k probabilities are divided by their sum (Mixtral, Qwen3-MoE's
    /// `norm_topk_prob`); otherwise they are used as the softmax over all experts gave them.
    pub norm_topk: bool,
    /// Hidden width of the shared expert that every token runs through, scaled by a sigmoid
    /// gate of its own (Qwen2-MoE), when there is one.
    pub shared_ffn: Option<usize>,
}

/// The rotary embedding of one kind of layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    /// The base frequency θ.
    pub base: f32,
    /// Rescaling of the frequencies.
    pub scaling: RopeScaling,
}

/// The feed-forward block's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) ⊙ up`.
    Silu,
    /// GeGLU with the tanh approximation of GELU (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// The hyper-parameters of a decoder-only transformer, whatever its family.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// The family: decides the tensor names only.
    pub family: Family,
    /// Width of the residual stream (`d_model`).
    pub dim: usize,
    /// Number of transformer blocks.
    pub layers: usize,
    /// Number of query heads.
    pub heads: usize,
    /// Number of key/value heads (`heads` must be a multiple of it).
    pub kv_heads: usize,
    /// Elements per head; `heads · head_dim` need not equal `dim` (Qwen3, Gemma).
    pub head_dim: usize,
    /// Hidden width of the gated feed-forward block.
    pub ffn_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab: usize,
    /// Longest sequence the model was trained for; the default KV cache capacity.
    pub context: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Norm weights are stored as `w` and applied as `1 + w` (Gemma in Hugging Face files;
    /// llama.cpp's converter adds the 1 into the GGUF weights).
    pub norm_plus_one: bool,
    /// Which elements of a head form RoPE's rotated pairs: GGUF files of the `llama`
    /// architecture have Q and K rows permuted for adjacent pairs; everything else rotates
    /// the two halves of a head.
    pub rope_style: RopeStyle,
    /// RoPE of the global (full-attention) layers.
    pub rope: Rope,
    /// RoPE of the sliding-window layers, when it differs (Gemma 3).
    pub rope_local: Option<Rope>,
    /// Biases on the Q, K and V projections (Qwen2, Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on the attention output projection (Llama with `attention_bias`).
    pub out_bias: bool,
    /// Queries and keys are RMS-normalised per head before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Norms after attention and after the feed-forward block too, before each residual add
    /// (Gemma 2 and 3).
    pub sandwich_norms: bool,
    /// The feed-forward gate's activation.
    pub activation: Activation,
    /// The embedding rows are multiplied by this (Gemma: `√dim`).
    pub embed_scale: Option<f32>,
    /// Attention scores are `q·k · attn_scale` (default `1/√head_dim`; Gemma's
    /// `query_pre_attn_scalar^-½`).
    pub attn_scale: f32,
    /// Soft-capping of the attention scores (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Soft-capping of the final logits (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Per layer: the sliding window of its attention, `None` for full causal attention.
    pub windows: Vec<Option<usize>>,
    /// Every layer's feed-forward block is this mixture of experts (instead of one SwiGLU of
    /// `ffn_dim`).
    pub moe: Option<Moe>,
    /// Where the weights come from.
    pub layout: WeightLayout,
}

/// The longest context a [`DecoderConfig`] may declare. The RoPE table is built for the whole
/// context when the model loads, so a file's context length must not be able to demand an
/// arbitrary amount of memory; 2^20 positions of a 128-wide head take 512 MiB of table.
pub const MAX_CONTEXT: usize = 1 << 20;

impl DecoderConfig {
    /// A Llama (SwiGLU, RMSNorm, plain RoPE, no biases) of the given sizes, head dimension
    /// `dim / heads`: the starting point of [`Decoder::synthetic`](super::Decoder::synthetic)
    /// models and of hand-written configurations.
    #[allow(clippy::too_many_arguments)]
    pub fn llama(
        dim: usize,
        layers: usize,
        heads: usize,
        kv_heads: usize,
        ffn_dim: usize,
        vocab: usize,
        context: usize,
        layout: WeightLayout,
    ) -> DecoderConfig {
        DecoderConfig {
            family: Family::Llama,
            dim,
            layers,
            heads,
            kv_heads,
            head_dim: dim.checked_div(heads).unwrap_or(0),
            ffn_dim,
            vocab,
            context,
            rms_eps: 1e-5,
            norm_plus_one: false,
            rope_style: match layout {
                WeightLayout::Gguf => RopeStyle::AdjacentPairs,
                WeightLayout::HuggingFace => RopeStyle::SplitHalf,
            },
            rope: Rope {
                base: 10000.0,
                scaling: RopeScaling::None,
            },
            rope_local: None,
            qkv_bias: false,
            out_bias: false,
            qk_norm: false,
            sandwich_norms: false,
            activation: Activation::Silu,
            embed_scale: None,
            attn_scale: default_attn_scale(dim.checked_div(heads).unwrap_or(1)),
            attn_softcap: None,
            final_softcap: None,
            windows: vec![None; layers.min(MAX_LAYERS)],
            moe: None,
            layout,
        }
    }

    /// Elements of one position's keys (or values): `kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Elements of one position's queries (and of the attention output): `heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Errors with [`Error::Config`] when the numbers cannot describe a decoder.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(format!("decoder: {msg}")));
        let nonzero = [
            ("embedding length", self.dim),
            ("block count", self.layers),
            ("head count", self.heads),
            ("KV head count", self.kv_heads),
            ("head dimension", self.head_dim),
            ("feed-forward length", self.ffn_dim),
            ("vocabulary size", self.vocab),
            ("context length", self.context),
        ];
        for (what, v) in nonzero {
            if v == 0 {
                return bad(format!("{what} is 0"));
            }
        }
        if self.layers > MAX_LAYERS {
            return bad(format!(
                "{} blocks, more than the {MAX_LAYERS} qkv accepts",
                self.layers
            ));
        }
        if self.windows.len() != self.layers {
            return bad(format!(
                "{} per-layer windows for {} layers",
                self.windows.len(),
                self.layers
            ));
        }
        if self.windows.contains(&Some(0)) {
            return bad("a sliding window of 0 positions".into());
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head dim {} is odd, RoPE needs pairs",
                self.head_dim
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of {} KV heads",
                self.heads, self.kv_heads
            ));
        }
        if self.heads.checked_mul(self.head_dim).is_none() {
            return bad("heads × head dim overflows".into());
        }
        for rope in std::iter::once(&self.rope).chain(&self.rope_local) {
            if !(rope.base.is_finite() && rope.base > 0.0) {
                return bad(format!("RoPE base {} is not a positive number", rope.base));
            }
            let factors = match rope.scaling {
                RopeScaling::Linear { factor } => vec![factor],
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_context,
                } => {
                    if high_freq_factor <= low_freq_factor {
                        return bad(format!(
                            "llama3 RoPE high_freq_factor {high_freq_factor} is not above \
                             low_freq_factor {low_freq_factor}"
                        ));
                    }
                    vec![factor, low_freq_factor, high_freq_factor, original_context]
                }
                RopeScaling::Yarn {
                    factor,
                    original_context,
                    beta_fast,
                    beta_slow,
                    attention_factor,
                    ..
                } => vec![
                    factor,
                    original_context,
                    beta_fast,
                    beta_slow,
                    attention_factor,
                ],
                RopeScaling::None | RopeScaling::FileFactors => vec![],
            };
            if let Some(f) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                return bad(format!(
                    "RoPE scaling parameter {f} is not a positive number"
                ));
            }
        }
        let positive = [
            ("RMS epsilon", Some(self.rms_eps)),
            ("attention scale", Some(self.attn_scale)),
            ("embedding scale", self.embed_scale),
            ("attention soft-cap", self.attn_softcap),
            ("final logit soft-cap", self.final_softcap),
        ];
        for (what, v) in positive {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return bad(format!("{what} {v} is not a positive number"));
            }
        }
        if let Some(m) = &self.moe {
            for (what, v) in [
                ("expert count", m.experts),
                ("experts used per token", m.used),
                ("expert feed-forward length", m.expert_ffn),
                (
                    "shared expert feed-forward length",
                    m.shared_ffn.unwrap_or(1),
                ),
            ] {
                if v == 0 {
                    return bad(format!("{what} is 0"));
                }
            }
            if m.used > m.experts {
                return bad(format!(
                    "{} experts used per token, of {} experts",
                    m.used, m.experts
                ));
            }
            if m.experts > MAX_EXPERTS {
                return bad(format!(
                    "{} experts, more than the {MAX_EXPERTS} qkv accepts",
                    m.experts
                ));
            }
        }
        if self.context > MAX_CONTEXT {
            return bad(format!(
                "context length {} is more than the {MAX_CONTEXT} positions qkv supports",
                self.context
            ));
        }
        Ok(())
    }
}

/// `1/√head_dim`, rounded once to f32 (transformers' `head_dim**-0.5`).
pub(crate) fn default_attn_scale(head_dim: usize) -> f32 {
    (1.0 / (head_dim.max(1) as f64).sqrt()) as f32
}

/// The most blocks a configuration may declare (the largest real models have ~130).
pub const MAX_LAYERS: usize = 4096;

/// The most experts per layer a configuration may declare (the largest real models have 512).
pub const MAX_EXPERTS: usize = 4096;

/// Wraps configuration errors with the file they came from.
pub(crate) fn in_file(path: &Path, e: Error) -> Error {
    match e {
        Error::MissingTensor { .. }
        | Error::TensorShape { .. }
        | Error::UnsupportedDType { .. }
        | Error::Config(_) => Error::InFile {
            path: path.to_owned(),
            source: Box::new(e),
        },
        other => other,
    }
}
