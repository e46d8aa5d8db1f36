//! Scaled dot-product attention, `softmax(Q·Kᵀ·scale + mask)·V`, as one streaming kernel.
//!
//! [`attention`] serves every attention in qkv: self-, cross- and causal attention,
//! multi-head, grouped-query and multi-query, prefill (many queries) and decode (one query
//! against a long KV cache).
//!
//! - Layout: Q `[tq, heads, d_qk]`, K `[tk, kv_heads, d_qk]`, V `[tk, kv_heads, d_v]`, each a
//!   strided view ([`QueryView`], [`KvView`]) so that a KV cache with spare capacity, or a
//!   head-major cache, is read in place. K and V may be f32, f16 or Q8_0 blocks
//!   ([`KvData::Q8_0`], see [`kv_q8`]). Query head `h` reads KV head `h / (heads / kv_heads)`.
//!   The output is `[tq, heads, d_v]`, contiguous.
//! - Streaming softmax: keys are visited in blocks; each query row keeps its running maximum,
//!   normaliser and weighted sum, so the `tq × tk` score matrix never exists beyond one block
//!   per worker thread.
//! - Masks ([`AttentionMask`]) are fused into the loop: causal with a query offset, a sliding
//!   window beside the causal end, per-key padding flags at any positions, and an optional
//!   dense `[tq, tk]` mask. Key blocks that lie wholly in the future of every query of a
//!   block, or wholly before the window of every one, are skipped, not computed. Scores may
//!   be soft-capped (`cap·tanh(s/cap)`) on the way, in the same loop.
//! - **A query row whose keys are all masked returns zeros** (PyTorch would return NaN with
//!   `-inf` fills, or the mean of V with `-1e9` fills).
//!
//! # NaN and infinities
//!
//! Non-finite values are never hidden: they propagate as in PyTorch's math path of
//! `scaled_dot_product_attention` (the softmax of the scores with masked positions at −∞,
//! times V), except that a masked key takes no part at all. Precisely, for one query row:
//!
//! - **Masked keys are never used.** Whatever a masked key's K or V row holds (NaN, ±∞),
//!   it changes nothing: its score is −∞ and its V is not added, not even as `0·V`.
//!   (PyTorch's math path adds `0·V`, so a NaN in a masked V row reaches its output; its
//!   fused kernels, like this one, skip masked blocks.)
//! - **A NaN score makes the row NaN**: a NaN in the query, or in the K row of a visible
//!   key, or `0·∞` in a dot product, gives NaN in every output element of that row (and, in
//!   [`attention_with_probs`], in every probability of it).
//! - **A +∞ score makes the row NaN** (`∞ − ∞` in the softmax), as does a visible key
//!   whose K holds ±∞ when the dot product comes out +∞ (a score of −∞ instead gives that
//!   key weight 0, like a masked one).
//! - **A row with visible keys whose scores are all −∞ is NaN** (`0/0`), unlike a row
//!   with no visible key at all, which is zeros (above).
//! - **NaN or ±∞ in the V row of a visible key reaches the output** as `p·V` does: NaN,
//!   or ±∞, or NaN where its probability is 0 (`0·∞`), even if that probability
//!   underflowed.
//! - Soft-capping maps the scores before the masks, as its formula does: ±∞ becomes ±cap
//!   (so a +∞ score no longer poisons the row), NaN stays NaN.
//!
//! The SIMD and scalar paths, prefill, decode and split keys, f32 and f16 caches all follow
//! this rule; where a row's output is not finite it is computed again by the scalar exact
//! path, which decides it, so the paths agree on where NaN appears. Overflow is not
//! guarded: finite inputs whose scores or sums overflow behave like the ∞ they become.
//! - Work is split over (KV head, query block) across rayon's pool; when that gives too few
//!   pieces (decode), the keys are split too and the partial softmax states are merged.
//!   Decode reads K and V in place rather than packing them; a head-major cache
//!   ([`KvView::head_major`]) lets it stream each head's keys in order.
//!
//! [`attention_with_probs`] is the slow path that also returns the probabilities.
//!
//! ```
//! use qkv_kernels::{attention, AttentionMask, KvView, QueryView};
//! // One head, two queries, three keys, d = 2; causal from position 0.
//! let q = [1.0, 0.0, 0.0, 1.0];
//! let k = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let mut out = [0.0; 4];
//! attention(
//!     &QueryView::contiguous(&q, 2, 1, 2),
//!     &KvView::contiguous_f32(&k, 3, 1, 2),
//!     &KvView::contiguous_f32(&v, 3, 1, 2),
//!     &AttentionMask::causal(0),
//!     None,
//!     &mut out,
//! )
//! .unwrap();
//! assert_eq!(&out[..2], &[1.0, 2.0]); // query 0 sees key 0 only
//! ```

use crate::error::{check_covers, check_len, check_nonzero, try_zeros_f32, KernelError, Result};
use half::f16;
use streaming::Call;

/// Queries: `rows × heads × dim` f32 values, element `(r, h, d)` at
/// `r·row_stride + h·head_stride + d`.
#[derive(Clone, Copy, Debug)]
pub struct QueryView<'a> {
    /// The backing slice.
    pub data: &'a [f32],
    /// Number of query positions (`tq`).
    pub rows: usize,
    /// Number of query heads.
    pub heads: usize,
    /// Elements per head (`d_qk`).
    pub dim: usize,
    /// Elements between consecutive positions.
    pub row_stride: usize,
    /// Elements between consecutive heads of one position.
    pub head_stride: usize,
}

impl<'a> QueryView<'a> {
    /// A dense `[rows, heads, dim]` view. (A `heads · dim` that overflows saturates, so
    /// the kernels reject the view as overflowing.)
    pub fn contiguous(data: &'a [f32], rows: usize, heads: usize, dim: usize) -> Self {
        QueryView {
            data,
            rows,
            heads,
            dim,
            row_stride: heads.saturating_mul(dim),
            head_stride: dim,
        }
    }
}

/// The element type of a K or V view.
#[derive(Clone, Copy, Debug)]
pub enum KvData<'a> {
    /// 32-bit floats.
    F32(&'a [f32]),
    /// Half floats, widened as they are read.
    F16(&'a [f16]),
    /// Q8_0 blocks, as llama.cpp's `q8_0` cache type: the element at flat index `i` is
    /// `q[i] · d[i / 32]`, one f16 scale per 32 consecutive elements (see [`kv_q8`]). The
    /// kernels read the blocks where they lie, a key block at a time. A view of this type
    /// must start every head row on a block: its `row_stride` (when `rows > 1`) and
    /// `head_stride` (when `heads > 1`) are multiples of [`kv_q8::BLOCK`]; a `dim` that is
    /// not leaves the rest of the row's last block unread (padding).
    Q8_0 {
        /// The quantized values, one per element.
        q: &'a [i8],
        /// The scales, one per [`kv_q8::BLOCK`] elements.
        d: &'a [f16],
    },
}

impl KvData<'_> {
    /// Checks that the data holds `need` elements (`what` names the view in the error), and
    /// for Q8_0 blocks that the scales cover them.
    fn check_covers(&self, what: &'static str, need: usize) -> Result<()> {
        match self {
            KvData::F32(x) => check_covers(what, need, x.len()),
            KvData::F16(x) => check_covers(what, need, x.len()),
            KvData::Q8_0 { q, d } => {
                check_covers(what, need, q.len())?;
                check_covers(what, need.div_ceil(kv_q8::BLOCK), d.len())
            }
        }
    }
}

/// Keys or values: `rows × heads × dim`, element `(r, h, d)` at
/// `r·row_stride + h·head_stride + d`. A cache of capacity `C > rows` is viewed in place by
/// passing its first `rows` positions' strides.
#[derive(Clone, Copy, Debug)]
pub struct KvView<'a> {
    /// The backing slice.
    pub data: KvData<'a>,
    /// Number of key positions (`tk`).
    pub rows: usize,
    /// Number of KV heads.
    pub heads: usize,
    /// Elements per head.
    pub dim: usize,
    /// Elements between consecutive positions.
    pub row_stride: usize,
    /// Elements between consecutive heads of one position.
    pub head_stride: usize,
}

impl<'a> KvView<'a> {
    /// A dense `[rows, heads, dim]` view of either dtype. (A `heads · dim` that overflows
    /// saturates, so the kernels reject the view as overflowing.)
    pub fn contiguous(data: KvData<'a>, rows: usize, heads: usize, dim: usize) -> Self {
        KvView {
            data,
            rows,
            heads,
            dim,
            row_stride: heads.saturating_mul(dim),
            head_stride: dim,
        }
    }

    /// The first `rows` positions of a head-major `[heads, capacity, dim]` buffer (a KV cache
    /// that keeps each head's positions together, so that decoding streams them in order).
    /// (A `capacity · dim` that overflows saturates, so the kernels reject the view.)
    ///
    /// ```
    /// use qkv_kernels::{KvData, KvView};
    /// // 2 heads × capacity 4 × dim 3, of which 2 positions are filled.
    /// let cache = [0.0f32; 2 * 4 * 3];
    /// let view = KvView::head_major(KvData::F32(&cache), 2, 2, 3, 4);
    /// assert_eq!((view.row_stride, view.head_stride), (3, 12));
    /// ```
    pub fn head_major(
        data: KvData<'a>,
        rows: usize,
        heads: usize,
        dim: usize,
        capacity: usize,
    ) -> Self {
        KvView {
            data,
            rows,
            heads,
            dim,
            row_stride: dim,
            head_stride: capacity.saturating_mul(dim),
        }
    }

    /// A dense `[rows, heads, dim]` f32 view.
    pub fn contiguous_f32(data: &'a [f32], rows: usize, heads: usize, dim: usize) -> Self {
        Self::contiguous(KvData::F32(data), rows, heads, dim)
    }

    /// A dense `[rows, heads, dim]` f16 view.
    pub fn contiguous_f16(data: &'a [f16], rows: usize, heads: usize, dim: usize) -> Self {
        Self::contiguous(KvData::F16(data), rows, heads, dim)
    }

    #[inline]
    fn offset(&self, row: usize, head: usize) -> usize {
        row * self.row_stride + head * self.head_stride
    }

    #[inline]
    fn get(&self, row: usize, head: usize, d: usize) -> f32 {
        let i = self.offset(row, head) + d;
        match self.data {
            KvData::F32(x) => x[i],
            KvData::F16(x) => x[i].to_f32(),
            KvData::Q8_0 { q, d } => q[i] as f32 * d[i / kv_q8::BLOCK].to_f32(),
        }
    }
}

/// Which (query, key) pairs may attend, and how their scores are capped. `true` means
/// *visible* everywhere in this API; a key is attended only if every given mask allows it.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionMask<'a> {
    /// Causal masking with a query offset `p₀`: query `i` sits at absolute position `p₀ + i`
    /// and sees keys `j ≤ p₀ + i`. `Some(0)` is PyTorch's `is_causal=True` (top-left aligned).
    pub causal_offset: Option<usize>,
    /// A sliding window of `w` positions beside the causal end: query `i` sees only keys
    /// `j > p₀ + i − w`, the `w` most recent positions, itself included (Mistral's and
    /// Gemma's local attention, transformers' `kv_idx > q_idx − sliding_window`). Needs
    /// `causal_offset`; `w ≥ 1`.
    pub window: Option<usize>,
    /// Per-key flags, length `tk`: `false` marks padding that no query attends.
    pub key_keep: Option<&'a [bool]>,
    /// Dense flags `[tq, tk]`, row-major: `false` blocks that (query, key) pair.
    pub dense_keep: Option<&'a [bool]>,
    /// Soft-capping of the scaled scores, `s → cap·tanh(s / cap)` before the masks and the
    /// softmax (Gemma 2's `attn_logit_softcapping`). Finite and positive.
    pub softcap: Option<f32>,
}

impl<'a> AttentionMask<'a> {
    /// No masking.
    pub fn none() -> Self {
        Self::default()
    }

    /// Causal masking, queries starting at absolute position `offset`.
    pub fn causal(offset: usize) -> Self {
        AttentionMask {
            causal_offset: Some(offset),
            ..Self::default()
        }
    }

    /// Causal masking with a sliding window of `window` positions (see
    /// [`window`](Self::window)), queries starting at absolute position `offset`.
    ///
    /// ```
    /// use qkv_kernels::AttentionMask;
    /// // Query 0 at position 5 with a window of 3 sees keys 3, 4 and 5.
    /// let m = AttentionMask::sliding(5, 3);
    /// assert!(!m.visible(0, 2, 8) && m.visible(0, 3, 8) && !m.visible(0, 6, 8));
    /// ```
    pub fn sliding(offset: usize, window: usize) -> Self {
        AttentionMask {
            causal_offset: Some(offset),
            window: Some(window),
            ..Self::default()
        }
    }

    /// Adds soft-capping of the scores at `cap` (see [`softcap`](Self::softcap)).
    pub fn with_softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// The first key query `i` may see under the sliding window (0 without one); keys
    /// before it are masked. Saturates instead of wrapping.
    #[inline]
    pub fn window_start(&self, i: usize) -> usize {
        match (self.causal_offset, self.window) {
            (Some(p0), Some(w)) => p0.saturating_add(i).saturating_add(1).saturating_sub(w),
            _ => 0,
        }
    }

    /// Adds per-key padding flags (`true` = real key).
    pub fn with_key_keep(mut self, keep: &'a [bool]) -> Self {
        self.key_keep = Some(keep);
        self
    }

    /// Adds a dense `[tq, tk]` mask (`true` = visible).
    pub fn with_dense_keep(mut self, keep: &'a [bool]) -> Self {
        self.dense_keep = Some(keep);
        self
    }

    /// True when query `i` may attend key `j` (`tk` is the number of keys).
    ///
    /// Never panics: a pair outside the shapes the mask describes is not visible, i.e. this
    /// returns `false` when `j ≥ tk`, when `j` is past `key_keep`, or when `i·tk + j` is
    /// past `dense_keep`. A causal position `p₀ + i` past `usize::MAX` sees every key.
    #[inline]
    pub fn visible(&self, i: usize, j: usize, tk: usize) -> bool {
        if j >= tk {
            return false;
        }
        if let Some(p0) = self.causal_offset {
            if j > p0.saturating_add(i) || j < self.window_start(i) {
                return false;
            }
        }
        if let Some(keep) = self.key_keep {
            if keep.get(j) != Some(&true) {
                return false;
            }
        }
        if let Some(dense) = self.dense_keep {
            let at = i.checked_mul(tk).and_then(|r| r.checked_add(j));
            if at.and_then(|at| dense.get(at)) != Some(&true) {
                return false;
            }
        }
        true
    }
}

/// Shapes every attention entry point agrees on, after validation.
#[derive(Clone, Copy, Debug)]
struct Dims {
    tq: usize,
    tk: usize,
    heads: usize,
    kv_heads: usize,
    d_qk: usize,
    d_v: usize,
    scale: f32,
}

fn view_span(
    rows: usize,
    heads: usize,
    dim: usize,
    row_stride: usize,
    head_stride: usize,
) -> Option<usize> {
    (rows - 1)
        .checked_mul(row_stride)?
        .checked_add((heads - 1).checked_mul(head_stride)?)?
        .checked_add(dim)
}

/// Checks a call's views, mask and output length against each other, and gives the call.
fn validate<'a>(
    q: &'a QueryView<'a>,
    k: &'a KvView<'a>,
    v: &'a KvView<'a>,
    mask: &'a AttentionMask<'a>,
    scale: Option<f32>,
    out_len: usize,
) -> Result<Call<'a>> {
    check_nonzero("tq (query rows)", q.rows)?;
    check_nonzero("heads", q.heads)?;
    check_nonzero("d_qk (query dim)", q.dim)?;
    check_nonzero("tk (key rows)", k.rows)?;
    check_nonzero("kv_heads", k.heads)?;
    check_nonzero("d_v (value dim)", v.dim)?;
    if k.rows != v.rows {
        return Err(KernelError::Mismatch {
            what: "key rows vs value rows",
            left: k.rows,
            right: v.rows,
        });
    }
    if k.heads != v.heads {
        return Err(KernelError::Mismatch {
            what: "key heads vs value heads",
            left: k.heads,
            right: v.heads,
        });
    }
    if k.dim != q.dim {
        return Err(KernelError::Mismatch {
            what: "key dim vs query dim",
            left: k.dim,
            right: q.dim,
        });
    }
    if !q.heads.is_multiple_of(k.heads) {
        return Err(KernelError::Mismatch {
            what: "heads must be a multiple of kv_heads",
            left: q.heads,
            right: k.heads,
        });
    }
    let span = |what: &'static str, rows, heads, dim, rs, hs| -> Result<usize> {
        view_span(rows, heads, dim, rs, hs)
            .ok_or_else(|| KernelError::Invalid(format!("`{what}` strides overflow")))
    };
    let need = span("q", q.rows, q.heads, q.dim, q.row_stride, q.head_stride)?;
    check_covers("q", need, q.data.len())?;
    for (what, x) in [("k", k), ("v", v)] {
        let need = span(what, x.rows, x.heads, x.dim, x.row_stride, x.head_stride)?;
        x.data.check_covers(what, need)?;
        kv_q8::check_alignment(what, x)?;
    }
    // Checked: a wrapped product could match a short slice and let the kernel write past
    // `out` or read past the mask.
    let out_need = q
        .rows
        .checked_mul(q.heads)
        .and_then(|n| n.checked_mul(v.dim))
        .ok_or_else(|| {
            KernelError::Invalid(format!(
                "`out` of tq {} × heads {} × d_v {} elements overflows usize",
                q.rows, q.heads, v.dim
            ))
        })?;
    check_len("out", out_need, out_len)?;
    if let Some(keep) = mask.key_keep {
        check_len("key_keep", k.rows, keep.len())?;
    }
    if let Some(dense) = mask.dense_keep {
        let need = q.rows.checked_mul(k.rows).ok_or_else(|| {
            KernelError::Invalid(format!(
                "`dense_keep` of tq {} × tk {} flags overflows usize",
                q.rows, k.rows
            ))
        })?;
        check_len("dense_keep", need, dense.len())?;
    }
    if let Some(p0) = mask.causal_offset {
        // The kernel forms positions up to p₀ + tq; they must not wrap.
        if p0.checked_add(q.rows).is_none() {
            return Err(KernelError::Invalid(format!(
                "causal_offset {p0} + tq {} query rows overflows usize",
                q.rows
            )));
        }
    }
    match (mask.window, mask.causal_offset) {
        (Some(0), _) => {
            return Err(KernelError::Invalid(
                "window must be at least 1 position".into(),
            ))
        }
        (Some(w), None) => {
            return Err(KernelError::Invalid(format!(
                "window {w} needs a causal_offset (the window ends at each query's position)"
            )))
        }
        _ => {}
    }
    if let Some(cap) = mask.softcap {
        if !(cap.is_finite() && cap > 0.0) {
            return Err(KernelError::Invalid(format!(
                "softcap must be finite and positive, got {cap}"
            )));
        }
    }
    // The per-thread buffers of this shape must be sizeable (they can only overflow for
    // views with zero strides, whose slices need not hold heads · dim elements).
    if streaming::ScratchSizes::new(q.heads, k.heads, q.dim, v.dim, rayon::current_num_threads())
        .is_none()
    {
        return Err(KernelError::Invalid(format!(
            "attention scratch for heads {} over kv_heads {}, d_qk {}, d_v {} overflows usize",
            q.heads, k.heads, q.dim, v.dim
        )));
    }
    let scale = scale.unwrap_or(1.0 / (q.dim as f32).sqrt());
    if !scale.is_finite() {
        return Err(KernelError::Invalid(format!(
            "scale must be finite, got {scale}"
        )));
    }
    let dims = Dims {
        tq: q.rows,
        tk: k.rows,
        heads: q.heads,
        kv_heads: k.heads,
        d_qk: q.dim,
        d_v: v.dim,
        scale,
    };
    Ok(Call {
        q,
        k,
        v,
        mask,
        dims,
    })
}

/// Attention over the views, written to `out` `[tq, heads, d_v]`. `scale` defaults to
/// `1/√d_qk`. Errors (never panics) when shapes, strides, lengths or masks disagree.
pub fn attention(
    q: &QueryView<'_>,
    k: &KvView<'_>,
    v: &KvView<'_>,
    mask: &AttentionMask<'_>,
    scale: Option<f32>,
    out: &mut [f32],
) -> Result<()> {
    let call = validate(q, k, v, mask, scale, out.len())?;
    streaming::run(&call, out);
    Ok(())
}

/// One call of [`attention_many`]: the arguments of [`attention`].
pub struct AttentionCall<'a> {
    /// The queries.
    pub q: QueryView<'a>,
    /// The keys.
    pub k: KvView<'a>,
    /// The values.
    pub v: KvView<'a>,
    /// The mask.
    pub mask: AttentionMask<'a>,
    /// The scale of the scores (`None`: `1/√d_qk`).
    pub scale: Option<f32>,
    /// The output `[tq, heads, d_v]`, overwritten.
    pub out: &'a mut [f32],
}

/// Several independent attention calls at once, such as every sequence's attention in a
/// batched decode step: each output equals what [`attention`] gives for its call alone, bit
/// for bit, but the work items of all the calls run in one pass over rayon's pool, so a
/// step hands off to the threads once instead of once per sequence and short calls balance
/// each other. Errors as [`attention`] would on any call, before anything runs.
///
/// ```
/// use qkv_kernels::{attention, attention_many, AttentionCall, AttentionMask, KvView, QueryView};
/// // Two sequences decoding one token each (2 heads of 4, one KV head), at 3 and 5 keys.
/// let q = [0.5f32; 8];
/// let (k3, v3) = (vec![0.25f32; 3 * 4], vec![1.0f32; 3 * 4]);
/// let (k5, v5) = (vec![-0.5f32; 5 * 4], vec![2.0f32; 5 * 4]);
/// let (mut a, mut b) = (vec![0.0; 8], vec![0.0; 8]);
/// let mut calls = [
///     AttentionCall {
///         q: QueryView::contiguous(&q, 1, 2, 4),
///         k: KvView::contiguous_f32(&k3, 3, 1, 4),
///         v: KvView::contiguous_f32(&v3, 3, 1, 4),
///         mask: AttentionMask::causal(2),
///         scale: None,
///         out: &mut a,
///     },
///     AttentionCall {
///         q: QueryView::contiguous(&q, 1, 2, 4),
///         k: KvView::contiguous_f32(&k5, 5, 1, 4),
///         v: KvView::contiguous_f32(&v5, 5, 1, 4),
///         mask: AttentionMask::causal(4),
///         scale: None,
///         out: &mut b,
///     },
/// ];
/// attention_many(&mut calls)?;
/// let mut alone = vec![0.0; 8];
/// let (k, v) = (KvView::contiguous_f32(&k5, 5, 1, 4), KvView::contiguous_f32(&v5, 5, 1, 4));
/// let q = QueryView::contiguous(&q, 1, 2, 4);
/// attention(&q, &k, &v, &AttentionMask::causal(4), None, &mut alone)?;
/// assert_eq!(b, alone);
/// # Ok::<(), qkv_kernels::KernelError>(())
/// ```
pub fn attention_many(calls: &mut [AttentionCall<'_>]) -> Result<()> {
    for c in calls.iter() {
        validate(&c.q, &c.k, &c.v, &c.mask, c.scale, c.out.len())?;
    }
    streaming::run_many(calls)
}

/// [`attention`] computed with the scalar micro-kernels only: the same blocking, masking and
/// splitting, with plain loops in place of the SIMD tiles. The reference the SIMD path is
/// tested against, and the fallback on CPUs without AVX2/FMA/F16C.
#[cfg(any(test, feature = "testing"))]
pub fn attention_scalar(
    q: &QueryView<'_>,
    k: &KvView<'_>,
    v: &KvView<'_>,
    mask: &AttentionMask<'_>,
    scale: Option<f32>,
    out: &mut [f32],
) -> Result<()> {
    let call = validate(q, k, v, mask, scale, out.len())?;
    streaming::run_scalar(&call, out);
    Ok(())
}

/// Sizes the per-thread scratch of [`attention`] on every thread of rayon's current pool and
/// on the calling thread, for `heads` query heads over `kv_heads` KV heads. Afterwards, decode
/// calls (one query row) of that shape allocate nothing, whichever thread runs them; without
/// it each thread sizes its buffers on first use. Prefill calls may still grow them once.
///
/// The memory per thread grows with the number of threads only up to 16 (the split-decode
/// partials follow the key splits, which stop at 64). Errors (allocating
/// nothing) when a dimension is zero or `heads` is not a multiple of `kv_heads`, as
/// [`attention`] would, and errors (rather than panicking or aborting) when the sizes
/// overflow or cannot be allocated; threads sized before the failure keep their buffers.
pub fn reserve_scratch(heads: usize, kv_heads: usize, d_qk: usize, d_v: usize) -> Result<()> {
    check_nonzero("heads", heads)?;
    check_nonzero("kv_heads", kv_heads)?;
    check_nonzero("d_qk (query dim)", d_qk)?;
    check_nonzero("d_v (value dim)", d_v)?;
    if !heads.is_multiple_of(kv_heads) {
        return Err(KernelError::Mismatch {
            what: "heads must be a multiple of kv_heads",
            left: heads,
            right: kv_heads,
        });
    }
    let shape = || format!("heads {heads} over kv_heads {kv_heads}, d_qk {d_qk}, d_v {d_v}");
    let sizes =
        streaming::ScratchSizes::new(heads, kv_heads, d_qk, d_v, rayon::current_num_threads())
            .ok_or_else(|| {
                KernelError::Invalid(format!("attention scratch for {} overflows usize", shape()))
            })?;
    let failed = || {
        KernelError::Invalid(format!(
            "attention scratch for {} cannot be allocated",
            shape()
        ))
    };
    // Every thread tries (a broadcast cannot stop half-way); any failure is the error.
    let on_pool = rayon::broadcast(|_| streaming::reserve(sizes).is_ok());
    if on_pool.contains(&false) {
        return Err(failed());
    }
    streaming::reserve(sizes).map_err(|_| failed())
}

/// The slow path: the same result as [`attention`] plus the probabilities `[heads, tq, tk]`
/// (row `(h, i)` sums to 1, is all zeros when every key is masked, and is all NaN when the
/// row's output is NaN by the rule of the [module documentation](self)). Each row is
/// computed by the kernel's own exact-row path (the scalar score, mask and softmax steps,
/// in two passes over the keys), so there is one softmax in the crate. It keeps the whole
/// probability matrix, so it is for inspection and tests, not for speed; errors as
/// [`attention`] does, and when that matrix cannot be allocated.
pub fn attention_with_probs(
    q: &QueryView<'_>,
    k: &KvView<'_>,
    v: &KvView<'_>,
    mask: &AttentionMask<'_>,
    scale: Option<f32>,
    out: &mut [f32],
) -> Result<Vec<f32>> {
    let call = validate(q, k, v, mask, scale, out.len())?;
    let Dims { tq, tk, heads, .. } = call.dims;
    let len = heads.checked_mul(tq).and_then(|n| n.checked_mul(tk));
    let mut probs = try_zeros_f32(len, || {
        format!("the probabilities of heads {heads} × tq {tq} × tk {tk}")
    })?;
    streaming::with_probs(&call, out, &mut probs);
    Ok(probs)
}

pub mod kv_q8;
mod streaming;
