//! [`AttentionCore`]: query/key/value projections, multi-head scaled dot-product attention
//! through the one kernel, and an optional output projection. The seeds' attention modules
//! ([`super::seeds`]) and the models' attention layers are all one of these.
//!
//! Heads split the projected features as PyTorch's `view(B, T, h, d/h).transpose(1, 2)`
//! does: head `i` owns columns `[i·d_h, (i+1)·d_h)`. Scores are scaled by `1/√d_h` (the
//! per-head query/key size). Masks follow [`super::mask`]: `true` = visible, and a query row
//! with no visible key gives zeros before the output projection.

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
            [query, key, value],
            mask,
            &mut AttentionScratch::default(),
            probs,
            &mut out,
        )?;
        SeqBuf::new(out, b, tq, self.out_dim())
    }

    /// The attention of `query` over `key` and `value` into `out`, the projections kept in
    /// `scratch`, each batch item's probabilities appended to `probs` when it is given.
    fn run_into(
        &self,
        [query, key, value]: [Seq<'_>; 3],
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
        self.run_into([query, key, value], mask, scratch, None, out)
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
