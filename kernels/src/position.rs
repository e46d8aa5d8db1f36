//! Sinusoidal absolute positional encoding ("Attention Is All You Need", §3.5):
//! `pe[pos, 2i] = sin(pos / 10000^(2i/d))`, `pe[pos, 2i+1] = cos(pos / 10000^(2i/d))`.
//!
//! # Precision: mimicking PyTorch's f32 table
//!
//! The usual PyTorch code builds the table in f32:
//! `div_term = exp(arange(0, d, 2).float() * (-ln(10000)/d))`,
//! `pe[:, 0::2] = sin(position * div_term)`, `pe[:, 1::2] = cos(position * div_term)`.
//! We follow the same order with the same roundings: the factor `−ln(10000)/d` rounded to
//! f32, the product `f32(2i) · factor` rounded to f32, its `exp` evaluated in f64 and rounded
//! to f32, the angle `f32(pos) · div_term` rounded to f32, and finally `sin`/`cos` of that f32
//! angle evaluated in f64 and rounded once. Where PyTorch's f32 `exp` returns the correctly
//! rounded `div_term`, the two tables agree to about 1e-7 even at position 500, where an f64
//! angle would differ by ~1e-5. Its vectorised `exp` is one ulp off for a few column pairs
//! at common sizes, though (one pair at d = 64, two at d = 512, as PyTorch 2.15 computes it
//! on x86-64), and those columns then drift with the position: at d = 512, up to 2e-6 below
//! position 64 and 2e-4 below 5000. A model that stores its table (the seed's `pe` buffer)
//! should add that instead, as `qkv::nn::PositionalEncoding::from_table` does.
//!
//! # Odd `d`
//!
//! PyTorch's reference code fails for odd `d` (the cos half is one column short). We use the
//! natural extension: the columns are still `sin, cos, sin, cos, …` with
//! `div_term = exp(2i · (−ln(10000)/d))`, so the last column is a sine.
//!
//! ```
//! use qkv_kernels::position::sinusoidal_table;
//! let pe = sinusoidal_table(2, 4).unwrap();
//! assert_eq!(&pe[..4], &[0.0, 1.0, 0.0, 1.0]); // position 0
//! assert!((pe[4] - 1f32.sin()).abs() < 1e-7);
//! ```

use crate::error::{check_len, check_nonzero, try_zeros_f32, KernelError, Result};

/// `exp(f32(2i) · f32(−ln(10000)/dim))` in f32, the `div_term` of column pair `i`.
#[inline]
fn div_term(i: usize, factor: f32) -> f32 {
    let arg = (2 * i) as f32 * factor;
    (arg as f64).exp() as f32
}

/// `f32(−ln(10000)/dim)`, computed in f64 and rounded as PyTorch rounds the Python float.
#[inline]
fn factor(dim: usize) -> f32 {
    (-(10000.0f64.ln()) / dim as f64) as f32
}

/// `(sin, cos)` of the f32 angle `f32(pos) · div`, each evaluated in f64 and rounded.
#[inline]
fn sin_cos(pos: usize, div: f32) -> (f32, f32) {
    let angle = (pos as f32 * div) as f64;
    (angle.sin() as f32, angle.cos() as f32)
}

/// The `[positions, dim]` table, row-major. Empty when either size is zero. Errors (rather
/// than panicking or aborting) when `positions · dim` f32 overflow or cannot be allocated.
pub fn sinusoidal_table(positions: usize, dim: usize) -> Result<Vec<f32>> {
    let len = positions.checked_mul(dim);
    let mut pe = try_zeros_f32(len, || {
        format!("a sinusoidal table of {positions} positions × dim {dim}")
    })?;
    if dim == 0 {
        return Ok(pe);
    }
    let f = factor(dim);
    for i in 0..dim.div_ceil(2) {
        let div = div_term(i, f);
        for (pos, row) in pe.chunks_exact_mut(dim).enumerate() {
            let (s, c) = sin_cos(pos, div);
            row[2 * i] = s;
            if 2 * i + 1 < dim {
                row[2 * i + 1] = c;
            }
        }
    }
    Ok(pe)
}

/// `x[r, :] += pe[pos0 + r, :]` for `x` of `rows × dim`, computing the encoding on the fly
/// (no allocation; the same values as [`sinusoidal_table`]). The added value is rounded to
/// f32 before the add, as adding a precomputed f32 table would.
///
/// This evaluates `sin`/`cos` in f64 per element; on a hot path with many rows, build the
/// table once and use [`add_inplace`](crate::activation::add_inplace) instead.
/// Errors if `dim == 0`, `x.len() ≠ rows·dim`, or the positions overflow.
pub fn add_sinusoidal_inplace(x: &mut [f32], rows: usize, dim: usize, pos0: usize) -> Result<()> {
    check_nonzero("dim", dim)?;
    let len = rows
        .checked_mul(dim)
        .ok_or_else(|| KernelError::Invalid(format!("{rows} rows × dim {dim} overflows")))?;
    check_len("x", len, x.len())?;
    pos0.checked_add(rows)
        .ok_or_else(|| KernelError::Invalid(format!("position {pos0} + {rows} rows overflows")))?;
    let f = factor(dim);
    for i in 0..dim.div_ceil(2) {
        let div = div_term(i, f);
        for (r, row) in x.chunks_exact_mut(dim).enumerate() {
            let (s, c) = sin_cos(pos0 + r, div);
            row[2 * i] += s;
            if 2 * i + 1 < dim {
                row[2 * i + 1] += c;
            }
        }
    }
    Ok(())
}
