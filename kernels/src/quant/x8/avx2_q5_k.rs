//! Interleaved Q5_K with 256-bit vectors. A column is Q4_K's with the fifth bits after it
//! ([`super::layout`]): for group `g` of 32 and chunk `p`, a nibble of Q4_K's chunk
//! `(g / 2, p)` and bit `g` of fifth-bit chunk `p` make row `r`'s elements `4p..4p + 4` in
//! its own 32-bit lane as `q` (0..=31), a few shifts and masks per 32 weights, once per
//! column for every row of `x`.
//!
//! - **8-bit activations.** `maddubs` meets the values (unsigned) with the bytes: 4 of them
//!   add into 16-bit lanes (at most 4·2·31·127 = 31496), widened by a `madd` with ones, two
//!   such sums per group; with AVX-512 VNNI, `vpdpbusd` adds each lane's 4 products into 32
//!   bits.
//! - **16-bit activations.** The values are widened to pairs of 16 bits and meet the
//!   activations in `madd` (at most 32·31·32767 < 2³¹ per group), as Q8_0's 16-bit kernel.
//!
//! A group then adds `float(Σ q·x)·(d·sc·xs)` and takes `dmin·mn·Σx` off, in Q4_K's order,
//! with the same steps at every height of tile, so a row's bits never depend on the rows
//! beside it.

use super::avx2_byte::{splat4, tile};
use super::avx2_i16::dot16;
use super::avx2_iq4::to_pairs;
use super::avx2_parts::k_scales;
use super::layout::q5_k_high;
use super::{q4_k_chunk, ROWS};
use crate::quant::act::QuantizedActs;
use core::arch::x86_64::*;

/// How far ahead of the column being multiplied the group's bytes are prefetched.
const PREFETCH: usize = 1024;

/// Bytes per column.
const COLUMN: usize = 1408;

/// The 8 rows' values `q` (0..=31) of group `g` (0..8) of the column at `base`: vector `p`
/// holds elements `4p..4p + 4` of row `r` in lane `r`.
///
/// # Safety
/// The column at `base` is whole; AVX2.
#[inline(always)]
unsafe fn values(base: *const u8, g: usize) -> [__m256i; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        let (m4, m16) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
        let count = |n: usize| _mm_cvtsi32_si128(n as i32);
        let mut q = [_mm256_setzero_si256(); 8];
        for (p, q) in q.iter_mut().enumerate() {
            let low = _mm256_loadu_si256(base.add(q4_k_chunk(g / 2, p, 0)) as *const __m256i);
            let high = _mm256_loadu_si256(base.add(q5_k_high(p, 0)) as *const __m256i);
            // Shifts within 16-bit lanes: the masks keep only bits that stayed in their byte.
            let nib = _mm256_and_si256(_mm256_srl_epi16(low, count(4 * (g % 2))), m4);
            let fifth = if g >= 4 {
                _mm256_srl_epi16(high, count(g - 4))
            } else {
                _mm256_sll_epi16(high, count(4 - g))
            };
            *q = _mm256_or_si256(nib, _mm256_and_si256(fifth, m16));
        }
        q
    }
}

/// Q5_K: adds `x[i0 + i]·W[r]` (without bias) to lane `r` of `acc[i]` for `i < M`, over the
/// `ns` super-block columns of the group at `col`; `i0` starts a tile of `M` rows of
/// [`QuantizedActs::bytes`].
///
/// # Safety
/// AVX2, FMA, F16C (and AVX-512 VNNI and VL with `VNNI`); `col` holds `ns` columns; `acts`
/// is at 8 bits with its tiles, rows of `256·ns` elements, and a tile of `M` rows at `i0`.
#[inline(always)]
pub(super) unsafe fn q5_k_bytes<const M: usize, const VNNI: bool>(
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
        let ones = _mm256_set1_epi16(1);
        for s in 0..ns {
            let base = col.add(s * COLUMN);
            for l in 0..COLUMN.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64 * l) as *const i8);
            }
            let (sc, mn) = k_scales(base);
            for g in 0..8 {
                let q = values(base, g);
                for (i, acc) in acc.iter_mut().enumerate().take(M) {
                    let at = (8 * s + g) * M + i;
                    let (x, xm) = ((*tiles.add(at)).q.as_ptr() as *const u8, &*meta.add(at));
                    let dot = if VNNI {
                        let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                        for v in (0..8).step_by(2) {
                            s0 = _mm256_dpbusd_epi32(s0, q[v], splat4(x.add(4 * v)));
                            s1 = _mm256_dpbusd_epi32(s1, q[v + 1], splat4(x.add(4 * v + 4)));
                        }
                        _mm256_add_epi32(s0, s1)
                    } else {
                        let mut half = [_mm256_setzero_si256(); 2];
                        for (hh, h) in half.iter_mut().enumerate() {
                            for (v, &q) in q.iter().enumerate().skip(4 * hh).take(4) {
                                let p = _mm256_maddubs_epi16(q, splat4(x.add(4 * v)));
                                *h = _mm256_add_epi16(*h, p);
                            }
                        }
                        _mm256_add_epi32(
                            _mm256_madd_epi16(half[0], ones),
                            _mm256_madd_epi16(half[1], ones),
                        )
                    };
                    let xs = _mm256_mul_ps(sc[g], _mm256_set1_ps(xm.scale));
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), xs, *acc);
                    *acc = _mm256_fnmadd_ps(mn[g], _mm256_set1_ps(xm.sum), *acc);
                }
            }
        }
    }
}

/// Q5_K against 16-bit activations ([`QuantizedActs::q`], no tiles): as [`q5_k_bytes`], the
/// values widened to pairs of 16 bits.
///
/// # Safety
/// AVX2, FMA, F16C; `col` holds `ns` columns; `acts` holds rows `i0..i0 + M` of `256·ns`
/// elements.
#[inline(always)]
pub(super) unsafe fn q5_k_wide<const M: usize>(
    col: *const u8,
    ns: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    let k = acts.k;
    debug_assert!(acts.m >= i0 + M && k == 256 * ns);
    // SAFETY: column s < ns lies inside `col` (the contract), its chunks inside it; rows
    // i0 + i < m of k elements lie inside `acts.q`, their blocks inside `acts.scale` and
    // `acts.sum`; prefetches never fault.
    unsafe {
        let (xq, scale, sum) = (acts.q.as_ptr(), acts.scale.as_ptr(), acts.sum.as_ptr());
        let (order, zero) = (to_pairs(), _mm256_setzero_si256());
        for s in 0..ns {
            let base = col.add(s * COLUMN);
            for l in 0..COLUMN.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64 * l) as *const i8);
            }
            let (sc, mn) = k_scales(base);
            for g in 0..8 {
                let q = values(base, g);
                // Elements 0..16 and 16..32 as 8 vectors of pairs each.
                let mut w = [[zero; 8]; 2];
                for (v, &q) in q.iter().enumerate() {
                    let t = _mm256_shuffle_epi8(q, order);
                    w[v / 4][2 * (v % 4)] = _mm256_unpacklo_epi8(t, zero);
                    w[v / 4][2 * (v % 4) + 1] = _mm256_unpackhi_epi8(t, zero);
                }
                for (i, acc) in acc.iter_mut().enumerate().take(M) {
                    let at = (i0 + i) * k + 256 * s + 32 * g;
                    let dot =
                        _mm256_add_epi32(dot16(&w[0], xq.add(at)), dot16(&w[1], xq.add(at + 16)));
                    let xs = _mm256_mul_ps(sc[g], _mm256_set1_ps(*scale.add(at / 32)));
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), xs, *acc);
                    *acc = _mm256_fnmadd_ps(mn[g], _mm256_set1_ps(*sum.add(at / 32)), *acc);
                }
            }
        }
    }
}
