//! The attention modules of the seeds, all over one [`AttentionCore`].
//!
//! | module | seed | weight names | heads | output projection |
//! |---|---|---|---|---|
//! | [`SelfAttention`] | 000 | `q`, `k`, `v` | 1 | none, output `[B, T, dim_v]` |
//! | [`MultiHeadAttention`] | 000 | `q`, `k`, `v`, `out` | h | `out: dim_v → input_dim` |
//! | [`CrossAttention`] | 000 | `q`, `k`, `v` | 1 | none |
//! | [`Attention`] | 001 | `query`, `key`, `value`, `out` | h | `dim → dim` |
//! | [`MultiHeadAttentionWithProbs`] | 002 | `w_q`, `w_k`, `w_v`, `w_o` | h | `d_model → d_model`, also returns the probabilities |
//! | [`MultiHeadCrossAttention`] | 003 | `q_proj`, `k_proj`, `v_proj`, `out_proj` | h | `embed_dim → embed_dim` |
//! | [`TransformerAttention`] | 004 | `wq`, `wk`, `wv`, `output_layer` | h | `hidden → hidden` |
//!
//! Heads split the projected features as PyTorch's `view(B, T, h, d/h).transpose(1, 2)`
//! does: head `i` owns columns `[i·d_h, (i+1)·d_h)`. Scores are scaled by `1/√d_h` (the
//! per-head query/key size; `1/√dim_qk` for one head). Masks follow [`super::mask`]:
//! `true` = visible, and a query row with no visible key gives zeros before the output
//! projection.
//!
//! ```
//! use qkv::nn::{Mask, MultiHeadAttention, Seq};
//! use qkv::weights::{Scope, Tensor, TensorSource};
//! use std::collections::HashMap;
//!
//! // A tiny in-memory state_dict: identity projections of size 2, two heads.
//! struct Dict(HashMap<String, (Vec<usize>, Vec<f32>)>);
//! impl TensorSource for Dict {
//!     fn tensor(&self, name: &str) -> qkv::Result<Tensor> {
//!         let missing = || qkv::Error::MissingTensor { name: name.into() };
//!         let (shape, data) = self.0.get(name).ok_or_else(missing)?;
//!         Tensor::from_f32(name, shape.clone(), data.clone())
//!     }
//!     fn contains(&self, name: &str) -> bool {
//!         self.0.contains_key(name)
//!     }
//!     fn names(&self) -> Vec<String> {
//!         self.0.keys().cloned().collect()
//!     }
//! }
//! let eye = (vec![2, 2], vec![1.0, 0.0, 0.0, 1.0]);
//! let names = ["q", "k", "v", "out"].iter();
//! let dict = Dict(names.map(|n| (format!("{n}.weight"), eye.clone())).collect());
//!
//! let mha = MultiHeadAttention::load(&Scope::new(&dict), 2, 2, 2, 2).unwrap();
//! let x = [1.0, 2.0, 3.0, 4.0]; // B = 1, T = 2, D = 2
//! let y = mha.forward(Seq::new(&x, 1, 2, 2).unwrap(), &Mask::none().with_causal()).unwrap();
//! assert_eq!(&y.data()[..2], &[1.0, 2.0]); // position 0 sees only itself
//! ```

use super::{Linear, Mask, Seq, SeqBuf};
use crate::error::{Error, Result};
use crate::weights::Scope;
use qkv_kernels::{AttentionMask, KvView, QueryView};

/// Sizes of an [`AttentionCore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Features of the query input.
    pub q_in: usize,
    /// Features of the key/value input.
    pub kv_in: usize,
    /// Total query/key projection size (all heads).
    pub dim_qk: usize,
    /// Total value projection size (all heads).
    pub dim_v: usize,
    /// Number of heads; must divide `dim_qk` and `dim_v`.
    pub heads: usize,
    /// Output projection size, when there is one.
    pub out_dim: Option<usize>,
}

/// Weight names of an [`AttentionCore`]'s projections.
#[derive(Clone, Copy, Debug)]
pub struct ProjectionNames<'n> {
    /// Query projection.
    pub q: &'n str,
    /// Key projection.
    pub k: &'n str,
    /// Value projection.
    pub v: &'n str,
    /// Output projection, when there is one.
    pub out: Option<&'n str>,
}

/// Query/key/value projections, multi-head scaled dot-product attention through the one
/// kernel, and an optional output projection. Every attention module is one of these.
#[derive(Debug)]
pub struct AttentionCore {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Option<Linear>,
    dims: AttentionDims,
}

impl AttentionCore {
    /// Loads the projections named in `names` under `scope`.
    ///
    /// Errors: [`Error::Config`] when `heads` is zero or does not divide `dim_qk` and
    /// `dim_v`; [`Error::MissingTensor`] / [`Error::TensorShape`] from the weights.
    pub fn load(
        scope: &Scope<'_>,
        names: ProjectionNames<'_>,
        dims: AttentionDims,
    ) -> Result<Self> {
        let AttentionDims {
            q_in,
            kv_in,
            dim_qk,
            dim_v,
            heads,
            out_dim,
        } = dims;
        if heads == 0 {
            return Err(Error::Config(format!(
                "{}: heads must be at least 1",
                scope.name("*")
            )));
        }
        for (what, d) in [("dim_qk", dim_qk), ("dim_v", dim_v)] {
            if d == 0 || d % heads != 0 {
                return Err(Error::Config(format!(
                    "{}: {what} = {d} is not divisible by heads = {heads}",
                    scope.name("*")
                )));
            }
        }
        let q = Linear::load(scope, names.q, q_in, dim_qk)?;
        let k = Linear::load(scope, names.k, kv_in, dim_qk)?;
        let v = Linear::load(scope, names.v, kv_in, dim_v)?;
        let out = match (names.out, out_dim) {
            (Some(name), Some(o)) => Some(Linear::load(scope, name, dim_v, o)?),
            (None, None) => None,
            _ => {
                return Err(Error::Config(
                    "an output projection needs both a name and a size".into(),
                ))
            }
        };
        Ok(AttentionCore { q, k, v, out, dims })
    }

    /// Every projection's f32 weight kept transposed for gemm ([`Linear::for_many_rows`]),
    /// for attention that always sees many rows: an encoder's.
    pub fn for_many_rows(self) -> Result<Self> {
        let AttentionCore { q, k, v, out, dims } = self;
        Ok(AttentionCore {
            q: q.for_many_rows()?,
            k: k.for_many_rows()?,
            v: v.for_many_rows()?,
            out: out.map(Linear::for_many_rows).transpose()?,
            dims,
        })
    }

    /// The K and V projections' f32 weights kept transposed for gemm: for cross-attention,
    /// whose keys and values are projected from a whole source at once while its queries
    /// may come a few rows per decode step.
    pub fn kv_for_many_rows(self) -> Result<Self> {
        Ok(AttentionCore {
            k: self.k.for_many_rows()?,
            v: self.v.for_many_rows()?,
            ..self
        })
    }

    /// The sizes.
    pub fn dims(&self) -> AttentionDims {
        self.dims
    }

    /// Number of heads.
    pub fn heads(&self) -> usize {
        self.dims.heads
    }

    /// Query/key size per head.
    pub fn head_dim_qk(&self) -> usize {
        self.dims.dim_qk / self.dims.heads
    }

    /// Value size per head.
    pub fn head_dim_v(&self) -> usize {
        self.dims.dim_v / self.dims.heads
    }

    /// Output features: the output projection's size, or `dim_v` without one.
    pub fn out_dim(&self) -> usize {
        self.dims.out_dim.unwrap_or(self.dims.dim_v)
    }

    /// The query projection.
    pub fn q_proj(&self) -> &Linear {
        &self.q
    }

    /// The key projection.
    pub fn k_proj(&self) -> &Linear {
        &self.k
    }

    /// The value projection.
    pub fn v_proj(&self) -> &Linear {
        &self.v
    }

    /// A `[rows, heads, head_dim_qk]` view of projected queries.
    pub fn query_view<'a>(&self, q: &'a [f32], rows: usize) -> QueryView<'a> {
        QueryView::contiguous(q, rows, self.heads(), self.head_dim_qk())
    }

    /// A dense `[rows, heads, head_dim_qk]` view of projected keys.
    pub fn key_view<'a>(&self, k: &'a [f32], rows: usize) -> KvView<'a> {
        KvView::contiguous_f32(k, rows, self.heads(), self.head_dim_qk())
    }

    /// A dense `[rows, heads, head_dim_v]` view of projected values.
    pub fn value_view<'a>(&self, v: &'a [f32], rows: usize) -> KvView<'a> {
        KvView::contiguous_f32(v, rows, self.heads(), self.head_dim_v())
    }

    /// Attention of one sequence's projected queries over projected keys and values, written
    /// to `ctx` `[tq, dim_v]` (heads concatenated, before the output projection).
    pub fn attend(
        &self,
        q: &QueryView<'_>,
        k: &KvView<'_>,
        v: &KvView<'_>,
        mask: &AttentionMask<'_>,
        ctx: &mut [f32],
    ) -> Result<()> {
        qkv_kernels::attention(q, k, v, mask, None, ctx)?;
        Ok(())
    }

    /// Applies the output projection to `rows` rows of `ctx` into `out` (a copy without one).
    pub fn project_out(&self, ctx: &[f32], rows: usize, out: &mut [f32]) -> Result<()> {
        match &self.out {
            Some(o) => o.forward_into(ctx, rows, out),
            None => {
                if ctx.len() != out.len() {
                    return Err(Error::Shape(format!(
                        "attention output: {} values into {}",
                        ctx.len(),
                        out.len()
                    )));
                }
                out.copy_from_slice(ctx);
                Ok(())
            }
        }
    }

    fn check_inputs(
        &self,
        query: Seq<'_>,
        key: Seq<'_>,
        value: Seq<'_>,
        mask: &Mask<'_>,
    ) -> Result<()> {
        let d = self.dims;
        if query.batch() != key.batch() || key.batch() != value.batch() {
            return Err(Error::Shape(format!(
                "attention: batch sizes differ (query {}, key {}, value {})",
                query.batch(),
                key.batch(),
                value.batch()
            )));
        }
        if key.len() != value.len() {
            return Err(Error::Shape(format!(
                "attention: key length {} differs from value length {}",
                key.len(),
                value.len()
            )));
        }
        for (what, got, want) in [
            ("query", query.dim(), d.q_in),
            ("key", key.dim(), d.kv_in),
            ("value", value.dim(), d.kv_in),
        ] {
            if got != want {
                return Err(Error::Shape(format!(
                    "attention: {what} has {got} features, the module takes {want}"
                )));
            }
        }
        mask.check(query.batch(), query.len(), key.len())
    }

    fn run(
        &self,
        query: Seq<'_>,
        key: Seq<'_>,
        value: Seq<'_>,
        mask: &Mask<'_>,
        probs: Option<&mut Vec<f32>>,
    ) -> Result<SeqBuf> {
        let (b, tq) = (query.batch(), query.len());
        let mut out = vec![0.0; b * tq * self.out_dim()];
        self.run_into(
            query,
            key,
            value,
            mask,
            &mut AttentionScratch::default(),
            probs,
            &mut out,
        )?;
        SeqBuf::new(out, b, tq, self.out_dim())
    }

    #[allow(clippy::too_many_arguments)]
    fn run_into(
        &self,
        query: Seq<'_>,
        key: Seq<'_>,
        value: Seq<'_>,
        mask: &Mask<'_>,
        scratch: &mut AttentionScratch,
        mut probs: Option<&mut Vec<f32>>,
        out: &mut [f32],
    ) -> Result<()> {
        self.check_inputs(query, key, value, mask)?;
        let (b, tq, tk) = (query.batch(), query.len(), key.len());
        if out.len() != b * tq * self.out_dim() {
            return Err(Error::Shape(format!(
                "attention: output holds {} values, [{b}, {tq}, {}] needs {}",
                out.len(),
                self.out_dim(),
                b * tq * self.out_dim()
            )));
        }
        let d = self.dims;
        let AttentionScratch { q, k, v, ctx } = scratch;
        let q = grown(q, b * tq * d.dim_qk);
        let k = grown(k, b * tk * d.dim_qk);
        let v = grown(v, b * tk * d.dim_v);
        let ctx = grown(ctx, b * tq * d.dim_v);
        self.q.forward_into(query.data(), b * tq, q)?;
        self.k.forward_into(key.data(), b * tk, k)?;
        self.v.forward_into(value.data(), b * tk, v)?;
        for i in 0..b {
            let qv = self.query_view(&q[i * tq * d.dim_qk..(i + 1) * tq * d.dim_qk], tq);
            let kv = self.key_view(&k[i * tk * d.dim_qk..(i + 1) * tk * d.dim_qk], tk);
            let vv = self.value_view(&v[i * tk * d.dim_v..(i + 1) * tk * d.dim_v], tk);
            let m = mask.for_item(i, 0)?;
            let c = &mut ctx[i * tq * d.dim_v..(i + 1) * tq * d.dim_v];
            match probs.as_deref_mut() {
                None => self.attend(&qv, &kv, &vv, &m, c)?,
                Some(p) => p.extend(qkv_kernels::attention_with_probs(
                    &qv, &kv, &vv, &m, None, c,
                )?),
            }
        }
        self.project_out(ctx, b * tq, out)
    }

    /// As [`AttentionCore::forward`], writing `[B, T_q, out_dim]` into `out` and keeping the
    /// projections in `scratch`, so that a caller running many layers (an encoder) allocates
    /// them once instead of once per call.
    ///
    /// Errors: as [`AttentionCore::forward`], and [`Error::Shape`] for an `out` of another
    /// length.
    pub fn forward_into(
        &self,
        query: Seq<'_>,
        key: Seq<'_>,
        value: Seq<'_>,
        mask: &Mask<'_>,
        scratch: &mut AttentionScratch,
        out: &mut [f32],
    ) -> Result<()> {
        self.run_into(query, key, value, mask, scratch, None, out)
    }

    /// `out(attention(q(query), k(key), v(value)))` for `query` `[B, T_q, q_in]` and
    /// `key`, `value` `[B, T_k, kv_in]`, giving `[B, T_q, out_dim]`.
    ///
    /// Errors: [`Error::Shape`] when batch sizes, lengths, features or the mask disagree.
    pub fn forward(
        &self,
        query: Seq<'_>,
        key: Seq<'_>,
        value: Seq<'_>,
        mask: &Mask<'_>,
    ) -> Result<SeqBuf> {
        self.run(query, key, value, mask, None)
    }

    /// As [`AttentionCore::forward`], also returning the attention probabilities
    /// `[B, heads, T_q, T_k]` (a fully masked row is all zeros). Slow path, for inspection.
    pub fn forward_with_probs(
        &self,
        query: Seq<'_>,
        key: Seq<'_>,
        value: Seq<'_>,
        mask: &Mask<'_>,
    ) -> Result<(SeqBuf, Vec<f32>)> {
        let mut probs = Vec::new();
        let out = self.run(query, key, value, mask, Some(&mut probs))?;
        Ok((out, probs))
    }
}

/// Buffers for [`AttentionCore::forward_into`]: the projected Q, K, V and the per-head
/// context, grown to the largest call seen and reused after that.
#[derive(Debug, Default)]
pub struct AttentionScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    ctx: Vec<f32>,
}

/// The first `n` elements of `buf`, grown (zero-filled) if it is shorter.
fn grown(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

macro_rules! core_access {
    () => {
        /// The underlying [`AttentionCore`].
        pub fn core(&self) -> &AttentionCore {
            &self.core
        }

        /// The module with every projection kept for many rows
        /// ([`AttentionCore::for_many_rows`]).
        pub fn for_many_rows(self) -> Result<Self> {
            Ok(Self {
                core: self.core.for_many_rows()?,
            })
        }

        /// The module with its K and V projections kept for many rows
        /// ([`AttentionCore::kv_for_many_rows`]).
        pub fn kv_for_many_rows(self) -> Result<Self> {
            Ok(Self {
                core: self.core.kv_for_many_rows()?,
            })
        }
    };
}

/// Seed 000's `SelfAttention(input_dim, dim_qk, dim_v)`: one head, `q`, `k`, `v` with bias,
/// no output projection; `[B, T, input_dim] → [B, T, dim_v]`, scale `1/√dim_qk`.
#[derive(Debug)]
pub struct SelfAttention {
    core: AttentionCore,
}

impl SelfAttention {
    /// Loads `q`, `k`, `v` under `scope`.
    pub fn load(scope: &Scope<'_>, input_dim: usize, dim_qk: usize, dim_v: usize) -> Result<Self> {
        let names = ProjectionNames {
            q: "q",
            k: "k",
            v: "v",
            out: None,
        };
        let dims = AttentionDims {
            q_in: input_dim,
            kv_in: input_dim,
            dim_qk,
            dim_v,
            heads: 1,
            out_dim: None,
        };
        Ok(SelfAttention {
            core: AttentionCore::load(scope, names, dims)?,
        })
    }

    /// Self-attention of `x` (the seed has no mask; pass [`Mask::none`] for it).
    pub fn forward(&self, x: Seq<'_>, mask: &Mask<'_>) -> Result<SeqBuf> {
        self.core.forward(x, x, x, mask)
    }

    core_access!();
}

/// Seed 000's `MultiHeadAttention(input_dim, num_heads, dim_qk, dim_v)`: `q`, `k`, `v`, and
/// `out: Linear(dim_v → input_dim)`; scale `1/√(dim_qk / num_heads)`.
#[derive(Debug)]
pub struct MultiHeadAttention {
    core: AttentionCore,
}

impl MultiHeadAttention {
    /// Loads `q`, `k`, `v`, `out` under `scope`. [`Error::Config`] when `num_heads` does not
    /// divide `dim_qk` and `dim_v`.
    pub fn load(
        scope: &Scope<'_>,
        input_dim: usize,
        num_heads: usize,
        dim_qk: usize,
        dim_v: usize,
    ) -> Result<Self> {
        let names = ProjectionNames {
            q: "q",
            k: "k",
            v: "v",
            out: Some("out"),
        };
        let dims = AttentionDims {
            q_in: input_dim,
            kv_in: input_dim,
            dim_qk,
            dim_v,
            heads: num_heads,
            out_dim: Some(input_dim),
        };
        Ok(MultiHeadAttention {
            core: AttentionCore::load(scope, names, dims)?,
        })
    }

    /// Multi-head self-attention of `x`.
    pub fn forward(&self, x: Seq<'_>, mask: &Mask<'_>) -> Result<SeqBuf> {
        self.core.forward(x, x, x, mask)
    }

    core_access!();
}

/// Seed 000's single-head `CrossAttention(input_dim, dim_qk, dim_v)`: queries from the
/// decoder input, keys and values from the encoder output; no output projection.
#[derive(Debug)]
pub struct CrossAttention {
    core: AttentionCore,
}

impl CrossAttention {
    /// Loads `q`, `k`, `v` under `scope`.
    pub fn load(scope: &Scope<'_>, input_dim: usize, dim_qk: usize, dim_v: usize) -> Result<Self> {
        let names = ProjectionNames {
            q: "q",
            k: "k",
            v: "v",
            out: None,
        };
        let dims = AttentionDims {
            q_in: input_dim,
            kv_in: input_dim,
            dim_qk,
            dim_v,
            heads: 1,
            out_dim: None,
        };
        Ok(CrossAttention {
            core: AttentionCore::load(scope, names, dims)?,
        })
    }

    /// `[B, T_q, dim_v]` for `decoder_input` `[B, T_q, input_dim]` attending over
    /// `encoder_input` `[B, T_k, input_dim]` (argument order as in the seed).
    pub fn forward(
        &self,
        encoder_input: Seq<'_>,
        decoder_input: Seq<'_>,
        mask: &Mask<'_>,
    ) -> Result<SeqBuf> {
        self.core
            .forward(decoder_input, encoder_input, encoder_input, mask)
    }

    core_access!();
}

/// Seed 003's multi-head `CrossAttention(embed_dim, num_heads)`: `q_proj`, `k_proj`,
/// `v_proj`, `out_proj`, all `embed_dim → embed_dim`. Dropout is the identity at inference.
#[derive(Debug)]
pub struct MultiHeadCrossAttention {
    core: AttentionCore,
}

impl MultiHeadCrossAttention {
    /// Loads the four projections under `scope`.
    pub fn load(scope: &Scope<'_>, embed_dim: usize, num_heads: usize) -> Result<Self> {
        let names = ProjectionNames {
            q: "q_proj",
            k: "k_proj",
            v: "v_proj",
            out: Some("out_proj"),
        };
        let dims = AttentionDims {
            q_in: embed_dim,
            kv_in: embed_dim,
            dim_qk: embed_dim,
            dim_v: embed_dim,
            heads: num_heads,
            out_dim: Some(embed_dim),
        };
        Ok(MultiHeadCrossAttention {
            core: AttentionCore::load(scope, names, dims)?,
        })
    }

    /// `query` `[B, T_q, E]` over `key`, `value` `[B, T_k, E]`. The seed's `mask == 0` means
    /// blocked; here build a [`Mask`] whose `true` means visible.
    pub fn forward(
        &self,
        query: Seq<'_>,
        key: Seq<'_>,
        value: Seq<'_>,
        mask: &Mask<'_>,
    ) -> Result<SeqBuf> {
        self.core.forward(query, key, value, mask)
    }

    core_access!();
}

/// Seed 001's `Attention(dim, num_heads)`: `query`, `key`, `value`, `out`, all `dim → dim`;
/// one module for self-, cross- and causal attention.
#[derive(Debug)]
pub struct Attention {
    core: AttentionCore,
}

impl Attention {
    /// Loads the four projections under `scope`.
    pub fn load(scope: &Scope<'_>, dim: usize, num_heads: usize) -> Result<Self> {
        let names = ProjectionNames {
            q: "query",
            k: "key",
            v: "value",
            out: Some("out"),
        };
        let dims = AttentionDims {
            q_in: dim,
            kv_in: dim,
            dim_qk: dim,
            dim_v: dim,
            heads: num_heads,
            out_dim: Some(dim),
        };
        Ok(Attention {
            core: AttentionCore::load(scope, names, dims)?,
        })
    }

    /// `forward(query, key, value, mask, causal)`: `causal` adds top-left causal masking to
    /// `mask` (the seed's `True` = blocked mask becomes `false` here).
    ///
    /// One deliberate difference from the seed's code: there, `causal=True` replaces the
    /// caller's mask with the causal one, so padding passed alongside was silently dropped.
    /// Here both apply, as `tools/seq2seq_fixtures.py` does for its reference.
    pub fn forward(
        &self,
        query: Seq<'_>,
        key: Seq<'_>,
        value: Seq<'_>,
        mask: &Mask<'_>,
        causal: bool,
    ) -> Result<SeqBuf> {
        let m = mask.causal_if(mask.causal || causal);
        self.core.forward(query, key, value, &m)
    }

    core_access!();
}

/// Seed 002's `MultiHeadAttention(d_model, h)`: `w_q`, `w_k`, `w_v`, `w_o`; returns the output
/// and the attention probabilities `A` `[B, h, L, L]`.
#[derive(Debug)]
pub struct MultiHeadAttentionWithProbs {
    core: AttentionCore,
}

impl MultiHeadAttentionWithProbs {
    /// Loads the four projections under `scope`.
    pub fn load(scope: &Scope<'_>, d_model: usize, h: usize) -> Result<Self> {
        let names = ProjectionNames {
            q: "w_q",
            k: "w_k",
            v: "w_v",
            out: Some("w_o"),
        };
        let dims = AttentionDims {
            q_in: d_model,
            kv_in: d_model,
            dim_qk: d_model,
            dim_v: d_model,
            heads: h,
            out_dim: Some(d_model),
        };
        Ok(MultiHeadAttentionWithProbs {
            core: AttentionCore::load(scope, names, dims)?,
        })
    }

    /// `(output [B, L, d_model], A [B, h, L, L])` for `x` `[B, L, d_model]`.
    pub fn forward(&self, x: Seq<'_>, mask: &Mask<'_>) -> Result<(SeqBuf, Vec<f32>)> {
        self.core.forward_with_probs(x, x, x, mask)
    }

    core_access!();
}

/// Seed 004's `MutiHeadAttention(hidden_size, num_head)`: `wq`, `wk`, `wv`, `output_layer`,
/// all `hidden → hidden`; the attention of the encoder–decoder Transformer.
#[derive(Debug)]
pub struct TransformerAttention {
    core: AttentionCore,
}

impl TransformerAttention {
    /// Loads the four projections under `scope`.
    pub fn load(scope: &Scope<'_>, hidden: usize, num_heads: usize) -> Result<Self> {
        let names = ProjectionNames {
            q: "wq",
            k: "wk",
            v: "wv",
            out: Some("output_layer"),
        };
        let dims = AttentionDims {
            q_in: hidden,
            kv_in: hidden,
            dim_qk: hidden,
            dim_v: hidden,
            heads: num_heads,
            out_dim: Some(hidden),
        };
        Ok(TransformerAttention {
            core: AttentionCore::load(scope, names, dims)?,
        })
    }

    /// `q` `[B, q_len, hidden]` over `k`, `v` `[B, k_len, hidden]`. The seed's separate
    /// padding and causal masks (`True` = blocked) become one [`Mask`] (`true` = visible).
    pub fn forward(&self, q: Seq<'_>, k: Seq<'_>, v: Seq<'_>, mask: &Mask<'_>) -> Result<SeqBuf> {
        self.core.forward(q, k, v, mask)
    }

    core_access!();
}
