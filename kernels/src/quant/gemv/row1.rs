//! The decode step's own case with 256-bit vectors: one row of `x` (m = 1) against one
//! row of `W` at a time ([`OneRow`]), 8 rows of `W` reduced and stored together.
//!
//! The activations are read in even/odd order ([`QuantizedActs::eo`]), so that the weights
//! come apart with masks and in-lane shifts only ([`pairs`]); the stored integers stay
//! unsigned, and a format's offset (Q4_0's 8, Q5_0's 16, Q6_K's 32) is taken off each
//! block's integer sum as `offset·Σx` from the activations' half-block sums, exactly.
//!
//! For a 32-element format (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: [`Small`]), each block is one
//! group with one f16 scale (and minimum) at its start. Blocks are taken in runs of 8. Each
//! block's integer dot product with `xq` stays an i32 vector; the run's 8 vectors are then
//! reduced with `hadd` into one vector whose lane `t` is block `t`'s sum, converted to f32
//! once and multiplied by the 8 blocks' scales (the 8 blocks' first 4 bytes, `d` and `m`,
//! read as 32-bit words and widened 8 at a time with F16C, times the 8 contiguous activation
//! scales). The minimums' term `m·Σx` takes one FMA per run. The blocks after the last whole
//! run (2 of the 18 in a row of 576) are summed as integers and scaled one at a time.
//!
//! The K-formats reduce a super-block's 8 groups (Q6_K: 16 half-groups) the same way, and
//! scale them with the super-block's scales decoded 8 at a time in registers.
//!
//! Against the general frame ([`super::avx2::columns_with`]), which converts and fuses every
//! group on its own, this saves a conversion, a broadcast and a dependent FMA per group, and
//! gathers no scales into memory first. The general frame serves m > 1, and m = 1 for the
//! formats without a one-row kernel here (Q3_K, IQ4_NL, IQ4_XS).
//!
//! [`QuantizedActs::eo`]: crate::quant::act::QuantizedActs::eo

mod pairs;

use crate::par::SharedOut;
use crate::quant::act::{QuantizedActs, ACT_BLOCK};
use crate::quant::frame::{k45_scales, q6k_scales, u16_at, u32_at, Format, Q4_K, Q5_K, Q6_K};
use core::arch::x86_64::*;
use core::marker::PhantomData;
use pairs::Pairs;

/// How far ahead of the block being multiplied its row's bytes are prefetched. The hardware
/// prefetchers alone left a thread's stream short of the memory's pace: on 1B-shaped Q4_0
/// decode (2 threads, medians of 4 alternated runs) 22.0 tok/s without, 25.2 with 2 KiB;
/// 512 B to 4 KiB all helped, within the host's noise of each other.
const PREFETCH: usize = 2048;

/// The two f16 at the start of each of the 8 blocks from `p` (stride `bb`), widened: the
/// blocks' `d` and the field after it (`m` in Q4_1 and Q5_1, else the first bytes of `qh`
/// or of the quants, which callers without a minimum ignore), from one 32-bit read per block.
/// (An AVX2 gather of the 8 words measured 15–25% slower on Zen 4.)
///
/// # Safety
/// `p` points to 8 blocks of `bb ≥ 4` bytes; AVX2 and F16C.
#[inline(always)]
unsafe fn heads8(p: *const u8, bb: usize) -> (__m256, __m256) {
    // SAFETY: the caller guarantees 8 blocks of at least 4 bytes at `p`, so the 32-bit reads
    // at `t·bb` (t < 8) lie inside them, and AVX2 and F16C.
    unsafe {
        let at = |t: usize| u32_at(p.add(t * bb)) as i32;
        let v = _mm256_setr_epi32(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7));
        // Per 128-bit lane: the low halves (d) to bytes 0–7, the high halves to 8–15; then
        // the 8 d's to the low 128 bits and the 8 second fields to the high ones.
        let split = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3,
            6, 7, 10, 11, 14, 15,
        );
        let t = _mm256_permute4x64_epi64::<0xD8>(_mm256_shuffle_epi8(v, split));
        (
            _mm256_cvtph_ps(_mm256_castsi256_si128(t)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(t)),
        )
    }
}

/// One lane per block: lane `t` is the sum of the 8 lanes of `p[t]`.
///
/// # Safety
/// The caller must have AVX2.
#[inline(always)]
unsafe fn reduce8(p: &[__m256i; 8]) -> __m256i {
    // SAFETY: the caller has AVX2 (this function's contract); registers only.
    unsafe {
        let lo = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        let hi = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
        // Each 128-bit half holds lane t's partial sum over that half of p[t] (t + 4 in `hi`).
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        )
    }
}

/// The sums of the 8 vectors, one per lane: lane `t` is the sum of the 8 lanes of `p[t]`.
///
/// # Safety
/// The caller must have AVX.
#[inline(always)]
unsafe fn reduce8_ps(p: &[__m256; 8]) -> __m256 {
    // SAFETY: the caller has AVX (this function's contract); registers only.
    unsafe {
        let lo = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
        let hi = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(lo, hi),
            _mm256_permute2f128_ps::<0x31>(lo, hi),
        )
    }
}

/// Asks for the cache lines from `p` to `p + bytes`, one prefetch per 64 bytes (at least
/// one).
///
/// # Safety
/// SSE; `p` may point anywhere (a prefetch never faults).
#[inline(always)]
unsafe fn prefetch(p: *const u8, bytes: usize) {
    let mut at = 0;
    while at < bytes.max(64) {
        // SAFETY: SSE is the caller's contract; a prefetch reads nothing architecturally.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(at) as *const i8) };
        at += 64;
    }
}

/// The sum of the 8 lanes.
///
/// # Safety
/// The caller must have AVX2.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: the caller has AVX2 (this function's contract); registers only.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// The f16 at `p`, widened.
///
/// # Safety
/// `p..p + 2` must be readable; F16C.
#[inline(always)]
unsafe fn half_at(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes at `p` and F16C.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16_at(p))))) }
}

/// A format's one-row kernel.
pub(super) trait OneRow {
    /// Bytes of a row of `k` elements.
    fn row_bytes(k: usize) -> usize;

    /// One row of `W` against the one row of `x`: 8 lanes whose sum is `x·W[j]ᵀ` (without
    /// the bias).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `row` points to a whole row of `acts.k` elements, and `acts`
    /// holds one row.
    unsafe fn lanes(row: *const u8, acts: &QuantizedActs) -> __m256;
}

/// The one-row kernel of a 32-element format `F` (one group, one scale per block).
pub(super) struct Small<F>(PhantomData<F>);

impl<F: Pairs> OneRow for Small<F> {
    fn row_bytes(k: usize) -> usize {
        k / ACT_BLOCK * F::BB
    }

    #[inline(always)]
    unsafe fn lanes(row: *const u8, acts: &QuantizedActs) -> __m256 {
        debug_assert!(F::BE == ACT_BLOCK);
        let nb = acts.k / ACT_BLOCK;
        let (xq, xs, xsum) = (acts.eo.as_ptr(), acts.scale.as_ptr(), acts.sum.as_ptr());
        let isum = acts.isum16.as_ptr();
        // SAFETY: (every access below) block b < nb lies inside the row and activation block
        // b < nb inside xq (32 each), xs and xsum (this function's contract); so do the
        // features.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            let mut acc_min = _mm256_setzero_ps();
            let mut b = 0;
            // Whole runs of 8 (a constant trip count keeps the 8 sums in registers).
            while b + 8 <= nb {
                prefetch(row.wrapping_add(b * F::BB + PREFETCH), 8 * F::BB);
                let mut p = [_mm256_setzero_si256(); 8];
                for (t, pt) in p.iter_mut().enumerate() {
                    let at = b + t;
                    *pt = pairs::dot(F::eo(row.add(at * F::BB)), xq.add(at * ACT_BLOCK));
                }
                let (d, m) = heads8(row.add(b * F::BB), F::BB);
                let mut sums = reduce8(&p);
                if F::OFFSET != 0 {
                    // The 8 blocks' Σx from their 16 half-block sums: hadd pairs them as
                    // blocks 0, 1, 4, 5 | 2, 3, 6, 7, and the permute restores the order.
                    let halves = _mm256_hadd_epi32(
                        _mm256_loadu_si256(isum.add(2 * b) as *const __m256i),
                        _mm256_loadu_si256(isum.add(2 * b + 8) as *const __m256i),
                    );
                    let x8 = _mm256_permute4x64_epi64::<0xD8>(halves);
                    let off = _mm256_mullo_epi32(x8, _mm256_set1_epi32(F::OFFSET));
                    sums = _mm256_sub_epi32(sums, off);
                }
                let sums = _mm256_cvtepi32_ps(sums);
                acc = _mm256_fmadd_ps(sums, _mm256_mul_ps(d, _mm256_loadu_ps(xs.add(b))), acc);
                if F::MIN {
                    acc_min = _mm256_fmadd_ps(m, _mm256_loadu_ps(xsum.add(b)), acc_min);
                }
                b += 8;
            }
            // The tail, a block at a time: each block's integer sum is exact (|Σ| ≤
            // 32·31·32767 < 2³¹) and is scaled by its own `d·xs`.
            let mut c = 0.0f32;
            while b < nb {
                let p = row.add(b * F::BB);
                let mut dot = hsum_i32(pairs::dot(F::eo(p), xq.add(b * ACT_BLOCK)));
                if F::OFFSET != 0 {
                    dot -= F::OFFSET * (*isum.add(2 * b) + *isum.add(2 * b + 1));
                }
                c += dot as f32 * (half_at(p) * *xs.add(b));
                if F::MIN {
                    c += half_at(p.add(2)) * *xsum.add(b);
                }
                b += 1;
            }
            _mm256_add_ps(
                _mm256_add_ps(acc, acc_min),
                _mm256_setr_ps(c, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
            )
        }
    }
}

/// `y[j] = x·W[j]ᵀ (+ b[j])` for `j` in `j0..j1`, with `x` one row.
///
/// Rows are taken 8 at a time so that their 8 sums are reduced together and stored as one
/// vector.
///
/// # Safety
/// AVX2, FMA and F16C; `acts.m == 1`; `w` holds `n` rows of `acts.k` elements; `y` points
/// to `n` floats of which no one else touches `j0..j1`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn columns<R: OneRow>(
    y: SharedOut,
    acts: &QuantizedActs,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    debug_assert!(acts.m == 1 && j1 <= n);
    let row_bytes = R::row_bytes(acts.k);
    let mut j = j0;
    while j < j1 {
        let rows = (j1 - j).min(8);
        // SAFETY: rows j..j + rows < n lie inside w, and y[j..j + rows] is this call's own
        // (the caller's contract); the features are the caller's contract too.
        unsafe {
            let mut lanes = [_mm256_setzero_ps(); 8];
            for (r, l) in lanes.iter_mut().enumerate().take(rows) {
                *l = R::lanes(w.as_ptr().add((j + r) * row_bytes), acts);
            }
            let mut v = reduce8_ps(&lanes);
            let out = y.get().add(j);
            if rows == 8 {
                if let Some(b) = bias {
                    v = _mm256_add_ps(v, _mm256_loadu_ps(b[j..j + 8].as_ptr()));
                }
                _mm256_storeu_ps(out, v);
            } else {
                let mut t = [0.0f32; 8];
                _mm256_storeu_ps(t.as_mut_ptr(), v);
                for (r, &s) in t.iter().enumerate().take(rows) {
                    *out.add(r) = s + bias.map_or(0.0, |b| b[j + r]);
                }
            }
        }
        j += rows;
    }
}

/// The one-row kernel of Q4_K and Q5_K: per super-block, the 8 groups' integer sums
/// reduced into one vector (lane g is group g), times the 8 scales `d·sc` and the 8
/// activation scales, plus the 8 minimums' terms `−dmin·mn·Σx` in one FMA.
macro_rules! k45_one_row {
    ($format:ty) => {
        impl OneRow for $format {
            fn row_bytes(k: usize) -> usize {
                k / <$format>::BE * <$format>::BB
            }

            #[inline(always)]
            unsafe fn lanes(row: *const u8, acts: &QuantizedActs) -> __m256 {
                let (xq, xs, xsum) = (acts.eo.as_ptr(), acts.scale.as_ptr(), acts.sum.as_ptr());
                // SAFETY: super-block s < k / 256 lies inside the row, and its 256
                // activations, 8 scales and 8 sums inside `acts` (the trait's contract); so
                // do the features. Prefetches never fault.
                unsafe {
                    let mut acc = _mm256_setzero_ps();
                    let mut acc_min = _mm256_setzero_ps();
                    for s in 0..acts.k / Self::BE {
                        let p = row.add(s * Self::BB);
                        prefetch(p.wrapping_add(PREFETCH), Self::BB);
                        let dots = <Self as pairs::KDots>::dots(p, xq.add(s * Self::BE));
                        let sums = _mm256_cvtepi32_ps(reduce8(&dots));
                        let (a, c) = k45_scales(p);
                        let x_scale = _mm256_loadu_ps(xs.add(8 * s));
                        acc = _mm256_fmadd_ps(sums, _mm256_mul_ps(a, x_scale), acc);
                        acc_min = _mm256_fmadd_ps(c, _mm256_loadu_ps(xsum.add(8 * s)), acc_min);
                    }
                    _mm256_add_ps(acc, acc_min)
                }
            }
        }
    };
}
k45_one_row!(Q4_K);
k45_one_row!(Q5_K);

/// The one-row kernel of Q6_K: per super-block, the 16 half-groups' integer sums reduced
/// into two vectors (lane t of the first is half-group t, of the second t + 8), less 32 times
/// the activations' half-group sums, times their scales `d·sc` and the activation scale of
/// the group each half belongs to.
impl OneRow for Q6_K {
    fn row_bytes(k: usize) -> usize {
        k / Self::BE * Self::BB
    }

    #[inline(always)]
    unsafe fn lanes(row: *const u8, acts: &QuantizedActs) -> __m256 {
        let (xq, xs, isum) = (acts.eo.as_ptr(), acts.scale.as_ptr(), acts.isum16.as_ptr());
        // SAFETY: super-block s < k / 256 lies inside the row, and its 256 activations, 8
        // scales and 16 half-group sums inside `acts` (the trait's contract); so do the
        // features. Prefetches never fault.
        unsafe {
            let dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
            let mut acc0 = _mm256_setzero_ps();
            let mut acc1 = _mm256_setzero_ps();
            for s in 0..acts.k / Self::BE {
                let p = row.add(s * Self::BB);
                prefetch(p.wrapping_add(PREFETCH), Self::BB);
                let [h0, h1] = pairs::q6k_halves(p, xq.add(s * Self::BE));
                let off = |v: __m256i, at: usize| {
                    let x = _mm256_loadu_si256(isum.add(16 * s + at) as *const __m256i);
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_slli_epi32::<5>(x)))
                };
                let [a0, a1] = q6k_scales(p);
                let x0 = _mm256_castps128_ps256(_mm_loadu_ps(xs.add(8 * s)));
                let x1 = _mm256_castps128_ps256(_mm_loadu_ps(xs.add(8 * s + 4)));
                let s0 = _mm256_mul_ps(a0, _mm256_permutevar8x32_ps(x0, dup));
                let s1 = _mm256_mul_ps(a1, _mm256_permutevar8x32_ps(x1, dup));
                acc0 = _mm256_fmadd_ps(off(h0, 0), s0, acc0);
                acc1 = _mm256_fmadd_ps(off(h1, 8), s1, acc1);
            }
            _mm256_add_ps(acc0, acc1)
        }
    }
}
