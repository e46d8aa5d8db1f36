//! `nn.Linear`: `y = x·Wᵀ + b`, `W` stored `[out_features, in_features]` in f32, f16 or
//! quantized blocks; an f32 weight may be kept transposed for gemm ([`Linear::for_many_rows`]).

use super::{Seq, SeqBuf};
use crate::error::{Error, Result};
use crate::weights::Scope;
use crate::weights::{MatrixOptions, Tensor};

/// A linear layer over the last dimension. The weight stays in the dtype it was stored in
/// (f16 is widened inside the kernel); the bias, when there is one, is kept in f32.
#[derive(Debug)]
pub struct Linear {
    /// `[out_dim, in_dim]`, or `[in_dim, out_dim]` when `transposed`.
    weight: Tensor,
    transposed: bool,
    bias: Option<Vec<f32>>,
    in_dim: usize,
    out_dim: usize,
}

impl Linear {
    /// Loads `name.weight` `[out_dim, in_dim]` and, when the file has it, `name.bias`
    /// `[out_dim]` (PyTorch's `bias=False` simply has none). Q3_K, Q4_0, Q4_1, Q4_K, Q5_K,
    /// Q6_K, Q8_0, IQ4_NL and IQ4_XS weights are kept with their rows interleaved for the matrix products, and mapped f16
    /// weights copied onto huge pages ([`Tensor::interleaved`], with the default
    /// [`MatrixOptions`]).
    ///
    /// Errors: [`Error::MissingTensor`] without the weight, [`Error::TensorShape`] when a
    /// shape disagrees with `in_dim`/`out_dim`.
    pub fn load(scope: &Scope<'_>, name: &str, in_dim: usize, out_dim: usize) -> Result<Self> {
        let s = scope.pp(name);
        let weight = s
            .tensor_shaped("weight", &[out_dim, in_dim])?
            .interleaved(&MatrixOptions::default())?;
        let bias = if s.contains("bias") {
            Some(s.tensor_shaped("bias", &[out_dim])?.to_f32_vec()?)
        } else {
            None
        };
        Ok(Linear {
            weight,
            transposed: false,
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

    /// A layer from a `[out, in]` weight tensor and an optional bias of `out` values; Q4_0,
    /// Q4_1, Q4_K, Q6_K, Q8_0, Q3_K, Q5_K, IQ4_NL and IQ4_XS weights are interleaved as in
    /// [`Linear::load`].
    pub fn from_tensors(weight: Tensor, bias: Option<Vec<f32>>) -> Result<Self> {
        Self::from_tensors_with(weight, bias, &MatrixOptions::default())
    }

    /// [`Linear::from_tensors`] with the weight prepared as `options` say (a model's
    /// options: [`Tensor::interleaved`]).
    pub fn from_tensors_with(
        weight: Tensor,
        bias: Option<Vec<f32>>,
        options: &MatrixOptions,
    ) -> Result<Self> {
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
        let weight = weight.interleaved(options)?;
        Ok(Linear {
            weight,
            transposed: false,
            bias,
            in_dim,
            out_dim,
        })
    }

    /// The layer with an f32 weight copied into the transposed layout `[in_dim, out_dim]`,
    /// for layers that only ever meet many rows at once (an encoder's): gemm reads that
    /// layout in whole rows instead of gathering one value from each, which made the seq2seq
    /// encoder's products 11–45% faster on 2 threads ([`Weights::F32T`](qkv_kernels::Weights)).
    /// Few rows then go to gemm too, and a mapped weight becomes an owned copy of the same
    /// size. Other formats are returned unchanged: f16 and quantized weights are widened
    /// per panel anyway, and their GEMV reads the stored layout.
    ///
    /// ```
    /// use qkv::nn::Linear;
    /// use qkv::weights::Tensor;
    /// # fn main() -> qkv::Result<()> {
    /// // W = [[1, 2], [3, 4], [5, 6]]: 2 inputs, 3 outputs.
    /// let w = Tensor::from_f32("w", vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?;
    /// let lin = Linear::from_tensors(w, None)?.for_many_rows()?;
    /// assert_eq!(lin.weight().shape(), &[2, 3]);
    /// let mut y = [0.0; 3];
    /// lin.forward_into(&[1.0, 1.0], 1, &mut y)?;
    /// assert_eq!(y, [3.0, 7.0, 11.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn for_many_rows(self) -> Result<Self> {
        let Some(w) = self.weight.as_f32().filter(|_| !self.transposed) else {
            return Ok(self);
        };
        let (n, k) = (self.out_dim, self.in_dim);
        let name = self.weight.name();
        let mut t = crate::alloc::zeroed(n * k, || format!("tensor `{name}` transposed"))?;
        // In 32×32 tiles: both sides stay in cache lines already fetched.
        const TILE: usize = 32;
        for j0 in (0..n).step_by(TILE) {
            for p0 in (0..k).step_by(TILE) {
                for j in j0..(j0 + TILE).min(n) {
                    for p in p0..(p0 + TILE).min(k) {
                        t[p * n + j] = w[j * k + p];
                    }
                }
            }
        }
        Ok(Linear {
            weight: Tensor::from_f32(name, vec![k, n], t)?,
            transposed: true,
            ..self
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
            w: self.operand(),
            bias: self.bias.as_deref(),
            n: self.out_dim,
            y,
        }
    }

    /// The bias, when the layer has one.
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// The weight tensor: `[out_dim, in_dim]`, or `[in_dim, out_dim]` after
    /// [`Linear::for_many_rows`] transposed it.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The weight as the kernels' operand.
    fn operand(&self) -> qkv_kernels::Weights<'_> {
        match (self.transposed, self.weight.as_f32()) {
            (true, Some(w)) => qkv_kernels::Weights::F32T(w),
            _ => self.weight.weights(),
        }
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
            self.operand(),
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
