//! The AVX2 micro-kernels over a cache in Q8_0 blocks ([`KvData::Q8_0`]), reading the
//! blocks where they lie: 8 signed bytes are widened to f32 per load (`vpmovsxbd`,
//! `vcvtdq2ps`, the same two steps the f16 path's `vcvtph2ps` takes), and the block scales
//! of a key block are first turned into a small f32 table ([`scale_table`]). Then
//!
//! - scores multiply each widened K vector by its key's scale before the FMAs with the
//!   query rows (one multiply per 8 elements per key, shared by every row);
//! - `P·V` folds the scale into the probabilities: per 32-column block of V, the weights
//!   `p[r, j] · d[j]` are formed once and the f16 path's tiles ([`pv_tile`]) run over the
//!   raw values, never crossing a block;
//! - the packing of prefill blocks packs the raw values with the f16 path's code and scales
//!   them after.
//!
//! Rows of more than [`MAX_BLOCKS`] blocks (head dims past 256) take the scalar forms.
//! `crate::attention::attention_scalar` is the reference these are tested against.
//!
//! [`KvData::Q8_0`]: crate::attention::KvData::Q8_0

use super::super::micro::{Block, Micro, Scalar};
use super::super::{IN_PLACE_MAX_ROWS, KB};
use super::{hsum4, pack_kt_typed, pack_v_typed, pv_tile, Ahead};
use crate::attention::kv_q8::BLOCK;
use crate::attention::KvView;
use crate::simd::avx2::{hsum, Lane};
use core::arch::x86_64::*;
use half::f16;

/// Most blocks per head row the AVX2 forms handle (head dims up to 256).
const MAX_BLOCKS: usize = 8;

impl Lane for i8 {
    #[inline(always)]
    unsafe fn load8(p: *const i8) -> __m256 {
        // SAFETY: the caller guarantees 8 readable bytes at `p` and AVX2.
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast::<__m128i>()))) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
}

/// The scales of keys `j0..j0 + nk` of head `g`: `tab[b·KB + j]` is block `b` of key
/// `j0 + j` (`b < nb`), and zero for `j ≥ nk`.
///
/// # Safety
/// The CPU must have F16C; keys `j0..j0 + nk` of head `g` must lie inside the validated view
/// whose scales are `d`, every head row holding `nb` blocks.
#[inline(always)]
unsafe fn scale_table(
    view: &KvView<'_>,
    d: &[f16],
    j0: usize,
    g: usize,
    nk: usize,
    nb: usize,
    tab: &mut [f32; KB * MAX_BLOCKS],
) {
    let mut bits = [0u16; KB * MAX_BLOCKS];
    for j in 0..nk {
        let first = view.offset(j0 + j, g) / BLOCK;
        for (b, s) in d[first..first + nb].iter().enumerate() {
            bits[b * KB + j] = s.to_bits();
        }
    }
    for (t, x) in tab[..nb * KB]
        .chunks_exact_mut(8)
        .zip(bits[..nb * KB].chunks_exact(8))
    {
        // SAFETY: both chunks hold 8 elements; the caller has F16C.
        unsafe {
            let h = _mm_loadu_si128(x.as_ptr().cast::<__m128i>());
            _mm256_storeu_ps(t.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
}

/// [`Micro::scores_in_place`] over Q8_0 blocks (`q8`, `ds`: `b.k`'s data).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; keys `j0..j0 + nk` of head `g` must lie inside the
/// validated view; `q` must hold `rows · d` floats and `s` `rows · KB`.
#[inline(always)]
pub(super) unsafe fn scores_in_place(
    q8: &[i8],
    ds: &[f16],
    b: &Block<'_>,
    ahead: Ahead,
    q: &[f32],
    s: &mut [f32],
) {
    let (rows, d) = (b.rows, b.d);
    let nb = d.div_ceil(BLOCK);
    if nb > MAX_BLOCKS {
        return Scalar::scores_in_place(b, q, s);
    }
    let mut tab = [0.0f32; KB * MAX_BLOCKS];
    let mut ahead = Some(ahead);
    // SAFETY: the view was validated (scales cover every element read, head rows start on
    // blocks), key j0 of head g is inside it, and rows of 3 (then 1 or 2) below `rows` meet
    // the contract of `scores_rows`.
    unsafe {
        scale_table(b.k, ds, b.j0, b.g, b.nk, nb, &mut tab);
        let (base, stride) = (q8.as_ptr().add(b.k.offset(b.j0, b.g)), b.k.row_stride);
        let mut r0 = 0;
        while r0 + 3 <= rows {
            scores_rows::<3, 3>(q, base, stride, b.nk, s, d, r0, ahead.take(), &tab);
            r0 += 3;
        }
        match rows - r0 {
            0 => {}
            1 => scores_rows::<1, 4>(q, base, stride, b.nk, s, d, r0, ahead, &tab),
            _ => scores_rows::<2, 4>(q, base, stride, b.nk, s, d, r0, ahead, &tab),
        }
    }
}

/// Scores of rows `r0..r0+R` against `nk` keys in Q8_0 blocks, key `j` at `k + j·k_stride`,
/// its block scales in `tab` ([`scale_table`]): `N` keys at a time, each widened K vector
/// scaled once and met by every row, as the f16 form does.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `k + j·k_stride .. + d` must be readable for every
/// `j < nk ≤ KB`; `q` must hold rows `r0..r0+R` of `d` floats and `s` rows `r0..r0+R` of
/// `KB` floats; `tab` must hold the scales of those keys' `⌈d/32⌉` blocks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_rows<const R: usize, const N: usize>(
    q: &[f32],
    k: *const i8,
    k_stride: usize,
    nk: usize,
    s: &mut [f32],
    d: usize,
    r0: usize,
    ahead: Option<Ahead>,
    tab: &[f32; KB * MAX_BLOCKS],
) {
    debug_assert!(N <= 4);
    let d8 = d / 8 * 8;
    // SAFETY: by the contract, q's rows r0..r0+R, s's rows r0..r0+R (columns j..j+4 ≤ KB
    // for the vector store), keys j < nk (elements p < d) and the table's entries
    // (p/32)·KB + j with p < d, j < KB bound every access below.
    unsafe {
        let qp = q.as_ptr().add(r0 * d);
        let sp = s.as_mut_ptr().add(r0 * KB);
        let tp = tab.as_ptr();
        let mut j = 0;
        while j + N <= nk {
            if let Some(a) = ahead {
                for i in 0..N {
                    a.fetch(j + i);
                }
            }
            let mut acc = [[_mm256_setzero_ps(); R]; N];
            let mut p = 0;
            while p < d8 {
                let qv: [__m256; R] = core::array::from_fn(|r| _mm256_loadu_ps(qp.add(r * d + p)));
                let t = tp.add(p / BLOCK * KB + j);
                for (i, ai) in acc.iter_mut().enumerate() {
                    let raw = i8::load8(k.add((j + i) * k_stride + p));
                    let kv = _mm256_mul_ps(raw, _mm256_broadcast_ss(&*t.add(i)));
                    for (a, qr) in ai.iter_mut().zip(&qv) {
                        *a = _mm256_fmadd_ps(kv, *qr, *a);
                    }
                }
                p += 8;
            }
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
                    let sc = _mm256_broadcast_ss(&*tp.add(p / BLOCK * KB + j));
                    let kv = _mm256_mul_ps(i8::load8(k.add(j * k_stride + p)), sc);
                    acc = _mm256_fmadd_ps(kv, qv, acc);
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
                    let kx = (*k.add(j * k_stride + p)) as f32 * *tp.add(p / BLOCK * KB + j);
                    *sp.add(r * KB + j) += qx * kx;
                }
            }
        }
    }
}

/// [`Micro::pv_in_place`] over Q8_0 blocks (`q8`, `ds`: `b.v`'s data): per 32-column block
/// of V, the weights `p[r, j] · d[j]` once, then the f16 path's tiles over the raw values.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; keys `j0..j0 + nk` of head `g` must lie inside the
/// validated view; `p` must hold `rows · KB` floats, `o` `rows · dvp` with `dvp ≥ d_v`, and
/// `corr` `rows`.
#[inline(always)]
pub(super) unsafe fn pv_in_place(
    q8: &[i8],
    ds: &[f16],
    b: &Block<'_>,
    p: &[f32],
    o: &mut [f32],
    corr: &[f32],
) {
    let (rows, nk, dvp) = (b.rows, b.nk, b.dvp);
    let (dv, stride) = (b.v.dim, b.v.row_stride);
    let nb = dv.div_ceil(BLOCK);
    if nb > MAX_BLOCKS || rows > IN_PLACE_MAX_ROWS {
        return Scalar::pv_in_place(b, p, o, corr);
    }
    let dv8 = dv / 8 * 8;
    let mut tab = [0.0f32; KB * MAX_BLOCKS];
    let mut w = [0.0f32; IN_PLACE_MAX_ROWS * KB];
    // SAFETY: the view was validated and key j0 of head g lies inside it, so `base` is
    // inside `q8` and every key j < nk has d_v readable values from `base + j·stride`; `w`
    // holds `rows` rows of KB weights; the tiles cover rows below `rows` and columns below
    // dv8 ≤ dvp, as `pv_tile` requires.
    unsafe {
        scale_table(b.v, ds, b.j0, b.g, nk, nb, &mut tab);
        let base = q8.as_ptr().add(b.v.offset(b.j0, b.g));
        for blk in 0..nb {
            let (c0, c1) = (blk * BLOCK, ((blk + 1) * BLOCK).min(dv8));
            if c0 >= c1 {
                break;
            }
            let t = &tab[blk * KB..(blk + 1) * KB];
            for r in 0..rows {
                for c in (0..KB).step_by(8) {
                    let x = _mm256_mul_ps(
                        _mm256_loadu_ps(p.as_ptr().add(r * KB + c)),
                        _mm256_loadu_ps(t.as_ptr().add(c)),
                    );
                    _mm256_storeu_ps(w.as_mut_ptr().add(r * KB + c), x);
                }
            }
            let mut r0 = 0;
            while r0 < rows {
                let n = (rows - r0).min(6);
                // Tiles of R rows × 8·C columns with U accumulator sets inside this block.
                macro_rules! cols {
                    ($r:literal, $c:literal, $u:literal) => {{
                        let mut c = c0;
                        while c + 8 * $c <= c1 {
                            pv_tile::<i8, $r, $c, $u>(&w, base, stride, nk, o, corr, r0, c, dvp);
                            c += 8 * $c;
                        }
                        if c + 16 <= c1 {
                            pv_tile::<i8, $r, 2, $u>(&w, base, stride, nk, o, corr, r0, c, dvp);
                            c += 16;
                        }
                        if c < c1 {
                            pv_tile::<i8, $r, 1, $u>(&w, base, stride, nk, o, corr, r0, c, dvp);
                        }
                    }};
                }
                match n {
                    1 => cols!(1, 4, 2),
                    2 => cols!(2, 4, 1),
                    3 => cols!(3, 2, 2),
                    4 => cols!(4, 2, 1),
                    5 => cols!(5, 2, 1),
                    _ => cols!(6, 2, 1),
                }
                r0 += n;
            }
        }
        for r in 0..rows {
            for c in dv8..dv {
                let sc = &tab[c / BLOCK * KB..];
                let mut x = o[r * dvp + c] * corr[r];
                for j in 0..nk {
                    x += p[r * KB + j] * ((*base.add(j * stride + c)) as f32 * sc[j]);
                }
                o[r * dvp + c] = x;
            }
        }
    }
}

/// [`Micro::pack_kt`] over Q8_0 blocks: the raw values packed by the f16 path's code, then
/// each packed row `p` scaled by its block's scales.
///
/// # Safety
/// As `pack_kt_typed`: the CPU must have AVX2, FMA and F16C; keys `j0..j0 + nk` of head `g`
/// must lie inside the validated view, and `kt` must hold `d · KB` floats.
#[inline(always)]
pub(super) unsafe fn pack_kt(q8: &[i8], ds: &[f16], b: &Block<'_>, kt: &mut [f32]) {
    let d = b.k.dim;
    let nb = d.div_ceil(BLOCK);
    if nb > MAX_BLOCKS {
        return Scalar::pack_kt(b, kt);
    }
    let mut tab = [0.0f32; KB * MAX_BLOCKS];
    // SAFETY: this function's contract is pack_kt_typed's and scale_table's; the packed rows
    // hold KB floats each and the table KB per block.
    unsafe {
        pack_kt_typed(q8, b, kt);
        scale_table(b.k, ds, b.j0, b.g, b.nk, nb, &mut tab);
        for (p, row) in kt[..d * KB].chunks_exact_mut(KB).enumerate() {
            let t = &tab[p / BLOCK * KB..][..KB];
            for c in (0..KB).step_by(8) {
                let x = _mm256_mul_ps(
                    _mm256_loadu_ps(row.as_ptr().add(c)),
                    _mm256_loadu_ps(t.as_ptr().add(c)),
                );
                _mm256_storeu_ps(row.as_mut_ptr().add(c), x);
            }
        }
    }
}

/// [`Micro::pack_v`] over Q8_0 blocks: the raw values packed by the f16 path's code, then
/// each key's values scaled by its blocks' scales.
///
/// # Safety
/// As `pack_v_typed`: the CPU must have AVX2, FMA and F16C; `out` must hold `KB · dvp`
/// floats, `dvp ≥ d_v`.
#[inline(always)]
pub(super) unsafe fn pack_v(q8: &[i8], ds: &[f16], b: &Block<'_>, out: &mut [f32]) {
    let (dv, dvp) = (b.v.dim, b.dvp);
    let nb = dv.div_ceil(BLOCK);
    if nb > MAX_BLOCKS {
        return Scalar::pack_v(b, out);
    }
    let mut tab = [0.0f32; KB * MAX_BLOCKS];
    // SAFETY: as in `pack_kt`; the scaled elements c < dv of keys j < nk lie in `out`.
    unsafe {
        pack_v_typed(q8, b, out);
        scale_table(b.v, ds, b.j0, b.g, b.nk, nb, &mut tab);
        for j in 0..b.nk {
            let row = &mut out[j * dvp..j * dvp + dv];
            for (c, x) in row.iter_mut().enumerate() {
                *x *= tab[c / BLOCK * KB + j];
            }
        }
    }
}
