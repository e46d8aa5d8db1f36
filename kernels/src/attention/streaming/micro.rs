//! The micro-kernel interface of the streaming kernel, its scalar implementation (the
//! reference every SIMD form is tested against), and the scalar softmax steps both share.

use super::KB;
use crate::attention::KvView;

/// One block of keys as the micro-kernels that touch K or V see it: keys `j0..j0 + nk`
/// (`nk ≤ KB`) of KV head `g`, met by `rows` query rows of `d` elements each, whose output
/// accumulators lie `dvp` floats apart. The one argument list of the packing and in-place
/// micro-kernels.
#[derive(Clone, Copy)]
pub(super) struct Block<'a> {
    /// The keys.
    pub(super) k: &'a KvView<'a>,
    /// The values.
    pub(super) v: &'a KvView<'a>,
    /// KV head.
    pub(super) g: usize,
    /// First key of the block.
    pub(super) j0: usize,
    /// Keys in the block, at most [`KB`].
    pub(super) nk: usize,
    /// Query rows (query head × query) of the work item.
    pub(super) rows: usize,
    /// Elements per query and key row (`d_qk`).
    pub(super) d: usize,
    /// Floats between consecutive rows of the output accumulators (`d_v` rounded up to 8).
    pub(super) dvp: usize,
}

/// The operations whose SIMD and scalar forms must agree; everything else is shared.
pub(super) trait Micro {
    /// `s[i] = cap · tanh(s[i] / cap)`: soft-capping of scores (NaN stays NaN, ±∞ → ±cap).
    fn softcap(s: &mut [f32], cap: f32);
    /// `kt[p·KB + j] = K[j0 + j, g, p]` for `j < nk`, zero for `nk ≤ j < KB`.
    fn pack_kt(b: &Block<'_>, kt: &mut [f32]);
    /// `v[j·dvp + c] = V[j0 + j, g, c]` for `j < nk, c < d_v`, zero elsewhere up to `KB × dvp`.
    fn pack_v(b: &Block<'_>, out: &mut [f32]);
    /// `s[r·KB + j] = Σ_p q[r·d + p] · kt[p·KB + j]` for `r < rows`.
    fn scores(q: &[f32], kt: &[f32], s: &mut [f32], rows: usize, d: usize);
    /// Folds one block of masked score rows (`KB` columns each, masked ones −∞) into each
    /// row's running state, as [`step`] decides: turns the scores into `exp(s − m_new)`,
    /// updates `m` and `l`, and sets `corr[r] = exp(m_old − m_new)`. A row that has seen no
    /// weight yet gets zeros and `corr = 1`; a row poisoned by a NaN or +∞ score (now or
    /// before) gets zeros and `m = l = corr = NaN`, so its accumulator turns NaN.
    fn softmax_update(s: &mut [f32], m: &mut [f32], l: &mut [f32], corr: &mut [f32], rows: usize);
    /// `o[r·dvp + c] = o[r·dvp + c]·corr[r] + Σ_j p[r·KB + j] · v[j·dvp + c]`.
    fn pv(p: &[f32], v: &[f32], o: &mut [f32], corr: &[f32], rows: usize, dvp: usize);
    /// `s[r·KB + j] = Σ_p q[r·d + p] · K[j0 + j, g, p]` for `r < rows, j < nk`, read in place
    /// (columns `nk..KB` are left for the mask to fill). The same keys' rows of `v` may be
    /// pulled into cache meanwhile, for the `P·V` that follows.
    fn scores_in_place(b: &Block<'_>, q: &[f32], s: &mut [f32]);
    /// `o[r·dvp + c] = o[r·dvp + c]·corr[r] + Σ_{j<nk} p[r·KB + j] · V[j0 + j, g, c]` for
    /// `c < d_v`, read in place.
    fn pv_in_place(b: &Block<'_>, p: &[f32], o: &mut [f32], corr: &[f32]);
}

/// What a row's running softmax state does with one more block of scores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Step {
    /// A NaN or +∞ score was seen (in this block or before): the row's output is NaN, as
    /// `softmax` over such scores gives (`+∞ − +∞` is NaN).
    Poisoned,
    /// No score above −∞ yet: nothing to weigh.
    Empty,
    /// Exponentiate relative to this (finite) running maximum.
    Max(f32),
}

/// The step of a row whose running maximum is `m_old` (NaN once poisoned) for a block whose
/// largest score is `block_max` (a maximum that ignores NaN) and which `has_nan` scores.
#[inline(always)]
pub(super) fn step(m_old: f32, block_max: f32, has_nan: bool) -> Step {
    let m_new = m_old.max(block_max);
    if has_nan || m_old.is_nan() || m_new == f32::INFINITY {
        Step::Poisoned
    } else if m_new == f32::NEG_INFINITY {
        Step::Empty
    } else {
        Step::Max(m_new)
    }
}

/// The largest score of a row, ignoring NaN, and whether the row holds a NaN.
#[inline(always)]
pub(super) fn row_max(row: &[f32]) -> (f32, bool) {
    let mut mx = f32::NEG_INFINITY;
    let mut nan = false;
    for &x in row {
        nan |= x.is_nan();
        mx = mx.max(x);
    }
    (mx, nan)
}

/// `x ← exp(x − m)` over the row; returns the sum.
#[inline(always)]
pub(super) fn exp_shifted(row: &mut [f32], m: f32) -> f32 {
    let mut sum = 0.0f32;
    for x in row.iter_mut() {
        *x = (*x - m).exp();
        sum += *x;
    }
    sum
}

/// Applies a [`Step`] that is not [`Step::Max`] to row `r`'s state (its scores become
/// zeros), or, for `Step::Max(m_new)`, records the block's exponentials' `sum`.
#[inline(always)]
pub(super) fn commit(
    st: Step,
    sum: f32,
    row: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
    corr: &mut [f32],
    r: usize,
) {
    match st {
        Step::Poisoned => {
            row.fill(0.0);
            m[r] = f32::NAN;
            l[r] = f32::NAN;
            corr[r] = f32::NAN;
        }
        Step::Empty => {
            row.fill(0.0);
            corr[r] = 1.0;
        }
        Step::Max(m_new) => {
            corr[r] = (m[r] - m_new).exp();
            l[r] = l[r] * corr[r] + sum;
            m[r] = m_new;
        }
    }
}

/// Plain loops: the reference every SIMD micro-kernel is tested against, and the fallback.
pub(super) struct Scalar;

impl Micro for Scalar {
    fn softcap(s: &mut [f32], cap: f32) {
        for x in s {
            *x = cap * (*x / cap).tanh();
        }
    }

    fn pack_kt(b: &Block<'_>, kt: &mut [f32]) {
        for p in 0..b.k.dim {
            for j in 0..KB {
                kt[p * KB + j] = if j < b.nk {
                    b.k.get(b.j0 + j, b.g, p)
                } else {
                    0.0
                };
            }
        }
    }

    fn pack_v(b: &Block<'_>, out: &mut [f32]) {
        let dvp = b.dvp;
        for j in 0..KB {
            for c in 0..dvp {
                out[j * dvp + c] = if j < b.nk && c < b.v.dim {
                    b.v.get(b.j0 + j, b.g, c)
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
            let (block_max, nan) = row_max(row);
            let st = step(m[r], block_max, nan);
            let sum = match st {
                Step::Max(m_new) => exp_shifted(row, m_new),
                _ => 0.0,
            };
            commit(st, sum, row, m, l, corr, r);
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

    fn scores_in_place(b: &Block<'_>, q: &[f32], s: &mut [f32]) {
        let d = b.d;
        for r in 0..b.rows {
            for j in 0..b.nk {
                let mut acc = 0.0f32;
                for p in 0..d {
                    acc += q[r * d + p] * b.k.get(b.j0 + j, b.g, p);
                }
                s[r * KB + j] = acc;
            }
        }
    }

    fn pv_in_place(b: &Block<'_>, p: &[f32], o: &mut [f32], corr: &[f32]) {
        let dvp = b.dvp;
        for r in 0..b.rows {
            let orow = &mut o[r * dvp..r * dvp + b.v.dim];
            for x in orow.iter_mut() {
                *x *= corr[r];
            }
            for j in 0..b.nk {
                let pj = p[r * KB + j];
                for (c, x) in orow.iter_mut().enumerate() {
                    *x += pj * b.v.get(b.j0 + j, b.g, c);
                }
            }
        }
    }
}
