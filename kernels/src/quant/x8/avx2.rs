//! The interleaved layout's kernels with 256-bit vectors: lane `r` is row `r` of a group of
//! 8, up to 8 rows of `x` per pass over a column of blocks (the pass reads the column from
//! memory for the first row of `x` and from L1 for the others).

use super::avx2_i16::{q6_k, q8_0};
use super::ROWS;
use crate::par::SharedOut;
use crate::quant::act::{QuantizedActs, TILE_ROWS};
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

/// One row of `x` (4 elements of its byte split: `hi`, `lo`) met by 8 rows × 4 weights
/// (`w`, one unsigned value of at most 15 per byte, row `r` in bytes `4r..4r + 4`): the two
/// halves' products added to the 16-bit sums `a` (with `hi`) and `b` (with `lo`).
///
/// # Safety
/// `hi..hi + 4` and `lo..lo + 4` readable; AVX2.
#[inline(always)]
unsafe fn step(w: __m256i, hi: *const i8, lo: *const u8, a: &mut __m256i, b: &mut __m256i) {
    // SAFETY: the caller's contract. maddubs takes its first operand unsigned and its second
    // signed: the nibbles against `hi`, and `lo` against the nibbles (0..=15 fit i8).
    unsafe {
        *a = _mm256_add_epi16(*a, _mm256_maddubs_epi16(w, splat4(hi as *const u8)));
        *b = _mm256_add_epi16(*b, _mm256_maddubs_epi16(splat4(lo), w));
    }
}

/// The exact integer dot products of a group of 32 per row (8 i32 lanes) from the 16-bit
/// sums of [`step`]: `256·a + b`, with `a`'s lanes signed and `b`'s unsigned.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn finish(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: registers only; the caller has AVX2.
    unsafe {
        let a = _mm256_madd_epi16(a, _mm256_set1_epi16(256));
        let b_even = _mm256_blend_epi16::<0b1010_1010>(b, _mm256_setzero_si256());
        _mm256_add_epi32(a, _mm256_add_epi32(b_even, _mm256_srli_epi32::<16>(b)))
    }
}

/// The low and high nibbles of 32 bytes.
///
/// # Safety
/// `p..p + 32` readable; AVX2.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm256_loadu_si256(p as *const __m256i);
        let m4 = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(v, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
        )
    }
}

/// Q4_0 (`Q41` false) and Q4_1 (`Q41` true): adds `x[i0 + i]·W[r]` (without bias) to lane
/// `r` of `acc[i]` for `i < M`, over the `nb` columns of the group at `col`; `i0` starts a
/// tile of the split, of `M` rows.
///
/// # Safety
/// AVX2, FMA, F16C; `col` holds `nb` columns of the format; `acts` has the byte split, with
/// a tile of `M` rows of `nb` blocks at `i0`.
#[inline(always)]
unsafe fn q4_0<const M: usize, const Q41: bool>(
    col: *const u8,
    nb: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    let tile = acts.split_at(i0, 0);
    let (column, head) = if Q41 { (160, 32) } else { (144, 16) };
    // SAFETY: column b < nb lies inside `col` (`column` bytes each), and the tile's entries
    // b·M + i < nb·M inside the split (the contract); prefetches never fault.
    unsafe {
        let (split, meta) = (
            acts.split.as_ptr().add(tile),
            acts.split_meta.as_ptr().add(tile),
        );
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
                let (x, xm) = (&*split.add(b * M + i), &*meta.add(b * M + i));
                let (hi, lo) = (x.hi.as_ptr(), x.lo.as_ptr());
                let (mut a, mut s) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for p in 0..4 {
                    // Chunk p: elements 4p..4p + 4 low, 16 + 4p.. high.
                    let (w_lo, w_hi) = nibbles(base.add(head + 32 * p));
                    step(w_lo, hi.add(4 * p), lo.add(4 * p), &mut a, &mut s);
                    step(w_hi, hi.add(16 + 4 * p), lo.add(16 + 4 * p), &mut a, &mut s);
                }
                let dot = if Q41 {
                    finish(a, s)
                } else {
                    // The stored nibbles are q + 8: take 8·Σx off, exactly.
                    _mm256_sub_epi32(finish(a, s), _mm256_set1_epi32(8 * xm.isum))
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
unsafe fn q4_k<const M: usize>(
    col: *const u8,
    ns: usize,
    acts: &QuantizedActs,
    i0: usize,
    acc: &mut [__m256; ROWS],
) {
    let tile = acts.split_at(i0, 0);
    // SAFETY: column s < ns lies inside `col` (1152 bytes each), and the tile's entries
    // (8s + g)·M + i < 8·ns·M inside the split (the contract); `tab` is this frame's;
    // prefetches never fault.
    unsafe {
        let (split, meta) = (
            acts.split.as_ptr().add(tile),
            acts.split_meta.as_ptr().add(tile),
        );
        let m4 = _mm256_set1_epi8(0x0F);
        let m30 = _mm256_set1_epi8(0x30);
        for s in 0..ns {
            let base = col.add(s * 1152);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(base.add(16) as *const __m128i));
            // The 64 scales and 64 minimums as bytes, `8g + r`.
            let lsc = _mm256_loadu_si256(base.add(32) as *const __m256i);
            let lmn = _mm256_loadu_si256(base.add(64) as *const __m256i);
            let h = _mm256_loadu_si256(base.add(96) as *const __m256i);
            let mut tab = [0u8; 128];
            let t = tab.as_mut_ptr();
            let put = |at: usize, v: __m256i| _mm256_storeu_si256(t.add(at) as *mut __m256i, v);
            put(
                0,
                _mm256_or_si256(
                    _mm256_and_si256(lsc, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(h), m30),
                ),
            );
            put(
                32,
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(lsc), m4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(h), m30),
                ),
            );
            put(
                64,
                _mm256_or_si256(_mm256_and_si256(lmn, m4), _mm256_and_si256(h, m30)),
            );
            put(
                96,
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(lmn), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(h), m30),
                ),
            );
            let byte8 = |at: usize| {
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                    tab.as_ptr().add(at) as *const __m128i
                )))
            };
            // Per group: the 8 rows' scales `d·sc` and minimums `mn` (times `dmin` later).
            let mut sc = [_mm256_setzero_ps(); 8];
            let mut mn = [_mm256_setzero_ps(); 8];
            for g in 0..8 {
                sc[g] = _mm256_mul_ps(d, byte8(8 * g));
                mn[g] = byte8(64 + 8 * g);
            }
            if M == 1 {
                // One row: both groups of each run of 8 chunks in one pass over its bytes
                // (in L2, 1.00 ns per 32 weights against 1.15 group by group).
                let acc = &mut acc[0];
                let mut mins = _mm256_setzero_ps();
                for j in 0..4 {
                    let q = base.add(128 + 256 * j);
                    for c in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH + 64 * c) as *const i8);
                    }
                    let (mut a0, mut s0) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    let (mut a1, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    let (x0, x1) = (&*split.add(8 * s + 2 * j), &*split.add(8 * s + 2 * j + 1));
                    for p in 0..8 {
                        // Chunk (j, p): group 2j's elements 4p..4p + 4 low, group 2j + 1's high.
                        let (w0, w1) = nibbles(q.add(32 * p));
                        let e = 4 * p;
                        step(
                            w0,
                            x0.hi.as_ptr().add(e),
                            x0.lo.as_ptr().add(e),
                            &mut a0,
                            &mut s0,
                        );
                        step(
                            w1,
                            x1.hi.as_ptr().add(e),
                            x1.lo.as_ptr().add(e),
                            &mut a1,
                            &mut s1,
                        );
                    }
                    for (g, a, t) in [(2 * j, a0, s0), (2 * j + 1, a1, s1)] {
                        let xm = &*meta.add(8 * s + g);
                        let dot = _mm256_cvtepi32_ps(finish(a, t));
                        let xs = _mm256_set1_ps(xm.scale);
                        *acc = _mm256_fmadd_ps(dot, _mm256_mul_ps(sc[g], xs), *acc);
                        mins = _mm256_fmadd_ps(mn[g], _mm256_set1_ps(xm.sum), mins);
                    }
                }
                *acc = _mm256_fnmadd_ps(dmin, mins, *acc);
                continue;
            }
            // Several rows: group by group, its 8 chunks of nibbles taken apart once and met
            // by every row of the tile while they sit in registers (2.2× the rate of the
            // one-row pass at 512 rows). Group 2j is the low nibbles of the j-th run of 8
            // chunks, group 2j + 1 the high ones.
            for g in 0..8 {
                let q = base.add(128 + 256 * (g / 2));
                if g % 2 == 0 {
                    for c in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(PREFETCH + 64 * c) as *const i8);
                    }
                }
                let mn = _mm256_mul_ps(dmin, mn[g]);
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
                    let (x, xm) = (&*split.add(at), &*meta.add(at));
                    let (mut a, mut t) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    for (p, &w) in w.iter().enumerate() {
                        step(
                            w,
                            x.hi.as_ptr().add(4 * p),
                            x.lo.as_ptr().add(4 * p),
                            &mut a,
                            &mut t,
                        );
                    }
                    let dot = _mm256_cvtepi32_ps(finish(a, t));
                    let xs = _mm256_set1_ps(xm.scale);
                    *acc = _mm256_fmadd_ps(dot, _mm256_mul_ps(sc[g], xs), *acc);
                    *acc = _mm256_fnmadd_ps(mn, _mm256_set1_ps(xm.sum), *acc);
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
    let (m, k) = (acts.m, acts.k);
    let cols = k / format.block_elems();
    let group_bytes = ROWS * cols * format.block_bytes();
    debug_assert!(w.len() == n / ROWS * group_bytes && j1 <= n);
    debug_assert!(acts.has_split() || !super::reads_split(format));
    // Q6_K's sums take the offset of 32 off per half-group, not per weight, where the
    // weights meet one or two rows: one row's step needs 2 instructions, the weights' 16.
    let raw = !acts.isum16.is_empty();
    let mut t = j0 / ROWS;
    while t * ROWS < j1 {
        let r0 = t * ROWS;
        // SAFETY: group t < n / 8 lies inside w; the kernels' other bounds are the
        // contract's (the split holds m rows of k); y's columns j0..j1 are this call's.
        unsafe {
            let col = w.as_ptr().add(t * group_bytes);
            let mut i0 = 0;
            while i0 < m {
                let mr = (m - i0).min(TILE_ROWS);
                let mut acc = [_mm256_setzero_ps(); ROWS];
                macro_rules! run {
                    ($kernel:ident $(, $flag:literal)?) => {
                        match mr {
                            1 => $kernel::<1 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            2 => $kernel::<2 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            3 => $kernel::<3 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            4 => $kernel::<4 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            5 => $kernel::<5 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            6 => $kernel::<6 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            7 => $kernel::<7 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                            _ => $kernel::<8 $(, $flag)?>(col, cols, acts, i0, &mut acc),
                        }
                    };
                }
                match format {
                    QuantFormat::Q4_0 => run!(q4_0, false),
                    QuantFormat::Q4_1 => run!(q4_0, true),
                    QuantFormat::Q6_K if raw && mr <= 2 => run!(q6_k, true),
                    QuantFormat::Q6_K => run!(q6_k, false),
                    QuantFormat::Q8_0 => run!(q8_0),
                    _ => run!(q4_k),
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
