//! The decode step's own case with 256-bit vectors: one row of `x` (m = 1) against a
//! 32-element format (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), where each block is one group with one
//! f16 scale (and minimum) at its start.
//!
//! Blocks are taken in runs of 8. Each block's integer dot product with `xq` stays an i32
//! vector; the run's 8 vectors are then reduced with `hadd` into one vector whose lane `t` is
//! block `t`'s sum, converted to f32 once and multiplied by the 8 blocks' scales
//! (`d` widened 8 at a time with F16C, times the 8 contiguous activation scales). The
//! minimums' term `m·Σx` takes one FMA per run. Against the general frame
//! ([`super::avx2::columns_with`]), which converts and fuses every group on its own, this
//! saves a conversion, a broadcast and a dependent FMA per block, and gathers no scales into
//! memory first. The general frame still serves m > 1 and the K-formats.

use super::avx2::{Sink, Unpack, W2};
use crate::quant::act::{QuantizedActs, ACT_BLOCK};
use crate::SharedOut;
use core::arch::x86_64::*;

/// Receives one block's single group and keeps its integer dot product with `x`.
struct Dot {
    x: *const i16,
    out: __m256i,
}

impl Sink<W2> for Dot {
    #[inline(always)]
    unsafe fn group(&mut self, _: usize, _: bool, w: W2) {
        // SAFETY: `x` points to the block's 32 activations (set by the caller).
        let (x0, x1) = unsafe {
            (
                _mm256_loadu_si256(self.x as *const __m256i),
                _mm256_loadu_si256(self.x.add(16) as *const __m256i),
            )
        };
        // |q| ≤ 128 and |xq| ≤ 32767: 32 products sum well inside i32.
        // SAFETY: the caller has AVX2 (the trait's contract); register arithmetic only.
        self.out =
            unsafe { _mm256_add_epi32(_mm256_madd_epi16(w.0, x0), _mm256_madd_epi16(w.1, x1)) };
    }
}

/// The integer dot product of the block at `p` with the 32 activations at `x`, as 8 i32
/// lanes whose sum it is.
///
/// # Safety
/// `p` points to one block of `F`, `x` to 32 readable i16; AVX2.
#[inline(always)]
unsafe fn block_dot<F: Unpack<W2>>(p: *const u8, x: *const i16) -> __m256i {
    // SAFETY: the caller's contract (one block at `p`, 32 i16 at `x`, AVX2) is what
    // `F::block` and the `Dot` sink's loads need.
    unsafe {
        let mut dot = Dot {
            x,
            out: _mm256_setzero_si256(),
        };
        F::block(p, &mut dot);
        dot.out
    }
}

/// The f16 at byte `at` of each of the 8 blocks from `p` (stride `bb`), widened; blocks at
/// or past `count` give 0.
///
/// # Safety
/// `p` points to `count ≤ 8` blocks of `bb ≥ at + 2` bytes; AVX2 and F16C.
#[inline(always)]
unsafe fn halfs8(p: *const u8, bb: usize, at: usize, count: usize) -> __m256 {
    let mut v = [0i16; 8];
    for (t, h) in v.iter_mut().enumerate().take(count) {
        // SAFETY: block t < count lies inside the row.
        *h = unsafe { (p.add(t * bb + at) as *const i16).read_unaligned() };
    }
    // SAFETY: the caller has AVX2 and F16C (this function's contract); registers only.
    unsafe {
        _mm256_cvtph_ps(_mm_setr_epi16(
            v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7],
        ))
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

/// `y[j] = x·W[j]ᵀ (+ b[j])` for `j` in `j0..j1`, with `x` one row.
///
/// # Safety
/// AVX2, FMA and F16C; `acts.m == 1`; `F` is a 32-element format; `w` holds `n` rows of
/// `acts.k` elements; `y` points to `n` floats of which no one else touches `j0..j1`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn columns<F: Unpack<W2>>(
    y: SharedOut,
    acts: &QuantizedActs,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    debug_assert!(acts.m == 1 && F::BE == ACT_BLOCK && j1 <= n);
    let nb = acts.k / ACT_BLOCK;
    let row_bytes = nb * F::BB;
    let (xq, xs, xsum) = (acts.q.as_ptr(), acts.scale.as_ptr(), acts.sum.as_ptr());
    for j in j0..j1 {
        // SAFETY: (every access below) row j < n lies inside w; block b < nb inside it;
        // activation block b < nb inside xq (32 each), xs and xsum (the caller's contract);
        // the features are the caller's contract too.
        unsafe {
            let row = w.as_ptr().add(j * row_bytes);
            let mut acc = _mm256_setzero_ps();
            let mut acc_min = _mm256_setzero_ps();
            let mut b = 0;
            // Whole runs of 8 (a constant trip count keeps the 8 sums in registers), then
            // the tail.
            while b + 8 <= nb {
                let mut p = [_mm256_setzero_si256(); 8];
                for (t, pt) in p.iter_mut().enumerate() {
                    *pt = block_dot::<F>(row.add((b + t) * F::BB), xq.add((b + t) * ACT_BLOCK));
                }
                let first = row.add(b * F::BB);
                let sums = _mm256_cvtepi32_ps(reduce8(&p));
                let scale = _mm256_mul_ps(halfs8(first, F::BB, 0, 8), _mm256_loadu_ps(xs.add(b)));
                acc = _mm256_fmadd_ps(sums, scale, acc);
                if F::MIN {
                    let x_sum = _mm256_loadu_ps(xsum.add(b));
                    acc_min = _mm256_fmadd_ps(halfs8(first, F::BB, 2, 8), x_sum, acc_min);
                }
                b += 8;
            }
            if b < nb {
                let count = nb - b;
                let mut p = [_mm256_setzero_si256(); 8];
                for (t, pt) in p.iter_mut().enumerate().take(count) {
                    *pt = block_dot::<F>(row.add((b + t) * F::BB), xq.add((b + t) * ACT_BLOCK));
                }
                // Lanes past `count` have d = m = 0 and zero activation scales and sums.
                let mut s = [0.0f32; 8];
                let mut m = [0.0f32; 8];
                s[..count].copy_from_slice(std::slice::from_raw_parts(xs.add(b), count));
                m[..count].copy_from_slice(std::slice::from_raw_parts(xsum.add(b), count));
                let first = row.add(b * F::BB);
                let sums = _mm256_cvtepi32_ps(reduce8(&p));
                let scale =
                    _mm256_mul_ps(halfs8(first, F::BB, 0, count), _mm256_loadu_ps(s.as_ptr()));
                acc = _mm256_fmadd_ps(sums, scale, acc);
                if F::MIN {
                    let x_sum = _mm256_loadu_ps(m.as_ptr());
                    acc_min = _mm256_fmadd_ps(halfs8(first, F::BB, 2, count), x_sum, acc_min);
                }
            }
            let v = crate::simd::avx2::hsum(_mm256_add_ps(acc, acc_min));
            *y.get().add(j) = v + bias.map_or(0.0, |b| b[j]);
        }
    }
}
