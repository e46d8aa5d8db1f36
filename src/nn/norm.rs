//! `nn.LayerNorm` over the last dimension.

use super::{Seq, SeqBuf};
use crate::error::{Error, Result};
use crate::weights::Scope;

/// Layer normalisation with a learned scale and shift, both kept in f32.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    eps: f32,
    dim: usize,
}

impl LayerNorm {
    /// Loads `name.weight` `[dim]` and, when present, `name.bias` `[dim]`.
    pub fn load(scope: &Scope<'_>, name: &str, dim: usize, eps: f32) -> Result<Self> {
        let s = scope.pp(name);
        let weight = s.tensor_shaped("weight", &[dim])?.to_f32_vec()?;
        let bias = if s.contains("bias") {
            Some(s.tensor_shaped("bias", &[dim])?.to_f32_vec()?)
        } else {
            None
        };
        Ok(LayerNorm {
            weight,
            bias,
            eps,
            dim,
        })
    }

    /// Feature size.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Normalises each row of `x` (`rows × dim`) into `out`.
    pub fn forward_into(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        if x.len() != out.len() || !x.len().is_multiple_of(self.dim) {
            return Err(Error::Shape(format!(
                "layer norm of dim {}: input {} values, output {}",
                self.dim,
                x.len(),
                out.len()
            )));
        }
        qkv_kernels::norm::layer_norm(
            out,
            x,
            &self.weight,
            self.bias.as_deref(),
            self.eps,
            self.dim,
        )?;
        Ok(())
    }

    /// Normalises every position of `x`.
    pub fn forward(&self, x: Seq<'_>) -> Result<SeqBuf> {
        let mut out = vec![0.0; x.data().len()];
        self.forward_into(x.data(), &mut out)?;
        SeqBuf::new(out, x.batch(), x.len(), x.dim())
    }
}

/// RMSNorm, `x / √(mean(x²) + eps) · w` over rows of `dim`, in f32 as PyTorch's Llama,
/// Qwen and Gemma norms compute it. Gemma stores `w − 1` ([`RmsNorm::new`] with
/// `plus_one`); the 1 is added once here, in f32, as Gemma's `1.0 + weight.float()`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    /// A norm of `weight.len()` features. With `plus_one`, the weight applied is `1 + w`.
    pub fn new(mut weight: Vec<f32>, eps: f32, plus_one: bool) -> Result<Self> {
        if weight.is_empty() || !(eps.is_finite() && eps > 0.0) {
            return Err(Error::Config(format!(
                "RMS norm of {} features with epsilon {eps}",
                weight.len()
            )));
        }
        if plus_one {
            weight.iter_mut().for_each(|w| *w += 1.0);
        }
        Ok(RmsNorm { weight, eps })
    }

    /// Features per row.
    pub fn dim(&self) -> usize {
        self.weight.len()
    }

    /// The weight applied (with `plus_one`, already `1 + w`).
    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    /// Normalises every row of `x` into `out` (same length, a multiple of [`dim`](Self::dim)).
    pub fn forward_into(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        qkv_kernels::norm::rms_norm(out, x, &self.weight, self.eps, self.dim())?;
        Ok(())
    }

    /// Normalises every row of `x` in place.
    pub fn forward_inplace(&self, x: &mut [f32]) -> Result<()> {
        qkv_kernels::norm::rms_norm_inplace(x, &self.weight, self.eps, self.dim())?;
        Ok(())
    }
}
