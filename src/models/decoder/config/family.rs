//! [`FAMILIES`]: what each decoder family is, written once. Both configuration readers look
//! the family up here and take only the numbers from the file; a new family is one row of
//! this table (plus its tensor names, if they differ) and its tests.

use super::{
    default_attn_scale, Activation, DecoderConfig, Family, Rope, RopeScaling, WeightLayout,
    MAX_LAYERS,
};
use qkv_kernels::rope::RopeStyle;

/// Where a family's Q/K/V biases come from in a Hugging Face config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfQkvBias {
    /// From `attention_bias` (which also puts a bias on the output projection).
    AttentionBias,
    /// Always there (Qwen2).
    Always,
    /// From the family's own `qkv_bias` key, on when it is missing (Qwen2-MoE).
    QkvBiasKey,
}

/// Whether a family's feed-forward blocks are mixtures of experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Experts {
    /// Never: expert keys are refused.
    None,
    /// When the file declares them (Mixtral files in the Llama family; in a Hugging Face
    /// config, `model_type` `mixtral`).
    Optional,
    /// Always: a file without experts is refused.
    Required,
}

/// The mixture of experts of a family, as llama.cpp runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeTraits {
    /// Whether there are experts.
    pub experts: Experts,
    /// The top-k weights are renormalised (GGUF files; a Hugging Face config says it with
    /// `norm_topk_prob`).
    pub gguf_norm_topk: bool,
    /// A shared expert behind a sigmoid gate runs beside the routed ones (Qwen2-MoE).
    pub shared_expert: bool,
}

/// Which layers use the sliding window when the file gives no per-layer list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowTraits {
    /// The period of the pattern: in each run of `period` layers the last is global and the
    /// others local; 0 makes every layer local.
    pub period: usize,
    /// The window when the file gives none (Gemma 2: 4096, the default of llama.cpp and
    /// transformers); `None` leaves every layer global.
    pub default: Option<usize>,
}

/// One row of [`FAMILIES`]: the facts of a family that no file states.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FamilyTraits {
    /// The family.
    pub family: Family,
    /// Its GGUF `general.architecture`.
    pub gguf_arch: &'static str,
    /// The Hugging Face `model_type`s that are this family.
    pub hf_model_types: &'static [&'static str],
    /// Norm weights are applied as `1 + w` in Hugging Face files (Gemma); llama.cpp's
    /// converter folds the 1 into the GGUF weights.
    pub hf_norm_plus_one: bool,
    /// Queries and keys are RMS-normalised per head before RoPE.
    pub qk_norm: bool,
    /// Norms after attention and after the feed-forward block too.
    pub sandwich_norms: bool,
    /// The feed-forward gate's activation.
    pub activation: Activation,
    /// The Hugging Face key that names the activation.
    pub hf_activation_key: &'static str,
    /// The embedding rows are multiplied by `√dim`.
    pub embed_scale_sqrt_dim: bool,
    /// Reads the soft-cap keys of a Hugging Face config (GGUF files have them or not).
    pub softcaps: bool,
    /// The attention soft-cap when the file has no key (Gemma 2: 50).
    pub default_attn_softcap: Option<f32>,
    /// Sliding-window layers.
    pub windows: WindowTraits,
    /// The sliding-window layers have a RoPE of their own (base 10000, no scaling, unless
    /// the file says otherwise).
    pub local_rope: bool,
    /// RoPE's pairs in GGUF files (llama.cpp permutes Q and K of the `llama` architecture
    /// for adjacent pairs); Hugging Face files always rotate halves.
    pub gguf_rope_style: RopeStyle,
    /// Q/K/V biases in Hugging Face configs.
    pub hf_qkv_bias: HfQkvBias,
    /// A Hugging Face `attention_bias` is accepted.
    pub attention_bias: bool,
    /// A Hugging Face window without `layer_types` is refused (Qwen2's `max_window_layers`
    /// form, which qkv does not run).
    pub hf_window_needs_layer_types: bool,
    /// Attention scores scale by a Hugging Face `query_pre_attn_scalar^-½` when given.
    pub query_pre_attn_scalar: bool,
    /// The block count of the model that llama.cpp scales by `1/√(dim / heads)` instead of
    /// `1/√head_dim` (the 27B Gemmas).
    pub gguf_dim_scaled_layers: Option<usize>,
    /// Q, K, V are one fused tensor, and so are gate and up (Phi-3).
    pub fused_projections: bool,
    /// Mixture of experts.
    pub moe: MoeTraits,
}

/// Every window global, unless the file gives a window; then every layer local.
const ALL_LOCAL: WindowTraits = WindowTraits {
    period: 0,
    default: None,
};

const DENSE: MoeTraits = MoeTraits {
    experts: Experts::None,
    gguf_norm_topk: true,
    shared_expert: false,
};

/// Llama: the row the others differ from.
const LLAMA: FamilyTraits = FamilyTraits {
    family: Family::Llama,
    gguf_arch: "llama",
    hf_model_types: &["llama", "mistral", "smollm3", "mixtral"],
    hf_norm_plus_one: false,
    qk_norm: false,
    sandwich_norms: false,
    activation: Activation::Silu,
    hf_activation_key: "hidden_act",
    embed_scale_sqrt_dim: false,
    softcaps: false,
    default_attn_softcap: None,
    windows: ALL_LOCAL,
    local_rope: false,
    gguf_rope_style: RopeStyle::AdjacentPairs,
    hf_qkv_bias: HfQkvBias::AttentionBias,
    attention_bias: true,
    hf_window_needs_layer_types: false,
    query_pre_attn_scalar: false,
    gguf_dim_scaled_layers: None,
    fused_projections: false,
    moe: MoeTraits {
        experts: Experts::Optional,
        ..DENSE
    },
};

/// What every family but Llama shares: halves rotated, no attention biases, no experts.
const NOT_LLAMA: FamilyTraits = FamilyTraits {
    gguf_rope_style: RopeStyle::SplitHalf,
    attention_bias: false,
    moe: DENSE,
    ..LLAMA
};

const QWEN2: FamilyTraits = FamilyTraits {
    family: Family::Qwen2,
    gguf_arch: "qwen2",
    hf_model_types: &["qwen2"],
    hf_qkv_bias: HfQkvBias::Always,
    hf_window_needs_layer_types: true,
    ..NOT_LLAMA
};

const QWEN3: FamilyTraits = FamilyTraits {
    family: Family::Qwen3,
    gguf_arch: "qwen3",
    hf_model_types: &["qwen3"],
    qk_norm: true,
    ..NOT_LLAMA
};

const GEMMA2: FamilyTraits = FamilyTraits {
    family: Family::Gemma2,
    gguf_arch: "gemma2",
    hf_model_types: &["gemma2"],
    hf_norm_plus_one: true,
    sandwich_norms: true,
    activation: Activation::GeluTanh,
    hf_activation_key: "hidden_activation",
    embed_scale_sqrt_dim: true,
    softcaps: true,
    default_attn_softcap: Some(50.0),
    windows: WindowTraits {
        period: 2,
        default: Some(4096),
    },
    query_pre_attn_scalar: true,
    gguf_dim_scaled_layers: Some(46),
    ..NOT_LLAMA
};

/// The families qkv's decoder runs, one row each.
pub const FAMILIES: &[FamilyTraits] = &[
    LLAMA,
    QWEN2,
    QWEN3,
    FamilyTraits {
        family: Family::Phi3,
        gguf_arch: "phi3",
        hf_model_types: &["phi3"],
        fused_projections: true,
        ..NOT_LLAMA
    },
    GEMMA2,
    FamilyTraits {
        family: Family::Gemma3,
        gguf_arch: "gemma3",
        hf_model_types: &["gemma3_text"],
        qk_norm: true,
        default_attn_softcap: None,
        windows: WindowTraits {
            period: 6,
            default: None,
        },
        local_rope: true,
        gguf_dim_scaled_layers: Some(62),
        ..GEMMA2
    },
    FamilyTraits {
        family: Family::Qwen3Moe,
        gguf_arch: "qwen3moe",
        hf_model_types: &["qwen3_moe"],
        moe: MoeTraits {
            experts: Experts::Required,
            ..DENSE
        },
        ..QWEN3
    },
    FamilyTraits {
        family: Family::Qwen2Moe,
        gguf_arch: "qwen2moe",
        hf_model_types: &["qwen2_moe"],
        hf_qkv_bias: HfQkvBias::QkvBiasKey,
        moe: MoeTraits {
            experts: Experts::Required,
            gguf_norm_topk: false,
            shared_expert: true,
        },
        ..QWEN2
    },
];

impl Family {
    /// The family's row of [`FAMILIES`].
    pub fn traits(self) -> &'static FamilyTraits {
        FAMILIES
            .iter()
            .find(|t| t.family == self)
            .expect("every family has a row")
    }

    /// The GGUF `general.architecture` of the family.
    pub fn gguf_arch(self) -> &'static str {
        self.traits().gguf_arch
    }

    pub(crate) fn from_gguf_arch(arch: &str) -> Option<Family> {
        FAMILIES
            .iter()
            .find(|t| t.gguf_arch == arch)
            .map(|t| t.family)
    }

    /// The family of a Hugging Face `model_type`.
    pub(crate) fn from_model_type(model_type: &str) -> Option<Family> {
        FAMILIES
            .iter()
            .find(|t| t.hf_model_types.contains(&model_type))
            .map(|t| t.family)
    }
}

impl Activation {
    /// The name transformers gives the activation.
    pub fn hf_name(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
        }
    }
}

impl WindowTraits {
    /// Per layer, whether it is local, for a pattern of period `period` (0: all local).
    pub(crate) fn local_layers(period: usize, layers: usize) -> Vec<bool> {
        (0..layers)
            .map(|l| period == 0 || l % period < period - 1)
            .collect()
    }
}

/// The sizes every reader takes from the file before anything else.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    pub dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab: usize,
    pub context: usize,
    pub rms_eps: f32,
}

impl FamilyTraits {
    /// A configuration of this family with the file's `sizes`, laid out as `layout`: the
    /// family's traits, and what a file may change left plain (RoPE of base 10000 without
    /// scaling, full attention in every layer, no biases, soft-caps or experts, scores
    /// scaled by `1/√head_dim`) for the reader to fill in.
    pub(crate) fn config(&self, sizes: Sizes, layout: WeightLayout) -> DecoderConfig {
        let Sizes {
            dim,
            layers,
            heads,
            kv_heads,
            head_dim,
            ffn_dim,
            vocab,
            context,
            rms_eps,
        } = sizes;
        let hf = layout == WeightLayout::HuggingFace;
        DecoderConfig {
            family: self.family,
            dim,
            layers,
            heads,
            kv_heads,
            head_dim,
            ffn_dim,
            vocab,
            context,
            rms_eps,
            norm_plus_one: hf && self.hf_norm_plus_one,
            rope_style: if hf {
                RopeStyle::SplitHalf
            } else {
                self.gguf_rope_style
            },
            rope: Rope {
                base: 10000.0,
                scaling: RopeScaling::None,
            },
            rope_local: None,
            qkv_bias: false,
            out_bias: false,
            qk_norm: self.qk_norm,
            sandwich_norms: self.sandwich_norms,
            activation: self.activation,
            embed_scale: self
                .embed_scale_sqrt_dim
                .then(|| (dim as f64).sqrt() as f32),
            attn_scale: default_attn_scale(head_dim),
            attn_softcap: None,
            final_softcap: None,
            windows: vec![None; layers.min(MAX_LAYERS)],
            moe: None,
            layout,
        }
    }
}
