//! `nn.Linear`: `y = x·Wᵀ + b`, `W` stored `[out_features, in_features]` in f32 or f16.

use super::{Scope, Seq, SeqBuf};
use crate::error::{Error, Result};
use crate::weights::Tensor;

/// A linear layer over the last dimension. The weight stays in the dtype it was stored in
/// (f16 is widened inside the kernel); the bias, when there is one, is kept in f32.
#[derive(Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Vec<f32>>,
    in_dim: usize,
    out_dim: usize,
}

impl Linear {
    /// Loads `name.weight` `[out_dim, in_dim]` and, when the file has it, `name.bias`
    /// `[out_dim]` (PyTorch's `bias=False` simply has none).
    ///
    /// Errors: [`Error::MissingTensor`] without the weight, [`Error::TensorShape`] when a
    /// shape disagrees with `in_dim`/`out_dim`.
    pub fn load(scope: &Scope<'_>, name: &str, in_dim: usize, out_dim: usize) -> Result<Self> {
        let s = scope.pp(name);
        let weight = s.tensor_shaped("weight", &[out_dim, in_dim])?;
        let bias = if s.contains("bias") {
            Some(s.tensor_shaped("bias", &[out_dim])?.to_f32_vec()?)
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            in_dim,
            out_dim,
        })
    }

    /// Loads like [`Linear::load`] but requires the bias.
    pub fn load_with_bias(
        scope: &Scope<'_>,
        name: &str,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<Self> {
        let s = scope.pp(name);
        if !s.contains("bias") {
            return Err(Error::MissingTensor {
                name: s.name("bias"),
            });
        }
        Self::load(scope, name, in_dim, out_dim)
    }

    /// A layer from a `[out, in]` weight tensor and an optional bias of `out` values.
    pub fn from_tensors(weight: Tensor, bias: Option<Vec<f32>>) -> Result<Self> {
        let (out_dim, in_dim) = match *weight.shape() {
            [o, i] if o > 0 && i > 0 => (o, i),
            _ => {
                return Err(Error::TensorShape {
                    name: weight.name().to_owned(),
                    expected: vec![0, 0],
                    actual: weight.shape().to_vec(),
                })
            }
        };
        if let Some(b) = &bias {
            if b.len() != out_dim {
                return Err(Error::TensorShape {
                    name: format!("{} (bias)", weight.name()),
                    expected: vec![out_dim],
                    actual: vec![b.len()],
                });
            }
        }
        Ok(Linear {
            weight,
            bias,
            in_dim,
            out_dim,
        })
    }

    /// Input features.
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// Output features.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// This layer as one of several products of the same input, for
    /// [`linear_many`](qkv_kernels::linear_many) (Q, K and V; gate and up): one hand-off to
    /// the threads for the group. `y` is the output `[rows, out_dim]`.
    pub fn projection<'a, 'y>(&'a self, y: &'y mut [f32]) -> qkv_kernels::Projection<'a, 'y> {
        qkv_kernels::Projection {
            w: self.weight.weights(),
            bias: self.bias.as_deref(),
            n: self.out_dim,
            y,
        }
    }

    /// The bias, when the layer has one.
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// The weight tensor.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `y[rows, out] = x[rows, in]·Wᵀ + b`, overwriting `y`. [`Error::Shape`] when a slice
    /// length disagrees.
    pub fn forward_into(&self, x: &[f32], rows: usize, y: &mut [f32]) -> Result<()> {
        if rows == 0
            || Some(x.len()) != rows.checked_mul(self.in_dim)
            || Some(y.len()) != rows.checked_mul(self.out_dim)
        {
            return Err(Error::Shape(format!(
                "linear `{}`: input has {} values and output {} for {rows} rows of {} → {}",
                self.weight.name(),
                x.len(),
                y.len(),
                self.in_dim,
                self.out_dim
            )));
        }
        qkv_kernels::linear(
            y,
            x,
            self.weight.weights(),
            self.bias.as_deref(),
            rows,
            self.in_dim,
            self.out_dim,
        )?;
        Ok(())
    }

    /// The layer applied to every position of `x` `[B, T, in]`, giving `[B, T, out]`.
    pub fn forward(&self, x: Seq<'_>) -> Result<SeqBuf> {
        if x.dim() != self.in_dim {
            return Err(Error::Shape(format!(
                "linear `{}`: input dim {} but the layer takes {}",
                self.weight.name(),
                x.dim(),
                self.in_dim
            )));
        }
        let mut y = vec![0.0; x.rows() * self.out_dim];
        self.forward_into(x.data(), x.rows(), &mut y)?;
        SeqBuf::new(y, x.batch(), x.len(), self.out_dim)
    }
}
