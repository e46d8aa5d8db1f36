//! One decoder-only transformer for every family qkv runs (Llama 2/3/3.1/3.2, SmolLM2/3,
//! Mistral, Mixtral, Qwen2/2.5, Qwen2-MoE, Qwen3, Qwen3-MoE, Phi-3, Gemma 2, Gemma 3),
//! described by a [`DecoderConfig`] and running on the `qkv-kernels`.
//!
//! One layer, for `t` new positions starting at absolute position `p₀` (brackets: only where
//! the configuration asks for it):
//!
//! ```text
//! q, k, v = Wq·n₁(x) [+bq], Wk·n₁(x) [+bk], Wv·n₁(x) [+bv]
//! q, k    = rope([rms_head(q)]), rope([rms_head(k)])            (the layer's RoPE table)
//! a       = Wo · attention(q, k ⧺ cache, v ⧺ cache) [+bo]      (causal [, window] [, soft-cap])
//! h       = x + [n₂](a)
//! f       = Wdown · (act(Wgate·n₃(h)) ⊙ Wup·n₃(h))             (act: silu, or tanh-GELU)
//! out     = h + [n₄](f)
//! ```
//!
//! where the `nᵢ` are RMSNorms (`n₂`, `n₄`: Gemma's sandwich norms); in a mixture of experts
//! `f` is instead the weighted sum of the router's top-k SwiGLU experts (and a gated shared
//! one), each chosen expert's weights read once per pass (see `moe.rs`). Then
//! `logits = [softcap](Wout · rms(out))` for the last position only (the prompt positions
//! before it never pay for the LM head). The embedding rows may be scaled (Gemma's `√dim`).
//! Attention is grouped-query: query head `h` reads KV head `h / (heads / kv_heads)`, which
//! the attention kernel does by itself, and the sliding window is the kernel's own mask.
//!
//! Weights come from a GGUF file (llama.cpp names: `blk.N.attn_q.weight`…) or a Hugging Face
//! directory (`model.layers.N.self_attn.q_proj.weight`…). For the `llama` architecture the
//! two differ in RoPE layout: llama.cpp's converter permutes the rows of Q and K so that
//! rotation pairs are adjacent elements ([`RopeStyle::AdjacentPairs`](qkv_kernels::rope::RopeStyle::AdjacentPairs)), where Hugging Face
//! keeps the two halves of each head apart ([`RopeStyle::SplitHalf`](qkv_kernels::rope::RopeStyle::SplitHalf)); the style is part of
//! the configuration, so no weight is copied to undo the permutation. Phi-3's fused QKV and
//! gate/up matrices are split into views of their rows at load, without a copy.
//!
//! The per-sequence state — the KV cache and every scratch buffer — is a [`DecoderState`],
//! sized once; a forward pass allocates nothing.

pub mod config;
mod forward;
pub mod lora;
mod moe;
mod state;

pub use forward::Segment;
pub use lora::{LoraAdapter, ScaledLora};

use state::KvStore;
pub use state::{DecoderState, KvCache, KvType, Scratch};

pub use config::{
    Activation, DecoderConfig, Family, Moe, Rope, RopeScaling, WeightLayout, GGUF_ARCHITECTURES,
    HF_MODEL_TYPES, MAX_CONTEXT, MAX_EXPERTS, MAX_LAYERS,
};
pub use moe::MoeScratch;
use moe::{Ffn, GatedMlp};

use crate::error::{Error, Result};
use crate::nn::{Linear, RmsNorm};
use crate::weights::{FloatType, MatrixOptions, Tensor, TensorSource, WeightFormat};
use qkv_kernels::quant::act::ActPrecision;
use qkv_kernels::rope::{inv_freq, RopeTable};

/// The names of one block's tensors in a layout; `part` is the GGUF spelling.
fn layer_name(c: &DecoderConfig, layer: usize, part: &str, suffix: &str) -> String {
    match c.layout {
        WeightLayout::Gguf => format!("blk.{layer}.{part}.{suffix}"),
        WeightLayout::HuggingFace => {
            let hf = match part {
                "attn_norm" => "input_layernorm",
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_qkv" => "self_attn.qkv_proj",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
                "attn_output" => "self_attn.o_proj",
                // Gemma's post-attention norm is applied to the attention output; in the
                // other families the same name is the norm before the feed-forward block.
                "post_attention_norm" => "post_attention_layernorm",
                "ffn_norm" if c.sandwich_norms => "pre_feedforward_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                "post_ffw_norm" => "post_feedforward_layernorm",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_gate_up" => "mlp.gate_up_proj",
                "ffn_down" => "mlp.down_proj",
                other => other,
            };
            format!("model.layers.{layer}.{hf}.{suffix}")
        }
    }
}

/// The names of the embedding, final norm and output head in a layout.
fn global_names(layout: WeightLayout) -> [&'static str; 3] {
    match layout {
        WeightLayout::Gguf => ["token_embd.weight", "output_norm.weight", "output.weight"],
        WeightLayout::HuggingFace => [
            "model.embed_tokens.weight",
            "model.norm.weight",
            "lm_head.weight",
        ],
    }
}

/// The weights of one transformer block.
struct Block {
    attn_norm: RmsNorm,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    wo: Linear,
    attn_post_norm: Option<RmsNorm>,
    ffn_norm: RmsNorm,
    ffn: Ffn,
    ffn_post_norm: Option<RmsNorm>,
}

impl Block {
    fn attn_matrices(&self) -> [&Tensor; 4] {
        [
            self.wq.weight(),
            self.wk.weight(),
            self.wv.weight(),
            self.wo.weight(),
        ]
    }

    fn matrices(&self) -> Vec<moe::Matrix<'_>> {
        let mut all: Vec<_> = self.attn_matrices().into_iter().map(Into::into).collect();
        all.extend(self.ffn.matrices());
        all
    }
}

/// A loaded decoder: configuration, weights (mapped or owned) and the RoPE tables.
/// Immutable, `Send + Sync`; any number of [`DecoderState`]s run on one `Decoder` at once.
pub struct Decoder {
    /// Unique per model ([`super::next_model_id`]): a state made by another is refused.
    id: u64,
    config: DecoderConfig,
    /// The KV cache's default dtype: f32 for a model whose matrices are f32, else f16 (bf16
    /// matrices included, as 16-bit weights).
    kv_dtype: FloatType,
    /// The precision at which activations meet its interleaved quantized matrices
    /// ([`MatrixOptions::act_precision`]).
    act_precision: ActPrecision,
    embedding: Tensor,
    blocks: Vec<Block>,
    final_norm: RmsNorm,
    /// `None` when the output head is tied to the embedding.
    output: Option<Tensor>,
    /// RoPE of the global layers, and of the local ones when they differ (Gemma 3).
    rope: RopeTable,
    rope_local: Option<RopeTable>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("config", &self.config)
            .field("kv_dtype", &self.kv_dtype)
            .field("tied_output", &self.output.is_none())
            .finish()
    }
}

/// The RoPE table of `rope` for heads of `head_dim` and `positions` positions.
/// `file_factors` are GGUF's `rope_freqs.weight` divisors, when the scaling says to use them.
fn rope_table(
    rope: &Rope,
    head_dim: usize,
    positions: usize,
    file_factors: Option<&[f32]>,
) -> Result<RopeTable> {
    let mut freqs = inv_freq(head_dim, rope.base)?;
    match &rope.scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => freqs.iter_mut().for_each(|f| *f /= factor),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context,
        } => {
            // transformers' `_compute_llama3_parameters`, step by step in f32.
            let low_wavelen = original_context / low_freq_factor;
            let high_wavelen = original_context / high_freq_factor;
            for f in &mut freqs {
                let wavelen = (2.0 * std::f32::consts::PI) / *f;
                let scaled = if wavelen > low_wavelen {
                    *f / factor
                } else {
                    *f
                };
                let smooth = (original_context / wavelen - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                *f = if medium { smoothed } else { scaled };
            }
        }
        RopeScaling::FileFactors => {
            let factors = file_factors.ok_or_else(|| Error::MissingTensor {
                name: "rope_freqs.weight".into(),
            })?;
            if factors.len() != freqs.len() {
                return Err(Error::TensorShape {
                    name: "rope_freqs.weight".into(),
                    expected: vec![freqs.len()],
                    actual: vec![factors.len()],
                });
            }
            if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                return Err(Error::Config(format!(
                    "rope_freqs.weight holds {bad}, not a positive divisor"
                )));
            }
            freqs.iter_mut().zip(factors).for_each(|(f, d)| *f /= d);
        }
        RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => yarn_inv_freq(
            &mut freqs,
            rope.base,
            head_dim,
            *factor,
            *original_context,
            (*beta_fast, *beta_slow),
            *truncate,
        ),
    }
    Ok(RopeTable::from_inv_freq(&freqs, positions)?)
}

/// YaRN's frequencies, step by step as transformers' `_compute_yarn_parameters` computes
/// them: the correction range in f64 (Python floats), the ramp and the blend in f32.
/// `freqs` holds the unscaled frequencies and becomes the blended ones.
fn yarn_inv_freq(
    freqs: &mut [f32],
    base: f32,
    head_dim: usize,
    factor: f32,
    original_context: f32,
    (beta_fast, beta_slow): (f32, f32),
    truncate: bool,
) {
    let (dim, base64) = (head_dim as f64, f64::from(base));
    // The pair index at which a frequency turns `rotations` times over the original context.
    let correction = |rotations: f32| {
        let turns =
            f64::from(original_context) / (f64::from(rotations) * 2.0 * std::f64::consts::PI);
        dim * turns.ln() / (2.0 * base64.ln())
    };
    let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001;
    }
    let (low32, span) = (low as f32, (high - low) as f32);
    for (i, f) in freqs.iter_mut().enumerate() {
        // `base ** (2i / dim)` as torch rounds it: the same power `inv_freq` inverts.
        let e = (2 * i) as f32 / head_dim as f32;
        let pos = (base64).powf(f64::from(e)) as f32;
        let interpolated = 1.0 / (factor * pos);
        let ramp = ((i as f32 - low32) / span).clamp(0.0, 1.0);
        let extrapolate = 1.0 - ramp;
        *f = interpolated * (1.0 - extrapolate) + *f * extrapolate;
    }
}

impl Decoder {
    /// Loads the weights `config` names from `source`. With `widen: None` every matrix stays
    /// as stored — f32, f16 or quantized blocks, mapped without a copy; with `Some(dtype)`
    /// each is widened (or rounded) to `dtype` at load. 1-D weights (norms, biases) are
    /// always widened to f32. The output head is tied to the embedding when the source has
    /// no separate one. `matrices` say how the matrices are prepared for the kernels
    /// ([`Tensor::interleaved`]).
    pub fn load(
        config: DecoderConfig,
        source: &dyn TensorSource,
        widen: Option<FloatType>,
        matrices: &MatrixOptions,
    ) -> Result<Decoder> {
        config.validate()?;
        let c = &config;
        let (d, qd, kvd, ff) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let tensor = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let t = source.tensor(name)?;
            t.expect_shape(shape)?;
            Ok(t)
        };
        let widened = |t: Tensor| -> Result<Tensor> {
            match widen {
                Some(dtype) => t.into_dtype(dtype),
                None => Ok(t),
            }
        };
        let vector = |name: &str, len: usize| tensor(name, &[len])?.to_f32_vec();
        let norm =
            |name: &str, len: usize| RmsNorm::new(vector(name, len)?, c.rms_eps, c.norm_plus_one);
        let linear =
            |l: usize, part: &str, rows: usize, cols: usize, bias: bool| -> Result<Linear> {
                let w = widened(tensor(&layer_name(c, l, part, "weight"), &[rows, cols])?)?;
                let b = match bias {
                    true => Some(vector(&layer_name(c, l, part, "bias"), rows)?),
                    false => None,
                };
                Linear::from_tensors_with(w, b, matrices)
            };
        // A fused matrix split into views of its rows (Phi-3).
        let fused = |l: usize, part: &str, rows: &[usize], cols: usize| -> Result<Vec<Linear>> {
            let name = layer_name(c, l, part, "weight");
            let t = tensor(&name, &[rows.iter().sum(), cols])?;
            t.split_rows(rows)?
                .into_iter()
                .map(|t| Linear::from_tensors_with(widened(t)?, None, matrices))
                .collect()
        };
        // Not `with_capacity(c.layers)`: the count comes from the file, the blocks from its tensors.
        let mut blocks = Vec::new();
        for l in 0..c.layers {
            let n = |part: &str| layer_name(c, l, part, "weight");
            let (wq, wk, wv) = if c.family.traits().fused_projections {
                let mut p = fused(l, "attn_qkv", &[qd, kvd, kvd], d)?.into_iter();
                let mut next = || p.next().expect("three parts");
                (next(), next(), next())
            } else {
                (
                    linear(l, "attn_q", qd, d, c.qkv_bias)?,
                    linear(l, "attn_k", kvd, d, c.qkv_bias)?,
                    linear(l, "attn_v", kvd, d, c.qkv_bias)?,
                )
            };
            let ffn = if let Some(m) = &c.moe {
                Ffn::Moe(moe::load_moe(c, m, l, source, &widened, matrices)?)
            } else {
                let (gate, up) = if c.family.traits().fused_projections {
                    let part = match c.layout {
                        WeightLayout::Gguf => "ffn_up",
                        WeightLayout::HuggingFace => "ffn_gate_up",
                    };
                    let mut p = fused(l, part, &[ff, ff], d)?.into_iter();
                    let mut next = || p.next().expect("two parts");
                    (next(), next())
                } else {
                    (
                        linear(l, "ffn_gate", ff, d, false)?,
                        linear(l, "ffn_up", ff, d, false)?,
                    )
                };
                let down = linear(l, "ffn_down", d, ff, false)?;
                Ffn::Dense(GatedMlp { gate, up, down })
            };
            let sandwich = |part: &str| -> Result<Option<RmsNorm>> {
                c.sandwich_norms.then(|| norm(&n(part), d)).transpose()
            };
            let qk = |part: &str| -> Result<Option<RmsNorm>> {
                c.qk_norm.then(|| norm(&n(part), c.head_dim)).transpose()
            };
            blocks.push(Block {
                attn_norm: norm(&n("attn_norm"), d)?,
                wq,
                wk,
                wv,
                q_norm: qk("attn_q_norm")?,
                k_norm: qk("attn_k_norm")?,
                wo: linear(l, "attn_output", d, qd, c.out_bias)?,
                attn_post_norm: sandwich("post_attention_norm")?,
                ffn_norm: norm(&n("ffn_norm"), d)?,
                ffn,
                ffn_post_norm: sandwich("post_ffw_norm")?,
            });
        }
        let [embedding_name, final_norm_name, output_name] = global_names(c.layout);
        // The output head is the largest matrix a step reads (an 8th of a 1B model's bytes):
        // interleaved like the others, and so is an embedding that serves as the head. Its
        // row lookups take the one row apart again, which costs nothing next to the head.
        let tied = !source.contains(output_name);
        let embedding = widened(tensor(embedding_name, &[c.vocab, d])?)?;
        let embedding = if tied {
            embedding.interleaved(matrices)?
        } else {
            embedding
        };
        let output = if tied {
            None
        } else {
            Some(widened(tensor(output_name, &[c.vocab, d])?)?.interleaved(matrices)?)
        };
        let final_norm = norm(final_norm_name, d)?;
        let file_factors = match c.rope.scaling {
            RopeScaling::FileFactors => Some(source.tensor("rope_freqs.weight")?.to_f32_vec()?),
            _ => None,
        };
        let rope = rope_table(&c.rope, c.head_dim, c.context, file_factors.as_deref())?;
        let rope_local = c
            .rope_local
            .as_ref()
            .map(|r| rope_table(r, c.head_dim, c.context, None))
            .transpose()?;
        let kv_dtype = match widen {
            Some(dtype) => dtype,
            None if blocks[0].wq.weight().format() == WeightFormat::F32 => FloatType::F32,
            None => FloatType::F16,
        };
        Ok(Decoder {
            id: super::next_model_id(),
            config,
            kv_dtype,
            act_precision: matrices.act_precision,
            embedding,
            blocks,
            final_norm,
            output,
            rope,
            rope_local,
        })
    }

    /// A model with deterministic pseudo-random weights (uniform, scaled by `1/√fan_in`, norm
    /// weights 1, biases 0): for tests, documentation and benchmarks that must not need a
    /// real file. The same `config`, `seed` and `dtype` give the same model.
    ///
    /// ```
    /// use qkv::models::decoder::{Decoder, DecoderConfig, WeightLayout};
    /// use qkv::weights::FloatType;
    /// let config = DecoderConfig::llama(64, 2, 4, 2, 128, 100, 256, WeightLayout::Gguf);
    /// let model = Decoder::synthetic(config, 7, FloatType::F32)?;
    /// let mut state = model.new_state(32, FloatType::F32, 8)?;
    /// let mut logits = vec![0.0; 100];
    /// model.forward(&mut state, &[1, 2, 3], 0, Some(&mut logits))?;
    /// assert!(logits.iter().all(|x| x.is_finite()));
    /// # Ok::<(), qkv::Error>(())
    /// ```
    pub fn synthetic(config: DecoderConfig, seed: u64, dtype: FloatType) -> Result<Decoder> {
        config.validate()?;
        let mut state = seed ^ 0x853C_49E6_748F_EA9B;
        let mut uniform = move || {
            // 64-bit LCG (Knuth's MMIX constants); the top 24 bits as a float in [-1, 1).
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let mut matrix = |name: String, rows: usize, cols: usize| -> Result<Tensor> {
            let scale = 1.0 / (cols as f32).sqrt();
            let data = (0..rows * cols).map(|_| uniform() * scale).collect();
            Tensor::from_f32(&name, vec![rows, cols], data)?.into_dtype(dtype)
        };
        let c = &config;
        let (d, qd, kvd, ff) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let ones = |n: usize| {
            RmsNorm::new(
                vec![if c.norm_plus_one { 0.0 } else { 1.0 }; n],
                c.rms_eps,
                c.norm_plus_one,
            )
        };
        type MatrixFn<'a> = dyn FnMut(String, usize, usize) -> Result<Tensor> + 'a;
        let linear = |matrix: &mut MatrixFn<'_>,
                      name: String,
                      rows: usize,
                      cols: usize,
                      bias: bool|
         -> Result<Linear> {
            Linear::from_tensors(matrix(name, rows, cols)?, bias.then(|| vec![0.0; rows]))
        };
        // Not `with_capacity(c.layers)`: the count comes from the file, the blocks from its tensors.
        let mut blocks = Vec::new();
        for l in 0..c.layers {
            let n = |part: &str| layer_name(c, l, part, "weight");
            let opt = |on: bool, dim: usize| on.then(|| ones(dim)).transpose();
            let mx: &mut MatrixFn<'_> = &mut matrix;
            let wq = linear(mx, n("attn_q"), qd, d, c.qkv_bias)?;
            let wk = linear(mx, n("attn_k"), kvd, d, c.qkv_bias)?;
            let wv = linear(mx, n("attn_v"), kvd, d, c.qkv_bias)?;
            let wo = linear(mx, n("attn_output"), d, qd, c.out_bias)?;
            let ffn = match &c.moe {
                Some(m) => Ffn::Moe(moe::synthetic_moe(c, m, l, mx)?),
                None => Ffn::Dense(GatedMlp {
                    gate: linear(mx, n("ffn_gate"), ff, d, false)?,
                    up: linear(mx, n("ffn_up"), ff, d, false)?,
                    down: linear(mx, n("ffn_down"), d, ff, false)?,
                }),
            };
            blocks.push(Block {
                attn_norm: ones(d)?,
                wq,
                wk,
                wv,
                q_norm: opt(c.qk_norm, c.head_dim)?,
                k_norm: opt(c.qk_norm, c.head_dim)?,
                wo,
                attn_post_norm: opt(c.sandwich_norms, d)?,
                ffn_norm: ones(d)?,
                ffn,
                ffn_post_norm: opt(c.sandwich_norms, d)?,
            });
        }
        let embedding = matrix(global_names(c.layout)[0].into(), c.vocab, d)?;
        let file_factors = vec![1.0; c.head_dim / 2];
        let rope = rope_table(&c.rope, c.head_dim, c.context, Some(&file_factors))?;
        let rope_local = c
            .rope_local
            .as_ref()
            .map(|r| rope_table(r, c.head_dim, c.context, None))
            .transpose()?;
        Ok(Decoder {
            id: super::next_model_id(),
            final_norm: ones(d)?,
            config,
            kv_dtype: dtype,
            // Float matrices only: no activation is rounded.
            act_precision: ActPrecision::Wide,
            embedding,
            blocks,
            output: None,
            rope,
            rope_local,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// A fingerprint of what this model computes, the same in every process that loads the
    /// same file with the same options: its configuration, the formats of its matrices, its
    /// activation precision and the weights of its norms (which differ between fine-tunes of
    /// one shape). A saved KV cache carries it, and is refused by a model with another.
    pub fn fingerprint(&self) -> u64 {
        use crate::alloc::{fnv1a, FNV_START};
        let described = format!(
            "{:?}|{:?}|{:?}|{:?}",
            self.config,
            self.weight_formats(),
            self.act_precision,
            self.kv_dtype
        );
        let mut h = fnv1a(FNV_START, described.as_bytes());
        let norms = self
            .blocks
            .iter()
            .flat_map(|b| [&b.attn_norm, &b.ffn_norm])
            .chain([&self.final_norm]);
        for norm in norms {
            for w in norm.weight() {
                h = fnv1a(h, &w.to_le_bytes());
            }
        }
        h
    }

    /// The KV cache's default dtype: f32 when the matrices are f32 (as stored or widened),
    /// else f16.
    pub fn kv_dtype(&self) -> FloatType {
        self.kv_dtype
    }

    /// The precision at which activations meet the interleaved quantized matrices
    /// ([`ModelOptions::act_precision`](crate::load::ModelOptions::act_precision)).
    pub fn act_precision(&self) -> ActPrecision {
        self.act_precision
    }

    /// The storage format of each weight matrix, and how many bytes of matrices a decode
    /// step reads (the output head, or the tied embedding, once; of a mixture of experts,
    /// the router and the used experts' share of all experts).
    pub fn weight_formats(&self) -> (Vec<(String, WeightFormat)>, usize) {
        let head = self.output.as_ref().unwrap_or(&self.embedding);
        let mut all = vec![moe::Matrix::from(head)];
        let mut bytes = head.bytes();
        for b in &self.blocks {
            all.extend(b.matrices());
            bytes += b.attn_matrices().iter().map(|t| t.bytes()).sum::<usize>();
            bytes += b.ffn.step_bytes(self.config.moe.as_ref());
        }
        (
            all.iter().map(|t| (t.name.to_owned(), t.format)).collect(),
            bytes,
        )
    }

    /// True when the output head shares the embedding matrix.
    pub fn tied_output(&self) -> bool {
        self.output.is_none()
    }

    /// Total number of weight elements (embedding counted once when tied; norms and biases
    /// included).
    pub fn parameters(&self) -> usize {
        let norm = |n: &Option<RmsNorm>| n.as_ref().map_or(0, RmsNorm::dim);
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                let biases = [&b.wq, &b.wk, &b.wv, &b.wo]
                    .iter()
                    .map(|l| l.bias().map_or(0, <[f32]>::len))
                    .sum::<usize>();
                b.attn_norm.dim()
                    + b.ffn_norm.dim()
                    + norm(&b.q_norm)
                    + norm(&b.k_norm)
                    + norm(&b.attn_post_norm)
                    + norm(&b.ffn_post_norm)
                    + biases
                    + b.attn_matrices().iter().map(|t| t.numel()).sum::<usize>()
                    + b.ffn.parameters()
            })
            .sum();
        blocks
            + self.embedding.numel()
            + self.final_norm.dim()
            + self.output.as_ref().map_or(0, |t| t.numel())
    }

    /// A fresh state: a KV cache of `capacity` positions stored as `kv_type` (a
    /// [`FloatType`] or a [`KvType`]), and scratch for prefill chunks of up to `chunk`
    /// positions. [`Error::Config`] when `capacity` exceeds the model's context length (the
    /// RoPE table ends there) or when either is 0; [`Error::AllocationRefused`] when the
    /// memory of the cache or the scratch cannot be had.
    pub fn new_state(
        &self,
        capacity: usize,
        kv_type: impl Into<KvType>,
        chunk: usize,
    ) -> Result<DecoderState> {
        let cache = self.new_cache(capacity, kv_type)?;
        let scratch = self.new_scratch(chunk.min(capacity))?;
        Ok(DecoderState {
            cache,
            scratch,
            lora: Vec::new(),
        })
    }

    /// An empty KV cache of `capacity` positions stored as `kv_type` (a [`FloatType`] or a
    /// [`KvType`]). [`Error::Config`] when `capacity` is 0 or exceeds the model's context
    /// length; [`Error::AllocationRefused`] when the memory cannot be had.
    pub fn new_cache(&self, capacity: usize, kv_type: impl Into<KvType>) -> Result<KvCache> {
        let c = &self.config;
        if capacity == 0 {
            return Err(Error::Config("KV cache capacity must be positive".into()));
        }
        if capacity > c.context {
            return Err(Error::Config(format!(
                "KV cache capacity {capacity} exceeds the model's context length {}",
                c.context
            )));
        }
        let kv_type = kv_type.into();
        let store = || KvStore::new(kv_type, c.layers, capacity, c.kv_heads, c.head_dim);
        let (keys, values) = (store()?, store()?);
        Ok(KvCache {
            capacity,
            model: self.id,
            filled: 0,
            keys,
            values,
        })
    }

    /// Bytes one position takes in a KV cache stored as `kv_type`, keys and values of every
    /// layer together.
    ///
    /// ```
    /// use qkv::models::decoder::{Decoder, DecoderConfig, KvType, WeightLayout};
    /// use qkv::weights::FloatType;
    /// // 2 layers, 2 KV heads of 64 (dim 256 over 4 heads).
    /// let config = DecoderConfig::llama(256, 2, 4, 2, 32, 50, 64, WeightLayout::Gguf);
    /// let model = Decoder::synthetic(config, 7, FloatType::F32)?;
    /// assert_eq!(model.kv_bytes_per_position(KvType::F16), 2 * 2 * 2 * 64 * 2);
    /// assert_eq!(model.kv_bytes_per_position(KvType::Q8_0), 2 * 2 * 2 * (64 + 4));
    /// # Ok::<(), qkv::Error>(())
    /// ```
    pub fn kv_bytes_per_position(&self, kv_type: impl Into<KvType>) -> usize {
        let c = &self.config;
        2 * c.layers * c.kv_heads * kv_type.into().row_bytes(c.head_dim)
    }

    /// Activations for passes of up to `rows` positions. [`Error::Config`] when `rows` is 0,
    /// [`Error::AllocationRefused`] when their memory cannot be had.
    pub fn new_scratch(&self, rows: usize) -> Result<Scratch> {
        let c = &self.config;
        if rows == 0 {
            return Err(Error::Config("a pass of 0 positions".into()));
        }
        let buf = |width: usize| -> Result<Vec<f32>> {
            crate::alloc::zeroed_for(&[rows, width], || {
                format!("the scratch of a pass of {rows} positions")
            })
        };
        let ffn_buf = || -> Result<Vec<f32>> {
            crate::alloc::zeroed_for(&[moe::ffn_elems(c, rows).unwrap_or(usize::MAX)], || {
                format!("the scratch of a pass of {rows} positions")
            })
        };
        Ok(Scratch {
            rows,
            x: buf(c.dim)?,
            xn: buf(c.dim)?,
            q: buf(c.q_dim())?,
            k: buf(c.kv_dim())?,
            v: buf(c.kv_dim())?,
            att: buf(c.q_dim())?,
            gate: ffn_buf()?,
            up: ffn_buf()?,
            hidden: ffn_buf()?,
            moe: c
                .moe
                .as_ref()
                .map(|m| MoeScratch::new(c, m, rows))
                .transpose()?,
            calls: Vec::new(),
            lora: lora::LoraScratch::default(),
        })
    }
}

#[cfg(test)]
mod tests;
