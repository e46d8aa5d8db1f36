//! The micro-kernel interface of the streaming kernel and its scalar implementation, the
//! reference every SIMD form is tested against.

use super::KB;
use crate::attention::KvView;

/// The operations whose SIMD and scalar forms must agree; everything else is shared.
pub(super) trait Micro {
    /// `s[i] = cap · tanh(s[i] / cap)`: soft-capping of scores.
    fn softcap(s: &mut [f32], cap: f32);
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
pub(super) struct Scalar;

impl Micro for Scalar {
    fn softcap(s: &mut [f32], cap: f32) {
        for x in s {
            *x = cap * (*x / cap).tanh();
        }
    }

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
