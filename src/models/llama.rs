//! The Llama family of decoder-only transformers (Llama 2/3, SmolLM2, TinyLlama, Mistral
//! without sliding windows…), running on the `qkv-kernels`.
//!
//! One layer, for `t` new positions starting at absolute position `p₀`:
//!
//! ```text
//! h   = x + Wo · attention(rope(Wq·rms(x)), rope(Wk·rms(x)) ⧺ cache, Wv·rms(x) ⧺ cache)
//! out = h + Wdown · (silu(Wgate·rms(h)) ⊙ Wup·rms(h))
//! ```
//!
//! then `logits = Wout · rms(out)` for the last position only (the prompt positions before it
//! never pay for the LM head). Attention is grouped-query: query head `h` reads KV head
//! `h / (heads / kv_heads)`, which the attention kernel does by itself.
//!
//! Weights come from a GGUF file (llama.cpp names: `blk.N.attn_q.weight`…) or a Hugging Face
//! directory (`model.layers.N.self_attn.q_proj.weight`…). The two differ in RoPE layout: GGUF
//! permutes the rows of Q and K so that rotation pairs are adjacent elements
//! ([`RopeStyle::AdjacentPairs`]); Hugging Face keeps the two halves of each head apart
//! ([`RopeStyle::SplitHalf`]). The style is picked per source, so no weight is copied to
//! undo the permutation.
//!
//! The per-sequence state — the KV cache and every scratch buffer — is a [`LlamaState`],
//! sized once; a forward pass allocates nothing.

use super::zeroed;
use crate::error::{Error, Result};
use crate::weights::{FloatType, Tensor, TensorSource, WeightFormat};
use half::f16;
use qkv_kernels::activation::{add_inplace, swiglu};
use qkv_kernels::convert::f32_to_f16;
use qkv_kernels::norm::rms_norm;
use qkv_kernels::rope::{RopeStyle, RopeTable};
use qkv_kernels::{
    attention, linear, linear_many, AttentionMask, KvData, KvView, Projection, QueryView,
};
use std::ops::Range;

/// Where a Llama's tensors come from, which fixes their names and their RoPE layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// llama.cpp's GGUF names; Q and K rows permuted for adjacent-pair rotation.
    Gguf,
    /// Hugging Face `transformers` names; split-half rotation.
    HuggingFace,
}

impl WeightLayout {
    /// The RoPE style the Q/K weights of this layout were written for.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            WeightLayout::Gguf => RopeStyle::AdjacentPairs,
            WeightLayout::HuggingFace => RopeStyle::SplitHalf,
        }
    }

    fn embedding(self) -> &'static str {
        match self {
            WeightLayout::Gguf => "token_embd.weight",
            WeightLayout::HuggingFace => "model.embed_tokens.weight",
        }
    }

    fn final_norm(self) -> &'static str {
        match self {
            WeightLayout::Gguf => "output_norm.weight",
            WeightLayout::HuggingFace => "model.norm.weight",
        }
    }

    fn output(self) -> &'static str {
        match self {
            WeightLayout::Gguf => "output.weight",
            WeightLayout::HuggingFace => "lm_head.weight",
        }
    }

    /// The name of `part` of layer `layer`; `part` is the GGUF spelling.
    fn layer(self, layer: usize, part: &str) -> String {
        match self {
            WeightLayout::Gguf => format!("blk.{layer}.{part}.weight"),
            WeightLayout::HuggingFace => {
                let hf = match part {
                    "attn_norm" => "input_layernorm",
                    "attn_q" => "self_attn.q_proj",
                    "attn_k" => "self_attn.k_proj",
                    "attn_v" => "self_attn.v_proj",
                    "attn_output" => "self_attn.o_proj",
                    "ffn_norm" => "post_attention_layernorm",
                    "ffn_gate" => "mlp.gate_proj",
                    "ffn_up" => "mlp.up_proj",
                    "ffn_down" => "mlp.down_proj",
                    other => other,
                };
                format!("model.layers.{layer}.{hf}.weight")
            }
        }
    }
}

/// The hyper-parameters of a Llama model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Width of the residual stream (`d_model`).
    pub dim: usize,
    /// Number of transformer blocks.
    pub layers: usize,
    /// Number of query heads.
    pub heads: usize,
    /// Number of key/value heads (`heads` must be a multiple of it).
    pub kv_heads: usize,
    /// Elements per head (`dim / heads` for every model this loads).
    pub head_dim: usize,
    /// Hidden width of the SwiGLU feed-forward block.
    pub ffn_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab: usize,
    /// Longest sequence the model was trained for; the default KV cache capacity.
    pub context: usize,
    /// RoPE base frequency (θ).
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Where the weights come from.
    pub layout: WeightLayout,
}

impl LlamaConfig {
    /// Elements of one position's keys (or values): `kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Errors with [`Error::Config`] when the numbers cannot describe a Llama.
    pub fn validate(&self) -> Result<()> {
        let nonzero = [
            ("embedding length", self.dim),
            ("block count", self.layers),
            ("head count", self.heads),
            ("KV head count", self.kv_heads),
            ("feed-forward length", self.ffn_dim),
            ("vocabulary size", self.vocab),
            ("context length", self.context),
        ];
        for (what, v) in nonzero {
            if v == 0 {
                return Err(Error::Config(format!("llama: {what} is 0")));
            }
        }
        if !self.dim.is_multiple_of(self.heads) || self.head_dim != self.dim / self.heads {
            return Err(Error::Config(format!(
                "llama: embedding length {} is not {} heads of {}",
                self.dim, self.heads, self.head_dim
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "llama: head dim {} is odd, RoPE needs pairs",
                self.head_dim
            )));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(Error::Config(format!(
                "llama: {} query heads are not a multiple of {} KV heads",
                self.heads, self.kv_heads
            )));
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return Err(Error::Config(format!(
                "llama: RoPE base {} is not a positive number",
                self.rope_base
            )));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return Err(Error::Config(format!(
                "llama: RMS epsilon {} is not a positive number",
                self.rms_eps
            )));
        }
        if self.context > MAX_CONTEXT {
            return Err(Error::Config(format!(
                "llama: context length {} is more than the {MAX_CONTEXT} positions qkv supports",
                self.context
            )));
        }
        Ok(())
    }
}

/// The longest context a [`LlamaConfig`] may declare. The RoPE table is built for the whole
/// context when the model loads, so a file's context length must not be able to demand an
/// arbitrary amount of memory; 2^20 positions of a 128-wide head take 512 MiB of table.
pub const MAX_CONTEXT: usize = 1 << 20;

/// The weights of one transformer block.
struct Block {
    attn_norm: Vec<f32>,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    ffn_norm: Vec<f32>,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
}

/// A loaded Llama: configuration, weights (mapped or owned) and the RoPE table. Immutable,
/// `Send + Sync`; any number of [`LlamaState`]s run on one `Llama` at once.
pub struct Llama {
    /// Unique per model ([`super::next_model_id`]): a state made by another is refused.
    id: u64,
    config: LlamaConfig,
    /// The KV cache's default dtype: f32 for a model whose matrices are f32, else f16.
    kv_dtype: FloatType,
    embedding: Tensor,
    blocks: Vec<Block>,
    final_norm: Vec<f32>,
    /// `None` when the output head is tied to the embedding.
    output: Option<Tensor>,
    rope: RopeTable,
}

impl std::fmt::Debug for Llama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llama")
            .field("config", &self.config)
            .field("kv_dtype", &self.kv_dtype)
            .field("tied_output", &self.output.is_none())
            .finish()
    }
}

impl Llama {
    /// Loads the weights named by `config.layout` from `source`. With `widen: None` every
    /// matrix stays as stored — f32, f16 or quantized blocks, mapped without a copy; with
    /// `Some(dtype)` each is widened (or rounded) to `dtype` at load. 1-D norm weights are
    /// always widened to f32. The output head is tied to the embedding when the source has
    /// no separate one.
    pub fn load(
        config: LlamaConfig,
        source: &dyn TensorSource,
        widen: Option<FloatType>,
    ) -> Result<Llama> {
        config.validate()?;
        let c = &config;
        let layout = c.layout;
        let matrix = |name: &str, rows: usize, cols: usize| -> Result<Tensor> {
            let t = source.tensor(name)?;
            t.expect_shape(&[rows, cols])?;
            match widen {
                Some(dtype) => t.into_dtype(dtype),
                None => Ok(t),
            }
        };
        let vector = |name: &str, len: usize| -> Result<Vec<f32>> {
            let t = source.tensor(name)?;
            t.expect_shape(&[len])?;
            t.to_f32_vec()
        };
        let kv_dim = c.kv_dim();
        // Not `with_capacity(c.layers)`: the count comes from the file, the blocks from its tensors.
        let mut blocks = Vec::new();
        for l in 0..c.layers {
            let n = |part: &str| layout.layer(l, part);
            blocks.push(Block {
                attn_norm: vector(&n("attn_norm"), c.dim)?,
                wq: matrix(&n("attn_q"), c.dim, c.dim)?,
                wk: matrix(&n("attn_k"), kv_dim, c.dim)?,
                wv: matrix(&n("attn_v"), kv_dim, c.dim)?,
                wo: matrix(&n("attn_output"), c.dim, c.dim)?,
                ffn_norm: vector(&n("ffn_norm"), c.dim)?,
                w_gate: matrix(&n("ffn_gate"), c.ffn_dim, c.dim)?,
                w_up: matrix(&n("ffn_up"), c.ffn_dim, c.dim)?,
                w_down: matrix(&n("ffn_down"), c.dim, c.ffn_dim)?,
            });
        }
        let embedding = matrix(layout.embedding(), c.vocab, c.dim)?;
        let output = if source.contains(layout.output()) {
            Some(matrix(layout.output(), c.vocab, c.dim)?)
        } else {
            None
        };
        let final_norm = vector(layout.final_norm(), c.dim)?;
        let rope = RopeTable::new(c.head_dim, c.rope_base, c.context)?;
        let kv_dtype = match widen {
            Some(dtype) => dtype,
            None if blocks[0].wq.format() == WeightFormat::F32 => FloatType::F32,
            None => FloatType::F16,
        };
        Ok(Llama {
            id: super::next_model_id(),
            config,
            kv_dtype,
            embedding,
            blocks,
            final_norm,
            output,
            rope,
        })
    }

    /// A model with deterministic pseudo-random weights (uniform, scaled by `1/√fan_in`, norm
    /// weights 1): for tests, documentation and benchmarks that must not need a real file.
    /// The same `config`, `seed` and `dtype` give the same model.
    pub fn synthetic(config: LlamaConfig, seed: u64, dtype: FloatType) -> Result<Llama> {
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
        let layout = c.layout;
        // Not `with_capacity(c.layers)`: the count comes from the file, the blocks from its tensors.
        let mut blocks = Vec::new();
        for l in 0..c.layers {
            let n = |part: &str| layout.layer(l, part);
            blocks.push(Block {
                attn_norm: vec![1.0; c.dim],
                wq: matrix(n("attn_q"), c.dim, c.dim)?,
                wk: matrix(n("attn_k"), c.kv_dim(), c.dim)?,
                wv: matrix(n("attn_v"), c.kv_dim(), c.dim)?,
                wo: matrix(n("attn_output"), c.dim, c.dim)?,
                ffn_norm: vec![1.0; c.dim],
                w_gate: matrix(n("ffn_gate"), c.ffn_dim, c.dim)?,
                w_up: matrix(n("ffn_up"), c.ffn_dim, c.dim)?,
                w_down: matrix(n("ffn_down"), c.dim, c.ffn_dim)?,
            });
        }
        let embedding = matrix(layout.embedding().into(), c.vocab, c.dim)?;
        let rope = RopeTable::new(c.head_dim, c.rope_base, c.context)?;
        Ok(Llama {
            id: super::next_model_id(),
            final_norm: vec![1.0; c.dim],
            config,
            kv_dtype: dtype,
            embedding,
            blocks,
            output: None,
            rope,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The KV cache's default dtype: f32 when the matrices are f32 (as stored or widened),
    /// else f16.
    pub fn kv_dtype(&self) -> FloatType {
        self.kv_dtype
    }

    /// The storage format of each weight matrix, and how many bytes of matrices a decode
    /// step reads (the output head, or the tied embedding, once).
    pub fn weight_formats(&self) -> (Vec<(String, WeightFormat)>, usize) {
        let head = self.output.as_ref().unwrap_or(&self.embedding);
        let mut all = vec![head];
        for b in &self.blocks {
            all.extend([&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down]);
        }
        let bytes = all.iter().map(|t| t.bytes()).sum();
        (
            all.iter()
                .map(|t| (t.name().to_owned(), t.format()))
                .collect(),
            bytes,
        )
    }

    /// True when the output head shares the embedding matrix.
    pub fn tied_output(&self) -> bool {
        self.output.is_none()
    }

    /// Total number of weight elements (embedding counted once when tied).
    pub fn parameters(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                b.attn_norm.len()
                    + b.ffn_norm.len()
                    + [&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down]
                        .iter()
                        .map(|t| t.numel())
                        .sum::<usize>()
            })
            .sum();
        blocks
            + self.embedding.numel()
            + self.final_norm.len()
            + self.output.as_ref().map_or(0, |t| t.numel())
    }

    /// A fresh state: a KV cache of `capacity` positions in `kv_dtype`, and scratch for
    /// prefill chunks of up to `chunk` positions. [`Error::Config`] when `capacity` exceeds
    /// the model's context length (the RoPE table ends there), when either is 0, or when the
    /// cache's memory cannot be had.
    pub fn new_state(
        &self,
        capacity: usize,
        kv_dtype: FloatType,
        chunk: usize,
    ) -> Result<LlamaState> {
        let c = &self.config;
        if capacity == 0 || chunk == 0 {
            return Err(Error::Config(format!(
                "KV cache capacity ({capacity}) and prefill chunk ({chunk}) must be positive"
            )));
        }
        if capacity > c.context {
            return Err(Error::Config(format!(
                "KV cache capacity {capacity} exceeds the model's context length {}",
                c.context
            )));
        }
        let chunk = chunk.min(capacity);
        let cache_len = c
            .layers
            .checked_mul(capacity)
            .and_then(|n| n.checked_mul(c.kv_dim()))
            .ok_or_else(|| Error::Config(format!("KV cache of {capacity} positions overflows")))?;
        let store = || KvStore::new(kv_dtype, cache_len, capacity, c.kv_heads, c.head_dim);
        let (keys, values) = (store()?, store()?);
        Ok(LlamaState {
            capacity,
            chunk,
            model: self.id,
            shape: self.state_shape(),
            filled: 0,
            keys,
            values,
            x: vec![0.0; chunk * c.dim],
            xn: vec![0.0; chunk * c.dim],
            q: vec![0.0; chunk * c.dim],
            k: vec![0.0; chunk * c.kv_dim()],
            v: vec![0.0; chunk * c.kv_dim()],
            att: vec![0.0; chunk * c.dim],
            gate: vec![0.0; chunk * c.ffn_dim],
            up: vec![0.0; chunk * c.ffn_dim],
            hidden: vec![0.0; chunk * c.ffn_dim],
        })
    }

    /// Runs `tokens` at absolute positions `pos0..pos0 + tokens.len()`, appending their keys
    /// and values to `state`'s cache, and writes the logits of the last token into `logits`
    /// (length `vocab`) when given. Positions before `pos0` must already be in the cache:
    /// `pos0` may be at most the number of positions the state holds, and running at an
    /// earlier position discards the later ones (how a session rewinds).
    ///
    /// Validates everything before touching the cache: token ids ([`Error::TokenOutOfRange`]),
    /// capacity ([`Error::ContextFull`]), the logits length, `pos0`, and that `state` was made
    /// by this very model ([`Error::Shape`]; another one's cache, even of the same shape,
    /// holds other keys). Prompts longer than the state's chunk run as several matrix passes.
    pub fn forward(
        &self,
        state: &mut LlamaState,
        tokens: &[u32],
        pos0: usize,
        logits: Option<&mut [f32]>,
    ) -> Result<()> {
        match logits {
            Some(l) => self.run(state, tokens, pos0, Logits::Last(l)),
            None => self.run(state, tokens, pos0, Logits::None),
        }
    }

    /// As [`forward`](Self::forward), but writes the logits of every token:
    /// `logits[i·vocab..(i+1)·vocab]` are those after `tokens[i]` (what perplexity scores).
    /// The output head then runs as one matrix product per chunk. Errors as `forward` does,
    /// and with [`Error::Shape`] when `logits` is not `tokens.len()·vocab` long.
    pub fn forward_all(
        &self,
        state: &mut LlamaState,
        tokens: &[u32],
        pos0: usize,
        logits: &mut [f32],
    ) -> Result<()> {
        self.run(state, tokens, pos0, Logits::All(logits))
    }

    fn run(
        &self,
        state: &mut LlamaState,
        tokens: &[u32],
        pos0: usize,
        mut logits: Logits<'_>,
    ) -> Result<()> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(Error::Shape("llama forward: no tokens".into()));
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(Error::TokenOutOfRange { id, vocab: c.vocab });
        }
        let needed = pos0.saturating_add(tokens.len());
        if needed > state.capacity {
            return Err(Error::ContextFull {
                needed,
                capacity: state.capacity,
            });
        }
        let wanted = match &logits {
            Logits::None => None,
            Logits::Last(l) => Some((l.len(), c.vocab)),
            Logits::All(l) => Some((l.len(), tokens.len().saturating_mul(c.vocab))),
        };
        if let Some((len, want)) = wanted.filter(|(len, want)| len != want) {
            return Err(Error::Shape(format!(
                "logits buffer holds {len}, {} tokens of a {}-token vocabulary need {want}",
                if matches!(logits, Logits::All(_)) {
                    tokens.len()
                } else {
                    1
                },
                c.vocab
            )));
        }
        if state.model != self.id {
            return Err(Error::Shape(format!(
                "llama forward: the state was made by another model (of [dim, kv dim, ffn \
                 dim, layers] = {:?}; this one is {:?}), whose cache this one cannot use",
                state.shape,
                self.state_shape()
            )));
        }
        if pos0 > state.filled {
            return Err(Error::Shape(format!(
                "llama forward at position {pos0}, but the cache holds only positions 0..{}",
                state.filled
            )));
        }
        // From here on, positions past pos0 no longer match the tokens before them.
        state.filled = pos0;
        let mut pos = pos0;
        for chunk in tokens.chunks(state.chunk) {
            self.forward_chunk(state, chunk, pos)?;
            if let Logits::All(all) = &mut logits {
                let at = (pos - pos0) * c.vocab;
                self.head(
                    state,
                    0..chunk.len(),
                    &mut all[at..at + chunk.len() * c.vocab],
                )?;
            }
            pos += chunk.len();
            state.filled = pos;
        }
        if let Logits::Last(logits) = logits {
            let last = (tokens.len() - 1) % state.chunk;
            self.head(state, last..last + 1, logits)?;
        }
        Ok(())
    }

    /// What a [`LlamaState`] made by this model records of it.
    fn state_shape(&self) -> [usize; 4] {
        let c = &self.config;
        [c.dim, c.kv_dim(), c.ffn_dim, c.layers]
    }

    /// The blocks over one chunk of at most `state.chunk` tokens; leaves the final residual
    /// stream in `state.x`.
    fn forward_chunk(&self, s: &mut LlamaState, tokens: &[u32], pos0: usize) -> Result<()> {
        let c = &self.config;
        let (t, d, kvd, ff) = (tokens.len(), c.dim, c.kv_dim(), c.ffn_dim);
        let style = c.layout.rope_style();
        self.embed(tokens, &mut s.x[..t * d])?;
        let x = &mut s.x[..t * d];
        let xn = &mut s.xn[..t * d];
        let q = &mut s.q[..t * d];
        let k = &mut s.k[..t * kvd];
        let v = &mut s.v[..t * kvd];
        let att = &mut s.att[..t * d];
        let gate = &mut s.gate[..t * ff];
        let up = &mut s.up[..t * ff];
        let hidden = &mut s.hidden[..t * ff];
        let seen = pos0 + t;

        for (l, b) in self.blocks.iter().enumerate() {
            // Attention.
            rms_norm(xn, x, &b.attn_norm, c.rms_eps, d)?;
            // Q, K and V as one group: one hand-off to the threads, no fused weight copy.
            linear_many(
                xn,
                t,
                d,
                &mut [
                    Projection {
                        w: b.wq.weights(),
                        bias: None,
                        n: d,
                        y: q,
                    },
                    Projection {
                        w: b.wk.weights(),
                        bias: None,
                        n: kvd,
                        y: k,
                    },
                    Projection {
                        w: b.wv.weights(),
                        bias: None,
                        n: kvd,
                        y: v,
                    },
                ],
            )?;
            self.rope.apply(q, t, c.heads, pos0, style)?;
            self.rope.apply(k, t, c.kv_heads, pos0, style)?;
            s.keys.write(l, pos0, k)?;
            s.values.write(l, pos0, v)?;
            let (keys, values) = (s.keys.view(l, seen), s.values.view(l, seen));
            attention(
                &QueryView::contiguous(q, t, c.heads, c.head_dim),
                &keys,
                &values,
                &AttentionMask::causal(pos0),
                None,
                att,
            )?;
            linear(xn, att, b.wo.weights(), None, t, d, d)?;
            add_inplace(x, xn)?;

            // Feed-forward.
            rms_norm(xn, x, &b.ffn_norm, c.rms_eps, d)?;
            linear_many(
                xn,
                t,
                d,
                &mut [
                    Projection {
                        w: b.w_gate.weights(),
                        bias: None,
                        n: ff,
                        y: gate,
                    },
                    Projection {
                        w: b.w_up.weights(),
                        bias: None,
                        n: ff,
                        y: up,
                    },
                ],
            )?;
            swiglu(hidden, gate, up)?;
            linear(xn, hidden, b.w_down.weights(), None, t, ff, d)?;
            add_inplace(x, xn)?;
        }
        Ok(())
    }

    /// Final norm and output head for `rows` of `state.x`, into `logits` (`rows.len()·vocab`).
    fn head(&self, s: &mut LlamaState, rows: Range<usize>, logits: &mut [f32]) -> Result<()> {
        let c = &self.config;
        let (d, t) = (c.dim, rows.len());
        let x = &s.x[rows.start * d..rows.end * d];
        let xn = &mut s.xn[..t * d];
        rms_norm(xn, x, &self.final_norm, c.rms_eps, d)?;
        let w = self.output.as_ref().unwrap_or(&self.embedding);
        linear(logits, xn, w.weights(), None, t, d, c.vocab)?;
        Ok(())
    }

    /// Looks up the embedding rows of `tokens` (already validated) into `out`.
    fn embed(&self, tokens: &[u32], out: &mut [f32]) -> Result<()> {
        let d = self.config.dim;
        for (&id, row) in tokens.iter().zip(out.chunks_exact_mut(d)) {
            self.embedding.rows_to_f32(id as usize, row)?;
        }
        Ok(())
    }
}

/// Which logits a forward pass writes.
enum Logits<'a> {
    None,
    /// The last token's.
    Last(&'a mut [f32]),
    /// Every token's, one row each.
    All(&'a mut [f32]),
}

/// What a KV cache of `capacity` positions is called in allocation errors.
fn kv_cache(capacity: usize) -> String {
    format!("a KV cache of {capacity} positions")
}

/// One cache tensor (all keys or all values), head-major within each layer:
/// `[layer][kv_head][position][head_dim]`. Each head's positions are contiguous, so a decode
/// step streams every head's history front to back, which is what the memory prefetcher
/// follows best (with position-major rows, a decode attention call over 2048 positions
/// took 2.3× as long).
struct KvStore {
    data: KvBuf,
    /// Positions each head holds.
    capacity: usize,
    heads: usize,
    dim: usize,
}

/// The cache's elements, in the KV dtype.
enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl KvStore {
    /// A zeroed cache of `len` elements (whole layers of `heads · capacity · dim`; the caller
    /// checked that the count fits). [`Error::Config`] when the memory cannot be had.
    fn new(
        dtype: FloatType,
        len: usize,
        capacity: usize,
        heads: usize,
        dim: usize,
    ) -> Result<Self> {
        let data = match dtype {
            FloatType::F32 => KvBuf::F32(zeroed(len, || kv_cache(capacity))?),
            FloatType::F16 => KvBuf::F16(zeroed(len, || kv_cache(capacity))?),
        };
        Ok(KvStore {
            data,
            capacity,
            heads,
            dim,
        })
    }

    /// Elements of one layer.
    fn layer_len(&self) -> usize {
        self.heads * self.capacity * self.dim
    }

    /// Stores `src` (`[t][kv_head][dim]`, the projections of positions `pos0..pos0 + t`)
    /// into layer `layer`.
    fn write(&mut self, layer: usize, pos0: usize, src: &[f32]) -> Result<()> {
        let (start, dim) = (layer * self.layer_len(), self.dim);
        for (t, row) in src.chunks_exact(self.heads * dim).enumerate() {
            for (h, x) in row.chunks_exact(dim).enumerate() {
                let at = start + (h * self.capacity + pos0 + t) * dim;
                match &mut self.data {
                    KvBuf::F32(dst) => dst[at..at + dim].copy_from_slice(x),
                    KvBuf::F16(dst) => f32_to_f16(x, &mut dst[at..at + dim])?,
                }
            }
        }
        Ok(())
    }

    /// The first `rows` positions of layer `layer`.
    fn view(&self, layer: usize, rows: usize) -> KvView<'_> {
        let span = layer * self.layer_len()..(layer + 1) * self.layer_len();
        let data = match &self.data {
            KvBuf::F32(v) => KvData::F32(&v[span]),
            KvBuf::F16(v) => KvData::F16(&v[span]),
        };
        KvView::head_major(data, rows, self.heads, self.dim, self.capacity)
    }

    fn dtype(&self) -> FloatType {
        match self.data {
            KvBuf::F32(_) => FloatType::F32,
            KvBuf::F16(_) => FloatType::F16,
        }
    }

    fn bytes(&self) -> usize {
        match &self.data {
            KvBuf::F32(v) => v.len() * 4,
            KvBuf::F16(v) => v.len() * 2,
        }
    }
}

/// Everything one sequence needs to run on a [`Llama`]: the KV cache (keys and values of
/// every layer, `capacity` positions, f32 or f16) and the activations of one prefill chunk.
/// Made by [`Llama::new_state`]; it does not know its position — the caller passes it.
pub struct LlamaState {
    capacity: usize,
    chunk: usize,
    /// The id of the model that made it.
    model: u64,
    /// `[dim, kv_dim, ffn_dim, layers]` of the model that made it (for error messages).
    shape: [usize; 4],
    /// Positions `0..filled` of the cache hold keys and values.
    filled: usize,
    keys: KvStore,
    values: KvStore,
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    hidden: Vec<f32>,
}

impl std::fmt::Debug for LlamaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaState")
            .field("capacity", &self.capacity)
            .field("chunk", &self.chunk)
            .field("kv_dtype", &self.keys.dtype())
            .finish()
    }
}

impl LlamaState {
    /// Positions the KV cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Most positions one matrix pass handles; longer prompts run in several.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// The dtype of the cached keys and values.
    pub fn kv_dtype(&self) -> FloatType {
        self.keys.dtype()
    }

    /// Bytes held by the KV cache.
    pub fn cache_bytes(&self) -> usize {
        self.keys.bytes() + self.values.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_names_follow_transformers() {
        let l = WeightLayout::HuggingFace;
        assert_eq!(
            l.layer(3, "attn_q"),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            l.layer(0, "ffn_norm"),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(
            WeightLayout::Gguf.layer(7, "ffn_down"),
            "blk.7.ffn_down.weight"
        );
    }

    #[test]
    fn config_validation_names_the_fault() {
        let good = tiny(1);
        good.validate().unwrap();
        let bad = LlamaConfig {
            kv_heads: 3,
            ..good.clone()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("KV heads"));
        let bad = LlamaConfig {
            dim: 9,
            ..good.clone()
        };
        assert!(matches!(bad.validate(), Err(Error::Config(_))));
        let bad = LlamaConfig {
            rms_eps: 0.0,
            ..good.clone()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("RMS epsilon"));
        let bad = LlamaConfig {
            context: MAX_CONTEXT + 1,
            ..good
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("context length"));
    }

    fn tiny(layers: usize) -> LlamaConfig {
        LlamaConfig {
            dim: 8,
            layers,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            ffn_dim: 16,
            vocab: 10,
            context: 32,
            rope_base: 10000.0,
            rms_eps: 1e-5,
            layout: WeightLayout::Gguf,
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
    fn an_absurd_block_count_is_a_missing_tensor_not_an_allocation() {
        let err = Llama::load(tiny(u32::MAX as usize), &Empty, Some(FloatType::F32)).unwrap_err();
        assert!(matches!(err, Error::MissingTensor { .. }), "{err}");
    }

    #[test]
    fn a_cache_the_allocator_refuses_is_a_config_error() {
        assert_eq!(zeroed::<f16>(5, || kv_cache(1)).unwrap(), [f16::ZERO; 5]);
        assert!(zeroed::<f32>(0, || kv_cache(1)).unwrap().is_empty());
        // Past the address space: the layout itself overflows, or the allocator says no.
        // (black_box: an allocation nobody reads may be optimised away, failure included.)
        for len in [usize::MAX / 2, 1 << 60] {
            match std::hint::black_box(zeroed::<f32>(len, || kv_cache(12345))) {
                Err(Error::Config(msg)) => assert!(msg.contains("12345 positions"), "{msg}"),
                other => panic!("{len} elements: {:?}", other.map(|v| v.len())),
            }
        }
    }

    #[test]
    fn forward_refuses_a_foreign_state_and_a_gap_in_the_cache() {
        let small = Llama::synthetic(tiny(1), 1, FloatType::F32).unwrap();
        let big = Llama::synthetic(tiny(2), 1, FloatType::F32).unwrap();
        let mut state = small.new_state(16, FloatType::F32, 4).unwrap();
        let err = big.forward(&mut state, &[1, 2], 0, None).unwrap_err();
        assert!(err.to_string().contains("made by another model"), "{err}");
        // The same shape, other weights: its cache would be wrong for this model.
        let twin = Llama::synthetic(tiny(1), 2, FloatType::F32).unwrap();
        let err = twin.forward(&mut state, &[1, 2], 0, None).unwrap_err();
        assert!(matches!(err, Error::Shape(_)), "{err}");

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
}
