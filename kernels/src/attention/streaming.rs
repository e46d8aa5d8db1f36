//! The blocked streaming-softmax kernel behind [`super::attention`], in four parts:
//!
//! - [`plan`], the planner: how a call is cut into work items, whether it runs on the pool,
//!   splits the keys (decode) or packs key blocks once up front (prefill);
//! - [`driver`]: runs the plan (packing, the per-item loop over key blocks, the masks, the
//!   normalisation of each row and the merge of split keys);
//! - the micro-kernels behind the [`micro::Micro`] trait: [`micro::Scalar`] (plain loops, the
//!   reference) and `avx2::Avx2` (AVX2 + FMA + F16C);
//! - [`exact`]: one row by the exact rule, which the probabilities of
//!   [`super::attention_with_probs`] and every row that comes out non-finite are computed by.
//!
//! A work item is one KV head `g`, a block of `nq` consecutive queries and a range of keys.
//! Its rows are the `group · nq` (query head, query) pairs that read KV head `g`, row
//! `r = hi·nq + qi` being query `i0 + qi` of head `g·group + hi`, so K and V blocks are packed
//! once and reused by every query head that shares them (GQA, MQA).
//!
//! Per key block of [`KB`] keys the item packs Kᵀ and V into f32 scratch, computes the
//! `rows × KB` scores (Q is pre-scaled), masks them, folds them into each row's running
//! (max, sum, accumulator) and accumulates `P·V`. Only that one block of scores exists.
//! Items of at most [`IN_PLACE_MAX_ROWS`] rows (decode) skip the packing and read K and V
//! where they lie, which is fastest when each head's positions are contiguous (a head-major
//! cache). With the keys split across items (decode), the partial states are merged at the
//! end.

use super::{AttentionCall, AttentionMask, Dims, KvView, QueryView};
use micro::Scalar;
pub(super) use scratch::{reserve, ScratchSizes};

/// Keys per block.
pub(super) const KB: usize = 64;
/// Rows (query head × query) a work item aims for: enough to amortise packing K and V.
pub(super) const ROWS_TARGET: usize = 96;
/// Items with at most this many rows read K and V in place instead of packing them.
const IN_PLACE_MAX_ROWS: usize = 8;

/// Kᵀ and V of every key block, packed once per call when several query blocks would
/// otherwise each pack them again: block `b` of KV head `g` is entry `g·blocks + b`.
struct Packed<'a> {
    kt: &'a [f32],
    v: &'a [f32],
    blocks: usize,
}

/// A call that [`super::validate`] accepted: its views, its mask and their dimensions.
pub(super) struct Call<'a> {
    pub(super) q: &'a QueryView<'a>,
    pub(super) k: &'a KvView<'a>,
    pub(super) v: &'a KvView<'a>,
    pub(super) mask: &'a AttentionMask<'a>,
    pub(super) dims: Dims,
}

/// Everything an item needs to know about the call.
struct Ctx<'a> {
    q: &'a QueryView<'a>,
    k: &'a KvView<'a>,
    v: &'a KvView<'a>,
    mask: &'a AttentionMask<'a>,
    dims: Dims,
    group: usize,
    /// `d_v` rounded up to the vector width.
    dvp: usize,
    /// Pre-packed key blocks (prefill), or `None` to pack per item (decode).
    packed: Option<Packed<'a>>,
}

impl<'a> Ctx<'a> {
    /// The context of a call that packs per item.
    fn new(call: &Call<'a>) -> Self {
        let dims = call.dims;
        Ctx {
            q: call.q,
            k: call.k,
            v: call.v,
            mask: call.mask,
            dims,
            group: dims.heads / dims.kv_heads,
            dvp: dims.d_v.div_ceil(8) * 8,
            packed: None,
        }
    }

    /// Writes query `i` of head `h`, times the scale, to `dst` (`d_qk` floats).
    #[inline]
    fn scaled_query(&self, i: usize, h: usize, dst: &mut [f32]) {
        let (q, d) = (self.q, self.dims.d_qk);
        let src = &q.data[i * q.row_stride + h * q.head_stride..][..d];
        for (y, x) in dst[..d].iter_mut().zip(src) {
            *y = x * self.dims.scale;
        }
    }
}

/// One item's rows: which KV head, which queries, which keys.
#[derive(Clone, Copy, Debug)]
struct Item {
    g: usize,
    i0: usize,
    nq: usize,
    j0: usize,
    j1: usize,
}

/// Runs attention with the fastest micro-kernels this CPU has.
pub(super) fn run(call: &Call<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        return driver::run_with::<avx2::Avx2>(call, out);
    }
    driver::run_with::<Scalar>(call, out)
}

/// Runs several calls at once with the fastest micro-kernels this CPU has, each output
/// equal to its call run by [`run`] alone. The calls must have passed [`super::validate`].
pub(super) fn run_many(calls: &mut [AttentionCall<'_>]) -> super::Result<()> {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        return driver::run_many_with::<avx2::Avx2>(calls);
    }
    driver::run_many_with::<Scalar>(calls)
}

/// Runs attention with the scalar micro-kernels only (the reference path).
#[cfg(any(test, feature = "testing"))]
pub(super) fn run_scalar(call: &Call<'_>, out: &mut [f32]) {
    driver::run_with::<Scalar>(call, out)
}

pub(super) use exact::with_probs;

#[cfg(target_arch = "x86_64")]
mod avx2;
mod driver;
mod exact;
mod mask;
mod micro;
mod plan;
mod scratch;
