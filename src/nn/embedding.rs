//! Token embeddings and the sinusoidal positional encoding of seed 004.

use super::SeqBuf;
use crate::error::{Error, Result};
use crate::weights::Scope;
use crate::weights::Tensor;

/// `nn.Embedding`: a `[vocab, dim]` table (f32 or f16) whose row `id` is token `id`'s vector.
#[derive(Debug)]
pub struct Embedding {
    table: Tensor,
    vocab: usize,
    dim: usize,
}

impl Embedding {
    /// Loads `name.weight` `[vocab, dim]`.
    pub fn load(scope: &Scope<'_>, name: &str, vocab: usize, dim: usize) -> Result<Self> {
        let table = scope.pp(name).tensor_shaped("weight", &[vocab, dim])?;
        Ok(Embedding { table, vocab, dim })
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Vector size.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Writes the vectors of `ids` into `out` (`ids.len() × dim`). [`Error::TokenOutOfRange`]
    /// for an id outside the vocabulary.
    pub fn lookup_into(&self, ids: &[u32], out: &mut [f32]) -> Result<()> {
        if out.len() != ids.len() * self.dim {
            return Err(Error::Shape(format!(
                "embedding: {} ids need {} output values, got {}",
                ids.len(),
                ids.len() * self.dim,
                out.len()
            )));
        }
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(self.dim)) {
            let i = id as usize;
            if i >= self.vocab {
                return Err(Error::TokenOutOfRange {
                    id,
                    vocab: self.vocab,
                });
            }
            self.table.rows_to_f32(i, row)?;
        }
        Ok(())
    }

    /// The vectors of `ids` `[batch, len]` as `[batch, len, dim]`.
    pub fn forward(&self, ids: &[u32], batch: usize, len: usize) -> Result<SeqBuf> {
        if batch == 0 || len == 0 || Some(ids.len()) != batch.checked_mul(len) {
            return Err(Error::Shape(format!(
                "embedding: {} ids for [{batch}, {len}]",
                ids.len()
            )));
        }
        let mut out = vec![0.0; ids.len() * self.dim];
        self.lookup_into(ids, &mut out)?;
        SeqBuf::new(out, batch, len, self.dim)
    }
}

/// Seed 004's sinusoidal positional encoding, `pe[pos, 2i] = sin(pos / 10000^(2i/d))`,
/// `pe[pos, 2i+1] = cos(…)`, added to the input. Dropout is the identity at inference.
///
/// [`new`](Self::new) computes the table as PyTorch's code does in f32 (see
/// [`qkv_kernels::position`]), which matches PyTorch's own table except where its vectorised
/// `exp` is one ulp off (a few column pairs, an error growing with the position);
/// [`from_table`](Self::from_table) adds a stored table (the seed's `pe` buffer), which a
/// checkpoint saved from PyTorch holds exactly.
#[derive(Debug, Clone)]
pub struct PositionalEncoding {
    dim: usize,
    max_len: usize,
    /// `[max_len, dim]`, when the encoding is a stored table.
    table: Option<Vec<f32>>,
}

impl PositionalEncoding {
    /// An encoding for `dim` features and positions below `max_len` (the seed's buffer size).
    pub fn new(dim: usize, max_len: usize) -> Result<Self> {
        if dim == 0 || max_len == 0 {
            return Err(Error::Config(format!(
                "positional encoding: dim {dim} and max_len {max_len} must be non-zero"
            )));
        }
        Ok(PositionalEncoding {
            dim,
            max_len,
            table: None,
        })
    }

    /// An encoding that adds the stored `table` (`[max_len, dim]`, row `pos` for position
    /// `pos`) instead of computing it. [`Error::Config`] for a zero size,
    /// [`Error::Shape`] when `table` is not `max_len · dim` long.
    pub fn from_table(dim: usize, max_len: usize, table: Vec<f32>) -> Result<Self> {
        let pe = Self::new(dim, max_len)?;
        if Some(table.len()) != dim.checked_mul(max_len) {
            return Err(Error::Shape(format!(
                "positional encoding: a table of {} values for [{max_len}, {dim}]",
                table.len()
            )));
        }
        Ok(PositionalEncoding {
            table: Some(table),
            ..pe
        })
    }

    /// Largest number of positions.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Adds the encoding of positions `pos0 .. pos0 + rows` to `x` (`rows × dim`).
    /// [`Error::ContextFull`] past `max_len`.
    pub fn add_into(&self, x: &mut [f32], rows: usize, pos0: usize) -> Result<()> {
        let needed = pos0.saturating_add(rows);
        if needed > self.max_len {
            return Err(Error::ContextFull {
                needed,
                capacity: self.max_len,
            });
        }
        match &self.table {
            Some(table) => {
                let d = self.dim;
                if x.len() != rows * d {
                    return Err(Error::Shape(format!(
                        "positional encoding: {} values for {rows} rows of {d}",
                        x.len()
                    )));
                }
                let rows_pe = &table[pos0 * d..(pos0 + rows) * d];
                for (v, p) in x.iter_mut().zip(rows_pe) {
                    *v += p;
                }
            }
            None => qkv_kernels::position::add_sinusoidal_inplace(x, rows, self.dim, pos0)?,
        }
        Ok(())
    }

    /// Adds the encoding of positions `0 .. len` to every sequence of `x`.
    pub fn forward(&self, x: &mut SeqBuf) -> Result<()> {
        if x.dim() != self.dim {
            return Err(Error::Shape(format!(
                "positional encoding: input dim {} but the encoding has {}",
                x.dim(),
                self.dim
            )));
        }
        let (len, dim) = (x.len(), x.dim());
        for item in x.data_mut().chunks_exact_mut(len * dim) {
            self.add_into(item, len, 0)?;
        }
        Ok(())
    }
}
