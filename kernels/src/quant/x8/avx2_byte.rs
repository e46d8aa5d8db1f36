//! Interleaved Q6_K and Q8_0 with 256-bit vectors, against 8-bit activations
//! ([`QuantizedActs::bytes`]): the weights stay bytes and meet 4 activations broadcast to
//! every 32-bit lane in one `maddubs` (32 byte products, summed in pairs into 16-bit lanes).
//! Where the CPU has AVX-512 VNNI, Q6_K also meets 16-bit activations here, as their byte
//! split ([`q6_k_split`]).
//!
//! The layout keeps two elements of each of two rows per 32-bit lane ([`super::pair_byte`],
//! what the 16-bit kernels widen); here one `pshufb` per vector of weights, once per column
//! for all the rows of `x` that meet it, moves each row's 4 elements into its own 32-bit
//! lane (row `r` in lane `r`), so that a lane's two 16-bit sums belong to one row.
//!
//! Bounds, per 16-bit lane of a `maddubs` (two products, activations within ±127):
//! - Q6_K's values `u = q + 32` are 0..=63, unsigned as `maddubs` takes its first operand:
//!   at most 2·63·127 = 16002 in magnitude, so two such sums added in 16 bits stay within
//!   32004 < 32767. Each pair of sums is widened by one `madd` against the 16 elements'
//!   scale (a signed byte: at most 2·32004·128 = 8193024 per 32-bit lane, 4 of them per
//!   block of 32), and the offset `32·Σx` comes off per 16 elements, times the scale, from
//!   the activations' half-block sums ([`TileMeta::isum_lo`], `|Σ| ≤ 16·127 = 2032`).
//! - Q8_0's weights are signed: `maddubs` meets their magnitudes (at most 128, unsigned)
//!   with the activations given the weights' signs (`sign_epi8`: negated where the weight
//!   is negative, zero where it is zero), the same products. A pair reaches 2·128·127 =
//!   32512, so every `maddubs` is widened at once by a `madd` with ones.
//!
//! Q8_0 gains less from 8 bits than Q6_K: its `madd` per `maddubs` leaves as many multiplies
//! per product as the 16-bit kernel's (widening its sums with shifts instead was slower).
//! For one row of `x` both kernels are bound by the count of vector instructions per
//! weight vector, not by memory: Q6_K spends about a third of its time taking the 6-bit
//! values apart, Q8_0 needs 6 per vector (shuffle, `abs`, `sign`, `maddubs`, `madd`, add).
//!
//! Where the CPU has AVX-512 VNNI, the `VNNI` variants take `vpdpbusd`, which sums each
//! lane's 4 byte products straight into 32 bits: Q6_K's half-group then needs 4 of them
//! and one 32-bit multiply by the scales (against 4 `maddubs`, 3 adds and 2 `madd`), Q8_0
//! one per vector in place of `maddubs`, `madd` and add.

use super::avx2_i16::{q6_k_join, q6_k_values};
use super::ROWS;
use crate::quant::act::{QuantizedActs, SplitBlock, TileMeta};
use core::arch::x86_64::*;

/// How far ahead of the column being multiplied the group's bytes are prefetched.
const PREFETCH: usize = 1024;

/// The 4 bytes at `p` in every 32-bit lane.
///
/// # Safety
/// `p..p + 4` readable; AVX.
#[inline(always)]
pub(super) unsafe fn splat4(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at `p`.
    unsafe { _mm256_set1_epi32(core::ptr::read_unaligned(p as *const i32)) }
}

/// The `pshufb` control that moves a vector of [`super::pair_byte`]'s layout (per 128-bit
/// half: rows' first two elements, row by row, then their next two) to 4 consecutive
/// elements per row: byte `4r + e` of a half takes byte `8·(e / 2) + 2r + e % 2`.
///
/// # Safety
/// AVX.
#[inline(always)]
unsafe fn rows4() -> __m256i {
    // SAFETY: registers only.
    unsafe {
        _mm256_setr_epi8(
            0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15, 0, 1, 8, 9, 2, 3, 10, 11, 4, 5,
            12, 13, 6, 7, 14, 15,
        )
    }
}

/// The tile of activations of the `M` rows starting at `i0`: its blocks in `blocks` (the
/// bytes, or the byte split) and its meta.
pub(super) fn tile<B>(
    blocks: &[B],
    acts: &QuantizedActs,
    i0: usize,
) -> (*const B, *const TileMeta) {
    let at = acts.tile_at(i0, 0);
    (
        blocks.as_ptr().wrapping_add(at),
        acts.tile_meta.as_ptr().wrapping_add(at),
    )
}

/// Q6_K: adds `x[i0 + i]·W[r]` (without bias) to lane `r` of `acc[i]` for `i < M`, over the
/// `ns` super-block columns (1680 bytes each) of the group at `col`; `i0` starts a tile of
/// `M` rows of [`QuantizedActs::bytes`].
///
/// # Safety
/// AVX2, FMA, F16C; `col` holds `ns` columns; `acts` is at 8 bits with its tiles, rows of
/// `256·ns` elements, and a tile of `M` rows at `i0`.
#[inline(always)]
pub(super) unsafe fn q6_k<const M: usize, const VNNI: bool>(
    col: *const u8,
    ns: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    debug_assert!(acts.m >= i0 + M && acts.k == 256 * ns && acts.has_tiles());
    if M == 1 {
        // SAFETY: the same contract.
        unsafe { q6_k_one::<VNNI>(col, ns, acts, i0, &mut acc[0]) };
        return;
    }
    let (tiles, meta) = tile(&acts.bytes, acts, i0);
    // SAFETY: column s < ns lies inside `col` (the contract), half-group h < 16 inside its
    // column; the tile's entries (8s + g)·M + i < 8·ns·M lie inside the tiles; prefetches
    // never fault.
    unsafe {
        let order = rows4();
        let low16 = _mm256_set1_epi32(0xFFFF);
        for s in 0..ns {
            let base = col.add(s * 1680);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            for g in 0..8 {
                // Block g of the activations: half-groups 2g and 2g + 1, 4 vectors each.
                let mut u = [_mm256_setzero_si256(); 8];
                for hh in 0..2 {
                    let hg = base.add(super::q6_k_half(2 * g + hh));
                    _mm_prefetch::<_MM_HINT_T0>(hg.wrapping_add(PREFETCH) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(hg.wrapping_add(PREFETCH + 64) as *const i8);
                    for (q, v) in q6_k_values(hg).into_iter().enumerate() {
                        u[4 * hh + q] = _mm256_shuffle_epi8(v, order);
                    }
                }
                // The 8 rows' scales of the two half-groups, sign-extended: `sc[hh]` holds
                // the scale in both 16-bit halves of lane r, `pair` scale 2g low, 2g + 1 high.
                let scale = |h: usize| {
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(base.add(16 + 8 * h) as *const __m128i))
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
                    // The stored values are q + 32: take 32·(sc·Σx) off per half-group, the
                    // two half-sums (each within ±2032) as the 16-bit halves of one lane.
                    let halves =
                        (xm.isum_lo as u32 & 0xFFFF) | ((xm.isum - xm.isum_lo) as u32) << 16;
                    let off = _mm256_madd_epi16(pair, _mm256_set1_epi32(halves as i32));
                    dot = _mm256_sub_epi32(dot, _mm256_slli_epi32::<5>(off));
                    let xs = _mm256_mul_ps(d, _mm256_set1_ps(xm.scale));
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), xs, *acc);
                }
            }
        }
    }
}

/// Q6_K's values `u` of half-group `hg` (as [`q6_k_values`]) with each row's 4 elements in
/// its own 32-bit lane: the three source vectors are reordered (`order`, [`rows4`]) before
/// they are taken apart, as every byte's bits stay in that byte.
///
/// # Safety
/// `hg..hg + 96` readable; AVX2.
#[inline(always)]
unsafe fn q6_k_rows(hg: *const u8, order: __m256i) -> [__m256i; 4] {
    // SAFETY: the caller's contract.
    unsafe {
        let load = |at: usize| {
            _mm256_shuffle_epi8(_mm256_loadu_si256(hg.add(at) as *const __m256i), order)
        };
        q6_k_join(load(0), load(32), load(64))
    }
}

/// Q6_K: the dot products of one half-group's values `u` (each row's 4 elements per vector
/// in its own lane) with the 16 activations at `x`, times the half-group's scales `sc`
/// (row `r`'s in both 16-bit halves of lane `r`; with `VNNI`, sign-extended to lane `r`),
/// as i32 lanes. Two sums of 2·16002 at most share each 16-bit lane before the `madd`
/// widens them (see the module). With `VNNI`, `vpdpbusd` sums each lane's 4 products
/// straight into 32 bits, and one 32-bit multiply scales them.
///
/// # Safety
/// `x..x + 16` readable; AVX2, and AVX-512 VNNI and VL with `VNNI`.
#[inline(always)]
pub(super) unsafe fn q6_k_half_dot<const VNNI: bool>(
    u: &[__m256i],
    x: *const u8,
    sc: __m256i,
) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        if VNNI {
            let z = _mm256_setzero_si256();
            let a = _mm256_dpbusd_epi32(
                _mm256_dpbusd_epi32(z, u[0], splat4(x)),
                u[1],
                splat4(x.add(4)),
            );
            let b = _mm256_dpbusd_epi32(
                _mm256_dpbusd_epi32(z, u[2], splat4(x.add(8))),
                u[3],
                splat4(x.add(12)),
            );
            return _mm256_mullo_epi32(_mm256_add_epi32(a, b), sc);
        }
        let a = _mm256_add_epi16(
            _mm256_maddubs_epi16(u[0], splat4(x)),
            _mm256_maddubs_epi16(u[1], splat4(x.add(4))),
        );
        let b = _mm256_add_epi16(
            _mm256_maddubs_epi16(u[2], splat4(x.add(8))),
            _mm256_maddubs_epi16(u[3], splat4(x.add(12))),
        );
        _mm256_add_epi32(_mm256_madd_epi16(a, sc), _mm256_madd_epi16(b, sc))
    }
}

/// A `pshufb` control for the 16 scale bytes of half-groups 2g and 2g + 1 (scale 2g of row
/// `r` at byte `r`, scale 2g + 1 at `8 + r`, broadcast to both 128-bit halves): lane `r`'s
/// low 16 bits take byte `lo + r` into their high byte, its high 16 bits byte `hi + r`; the
/// low bytes are zeroed (−128).
const fn scale_ctl(lo: usize, hi: usize) -> [i8; 32] {
    let mut c = [-128i8; 32];
    let mut r = 0;
    while r < 8 {
        let at = 16 * (r / 4) + 4 * (r % 4);
        c[at + 1] = (lo + r) as i8;
        c[at + 3] = (hi + r) as i8;
        r += 1;
    }
    c
}

/// Scale 2g of row `r` in both 16-bit halves of lane `r` (high bytes).
const SCALE0: [i8; 32] = scale_ctl(0, 0);
/// Scale 2g + 1 of row `r` in both 16-bit halves of lane `r` (high bytes).
const SCALE1: [i8; 32] = scale_ctl(8, 8);
/// Scale 2g of row `r` in the low 16 bits of lane `r`, 2g + 1 in the high ones (high bytes).
const SCALE_PAIR: [i8; 32] = scale_ctl(0, 8);

/// Q6_K against one row of `x` (decode): as [`q6_k`] with `M = 1`, adding to `acc`. The
/// scales of a block's two half-groups come out of one broadcast load by three `pshufb`
/// (each scale byte into the high byte of its 16-bit lanes, then an arithmetic shift: by 8
/// for the scale itself, by 3 for 32 times it, the offset's factor); the source vectors are
/// reordered before they are taken apart ([`q6_k_rows`], 3 shuffles for 4 vectors). The
/// blocks' products add into `acc` one after the other, as in [`q6_k`], so that a row's
/// bits do not depend on the height of its tile.
///
/// # Safety
/// As [`q6_k`] with `M = 1`.
#[inline(always)]
unsafe fn q6_k_one<const VNNI: bool>(
    col: *const u8,
    ns: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut __m256,
) {
    let (tiles, meta) = tile(&acts.bytes, acts, i0);
    // SAFETY: column s < ns lies inside `col` (the contract), half-group h < 16 inside its
    // column; the row's blocks 8s + g < 8·ns lie inside the tiles; prefetches never fault.
    unsafe {
        let order = rows4();
        let ctl = |c: &[i8; 32]| _mm256_loadu_si256(c.as_ptr() as *const __m256i);
        let (c_sc0, c_sc1, c_pair) = (ctl(&SCALE0), ctl(&SCALE1), ctl(&SCALE_PAIR));
        for s in 0..ns {
            let base = col.add(s * 1680);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            for g in 0..8 {
                let b = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    base.add(16 + 16 * g) as *const __m128i
                ));
                // With VNNI, the scale in the lane's top byte, sign-extended to 32 bits.
                let sc = if VNNI {
                    [
                        _mm256_srai_epi32::<24>(_mm256_shuffle_epi8(b, c_sc0)),
                        _mm256_srai_epi32::<24>(_mm256_shuffle_epi8(b, c_sc1)),
                    ]
                } else {
                    [
                        _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(b, c_sc0)),
                        _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(b, c_sc1)),
                    ]
                };
                let pair32 = _mm256_srai_epi16::<3>(_mm256_shuffle_epi8(b, c_pair));
                let (x, xm) = (
                    (*tiles.add(8 * s + g)).q.as_ptr() as *const u8,
                    &*meta.add(8 * s + g),
                );
                let mut dot = [_mm256_setzero_si256(); 2];
                for (hh, &sc) in sc.iter().enumerate() {
                    let hg = base.add(super::q6_k_half(2 * g + hh));
                    _mm_prefetch::<_MM_HINT_T0>(hg.wrapping_add(PREFETCH) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(hg.wrapping_add(PREFETCH + 64) as *const i8);
                    dot[hh] = q6_k_half_dot::<VNNI>(&q6_k_rows(hg, order), x.add(16 * hh), sc);
                }
                let halves = (xm.isum_lo as u32 & 0xFFFF) | ((xm.isum - xm.isum_lo) as u32) << 16;
                let off = _mm256_madd_epi16(pair32, _mm256_set1_epi32(halves as i32));
                let dot = _mm256_sub_epi32(_mm256_add_epi32(dot[0], dot[1]), off);
                let xs = _mm256_mul_ps(d, _mm256_set1_ps(xm.scale));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), xs, *acc);
            }
        }
    }
}

/// Q6_K against 16-bit activations where the CPU has AVX-512 VNNI: as [`q6_k`], reading the
/// tile's byte split ([`QuantizedActs::split`], `q = 256·hi + lo`) instead of its bytes.
/// Per half-group and row, four `vpdpbusd` take `Σu·hi` (the values unsigned, `hi` signed)
/// and four `Σlo·u` (`lo` unsigned, the values as signed bytes, which 0..=63 fit); the
/// second sum starts from `−32·Σq` of the half-group, the values' offset. The half-group's
/// dot product `256·Σu·hi + Σlo·u − 32·Σq` is exact in i32 and in f32: at most
/// 16·32·32767 < 2²⁴ in magnitude (its parts at most 16·63·128·256 and 16·63·255 + 32·16·32767).
/// The scales then apply in f32 (times a signed byte, the product could reach 2³¹), the
/// half-group's `d·sc` once per column for all rows. The widened 16-bit kernel
/// ([`super::avx2_i16`]'s `q6_k`) spends a `madd` and an add per 16 products and widens the
/// weights to 16 bits first; this one a `vpdpbusd` per 16 (its 32 byte products are 16
/// products of 16-bit activations, in two halves), with no adds and no widening.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 VNNI and VL; `col` holds `ns` columns; `acts` is at 16 bits
/// with its byte split, rows of `256·ns` elements, and a tile of `M` rows at `i0`.
#[inline(always)]
pub(super) unsafe fn q6_k_split<const M: usize>(
    col: *const u8,
    ns: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    debug_assert!(acts.m >= i0 + M && acts.k == 256 * ns && acts.has_tiles());
    let (tiles, meta) = tile(&acts.split, acts, i0);
    // SAFETY: column s < ns lies inside `col` (the contract), half-group h < 16 inside its
    // column; the tile's entries (8s + g)·M + i < 8·ns·M lie inside the tiles; prefetches
    // never fault; the features are the contract's.
    unsafe {
        let order = rows4();
        for s in 0..ns {
            let base = col.add(s * 1680);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            for g in 0..8 {
                // Block g of the activations: half-groups 2g and 2g + 1, 4 vectors each, and
                // their 8 rows' scales times d.
                let mut u = [_mm256_setzero_si256(); 8];
                let mut sc = [_mm256_setzero_ps(); 2];
                for hh in 0..2 {
                    let h = 2 * g + hh;
                    let hg = base.add(super::q6_k_half(h));
                    _mm_prefetch::<_MM_HINT_T0>(hg.wrapping_add(PREFETCH) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(hg.wrapping_add(PREFETCH + 64) as *const i8);
                    u[4 * hh..4 * hh + 4].copy_from_slice(&q6_k_rows(hg, order));
                    let s8 = _mm_loadl_epi64(base.add(16 + 8 * h) as *const __m128i);
                    sc[hh] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8)));
                }
                for (i, acc) in acc.iter_mut().enumerate().take(M) {
                    let at = (8 * s + g) * M + i;
                    let (x, xm): (&SplitBlock, &TileMeta) = (&*tiles.add(at), &*meta.add(at));
                    let (hi, lo) = (x.hi.as_ptr() as *const u8, x.lo.as_ptr());
                    let mut dot = [_mm256_setzero_ps(); 2];
                    for (hh, dot) in dot.iter_mut().enumerate() {
                        let isum = if hh == 0 {
                            xm.isum_lo
                        } else {
                            xm.isum - xm.isum_lo
                        };
                        let mut a = _mm256_setzero_si256();
                        let mut b = _mm256_set1_epi32(-32 * isum);
                        for v in 0..4 {
                            let (w, e) = (u[4 * hh + v], 16 * hh + 4 * v);
                            a = _mm256_dpbusd_epi32(a, w, splat4(hi.add(e)));
                            b = _mm256_dpbusd_epi32(b, splat4(lo.add(e)), w);
                        }
                        let q = _mm256_add_epi32(_mm256_slli_epi32::<8>(a), b);
                        *dot = _mm256_cvtepi32_ps(q);
                    }
                    let t = _mm256_fmadd_ps(dot[1], sc[1], _mm256_mul_ps(dot[0], sc[0]));
                    *acc = _mm256_fmadd_ps(t, _mm256_set1_ps(xm.scale), *acc);
                }
            }
        }
    }
}

/// Q8_0: as [`q6_k`] over the `nb` block columns (272 bytes each) of the group at `col`.
///
/// # Safety
/// AVX2, FMA, F16C; `col` holds `nb` columns; `acts` is at 8 bits with its tiles, rows of
/// `32·nb` elements, and a tile of `M` rows at `i0`.
#[inline(always)]
pub(super) unsafe fn q8_0<const M: usize, const VNNI: bool>(
    col: *const u8,
    nb: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    debug_assert!(acts.m >= i0 + M && acts.k == 32 * nb && acts.has_tiles());
    let (tiles, meta) = tile(&acts.bytes, acts, i0);
    // SAFETY: column b < nb lies inside `col` (the contract); the tile's entries b·M + i <
    // nb·M lie inside the tiles; prefetches never fault.
    unsafe {
        let (order, ones) = (rows4(), _mm256_set1_epi16(1));
        for b in 0..nb {
            let base = col.add(b * 272);
            for c in 0..5 {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64 * c) as *const i8);
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            // Vector v: elements 4v..4v + 4 of row r in lane r, and their magnitudes.
            let mut w = [_mm256_setzero_si256(); 8];
            let mut mag = [_mm256_setzero_si256(); 8];
            for v in 0..8 {
                let bytes = _mm256_loadu_si256(base.add(16 + 32 * v) as *const __m256i);
                w[v] = _mm256_shuffle_epi8(bytes, order);
                mag[v] = _mm256_abs_epi8(w[v]);
            }
            for (i, acc) in acc.iter_mut().enumerate().take(M) {
                let at = b * M + i;
                let (x, xm) = ((*tiles.add(at)).q.as_ptr() as *const u8, &*meta.add(at));
                let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for v in (0..8).step_by(2) {
                    let x0 = _mm256_sign_epi8(splat4(x.add(4 * v)), w[v]);
                    let x1 = _mm256_sign_epi8(splat4(x.add(4 * v + 4)), w[v + 1]);
                    if VNNI {
                        s0 = _mm256_dpbusd_epi32(s0, mag[v], x0);
                        s1 = _mm256_dpbusd_epi32(s1, mag[v + 1], x1);
                    } else {
                        let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(mag[v], x0), ones);
                        let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(mag[v + 1], x1), ones);
                        s0 = _mm256_add_epi32(s0, p0);
                        s1 = _mm256_add_epi32(s1, p1);
                    }
                }
                let xs = _mm256_mul_ps(d, _mm256_set1_ps(xm.scale));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), xs, *acc);
            }
        }
    }
}
