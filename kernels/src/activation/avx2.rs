//! The AVX2+FMA bodies of [`super`]'s kernels. Every function here is `unsafe`; the contract
//! they share is that the caller has checked [`crate::simd::Isa::avx2_fma_f16c`] (or runs
//! inside a `#[target_feature]` function with those features), and each states any other.

use crate::simd::avx2::{exp, exp_nonpositive, hmax, hsum};
use core::arch::x86_64::*;

/// An 8-lane elementwise function, inlined into the `#[target_feature]` loop.
pub trait Map8 {
    /// Applies the function to 8 lanes.
    ///
    /// # Safety
    /// The caller must have AVX2 and FMA.
    unsafe fn f(x: __m256) -> __m256;
}

/// Applies `M` to every element; the tail (< 8 elements) goes through a padded register
/// so it gets exactly the same arithmetic as the body.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn map_inplace<M: Map8>(x: &mut [f32]) {
    let n8 = x.len() / 8 * 8;
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 ≤ n8 ≤ len.
        unsafe { _mm256_storeu_ps(p.add(i), M::f(_mm256_loadu_ps(p.add(i)))) };
        i += 8;
    }
    let tail = &mut x[n8..];
    if !tail.is_empty() {
        let mut buf = [0.0f32; 8];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: `buf` holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(buf.as_mut_ptr(), M::f(_mm256_loadu_ps(buf.as_ptr()))) };
        let n = tail.len();
        tail.copy_from_slice(&buf[..n]);
    }
}

/// `x / (1 + e^(−x))`.
///
/// # Safety
/// The caller must have AVX2 and FMA.
#[inline(always)]
unsafe fn silu8(x: __m256) -> __m256 {
    // SAFETY: the caller has AVX2 and FMA (this function's contract); the intrinsics only compute
    // on registers.
    unsafe {
        let e = exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
    }
}

/// SiLU.
pub struct Silu;
impl Map8 for Silu {
    #[inline(always)]
    unsafe fn f(x: __m256) -> __m256 {
        // SAFETY: the caller has AVX2 and FMA (this function's contract); the intrinsics only compute
        // on registers.
        unsafe { silu8(x) }
    }
}

/// GELU, tanh approximation, as `x / (1 + e^(−2u))`, `u = β(x + κx³)`.
pub struct GeluTanh;
impl Map8 for GeluTanh {
    #[inline(always)]
    unsafe fn f(x: __m256) -> __m256 {
        // SAFETY: the caller has AVX2 and FMA (this function's contract); the intrinsics only compute
        // on registers.
        unsafe {
            let beta = _mm256_set1_ps(super::GELU_TANH_BETA);
            let x2 = _mm256_mul_ps(x, x);
            // −2u = x · (−2β − 2βκ·x²)
            let c = _mm256_fmadd_ps(
                x2,
                _mm256_set1_ps(-2.0 * super::GELU_TANH_BETA * super::GELU_TANH_KAPPA),
                _mm256_mul_ps(beta, _mm256_set1_ps(-2.0)),
            );
            let e = exp(_mm256_mul_ps(x, c));
            _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
        }
    }
}

/// `erf(t)/t = P(t²)` on `0 ≤ t ≤ 1`, coefficients of `t⁰, t², t⁴, …` (Chebyshev
/// least-squares fit, max abs error of `t·P(t²)` about 1e-7 in f32 arithmetic).
const ERF_SMALL: [f32; 7] = [
    // The fit's constant term rounds to the same f32 as 2/√π.
    std::f32::consts::FRAC_2_SQRT_PI,
    -0.376_126_26,
    0.112_835_97,
    -0.026_854_329,
    0.005_189_312,
    -0.000_801_885_5,
    0.000_078_824_97,
];

/// `h(u) = t·e^(t²)·erfc(t)` with `u = 1/t ∈ [1/9.4, 1]`, as a polynomial in
/// `v = u·H_SCALE − H_SHIFT ∈ [−1, 1]` (Chebyshev fit converted to monomials in the
/// mapped variable; relative error about 8e-8 in f32 arithmetic).
const ERFC_LARGE: [f32; 12] = [
    0.501_810_55,
    -0.076_029_88,
    -0.003_878_905,
    0.008_663_538,
    -0.003_830_968,
    0.000_891_386_7,
    0.000_066_854_39,
    -0.000_207_041_7,
    0.000_162_722_3,
    -0.000_067_163_7,
    -0.000_013_598_53,
    0.000_016_077_74,
];
const H_T_MAX: f32 = 9.4;
const H_SCALE: f32 = 2.238_095_3;
const H_SHIFT: f32 = 1.238_095_3;

/// `c[0] + c[1]·x + … + c[N−1]·x^(N−1)` for 8 lanes, in Horner form.
///
/// # Safety
/// The caller must have AVX2 and FMA.
#[inline(always)]
unsafe fn horner<const N: usize>(c: &[f32; N], x: __m256) -> __m256 {
    // SAFETY: the caller has AVX2 and FMA (this function's contract); the intrinsics only compute
    // on registers.
    unsafe {
        let mut p = _mm256_set1_ps(c[N - 1]);
        let mut k = N - 1;
        while k > 0 {
            k -= 1;
            p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(c[k]));
        }
        p
    }
}

/// Exact GELU: `0.5·x·w` with `w = 1 + erf(x/√2)`, i.e. `erfc(t)` for `x < 0` and
/// `2 − erfc(t)` for `x ≥ 0`, where `t = |x|/√2`.
pub struct GeluErf;
impl Map8 for GeluErf {
    #[inline(always)]
    unsafe fn f(x: __m256) -> __m256 {
        // SAFETY: the caller has AVX2 and FMA (this function's contract); the intrinsics only compute
        // on registers.
        unsafe {
            let one = _mm256_set1_ps(1.0);
            let half = _mm256_set1_ps(0.5);
            let ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
            let t = _mm256_mul_ps(ax, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
            // t² = x²/2 kept as hi + lo (FMA gives the exact rounding error of x·x).
            let xx_hi = _mm256_mul_ps(x, x);
            let xx_lo = _mm256_fmsub_ps(x, x, xx_hi);
            let t2 = _mm256_mul_ps(xx_hi, half);

            // Small branch: erfc = 1 − t·P(t²).
            let small = _mm256_fnmadd_ps(t, horner(&ERF_SMALL, t2), one);

            // Large branch: erfc = e^(−t²) · h(u) · u, u = 1/t, t clamped to [1, T_MAX].
            let tc = _mm256_min_ps(_mm256_max_ps(t, one), _mm256_set1_ps(H_T_MAX));
            let u = _mm256_div_ps(one, tc);
            let v = _mm256_fmsub_ps(u, _mm256_set1_ps(H_SCALE), _mm256_set1_ps(H_SHIFT));
            let h = horner(&ERFC_LARGE, v);
            // e^(−(hi+lo)/2) ≈ e^(−hi/2)·(1 − lo/2)
            let g = exp(_mm256_sub_ps(_mm256_setzero_ps(), t2));
            let g = _mm256_fnmadd_ps(g, _mm256_mul_ps(xx_lo, half), g);
            let large = _mm256_mul_ps(_mm256_mul_ps(g, h), u);

            let is_small = _mm256_cmp_ps::<_CMP_LT_OQ>(t, one);
            let erfc_t = _mm256_blendv_ps(large, small, is_small);
            let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps());
            let w = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.0), erfc_t), erfc_t, neg);
            _mm256_mul_ps(_mm256_mul_ps(half, x), w)
        }
    }
}

/// `out = M(gate) · up`, equal lengths (SwiGLU with [`Silu`], GeGLU with [`GeluTanh`]).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C, and `gate` and `up` must hold at least
/// `out.len()` values (their vector loads run to `out.len()` rounded down to 8).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn glu<M: Map8>(out: &mut [f32], gate: &[f32], up: &[f32]) {
    let n = out.len();
    let n8 = n / 8 * 8;
    let (o, g, u) = (out.as_mut_ptr(), gate.as_ptr(), up.as_ptr());
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 ≤ n8 ≤ len of all three slices (equal, checked by the caller).
        unsafe {
            let s = M::f(_mm256_loadu_ps(g.add(i)));
            _mm256_storeu_ps(o.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.add(i))));
        }
        i += 8;
    }
    if n8 < n {
        let r = n - n8;
        let mut gb = [0.0f32; 8];
        let mut ub = [0.0f32; 8];
        gb[..r].copy_from_slice(&gate[n8..]);
        ub[..r].copy_from_slice(&up[n8..]);
        // SAFETY: the buffers hold exactly 8 f32 each.
        unsafe {
            let s = M::f(_mm256_loadu_ps(gb.as_ptr()));
            _mm256_storeu_ps(
                gb.as_mut_ptr(),
                _mm256_mul_ps(s, _mm256_loadu_ps(ub.as_ptr())),
            );
        }
        out[n8..].copy_from_slice(&gb[..r]);
    }
}

/// Taylor coefficients of `tanh(u)/u` in `u²` (`1, −1/3, 2/15, −17/315, 62/2835,
/// −1382/155925`): below `|u| = 1/4` the next term is under 3e-11 of `u`.
const TANH_SMALL: [f32; 6] = [
    1.0,
    -1.0 / 3.0,
    2.0 / 15.0,
    -17.0 / 315.0,
    62.0 / 2835.0,
    -1382.0 / 155_925.0,
];

/// `tanh(x)` for 8 lanes: the polynomial above for `|x| < 1/4`, else
/// `(1 − t)/(1 + t)` with `t = e^(−2|x|)` and the sign of `x` (no cancellation: `t ≤ 0.61`
/// there). NaN lanes stay NaN.
///
/// # Safety
/// The caller must have AVX2 and FMA.
#[inline(always)]
pub unsafe fn tanh8(x: __m256) -> __m256 {
    // SAFETY: the caller has AVX2 and FMA (this function's contract); the intrinsics only compute
    // on registers.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let ax = _mm256_andnot_ps(sign, x);
        let x2 = _mm256_mul_ps(x, x);
        let small = _mm256_mul_ps(x, horner(&TANH_SMALL, x2));
        let one = _mm256_set1_ps(1.0);
        let t = exp_nonpositive(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0)));
        let large = _mm256_div_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t));
        let large = _mm256_or_ps(large, _mm256_and_ps(x, sign));
        let is_small = _mm256_cmp_ps::<_CMP_LT_OQ>(ax, _mm256_set1_ps(0.25));
        let r = _mm256_blendv_ps(large, small, is_small);
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        _mm256_blendv_ps(r, x, nan)
    }
}

/// See [`super::softcap_inplace`].
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn softcap(x: &mut [f32], cap: f32) {
    // SAFETY: the function's contract.
    unsafe { softcap_body(x, cap) }
}

/// The body of [`softcap`], inlined into callers that have the features (the attention
/// kernel's score soft-capping). The tail goes through a padded register, so every
/// element gets the same arithmetic.
///
/// # Safety
/// The caller must have AVX2 and FMA.
#[inline(always)]
pub unsafe fn softcap_body(x: &mut [f32], cap: f32) {
    // x / cap as x · (1/cap) would round twice; divide exactly like the reference.
    // SAFETY: the caller has AVX (this function's contract); a register broadcast.
    let c = unsafe { _mm256_set1_ps(cap) };
    let n8 = x.len() / 8 * 8;
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 ≤ n8 ≤ len.
        unsafe {
            let v = _mm256_div_ps(_mm256_loadu_ps(p.add(i)), c);
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(c, tanh8(v)));
        }
        i += 8;
    }
    let tail = &mut x[n8..];
    if !tail.is_empty() {
        let mut buf = [0.0f32; 8];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: `buf` holds exactly 8 f32.
        unsafe {
            let v = _mm256_div_ps(_mm256_loadu_ps(buf.as_ptr()), c);
            _mm256_storeu_ps(buf.as_mut_ptr(), _mm256_mul_ps(c, tanh8(v)));
        }
        let n = tail.len();
        tail.copy_from_slice(&buf[..n]);
    }
}

/// Row softmax; see [`super::softmax_inplace`].
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn softmax(x: &mut [f32]) {
    let n = x.len();
    let n8 = n / 8 * 8;
    // SAFETY: AVX2 is available (the function's contract).
    let (max, has_nan) = unsafe { max_and_nan(x) };
    let p = x.as_mut_ptr();
    // NaN or +inf: let the scalar path produce PyTorch's NaNs (the max skips NaN and the
    // vector exp clamps it).
    if has_nan || max == f32::INFINITY {
        super::softmax_inplace_scalar(x);
        return;
    }
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }

    let m = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 ≤ n8 ≤ len.
        unsafe {
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m));
            _mm256_storeu_ps(p.add(i), e);
            acc = _mm256_add_ps(acc, e);
        }
        i += 8;
    }
    if n8 < n {
        // Pad with -inf: exp(-inf - max) is exactly 0 and adds nothing to the sum.
        let mut buf = [f32::NEG_INFINITY; 8];
        buf[..n - n8].copy_from_slice(&x[n8..]);
        // SAFETY: `buf` holds exactly 8 f32.
        unsafe {
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), m));
            _mm256_storeu_ps(buf.as_mut_ptr(), e);
            acc = _mm256_add_ps(acc, e);
        }
        x[n8..].copy_from_slice(&buf[..n - n8]);
    }
    // SAFETY: AVX2 is available (the function's contract).
    let sum = unsafe { hsum(acc) };
    let inv = _mm256_set1_ps(1.0 / sum);
    // Taken again: the tail above went through `x`, which ends what `p` may do (Miri found
    // the write through the old pointer, an aliasing violation, in `softmax_matches_scalar`).
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 ≤ n8 ≤ len.
        unsafe { _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv)) };
        i += 8;
    }
    let inv = 1.0 / sum;
    for v in &mut x[n8..] {
        *v *= inv;
    }
}

/// The largest non-NaN entry (`-inf` if none) and whether any entry is NaN.
///
/// # Safety
/// The caller must have AVX2.
#[inline(always)]
unsafe fn max_and_nan(x: &[f32]) -> (f32, bool) {
    let n8 = x.len() / 8 * 8;
    let p = x.as_ptr();
    // SAFETY: the caller has AVX2 (this function's contract); every load reads 8 f32 at
    // i with i + 8 ≤ n8 ≤ len.
    let (mut max, mut has_nan) = unsafe {
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut nan = _mm256_setzero_ps();
        let mut i = 0;
        while i < n8 {
            let v = _mm256_loadu_ps(p.add(i));
            // max_ps returns its second operand when either is NaN: NaN lanes keep vmax.
            vmax = _mm256_max_ps(v, vmax);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            i += 8;
        }
        (hmax(vmax), _mm256_movemask_ps(nan) != 0)
    };
    for &v in &x[n8..] {
        if v.is_nan() {
            has_nan = true;
        } else {
            max = max.max(v);
        }
    }
    (max, has_nan)
}

/// See [`super::log_sum_exp`].
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn log_sum_exp(x: &[f32]) -> f32 {
    // SAFETY: the function's contract.
    let (max, has_nan) = unsafe { max_and_nan(x) };
    if has_nan {
        return f32::NAN;
    }
    if max.is_infinite() {
        return max;
    }
    let (n, n8, p) = (x.len(), x.len() / 8 * 8, x.as_ptr());
    let m = _mm256_set1_ps(max);
    // Two accumulators: the exp chain, not the adds, should set the pace.
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n8 {
        // SAFETY: i + 16 ≤ n8 ≤ len.
        unsafe {
            a0 = _mm256_add_ps(a0, exp(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m)));
            a1 = _mm256_add_ps(a1, exp(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), m)));
        }
        i += 16;
    }
    if i < n8 {
        // SAFETY: i + 8 ≤ n8 ≤ len; `exp` needs AVX2 and FMA, which this function has.
        a0 = _mm256_add_ps(a0, unsafe {
            exp(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m))
        });
    }
    if n8 < n {
        // Pad with -inf: exp(-inf - max) is exactly 0.
        let mut buf = [f32::NEG_INFINITY; 8];
        buf[..n - n8].copy_from_slice(&x[n8..]);
        // SAFETY: `buf` holds exactly 8 f32; `exp` needs AVX2 and FMA, which this
        // function has.
        a1 = _mm256_add_ps(a1, unsafe {
            exp(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), m))
        });
    }
    // SAFETY: AVX2 is available (the function's contract).
    let sum = unsafe { hsum(_mm256_add_ps(a0, a1)) };
    max + sum.ln()
}

/// See [`super::argmax`]: one pass for the maximum, one for its first position.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn argmax(x: &[f32]) -> usize {
    // SAFETY: the function's contract.
    let (max, _) = unsafe { max_and_nan(x) };
    let (n8, p) = (x.len() / 8 * 8, x.as_ptr());
    let m = _mm256_set1_ps(max);
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 ≤ n8 ≤ len.
        let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(unsafe { _mm256_loadu_ps(p.add(i)) }, m);
        let bits = _mm256_movemask_ps(eq);
        if bits != 0 {
            return i + bits.trailing_zeros() as usize;
        }
        i += 8;
    }
    // The tail, or a row without a number (max = -inf matches only real -inf entries).
    x[n8..].iter().position(|&v| v == max).map_or(0, |k| n8 + k)
}
