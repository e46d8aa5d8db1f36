//! Interleaved IQ4_NL and IQ4_XS with 256-bit vectors. Their nibbles index the non-linear
//! table of 16 signed values ([`IQ4_TABLE`], −127..=113): one `pshufb` per 32 nibbles (the
//! table in both 128-bit halves) turns a chunk of the layout, row `r`'s 4 consecutive
//! elements in bytes `4r..4r + 4`, into the 8 rows' values in their own 32-bit lanes, once
//! per column for every row of `x` that meets it.
//!
//! - **8-bit activations.** With AVX-512 VNNI, the lookup gives the values plus 128
//!   (1..=241, unsigned) and `vpdpbusd` adds each lane's 4 products into 32 bits; the
//!   offset, `128·Σx` of the block ([`TileMeta::isum`]), comes off once per block. Without
//!   it, `maddubs` meets the values' magnitudes (unsigned) with the activations given the
//!   values' signs (`sign_epi8`), as Q8_0 does; each pair of products (at most
//!   2·127·127 = 32258) is widened at once by a `madd` with ones.
//! - **16-bit activations.** The values are widened to 16 bits, two elements of each row per
//!   32-bit lane ([`super::pair_byte`]'s order, one more `pshufb`), and meet pairs of
//!   activations in `madd`, as Q8_0's 16-bit kernel: at most 32·127·32767 < 2³¹ per block.
//!
//! Each block of 32 adds `float(Σ q·x)·(a·xs)` to a row's sum, `a` the weights' scale (`d`,
//! or IQ4_XS's `d·(sc − 32)`, rounded as the GGUF-layout reference rounds it) and `xs` the
//! activations' scale: the same steps at every height of tile, so a row's bits never
//! depend on the rows beside it.

use super::avx2_byte::{splat4, tile};
use super::avx2_i16::dot16;
use super::avx2_parts::nibbles;
use super::layout::iq4_xs_chunk;
use super::ROWS;
use crate::quant::act::QuantizedActs;
use crate::quant::blocks::IQ4_TABLE;
use core::arch::x86_64::*;

/// How far ahead of the column being multiplied the group's bytes are prefetched.
const PREFETCH: usize = 1024;

/// The table in both 128-bit halves, each value plus `offset` (wrapping: 128 makes the
/// values unsigned bytes).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn table(offset: u8) -> __m256i {
    let mut t = [0u8; 16];
    for (o, &v) in t.iter_mut().zip(&IQ4_TABLE) {
        *o = (v as u8).wrapping_add(offset);
    }
    // SAFETY: 16 readable bytes; the caller has AVX2.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i)) }
}

/// The `pshufb` control that moves each row's 4 elements from bytes `4r..4r + 4` of a
/// 128-bit half (rows 0–3, then 4–7 in the other half) to [`super::pair_byte`]'s places:
/// the rows' first two elements, row by row, then their next two. `unpacklo_epi8` and
/// `unpackhi_epi8` then give each row's element pairs in its own 32-bit lane.
///
/// # Safety
/// AVX.
#[inline(always)]
pub(super) unsafe fn to_pairs() -> __m256i {
    // Byte 8·(e / 2) + 2r + e % 2 takes byte 4r + e.
    // SAFETY: registers only.
    unsafe {
        _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3,
            6, 7, 10, 11, 14, 15,
        )
    }
}

/// The 8 rows' scales `d·(sc − 32)` of an IQ4_XS column's 8 sub-blocks, from its 8 `d`
/// and its 48 bytes of six-bit scales (see `layout::pack_six`, values `8g + r`).
///
/// # Safety
/// `base..base + 64` readable; AVX2, F16C.
#[inline(always)]
unsafe fn xs_scales(base: *const u8) -> [__m256; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
        let low = _mm256_loadu_si256(base.add(16) as *const __m256i);
        let h = _mm_loadu_si128(base.add(48) as *const __m128i);
        // Byte v of `top` holds value v's top 2 bits in bits 0–1 and value v + 32's in
        // bits 4–5: the 16 bytes for values 0..16 and 32..48, then (shifted by 2) those for
        // 16..32 and 48..64.
        let top = _mm256_set_m128i(_mm_srli_epi16::<2>(h), h);
        let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let c32 = _mm256_set1_epi8(32);
        let first = _mm256_or_si256(
            _mm256_and_si256(low, m4),
            _mm256_and_si256(_mm256_slli_epi16::<4>(top), m30),
        );
        let second = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(low), m4),
            _mm256_and_si256(top, m30),
        );
        let mut tab = [0i8; 64];
        _mm256_storeu_si256(
            tab.as_mut_ptr() as *mut __m256i,
            _mm256_sub_epi8(first, c32),
        );
        _mm256_storeu_si256(
            tab.as_mut_ptr().add(32) as *mut __m256i,
            _mm256_sub_epi8(second, c32),
        );
        let mut a = [_mm256_setzero_ps(); 8];
        for (g, a) in a.iter_mut().enumerate() {
            let sc =
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(tab.as_ptr().add(8 * g) as *const __m128i));
            *a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
        }
        a
    }
}

/// Bytes per column, sub-blocks per column and where sub-block `g`'s 4 chunks start.
const fn geometry(xs: bool) -> (usize, usize) {
    if xs {
        (1088, 8)
    } else {
        (144, 1)
    }
}

/// Offset of sub-block `g`'s first chunk in a column.
const fn chunks(xs: bool, g: usize) -> usize {
    if xs {
        iq4_xs_chunk(g, 0, 0)
    } else {
        16
    }
}

/// The 8 rows' scales of each sub-block of the column at `base`: IQ4_NL's `d`, IQ4_XS's
/// `d·(sc − 32)`.
///
/// # Safety
/// The column at `base` is whole; AVX2, F16C.
#[inline(always)]
unsafe fn scales<const XS: bool>(base: *const u8) -> [__m256; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        if XS {
            xs_scales(base)
        } else {
            [_mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i)); 8]
        }
    }
}

/// IQ4_NL (`XS` false) and IQ4_XS: adds `x[i0 + i]·W[r]` (without bias) to lane `r` of
/// `acc[i]` for `i < M`, over the `cols` columns of the group at `col`; `i0` starts a tile
/// of `M` rows of [`QuantizedActs::bytes`].
///
/// # Safety
/// AVX2, FMA, F16C (and AVX-512 VNNI and VL with `VNNI`); `col` holds `cols` columns;
/// `acts` is at 8 bits with its tiles, rows of `cols` blocks (super-blocks for IQ4_XS), and
/// a tile of `M` rows at `i0`.
#[inline(always)]
unsafe fn bytes<const M: usize, const XS: bool, const VNNI: bool>(
    col: *const u8,
    cols: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    let (column, groups) = geometry(XS);
    debug_assert!(acts.m >= i0 + M && acts.k == 32 * groups * cols && acts.has_tiles());
    let (tiles, meta) = tile(&acts.bytes, acts, i0);
    // SAFETY: column c < cols lies inside `col` (the contract), its chunks inside it; the
    // tile's entries (groups·c + g)·M + i lie inside the tiles; prefetches never fault.
    unsafe {
        let tab = table(if VNNI { 128 } else { 0 });
        let ones = _mm256_set1_epi16(1);
        for c in 0..cols {
            let base = col.add(c * column);
            let a = scales::<XS>(base);
            for (g, &a) in a.iter().enumerate().take(groups) {
                let q = base.add(chunks(XS, g));
                for l in 0..2 {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH + 64 * l) as *const i8);
                }
                // Vector v: elements 4v..4v + 4 of each row, in its lane (low nibbles of
                // chunks 0–3, then their high nibbles).
                let mut w = [_mm256_setzero_si256(); 8];
                for p in 0..4 {
                    let (lo, hi) = nibbles(q.add(32 * p));
                    w[p] = _mm256_shuffle_epi8(tab, lo);
                    w[4 + p] = _mm256_shuffle_epi8(tab, hi);
                }
                let mut mag = [_mm256_setzero_si256(); 8];
                if !VNNI {
                    for (m, &w) in mag.iter_mut().zip(&w) {
                        *m = _mm256_abs_epi8(w);
                    }
                }
                for (i, acc) in acc.iter_mut().enumerate().take(M) {
                    let at = (groups * c + g) * M + i;
                    let (x, xm) = ((*tiles.add(at)).q.as_ptr() as *const u8, &*meta.add(at));
                    let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    for v in (0..8).step_by(2) {
                        let (x0, x1) = (splat4(x.add(4 * v)), splat4(x.add(4 * v + 4)));
                        if VNNI {
                            s0 = _mm256_dpbusd_epi32(s0, w[v], x0);
                            s1 = _mm256_dpbusd_epi32(s1, w[v + 1], x1);
                        } else {
                            let p0 = _mm256_maddubs_epi16(mag[v], _mm256_sign_epi8(x0, w[v]));
                            let p1 =
                                _mm256_maddubs_epi16(mag[v + 1], _mm256_sign_epi8(x1, w[v + 1]));
                            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p0, ones));
                            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p1, ones));
                        }
                    }
                    let mut dot = _mm256_add_epi32(s0, s1);
                    if VNNI {
                        // The values were looked up plus 128.
                        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(128 * xm.isum));
                    }
                    let xs = _mm256_mul_ps(a, _mm256_set1_ps(xm.scale));
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), xs, *acc);
                }
            }
        }
    }
}

/// IQ4_NL and IQ4_XS against 16-bit activations ([`QuantizedActs::q`], no tiles): as
/// [`bytes`], the values widened to pairs of 16 bits.
///
/// # Safety
/// AVX2, FMA, F16C; `col` holds `cols` columns; `acts` holds rows `i0..i0 + M` of
/// `cols` blocks (super-blocks for IQ4_XS).
#[inline(always)]
unsafe fn wide<const M: usize, const XS: bool>(
    col: *const u8,
    cols: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    let (column, groups) = geometry(XS);
    let k = acts.k;
    debug_assert!(acts.m >= i0 + M && k == 32 * groups * cols);
    // SAFETY: column c < cols lies inside `col` (the contract), its chunks inside it; rows
    // i0 + i < m of k elements lie inside `acts.q`, their blocks inside `acts.scale`;
    // prefetches never fault.
    unsafe {
        let (xq, scale) = (acts.q.as_ptr(), acts.scale.as_ptr());
        let (tab, order) = (table(0), to_pairs());
        for c in 0..cols {
            let base = col.add(c * column);
            let a = scales::<XS>(base);
            for (g, &a) in a.iter().enumerate().take(groups) {
                let q = base.add(chunks(XS, g));
                for l in 0..2 {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH + 64 * l) as *const i8);
                }
                // Elements 0..16 (low nibbles) and 16..32 (high ones) as 8 vectors of pairs
                // each, sign-extended (a byte doubled, shifted right by 8).
                let (mut w_lo, mut w_hi) =
                    ([_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8]);
                for p in 0..4 {
                    let (lo, hi) = nibbles(q.add(32 * p));
                    for (w, nib) in [(&mut w_lo, lo), (&mut w_hi, hi)] {
                        let t = _mm256_shuffle_epi8(_mm256_shuffle_epi8(tab, nib), order);
                        w[2 * p] = _mm256_srai_epi16::<8>(_mm256_unpacklo_epi8(t, t));
                        w[2 * p + 1] = _mm256_srai_epi16::<8>(_mm256_unpackhi_epi8(t, t));
                    }
                }
                for (i, acc) in acc.iter_mut().enumerate().take(M) {
                    let at = (i0 + i) * k + 32 * (groups * c + g);
                    let dot =
                        _mm256_add_epi32(dot16(&w_lo, xq.add(at)), dot16(&w_hi, xq.add(at + 16)));
                    let xs = _mm256_mul_ps(a, _mm256_set1_ps(*scale.add(at / 32)));
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), xs, *acc);
                }
            }
        }
    }
}

/// IQ4_NL at 8 bits: see [`bytes`].
///
/// # Safety
/// As [`bytes`].
#[inline(always)]
pub(super) unsafe fn iq4_nl_bytes<const M: usize, const VNNI: bool>(
    col: *const u8,
    cols: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    // SAFETY: the caller's contract.
    unsafe { bytes::<M, false, VNNI>(col, cols, acts, i0, acc) }
}

/// IQ4_XS at 8 bits: see [`bytes`].
///
/// # Safety
/// As [`bytes`].
#[inline(always)]
pub(super) unsafe fn iq4_xs_bytes<const M: usize, const VNNI: bool>(
    col: *const u8,
    cols: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    // SAFETY: the caller's contract.
    unsafe { bytes::<M, true, VNNI>(col, cols, acts, i0, acc) }
}

/// IQ4_NL at 16 bits: see [`wide`].
///
/// # Safety
/// As [`wide`].
#[inline(always)]
pub(super) unsafe fn iq4_nl_wide<const M: usize>(
    col: *const u8,
    cols: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    // SAFETY: the caller's contract.
    unsafe { wide::<M, false>(col, cols, acts, i0, acc) }
}

/// IQ4_XS at 16 bits: see [`wide`].
///
/// # Safety
/// As [`wide`].
#[inline(always)]
pub(super) unsafe fn iq4_xs_wide<const M: usize>(
    col: *const u8,
    cols: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    // SAFETY: the caller's contract.
    unsafe { wide::<M, true>(col, cols, acts, i0, acc) }
}
