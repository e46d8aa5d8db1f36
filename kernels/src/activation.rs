//! Elementwise activations, the SwiGLU and GeGLU gates, soft-capping, the row softmax and the
//! residual add.
//!
//! Every kernel has a plain `*_scalar` reference beside it. The fast versions of the
//! kernels that only need `+ · max` ([`relu_inplace`], [`add_inplace`]) are one generic body
//! dispatched at run time through [`pulp::Arch`]; the ones that need a vector `exp` or `erf`
//! ([`silu_inplace`], [`swiglu`], [`gelu_tanh_inplace`], [`geglu_tanh`], [`gelu_erf_inplace`],
//! [`softcap_inplace`], [`softmax_inplace`]) are written for AVX2+FMA with
//! [`simd::avx2::exp`](crate::simd) and fall back to scalar code on other CPUs (or with
//! `QKV_ISA=scalar`): their reference, except [`gelu_tanh_inplace`] and [`geglu_tanh`],
//! whose fallback keeps the vector path's sigmoid form.
//!
//! ```
//! use qkv_kernels::activation::{softmax_inplace, swiglu};
//! let mut row = [1.0f32, 2.0, 3.0];
//! softmax_inplace(&mut row);
//! assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
//!
//! let mut out = [0.0f32; 2];
//! swiglu(&mut out, &[0.0, 1.0], &[5.0, 2.0]).unwrap();
//! assert_eq!(out[0], 0.0); // silu(0) = 0
//! ```

use crate::error::{check_len, Result};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

/// `sqrt(2/π)`, the GELU tanh-approximation scale (PyTorch's `kBeta`).
const GELU_TANH_BETA: f32 = 0.797_884_6;
/// The cubic coefficient of the GELU tanh approximation (PyTorch's `kKappa`).
const GELU_TANH_KAPPA: f32 = 0.044_715;

// ---------------------------------------------------------------------------------------
// erf
// ---------------------------------------------------------------------------------------

/// The error function `erf(x) = 2/√π ∫₀ˣ e^(−t²) dt`, correctly rounded to f32 in all but
/// rare ties (evaluated in f64 with relative error below 1e-14, see [`erf_f64`]).
pub fn erf(x: f32) -> f32 {
    erf_f64(x as f64) as f32
}

/// The complementary error function `erfc(x) = 1 − erf(x)`, accurate in relative terms
/// even where it is tiny (large positive `x`), rounded to f32.
pub fn erfc(x: f32) -> f32 {
    erfc_f64(x as f64) as f32
}

/// Below this `|x|` the error function is summed from its everywhere-positive series;
/// at and above it `erfc` comes from its continued fraction.
const ERF_SERIES_LIMIT: f64 = 2.5;

/// `erf(x)` in f64, relative error below 1e-14 over the whole line.
///
/// For `|x| < 2.5` it sums `erf(x) = 2/√π · e^(−x²) · Σₙ 2ⁿ x^(2n+1) / (1·3·…·(2n+1))`, a
/// series of positive terms (no cancellation; at most ~45 terms). For `|x| ≥ 2.5` it uses
/// `erf = 1 − erfc` with `erfc` from its continued fraction (see [`erfc_f64`]).
pub fn erf_f64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < ERF_SERIES_LIMIT {
        erf_series(a)
    } else {
        1.0 - erfc_continued_fraction(a)
    };
    r.copysign(x)
}

/// `erfc(x)` in f64, relative error below 1e-13 for every `x` where the result is normal.
pub fn erfc_f64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x >= ERF_SERIES_LIMIT {
        erfc_continued_fraction(x)
    } else if x > -ERF_SERIES_LIMIT {
        1.0 - erf_f64(x)
    } else {
        2.0 - erfc_continued_fraction(-x)
    }
}

/// The positive series for `erf(a)`, `0 ≤ a < 2.5`.
fn erf_series(a: f64) -> f64 {
    if a == 0.0 {
        return 0.0;
    }
    let a2 = a * a;
    let mut term = a;
    let mut sum = a;
    for n in 0..200 {
        term *= 2.0 * a2 / (2 * n + 3) as f64;
        sum += term;
        if term < 1e-17 * sum {
            break;
        }
    }
    std::f64::consts::FRAC_2_SQRT_PI * (-a2).exp() * sum
}

/// `erfc(a)` for `a ≥ 2.5` from the continued fraction
/// `erfc(a) = e^(−a²)/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + …))))`, evaluated backwards
/// from a fixed depth of 40 (converged to f64 precision from `a = 2.5` on).
fn erfc_continued_fraction(a: f64) -> f64 {
    // erfc(27) ≈ 5e-319: below that the result is 0 (also for a = +inf).
    if a > 27.0 {
        return 0.0;
    }
    let mut f = a;
    for k in (1..=40).rev() {
        f = a + (k as f64 * 0.5) / f;
    }
    // e^(−a²) with a² split into its rounded value and the rounding error, so the
    // exponent is exact to well below an ulp of the result.
    let hi = a * a;
    let lo = a.mul_add(a, -hi);
    (-hi).exp() * (1.0 - lo) / (std::f64::consts::PI.sqrt() * f)
}

// ---------------------------------------------------------------------------------------
// ReLU
// ---------------------------------------------------------------------------------------

/// `x = max(x, 0)` in place. A NaN becomes 0 (as in the scalar reference).
pub fn relu_inplace(x: &mut [f32]) {
    struct Op<'a>(&'a mut [f32]);
    impl WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let (head, tail) = S::as_mut_simd_f32s(self.0);
            let zero = simd.splat_f32s(0.0);
            for v in head {
                // max(v, 0) picks the second operand (0) when v is NaN on x86.
                *v = simd.max_f32s(*v, zero);
            }
            relu_inplace_scalar(tail);
        }
    }
    pulp::Arch::new().dispatch(Op(x));
}

scalar_reference! {
    /// Scalar reference for [`relu_inplace`].
    pub fn relu_inplace_scalar(x: &mut [f32]) {
        for v in x {
            *v = if *v > 0.0 { *v } else { 0.0 };
        }
    }
}

// ---------------------------------------------------------------------------------------
// residual add
// ---------------------------------------------------------------------------------------

/// `dst += src` elementwise (the residual add). Errors if the lengths differ.
pub fn add_inplace(dst: &mut [f32], src: &[f32]) -> Result<()> {
    check_len("src", dst.len(), src.len())?;
    match crate::par::par_elems(dst.len()) {
        Some(piece) => dst
            .par_chunks_mut(piece)
            .zip(src.par_chunks(piece))
            .for_each(|(d, s)| add_serial(d, s)),
        None => add_serial(dst, src),
    }
    Ok(())
}

/// [`add_inplace`] on the calling thread; the lengths are equal.
fn add_serial(dst: &mut [f32], src: &[f32]) {
    struct Op<'a>(&'a mut [f32], &'a [f32]);
    impl WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let (dh, dt) = S::as_mut_simd_f32s(self.0);
            let (sh, st) = S::as_simd_f32s(self.1);
            for (d, s) in dh.iter_mut().zip(sh) {
                *d = simd.add_f32s(*d, *s);
            }
            for (d, s) in dt.iter_mut().zip(st) {
                *d += *s;
            }
        }
    }
    pulp::Arch::new().dispatch(Op(dst, src));
}

/// Scalar reference for [`add_inplace`].
#[cfg(any(test, feature = "testing"))]
pub fn add_inplace_scalar(dst: &mut [f32], src: &[f32]) -> Result<()> {
    check_len("src", dst.len(), src.len())?;
    for (d, s) in dst.iter_mut().zip(src) {
        *d += *s;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// SiLU / SwiGLU
// ---------------------------------------------------------------------------------------

/// `x = x · sigmoid(x) = x / (1 + e^(−x))` in place (SiLU, a.k.a. swish).
pub fn silu_inplace(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        unsafe { avx2::map_inplace::<avx2::Silu>(x) };
        return;
    }
    silu_inplace_scalar(x);
}

scalar_reference! {
    /// Scalar reference for [`silu_inplace`]: `x / (1 + exp(−x))` in f32, PyTorch's formula.
    pub fn silu_inplace_scalar(x: &mut [f32]) {
        for v in x {
            *v = silu_scalar(*v);
        }
    }
}

#[inline]
fn silu_scalar(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `out = silu(gate) · up` elementwise: the gated FFN activation of Llama-style MLPs.
/// Errors unless `out`, `gate` and `up` have the same length.
pub fn swiglu(out: &mut [f32], gate: &[f32], up: &[f32]) -> Result<()> {
    check_len("gate", out.len(), gate.len())?;
    check_len("up", out.len(), up.len())?;
    match crate::par::par_elems(out.len()) {
        Some(piece) => out
            .par_chunks_mut(piece)
            .zip(gate.par_chunks(piece))
            .zip(up.par_chunks(piece))
            .for_each(|((o, g), u)| swiglu_serial(o, g, u)),
        None => swiglu_serial(out, gate, up),
    }
    Ok(())
}

/// [`swiglu`] on the calling thread; the three lengths are equal.
fn swiglu_serial(out: &mut [f32], gate: &[f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above; the three
        // lengths are equal (the caller checked).
        unsafe { avx2::glu::<avx2::Silu>(out, gate, up) };
        return;
    }
    swiglu_plain(out, gate, up);
}

/// The scalar loop of `swiglu_scalar`, lengths already checked.
fn swiglu_plain(out: &mut [f32], gate: &[f32], up: &[f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu_scalar(*g) * *u;
    }
}

/// Scalar reference for [`swiglu`]: `silu(gate)` rounded to f32, then times `up`
/// (the order of PyTorch's `F.silu(gate) * up`).
#[cfg(any(test, feature = "testing"))]
pub fn swiglu_scalar(out: &mut [f32], gate: &[f32], up: &[f32]) -> Result<()> {
    check_len("gate", out.len(), gate.len())?;
    check_len("up", out.len(), up.len())?;
    swiglu_plain(out, gate, up);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// GELU / GeGLU
// ---------------------------------------------------------------------------------------

/// The tanh approximation of GELU in place,
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (PyTorch `approximate="tanh"`, GPT-2's
/// `gelu_new`).
///
/// The vector path uses the identity `0.5·(1 + tanh(u)) = 1/(1 + e^(−2u))`, which avoids
/// the cancellation of `1 + tanh(u)` for negative `x` and needs only `exp`.
pub fn gelu_tanh_inplace(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        unsafe { avx2::map_inplace::<avx2::GeluTanh>(x) };
        return;
    }
    // Same sigmoid form as the vector path, one element at a time.
    for v in x {
        let a = *v;
        let minus_2u = -2.0 * GELU_TANH_BETA * (a + GELU_TANH_KAPPA * a * a * a);
        *v = a / (1.0 + minus_2u.exp());
    }
}

/// Scalar reference for [`gelu_tanh_inplace`]: PyTorch's formula literally, in f32.
#[cfg(any(test, feature = "testing"))]
pub fn gelu_tanh_inplace_scalar(x: &mut [f32]) {
    for v in x {
        let a = *v;
        let inner = GELU_TANH_BETA * (a + GELU_TANH_KAPPA * a * a * a);
        *v = 0.5 * a * (1.0 + inner.tanh());
    }
}

/// `out = gelu_tanh(gate) · up` elementwise: the gated FFN activation of Gemma's MLPs
/// (`gelu_pytorch_tanh`), computed as [`gelu_tanh_inplace`] computes GELU. Errors unless
/// `out`, `gate` and `up` have the same length.
///
/// ```
/// use qkv_kernels::activation::geglu_tanh;
/// let mut out = [0.0f32; 2];
/// geglu_tanh(&mut out, &[0.0, 10.0], &[5.0, 2.0]).unwrap();
/// assert_eq!(out[0], 0.0); // gelu(0) = 0
/// assert!((out[1] - 20.0).abs() < 1e-5); // gelu(10) ≈ 10
/// ```
pub fn geglu_tanh(out: &mut [f32], gate: &[f32], up: &[f32]) -> Result<()> {
    check_len("gate", out.len(), gate.len())?;
    check_len("up", out.len(), up.len())?;
    match crate::par::par_elems(out.len()) {
        Some(piece) => out
            .par_chunks_mut(piece)
            .zip(gate.par_chunks(piece))
            .zip(up.par_chunks(piece))
            .for_each(|((o, g), u)| geglu_tanh_serial(o, g, u)),
        None => geglu_tanh_serial(out, gate, up),
    }
    Ok(())
}

/// [`geglu_tanh`] on the calling thread; the three lengths are equal.
fn geglu_tanh_serial(out: &mut [f32], gate: &[f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above; the three
        // lengths are equal (the caller checked).
        unsafe { avx2::glu::<avx2::GeluTanh>(out, gate, up) };
        return;
    }
    // Same sigmoid form as the vector path, one element at a time.
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let minus_2u = -2.0 * GELU_TANH_BETA * (g + GELU_TANH_KAPPA * g * g * g);
        *o = g / (1.0 + minus_2u.exp()) * u;
    }
}

/// Scalar reference for [`geglu_tanh`]: PyTorch's `gelu(gate, approximate="tanh")`
/// literally, rounded to f32, then times `up`.
#[cfg(any(test, feature = "testing"))]
pub fn geglu_tanh_scalar(out: &mut [f32], gate: &[f32], up: &[f32]) -> Result<()> {
    check_len("gate", out.len(), gate.len())?;
    check_len("up", out.len(), up.len())?;
    out.copy_from_slice(gate);
    gelu_tanh_inplace_scalar(out);
    for (o, &u) in out.iter_mut().zip(up) {
        *o *= u;
    }
    Ok(())
}

/// Exact GELU in place, `x·Φ(x) = 0.5·x·(1 + erf(x/√2))` (PyTorch's default `nn.GELU()`,
/// BERT's `gelu`).
///
/// The vector path evaluates `erfc(|x|/√2)` with a degree-6 polynomial in `x²` for
/// `|x| < √2` and `e^(−x²/2)·h(√2/|x|)·√2/|x|` (a degree-11 fit of `t·e^(t²)·erfc(t)`)
/// above, so the far negative tail keeps its relative accuracy; absolute error against the
/// f64 reference stays below about `3e-7·max(1, |x|)`.
pub fn gelu_erf_inplace(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        unsafe { avx2::map_inplace::<avx2::GeluErf>(x) };
        return;
    }
    gelu_erf_inplace_scalar(x);
}

scalar_reference! {
    /// Scalar reference for [`gelu_erf_inplace`]: `0.5·x·erfc(−x/√2)` evaluated in f64 with
    /// [`erfc_f64`] and rounded once to f32 (at least as accurate as PyTorch's f32 path).
    pub fn gelu_erf_inplace_scalar(x: &mut [f32]) {
        for v in x {
            let a = *v as f64;
            *v = (0.5 * a * erfc_f64(-a * std::f64::consts::FRAC_1_SQRT_2)) as f32;
        }
    }
}

// ---------------------------------------------------------------------------------------
// soft-capping
// ---------------------------------------------------------------------------------------

/// `x = cap · tanh(x / cap)` in place: Gemma 2's soft-capping of logits, which squashes them
/// smoothly into `(−cap, cap)`. `cap` should be positive and finite (the caller checks). A
/// NaN stays NaN.
///
/// The vector path evaluates `tanh(u)` as an odd Taylor polynomial for `|u| < 1/4` and as
/// `(1 − e^(−2|u|)) / (1 + e^(−2|u|))` above; its relative error stays below 1e-6 (see the
/// sweep in the tests), so the result is within `1e-6·|x|` of the scalar reference.
///
/// ```
/// use qkv_kernels::activation::softcap_inplace;
/// let mut x = [0.0f32, 1000.0, -1000.0];
/// softcap_inplace(&mut x, 30.0);
/// assert_eq!(x, [0.0, 30.0, -30.0]);
/// ```
pub fn softcap_inplace(x: &mut [f32], cap: f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        unsafe { avx2::softcap(x, cap) };
        return;
    }
    softcap_inplace_scalar(x, cap);
}

scalar_reference! {
    /// Scalar reference for [`softcap_inplace`]: `cap · tanh(x / cap)` in f32, in PyTorch's order
    /// (divide, `tanh`, multiply).
    pub fn softcap_inplace_scalar(x: &mut [f32], cap: f32) {
        for v in x {
            *v = cap * (*v / cap).tanh();
        }
    }
}

// ---------------------------------------------------------------------------------------
// softmax
// ---------------------------------------------------------------------------------------

/// Numerically stable softmax of one row in place: `x = e^(x − max) / Σ e^(x − max)`.
///
/// A row whose entries are all `-inf` (fully masked) becomes all zeros rather than NaN; an
/// empty row is left alone. A `+inf` or NaN entry gives NaN, as in PyTorch.
pub fn softmax_inplace(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        unsafe { avx2::softmax(x) };
        return;
    }
    softmax_inplace_scalar(x);
}

scalar_reference! {
    /// Scalar reference for [`softmax_inplace`]: f32 `exp`, the sum accumulated in f64.
    pub fn softmax_inplace_scalar(x: &mut [f32]) {
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        if max == f32::NEG_INFINITY {
            x.fill(0.0);
            return;
        }
        let mut sum = 0.0f64;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += *v as f64;
        }
        let inv = (1.0 / sum) as f32;
        for v in x.iter_mut() {
            *v *= inv;
        }
    }
}

// ---------------------------------------------------------------------------------------
// log-sum-exp and argmax (what a sampler reads from the logits)
// ---------------------------------------------------------------------------------------

/// `ln Σ eˣ` of a row, computed stably as `max + ln Σ e^(x − max)`.
///
/// An empty row or one of `-inf`s gives `-inf`; a NaN anywhere gives NaN; a `+inf` (and no
/// NaN) gives `+inf`, as `torch.logsumexp` does. The log-probability of entry `i` is
/// `x[i] − log_sum_exp(x)`, without writing a softmax anywhere.
///
/// ```
/// use qkv_kernels::activation::log_sum_exp;
/// let lse = log_sum_exp(&[0.0, (3.0f32).ln()]); // ln(1 + 3)
/// assert!((lse - (4.0f32).ln()).abs() < 1e-6);
/// ```
pub fn log_sum_exp(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::log_sum_exp(x) };
    }
    log_sum_exp_scalar(x)
}

scalar_reference! {
    /// Scalar reference for [`log_sum_exp`]: f32 `exp`, the sum accumulated in f64.
    pub fn log_sum_exp_scalar(x: &[f32]) -> f32 {
        if x.iter().any(|v| v.is_nan()) {
            return f32::NAN;
        }
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        if max.is_infinite() {
            return max;
        }
        let sum: f64 = x.iter().map(|&v| (v - max).exp() as f64).sum();
        max + (sum.ln() as f32)
    }
}

/// The index of the largest entry: the first one on ties, NaN never chosen; 0 for an empty
/// row or one without a number.
///
/// ```
/// use qkv_kernels::activation::argmax;
/// assert_eq!(argmax(&[0.5, f32::NAN, 2.0, 2.0]), 2);
/// ```
pub fn argmax(x: &[f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::argmax(x) };
    }
    argmax_scalar(x)
}

scalar_reference! {
    /// Scalar reference for [`argmax`].
    pub fn argmax_scalar(x: &[f32]) -> usize {
        let mut best: Option<(usize, f32)> = None;
        for (i, &v) in x.iter().enumerate() {
            if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
                best = Some((i, v));
            }
        }
        best.map_or(0, |(i, _)| i)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
