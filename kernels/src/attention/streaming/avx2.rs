//! AVX2 + FMA + F16C micro-kernels. Packed items (prefill) use 6×16 register tiles for
//! Q·Kᵀ and P·V and an 8×8 transpose to pack Kᵀ; in-place items (decode, ≤ 8 rows) score
//! 3 rows against 3 keys at a time and accumulate P·V in tiles of R rows × 8·C columns
//! (3×24 for SmolLM2's three query heads per KV head), reading the f16 or f32 cache
//! directly. The softmax uses a vector `exp`. Q8_0 blocks have their own forms in [`q8`].
use super::driver::{process_item, ProcessItem};
use super::micro::{commit, step, Block, Micro, Step};
use super::scratch::Scratch;
use super::{Ctx, Item, KB};
use crate::attention::{KvData, KvView};
use crate::simd::avx2::transpose8;
use crate::simd::avx2::{exp_nonpositive, hmax, hsum, Lane};
use core::arch::x86_64::*;

#[path = "avx2_q8.rs"]
mod q8;

/// The AVX2 micro-kernels. Every method needs AVX2, FMA and F16C: `Avx2` is named only by
/// `streaming::run`, which picks it after `has_avx2_fma_f16c()` returned true, and its
/// methods run only inside [`process_avx2`] and [`pack_block_avx2`], reached from there.
pub(super) struct Avx2;

impl ProcessItem for Avx2 {
    fn process(ctx: &Ctx<'_>, it: Item, sc: &mut Scratch) {
        // SAFETY: the CPU has AVX2, FMA and F16C (see `Avx2`).
        unsafe { process_avx2(ctx, it, sc) }
    }

    fn pack_block(b: &Block<'_>, kt: &mut [f32], vb: &mut [f32]) {
        // SAFETY: as in `process`.
        unsafe { pack_block_avx2(b, kt, vb) }
    }
}

/// [`process_item`] compiled with the AVX2 features, so the micro-kernels inline into it.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn process_avx2(ctx: &Ctx<'_>, it: Item, sc: &mut Scratch) {
    process_item::<Avx2>(ctx, it, sc)
}

/// Packs Kᵀ and V of block `b` with the AVX2 features.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_block_avx2(b: &Block<'_>, kt: &mut [f32], vb: &mut [f32]) {
    Avx2::pack_kt(b, kt);
    Avx2::pack_v(b, vb);
}

/// [`Micro::pack_kt`] for one element type (`data` is `b.k`'s slice).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; keys `j0..j0 + nk` of head `g` must lie inside
/// the validated view over `data`, and `kt` must hold `d · KB` floats.
#[inline(always)]
unsafe fn pack_kt_typed<T: Lane>(data: &[T], b: &Block<'_>, kt: &mut [f32]) {
    let (k, g, j0, nk) = (b.k, b.g, b.j0, b.nk);
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
            // SAFETY: rows j0+j..j0+j+8 < j0+nk lie in the view and p + 8 ≤ d, so each load
            // reads 8 elements of `data`; (p+t)·KB + j + 8 ≤ d·KB, so each store stays
            // inside `kt`; the caller has the features.
            unsafe {
                let rows: [__m256; 8] =
                    core::array::from_fn(|t| T::load8(data.as_ptr().add(base[t] + p)));
                let cols = transpose8(rows);
                for (t, c) in cols.iter().enumerate() {
                    _mm256_storeu_ps(ktp.add((p + t) * KB + j), *c);
                }
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

/// [`Micro::pack_v`] for one element type (`data` is `b.v`'s slice).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `out` must hold `KB · dvp` floats, `dvp ≥ d_v`.
#[inline(always)]
unsafe fn pack_v_typed<T: Lane>(data: &[T], b: &Block<'_>, out: &mut [f32]) {
    let (v, dvp) = (b.v, b.dvp);
    let dv = v.dim;
    let dv8 = dv / 8 * 8;
    for j in 0..b.nk {
        let src = &data[v.offset(b.j0 + j, b.g)..][..dv];
        let dst = &mut out[j * dvp..(j + 1) * dvp];
        let mut c = 0;
        while c < dv8 {
            // SAFETY: c + 8 ≤ dv ≤ dvp, inside both rows (sliced above); the caller has the
            // features.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(c), T::load8(src.as_ptr().add(c))) };
            c += 8;
        }
        for c in dv8..dv {
            dst[c] = src[c].to_f32();
        }
        dst[dv..].fill(0.0);
    }
    out[b.nk * dvp..KB * dvp].fill(0.0);
}

/// Scores for rows `r0..r0+R`, all KB columns.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `q` must hold rows `r0..r0+R` of `d` floats, `kt`
/// `d · KB` floats and `s` rows `r0..r0+R` of `KB` floats.
#[inline(always)]
unsafe fn scores_tile<const R: usize>(q: &[f32], kt: &[f32], s: &mut [f32], r0: usize, d: usize) {
    // SAFETY: by the contract, every offset below stays inside its slice: q rows
    // r0..r0+R of d, kt's p < d rows of KB with c + 16 ≤ KB, s rows r0..r0+R of KB.
    unsafe {
        let qp = q.as_ptr().add(r0 * d);
        let kp = kt.as_ptr();
        let sp = s.as_mut_ptr().add(r0 * KB);
        let mut c = 0;
        while c < KB {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for p in 0..d {
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
}

/// P·V for rows `r0..r0+R`, `V` columns `c..c+8·C`: `V` row `j < nk` starts at
/// `v + j·v_stride` (packed f32 blocks, or the cache itself). Keys alternate between `U`
/// sets of accumulators, summed at the end: each accumulator takes one FMA per key, so
/// with few rows `U = 2` doubles the independent chains that hide the FMA latency.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `v + j·v_stride + c .. + 8·C` must be readable for
/// every `j < nk`; `p` must hold rows `r0..r0+R` of `KB` floats, `o` rows `r0..r0+R` of
/// `dvp` floats with `c + 8·C ≤ dvp`, and `corr` rows `r0..r0+R`.
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
    // SAFETY: by the contract, the loads and stores of `o` (rows r0..r0+R, columns
    // c..c+8·C ≤ dvp), of `p` (rows r0..r0+R of KB) and of V (keys j < nk) are in bounds.
    unsafe {
        let mut acc = [[[_mm256_setzero_ps(); C]; R]; U];
        for (r, a) in acc[0].iter_mut().enumerate() {
            let cr = _mm256_set1_ps(corr[r0 + r]);
            for (x, av) in a.iter_mut().enumerate() {
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
}

/// One key of [`pv_tile`]: `a[r] += p[r·KB + j] · vrow[..8·C]` for every row `r`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `vrow` must have `8·C` readable elements and `p`
/// `R` rows of `KB` floats, `j < KB`.
#[inline(always)]
unsafe fn pv_key<T: Lane, const R: usize, const C: usize>(
    a: &mut [[__m256; C]; R],
    p: *const f32,
    vrow: *const T,
    j: usize,
) {
    // SAFETY: the contract covers every load below.
    unsafe {
        let vv: [__m256; C] = core::array::from_fn(|x| T::load8(vrow.add(8 * x)));
        for (r, ar) in a.iter_mut().enumerate() {
            let pb = _mm256_broadcast_ss(&*p.add(r * KB + j));
            for (acc, vx) in ar.iter_mut().zip(&vv) {
                *acc = _mm256_fmadd_ps(pb, *vx, *acc);
            }
        }
    }
}

/// Where the V rows of the keys being scored lie: decode items prefetch them while the
/// scores are computed, so that memory keeps streaming through the scores and the `P·V`
/// sweeps that follow find V in cache. (Before, the sweeps met V in memory one row per key
/// after the scores had left the memory idle, 10–25% slower in cache-cold decode calls.)
/// Prefetching the next block's K as well gained nothing.
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
            KvData::Q8_0 { q, .. } => (q.as_ptr().cast::<u8>(), 1),
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
///
/// # Safety
/// The CPU must have AVX.
#[inline(always)]
unsafe fn hsum4(a: [__m256; 4]) -> __m128 {
    // SAFETY: register-only intrinsics; the caller has the features.
    unsafe {
        let t0 = _mm256_hadd_ps(a[0], a[1]);
        let t1 = _mm256_hadd_ps(a[2], a[3]);
        let t = _mm256_hadd_ps(t0, t1);
        _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t))
    }
}

/// Scores of rows `r0..r0+R` against `nk` keys read in place: key `j` starts at
/// `k + j·k_stride`. `N` keys at a time share each widened K vector and each load of Q
/// (`R·N` accumulators, `R` Q vectors and one K vector fit the 16 registers for R = N = 3);
/// each row's `N` dot products are reduced across lanes together and stored as one vector.
/// Elements past the last multiple of 8 of `d` are added in a scalar pass at the end.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `k + j·k_stride .. + d` must be readable for every
/// `j < nk ≤ KB`; `q` must hold rows `r0..r0+R` of `d` floats and `s` rows `r0..r0+R` of
/// `KB` floats.
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
    // SAFETY: by the contract, q's rows r0..r0+R (d floats each), s's rows r0..r0+R (KB
    // floats each, columns j..j+4 ≤ KB for the vector store) and keys j < nk (elements
    // p < d) bound every access below.
    unsafe {
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
}

/// [`Micro::scores_in_place`] for one element type (`data` is `b.k`'s slice).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; keys `j0..j0 + nk` of head `g` must lie inside the
/// validated view over `data`; `q` must hold `rows · d` floats and `s` `rows · KB`.
#[inline(always)]
unsafe fn scores_in_place_typed<T: Lane>(
    data: &[T],
    b: &Block<'_>,
    ahead: Ahead,
    q: &[f32],
    s: &mut [f32],
) {
    let (rows, d) = (b.rows, b.d);
    // Only the first sweep over the keys prefetches.
    let mut ahead = Some(ahead);
    // SAFETY: key j0 of head g is inside the view, so its offset is inside `data`; rows
    // of 3 (then 1 or 2) below `rows` and keys j0..j0+nk meet the contract of
    // `scores_in_place_rows`, as this function's contract gives.
    unsafe {
        let (base, stride) = (data.as_ptr().add(b.k.offset(b.j0, b.g)), b.k.row_stride);
        let mut r0 = 0;
        while r0 + 3 <= rows {
            scores_in_place_rows::<T, 3, 3>(q, base, stride, b.nk, s, d, r0, ahead.take());
            r0 += 3;
        }
        match rows - r0 {
            0 => {}
            1 => scores_in_place_rows::<T, 1, 4>(q, base, stride, b.nk, s, d, r0, ahead),
            _ => scores_in_place_rows::<T, 2, 4>(q, base, stride, b.nk, s, d, r0, ahead),
        }
    }
}

/// [`Micro::pv_in_place`] for one element type (`data` is `b.v`'s slice): tiles of R rows ×
/// 8·C columns chosen by the row count (1×32 up to 6×16), then 16 columns, then 8, then the
/// columns past the last multiple of 8 in scalar code.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; keys `j0..j0 + nk` of head `g` must lie inside the
/// validated view over `data`; `p` must hold `rows · KB` floats, `o` `rows · dvp` with
/// `dvp ≥ d_v`, and `corr` `rows`.
#[inline(always)]
unsafe fn pv_in_place_typed<T: Lane>(
    data: &[T],
    b: &Block<'_>,
    p: &[f32],
    o: &mut [f32],
    corr: &[f32],
) {
    let (rows, nk, dvp) = (b.rows, b.nk, b.dvp);
    let (dv, stride) = (b.v.dim, b.v.row_stride);
    let dv8 = dv / 8 * 8;
    // SAFETY: key j0 of head g is inside the view, so `base` is inside `data`, and every
    // key j < nk has d_v readable elements from `base + j·stride`; the tiles cover rows
    // below `rows` and columns below dv8 ≤ dvp, as `pv_tile` requires.
    unsafe {
        let base = data.as_ptr().add(b.v.offset(b.j0, b.g));
        // The block's V rows were prefetched while its scores were computed
        // (`scores_in_place`), so the tiles' sweeps find them in cache.
        let mut r0 = 0;
        while r0 < rows {
            let n = (rows - r0).min(6);
            // Tiles of R rows × 8·C columns with U accumulator sets, chosen so that the
            // main tile has at least 8 independent FMA chains (R·C·U) and still fits the
            // 16 registers; the last 16 or 8 columns take narrower tiles.
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

/// [`scores_tile`] with the arguments in [`by_rows`]' order.
///
/// # Safety
/// As [`scores_tile`].
#[inline(always)]
unsafe fn scores_rows<const R: usize>(q: &[f32], kt: &[f32], s: &mut [f32], d: usize, r0: usize) {
    // SAFETY: the same contract.
    unsafe { scores_tile::<R>(q, kt, s, r0, d) }
}

/// Packed P·V for rows `r0..r0+R`, every column: tiles of 16 columns, then 8.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `p` must hold rows `r0..r0+R` of `KB` floats, `v`
/// `KB · dvp`, `o` rows `r0..r0+R` of `dvp`, `corr` rows `r0..r0+R`; `dvp` is a multiple
/// of 8.
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
    // SAFETY: packed V has KB rows of dvp floats, so every key j < KB has the tile's
    // columns c..c+16 (or c+8) ≤ dvp readable; the rest is this function's contract.
    unsafe {
        while c + 16 <= dvp {
            pv_tile::<f32, R, 2, 1>(p, v.as_ptr(), dvp, KB, o, corr, r0, c, dvp);
            c += 16;
        }
        if c < dvp {
            pv_tile::<f32, R, 1, 1>(p, v.as_ptr(), dvp, KB, o, corr, r0, c, dvp);
        }
    }
}

/// The largest score of a row of `KB`, ignoring NaN, and whether the row holds a NaN:
/// `_mm256_max_ps` drops a NaN operand, so NaN is looked for apart, one unordered compare
/// per pair of vectors.
///
/// # Safety
/// The CPU must have AVX; `rp` must point to `KB` readable floats.
#[inline(always)]
unsafe fn row_max_avx(rp: *const f32) -> (f32, bool) {
    // SAFETY: c + 16 ≤ KB, so both loads are inside the row; the caller has the features.
    unsafe {
        let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut nan = _mm256_setzero_ps();
        for c in (0..KB).step_by(16) {
            let a = _mm256_loadu_ps(rp.add(c));
            let b = _mm256_loadu_ps(rp.add(c + 8));
            mx = _mm256_max_ps(mx, _mm256_max_ps(a, b));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, b));
        }
        (hmax(mx), _mm256_movemask_ps(nan) != 0)
    }
}

impl Micro for Avx2 {
    #[inline(always)]
    fn softcap(s: &mut [f32], cap: f32) {
        // SAFETY: the CPU has the features (see `Avx2`); the body bounds its own accesses.
        unsafe { crate::activation::avx2::softcap_body(s, cap) }
    }

    #[inline(always)]
    fn pack_kt(b: &Block<'_>, kt: &mut [f32]) {
        // SAFETY: the CPU has the features (see `Avx2`); the driver passes blocks of keys
        // inside the validated view and a scratch `kt` of d·KB floats.
        unsafe {
            match b.k.data {
                KvData::F32(x) => pack_kt_typed(x, b, kt),
                KvData::F16(x) => pack_kt_typed(x, b, kt),
                KvData::Q8_0 { q, d } => q8::pack_kt(q, d, b, kt),
            }
        }
    }

    #[inline(always)]
    fn pack_v(b: &Block<'_>, out: &mut [f32]) {
        // SAFETY: the CPU has the features (see `Avx2`); `out` is the driver's KB·dvp
        // scratch (bounds are checked by the slicing inside).
        unsafe {
            match b.v.data {
                KvData::F32(x) => pack_v_typed(x, b, out),
                KvData::F16(x) => pack_v_typed(x, b, out),
                KvData::Q8_0 { q, d } => q8::pack_v(q, d, b, out),
            }
        }
    }

    #[inline(always)]
    fn scores(q: &[f32], kt: &[f32], s: &mut [f32], rows: usize, d: usize) {
        debug_assert!(q.len() >= rows * d && kt.len() >= d * KB && s.len() >= rows * KB);
        // SAFETY: the CPU has the features (see `Avx2`); the driver's scratch holds `rows`
        // query rows of d, d·KB packed keys and `rows` score rows of KB.
        unsafe { by_rows!(rows, scores_rows, q, kt, s, d) }
    }

    #[inline(always)]
    fn softmax_update(s: &mut [f32], m: &mut [f32], l: &mut [f32], corr: &mut [f32], rows: usize) {
        for r in 0..rows {
            let row = &mut s[r * KB..(r + 1) * KB];
            let rp = row.as_mut_ptr();
            // SAFETY: the CPU has the features (see `Avx2`); the row holds KB floats.
            let (block_max, nan) = unsafe { row_max_avx(rp) };
            let st = step(m[r], block_max, nan);
            let sum = match st {
                // SAFETY: as above; c + 8 ≤ KB. No NaN here, every score is ≤ m_new.
                Step::Max(m_new) => unsafe {
                    let mv = _mm256_set1_ps(m_new);
                    let mut sum = _mm256_setzero_ps();
                    for c in (0..KB).step_by(8) {
                        let e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(rp.add(c)), mv));
                        _mm256_storeu_ps(rp.add(c), e);
                        sum = _mm256_add_ps(sum, e);
                    }
                    hsum(sum)
                },
                _ => 0.0,
            };
            commit(st, sum, row, m, l, corr, r);
        }
    }

    #[inline(always)]
    fn pv(p: &[f32], v: &[f32], o: &mut [f32], corr: &[f32], rows: usize, dvp: usize) {
        debug_assert!(p.len() >= rows * KB && v.len() >= KB * dvp && o.len() >= rows * dvp);
        // SAFETY: the CPU has the features (see `Avx2`); the driver's scratch holds `rows`
        // rows of KB probabilities and of dvp accumulators, and KB·dvp packed values.
        unsafe { by_rows!(rows, pv_rows, p, v, o, corr, dvp) }
    }

    #[inline(always)]
    fn scores_in_place(b: &Block<'_>, q: &[f32], s: &mut [f32]) {
        debug_assert!(b.j0 + b.nk <= b.k.rows && q.len() >= b.rows * b.d && s.len() >= b.rows * KB);
        let ahead = Ahead::rows_of(b.v, b.j0, b.g);
        // SAFETY: the CPU has the features (see `Avx2`); keys j0..j0+nk of head g lie
        // inside the validated view (the driver visits only keys below tk), and the
        // scratch holds `rows` query rows of d and score rows of KB.
        unsafe {
            match b.k.data {
                KvData::F32(x) => scores_in_place_typed(x, b, ahead, q, s),
                KvData::F16(x) => scores_in_place_typed(x, b, ahead, q, s),
                KvData::Q8_0 { q: kq, d } => q8::scores_in_place(kq, d, b, ahead, q, s),
            }
        }
    }

    #[inline(always)]
    fn pv_in_place(b: &Block<'_>, p: &[f32], o: &mut [f32], corr: &[f32]) {
        debug_assert!(
            b.j0 + b.nk <= b.v.rows && p.len() >= b.rows * KB && o.len() >= b.rows * b.dvp
        );
        // SAFETY: as in `scores_in_place`, for V and the accumulators.
        unsafe {
            match b.v.data {
                KvData::F32(x) => pv_in_place_typed(x, b, p, o, corr),
                KvData::F16(x) => pv_in_place_typed(x, b, p, o, corr),
                KvData::Q8_0 { q, d } => q8::pv_in_place(q, d, b, p, o, corr),
            }
        }
    }
}
