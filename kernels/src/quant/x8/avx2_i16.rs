//! Interleaved Q6_K and Q8_0 with 256-bit vectors, against 16-bit activations: the weights
//! are widened to 16-bit lanes once per column, two elements of each of the 8 rows per
//! vector ([`super::pair_byte`]), and each vector meets a broadcast pair of activations in
//! one `madd`: 16 exact products summed in pairs into 32-bit lanes, which cannot overflow
//! (at most 2·32767·128 per `madd`, and 16 of them per lane before the sums are scaled).
//! Six- and eight-bit weights would overflow the 16-bit sums of the 4-bit kernels'
//! `maddubs` against the byte split of 16-bit activations; against 8-bit ones they take
//! `avx2_byte.rs`'s kernels, and so does Q6_K against the byte split where `vpdpbusd`
//! sums into 32 bits (AVX-512 VNNI).

use super::ROWS;
use crate::quant::act::QuantizedActs;
use core::arch::x86_64::*;

/// How far ahead of the column being multiplied the group's bytes are prefetched.
const PREFETCH: usize = 1024;

/// The two 16-bit activations at `p` in every 32-bit lane.
///
/// # Safety
/// `p..p + 2` readable; AVX.
#[inline(always)]
unsafe fn pair(p: *const i16) -> __m256i {
    // SAFETY: the caller guarantees 2 readable i16 at `p`.
    unsafe { _mm256_set1_epi32(core::ptr::read_unaligned(p as *const i32)) }
}

/// Lane `r`: the exact dot product of 16 elements of row `r` of the weights (`w`, element
/// pairs in order) with the 16 activations at `x`.
///
/// # Safety
/// `x..x + 16` readable; AVX2.
#[inline(always)]
pub(super) unsafe fn dot16(w: &[__m256i; 8], x: *const i16) -> __m256i {
    // SAFETY: pairs 0..8 lie inside the caller's 16 activations.
    unsafe {
        let mut a = _mm256_madd_epi16(w[0], pair(x));
        let mut b = _mm256_madd_epi16(w[1], pair(x.add(2)));
        for p in (2..8).step_by(2) {
            a = _mm256_add_epi32(a, _mm256_madd_epi16(w[p], pair(x.add(2 * p))));
            b = _mm256_add_epi32(b, _mm256_madd_epi16(w[p + 1], pair(x.add(2 * p + 2))));
        }
        _mm256_add_epi32(a, b)
    }
}

/// The 8 rows' values `u` (0..=63) of Q6_K half-group at `hg` (96 bytes) as 4 vectors of
/// bytes, vector `v` holding elements `4v..4v + 4` at [`super::pair_byte`].
///
/// # Safety
/// `hg..hg + 96` readable; AVX2.
#[inline(always)]
pub(super) unsafe fn q6_k_values(hg: *const u8) -> [__m256i; 4] {
    // SAFETY: the caller's contract.
    unsafe {
        let load = |at: usize| _mm256_loadu_si256(hg.add(at) as *const __m256i);
        q6_k_join(load(0), load(32), load(64))
    }
}

/// The 4 vectors of 6-bit values from a half-group's three source vectors: `n0` and `n1`
/// (two vectors' low 4 bits each, in their low and high nibbles) and `top` (bits `2v`,
/// `2v + 1` of each byte: vector `v`'s top 2 bits). Every value's bits stay in their byte,
/// so the sources may first be reordered by any byte shuffle, the same for all three.
///
/// # Safety
/// AVX2.
#[inline(always)]
pub(super) unsafe fn q6_k_join(n0: __m256i, n1: __m256i, top: __m256i) -> [__m256i; 4] {
    // SAFETY: registers only; the caller has AVX2.
    unsafe {
        let (m4, m3) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        // Vector v: a nibble of n0 / n1, and bits 2v, 2v + 1 of `top` moved to bits 4–5.
        [
            _mm256_or_si256(
                _mm256_and_si256(n0, m4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(top), m3),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(n0), m4),
                _mm256_and_si256(_mm256_slli_epi16::<2>(top), m3),
            ),
            _mm256_or_si256(_mm256_and_si256(n1, m4), _mm256_and_si256(top, m3)),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(n1), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(top), m3),
            ),
        ]
    }
}

/// The 8 rows' values `u` (0..=63) of Q6_K half-group at `hg` (96 bytes), as element pairs
/// in 16-bit lanes: `u − 32` unless `RAW` (the caller then takes `32·Σx` off the sums).
///
/// # Safety
/// `hg..hg + 96` readable; AVX2.
#[inline(always)]
unsafe fn q6_k_pairs<const RAW: bool>(hg: *const u8) -> [__m256i; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        let v = q6_k_values(hg);
        let (zero, c32) = (_mm256_setzero_si256(), _mm256_set1_epi16(32));
        let mut w = [zero; 8];
        for (q, v) in v.into_iter().enumerate() {
            w[2 * q] = _mm256_unpacklo_epi8(v, zero);
            w[2 * q + 1] = _mm256_unpackhi_epi8(v, zero);
            if !RAW {
                w[2 * q] = _mm256_sub_epi16(w[2 * q], c32);
                w[2 * q + 1] = _mm256_sub_epi16(w[2 * q + 1], c32);
            }
        }
        w
    }
}

/// Q6_K: adds `x[i0 + i]·W[r]` (without bias) to lane `r` of `acc[i]` for `i < M`, over the
/// `ns` super-block columns (1680 bytes each) of the group at `col`. With `RAW` the weights
/// keep their offset of 32 and each half-group's sum takes `32·Σx` off, from
/// [`QuantizedActs::isum16`]: fewer instructions for one or two rows.
///
/// # Safety
/// AVX2, FMA, F16C; `col` holds `ns` columns; `acts` holds rows `i0..i0 + M` of `256·ns`
/// elements, with `isum16` when `RAW`.
#[inline(always)]
pub(super) unsafe fn q6_k<const M: usize, const RAW: bool>(
    col: *const u8,
    ns: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    let k = acts.k;
    debug_assert!(acts.m >= i0 + M && k == 256 * ns && (!RAW || !acts.isum16.is_empty()));
    // SAFETY: column s < ns lies inside `col` (the contract), half-group h < 16 inside its
    // column; rows i0 + i < m of k elements lie inside `acts.q`, their blocks inside
    // `acts.scale` and their half-blocks inside `acts.isum16` (when RAW); prefetches never
    // fault.
    unsafe {
        let (q, scale, isum16) = (acts.q.as_ptr(), acts.scale.as_ptr(), acts.isum16.as_ptr());
        for s in 0..ns {
            let base = col.add(s * 1680);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            for h in 0..16 {
                let hg = base.add(super::q6_k_half(h));
                _mm_prefetch::<_MM_HINT_T0>(hg.wrapping_add(PREFETCH) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(hg.wrapping_add(PREFETCH + 64) as *const i8);
                let w = q6_k_pairs::<RAW>(hg);
                let sc8 = _mm_loadl_epi64(base.add(16 + 8 * h) as *const __m128i);
                let sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)));
                for (i, acc) in acc.iter_mut().enumerate().take(M) {
                    let at = (i0 + i) * k + 256 * s + 16 * h;
                    let mut dot = dot16(&w, q.add(at));
                    if RAW {
                        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(32 * *isum16.add(at / 16)));
                    }
                    let xs = _mm256_set1_ps(*scale.add(at / 32));
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sc, xs), *acc);
                }
            }
        }
    }
}

/// Q8_0: as [`q6_k`] over the `nb` block columns (272 bytes each) of the group at `col`.
///
/// # Safety
/// AVX2, FMA, F16C; `col` holds `nb` columns; `acts` holds rows `i0..i0 + M` of `32·nb`
/// elements.
#[inline(always)]
pub(super) unsafe fn q8_0<const M: usize>(
    col: *const u8,
    nb: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    let k = acts.k;
    debug_assert!(acts.m >= i0 + M && k == 32 * nb);
    // SAFETY: column b < nb lies inside `col` (the contract); rows i0 + i < m of k elements
    // lie inside `acts.q` and their blocks inside `acts.scale`; prefetches never fault.
    unsafe {
        let (q, scale) = (acts.q.as_ptr(), acts.scale.as_ptr());
        for b in 0..nb {
            let base = col.add(b * 272);
            for c in 0..5 {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64 * c) as *const i8);
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            let mut dots = [_mm256_setzero_si256(); ROWS];
            for half in 0..2 {
                // Elements 16·half.. of each row: vectors 4·half..4·half + 4, each two
                // pairs, sign-extended to 16 bits (a byte doubled, shifted right by 8).
                let mut w = [_mm256_setzero_si256(); 8];
                for v in 0..4 {
                    let at = base.add(16 + 32 * (4 * half + v));
                    let bytes = _mm256_loadu_si256(at as *const __m256i);
                    w[2 * v] = _mm256_srai_epi16::<8>(_mm256_unpacklo_epi8(bytes, bytes));
                    w[2 * v + 1] = _mm256_srai_epi16::<8>(_mm256_unpackhi_epi8(bytes, bytes));
                }
                for (i, dot) in dots.iter_mut().enumerate().take(M) {
                    let at = (i0 + i) * k + 32 * b + 16 * half;
                    *dot = _mm256_add_epi32(*dot, dot16(&w, q.add(at)));
                }
            }
            for (i, (acc, dot)) in acc.iter_mut().zip(dots).enumerate().take(M) {
                let xs = _mm256_set1_ps(*scale.add(((i0 + i) * k) / 32 + b));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, xs), *acc);
            }
        }
    }
}
