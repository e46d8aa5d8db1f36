//! AVX2 + FMA + F16C micro-kernels. Packed items (prefill) use 6×16 register tiles for
//! Q·Kᵀ and P·V and an 8×8 transpose to pack Kᵀ; in-place items (decode, ≤ 8 rows) score
//! 3 rows against 3 keys at a time and accumulate P·V in tiles of R rows × 8·C columns
//! (3×24 for SmolLM2's three query heads per KV head), reading the f16 or f32 cache
//! directly. The softmax uses a vector `exp`.
use super::micro::Micro;
use super::scratch::Scratch;
use super::{process_item, Ctx, Item, ProcessItem, KB};
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
unsafe fn scores_tile<const R: usize>(q: &[f32], kt: &[f32], s: &mut [f32], r0: usize, d: usize) {
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
unsafe fn scores_rows<const R: usize>(q: &[f32], kt: &[f32], s: &mut [f32], d: usize, r0: usize) {
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
    fn softcap(s: &mut [f32], cap: f32) {
        // SAFETY: see `pack_kt`.
        unsafe { crate::activation::avx2::softcap_body(s, cap) }
    }

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
    fn softmax_update(s: &mut [f32], m: &mut [f32], l: &mut [f32], corr: &mut [f32], rows: usize) {
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
