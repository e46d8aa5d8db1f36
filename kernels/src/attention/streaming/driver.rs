//! The driver: runs a [`Plan`] — packs key blocks, runs every item's loop over its key
//! blocks with the micro-kernels, masks the scores, and turns each row's running state into
//! output (merging split keys first), by the rule in [`mod@crate::attention`]'s documentation.

use super::exact::{exact_row, has_visible_key};
use super::mask::mask_row;
use super::micro::{Block, Micro, Scalar};
use super::plan::{worth_parallel, Plan};
use super::scratch::{try_grow, Scratch, PACKED, PARTIALS, SCRATCH};
use super::{Call, Ctx, Dims, Item, Packed, IN_PLACE_MAX_ROWS, KB};
use crate::attention::{validate, AttentionCall};
use crate::par::SharedOut;
use crate::Result;
use rayon::prelude::*;

/// Runs the call with the micro-kernels `M`.
pub(super) fn run_with<M: Micro + ProcessItem>(call: &Call<'_>, out: &mut [f32]) {
    let dims = &call.dims;
    let plan = Plan::new(dims, call.mask, rayon::current_num_threads());
    let mut ctx = Ctx::new(call);
    let dvp = ctx.dvp;
    let k_lo = plan.k_lo;
    // With three or more query blocks, packing every key block once up front is cheaper
    // than packing it again in every item.
    let mut packed_bufs = (Vec::new(), Vec::new());
    let blocks = dims.tk.div_ceil(KB);
    let (kt_len, v_len) = (dims.d_qk * KB, KB * dvp);
    // Checked: views with zero row strides may describe more keys than memory holds packed;
    // then (or when the buffers cannot grow) every item packs its own blocks instead.
    let n = dims.kv_heads.saturating_mul(blocks);
    let packed_lens = n.checked_mul(kt_len).zip(n.checked_mul(v_len));
    if let (true, Some((kt_total, v_total))) = (plan.pack_up_front, packed_lens) {
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
            let b = Block {
                k: call.k,
                v: call.v,
                g,
                j0,
                nk: KB.min(dims.tk - j0),
                rows: 0,
                d: dims.d_qk,
                dvp,
            };
            M::pack_block(&b, kt, vb);
        };
        let (kt, vb) = (&mut kt[..n * kt_len], &mut vb[..n * v_len]);
        if plan.parallel {
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
        ctx.packed = Some(Packed {
            kt: &packed_bufs.0,
            v: &packed_bufs.1,
            blocks,
        });
    }
    let n_items = plan.items();
    let optr = SharedOut(out.as_mut_ptr());

    if plan.splits == 1 {
        let body = |idx: usize| {
            SCRATCH.with(|sc| {
                let mut sc = sc.borrow_mut();
                let it = plan.item(idx, dims);
                M::process(&ctx, it, &mut sc);
                // SAFETY: `out` is tq·heads·d_v long (validated) and outlives this call; the
                // item writes only its own rows, which no other item of the plan shares.
                unsafe { finalize_item(&ctx, it, &sc, optr) };
            })
        };
        if plan.parallel {
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
    merge_splits::<M>(&ctx, &plan, out);
}

/// Most calls [`run_many_with`] takes in one pass: its bookkeeping lives on the stack (a
/// decode step allocates nothing), and a batch of more calls goes in passes of this many.
const MANY_MAX: usize = 32;

/// One call of [`run_many_with`] whose items join the shared pass.
struct Joined<'a> {
    ctx: Ctx<'a>,
    plan: Plan,
    out: &'a mut [f32],
    /// `out` for the items, which write their own rows of it during the pass.
    optr: SharedOut,
    /// Its first item in the pass's numbering.
    first: usize,
    /// Where its items' partial states start in the pass's partials (split plans only).
    partials: usize,
}

/// Runs several calls with the micro-kernels `M`, each cut into items by its own plan on
/// the current pool exactly as [`run_with`] cuts it alone, and the items of all of them in
/// one pass over the pool: one hand-off to the threads instead of one per call, and the
/// short calls of a batched decode step balance each other. Every item computes what it
/// computes alone, and split keys merge in the same order, so each output equals its call
/// run alone, bit for bit. Calls that pack key blocks up front (long prompts) run alone.
/// The calls must have passed [`validate`] (which is run again here to build them).
pub(super) fn run_many_with<M: Micro + ProcessItem>(calls: &mut [AttentionCall<'_>]) -> Result<()> {
    let threads = rayon::current_num_threads();
    for chunk in calls.chunks_mut(MANY_MAX) {
        let mut joined: [Option<Joined<'_>>; MANY_MAX] = [const { None }; MANY_MAX];
        let (mut n, mut items, mut partial_total, mut work) = (0, 0, 0, 0usize);
        for c in chunk.iter_mut() {
            let AttentionCall {
                q,
                k,
                v,
                mask,
                scale,
                out,
            } = c;
            let call = validate(q, k, v, mask, *scale, out.len())?;
            let plan = Plan::new(&call.dims, call.mask, threads);
            if plan.pack_up_front {
                run_with::<M>(&call, out);
                continue;
            }
            let ctx = Ctx::new(&call);
            let split_len = if plan.splits > 1 {
                plan.items() * partial_len(&ctx, &plan)
            } else {
                0
            };
            joined[n] = Some(Joined {
                ctx,
                plan,
                optr: SharedOut(out.as_mut_ptr()),
                out,
                first: items,
                partials: partial_total,
            });
            n += 1;
            items += plan.items();
            work = work.saturating_add(plan.work);
            partial_total += split_len;
        }
        let joined = &mut joined[..n];
        let mut partials = PARTIALS.with(|p| std::mem::take(&mut *p.borrow_mut()));
        if partials.len() < partial_total {
            partials.resize(partial_total, 0.0);
        }
        let pp = SharedOut(partials.as_mut_ptr());
        let shared: &[Option<Joined<'_>>] = joined;
        let body = |flat: usize| {
            let at = shared.partition_point(|j| j.as_ref().is_some_and(|j| j.first <= flat)) - 1;
            let Some(j) = &shared[at] else {
                unreachable!("filled up to n")
            };
            let idx = flat - j.first;
            SCRATCH.with(|sc| {
                let mut sc = sc.borrow_mut();
                if j.plan.splits == 1 {
                    let it = j.plan.item(idx, &j.ctx.dims);
                    M::process(&j.ctx, it, &mut sc);
                    // SAFETY: the call's `out` was validated to hold its tq·heads·d_v floats
                    // and is borrowed for this function; the item writes only its own rows,
                    // which no other item (of this call, or of another, whose `out` is
                    // another slice) shares.
                    unsafe { finalize_item(&j.ctx, it, &sc, j.optr) };
                } else {
                    let len = partial_len(&j.ctx, &j.plan);
                    // SAFETY: item idx of this call owns floats j.partials + idx·len.. (+len)
                    // of `partials`, which holds partial_total ≥ that end; no other item
                    // touches them.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(pp.get().add(j.partials + idx * len), len)
                    };
                    process_partial::<M>(&j.ctx, &j.plan, idx, &mut sc, dst);
                }
            })
        };
        // As a call alone decides (one call goes to the pool exactly when it would alone).
        if items > 1 && worth_parallel(work, threads) {
            (0..items).into_par_iter().for_each(body);
        } else {
            (0..items).for_each(body);
        }
        for j in joined.iter_mut().flatten().filter(|j| j.plan.splits > 1) {
            merge_rows(&j.ctx, &j.plan, &partials[j.partials..], j.out);
        }
        PARTIALS.with(|p| *p.borrow_mut() = partials);
    }
    Ok(())
}

/// Runs the items of a plan that splits the keys, each leaving `(m, l, o[d_v])` per row in
/// this thread's `PARTIALS`, then merges the splits of every (KV head, query block) row by
/// row into `out`.
fn merge_splits<M: Micro + ProcessItem>(ctx: &Ctx<'_>, plan: &Plan, out: &mut [f32]) {
    let item_len = partial_len(ctx, plan);
    let n_items = plan.items();
    let mut partials = PARTIALS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if partials.len() < n_items * item_len {
        partials.resize(n_items * item_len, 0.0);
    }
    partials[..n_items * item_len]
        .par_chunks_mut(item_len)
        .enumerate()
        .for_each(|(idx, dst)| {
            SCRATCH.with(|sc| process_partial::<M>(ctx, plan, idx, &mut sc.borrow_mut(), dst))
        });
    merge_rows(ctx, plan, &partials, out);
    PARTIALS.with(|p| *p.borrow_mut() = partials);
}

/// Floats one item of a split plan leaves in the partials: `(m, l, o[d_v])` per row.
fn partial_len(ctx: &Ctx<'_>, plan: &Plan) -> usize {
    ctx.group * plan.qb * (ctx.dims.d_v + 2)
}

/// Runs item `idx` of a split plan and writes its rows' `(m, l, o[d_v])` to `dst`.
fn process_partial<M: Micro + ProcessItem>(
    ctx: &Ctx<'_>,
    plan: &Plan,
    idx: usize,
    sc: &mut Scratch,
    dst: &mut [f32],
) {
    let dims = &ctx.dims;
    let stride = dims.d_v + 2;
    let it = plan.item(idx, dims);
    M::process(ctx, it, sc);
    for r in 0..ctx.group * it.nq {
        let d = &mut dst[r * stride..(r + 1) * stride];
        d[0] = sc.m[r];
        d[1] = sc.l[r];
        d[2..].copy_from_slice(&sc.o[r * ctx.dvp..r * ctx.dvp + dims.d_v]);
    }
}

/// Merges the splits of every (KV head, query block) of a split plan, row by row, from the
/// items' `partials` (each [`partial_len`] floats, in item order) into `out`.
fn merge_rows(ctx: &Ctx<'_>, plan: &Plan, partials: &[f32], out: &mut [f32]) {
    let dims = &ctx.dims;
    let (group, splits) = (ctx.group, plan.splits);
    let stride = dims.d_v + 2;
    let item_len = partial_len(ctx, plan);
    for base in 0..plan.base_items {
        let it = plan.item(base * splits, dims);
        let rows = group * it.nq;
        for r in 0..rows {
            let (hi, qi) = (r / it.nq, r % it.nq);
            let h = it.g * group + hi;
            let i = it.i0 + qi;
            let o = &mut out[(i * dims.heads + h) * dims.d_v..][..dims.d_v];
            let part =
                |s: usize| &partials[(base * splits + s) * item_len + r * stride..][..stride];
            // A split that saw a NaN or +∞ score poisons the row; the max ignores NaN.
            let (mut m, mut poisoned) = (f32::NEG_INFINITY, false);
            for s in 0..splits {
                let ms = part(s)[0];
                poisoned |= ms.is_nan();
                m = m.max(ms);
            }
            let end = if poisoned {
                RowEnd::Poisoned
            } else if m == f32::NEG_INFINITY {
                RowEnd::NoWeight
            } else {
                o.fill(0.0);
                let mut l = 0.0f32;
                for s in 0..splits {
                    let p = part(s);
                    if p[0] == f32::NEG_INFINITY {
                        continue; // no weight in this split (its sums may hold masked V)
                    }
                    let w = (p[0] - m).exp();
                    l += p[1] * w;
                    for (x, y) in o.iter_mut().zip(&p[2..]) {
                        *x += w * y;
                    }
                }
                RowEnd::Scale(1.0 / l)
            };
            if finish_row(ctx, i, end, None, o) {
                // Rare (non-finite values): the scaled query is made again for the exact row.
                let mut qs = vec![0.0f32; dims.d_qk];
                ctx.scaled_query(i, h, &mut qs);
                exact_row(ctx, i, h, &qs, o, None);
            }
        }
    }
}

/// How a row's finished state becomes output.
#[derive(Clone, Copy, Debug)]
enum RowEnd {
    /// A NaN or +∞ score was seen: the row is NaN.
    Poisoned,
    /// No score above −∞: zeros when no key is visible to the query, else NaN (`0/0`).
    NoWeight,
    /// The accumulator times this factor (`1/l`).
    Scale(f32),
}

impl RowEnd {
    /// The end of a row whose running state is `(m, l)`.
    #[inline]
    fn of(m: f32, l: f32) -> RowEnd {
        if m.is_nan() {
            RowEnd::Poisoned
        } else if l > 0.0 {
            RowEnd::Scale(1.0 / l)
        } else {
            RowEnd::NoWeight
        }
    }
}

/// Writes output row `o` of query `i`, head `h`: `acc · (1/l)` (or `o · (1/l)` in place when
/// `acc` is `None`), NaN, or zeros, as `end` says. Returns true when a scaled row came out
/// non-finite (a NaN or ∞ in V, or a masked key's V leaking through a zero probability):
/// then the caller computes it again by [`exact_row`], which decides what the rule gives.
#[inline]
fn finish_row(ctx: &Ctx<'_>, i: usize, end: RowEnd, acc: Option<&[f32]>, o: &mut [f32]) -> bool {
    match end {
        RowEnd::Poisoned => o.fill(f32::NAN),
        RowEnd::NoWeight => {
            let fill = if has_visible_key(ctx.mask, i, ctx.dims.tk) {
                f32::NAN
            } else {
                0.0
            };
            o.fill(fill);
        }
        RowEnd::Scale(inv) => {
            // The check rides on the values as they are stored, without an early exit, so
            // that it vectorizes and never reads `o` back (read back element by element, a
            // fifth of an encoder's attention time went to this function).
            let mut bad = false;
            let mut put = |x: &mut f32, y: f32| {
                *x = y * inv;
                bad |= !x.is_finite();
            };
            match acc {
                Some(acc) => o.iter_mut().zip(acc).for_each(|(x, &y)| put(x, y)),
                None => o.iter_mut().for_each(|x| put(x, *x)),
            }
            return bad;
        }
    }
    false
}

/// Writes an item's rows to `out` (see [`finish_row`]).
///
/// # Safety
/// `out` must point to `tq·heads·d_v` writable floats, and no other thread may write the
/// rows of this item's (KV head, query block) at the same time.
unsafe fn finalize_item(ctx: &Ctx<'_>, it: Item, sc: &Scratch, out: SharedOut) {
    let Dims {
        heads, d_v, d_qk, ..
    } = ctx.dims;
    for r in 0..ctx.group * it.nq {
        let (hi, qi) = (r / it.nq, r % it.nq);
        let h = it.g * ctx.group + hi;
        let i = it.i0 + qi;
        // SAFETY: (i, h) is inside the output (i < tq, h < heads), so the d_v floats at
        // (i·heads + h)·d_v lie inside `out`; the caller lets no one else write them now.
        let o =
            unsafe { std::slice::from_raw_parts_mut(out.get().add((i * heads + h) * d_v), d_v) };
        let end = RowEnd::of(sc.m[r], sc.l[r]);
        let acc = &sc.o[r * ctx.dvp..r * ctx.dvp + d_v];
        if finish_row(ctx, i, end, Some(acc), o) {
            exact_row(ctx, i, h, &sc.q[r * d_qk..(r + 1) * d_qk], o, None);
        }
    }
}

/// The item loop, generic over the micro-kernels; the AVX2 form runs it inside a
/// `#[target_feature]` function so that everything inlines with the right instructions.
pub(super) trait ProcessItem {
    /// Runs item `it` over its key blocks, leaving each row's `(m, l, o)` in `sc`.
    fn process(ctx: &Ctx<'_>, it: Item, sc: &mut Scratch);
    /// Packs Kᵀ (to `kt`) and V (to `vb`) of the key block `b`.
    fn pack_block(b: &Block<'_>, kt: &mut [f32], vb: &mut [f32]);
}

impl ProcessItem for Scalar {
    fn process(ctx: &Ctx<'_>, it: Item, sc: &mut Scratch) {
        process_item::<Scalar>(ctx, it, sc)
    }

    fn pack_block(b: &Block<'_>, kt: &mut [f32], vb: &mut [f32]) {
        Scalar::pack_kt(b, kt);
        Scalar::pack_v(b, vb);
    }
}

/// One item: its queries scaled into scratch, then every key block it sees through scores,
/// soft-cap, masks, the softmax update and `P·V`.
#[inline(always)]
pub(super) fn process_item<M: Micro>(ctx: &Ctx<'_>, it: Item, sc: &mut Scratch) {
    let Dims { tk, d_qk: d, .. } = ctx.dims;
    let rows = ctx.group * it.nq;
    let dvp = ctx.dvp;
    sc.prepare(rows, d, dvp);
    for r in 0..rows {
        let (hi, qi) = (r / it.nq, r % it.nq);
        let h = it.g * ctx.group + hi;
        ctx.scaled_query(it.i0 + qi, h, &mut sc.q[r * d..(r + 1) * d]);
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
    let block = |j0: usize, nk: usize| Block {
        k: ctx.k,
        v: ctx.v,
        g: it.g,
        j0,
        nk,
        rows,
        d,
        dvp,
    };
    // Few rows (decode): packing a block would cost as much as using it, so K and V are read
    // where they lie.
    if ctx.packed.is_none() && rows <= IN_PLACE_MAX_ROWS {
        let mut jb = it.j0.max(window_start);
        while jb < j_end {
            let b = block(jb, KB.min(j_end - jb));
            M::scores_in_place(&b, &sc.q, &mut sc.s);
            if let Some(cap) = softcap {
                M::softcap(&mut sc.s[..rows * KB], cap);
            }
            apply_masks(ctx, it, jb, b.nk, tk, &mut sc.s[..rows * KB]);
            M::softmax_update(&mut sc.s, &mut sc.m, &mut sc.l, &mut sc.corr, rows);
            M::pv_in_place(&b, &sc.s, &mut sc.o, &sc.corr);
            jb += b.nk;
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
                let b = block(jb, nk);
                M::pack_kt(&b, &mut sc.kt);
                M::pack_v(&b, &mut sc.v);
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

/// Sets blocked scores of one block to −∞: padding columns past `nk`, and in each row what
/// [`mask_row`] blocks. Blocks that need none of it return at once.
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
        row[nk..].fill(f32::NEG_INFINITY);
        mask_row(mask, it.i0 + r % it.nq, jb, tk, pads, &mut row[..nk]);
    }
}
