//! Rotary position embedding (RoPE) with a precomputed cos/sin table.
//!
//! Pair `i` of a head (`0 ≤ i < head_dim/2`) at absolute position `p` is rotated by the
//! angle `p·θᵢ`, `θᵢ = base^(−2i/head_dim)`:
//! `(a, b) → (a·cos − b·sin, a·sin + b·cos)`. [`RopeStyle`] says which two elements of the
//! head form pair `i`.
//!
//! # Precision: what the table holds
//!
//! The table reproduces Hugging Face's f32 computation (`LlamaRotaryEmbedding`) step by step
//! so that the rotated values agree with PyTorch to about 1e-7 even at large positions:
//! - `θᵢ = 1 / base^(f32(2i) / f32(head_dim))` with the exponent and the reciprocal rounded
//!   to f32 as PyTorch does, the power evaluated in f64 and rounded once;
//! - the angle `f32(p) · θᵢ` rounded to f32 (HF's f32 outer product);
//! - `cos` and `sin` of that f32 angle evaluated in f64 and rounded once (PyTorch's f32
//!   `cos`/`sin` are within an ulp of this).
//!
//! Computing the whole angle in f64 instead would be "more exact" but would drift from HF by
//! up to ~1e-4 at positions in the thousands, because HF's own angle is an f32 product.
//!
//! The rotation itself is `a·cos − b·sin` with two rounded products and a rounded
//! difference (no FMA), exactly PyTorch's `q·cos + rotate_half(q)·sin`.
//!
//! ```
//! use qkv_kernels::rope::{RopeStyle, RopeTable};
//! let table = RopeTable::new(4, 10000.0, 16).unwrap();
//! let mut x = [1.0f32, 2.0, 3.0, 4.0]; // one row, one head
//! table.apply(&mut x, 1, 1, 0, RopeStyle::SplitHalf).unwrap(); // position 0: identity
//! assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
//! ```

use crate::error::{check_covers, check_len, check_nonzero, try_zeros_f32, KernelError, Result};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

/// Which elements of a head form the rotated pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pair `i` is `(x[2i], x[2i+1])`: GGUF / llama.cpp "normal" RoPE, Meta's original
    /// complex-number formulation.
    AdjacentPairs,
    /// Pair `i` is `(x[i], x[i + head_dim/2])`: Hugging Face `rotate_half` / GPT-NeoX style.
    SplitHalf,
}

/// Precomputed `cos(p·θᵢ)` and `sin(p·θᵢ)` for positions `0..max_positions` and pairs
/// `0..head_dim/2`; see the [module docs](self) for exactly how they are rounded.
#[derive(Clone, Debug)]
pub struct RopeTable {
    head_dim: usize,
    max_positions: usize,
    /// `[max_positions, head_dim/2]`
    cos: Vec<f32>,
    /// `[max_positions, head_dim/2]`
    sin: Vec<f32>,
}

/// The unscaled frequencies `θᵢ = 1 / base^(f32(2i) / f32(head_dim))` for `i < head_dim/2`,
/// rounded as Hugging Face's f32 `inv_freq` (see the module docs). `head_dim` must be even
/// and non-zero, `base` finite and positive.
pub fn inv_freq(head_dim: usize, base: f32) -> Result<Vec<f32>> {
    check_nonzero("head_dim", head_dim)?;
    if !head_dim.is_multiple_of(2) {
        return Err(KernelError::Invalid(format!(
            "RoPE head_dim must be even, got {head_dim}"
        )));
    }
    if !(base.is_finite() && base > 0.0) {
        return Err(KernelError::Invalid(format!(
            "RoPE base must be finite and positive, got {base}"
        )));
    }
    Ok((0..head_dim / 2)
        .map(|i| {
            let e = (2 * i) as f32 / head_dim as f32;
            let p = (base as f64).powf(e as f64) as f32;
            1.0f32 / p
        })
        .collect())
}

impl RopeTable {
    /// Builds the table for heads of `head_dim` (even, non-zero) and positions
    /// `0..max_positions` (non-zero), with frequency base `base` (finite, > 0; 10000 for
    /// Llama 2, 500000 for Llama 3). Takes `max_positions · head_dim` f32 of memory; errors
    /// (rather than panicking or aborting) when that size overflows or cannot be allocated.
    pub fn new(head_dim: usize, base: f32, max_positions: usize) -> Result<RopeTable> {
        Self::from_inv_freq(&inv_freq(head_dim, base)?, max_positions)
    }

    /// Builds the table from explicit per-pair frequencies `θᵢ` (`head_dim = 2·len`): the
    /// scaled variants — linear position interpolation, Llama 3's smoothed bands, GGUF's
    /// `rope_freqs` factors — differ from [`RopeTable::new`] only in these. Each `θᵢ` must be
    /// finite; the angles and their cos/sin are rounded as the module docs describe.
    ///
    /// ```
    /// use qkv_kernels::rope::{inv_freq, RopeTable};
    /// // Linear scaling by 4: every frequency divided by the factor.
    /// let theta: Vec<f32> = inv_freq(8, 10000.0).unwrap().iter().map(|f| f / 4.0).collect();
    /// let t = RopeTable::from_inv_freq(&theta, 64).unwrap();
    /// assert_eq!(t.cos(8), RopeTable::new(8, 10000.0, 64).unwrap().cos(2));
    /// ```
    pub fn from_inv_freq(inv_freq: &[f32], max_positions: usize) -> Result<RopeTable> {
        let half = inv_freq.len();
        check_nonzero("head_dim", half)?;
        check_nonzero("max_positions", max_positions)?;
        if let Some(bad) = inv_freq.iter().find(|f| !f.is_finite()) {
            return Err(KernelError::Invalid(format!(
                "RoPE frequencies must be finite, got {bad}"
            )));
        }
        let head_dim = half * 2;
        let len = max_positions.checked_mul(half).ok_or_else(|| {
            KernelError::Invalid(format!(
                "RoPE table of {max_positions} positions × {half} pairs overflows"
            ))
        })?;
        // Both tables up front, fallibly: an absurd `max_positions` is an error, not a
        // capacity-overflow panic or an allocation-failure abort.
        let what = || {
            format!(
                "each of the RoPE cos and sin tables of {max_positions} positions × \
                 head_dim {head_dim}"
            )
        };
        let mut cos = try_zeros_f32(Some(len), what)?;
        let mut sin = try_zeros_f32(Some(len), what)?;
        for (p, (c, s)) in cos
            .chunks_exact_mut(half)
            .zip(sin.chunks_exact_mut(half))
            .enumerate()
        {
            let pf = p as f32;
            for ((c, s), &f) in c.iter_mut().zip(s.iter_mut()).zip(inv_freq) {
                let angle = (pf * f) as f64;
                *c = angle.cos() as f32;
                *s = angle.sin() as f32;
            }
        }
        Ok(RopeTable {
            head_dim,
            max_positions,
            cos,
            sin,
        })
    }

    /// Elements per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Positions the table covers (`0..max_positions`).
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// `cos(pos·θᵢ)` for `i in 0..head_dim/2`, or `None` past the table.
    pub fn cos(&self, pos: usize) -> Option<&[f32]> {
        let half = self.head_dim / 2;
        self.cos
            .get(pos.checked_mul(half)?..(pos + 1).checked_mul(half)?)
    }

    /// `sin(pos·θᵢ)` for `i in 0..head_dim/2`, or `None` past the table.
    pub fn sin(&self, pos: usize) -> Option<&[f32]> {
        let half = self.head_dim / 2;
        self.sin
            .get(pos.checked_mul(half)?..(pos + 1).checked_mul(half)?)
    }

    /// Rotates `x`, `[rows, heads, head_dim]` contiguous, in place; row `r` is at absolute
    /// position `pos0 + r`. Errors if `x.len() ≠ rows·heads·head_dim`, `heads == 0`, or
    /// `pos0 + rows > max_positions`.
    pub fn apply(
        &self,
        x: &mut [f32],
        rows: usize,
        heads: usize,
        pos0: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let width = self.validate(rows, heads, pos0)?;
        check_len("x", rows * width, x.len())?;
        self.apply_fast(x, rows, heads, width, pos0, style);
        Ok(())
    }

    /// Like [`apply`](Self::apply) for rows embedded in a wider buffer: row `r` is
    /// `x[r·row_stride ..][.. heads·head_dim]`, e.g. the query part of a fused QKV output
    /// row (pass the slice starting at the query offset and the fused row width as
    /// `row_stride`). Elements between rows are not touched. Errors if
    /// `row_stride < heads·head_dim`, `x` is too short for `rows` such rows, `heads == 0`,
    /// or `pos0 + rows > max_positions`.
    pub fn apply_strided(
        &self,
        x: &mut [f32],
        rows: usize,
        heads: usize,
        row_stride: usize,
        pos0: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let width = self.validate(rows, heads, pos0)?;
        self.validate_stride(x.len(), rows, width, row_stride)?;
        self.apply_fast(x, rows, heads, row_stride, pos0, style);
        Ok(())
    }

    /// Scalar reference for [`apply`](Self::apply): same arguments, errors and (bitwise)
    /// results.
    #[cfg(any(test, feature = "testing"))]
    pub fn apply_scalar(
        &self,
        x: &mut [f32],
        rows: usize,
        heads: usize,
        pos0: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let width = self.validate(rows, heads, pos0)?;
        check_len("x", rows * width, x.len())?;
        self.rotate_rows_scalar(x, rows, heads, width, pos0, style);
        Ok(())
    }

    /// Scalar reference for [`apply_strided`](Self::apply_strided).
    #[cfg(any(test, feature = "testing"))]
    pub fn apply_strided_scalar(
        &self,
        x: &mut [f32],
        rows: usize,
        heads: usize,
        row_stride: usize,
        pos0: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let width = self.validate(rows, heads, pos0)?;
        self.validate_stride(x.len(), rows, width, row_stride)?;
        self.rotate_rows_scalar(x, rows, heads, row_stride, pos0, style);
        Ok(())
    }

    /// Checks `heads` and the position range; returns the row width `heads·head_dim`.
    fn validate(&self, rows: usize, heads: usize, pos0: usize) -> Result<usize> {
        check_nonzero("heads", heads)?;
        let end = pos0.saturating_add(rows);
        if end > self.max_positions {
            return Err(KernelError::Invalid(format!(
                "RoPE positions {pos0}..{end} exceed the table's {} positions",
                self.max_positions
            )));
        }
        let width = heads
            .checked_mul(self.head_dim)
            .ok_or_else(|| KernelError::Invalid(format!("RoPE row of {heads} heads overflows")))?;
        width
            .checked_mul(rows)
            .ok_or_else(|| KernelError::Invalid(format!("RoPE input of {rows} rows overflows")))?;
        Ok(width)
    }

    fn validate_stride(&self, len: usize, rows: usize, width: usize, stride: usize) -> Result<()> {
        if stride < width {
            return Err(KernelError::Mismatch {
                what: "row_stride < heads·head_dim",
                left: stride,
                right: width,
            });
        }
        if rows == 0 {
            return Ok(());
        }
        let needed = (rows - 1)
            .checked_mul(stride)
            .and_then(|v| v.checked_add(width))
            .ok_or_else(|| KernelError::Invalid("RoPE strided view overflows".into()))?;
        check_covers("x", needed, len)
    }

    /// Picks the vector path for `style`; arguments already validated.
    fn apply_fast(
        &self,
        x: &mut [f32],
        rows: usize,
        heads: usize,
        stride: usize,
        pos0: usize,
        style: RopeStyle,
    ) {
        match crate::par::par_rows(rows, heads * self.head_dim) {
            // Pieces of whole rows at their own positions; the last may end short of a
            // full stride, as `x` itself may.
            Some(piece) => x
                .par_chunks_mut(piece * stride)
                .enumerate()
                .for_each(|(i, xs)| {
                    let r0 = i * piece;
                    let n = piece.min(rows - r0);
                    self.apply_rows(xs, n, heads, stride, pos0 + r0, style);
                }),
            None => self.apply_rows(x, rows, heads, stride, pos0, style),
        }
    }

    /// [`Self::apply_fast`] on the calling thread.
    fn apply_rows(
        &self,
        x: &mut [f32],
        rows: usize,
        heads: usize,
        stride: usize,
        pos0: usize,
        style: RopeStyle,
    ) {
        match style {
            RopeStyle::SplitHalf => pulp::Arch::new().dispatch(SplitHalfOp {
                table: self,
                x,
                rows,
                heads,
                stride,
                pos0,
            }),
            RopeStyle::AdjacentPairs => {
                #[cfg(target_arch = "x86_64")]
                if crate::simd::isa().avx2_fma_f16c {
                    // SAFETY: AVX2/FMA/F16C detected just above; the view of `rows` rows of
                    // `heads·head_dim` at `stride` fits in `x` and the positions are in the
                    // table (validated by the caller).
                    unsafe { avx2::adjacent(self, x, rows, heads, stride, pos0) };
                    return;
                }
                self.rotate_rows_scalar(x, rows, heads, stride, pos0, style);
            }
        }
    }

    fn rotate_rows_scalar(
        &self,
        x: &mut [f32],
        rows: usize,
        heads: usize,
        stride: usize,
        pos0: usize,
        style: RopeStyle,
    ) {
        let half = self.head_dim / 2;
        for r in 0..rows {
            let p = pos0 + r;
            let (c, s) = (&self.cos[p * half..][..half], &self.sin[p * half..][..half]);
            let row = &mut x[r * stride..][..heads * self.head_dim];
            for head in row.chunks_exact_mut(self.head_dim) {
                for i in 0..half {
                    let (ia, ib) = match style {
                        RopeStyle::AdjacentPairs => (2 * i, 2 * i + 1),
                        RopeStyle::SplitHalf => (i, i + half),
                    };
                    let (a, b) = (head[ia], head[ib]);
                    head[ia] = a * c[i] - b * s[i];
                    head[ib] = b * c[i] + a * s[i];
                }
            }
        }
    }
}

/// SplitHalf: both halves and the table rows are contiguous, so it is plain vector math.
struct SplitHalfOp<'a> {
    table: &'a RopeTable,
    x: &'a mut [f32],
    rows: usize,
    heads: usize,
    stride: usize,
    pos0: usize,
}

impl WithSimd for SplitHalfOp<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let d = self.table.head_dim;
        let half = d / 2;
        for r in 0..self.rows {
            let p = self.pos0 + r;
            let c = &self.table.cos[p * half..][..half];
            let s = &self.table.sin[p * half..][..half];
            let (ch, ct) = S::as_simd_f32s(c);
            let (sh, st) = S::as_simd_f32s(s);
            let row = &mut self.x[r * self.stride..][..self.heads * d];
            for head in row.chunks_exact_mut(d) {
                let (x1, x2) = head.split_at_mut(half);
                let (ah, at) = S::as_mut_simd_f32s(x1);
                let (bh, bt) = S::as_mut_simd_f32s(x2);
                for (((a, b), cv), sv) in ah.iter_mut().zip(bh.iter_mut()).zip(ch).zip(sh) {
                    let (av, bv) = (*a, *b);
                    *a = simd.sub_f32s(simd.mul_f32s(av, *cv), simd.mul_f32s(bv, *sv));
                    *b = simd.add_f32s(simd.mul_f32s(bv, *cv), simd.mul_f32s(av, *sv));
                }
                for (((a, b), cv), sv) in at.iter_mut().zip(bt.iter_mut()).zip(ct).zip(st) {
                    let (av, bv) = (*a, *b);
                    *a = av * cv - bv * sv;
                    *b = bv * cv + av * sv;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::RopeTable;
    use core::arch::x86_64::*;

    /// AdjacentPairs with AVX2: 4 pairs per step. `x·[c0 c0 c1 c1 …]` and
    /// `swap(x)·[s0 s0 s1 s1 …]` combined by `addsub` (even lanes subtract, odd lanes add)
    /// give `(a·c − b·s, b·c + a·s)` with the same roundings as the scalar reference.
    ///
    /// # Safety
    /// The caller must have AVX2, FMA and F16C; `rows` rows of `heads·head_dim` elements at
    /// `stride` must lie inside `x`; `pos0 + rows ≤ table.max_positions`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn adjacent(
        table: &RopeTable,
        x: &mut [f32],
        rows: usize,
        heads: usize,
        stride: usize,
        pos0: usize,
    ) {
        let d = table.head_dim;
        let half = d / 2;
        let quads = half / 4;
        let dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
        for r in 0..rows {
            let p = pos0 + r;
            let c = &table.cos[p * half..][..half];
            let s = &table.sin[p * half..][..half];
            let row = &mut x[r * stride..][..heads * d];
            for head in row.chunks_exact_mut(d) {
                let hp = head.as_mut_ptr();
                for q in 0..quads {
                    // SAFETY: 4q + 4 ≤ half, so the 4 table entries and the 8 head
                    // elements at 8q..8q+8 ≤ d are in bounds.
                    unsafe {
                        let cv = _mm256_permutevar8x32_ps(
                            _mm256_castps128_ps256(_mm_loadu_ps(c.as_ptr().add(4 * q))),
                            dup,
                        );
                        let sv = _mm256_permutevar8x32_ps(
                            _mm256_castps128_ps256(_mm_loadu_ps(s.as_ptr().add(4 * q))),
                            dup,
                        );
                        let xv = _mm256_loadu_ps(hp.add(8 * q));
                        let sw = _mm256_permute_ps::<0b10_11_00_01>(xv);
                        let out = _mm256_addsub_ps(_mm256_mul_ps(xv, cv), _mm256_mul_ps(sw, sv));
                        _mm256_storeu_ps(hp.add(8 * q), out);
                    }
                }
                for i in 4 * quads..half {
                    let (a, b) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = a * c[i] - b * s[i];
                    head[2 * i + 1] = b * c[i] + a * s[i];
                }
            }
        }
    }
}
