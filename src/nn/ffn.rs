//! The position-wise feed-forward block of seed 004: `linear2(relu(linear1(x)))`.

use super::{Linear, Seq, SeqBuf};
use crate::error::{Error, Result};
use crate::weights::Scope;

/// `linear2(relu(linear1(x)))` with inner size `scale · hidden` (PyTorch names `linear1`,
/// `linear2`). Dropout is the identity at inference.
#[derive(Debug)]
pub struct FeedForward {
    linear1: Linear,
    linear2: Linear,
}

impl FeedForward {
    /// Loads `linear1` `[scale·hidden, hidden]` and `linear2` `[hidden, scale·hidden]`.
    pub fn load(scope: &Scope<'_>, hidden: usize, scale: usize) -> Result<Self> {
        if scale == 0 {
            return Err(Error::Config(
                "feed-forward scale must be at least 1".into(),
            ));
        }
        let inner = hidden.checked_mul(scale).ok_or_else(|| {
            Error::Config(format!("feed-forward size {hidden} × {scale} overflows"))
        })?;
        Ok(FeedForward {
            linear1: Linear::load(scope, "linear1", hidden, inner)?,
            linear2: Linear::load(scope, "linear2", inner, hidden)?,
        })
    }

    /// Both layers' f32 weights kept transposed for gemm ([`Linear::for_many_rows`]), for a
    /// block that always sees many rows: an encoder's.
    pub fn for_many_rows(self) -> Result<Self> {
        Ok(FeedForward {
            linear1: self.linear1.for_many_rows()?,
            linear2: self.linear2.for_many_rows()?,
        })
    }

    /// Inner size.
    pub fn inner_dim(&self) -> usize {
        self.linear1.out_dim()
    }

    /// `rows` rows of `x` into `out`, with `hidden` a scratch of `rows · inner_dim` values.
    pub fn forward_into(
        &self,
        x: &[f32],
        rows: usize,
        hidden: &mut [f32],
        out: &mut [f32],
    ) -> Result<()> {
        self.linear1.forward_into(x, rows, hidden)?;
        qkv_kernels::activation::relu_inplace(hidden);
        self.linear2.forward_into(hidden, rows, out)
    }

    /// Applies the block to every position of `x`.
    pub fn forward(&self, x: Seq<'_>) -> Result<SeqBuf> {
        let mut hidden = vec![0.0; x.rows() * self.inner_dim()];
        let mut out = vec![0.0; x.rows() * self.linear2.out_dim()];
        if x.dim() != self.linear1.in_dim() {
            return Err(Error::Shape(format!(
                "feed-forward: input dim {} but the block takes {}",
                x.dim(),
                self.linear1.in_dim()
            )));
        }
        self.forward_into(x.data(), x.rows(), &mut hidden, &mut out)?;
        SeqBuf::new(out, x.batch(), x.len(), self.linear2.out_dim())
    }
}
