//! Keys and values in Q8_0 blocks, the layout of llama.cpp's `-ctk q8_0 -ctv q8_0` cache:
//! each run of [`BLOCK`] = 32 elements is stored as 32 signed bytes and one f16 scale `d`,
//! the element being `q · d` (34 bytes per 32 elements, 1.0625 bytes each, against 2 for
//! f16).
//!
//! [`quantize`] writes one row (a head's `dim` elements) into whole blocks. The values and
//! the scales live in two slices ([`KvData::Q8_0`]) rather than interleaved, so that the
//! attention kernel loads 8 values at a time without stepping over scales; the bytes per
//! element are the same. Every head row starts on a block boundary; a `dim` that is not a
//! multiple of 32 pads its last block with zeros (`dim` 80 takes 96 bytes and 3 scales).
//!
//! Non-finite input is not hidden: a block holding NaN or ±∞ gets the scale `d = NaN` or
//! `+∞` and zero values, so every element of it dequantizes to NaN (`0 · ∞`), and attention
//! then treats the key as its rule for NaN says.
//!
//! ```
//! use qkv_kernels::attention::kv_q8;
//! use qkv_kernels::f16;
//! let row = [0.6f32, -1.0, 0.25];
//! let mut q = [0i8; 32];
//! let mut d = [f16::ZERO; 1];
//! kv_q8::quantize(&row, &mut q, &mut d).unwrap();
//! assert_eq!(&q[..3], &[76, -127, 32]); // 76.2 and 31.75 rounded
//! assert_eq!(d[0], f16::from_f32(1.0 / 127.0));
//! ```

use super::{KvData, KvView};
use crate::error::{check_len, KernelError, Result};
use half::f16;

/// Elements per Q8_0 block.
pub const BLOCK: usize = 32;

/// Elements a row of `dim` takes in Q8_0 blocks: `dim` rounded up to [`BLOCK`].
pub fn padded(dim: usize) -> usize {
    dim.div_ceil(BLOCK) * BLOCK
}

/// Bytes a row of `dim` elements takes in Q8_0 blocks (values and scales).
pub fn row_bytes(dim: usize) -> usize {
    padded(dim) + padded(dim) / BLOCK * 2
}

/// Quantizes `src` into Q8_0 blocks: `q` must hold [`padded`]`(src.len())` values and `d`
/// one scale per block. Per block, `d = max|x| / 127` and `q = round(x / d)` (half away from
/// zero; all zeros when `d = 0`), the scale stored as f16 afterwards, as llama.cpp's
/// `quantize_row_q8_0` does. Elements past `src.len()` are zeros. Errors when a length is
/// wrong.
pub fn quantize(src: &[f32], q: &mut [i8], d: &mut [f16]) -> Result<()> {
    let n = padded(src.len());
    check_len("q8_0 values", n, q.len())?;
    check_len("q8_0 scales", n / BLOCK, d.len())?;
    for ((x, qb), db) in src
        .chunks(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .zip(d.iter_mut())
    {
        // NaN-propagating maximum: `f32::max` would drop a NaN.
        let amax = x.iter().fold(0.0f32, |m, v| {
            let a = v.abs();
            if a > m || a.is_nan() {
                a
            } else {
                m
            }
        });
        let scale = amax / 127.0;
        // A non-finite block stores zeros under a non-finite scale (each element then reads
        // NaN); a zero block stores zeros under a zero scale.
        let inv = if scale.is_finite() && scale != 0.0 {
            1.0 / scale
        } else {
            0.0
        };
        for (y, v) in qb.iter_mut().zip(x.iter().chain(std::iter::repeat(&0.0))) {
            // |v·inv| ≤ 127 (plus rounding), so the cast never saturates on finite blocks.
            *y = (v * inv).round() as i8;
        }
        *db = f16::from_f32(scale);
    }
    Ok(())
}

/// Checks that a Q8_0 view starts every head row on a block (see [`KvData::Q8_0`]); other
/// dtypes always pass.
pub(super) fn check_alignment(what: &'static str, x: &KvView<'_>) -> Result<()> {
    if !matches!(x.data, KvData::Q8_0 { .. }) {
        return Ok(());
    }
    let bad = |s: usize, n: usize| n > 1 && !s.is_multiple_of(BLOCK);
    if bad(x.row_stride, x.rows) || bad(x.head_stride, x.heads) {
        return Err(KernelError::Invalid(format!(
            "`{what}` in Q8_0 blocks needs row and head strides that are multiples of {BLOCK} \
             (got {} and {})",
            x.row_stride, x.head_stride
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_matches_the_block_rule() {
        let src: Vec<f32> = (0..80)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.1)
            .collect();
        let mut q = vec![0i8; padded(80)];
        let mut d = vec![f16::ZERO; 3];
        quantize(&src, &mut q, &mut d).unwrap();
        for (i, x) in src.iter().enumerate() {
            let back = q[i] as f32 * d[i / BLOCK].to_f32();
            // Half a step of the block, plus the f16 rounding of the scale.
            let step = d[i / BLOCK].to_f32();
            assert!(
                (back - x).abs() <= 0.5 * step + x.abs() * 1e-3,
                "{i}: {x} vs {back}"
            );
        }
        assert!(q[80..].iter().all(|&v| v == 0));
        assert_eq!(row_bytes(80), 96 + 6);
    }

    #[test]
    fn non_finite_blocks_read_nan_and_zero_blocks_zero() {
        let mut src = vec![0.5f32; 64];
        src[3] = f32::INFINITY;
        src[40] = f32::NAN;
        let mut q = vec![0i8; 64];
        let mut d = vec![f16::ZERO; 2];
        quantize(&src, &mut q, &mut d).unwrap();
        assert!(d[0].to_f32().is_infinite() && d[1].to_f32().is_nan());
        assert!((q[0] as f32 * d[0].to_f32()).is_nan());
        let zeros = [0.0f32; 32];
        quantize(&zeros, &mut q[..32], &mut d[..1]).unwrap();
        assert_eq!((q[0], d[0].to_f32()), (0, 0.0));
        assert!(quantize(&zeros, &mut q[..31], &mut d[..1]).is_err());
    }
}
