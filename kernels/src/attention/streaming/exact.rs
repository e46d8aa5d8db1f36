//! One output row by the exact rule, built from the kernel's own pieces (the scalar score,
//! soft-cap, mask, softmax-update and `P·V` steps): the probabilities of
//! [`crate::attention::attention_with_probs`], and every row the streaming pass leaves
//! non-finite. Masked keys take no part in it at all, whatever their K and V hold.

use super::mask::mask_row;
use super::micro::{Block, Micro, Scalar};
use super::{Call, Ctx, Dims, KB};
use crate::attention::AttentionMask;

/// True when query `i` may attend at least one of the `tk` keys.
pub(super) fn has_visible_key(mask: &AttentionMask<'_>, i: usize, tk: usize) -> bool {
    (0..tk).any(|j| mask.visible(i, j, tk))
}

/// Query `i` of head `h` (its query `qs` already scaled) against every key, by the rule in
/// [`mod@crate::attention`]'s documentation: `o` (`d_v` floats) gets the output and `probs`,
/// when given, the `tk` probabilities.
///
/// Two passes over the keys: the first folds every block into the row's running maximum and
/// normaliser with the kernel's softmax update; the second recomputes each block's scores,
/// takes them relative to the final maximum through the same update, normalises them and
/// adds `p·V` of the visible keys only.
pub(super) fn exact_row(
    ctx: &Ctx<'_>,
    i: usize,
    h: usize,
    qs: &[f32],
    o: &mut [f32],
    mut probs: Option<&mut [f32]>,
) {
    let Dims { tk, d_qk: d, .. } = ctx.dims;
    let mask = ctx.mask;
    let pads = mask.key_keep.is_some();
    let block = |j0: usize, nk: usize| Block {
        k: ctx.k,
        v: ctx.v,
        g: h / ctx.group,
        j0,
        nk,
        rows: 1,
        d,
        dvp: ctx.dvp,
    };
    // One block's masked scores, −∞ past `nk`.
    let scores = |b: &Block<'_>, s: &mut [f32; KB]| {
        Scalar::scores_in_place(b, qs, s);
        if let Some(cap) = mask.softcap {
            Scalar::softcap(&mut s[..b.nk], cap);
        }
        mask_row(mask, i, b.j0, tk, pads, &mut s[..b.nk]);
        s[b.nk..].fill(f32::NEG_INFINITY);
    };
    let mut s = [0.0f32; KB];
    let (mut m, mut l, mut corr) = ([f32::NEG_INFINITY], [0.0f32], [1.0f32]);
    for jb in (0..tk).step_by(KB) {
        scores(&block(jb, KB.min(tk - jb)), &mut s);
        Scalar::softmax_update(&mut s, &mut m, &mut l, &mut corr, 1);
    }
    let fill = if m[0].is_nan() {
        Some(f32::NAN) // a NaN or +∞ score
    } else if l[0] == 0.0 {
        // No weight anywhere: zeros without a visible key, else 0/0.
        Some(if has_visible_key(mask, i, tk) {
            f32::NAN
        } else {
            0.0
        })
    } else {
        None
    };
    if let Some(x) = fill {
        o.fill(x);
        if let Some(p) = probs {
            p.fill(x);
        }
        return;
    }
    let inv = 1.0 / l[0];
    o.fill(0.0);
    // The update against the final maximum leaves exp(s − m) and never moves it.
    let (mut l2, mut corr2) = ([0.0f32], [1.0f32]);
    for jb in (0..tk).step_by(KB) {
        let b = block(jb, KB.min(tk - jb));
        scores(&b, &mut s);
        let mut m2 = m;
        Scalar::softmax_update(&mut s, &mut m2, &mut l2, &mut corr2, 1);
        for x in &mut s[..b.nk] {
            *x *= inv;
        }
        if let Some(p) = probs.as_deref_mut() {
            p[jb..jb + b.nk].copy_from_slice(&s[..b.nk]);
        }
        // P·V over each run of visible keys: a masked key's V is never read.
        let mut j = 0;
        while j < b.nk {
            let start = j;
            while j < b.nk && mask.visible(i, jb + j, tk) {
                j += 1;
            }
            if j > start {
                let run = Block {
                    j0: jb + start,
                    nk: j - start,
                    ..b
                };
                Scalar::pv_in_place(&run, &s[start..], o, &[1.0]);
            } else {
                j += 1;
            }
        }
    }
}

/// [`crate::attention::attention_with_probs`] on validated views: every row by
/// [`exact_row`], the probabilities `[heads, tq, tk]` into `probs`.
pub(in crate::attention) fn with_probs(call: &Call<'_>, out: &mut [f32], probs: &mut [f32]) {
    let ctx = Ctx::new(call);
    let Dims {
        tq,
        tk,
        heads,
        d_qk,
        d_v,
        ..
    } = call.dims;
    let mut qs = vec![0.0f32; d_qk];
    for h in 0..heads {
        for i in 0..tq {
            ctx.scaled_query(i, h, &mut qs);
            let o = &mut out[(i * heads + h) * d_v..][..d_v];
            let p = &mut probs[(h * tq + i) * tk..][..tk];
            exact_row(&ctx, i, h, &qs, o, Some(p));
        }
    }
}
