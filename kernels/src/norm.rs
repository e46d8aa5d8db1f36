//! Row normalisations: LayerNorm (PyTorch `nn.LayerNorm`) and RMSNorm (Llama).
//!
//! `x` and `out` hold `rows × dim` values row-major; each row of `dim` values is normalised
//! on its own. The fast versions are one generic body dispatched through [`pulp::Arch`]
//! (AVX-512, AVX2, NEON or scalar at run time); `*_scalar` are the plain references, which
//! accumulate their sums in f64.
//!
//! ```
//! use qkv_kernels::norm::rms_norm;
//! let x = [2.0f32; 4];
//! let w = [1.0f32, 2.0, 3.0, 4.0];
//! let mut out = [0.0f32; 4];
//! rms_norm(&mut out, &x, &w, 1e-6, 4).unwrap();
//! for (o, w) in out.iter().zip(w) {
//!     assert!((o - w).abs() <= 1e-6 * w);
//! }
//! ```

use crate::error::{check_len, check_nonzero, KernelError, Result};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

/// Checks `dim ≠ 0`, `eps` finite and positive, `x.len()` a multiple of `dim`, `out` as long
/// as `x`, and the per-feature vectors `dim` long.
fn validate(
    out: &[f32],
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    dim: usize,
) -> Result<()> {
    check_nonzero("dim", dim)?;
    // eps keeps 1/sqrt(var + eps) finite on a constant (or all-zero) row: 0, negative, NaN
    // or infinite values would turn such rows into NaN (or zeros, for +inf) silently.
    if !(eps.is_finite() && eps > 0.0) {
        return Err(KernelError::Invalid(format!(
            "norm eps must be finite and > 0, got {eps}"
        )));
    }
    if !x.len().is_multiple_of(dim) {
        return Err(KernelError::Invalid(format!(
            "`x` has {} elements, which is not a whole number of rows of dim {dim}",
            x.len()
        )));
    }
    check_len("out", x.len(), out.len())?;
    check_len("weight", dim, weight.len())?;
    if let Some(b) = bias {
        check_len("bias", dim, b.len())?;
    }
    Ok(())
}

/// LayerNorm over the last dimension, PyTorch `nn.LayerNorm` semantics:
/// `out = (x − mean) / sqrt(var + eps) · weight (+ bias)` per row, with the biased
/// variance (divide by `dim`) computed in two passes.
///
/// `x` and `out` are `rows × dim`; `weight` and `bias` are `dim` long; `eps` must be finite
/// and > 0. Errors if `dim == 0`, `eps` is not finite and positive, `x.len()` is not a
/// multiple of `dim`, or any other length disagrees.
pub fn layer_norm(
    out: &mut [f32],
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    dim: usize,
) -> Result<()> {
    validate(out, x, weight, bias, eps, dim)?;
    pulp::Arch::new().dispatch(LayerNormOp {
        out,
        x,
        weight,
        bias,
        eps,
        dim,
    });
    Ok(())
}

/// Scalar reference for [`layer_norm`]: two passes, sums in f64.
#[cfg(any(test, feature = "testing"))]
pub fn layer_norm_scalar(
    out: &mut [f32],
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    dim: usize,
) -> Result<()> {
    validate(out, x, weight, bias, eps, dim)?;
    for (o, xr) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
        let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
        let var = xr
            .iter()
            .map(|&v| {
                let d = v as f64 - mean;
                d * d
            })
            .sum::<f64>()
            / dim as f64;
        let rstd = 1.0 / (var + eps as f64).sqrt();
        for j in 0..dim {
            let y = (xr[j] as f64 - mean) * rstd * weight[j] as f64;
            o[j] = (y + bias.map_or(0.0, |b| b[j] as f64)) as f32;
        }
    }
    Ok(())
}

/// RMSNorm, Llama semantics: `out = x / sqrt(mean(x²) + eps) · weight` per row, the
/// normalised value rounded to f32 before the multiply by `weight` (as Hugging Face's
/// `LlamaRMSNorm` does in f32).
///
/// `x` and `out` are `rows × dim`; `weight` is `dim` long; `eps` must be finite and > 0.
/// Errors if `dim == 0`, `eps` is not finite and positive, `x.len()` is not a multiple of
/// `dim`, or any other length disagrees.
pub fn rms_norm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32, dim: usize) -> Result<()> {
    validate(out, x, weight, None, eps, dim)?;
    let run = |out: &mut [f32], x: &[f32]| {
        pulp::Arch::new().dispatch(RmsNormOp {
            out,
            x,
            weight,
            eps,
            dim,
        })
    };
    match crate::par::par_rows(x.len() / dim, dim) {
        Some(rows) => out
            .par_chunks_mut(rows * dim)
            .zip(x.par_chunks(rows * dim))
            .for_each(|(o, x)| run(o, x)),
        None => run(out, x),
    }
    Ok(())
}

/// Scalar reference for [`rms_norm`]: sum of squares in f64, then
/// `(x · rstd) · weight` in f32.
#[cfg(any(test, feature = "testing"))]
pub fn rms_norm_scalar(
    out: &mut [f32],
    x: &[f32],
    weight: &[f32],
    eps: f32,
    dim: usize,
) -> Result<()> {
    validate(out, x, weight, None, eps, dim)?;
    for (o, xr) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
        let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let rstd = (1.0 / (ms + eps as f64).sqrt()) as f32;
        for j in 0..dim {
            o[j] = (xr[j] * rstd) * weight[j];
        }
    }
    Ok(())
}

/// RMSNorm in place (`x` is both input and output); same semantics and errors as
/// [`rms_norm`].
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32, dim: usize) -> Result<()> {
    validate(x, x, weight, None, eps, dim)?;
    let run = |x: &mut [f32]| {
        pulp::Arch::new().dispatch(RmsNormInplaceOp {
            x,
            weight,
            eps,
            dim,
        })
    };
    match crate::par::par_rows(x.len() / dim, dim) {
        Some(rows) => x.par_chunks_mut(rows * dim).for_each(run),
        None => run(x),
    }
    Ok(())
}

/// Sum of `x` with four vector accumulators and a scalar tail.
#[inline(always)]
fn sum<S: Simd>(simd: S, x: &[f32]) -> f32 {
    let (head, tail) = S::as_simd_f32s(x);
    let zero = simd.splat_f32s(0.0);
    let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
    let mut quads = head.chunks_exact(4);
    for q in &mut quads {
        a0 = simd.add_f32s(a0, q[0]);
        a1 = simd.add_f32s(a1, q[1]);
        a2 = simd.add_f32s(a2, q[2]);
        a3 = simd.add_f32s(a3, q[3]);
    }
    for v in quads.remainder() {
        a0 = simd.add_f32s(a0, *v);
    }
    let acc = simd.add_f32s(simd.add_f32s(a0, a1), simd.add_f32s(a2, a3));
    simd.reduce_sum_f32s(acc) + tail.iter().sum::<f32>()
}

/// `Σ (x − c)²` with four vector accumulators and a scalar tail.
#[inline(always)]
fn sum_sq_dev<S: Simd>(simd: S, x: &[f32], c: f32) -> f32 {
    let (head, tail) = S::as_simd_f32s(x);
    let zero = simd.splat_f32s(0.0);
    let cv = simd.splat_f32s(c);
    let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
    let mut quads = head.chunks_exact(4);
    for q in &mut quads {
        let d0 = simd.sub_f32s(q[0], cv);
        let d1 = simd.sub_f32s(q[1], cv);
        let d2 = simd.sub_f32s(q[2], cv);
        let d3 = simd.sub_f32s(q[3], cv);
        a0 = simd.mul_add_f32s(d0, d0, a0);
        a1 = simd.mul_add_f32s(d1, d1, a1);
        a2 = simd.mul_add_f32s(d2, d2, a2);
        a3 = simd.mul_add_f32s(d3, d3, a3);
    }
    for v in quads.remainder() {
        let d = simd.sub_f32s(*v, cv);
        a0 = simd.mul_add_f32s(d, d, a0);
    }
    let acc = simd.add_f32s(simd.add_f32s(a0, a1), simd.add_f32s(a2, a3));
    simd.reduce_sum_f32s(acc) + tail.iter().map(|&v| (v - c) * (v - c)).sum::<f32>()
}

/// `1 / sqrt(mean(x²) + eps)` for one row.
#[inline(always)]
fn rms_rstd<S: Simd>(simd: S, xr: &[f32], eps: f32) -> f32 {
    // Σ x² = Σ (x − 0)².
    let ms = sum_sq_dev(simd, xr, 0.0) / xr.len() as f32;
    1.0 / (ms + eps).sqrt()
}

struct LayerNormOp<'a> {
    out: &'a mut [f32],
    x: &'a [f32],
    weight: &'a [f32],
    bias: Option<&'a [f32]>,
    eps: f32,
    dim: usize,
}

impl WithSimd for LayerNormOp<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let dim = self.dim;
        let (wh, wt) = S::as_simd_f32s(self.weight);
        let bias = self.bias.map(S::as_simd_f32s);
        for (o, xr) in self.out.chunks_exact_mut(dim).zip(self.x.chunks_exact(dim)) {
            let mean = sum(simd, xr) / dim as f32;
            let var = sum_sq_dev(simd, xr, mean) / dim as f32;
            let rstd = 1.0 / (var + self.eps).sqrt();
            // out = ((x − mean)·rstd)·w + b.
            let (oh, ot) = S::as_mut_simd_f32s(o);
            let (xh, xt) = S::as_simd_f32s(xr);
            let meanv = simd.splat_f32s(mean);
            let rstdv = simd.splat_f32s(rstd);
            match bias {
                Some((bh, bt)) => {
                    for (((ov, xv), wv), bv) in oh.iter_mut().zip(xh).zip(wh).zip(bh) {
                        let n = simd.mul_f32s(simd.sub_f32s(*xv, meanv), rstdv);
                        *ov = simd.mul_add_f32s(n, *wv, *bv);
                    }
                    for (((ov, xv), wv), bv) in ot.iter_mut().zip(xt).zip(wt).zip(bt) {
                        *ov = (*xv - mean) * rstd * *wv + *bv;
                    }
                }
                None => {
                    for ((ov, xv), wv) in oh.iter_mut().zip(xh).zip(wh) {
                        let n = simd.mul_f32s(simd.sub_f32s(*xv, meanv), rstdv);
                        *ov = simd.mul_f32s(n, *wv);
                    }
                    for ((ov, xv), wv) in ot.iter_mut().zip(xt).zip(wt) {
                        *ov = (*xv - mean) * rstd * *wv;
                    }
                }
            }
        }
    }
}

struct RmsNormOp<'a> {
    out: &'a mut [f32],
    x: &'a [f32],
    weight: &'a [f32],
    eps: f32,
    dim: usize,
}

impl WithSimd for RmsNormOp<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let (wh, wt) = S::as_simd_f32s(self.weight);
        for (o, xr) in self
            .out
            .chunks_exact_mut(self.dim)
            .zip(self.x.chunks_exact(self.dim))
        {
            let rstd = rms_rstd(simd, xr, self.eps);
            let rstdv = simd.splat_f32s(rstd);
            let (oh, ot) = S::as_mut_simd_f32s(o);
            let (xh, xt) = S::as_simd_f32s(xr);
            for ((ov, xv), wv) in oh.iter_mut().zip(xh).zip(wh) {
                *ov = simd.mul_f32s(simd.mul_f32s(*xv, rstdv), *wv);
            }
            for ((ov, xv), wv) in ot.iter_mut().zip(xt).zip(wt) {
                *ov = (*xv * rstd) * *wv;
            }
        }
    }
}

struct RmsNormInplaceOp<'a> {
    x: &'a mut [f32],
    weight: &'a [f32],
    eps: f32,
    dim: usize,
}

impl WithSimd for RmsNormInplaceOp<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let (wh, wt) = S::as_simd_f32s(self.weight);
        for xr in self.x.chunks_exact_mut(self.dim) {
            let rstd = rms_rstd(simd, xr, self.eps);
            let rstdv = simd.splat_f32s(rstd);
            let (xh, xt) = S::as_mut_simd_f32s(xr);
            for (xv, wv) in xh.iter_mut().zip(wh) {
                *xv = simd.mul_f32s(simd.mul_f32s(*xv, rstdv), *wv);
            }
            for (xv, wv) in xt.iter_mut().zip(wt) {
                *xv = (*xv * rstd) * *wv;
            }
        }
    }
}
