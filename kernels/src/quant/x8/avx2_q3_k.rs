//! Interleaved Q3_K with 256-bit vectors. A column keeps each row's low 2 bits and its high
//! bit apart, as the file does ([`super::layout`]): for sub-block `g` of 32 (`g = 4h + j`)
//! and chunk `p`, bits `2j, 2j + 1` of low-bit chunk `(h, p)` and bit `g` of high-bit chunk
//! `p` make row `r`'s elements `4p..4p + 4` in its own 32-bit lane as `u = q + 4` (0..=7),
//! a few shifts and masks per 32 weights, once per column for every row of `x`.
//!
//! - **8-bit activations.** The values meet the bytes as Q6_K's do in `avx2_byte.rs`
//!   (`q6_k_half_dot`, `maddubs` or `vpdpbusd`; at most 4·2·7·127 = 7112 per 16-bit lane
//!   before the `madd` by the 16 elements' scale), the scales (−32..=31) apply per 16
//!   elements as integers, and the offset `4·sc·Σx` comes off per 16 elements from the
//!   activations' half-block sums. A block's integer sum stays below 2·16·4·127·32 < 2²⁴,
//!   exact in f32.
//! - **16-bit activations.** The values are widened to pairs of 16 bits less 4 and meet the
//!   activations in `madd` (at most 16·4·32767 per 16 elements), each 16 elements then
//!   scaled in f32 by `d·(sc − 32)` as Q6_K's 16-bit kernel does.
//!
//! Each row's sum takes the same steps at every height of tile, so its bits never depend on
//! the rows beside it.

use super::avx2_byte::{q6_k_half_dot, tile};
use super::avx2_i16::dot16;
use super::avx2_iq4::to_pairs;
use super::layout::{q3_k_high, q3_k_low};
use super::ROWS;
use crate::quant::act::QuantizedActs;
use core::arch::x86_64::*;

/// How far ahead of the column being multiplied the group's bytes are prefetched.
const PREFETCH: usize = 1024;

/// Bytes per column.
const COLUMN: usize = 880;

/// The 128 scales `sc − 32` of a column, numbered `8s + r` (sub-block `s` of 16, row `r`),
/// from its 96 bytes at 16 (see `layout::pack_six`).
///
/// # Safety
/// `base..base + 112` readable; AVX2.
#[inline(always)]
unsafe fn scales(base: *const u8) -> [i8; 128] {
    // SAFETY: the caller's contract.
    unsafe {
        let load = |at: usize| _mm256_loadu_si256(base.add(at) as *const __m256i);
        let (a, b, h) = (load(16), load(48), load(80));
        let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let c32 = _mm256_set1_epi8(32);
        // Values 0..32, 32..64, 64..96, 96..128: a low nibble of `a` or `b` (a high one for
        // the last two) and bits 0–1, 2–3, 4–5, 6–7 of `h` moved to bits 4–5.
        let parts = [
            _mm256_or_si256(
                _mm256_and_si256(a, m4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(h), m30),
            ),
            _mm256_or_si256(
                _mm256_and_si256(b, m4),
                _mm256_and_si256(_mm256_slli_epi16::<2>(h), m30),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(a), m4),
                _mm256_and_si256(h, m30),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(b), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(h), m30),
            ),
        ];
        let mut tab = [0i8; 128];
        for (i, v) in parts.into_iter().enumerate() {
            let at = tab.as_mut_ptr().add(32 * i) as *mut __m256i;
            _mm256_storeu_si256(at, _mm256_sub_epi8(v, c32));
        }
        tab
    }
}

/// The 8 rows' values `u = q + 4` of sub-block `g` (0..8) of the column at `base`: vector
/// `p` holds elements `4p..4p + 4` of row `r` in lane `r`.
///
/// # Safety
/// The column at `base` is whole; AVX2.
#[inline(always)]
unsafe fn values(base: *const u8, g: usize) -> [__m256i; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        let (h, j) = (g / 4, g % 4);
        let (m3, m4) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
        let count = |n: usize| _mm_cvtsi32_si128(n as i32);
        let mut u = [_mm256_setzero_si256(); 8];
        for (p, u) in u.iter_mut().enumerate() {
            let low = _mm256_loadu_si256(base.add(q3_k_low(h, p, 0)) as *const __m256i);
            let high = _mm256_loadu_si256(base.add(q3_k_high(p, 0)) as *const __m256i);
            // Shifts within 16-bit lanes: the masks keep only bits that stayed in their byte.
            let q2 = _mm256_and_si256(_mm256_srl_epi16(low, count(2 * j)), m3);
            let hb = if g >= 2 {
                _mm256_srl_epi16(high, count(g - 2))
            } else {
                _mm256_sll_epi16(high, count(2 - g))
            };
            *u = _mm256_or_si256(q2, _mm256_and_si256(hb, m4));
        }
        u
    }
}

/// Q3_K: adds `x[i0 + i]·W[r]` (without bias) to lane `r` of `acc[i]` for `i < M`, over the
/// `ns` super-block columns of the group at `col`; `i0` starts a tile of `M` rows of
/// [`QuantizedActs::bytes`].
///
/// # Safety
/// AVX2, FMA, F16C (and AVX-512 VNNI and VL with `VNNI`); `col` holds `ns` columns; `acts`
/// is at 8 bits with its tiles, rows of `256·ns` elements, and a tile of `M` rows at `i0`.
#[inline(always)]
pub(super) unsafe fn q3_k_bytes<const M: usize, const VNNI: bool>(
    col: *const u8,
    ns: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    debug_assert!(acts.m >= i0 + M && acts.k == 256 * ns && acts.has_tiles());
    let (tiles, meta) = tile(&acts.bytes, acts, i0);
    // SAFETY: column s < ns lies inside `col` (the contract), its chunks inside it; the
    // tile's entries (8s + g)·M + i < 8·ns·M lie inside the tiles; prefetches never fault.
    unsafe {
        let low16 = _mm256_set1_epi32(0xFFFF);
        for s in 0..ns {
            let base = col.add(s * COLUMN);
            for l in 0..COLUMN.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64 * l) as *const i8);
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            let tab = scales(base);
            for g in 0..8 {
                let u = values(base, g);
                // The 8 rows' scales of sub-blocks 2g and 2g + 1, sign-extended: with VNNI in
                // lane r, else in both 16-bit halves of lane r; `pair` holds 2g's in the low
                // half and 2g + 1's in the high one.
                let scale = |h: usize| {
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(tab.as_ptr().add(8 * h) as *const __m128i))
                };
                let (t0, t1) = (scale(2 * g), scale(2 * g + 1));
                let both = |t: __m256i| {
                    _mm256_or_si256(_mm256_and_si256(t, low16), _mm256_slli_epi32::<16>(t))
                };
                let sc = if VNNI { [t0, t1] } else { [both(t0), both(t1)] };
                let pair =
                    _mm256_or_si256(_mm256_and_si256(t0, low16), _mm256_slli_epi32::<16>(t1));
                for (i, acc) in acc.iter_mut().enumerate().take(M) {
                    let at = (8 * s + g) * M + i;
                    let (x, xm) = ((*tiles.add(at)).q.as_ptr() as *const u8, &*meta.add(at));
                    let mut dot = _mm256_setzero_si256();
                    for (hh, &sc) in sc.iter().enumerate() {
                        let half =
                            q6_k_half_dot::<VNNI>(&u[4 * hh..4 * hh + 4], x.add(16 * hh), sc);
                        dot = _mm256_add_epi32(dot, half);
                    }
                    // The values are q + 4: take 4·(sc·Σx) off per 16 elements, the two
                    // half-sums (each within ±2032) as the 16-bit halves of one lane.
                    let halves =
                        (xm.isum_lo as u32 & 0xFFFF) | ((xm.isum - xm.isum_lo) as u32) << 16;
                    let off = _mm256_madd_epi16(pair, _mm256_set1_epi32(halves as i32));
                    dot = _mm256_sub_epi32(dot, _mm256_slli_epi32::<2>(off));
                    let xs = _mm256_mul_ps(d, _mm256_set1_ps(xm.scale));
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), xs, *acc);
                }
            }
        }
    }
}

/// Q3_K against 16-bit activations ([`QuantizedActs::q`], no tiles): as [`q3_k_bytes`],
/// the values widened to pairs of 16 bits.
///
/// # Safety
/// AVX2, FMA, F16C; `col` holds `ns` columns; `acts` holds rows `i0..i0 + M` of `256·ns`
/// elements.
#[inline(always)]
pub(super) unsafe fn q3_k_wide<const M: usize>(
    col: *const u8,
    ns: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    let k = acts.k;
    debug_assert!(acts.m >= i0 + M && k == 256 * ns);
    // SAFETY: column s < ns lies inside `col` (the contract), its chunks inside it; rows
    // i0 + i < m of k elements lie inside `acts.q`, their blocks inside `acts.scale`;
    // prefetches never fault.
    unsafe {
        let (xq, scale) = (acts.q.as_ptr(), acts.scale.as_ptr());
        let (order, zero, c4) = (to_pairs(), _mm256_setzero_si256(), _mm256_set1_epi16(4));
        for s in 0..ns {
            let base = col.add(s * COLUMN);
            for l in 0..COLUMN.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64 * l) as *const i8);
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            let tab = scales(base);
            for g in 0..8 {
                let u = values(base, g);
                for hh in 0..2 {
                    let mut w = [zero; 8];
                    for v in 0..4 {
                        let t = _mm256_shuffle_epi8(u[4 * hh + v], order);
                        w[2 * v] = _mm256_sub_epi16(_mm256_unpacklo_epi8(t, zero), c4);
                        w[2 * v + 1] = _mm256_sub_epi16(_mm256_unpackhi_epi8(t, zero), c4);
                    }
                    let s8 = _mm_loadl_epi64(tab.as_ptr().add(8 * (2 * g + hh)) as *const __m128i);
                    let sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8)));
                    for (i, acc) in acc.iter_mut().enumerate().take(M) {
                        let at = (i0 + i) * k + 256 * s + 32 * g + 16 * hh;
                        let dot = dot16(&w, xq.add(at));
                        let xs = _mm256_set1_ps(*scale.add(at / 32));
                        *acc =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sc, xs), *acc);
                    }
                }
            }
        }
    }
}
