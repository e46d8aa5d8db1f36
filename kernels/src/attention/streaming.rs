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
use rayon::prelude::*;
use std::cell::RefCell;
use std::collections::TryReserveError;

/// Keys per block.
pub(super) const KB: usize = 64;
/// Rows (query head × query) a work item aims for: enough to amortise packing K and V.
const ROWS_TARGET: usize = 96;
/// Items with at most this many rows read K and V in place instead of packing them.
const IN_PLACE_MAX_ROWS: usize = 8;
/// Work items per thread a decode call aims for when it splits the keys.
const SPLIT_ITEMS_PER_THREAD: usize = 2;
/// Key splits are at least this many keys long.
const MIN_SPLIT_KEYS: usize = 4 * KB;
/// Below this many multiply-adds the call runs on the calling thread alone.
const PARALLEL_MIN_WORK: usize = 1 << 17;

/// Per-thread buffers, grown once and reused: the decode path allocates nothing after warm-up.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    kt: Vec<f32>,
    v: Vec<f32>,
    s: Vec<f32>,
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    corr: Vec<f32>,
}

impl Scratch {
    /// [`prepare`](Self::prepare) that fails instead of aborting when memory runs out; the
    /// products must not overflow (checked by [`ScratchSizes::new`]).
    fn try_prepare(
        &mut self,
        rows: usize,
        d: usize,
        dvp: usize,
    ) -> std::result::Result<(), TryReserveError> {
        try_grow(&mut self.q, rows * d)?;
        try_grow(&mut self.kt, d * KB)?;
        try_grow(&mut self.v, KB * dvp)?;
        try_grow(&mut self.s, rows * KB)?;
        try_grow(&mut self.o, rows * dvp)?;
        try_grow(&mut self.m, rows)?;
        try_grow(&mut self.l, rows)?;
        try_grow(&mut self.corr, rows)
    }

    fn prepare(&mut self, rows: usize, d: usize, dvp: usize) {
        fn grow(v: &mut Vec<f32>, n: usize) {
            if v.len() < n {
                v.resize(n, 0.0);
            }
        }
        grow(&mut self.q, rows * d);
        grow(&mut self.kt, d * KB);
        grow(&mut self.v, KB * dvp);
        grow(&mut self.s, rows * KB);
        grow(&mut self.o, rows * dvp);
        grow(&mut self.m, rows);
        grow(&mut self.l, rows);
        grow(&mut self.corr, rows);
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static PACKED: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Kᵀ and V of every key block, packed once per call when several query blocks would
/// otherwise each pack them again: block `b` of KV head `g` is entry `g·blocks + b`.
struct Packed<'a> {
    kt: &'a [f32],
    v: &'a [f32],
    blocks: usize,
}

/// The most ranges a call splits its keys into, whatever the thread count: it bounds the
/// per-thread `PARTIALS` buffer (which holds every split of a call), so that memory does not
/// grow with the pool. Above every split count of pools up to 16 threads (at most
/// `2 · split_guess ≤ 4 · threads`), so those split exactly as without the cap.
const MAX_KEY_SPLITS: usize = 64;

/// Floats of one thread's buffers for calls with `heads` query heads over `kv_heads`, sized
/// for the largest work item such a call makes (any query count) and for split decode
/// calls on `threads` threads; `None` when a size overflows `usize`.
#[derive(Clone, Copy, Debug)]
pub(super) struct ScratchSizes {
    rows: usize,
    d: usize,
    dvp: usize,
    partials: usize,
}

impl ScratchSizes {
    /// The sizes, or `None` on overflow. `kv_heads` must be non-zero.
    pub(super) fn new(
        heads: usize,
        kv_heads: usize,
        d_qk: usize,
        d_v: usize,
        threads: usize,
    ) -> Option<ScratchSizes> {
        let group = heads / kv_heads.max(1);
        // `run_with` makes items of `group · qb` rows, `qb ≤ max(ROWS_TARGET / group, 1)`.
        let rows = group.checked_mul((ROWS_TARGET / group.max(1)).max(1))?;
        let dvp = d_v.checked_next_multiple_of(8)?;
        // Split decode: `key_splits` never goes past its bound, whatever the key count.
        let items = kv_heads.checked_mul(max_key_splits(kv_heads, threads))?;
        let partials = items.checked_mul(group)?.checked_mul(d_v.checked_add(2)?)?;
        // Every product `Scratch::prepare` forms must fit too.
        let _ = rows
            .checked_mul(d_qk)?
            .checked_add(rows.checked_mul(dvp)?)?;
        let _ = KB.checked_mul(d_qk)?.checked_add(KB.checked_mul(dvp)?)?;
        Some(ScratchSizes {
            rows,
            d: d_qk,
            dvp,
            partials,
        })
    }
}

/// Sizes this thread's buffers to `sizes`, so that decode calls of that shape allocate
/// nothing later. See [`super::reserve_scratch`]. Errors, growing nothing further, when an
/// allocation fails.
pub(super) fn reserve(sizes: ScratchSizes) -> std::result::Result<(), TryReserveError> {
    let ScratchSizes {
        rows,
        d,
        dvp,
        partials,
    } = sizes;
    SCRATCH.with(|sc| sc.borrow_mut().try_prepare(rows, d, dvp))?;
    PARTIALS.with(|p| try_grow(&mut p.borrow_mut(), partials))
}

/// Grows `v` to at least `n` zeros, failing instead of aborting when memory runs out.
fn try_grow(v: &mut Vec<f32>, n: usize) -> std::result::Result<(), TryReserveError> {
    if v.len() < n {
        v.try_reserve_exact(n - v.len())?;
        v.resize(n, 0.0);
    }
    Ok(())
}

/// How many ranges a decode call splits its keys into, given `base` (KV head, query block)
/// items: about [`SPLIT_ITEMS_PER_THREAD`] items per thread, and a multiple of the thread
/// count when the key count allows it, never more than twice the first guess.
///
/// Cache-cold decode calls, 3 KV heads on 2 threads, alternating in one process: at
/// tk = 2048, 6 items took 61–63 µs, 12 items 67–70 and 9 items (one thread idle for the
/// last) 70–73; at tk = 8192, 6 and 12 items tied and 24 were 10% slower.
fn key_splits(base: usize, tk: usize, threads: usize) -> usize {
    let most = (tk / MIN_SPLIT_KEYS).clamp(1, MAX_KEY_SPLITS);
    let want = split_guess(base, threads).min(most);
    let balanced = |s: &usize| (base * s).is_multiple_of(threads.max(1));
    (want..=most.min(2 * want))
        .find(balanced)
        .or_else(|| (1..want).rev().find(balanced))
        .unwrap_or(want)
}

/// [`key_splits`]' first guess: enough ranges for about [`SPLIT_ITEMS_PER_THREAD`] items
/// per thread.
fn split_guess(base: usize, threads: usize) -> usize {
    SPLIT_ITEMS_PER_THREAD
        .saturating_mul(threads)
        .div_ceil(base.max(1))
}

/// The most ranges [`key_splits`] returns for `base` items: twice its first guess, and
/// never more than [`MAX_KEY_SPLITS`].
fn max_key_splits(base: usize, threads: usize) -> usize {
    split_guess(base, threads)
        .saturating_mul(2)
        .min(MAX_KEY_SPLITS)
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

/// The four operations whose SIMD and scalar forms must agree; everything else is shared.
trait Micro {
    /// `kt[p·KB + j] = K[j0 + j, g, p]` for `j < nk`, zero for `nk ≤ j < KB`.
    fn pack_kt(k: &KvView<'_>, g: usize, j0: usize, nk: usize, kt: &mut [f32]);
    /// `v[j·dvp + c] = V[j0 + j, g, c]` for `j < nk, c < d_v`, zero elsewhere up to `KB × dvp`.
    fn pack_v(v: &KvView<'_>, g: usize, j0: usize, nk: usize, dvp: usize, out: &mut [f32]);
    /// `s[r·KB + j] = Σ_p q[r·d + p] · kt[p·KB + j]` for `r < rows`.
    fn scores(q: &[f32], kt: &[f32], s: &mut [f32], rows: usize, d: usize);
    /// Turns score rows into probabilities relative to the updated running max; updates
    /// `m`, `l` and sets `corr[r] = exp(m_old − m_new)` (1 when the row has seen no key yet).
    fn softmax_update(s: &mut [f32], m: &mut [f32], l: &mut [f32], corr: &mut [f32], rows: usize);
    /// `o[r·dvp + c] = o[r·dvp + c]·corr[r] + Σ_j p[r·KB + j] · v[j·dvp + c]`.
    fn pv(p: &[f32], v: &[f32], o: &mut [f32], corr: &[f32], rows: usize, dvp: usize);
    /// `s[r·KB + j] = Σ_p q[r·d + p] · K[j0 + j, g, p]` for `r < rows, j < nk`, read in place
    /// (columns `nk..KB` are left for the mask to fill). The same keys' rows of `v` may be
    /// pulled into cache meanwhile, for the `P·V` that follows.
    #[allow(clippy::too_many_arguments)]
    fn scores_in_place(
        q: &[f32],
        k: &KvView<'_>,
        v: &KvView<'_>,
        g: usize,
        j0: usize,
        nk: usize,
        s: &mut [f32],
        rows: usize,
        d: usize,
    );
    /// `o[r·dvp + c] = o[r·dvp + c]·corr[r] + Σ_{j<nk} p[r·KB + j] · V[j0 + j, g, c]` for
    /// `c < d_v`, read in place.
    #[allow(clippy::too_many_arguments)]
    fn pv_in_place(
        p: &[f32],
        v: &KvView<'_>,
        g: usize,
        j0: usize,
        nk: usize,
        o: &mut [f32],
        corr: &[f32],
        rows: usize,
        dvp: usize,
    );
}

/// Plain loops: the reference every SIMD micro-kernel is tested against, and the fallback.
struct Scalar;

impl Micro for Scalar {
    fn pack_kt(k: &KvView<'_>, g: usize, j0: usize, nk: usize, kt: &mut [f32]) {
        for p in 0..k.dim {
            for j in 0..KB {
                kt[p * KB + j] = if j < nk { k.get(j0 + j, g, p) } else { 0.0 };
            }
        }
    }

    fn pack_v(v: &KvView<'_>, g: usize, j0: usize, nk: usize, dvp: usize, out: &mut [f32]) {
        for j in 0..KB {
            for c in 0..dvp {
                out[j * dvp + c] = if j < nk && c < v.dim {
                    v.get(j0 + j, g, c)
                } else {
                    0.0
                };
            }
        }
    }

    fn scores(q: &[f32], kt: &[f32], s: &mut [f32], rows: usize, d: usize) {
        for r in 0..rows {
            for j in 0..KB {
                let mut acc = 0.0f32;
                for p in 0..d {
                    acc += q[r * d + p] * kt[p * KB + j];
                }
                s[r * KB + j] = acc;
            }
        }
    }

    fn softmax_update(s: &mut [f32], m: &mut [f32], l: &mut [f32], corr: &mut [f32], rows: usize) {
        for r in 0..rows {
            let row = &mut s[r * KB..(r + 1) * KB];
            let block_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m_new = m[r].max(block_max);
            if m_new == f32::NEG_INFINITY {
                row.fill(0.0);
                corr[r] = 1.0;
                continue;
            }
            let mut sum = 0.0f32;
            for x in row.iter_mut() {
                *x = (*x - m_new).exp();
                sum += *x;
            }
            corr[r] = (m[r] - m_new).exp();
            l[r] = l[r] * corr[r] + sum;
            m[r] = m_new;
        }
    }

    fn pv(p: &[f32], v: &[f32], o: &mut [f32], corr: &[f32], rows: usize, dvp: usize) {
        for r in 0..rows {
            let orow = &mut o[r * dvp..(r + 1) * dvp];
            for x in orow.iter_mut() {
                *x *= corr[r];
            }
            for j in 0..KB {
                let pj = p[r * KB + j];
                for (c, x) in orow.iter_mut().enumerate() {
                    *x += pj * v[j * dvp + c];
                }
            }
        }
    }

    fn scores_in_place(
        q: &[f32],
        k: &KvView<'_>,
        _v: &KvView<'_>,
        g: usize,
        j0: usize,
        nk: usize,
        s: &mut [f32],
        rows: usize,
        d: usize,
    ) {
        for r in 0..rows {
            for j in 0..nk {
                let mut acc = 0.0f32;
                for p in 0..d {
                    acc += q[r * d + p] * k.get(j0 + j, g, p);
                }
                s[r * KB + j] = acc;
            }
        }
    }

    fn pv_in_place(
        p: &[f32],
        v: &KvView<'_>,
        g: usize,
        j0: usize,
        nk: usize,
        o: &mut [f32],
        corr: &[f32],
        rows: usize,
        dvp: usize,
    ) {
        for r in 0..rows {
            let orow = &mut o[r * dvp..r * dvp + v.dim];
            for x in orow.iter_mut() {
                *x *= corr[r];
            }
            for j in 0..nk {
                let pj = p[r * KB + j];
                for (c, x) in orow.iter_mut().enumerate() {
                    *x += pj * v.get(j0 + j, g, c);
                }
            }
        }
    }
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
    // Saturating: with zero-stride views tq·tk need not fit, and this only picks the split.
    let work = dims
        .tq
        .saturating_mul(dims.tk)
        .saturating_mul(dims.heads)
        .saturating_mul(dims.d_qk.saturating_add(dims.d_v));
    let parallel = threads > 1 && work >= PARALLEL_MIN_WORK;
    // Too few items to keep every thread busy (decode): split the keys as well.
    let splits = if parallel && base_items < SPLIT_ITEMS_PER_THREAD * threads {
        key_splits(base_items, dims.tk, threads)
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
        let per = dims.tk.div_ceil(splits);
        Item {
            g,
            i0,
            nq: qb.min(dims.tq - i0),
            j0: (split * per).min(dims.tk),
            j1: ((split + 1) * per).min(dims.tk),
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

    // Keys past the last query's causal horizon are never visited.
    let causal = ctx.mask.causal_offset;
    let j_end = match causal {
        Some(p0) => it.j1.min(p0 + it.i0 + it.nq),
        None => it.j1,
    };
    // Few rows (decode): packing a block would cost as much as using it, so K and V are read
    // where they lie.
    if ctx.packed.is_none() && rows <= IN_PLACE_MAX_ROWS {
        let mut jb = it.j0;
        while jb < j_end {
            let nk = KB.min(j_end - jb);
            M::scores_in_place(&sc.q, ctx.k, ctx.v, it.g, jb, nk, &mut sc.s, rows, d);
            apply_masks(ctx, it, jb, nk, tk, &mut sc.s[..rows * KB]);
            M::softmax_update(&mut sc.s, &mut sc.m, &mut sc.l, &mut sc.corr, rows);
            M::pv_in_place(&sc.s, ctx.v, it.g, jb, nk, &mut sc.o, &sc.corr, rows, dvp);
            jb += nk;
        }
        return;
    }
    let mut jb = it.j0;
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
        apply_masks(ctx, it, jb, nk, tk, &mut sc.s[..rows * KB]);
        M::softmax_update(&mut sc.s, &mut sc.m, &mut sc.l, &mut sc.corr, rows);
        M::pv(&sc.s, vb, &mut sc.o, &sc.corr, rows, dvp);
        jb += nk;
    }
}

/// Sets blocked scores of one block to −∞: padding columns past `nk`, future keys, padded keys
/// and pairs the dense mask blocks. Blocks that need none of it return at once.
fn apply_masks(ctx: &Ctx<'_>, it: Item, jb: usize, nk: usize, tk: usize, s: &mut [f32]) {
    let mask = ctx.mask;
    let causal_cut = mask
        .causal_offset
        .is_some_and(|p0| jb + nk > p0 + it.i0 + 1);
    let pads = mask
        .key_keep
        .is_some_and(|keep| keep[jb..jb + nk].iter().any(|&k| !k));
    if nk == KB && !causal_cut && !pads && mask.dense_keep.is_none() {
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
mod avx2 {
    //! AVX2 + FMA + F16C micro-kernels. Packed items (prefill) use 6×16 register tiles for
    //! Q·Kᵀ and P·V and an 8×8 transpose to pack Kᵀ; in-place items (decode, ≤ 8 rows) score
    //! 3 rows against 3 keys at a time and accumulate P·V in tiles of R rows × 8·C columns
    //! (3×24 for SmolLM2's three query heads per KV head), reading the f16 or f32 cache
    //! directly. The softmax uses a vector `exp`.
    use super::{process_item, Ctx, Item, Micro, ProcessItem, Scratch, KB};
    use crate::attention::{KvData, KvView};
    use crate::simd::avx2::{exp_nonpositive, hmax, hsum, Lane};
    use core::arch::x86_64::*;

    pub(super) struct Avx2;

    impl ProcessItem for Avx2 {
        fn process(ctx: &Ctx<'_>, it: Item, sc: &mut Scratch) {
            // SAFETY: `Avx2` is selected only after `has_avx2_fma_f16c()` returned true.
            unsafe { process_avx2(ctx, it, sc) }
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
            // SAFETY: as in `process`.
            unsafe { pack_block_avx2(k, v, g, j0, nk, dvp, kt, vb) }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn process_avx2(ctx: &Ctx<'_>, it: Item, sc: &mut Scratch) {
        process_item::<Avx2>(ctx, it, sc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pack_block_avx2(
        k: &KvView<'_>,
        v: &KvView<'_>,
        g: usize,
        j0: usize,
        nk: usize,
        dvp: usize,
        kt: &mut [f32],
        vb: &mut [f32],
    ) {
        Avx2::pack_kt(k, g, j0, nk, kt);
        Avx2::pack_v(v, g, j0, nk, dvp, vb);
    }

    /// 8×8 transpose of f32 lanes.
    #[inline(always)]
    unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }

    #[inline(always)]
    unsafe fn pack_kt_typed<T: Lane>(
        data: &[T],
        k: &KvView<'_>,
        g: usize,
        j0: usize,
        nk: usize,
        kt: &mut [f32],
    ) {
        let d = k.dim;
        debug_assert!(kt.len() >= d * KB);
        let d8 = d / 8 * 8;
        let nk8 = nk / 8 * 8;
        let ktp = kt.as_mut_ptr();
        let mut j = 0;
        while j < nk8 {
            let base: [usize; 8] = core::array::from_fn(|t| k.offset(j0 + j + t, g));
            let mut p = 0;
            while p < d8 {
                // SAFETY: rows j0+j..j0+j+8 < tk and p+8 ≤ d, inside the validated view.
                let rows: [__m256; 8] =
                    core::array::from_fn(|t| T::load8(data.as_ptr().add(base[t] + p)));
                let cols = transpose8(rows);
                for (t, c) in cols.iter().enumerate() {
                    // SAFETY: (p+t)·KB + j + 8 ≤ d·KB.
                    _mm256_storeu_ps(ktp.add((p + t) * KB + j), *c);
                }
                p += 8;
            }
            for p in d8..d {
                for t in 0..8 {
                    kt[p * KB + j + t] = data[base[t] + p].to_f32();
                }
            }
            j += 8;
        }
        for j in nk8..nk {
            let base = k.offset(j0 + j, g);
            for p in 0..d {
                kt[p * KB + j] = data[base + p].to_f32();
            }
        }
        if nk < KB {
            for p in 0..d {
                kt[p * KB + nk..(p + 1) * KB].fill(0.0);
            }
        }
    }

    #[inline(always)]
    unsafe fn pack_v_typed<T: Lane>(
        data: &[T],
        v: &KvView<'_>,
        g: usize,
        j0: usize,
        nk: usize,
        dvp: usize,
        out: &mut [f32],
    ) {
        let dv = v.dim;
        let dv8 = dv / 8 * 8;
        for j in 0..nk {
            let src = &data[v.offset(j0 + j, g)..][..dv];
            let dst = &mut out[j * dvp..(j + 1) * dvp];
            let mut c = 0;
            while c < dv8 {
                // SAFETY: c + 8 ≤ dv ≤ dvp for both rows.
                _mm256_storeu_ps(dst.as_mut_ptr().add(c), T::load8(src.as_ptr().add(c)));
                c += 8;
            }
            for c in dv8..dv {
                dst[c] = src[c].to_f32();
            }
            dst[dv..].fill(0.0);
        }
        out[nk * dvp..KB * dvp].fill(0.0);
    }

    /// Scores for rows `r0..r0+R`, all KB columns.
    #[inline(always)]
    unsafe fn scores_tile<const R: usize>(
        q: &[f32],
        kt: &[f32],
        s: &mut [f32],
        r0: usize,
        d: usize,
    ) {
        let qp = q.as_ptr().add(r0 * d);
        let kp = kt.as_ptr();
        let sp = s.as_mut_ptr().add(r0 * KB);
        let mut c = 0;
        while c < KB {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for p in 0..d {
                // SAFETY: p < d and c + 16 ≤ KB, so both loads are inside kt (d·KB).
                let k0 = _mm256_loadu_ps(kp.add(p * KB + c));
                let k1 = _mm256_loadu_ps(kp.add(p * KB + c + 8));
                for (r, a) in acc.iter_mut().enumerate() {
                    let qv = _mm256_broadcast_ss(&*qp.add(r * d + p));
                    a[0] = _mm256_fmadd_ps(qv, k0, a[0]);
                    a[1] = _mm256_fmadd_ps(qv, k1, a[1]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(sp.add(r * KB + c), a[0]);
                _mm256_storeu_ps(sp.add(r * KB + c + 8), a[1]);
            }
            c += 16;
        }
    }

    /// P·V for rows `r0..r0+R`, `V` columns `c..c+8·C`: `V` row `j < nk` starts at
    /// `v + j·v_stride` (packed f32 blocks, or the cache itself). Keys alternate between `U`
    /// sets of accumulators, summed at the end: each accumulator takes one FMA per key, so
    /// with few rows `U = 2` doubles the independent chains that hide the FMA latency.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pv_tile<T: Lane, const R: usize, const C: usize, const U: usize>(
        p: &[f32],
        v: *const T,
        v_stride: usize,
        nk: usize,
        o: &mut [f32],
        corr: &[f32],
        r0: usize,
        c: usize,
        dvp: usize,
    ) {
        let op = o.as_mut_ptr();
        let mut acc = [[[_mm256_setzero_ps(); C]; R]; U];
        for (r, a) in acc[0].iter_mut().enumerate() {
            let cr = _mm256_set1_ps(corr[r0 + r]);
            for (x, av) in a.iter_mut().enumerate() {
                // SAFETY: row r0+r < rows and c + 8·C ≤ dvp: inside o (rows·dvp).
                *av = _mm256_mul_ps(_mm256_loadu_ps(op.add((r0 + r) * dvp + c + 8 * x)), cr);
            }
        }
        let pp = p.as_ptr().add(r0 * KB);
        let mut j = 0;
        while j + U <= nk {
            for (u, a) in acc.iter_mut().enumerate() {
                pv_key(a, pp, v.add((j + u) * v_stride + c), j + u);
            }
            j += U;
        }
        while j < nk {
            pv_key(&mut acc[0], pp, v.add(j * v_stride + c), j);
            j += 1;
        }
        for (r, a) in acc[0].iter().enumerate() {
            for (x, av) in a.iter().enumerate() {
                let mut t = *av;
                for other in &acc[1..] {
                    t = _mm256_add_ps(t, other[r][x]);
                }
                _mm256_storeu_ps(op.add((r0 + r) * dvp + c + 8 * x), t);
            }
        }
    }

    /// One key of [`pv_tile`]: `a[r] += p[r·KB + j] · vrow[..8·C]` for every row `r`.
    #[inline(always)]
    unsafe fn pv_key<T: Lane, const R: usize, const C: usize>(
        a: &mut [[__m256; C]; R],
        p: *const f32,
        vrow: *const T,
        j: usize,
    ) {
        // SAFETY: the caller guarantees 8·C readable elements at `vrow` and R rows of KB
        // probabilities at `p`.
        let vv: [__m256; C] = core::array::from_fn(|x| T::load8(vrow.add(8 * x)));
        for (r, ar) in a.iter_mut().enumerate() {
            let pb = _mm256_broadcast_ss(&*p.add(r * KB + j));
            for (acc, vx) in ar.iter_mut().zip(&vv) {
                *acc = _mm256_fmadd_ps(pb, *vx, *acc);
            }
        }
    }

    /// Where the V rows of the keys being scored lie: decode items prefetch them while the
    /// scores are computed, so that memory keeps streaming through the scores and the `P·V`
    /// sweeps that follow find V in cache. (Before, the sweeps met V in memory one row per key
    /// after the scores had left the memory idle.) Cache-cold decode calls,
    /// `attention_time 1 TK f16 31 60 head` with both forms alternating call by call in one
    /// process: at tk = 2048, medians of 98–122 µs against 129–147 in seven runs of eight
    /// (the eighth, on a quiet host, tied at 83 against 80), and 10–20% faster at tk = 512
    /// and 8192 in most runs. Prefetching the next block's K as well gained nothing
    /// measurable.
    ///
    /// Key `j` of the block starts `j · stride` bytes after `base` and spans `bytes`.
    #[derive(Clone, Copy)]
    struct Ahead {
        base: *const u8,
        stride: usize,
        bytes: usize,
    }

    impl Ahead {
        /// The rows of KV head `g` of `v` from key `j0` on.
        fn rows_of(v: &KvView<'_>, j0: usize, g: usize) -> Ahead {
            let (ptr, size) = match v.data {
                KvData::F32(x) => (x.as_ptr().cast::<u8>(), 4),
                KvData::F16(x) => (x.as_ptr().cast::<u8>(), 2),
            };
            Ahead {
                base: ptr.wrapping_add(v.offset(j0, g) * size),
                stride: v.row_stride * size,
                bytes: v.dim * size,
            }
        }

        /// Asks for every cache line of key `j`'s row. Prefetches never fault, and the
        /// addresses are formed with wrapping arithmetic, so no bound is needed for safety.
        #[inline(always)]
        fn fetch(self, j: usize) {
            let row = self.base.wrapping_add(j * self.stride);
            let mut b = 0;
            while b < self.bytes {
                // SAFETY: a prefetch reads nothing architecturally and cannot fault.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(b).cast::<i8>()) };
                b += 64;
            }
        }
    }

    /// The sums of four vectors' lanes, in order.
    #[inline(always)]
    unsafe fn hsum4(a: [__m256; 4]) -> __m128 {
        let t0 = _mm256_hadd_ps(a[0], a[1]);
        let t1 = _mm256_hadd_ps(a[2], a[3]);
        let t = _mm256_hadd_ps(t0, t1);
        _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t))
    }

    /// Scores of rows `r0..r0+R` against `nk` keys read in place: key `j` starts at
    /// `k + j·k_stride`. `N` keys at a time share each widened K vector and each load of Q
    /// (`R·N` accumulators, `R` Q vectors and one K vector fit the 16 registers for R = N = 3);
    /// each row's `N` dot products are reduced across lanes together and stored as one vector.
    /// Elements past the last multiple of 8 of `d` are added in a scalar pass at the end.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores_in_place_rows<T: Lane, const R: usize, const N: usize>(
        q: &[f32],
        k: *const T,
        k_stride: usize,
        nk: usize,
        s: &mut [f32],
        d: usize,
        r0: usize,
        ahead: Option<Ahead>,
    ) {
        debug_assert!(N <= 4);
        let d8 = d / 8 * 8;
        let qp = q.as_ptr().add(r0 * d);
        let sp = s.as_mut_ptr().add(r0 * KB);
        let mut j = 0;
        while j + N <= nk {
            if let Some(a) = ahead {
                for i in 0..N {
                    a.fetch(j + i);
                }
            }
            // acc[i][r]: key j + i against row r.
            let mut acc = [[_mm256_setzero_ps(); R]; N];
            let mut p = 0;
            while p < d8 {
                // SAFETY: keys j..j+N < nk and p + 8 ≤ d: inside the view and inside q.
                let qv: [__m256; R] = core::array::from_fn(|r| _mm256_loadu_ps(qp.add(r * d + p)));
                for (i, ai) in acc.iter_mut().enumerate() {
                    let kv = T::load8(k.add((j + i) * k_stride + p));
                    for (a, qr) in ai.iter_mut().zip(&qv) {
                        *a = _mm256_fmadd_ps(kv, *qr, *a);
                    }
                }
                p += 8;
            }
            // `r` picks the inner index of `acc[i][r]` across all keys i.
            #[allow(clippy::needless_range_loop)]
            for r in 0..R {
                let sums = hsum4(core::array::from_fn(|i| {
                    if i < N {
                        acc[i][r]
                    } else {
                        _mm256_setzero_ps()
                    }
                }));
                let dst = sp.add(r * KB + j);
                if j + 4 <= KB {
                    // Lanes past N land on columns the next keys or the mask overwrite.
                    // SAFETY: columns j..j+4 ≤ KB of row r0+r lie inside s.
                    _mm_storeu_ps(dst, sums);
                } else {
                    let mut t = [0.0f32; 4];
                    _mm_storeu_ps(t.as_mut_ptr(), sums);
                    for (i, x) in t[..N].iter().enumerate() {
                        *dst.add(i) = *x;
                    }
                }
            }
            j += N;
        }
        while j < nk {
            if let Some(a) = ahead {
                a.fetch(j);
            }
            for r in 0..R {
                let mut acc = _mm256_setzero_ps();
                let mut p = 0;
                while p < d8 {
                    let qv = _mm256_loadu_ps(qp.add(r * d + p));
                    acc = _mm256_fmadd_ps(T::load8(k.add(j * k_stride + p)), qv, acc);
                    p += 8;
                }
                *sp.add(r * KB + j) = hsum(acc);
            }
            j += 1;
        }
        for p in d8..d {
            for r in 0..R {
                let qx = *qp.add(r * d + p);
                for j in 0..nk {
                    *sp.add(r * KB + j) += qx * (*k.add(j * k_stride + p)).to_f32();
                }
            }
        }
    }

    /// [`Micro::scores_in_place`] for one element type.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores_in_place_typed<T: Lane>(
        q: &[f32],
        data: &[T],
        k: &KvView<'_>,
        ahead: Ahead,
        g: usize,
        j0: usize,
        nk: usize,
        s: &mut [f32],
        rows: usize,
        d: usize,
    ) {
        let (base, stride) = (data.as_ptr().add(k.offset(j0, g)), k.row_stride);
        // Only the first sweep over the keys prefetches.
        let mut ahead = Some(ahead);
        let mut r0 = 0;
        while r0 + 3 <= rows {
            scores_in_place_rows::<T, 3, 3>(q, base, stride, nk, s, d, r0, ahead.take());
            r0 += 3;
        }
        match rows - r0 {
            0 => {}
            1 => scores_in_place_rows::<T, 1, 4>(q, base, stride, nk, s, d, r0, ahead),
            _ => scores_in_place_rows::<T, 2, 4>(q, base, stride, nk, s, d, r0, ahead),
        }
    }

    /// [`Micro::pv_in_place`] for one element type: tiles of R rows × 8·C columns chosen by
    /// the row count (1×32 up to 6×16), then 16 columns, then 8, then the columns past the
    /// last multiple of 8 in scalar code.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pv_in_place_typed<T: Lane>(
        p: &[f32],
        data: &[T],
        v: &KvView<'_>,
        g: usize,
        j0: usize,
        nk: usize,
        o: &mut [f32],
        corr: &[f32],
        rows: usize,
        dvp: usize,
    ) {
        let base = data.as_ptr().add(v.offset(j0, g));
        let (dv, stride) = (v.dim, v.row_stride);
        let dv8 = dv / 8 * 8;
        // The block's V rows were prefetched while its scores were computed
        // (`scores_in_place`), so the tiles' sweeps find them in cache.
        let mut r0 = 0;
        while r0 < rows {
            let n = (rows - r0).min(6);
            // Tiles of R rows × 8·C columns with U accumulator sets, chosen so that the main
            // tile has at least 8 independent FMA chains (R·C·U) and still fits the 16
            // registers; the last 16 or 8 columns take narrower tiles.
            macro_rules! cols {
                ($r:literal, $c:literal, $u:literal) => {{
                    let mut c = 0;
                    while c + 8 * $c <= dv8 {
                        pv_tile::<T, $r, $c, $u>(p, base, stride, nk, o, corr, r0, c, dvp);
                        c += 8 * $c;
                    }
                    if c + 16 <= dv8 {
                        pv_tile::<T, $r, 2, $u>(p, base, stride, nk, o, corr, r0, c, dvp);
                        c += 16;
                    }
                    if c < dv8 {
                        pv_tile::<T, $r, 1, $u>(p, base, stride, nk, o, corr, r0, c, dvp);
                    }
                }};
            }
            match n {
                1 => cols!(1, 4, 2),
                2 => cols!(2, 4, 1),
                3 => cols!(3, 3, 1),
                4 => cols!(4, 2, 1),
                5 => cols!(5, 2, 1),
                _ => cols!(6, 2, 1),
            }
            r0 += n;
        }
        for r in 0..rows {
            for c in dv8..dv {
                let mut x = o[r * dvp + c] * corr[r];
                for j in 0..nk {
                    x += p[r * KB + j] * (*base.add(j * stride + c)).to_f32();
                }
                o[r * dvp + c] = x;
            }
        }
    }

    macro_rules! by_rows {
        ($rows:expr, $f:ident, $($arg:expr),*) => {{
            let mut r0 = 0;
            while r0 + 6 <= $rows {
                $f::<6>($($arg,)* r0);
                r0 += 6;
            }
            match $rows - r0 {
                0 => {}
                1 => $f::<1>($($arg,)* r0),
                2 => $f::<2>($($arg,)* r0),
                3 => $f::<3>($($arg,)* r0),
                4 => $f::<4>($($arg,)* r0),
                _ => $f::<5>($($arg,)* r0),
            }
        }};
    }

    #[inline(always)]
    unsafe fn scores_rows<const R: usize>(
        q: &[f32],
        kt: &[f32],
        s: &mut [f32],
        d: usize,
        r0: usize,
    ) {
        scores_tile::<R>(q, kt, s, r0, d)
    }

    #[inline(always)]
    unsafe fn pv_rows<const R: usize>(
        p: &[f32],
        v: &[f32],
        o: &mut [f32],
        corr: &[f32],
        dvp: usize,
        r0: usize,
    ) {
        let mut c = 0;
        while c + 16 <= dvp {
            pv_tile::<f32, R, 2, 1>(p, v.as_ptr(), dvp, KB, o, corr, r0, c, dvp);
            c += 16;
        }
        if c < dvp {
            pv_tile::<f32, R, 1, 1>(p, v.as_ptr(), dvp, KB, o, corr, r0, c, dvp);
        }
    }

    impl Micro for Avx2 {
        #[inline(always)]
        fn pack_kt(k: &KvView<'_>, g: usize, j0: usize, nk: usize, kt: &mut [f32]) {
            // SAFETY (all methods): only called from `process_avx2`, which has the features;
            // indices stay inside the validated views and the scratch sized by `prepare`.
            unsafe {
                match k.data {
                    KvData::F32(x) => pack_kt_typed(x, k, g, j0, nk, kt),
                    KvData::F16(x) => pack_kt_typed(x, k, g, j0, nk, kt),
                }
            }
        }

        #[inline(always)]
        fn pack_v(v: &KvView<'_>, g: usize, j0: usize, nk: usize, dvp: usize, out: &mut [f32]) {
            // SAFETY: see `pack_kt`.
            unsafe {
                match v.data {
                    KvData::F32(x) => pack_v_typed(x, v, g, j0, nk, dvp, out),
                    KvData::F16(x) => pack_v_typed(x, v, g, j0, nk, dvp, out),
                }
            }
        }

        #[inline(always)]
        fn scores(q: &[f32], kt: &[f32], s: &mut [f32], rows: usize, d: usize) {
            debug_assert!(q.len() >= rows * d && kt.len() >= d * KB && s.len() >= rows * KB);
            // SAFETY: see `pack_kt`.
            unsafe { by_rows!(rows, scores_rows, q, kt, s, d) }
        }

        #[inline(always)]
        fn softmax_update(
            s: &mut [f32],
            m: &mut [f32],
            l: &mut [f32],
            corr: &mut [f32],
            rows: usize,
        ) {
            for r in 0..rows {
                let row = &mut s[r * KB..(r + 1) * KB];
                let rp = row.as_mut_ptr();
                // SAFETY: see `pack_kt`; the row holds KB = 8·8 floats.
                unsafe {
                    let mut mx = _mm256_loadu_ps(rp);
                    for c in (8..KB).step_by(8) {
                        mx = _mm256_max_ps(mx, _mm256_loadu_ps(rp.add(c)));
                    }
                    let m_new = m[r].max(hmax(mx));
                    if m_new == f32::NEG_INFINITY {
                        row.fill(0.0);
                        corr[r] = 1.0;
                        continue;
                    }
                    let mv = _mm256_set1_ps(m_new);
                    let mut sum = _mm256_setzero_ps();
                    for c in (0..KB).step_by(8) {
                        let e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(rp.add(c)), mv));
                        _mm256_storeu_ps(rp.add(c), e);
                        sum = _mm256_add_ps(sum, e);
                    }
                    corr[r] = (m[r] - m_new).exp();
                    l[r] = l[r] * corr[r] + hsum(sum);
                    m[r] = m_new;
                }
            }
        }

        #[inline(always)]
        fn pv(p: &[f32], v: &[f32], o: &mut [f32], corr: &[f32], rows: usize, dvp: usize) {
            debug_assert!(p.len() >= rows * KB && v.len() >= KB * dvp && o.len() >= rows * dvp);
            // SAFETY: see `pack_kt`.
            unsafe { by_rows!(rows, pv_rows, p, v, o, corr, dvp) }
        }

        #[inline(always)]
        fn scores_in_place(
            q: &[f32],
            k: &KvView<'_>,
            v: &KvView<'_>,
            g: usize,
            j0: usize,
            nk: usize,
            s: &mut [f32],
            rows: usize,
            d: usize,
        ) {
            debug_assert!(j0 + nk <= k.rows && q.len() >= rows * d && s.len() >= rows * KB);
            let ahead = Ahead::rows_of(v, j0, g);
            // SAFETY: see `pack_kt`; keys j0..j0+nk of head g lie inside the validated view.
            unsafe {
                match k.data {
                    KvData::F32(x) => scores_in_place_typed(q, x, k, ahead, g, j0, nk, s, rows, d),
                    KvData::F16(x) => scores_in_place_typed(q, x, k, ahead, g, j0, nk, s, rows, d),
                }
            }
        }

        #[inline(always)]
        fn pv_in_place(
            p: &[f32],
            v: &KvView<'_>,
            g: usize,
            j0: usize,
            nk: usize,
            o: &mut [f32],
            corr: &[f32],
            rows: usize,
            dvp: usize,
        ) {
            debug_assert!(j0 + nk <= v.rows && p.len() >= rows * KB && o.len() >= rows * dvp);
            // SAFETY: as in `scores_in_place`.
            unsafe {
                match v.data {
                    KvData::F32(x) => pv_in_place_typed(p, x, v, g, j0, nk, o, corr, rows, dvp),
                    KvData::F16(x) => pv_in_place_typed(p, x, v, g, j0, nk, o, corr, rows, dvp),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{key_splits, ScratchSizes, MAX_KEY_SPLITS, MIN_SPLIT_KEYS, SPLIT_ITEMS_PER_THREAD};

    /// `key_splits` as it was before [`MAX_KEY_SPLITS`]: no bound but the key count.
    fn uncapped_key_splits(base: usize, tk: usize, threads: usize) -> usize {
        let most = (tk / MIN_SPLIT_KEYS).max(1);
        let guess = (SPLIT_ITEMS_PER_THREAD * threads).div_ceil(base.max(1));
        let want = guess.min(most);
        let balanced = |s: &usize| (base * s).is_multiple_of(threads.max(1));
        (want..=most.min(2 * want))
            .find(balanced)
            .or_else(|| (1..want).rev().find(balanced))
            .unwrap_or(want)
    }

    #[test]
    fn the_split_cap_changes_nothing_up_to_sixteen_threads() {
        for threads in 1..=16 {
            for base in 1..=40 {
                for tk in [1, 255, 256, 700, 2048, 8192, 65_536, 1 << 20, usize::MAX] {
                    assert_eq!(
                        key_splits(base, tk, threads),
                        uncapped_key_splits(base, tk, threads),
                        "base {base}, tk {tk}, threads {threads}"
                    );
                }
            }
        }
        // Wider pools are capped.
        assert_eq!(key_splits(1, 1 << 20, 1000), MAX_KEY_SPLITS);
    }

    #[test]
    fn scratch_does_not_grow_with_the_thread_count() {
        // Llama-like decode shape: 32 heads over 8 KV heads, d = 128.
        let size = |threads| {
            ScratchSizes::new(32, 8, 128, 128, threads)
                .unwrap()
                .partials
        };
        let bound = 8 * MAX_KEY_SPLITS * 4 * 130;
        assert!(size(1000) <= bound && size(100_000) == size(1000));
        assert!(size(usize::MAX) <= bound);
        // Up to the cap, as before: 8 KV heads × 2·⌈16/8⌉ splits on 8 threads.
        assert_eq!(size(8), 8 * 4 * 4 * 130);
    }

    #[test]
    fn key_splits_give_a_multiple_of_the_threads_when_they_can() {
        // 3 KV heads on 2 threads: 6 items, whatever the (long enough) key count.
        assert_eq!(key_splits(3, 2048, 2), 2);
        assert_eq!(key_splits(3, 8192, 2), 2);
        // Too few keys to split: one range, even if that leaves the items unbalanced.
        assert_eq!(key_splits(3, 300, 2), 1);
        // One KV head: 4 ranges for 2 threads; 5 heads: 2 ranges (10 items, not 5).
        assert_eq!(key_splits(1, 4096, 2), 4);
        assert_eq!(key_splits(5, 4096, 2), 2);
        // 3 heads on 4 threads: 8 wanted → ⌈8/3⌉ = 3 ranges (9 items) is odd; 4 ranges
        // give 12, a multiple of 4.
        assert_eq!(key_splits(3, 8192, 4), 4);
        // Capped by the key count: 768 keys allow 3 ranges at most, and no count of 1–3
        // ranges makes 3 heads a multiple of 4 threads, so the first guess stands.
        assert_eq!(key_splits(3, 768, 4), 3);
        // 2 heads on 4 threads, 512 keys: 2 ranges wanted and allowed, 4 items.
        assert_eq!(key_splits(2, 512, 4), 2);
    }
}
