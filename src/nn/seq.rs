//! Activations with explicit shapes: [`Seq`] borrows `[batch, len, dim]` f32 values,
//! [`SeqBuf`] owns them.

use crate::error::{Error, Result};

/// A borrowed `[batch, len, dim]` f32 tensor, row-major (element `(b, t, d)` at
/// `(b·len + t)·dim + d`), as PyTorch lays out a contiguous `[B, T, D]` tensor.
#[derive(Clone, Copy, Debug)]
pub struct Seq<'a> {
    data: &'a [f32],
    batch: usize,
    len: usize,
    dim: usize,
}

fn check_shape(what: &str, n: usize, batch: usize, len: usize, dim: usize) -> Result<()> {
    if batch == 0 || len == 0 || dim == 0 {
        return Err(Error::Shape(format!(
            "{what}: shape [{batch}, {len}, {dim}] has a zero dimension"
        )));
    }
    let need = batch
        .checked_mul(len)
        .and_then(|x| x.checked_mul(dim))
        .ok_or_else(|| Error::Shape(format!("{what}: shape [{batch}, {len}, {dim}] overflows")))?;
    if n != need {
        return Err(Error::Shape(format!(
            "{what}: {n} values do not fill shape [{batch}, {len}, {dim}] ({need} needed)"
        )));
    }
    Ok(())
}

impl<'a> Seq<'a> {
    /// A view of `data` as `[batch, len, dim]`. [`Error::Shape`] if the length disagrees or a
    /// dimension is zero.
    pub fn new(data: &'a [f32], batch: usize, len: usize, dim: usize) -> Result<Self> {
        check_shape("input", data.len(), batch, len, dim)?;
        Ok(Seq {
            data,
            batch,
            len,
            dim,
        })
    }

    /// All values.
    pub fn data(&self) -> &'a [f32] {
        self.data
    }

    /// Batch size `B`.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Sequence length `T`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a [`Seq`] has no zero dimension.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Feature size `D`.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Rows `B·T`.
    pub fn rows(&self) -> usize {
        self.batch * self.len
    }

    /// The `[len, dim]` values of batch element `b`, or `None` when `b ≥ batch`.
    pub fn item(&self, b: usize) -> Option<&'a [f32]> {
        if b >= self.batch {
            return None;
        }
        let n = self.len * self.dim;
        self.data.get(b * n..(b + 1) * n)
    }
}

/// An owned `[batch, len, dim]` f32 tensor, the output of the modules.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqBuf {
    data: Vec<f32>,
    batch: usize,
    len: usize,
    dim: usize,
}

impl SeqBuf {
    /// Wraps `data` as `[batch, len, dim]`; [`Error::Shape`] if the length disagrees.
    pub fn new(data: Vec<f32>, batch: usize, len: usize, dim: usize) -> Result<Self> {
        check_shape("buffer", data.len(), batch, len, dim)?;
        Ok(SeqBuf {
            data,
            batch,
            len,
            dim,
        })
    }

    /// Zeros of shape `[batch, len, dim]`.
    pub fn zeros(batch: usize, len: usize, dim: usize) -> Result<Self> {
        let n = batch
            .checked_mul(len)
            .and_then(|x| x.checked_mul(dim))
            .ok_or_else(|| Error::Shape(format!("shape [{batch}, {len}, {dim}] overflows")))?;
        Self::new(vec![0.0; n], batch, len, dim)
    }

    /// The borrowed view.
    pub fn view(&self) -> Seq<'_> {
        Seq {
            data: &self.data,
            batch: self.batch,
            len: self.len,
            dim: self.dim,
        }
    }

    /// All values.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// All values, mutably.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// The values, giving up the shape.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// Batch size `B`.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Sequence length `T`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a [`SeqBuf`] has no zero dimension.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Feature size `D`.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The shape `[batch, len, dim]`.
    pub fn shape(&self) -> [usize; 3] {
        [self.batch, self.len, self.dim]
    }
}
