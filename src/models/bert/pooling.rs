//! Pooling: a text's token vectors into one vector, as sentence-transformers' `Pooling`
//! module computes it, and the `Normalize` module's L2 scaling.
//!
//! Only the text's real tokens are pooled, never padding: the caller hands over the first
//! `len` rows of the sequence (qkv pads at the tail).
//!
//! ```
//! use qkv::models::bert::{Pooling, PoolingMode};
//! # fn main() -> qkv::Result<()> {
//! let pool = Pooling::new(vec![PoolingMode::Mean], 2)?;
//! let tokens = [1.0, 2.0, 3.0, 6.0]; // two tokens of dimension 2
//! let mut out = [0.0; 2];
//! pool.pool_into(&tokens, &mut out)?;
//! assert_eq!(out, [2.0, 4.0]);
//! qkv::models::bert::l2_normalize(&mut out);
//! assert!((out[0] * out[0] + out[1] * out[1] - 1.0).abs() < 1e-6);
//! # Ok(())
//! # }
//! ```

use crate::error::{Error, Result};

/// One way of pooling token vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingMode {
    /// The first token's vector (`[CLS]`).
    Cls,
    /// The elementwise maximum over the tokens.
    Max,
    /// The mean over the tokens.
    Mean,
    /// The sum over the tokens divided by the square root of their number.
    MeanSqrtLen,
}

impl PoolingMode {
    /// The mode sentence-transformers calls `name` (`cls`, `max`, `mean`,
    /// `mean_sqrt_len_tokens`); `None` for any other (`weightedmean`, `lasttoken`, …).
    pub fn from_name(name: &str) -> Option<PoolingMode> {
        Some(match name {
            "cls" => PoolingMode::Cls,
            "max" => PoolingMode::Max,
            "mean" => PoolingMode::Mean,
            "mean_sqrt_len_tokens" => PoolingMode::MeanSqrtLen,
            _ => return None,
        })
    }
}

/// One or more pooling modes over token vectors of dimension `dim`; with several, their
/// results are concatenated in the given order, as sentence-transformers does.
#[derive(Clone, Debug, PartialEq)]
pub struct Pooling {
    modes: Vec<PoolingMode>,
    dim: usize,
}

impl Pooling {
    /// [`Error::Config`] for no mode or a zero dimension.
    pub fn new(modes: Vec<PoolingMode>, dim: usize) -> Result<Pooling> {
        if modes.is_empty() || dim == 0 {
            return Err(Error::Config(format!(
                "pooling: {} modes over dimension {dim}",
                modes.len()
            )));
        }
        Ok(Pooling { modes, dim })
    }

    /// The modes, in output order.
    pub fn modes(&self) -> &[PoolingMode] {
        &self.modes
    }

    /// Dimension of a token vector.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Dimension of the pooled vector: `dim` per mode.
    pub fn out_dim(&self) -> usize {
        self.dim * self.modes.len()
    }

    /// Pools `tokens` (`len × dim`, the text's real tokens only, `len ≥ 1`) into `out`
    /// (`out_dim` values). Sums are accumulated in f32 in token order, as PyTorch's reduction
    /// over the sequence does; a NaN in a token reaches the result in every mode.
    /// [`Error::Shape`] when a length disagrees.
    pub fn pool_into(&self, tokens: &[f32], out: &mut [f32]) -> Result<()> {
        let d = self.dim;
        if tokens.is_empty() || !tokens.len().is_multiple_of(d) || out.len() != self.out_dim() {
            return Err(Error::Shape(format!(
                "pooling: {} token values of dimension {d} into {} outputs ({} needed)",
                tokens.len(),
                out.len(),
                self.out_dim()
            )));
        }
        let len = tokens.len() / d;
        for (&mode, o) in self.modes.iter().zip(out.chunks_exact_mut(d)) {
            match mode {
                PoolingMode::Cls => o.copy_from_slice(&tokens[..d]),
                PoolingMode::Max => {
                    o.copy_from_slice(&tokens[..d]);
                    for row in tokens.chunks_exact(d).skip(1) {
                        for (m, &v) in o.iter_mut().zip(row) {
                            // A NaN is taken too, so it is never hidden.
                            if v > *m || v.is_nan() {
                                *m = v;
                            }
                        }
                    }
                }
                PoolingMode::Mean | PoolingMode::MeanSqrtLen => {
                    o.fill(0.0);
                    for row in tokens.chunks_exact(d) {
                        for (s, &v) in o.iter_mut().zip(row) {
                            *s += v;
                        }
                    }
                    let n = len as f32;
                    let div = if mode == PoolingMode::Mean {
                        n
                    } else {
                        n.sqrt()
                    };
                    for s in o.iter_mut() {
                        *s /= div;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Scales `v` to unit L2 norm, as PyTorch's `F.normalize(v, p=2, eps=1e-12)`: divided by
/// `max(‖v‖, 1e-12)` (so an all-zero vector stays zero). The norm is summed in f64.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let norm = (norm as f32).max(1e-12);
    for x in v {
        *x /= norm;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_concatenate_in_order() {
        let pool = Pooling::new(
            vec![
                PoolingMode::Cls,
                PoolingMode::Max,
                PoolingMode::Mean,
                PoolingMode::MeanSqrtLen,
            ],
            2,
        )
        .unwrap();
        let tokens = [1.0, -4.0, 3.0, 0.0, 2.0, -2.0, 6.0, 2.0];
        let mut out = [0.0; 8];
        pool.pool_into(&tokens, &mut out).unwrap();
        assert_eq!(out, [1.0, -4.0, 6.0, 2.0, 3.0, -1.0, 6.0, -2.0]);
    }

    #[test]
    fn nan_is_never_hidden() {
        for mode in [PoolingMode::Max, PoolingMode::Mean] {
            let pool = Pooling::new(vec![mode], 1).unwrap();
            let mut out = [0.0];
            pool.pool_into(&[1.0, f32::NAN, 2.0], &mut out).unwrap();
            assert!(out[0].is_nan(), "{mode:?}");
        }
    }

    #[test]
    fn bad_lengths_are_shape_errors() {
        let pool = Pooling::new(vec![PoolingMode::Mean], 2).unwrap();
        let mut out = [0.0; 2];
        assert!(matches!(
            pool.pool_into(&[], &mut out),
            Err(Error::Shape(_))
        ));
        assert!(matches!(
            pool.pool_into(&[1.0; 3], &mut out),
            Err(Error::Shape(_))
        ));
        assert!(matches!(
            pool.pool_into(&[1.0; 2], &mut [0.0; 3]),
            Err(Error::Shape(_))
        ));
        assert!(Pooling::new(vec![], 2).is_err());
    }

    #[test]
    fn zero_vector_stays_zero() {
        let mut v = [0.0f32; 4];
        l2_normalize(&mut v);
        assert_eq!(v, [0.0; 4]);
    }
}
