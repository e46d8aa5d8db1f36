//! The interleaved layout's kernels with 256-bit vectors: lane `r` is row `r` of a group of
//! 8, up to 8 rows of `x` per pass over a column of blocks (the pass reads the column from
//! memory for the first row of `x` and from L1 for the others).

use super::avx2_byte::{q6_k as q6_k_bytes, q6_k_split, q8_0 as q8_0_bytes};
use super::avx2_i16::{q6_k, q8_0};
use super::avx2_iq4::{iq4_nl_bytes, iq4_nl_wide, iq4_xs_bytes, iq4_xs_wide};
use super::avx2_parts::{k_scales, nibbles};
use super::avx2_q3_k::{q3_k_bytes, q3_k_wide};
use super::avx2_q5_k::{q5_k_bytes, q5_k_wide};
use super::ROWS;
use crate::par::SharedOut;
use crate::quant::act::{ActPrecision, ByteBlock, QuantizedActs, SplitBlock, TILE_ROWS};
use crate::quant::QuantFormat;
use core::arch::x86_64::*;

/// How far ahead of the column being multiplied the group's bytes are prefetched.
const PREFETCH: usize = 1024;

/// The 4 bytes at `p` in every 32-bit lane.
///
/// # Safety
/// `p..p + 4` readable; AVX.
#[inline(always)]
unsafe fn splat4(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at `p`.
    unsafe { _mm256_set1_epi32(core::ptr::read_unaligned(p as *const i32)) }
}

/// How a row's tile entry of activations meets 8 rows × 4 weights (`w`, one unsigned value of
/// at most 15 per byte, row `r` in bytes `4r..4r + 4`): [`Split`] for 16-bit activations,
/// [`Bytes`] for 8-bit ones, [`SplitVnni`] and [`Vnni`] the same with `vpdpbusd`. A group of
/// 32 takes 8 steps into sums that cannot overflow, and [`Tiles::finish`] gives its exact
/// integer dot products, one per row.
trait Tiles {
    /// A block of one row.
    type Block;
    /// The running sums of a group.
    type Sums: Copy;
    /// The first tile entry of `acts`.
    fn blocks(acts: &QuantizedActs) -> *const Self::Block;
    /// Sums of nothing.
    ///
    /// # Safety
    /// AVX2.
    unsafe fn zero() -> Self::Sums;
    /// Adds the products of `w` with elements `e..e + 4` of the block at `x`.
    ///
    /// # Safety
    /// `x` points to a block; `e + 4 ≤ 32`; AVX2.
    unsafe fn step(w: __m256i, x: *const Self::Block, e: usize, s: &mut Self::Sums);
    /// The 8 rows' dot products (i32 lanes).
    ///
    /// # Safety
    /// AVX2.
    unsafe fn finish(s: Self::Sums) -> __m256i;
}

/// 16-bit activations as their byte split `q = 256·hi + lo`: the nibbles times `hi` (signed)
/// and `lo` (unsigned) times the nibbles (as signed bytes, which they fit), in two sums (at
/// most 8·2·15·128 = 30720 and, unsigned, 8·2·255·15 = 61200), put together as
/// `256·Σ(q·hi) + Σ(q·lo)`.
struct Split;

impl Tiles for Split {
    type Block = SplitBlock;
    type Sums = (__m256i, __m256i);
    fn blocks(acts: &QuantizedActs) -> *const SplitBlock {
        acts.split.as_ptr()
    }
    #[inline(always)]
    unsafe fn zero() -> Self::Sums {
        // SAFETY: registers only; the caller has AVX2.
        unsafe { (_mm256_setzero_si256(), _mm256_setzero_si256()) }
    }
    #[inline(always)]
    unsafe fn step(w: __m256i, x: *const SplitBlock, e: usize, s: &mut Self::Sums) {
        // SAFETY: the caller's contract. maddubs takes its first operand unsigned and its
        // second signed: the nibbles against `hi`, and `lo` against the nibbles.
        unsafe {
            let (hi, lo) = ((*x).hi.as_ptr().add(e), (*x).lo.as_ptr().add(e));
            s.0 = _mm256_add_epi16(s.0, _mm256_maddubs_epi16(w, splat4(hi as *const u8)));
            s.1 = _mm256_add_epi16(s.1, _mm256_maddubs_epi16(splat4(lo), w));
        }
    }
    #[inline(always)]
    unsafe fn finish((a, b): Self::Sums) -> __m256i {
        // SAFETY: registers only; the caller has AVX2. `a`'s lanes are signed, `b`'s
        // unsigned.
        unsafe {
            let a = _mm256_madd_epi16(a, _mm256_set1_epi16(256));
            let b_even = _mm256_blend_epi16::<0b1010_1010>(b, _mm256_setzero_si256());
            _mm256_add_epi32(a, _mm256_add_epi32(b_even, _mm256_srli_epi32::<16>(b)))
        }
    }
}

/// 8-bit activations: the nibbles times the bytes in one `maddubs` (at most
/// 8·2·15·128 = 30720 per lane).
struct Bytes;

impl Tiles for Bytes {
    type Block = ByteBlock;
    type Sums = __m256i;
    fn blocks(acts: &QuantizedActs) -> *const ByteBlock {
        acts.bytes.as_ptr()
    }
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        // SAFETY: registers only; the caller has AVX2.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn step(w: __m256i, x: *const ByteBlock, e: usize, s: &mut __m256i) {
        // SAFETY: the caller's contract. maddubs takes the nibbles unsigned, the
        // activations signed.
        unsafe {
            let x = splat4((*x).q.as_ptr().add(e) as *const u8);
            *s = _mm256_add_epi16(*s, _mm256_maddubs_epi16(w, x));
        }
    }
    #[inline(always)]
    unsafe fn finish(s: __m256i) -> __m256i {
        // SAFETY: registers only; the caller has AVX2.
        unsafe { _mm256_madd_epi16(s, _mm256_set1_epi16(1)) }
    }
}

/// 16-bit activations where the CPU has AVX-512 VNNI with 256-bit vectors (VL): each of
/// [`Split`]'s two byte products is one `vpdpbusd` into 32-bit sums (the nibbles, unsigned,
/// times `hi`, signed; `lo`, unsigned, times the nibbles as signed bytes, which they fit),
/// in place of two `maddubs` and two adds, and nothing is left to widen: `finish` is
/// `256·Σ(q·hi) + Σ(q·lo)`, the same integers as [`Split`]'s (a group's sums stay below
/// 32·15·255 in magnitude). Only [`columns_vnni`] runs it, which enables the features.
struct SplitVnni;

impl Tiles for SplitVnni {
    type Block = SplitBlock;
    /// Σ(q·hi) and Σ(q·lo), each in two sums that alternate by chunk (as [`Vnni`]'s), so
    /// that each `vpdpbusd` does not wait on the one before.
    type Sums = [__m256i; 4];
    fn blocks(acts: &QuantizedActs) -> *const SplitBlock {
        acts.split.as_ptr()
    }
    #[inline(always)]
    unsafe fn zero() -> Self::Sums {
        // SAFETY: registers only; the caller has AVX2.
        unsafe { [_mm256_setzero_si256(); 4] }
    }
    #[inline(always)]
    unsafe fn step(w: __m256i, x: *const SplitBlock, e: usize, s: &mut Self::Sums) {
        // SAFETY: the caller's contract, and (inlined only into `columns_vnni`) AVX-512
        // VNNI and VL.
        unsafe {
            let (hi, lo) = ((*x).hi.as_ptr().add(e), (*x).lo.as_ptr().add(e));
            let odd = (e / 4) % 2;
            s[odd] = _mm256_dpbusd_epi32(s[odd], w, splat4(hi as *const u8));
            s[2 + odd] = _mm256_dpbusd_epi32(s[2 + odd], splat4(lo), w);
        }
    }
    #[inline(always)]
    unsafe fn finish(s: Self::Sums) -> __m256i {
        // SAFETY: registers only; the caller has AVX2.
        unsafe {
            let hi = _mm256_add_epi32(s[0], s[1]);
            _mm256_add_epi32(_mm256_slli_epi32::<8>(hi), _mm256_add_epi32(s[2], s[3]))
        }
    }
}

/// 8-bit activations where the CPU has AVX-512 VNNI with 256-bit vectors (VL): one
/// `vpdpbusd` multiplies the nibbles (unsigned) by the activations (signed) and adds each
/// lane's 4 products straight into its 32-bit sum, the work of a `maddubs` and an add in
/// [`Bytes`], with nothing left to widen. Chunks alternate between two sums, so that each
/// `vpdpbusd` does not wait on the one before. The integers are the same as [`Bytes`]'s.
/// Only [`columns_vnni`] runs it, which enables the features.
struct Vnni;

impl Tiles for Vnni {
    type Block = ByteBlock;
    type Sums = (__m256i, __m256i);
    fn blocks(acts: &QuantizedActs) -> *const ByteBlock {
        acts.bytes.as_ptr()
    }
    #[inline(always)]
    unsafe fn zero() -> Self::Sums {
        // SAFETY: registers only; the caller has AVX2.
        unsafe { (_mm256_setzero_si256(), _mm256_setzero_si256()) }
    }
    #[inline(always)]
    unsafe fn step(w: __m256i, x: *const ByteBlock, e: usize, s: &mut Self::Sums) {
        // SAFETY: the caller's contract, and (inlined only into `columns_vnni`) AVX-512
        // VNNI and VL.
        unsafe {
            let x = splat4((*x).q.as_ptr().add(e) as *const u8);
            if (e / 4).is_multiple_of(2) {
                s.0 = _mm256_dpbusd_epi32(s.0, w, x);
            } else {
                s.1 = _mm256_dpbusd_epi32(s.1, w, x);
            }
        }
    }
    #[inline(always)]
    unsafe fn finish(s: Self::Sums) -> __m256i {
        // SAFETY: registers only; the caller has AVX2.
        unsafe { _mm256_add_epi32(s.0, s.1) }
    }
}

/// Q4_0 (`Q41` false) and Q4_1 (`Q41` true): adds `x[i0 + i]·W[r]` (without bias) to lane
/// `r` of `acc[i]` for `i < M`, over the `nb` columns of the group at `col`; `i0` starts a
/// tile of `T`'s layout, of `M` rows.
///
/// # Safety
/// AVX2, FMA, F16C; `col` holds `nb` columns of the format; `acts` has `T`'s tiles, with
/// a tile of `M` rows of `nb` blocks at `i0`.
#[inline(always)]
unsafe fn q4_0<T: Tiles, const M: usize, const Q41: bool>(
    col: *const u8,
    nb: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    let tile = acts.tile_at(i0, 0);
    let (column, head) = if Q41 { (160, 32) } else { (144, 16) };
    // SAFETY: column b < nb lies inside `col` (`column` bytes each), and the tile's entries
    // b·M + i < nb·M inside the tiles (the contract); prefetches never fault.
    unsafe {
        let (tiles, meta) = (T::blocks(acts).add(tile), acts.tile_meta.as_ptr().add(tile));
        for b in 0..nb {
            let base = col.add(b * column);
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 128) as *const i8);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            // Q4_1's minimums (unused for Q4_0).
            let mins = if Q41 {
                _mm256_cvtph_ps(_mm_loadu_si128(base.add(16) as *const __m128i))
            } else {
                _mm256_setzero_ps()
            };
            for (i, acc) in acc.iter_mut().enumerate().take(M) {
                let (x, xm) = (tiles.add(b * M + i), &*meta.add(b * M + i));
                let mut a = T::zero();
                for p in 0..4 {
                    // Chunk p: elements 4p..4p + 4 low, 16 + 4p.. high.
                    let (w_lo, w_hi) = nibbles(base.add(head + 32 * p));
                    T::step(w_lo, x, 4 * p, &mut a);
                    T::step(w_hi, x, 16 + 4 * p, &mut a);
                }
                let dot = if Q41 {
                    T::finish(a)
                } else {
                    // The stored nibbles are q + 8: take 8·Σx off, exactly.
                    _mm256_sub_epi32(T::finish(a), _mm256_set1_epi32(8 * xm.isum))
                };
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(xm.scale));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, *acc);
                if Q41 {
                    // Q4_1's values are d·q + m: add m·Σx.
                    *acc = _mm256_fmadd_ps(mins, _mm256_set1_ps(xm.sum), *acc);
                }
            }
        }
    }
}

/// Q4_K: as [`q4_0`] over the `ns` super-block columns of the group at `col`.
///
/// # Safety
/// As [`q4_0`], with `ns` Q4_K columns of 1152 bytes and rows of `256·ns` elements.
#[inline(always)]
unsafe fn q4_k<T: Tiles, const M: usize>(
    col: *const u8,
    ns: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    let tile = acts.tile_at(i0, 0);
    // SAFETY: column s < ns lies inside `col` (1152 bytes each), and the tile's entries
    // (8s + g)·M + i < 8·ns·M inside the tiles (the contract); prefetches never fault.
    unsafe {
        let (tiles, meta) = (T::blocks(acts).add(tile), acts.tile_meta.as_ptr().add(tile));
        let m4 = _mm256_set1_epi8(0x0F);
        for s in 0..ns {
            let base = col.add(s * 1152);
            let (sc, mn) = k_scales(base);
            // A row's sum takes the same steps in the same order at every height of tile, so
            // that its bits never depend on the rows beside it: per group, the integer dot
            // product times `d·sc·xs`, then the minimums' term.
            let add = |acc: &mut __m256, g: usize, a: T::Sums, at: usize| {
                let xm = &*meta.add(at);
                let dot = _mm256_cvtepi32_ps(T::finish(a));
                *acc = _mm256_fmadd_ps(dot, _mm256_mul_ps(sc[g], _mm256_set1_ps(xm.scale)), *acc);
                *acc = _mm256_fnmadd_ps(mn[g], _mm256_set1_ps(xm.sum), *acc);
            };
            if M == 1 {
                // One row: both groups of each run of 8 chunks in one pass over its bytes.
                let acc = &mut acc[0];
                for j in 0..4 {
                    let q = base.add(128 + 256 * j);
                    for c in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH + 64 * c) as *const i8);
                    }
                    let (mut a0, mut a1) = (T::zero(), T::zero());
                    let (x0, x1) = (tiles.add(8 * s + 2 * j), tiles.add(8 * s + 2 * j + 1));
                    for p in 0..8 {
                        // Chunk (j, p): group 2j's elements 4p..4p + 4 low, group 2j + 1's high.
                        let (w0, w1) = nibbles(q.add(32 * p));
                        T::step(w0, x0, 4 * p, &mut a0);
                        T::step(w1, x1, 4 * p, &mut a1);
                    }
                    add(acc, 2 * j, a0, 8 * s + 2 * j);
                    add(acc, 2 * j + 1, a1, 8 * s + 2 * j + 1);
                }
                continue;
            }
            // Several rows: group by group, its 8 chunks of nibbles taken apart once and met
            // by every row of the tile while they sit in registers. Group 2j is the low
            // nibbles of the j-th run of 8 chunks, group 2j + 1 the high ones.
            for g in 0..8 {
                let q = base.add(128 + 256 * (g / 2));
                if g % 2 == 0 {
                    for c in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH + 64 * c) as *const i8);
                    }
                }
                let mut w = [_mm256_setzero_si256(); 8];
                for (p, w) in w.iter_mut().enumerate() {
                    let v = _mm256_loadu_si256(q.add(32 * p) as *const __m256i);
                    *w = if g % 2 == 0 {
                        _mm256_and_si256(v, m4)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4)
                    };
                }
                for (i, acc) in acc.iter_mut().enumerate().take(M) {
                    // Block g of the super-block, row i of the tile.
                    let at = (8 * s + g) * M + i;
                    let mut a = T::zero();
                    for (p, &w) in w.iter().enumerate() {
                        T::step(w, tiles.add(at), 4 * p, &mut a);
                    }
                    add(acc, g, a, at);
                }
            }
        }
    }
}

/// Columns `j0..j1` of `y[m, n] = x·Wᵀ (+ b)` with `W` interleaved.
///
/// # Safety
/// AVX2, FMA and F16C; the contract of [`super::columns`].
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn columns(
    y: SharedOut,
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { columns_with::<false>(y, acts, format, w, bias, n, j0, j1) }
}

/// As [`columns`], with the products at 8 bits taken by `vpdpbusd` ([`Vnni`] for the
/// 4-bit formats, the `VNNI` variants of Q6_K's and Q8_0's), and the byte split at 16 bits
/// too ([`SplitVnni`] for the 4-bit formats, [`q6_k_split`] for Q6_K): the same integers,
/// so the same results.
///
/// # Safety
/// AVX2, FMA, F16C, and AVX-512 F, BW, VL and VNNI; the contract of [`super::columns`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn columns_vnni(
    y: SharedOut,
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { columns_with::<true>(y, acts, format, w, bias, n, j0, j1) }
}

/// The body of [`columns`] (`VNNI` false) and [`columns_vnni`], inlined into each.
///
/// # Safety
/// As [`columns`], and as [`columns_vnni`] when `VNNI` is true.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn columns_with<const VNNI: bool>(
    y: SharedOut,
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    let (m, k) = (acts.m, acts.k);
    let cols = k / format.block_elems();
    let group_bytes = ROWS * cols * format.block_bytes();
    debug_assert!(w.len() == n / ROWS * group_bytes && j1 <= n);
    let bytes = acts.precision == ActPrecision::Byte;
    debug_assert!(acts.has_tiles() || !(bytes || super::reads_tiles(format)));
    // Q6_K's sums take the offset of 32 off per half-group, not per weight, where the
    // weights meet one or two rows: one row's step needs 2 instructions, the weights' 16.
    let raw = !acts.isum16.is_empty();
    let mut t = j0 / ROWS;
    while t * ROWS < j1 {
        let r0 = t * ROWS;
        // SAFETY: group t < n / 8 lies inside w; the kernels' other bounds are the
        // contract's (the tiles hold m rows of k); y's columns j0..j1 are this call's.
        unsafe {
            let col = w.as_ptr().add(t * group_bytes);
            let mut i0 = 0;
            while i0 < m {
                let mr = (m - i0).min(TILE_ROWS);
                let mut acc = [_mm256_setzero_ps(); ROWS];
                macro_rules! run {
                    ($kernel:ident $(, $t:ty)? $(; $flag:tt)?) => {
                        match mr {
                            1 => $kernel::<$($t,)? 1 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            2 => $kernel::<$($t,)? 2 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            3 => $kernel::<$($t,)? 3 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            4 => $kernel::<$($t,)? 4 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            5 => $kernel::<$($t,)? 5 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            6 => $kernel::<$($t,)? 6 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            7 => $kernel::<$($t,)? 7 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            _ => $kernel::<$($t,)? 8 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                        }
                    };
                }
                match format {
                    QuantFormat::Q4_0 if bytes && VNNI => run!(q4_0, Vnni; false),
                    QuantFormat::Q4_0 if bytes => run!(q4_0, Bytes; false),
                    QuantFormat::Q4_0 if VNNI => run!(q4_0, SplitVnni; false),
                    QuantFormat::Q4_0 => run!(q4_0, Split; false),
                    QuantFormat::Q4_1 if bytes && VNNI => run!(q4_0, Vnni; true),
                    QuantFormat::Q4_1 if bytes => run!(q4_0, Bytes; true),
                    QuantFormat::Q4_1 if VNNI => run!(q4_0, SplitVnni; true),
                    QuantFormat::Q4_1 => run!(q4_0, Split; true),
                    QuantFormat::Q6_K if bytes => run!(q6_k_bytes; VNNI),
                    QuantFormat::Q6_K if VNNI => run!(q6_k_split),
                    QuantFormat::Q6_K if raw && mr <= 2 => run!(q6_k; true),
                    QuantFormat::Q6_K => run!(q6_k; false),
                    QuantFormat::Q8_0 if bytes => run!(q8_0_bytes; VNNI),
                    QuantFormat::Q8_0 => run!(q8_0),
                    QuantFormat::Q3_K if bytes => run!(q3_k_bytes; VNNI),
                    QuantFormat::Q3_K => run!(q3_k_wide),
                    QuantFormat::Q5_K if bytes => run!(q5_k_bytes; VNNI),
                    QuantFormat::Q5_K => run!(q5_k_wide),
                    QuantFormat::IQ4_NL if bytes => run!(iq4_nl_bytes; VNNI),
                    QuantFormat::IQ4_NL => run!(iq4_nl_wide),
                    QuantFormat::IQ4_XS if bytes => run!(iq4_xs_bytes; VNNI),
                    QuantFormat::IQ4_XS => run!(iq4_xs_wide),
                    _ if bytes && VNNI => run!(q4_k, Vnni),
                    _ if bytes => run!(q4_k, Bytes),
                    _ if VNNI => run!(q4_k, SplitVnni),
                    _ => run!(q4_k, Split),
                }
                let (a, b) = (j0.max(r0), j1.min(r0 + ROWS));
                for (i, v) in acc.iter().enumerate().take(mr) {
                    let out = y.get().add((i0 + i) * n);
                    if a == r0 && b == r0 + ROWS {
                        let v = match bias {
                            Some(bias) => _mm256_add_ps(*v, _mm256_loadu_ps(bias[r0..].as_ptr())),
                            None => *v,
                        };
                        _mm256_storeu_ps(out.add(r0), v);
                    } else {
                        let mut lanes = [0.0f32; ROWS];
                        _mm256_storeu_ps(lanes.as_mut_ptr(), *v);
                        for r in a..b {
                            *out.add(r) = lanes[r - r0] + bias.map_or(0.0, |bias| bias[r]);
                        }
                    }
                }
                i0 += mr;
            }
        }
        t += 1;
    }
}
