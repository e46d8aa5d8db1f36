//! The blocked streaming-softmax kernel behind [`super::attention`].
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

use super::{AttentionMask, Dims, KvView, QueryView};
use crate::SharedOut;
use micro::{Micro, Scalar};
use rayon::prelude::*;
use scratch::{key_splits, try_grow, Scratch, PACKED, PARTIALS, SCRATCH, SPLIT_ITEMS_PER_THREAD};
pub(super) use scratch::{reserve, ScratchSizes};

/// Keys per block.
pub(super) const KB: usize = 64;
/// Rows (query head × query) a work item aims for: enough to amortise packing K and V.
pub(super) const ROWS_TARGET: usize = 96;
/// Items with at most this many rows read K and V in place instead of packing them.
const IN_PLACE_MAX_ROWS: usize = 8;
/// Below this many multiply-adds the call runs on the calling thread alone.
const PARALLEL_MIN_WORK: usize = 1 << 17;

/// Kᵀ and V of every key block, packed once per call when several query blocks would
/// otherwise each pack them again: block `b` of KV head `g` is entry `g·blocks + b`.
struct Packed<'a> {
    kt: &'a [f32],
    v: &'a [f32],
    blocks: usize,
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
pub(super) fn run(
    q: &QueryView<'_>,
    k: &KvView<'_>,
    v: &KvView<'_>,
    mask: &AttentionMask<'_>,
    dims: &Dims,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma_f16c() {
        return run_with::<avx2::Avx2>(q, k, v, mask, dims, out);
    }
    run_with::<Scalar>(q, k, v, mask, dims, out)
}

/// Runs attention with the scalar micro-kernels only (the reference path).
pub(super) fn run_scalar(
    q: &QueryView<'_>,
    k: &KvView<'_>,
    v: &KvView<'_>,
    mask: &AttentionMask<'_>,
    dims: &Dims,
    out: &mut [f32],
) {
    run_with::<Scalar>(q, k, v, mask, dims, out)
}

fn run_with<M: Micro + ProcessItem>(
    q: &QueryView<'_>,
    k: &KvView<'_>,
    v: &KvView<'_>,
    mask: &AttentionMask<'_>,
    dims: &Dims,
    out: &mut [f32],
) {
    let group = dims.heads / dims.kv_heads;
    let qb = (ROWS_TARGET / group).clamp(1, dims.tq);
    let dvp = dims.d_v.div_ceil(8) * 8;
    let q_blocks = dims.tq.div_ceil(qb);
    let base_items = dims.kv_heads * q_blocks;
    let threads = rayon::current_num_threads();
    // Keys before the first query's sliding window are seen by no query at all.
    let k_lo = mask.window_start(0).min(dims.tk);
    // Saturating: with zero-stride views tq·tk need not fit, and this only picks the split.
    let work = dims
        .tq
        .saturating_mul(dims.tk)
        .saturating_mul(dims.heads)
        .saturating_mul(dims.d_qk.saturating_add(dims.d_v));
    let parallel = threads > 1 && work >= PARALLEL_MIN_WORK;
    // Too few items to keep every thread busy (decode): split the keys as well.
    let splits = if parallel && base_items < SPLIT_ITEMS_PER_THREAD * threads {
        key_splits(base_items, dims.tk - k_lo, threads)
    } else {
        1
    };
    // With three or more query blocks, packing every key block once up front is cheaper
    // than packing it again in every item.
    let mut packed_bufs = (Vec::new(), Vec::new());
    let blocks = dims.tk.div_ceil(KB);
    let (kt_len, v_len) = (dims.d_qk * KB, KB * dvp);
    // Checked: views with zero row strides may describe more keys than memory holds packed;
    // then (or when the buffers cannot grow) every item packs its own blocks instead.
    let n = dims.kv_heads.saturating_mul(blocks);
    let packed_lens = n.checked_mul(kt_len).zip(n.checked_mul(v_len));
    if let (true, Some((kt_total, v_total))) = (splits == 1 && q_blocks >= 3, packed_lens) {
        packed_bufs = PACKED.with(|p| std::mem::take(&mut *p.borrow_mut()));
        let (kt, vb) = &mut packed_bufs;
        if try_grow(kt, kt_total).is_err() || try_grow(vb, v_total).is_err() {
            // Keep what was there for later calls; this one packs per item.
            PACKED.with(|p| *p.borrow_mut() = std::mem::take(&mut packed_bufs));
        }
    }
    if !packed_bufs.0.is_empty() {
        let (kt, vb) = &mut packed_bufs;
        let pack = |(idx, (kt, vb)): (usize, (&mut [f32], &mut [f32]))| {
            let (g, j0) = (idx / blocks, (idx % blocks) * KB);
            if j0 + KB <= k_lo {
                return; // before every window: never read
            }
            M::pack_block(k, v, g, j0, KB.min(dims.tk - j0), dvp, kt, vb);
        };
        let (kt, vb) = (&mut kt[..n * kt_len], &mut vb[..n * v_len]);
        if parallel {
            kt.par_chunks_mut(kt_len)
                .zip(vb.par_chunks_mut(v_len))
                .enumerate()
                .for_each(pack);
        } else {
            kt.chunks_mut(kt_len)
                .zip(vb.chunks_mut(v_len))
                .enumerate()
                .for_each(pack);
        }
    }
    let ctx = Ctx {
        q,
        k,
        v,
        mask,
        dims: *dims,
        group,
        dvp,
        packed: (!packed_bufs.0.is_empty()).then(|| Packed {
            kt: &packed_bufs.0,
            v: &packed_bufs.1,
            blocks,
        }),
    };
    let item = |idx: usize| -> Item {
        let split = idx % splits;
        let rest = idx / splits;
        let (g, qblk) = (rest % dims.kv_heads, rest / dims.kv_heads);
        let i0 = qblk * qb;
        let per = (dims.tk - k_lo).div_ceil(splits);
        Item {
            g,
            i0,
            nq: qb.min(dims.tq - i0),
            j0: (k_lo + split * per).min(dims.tk),
            j1: (k_lo + (split + 1) * per).min(dims.tk),
        }
    };
    let n_items = base_items * splits;
    let optr = SharedOut(out.as_mut_ptr());

    if splits == 1 {
        let body = |idx: usize| {
            SCRATCH.with(|sc| {
                let mut sc = sc.borrow_mut();
                let it = item(idx);
                M::process(&ctx, it, &mut sc);
                // SAFETY: `out` is tq·heads·d_v long (validated) and outlives this call; the
                // item writes only its own rows.
                unsafe { finalize_item(&ctx, it, &sc, optr) };
            })
        };
        if parallel {
            // Items in reverse: in causal attention the last query blocks are the longest,
            // so starting them first balances the threads.
            (0..n_items).into_par_iter().rev().for_each(body);
        } else {
            (0..n_items).for_each(body);
        }
        if !packed_bufs.0.is_empty() {
            PACKED.with(|p| *p.borrow_mut() = packed_bufs);
        }
        return;
    }

    // Split keys: each item leaves (m, l, o[d_v]) per row in `partials`, merged afterwards.
    let rows_per_item = group * qb;
    let stride = ctx.dims.d_v + 2;
    let item_len = rows_per_item * stride;
    let mut partials = PARTIALS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if partials.len() < n_items * item_len {
        partials.resize(n_items * item_len, 0.0);
    }
    partials[..n_items * item_len]
        .par_chunks_mut(item_len)
        .enumerate()
        .for_each(|(idx, dst)| {
            SCRATCH.with(|sc| {
                let mut sc = sc.borrow_mut();
                let it = item(idx);
                M::process(&ctx, it, &mut sc);
                let rows = group * it.nq;
                for r in 0..rows {
                    let d = &mut dst[r * stride..(r + 1) * stride];
                    d[0] = sc.m[r];
                    d[1] = sc.l[r];
                    d[2..].copy_from_slice(&sc.o[r * ctx.dvp..r * ctx.dvp + ctx.dims.d_v]);
                }
            })
        });
    // Merge the splits of every (KV head, query block), row by row.
    for base in 0..base_items {
        let it = item(base * splits);
        let rows = group * it.nq;
        for r in 0..rows {
            let (hi, qi) = (r / it.nq, r % it.nq);
            let h = it.g * group + hi;
            let i = it.i0 + qi;
            let o = &mut out[(i * dims.heads + h) * dims.d_v..][..dims.d_v];
            let part =
                |s: usize| &partials[(base * splits + s) * item_len + r * stride..][..stride];
            let m = (0..splits)
                .map(|s| part(s)[0])
                .fold(f32::NEG_INFINITY, f32::max);
            o.fill(0.0);
            if m == f32::NEG_INFINITY {
                continue;
            }
            let mut l = 0.0f32;
            for s in 0..splits {
                let p = part(s);
                if p[0] == f32::NEG_INFINITY {
                    continue;
                }
                let w = (p[0] - m).exp();
                l += p[1] * w;
                for (x, y) in o.iter_mut().zip(&p[2..]) {
                    *x += w * y;
                }
            }
            let inv = 1.0 / l;
            for x in o.iter_mut() {
                *x *= inv;
            }
        }
    }
    PARTIALS.with(|p| *p.borrow_mut() = partials);
}

/// Writes an item's normalised rows to `out`; rows that saw no visible key become zeros.
///
/// # Safety
/// `out` must point to `tq·heads·d_v` writable floats, and no other thread may write the
/// rows of this item's (KV head, query block) at the same time.
unsafe fn finalize_item(ctx: &Ctx<'_>, it: Item, sc: &Scratch, out: SharedOut) {
    let Dims { heads, d_v, .. } = ctx.dims;
    for r in 0..ctx.group * it.nq {
        let (hi, qi) = (r / it.nq, r % it.nq);
        let h = it.g * ctx.group + hi;
        let i = it.i0 + qi;
        // SAFETY: (i, h) is inside the output (i < tq, h < heads) and owned by this item.
        let o =
            unsafe { std::slice::from_raw_parts_mut(out.get().add((i * heads + h) * d_v), d_v) };
        let l = sc.l[r];
        let src = &sc.o[r * ctx.dvp..r * ctx.dvp + d_v];
        if l > 0.0 {
            let inv = 1.0 / l;
            for (x, y) in o.iter_mut().zip(src) {
                *x = y * inv;
            }
        } else {
            o.fill(0.0);
        }
    }
}

/// The item loop, generic over the micro-kernels; the AVX2 form runs it inside a
/// `#[target_feature]` function so that everything inlines with the right instructions.
trait ProcessItem {
    fn process(ctx: &Ctx<'_>, it: Item, sc: &mut Scratch);
    /// Packs Kᵀ and V of the key block starting at `j0` (`nk` keys) of KV head `g`.
    #[allow(clippy::too_many_arguments)]
    fn pack_block(
        k: &KvView<'_>,
        v: &KvView<'_>,
        g: usize,
        j0: usize,
        nk: usize,
        dvp: usize,
        kt: &mut [f32],
        vb: &mut [f32],
    );
}

impl ProcessItem for Scalar {
    fn process(ctx: &Ctx<'_>, it: Item, sc: &mut Scratch) {
        process_item::<Scalar>(ctx, it, sc)
    }

    fn pack_block(
        k: &KvView<'_>,
        v: &KvView<'_>,
        g: usize,
        j0: usize,
        nk: usize,
        dvp: usize,
        kt: &mut [f32],
        vb: &mut [f32],
    ) {
        Scalar::pack_kt(k, g, j0, nk, kt);
        Scalar::pack_v(v, g, j0, nk, dvp, vb);
    }
}

#[inline(always)]
fn process_item<M: Micro>(ctx: &Ctx<'_>, it: Item, sc: &mut Scratch) {
    let Dims {
        tk, d_qk: d, scale, ..
    } = ctx.dims;
    let rows = ctx.group * it.nq;
    let dvp = ctx.dvp;
    sc.prepare(rows, d, dvp);
    let q = ctx.q;
    for r in 0..rows {
        let (hi, qi) = (r / it.nq, r % it.nq);
        let h = it.g * ctx.group + hi;
        let src = &q.data[(it.i0 + qi) * q.row_stride + h * q.head_stride..][..d];
        for (dst, x) in sc.q[r * d..(r + 1) * d].iter_mut().zip(src) {
            *dst = x * scale;
        }
    }
    sc.m[..rows].fill(f32::NEG_INFINITY);
    sc.l[..rows].fill(0.0);
    sc.o[..rows * dvp].fill(0.0);
    sc.corr[..rows].fill(1.0);

    // Keys past the last query's causal horizon, or before the first query's sliding
    // window, are never visited.
    let causal = ctx.mask.causal_offset;
    let j_end = match causal {
        Some(p0) => it.j1.min(p0 + it.i0 + it.nq),
        None => it.j1,
    };
    let window_start = ctx.mask.window_start(it.i0);
    let softcap = ctx.mask.softcap;
    // Few rows (decode): packing a block would cost as much as using it, so K and V are read
    // where they lie.
    if ctx.packed.is_none() && rows <= IN_PLACE_MAX_ROWS {
        let mut jb = it.j0.max(window_start);
        while jb < j_end {
            let nk = KB.min(j_end - jb);
            M::scores_in_place(&sc.q, ctx.k, ctx.v, it.g, jb, nk, &mut sc.s, rows, d);
            if let Some(cap) = softcap {
                M::softcap(&mut sc.s[..rows * KB], cap);
            }
            apply_masks(ctx, it, jb, nk, tk, &mut sc.s[..rows * KB]);
            M::softmax_update(&mut sc.s, &mut sc.m, &mut sc.l, &mut sc.corr, rows);
            M::pv_in_place(&sc.s, ctx.v, it.g, jb, nk, &mut sc.o, &sc.corr, rows, dvp);
            jb += nk;
        }
        return;
    }
    // Packed blocks start at multiples of KB (and an unsplit item's keys start at the first
    // window's start, so rounding down only adds keys the window mask blocks).
    let mut jb = match ctx.packed {
        Some(_) => it.j0.max(window_start) / KB * KB,
        None => it.j0.max(window_start),
    };
    while jb < j_end {
        let nk = KB.min(j_end - jb);
        let (kt, vb): (&[f32], &[f32]) = match &ctx.packed {
            // Packed blocks start at multiples of KB and may hold keys past `nk`; those
            // columns are masked to −∞ below, so their P is exactly 0.
            Some(p) => {
                let b = it.g * p.blocks + jb / KB;
                (
                    &p.kt[b * d * KB..][..d * KB],
                    &p.v[b * KB * dvp..][..KB * dvp],
                )
            }
            None => {
                M::pack_kt(ctx.k, it.g, jb, nk, &mut sc.kt);
                M::pack_v(ctx.v, it.g, jb, nk, dvp, &mut sc.v);
                (&sc.kt, &sc.v)
            }
        };
        M::scores(&sc.q, kt, &mut sc.s, rows, d);
        if let Some(cap) = softcap {
            M::softcap(&mut sc.s[..rows * KB], cap);
        }
        apply_masks(ctx, it, jb, nk, tk, &mut sc.s[..rows * KB]);
        M::softmax_update(&mut sc.s, &mut sc.m, &mut sc.l, &mut sc.corr, rows);
        M::pv(&sc.s, vb, &mut sc.o, &sc.corr, rows, dvp);
        jb += nk;
    }
}

/// Sets blocked scores of one block to −∞: padding columns past `nk`, future keys, keys before
/// a query's sliding window, padded keys and pairs the dense mask blocks. Blocks that need
/// none of it return at once.
fn apply_masks(ctx: &Ctx<'_>, it: Item, jb: usize, nk: usize, tk: usize, s: &mut [f32]) {
    let mask = ctx.mask;
    let causal_cut = mask
        .causal_offset
        .is_some_and(|p0| jb + nk > p0 + it.i0 + 1);
    // The last query of the item has the latest window start.
    let window_cut = jb < mask.window_start(it.i0 + it.nq - 1);
    let pads = mask
        .key_keep
        .is_some_and(|keep| keep[jb..jb + nk].iter().any(|&k| !k));
    if nk == KB && !causal_cut && !window_cut && !pads && mask.dense_keep.is_none() {
        return;
    }
    for (r, row) in s.chunks_exact_mut(KB).enumerate() {
        let i = it.i0 + r % it.nq;
        row[nk..].fill(f32::NEG_INFINITY);
        if let Some(p0) = mask.causal_offset {
            // Keys j ≤ p0 + i are visible; the first blocked column in this block:
            let first_blocked = (p0 + i + 1).saturating_sub(jb).min(nk);
            row[first_blocked..nk].fill(f32::NEG_INFINITY);
        }
        if window_cut {
            // Keys j ≥ window_start(i) are visible; the first visible column in this block:
            let first_visible = mask.window_start(i).saturating_sub(jb).min(nk);
            row[..first_visible].fill(f32::NEG_INFINITY);
        }
        if pads {
            let keep = &mask.key_keep.expect("pads implies key_keep")[jb..jb + nk];
            for (x, &k) in row.iter_mut().zip(keep) {
                if !k {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        if let Some(dense) = mask.dense_keep {
            let keep = &dense[i * tk + jb..i * tk + jb + nk];
            for (x, &k) in row.iter_mut().zip(keep) {
                if !k {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
mod micro;
mod scratch;
