//! Masks, with one convention throughout qkv: **`true` means visible** (the key may be
//! attended), `false` means blocked — the convention of the attention kernel.
//!
//! A [`Mask`] combines, for one attention call over a batch:
//! - causal masking (query at absolute position `p₀ + i` sees keys `j ≤ p₀ + i`, where `p₀`
//!   is the number of positions already in a KV cache, 0 without one; for `T_q ≠ T_k`
//!   without a cache that is PyTorch's top-left `triu(ones, diagonal=1)` alignment);
//! - key padding ([`KeyPadding`], `[B, T_k]`), built from per-sequence lengths (pads at the
//!   tail) or from explicit flags (pads anywhere);
//! - a dense mask ([`DenseMask`], `[T_q, T_k]` shared by the batch or `[B, T_q, T_k]`).
//!
//! A key is attended only when every given part allows it. **A query row that sees no key at
//! all returns zeros** (PyTorch returns NaN with `-inf` fills and the mean of V with `-1e9`
//! fills). With an output projection, such a row then becomes the projection's bias.
//!
//! The seeds use other conventions: in 001 and 004 `True` means blocked, in 002 and 003
//! `mask == 0` means blocked. Convert at the edge: `keep = !blocked` or `keep = (m != 0)`.

use crate::error::{Error, Result};
use qkv_kernels::AttentionMask;

/// Per-key padding flags `[batch, len]`: `true` = a real token, `false` = padding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPadding {
    keep: Vec<bool>,
    batch: usize,
    len: usize,
}

/// `batch·len` flags set to `value`; [`Error::Shape`] when the product overflows,
/// [`Error::AllocationRefused`] when the flags cannot be allocated (instead of a capacity
/// panic or an allocation abort).
fn flags(batch: usize, len: usize, value: bool) -> Result<Vec<bool>> {
    let n = batch
        .checked_mul(len)
        .ok_or_else(|| Error::Shape(format!("key padding: [{batch}, {len}] overflows")))?;
    let mut keep = Vec::new();
    keep.try_reserve_exact(n)
        .map_err(|_| Error::AllocationRefused {
            what: format!("key padding of [{batch}, {len}] flags"),
            bytes: n,
        })?;
    keep.resize(n, value);
    Ok(keep)
}

impl KeyPadding {
    /// Sequence `b` holds `lengths[b]` real tokens followed by padding up to `len`.
    /// [`Error::Shape`] if a length exceeds `len`.
    pub fn from_lengths(lengths: &[usize], len: usize) -> Result<Self> {
        if lengths.is_empty() || len == 0 {
            return Err(Error::Shape(format!(
                "key padding: {} lengths for a padded length of {len}",
                lengths.len()
            )));
        }
        let mut keep = flags(lengths.len(), len, false)?;
        for (b, &l) in lengths.iter().enumerate() {
            if l > len {
                return Err(Error::Shape(format!(
                    "key padding: sequence {b} has length {l}, longer than the padded length {len}"
                )));
            }
            keep[b * len..b * len + l].fill(true);
        }
        Ok(KeyPadding {
            keep,
            batch: lengths.len(),
            len,
        })
    }

    /// Explicit flags `[batch, len]`, row-major, `true` = real token; pads may be anywhere.
    /// [`Error::Shape`] if `keep` does not hold `batch·len` flags.
    pub fn from_flags(keep: Vec<bool>, batch: usize, len: usize) -> Result<Self> {
        if batch == 0 || len == 0 || Some(keep.len()) != batch.checked_mul(len) {
            return Err(Error::Shape(format!(
                "key padding: {} flags for [{batch}, {len}]",
                keep.len()
            )));
        }
        Ok(KeyPadding { keep, batch, len })
    }

    /// All real: no padding. [`Error::Shape`] when `batch·len` overflows,
    /// [`Error::AllocationRefused`] when the flags do not fit in memory.
    pub fn all(batch: usize, len: usize) -> Result<Self> {
        Self::from_flags(flags(batch, len, true)?, batch, len)
    }

    /// Batch size.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Padded length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the padded length is zero (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The flags of sequence `b`, or `None` when there is no such sequence.
    pub fn keep(&self, b: usize) -> Option<&[bool]> {
        let start = b.checked_mul(self.len)?;
        self.keep.get(start..start.checked_add(self.len)?)
    }
}

/// Dense flags over (query, key) pairs, `true` = visible: `[T_q, T_k]` shared by every batch
/// element, or `[B, T_q, T_k]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenseMask {
    keep: Vec<bool>,
    batch: Option<usize>,
    tq: usize,
    tk: usize,
}

impl DenseMask {
    /// One `[tq, tk]` mask for the whole batch (seed 001's `mask[None, None]`).
    pub fn shared(keep: Vec<bool>, tq: usize, tk: usize) -> Result<Self> {
        if tq == 0 || tk == 0 || Some(keep.len()) != tq.checked_mul(tk) {
            return Err(Error::Shape(format!(
                "dense mask: {} flags for [{tq}, {tk}]",
                keep.len()
            )));
        }
        Ok(DenseMask {
            keep,
            batch: None,
            tq,
            tk,
        })
    }

    /// One `[tq, tk]` mask per batch element, `[batch, tq, tk]` row-major.
    pub fn per_batch(keep: Vec<bool>, batch: usize, tq: usize, tk: usize) -> Result<Self> {
        let n = batch.checked_mul(tq).and_then(|n| n.checked_mul(tk));
        if batch == 0 || tq == 0 || tk == 0 || Some(keep.len()) != n {
            return Err(Error::Shape(format!(
                "dense mask: {} flags for [{batch}, {tq}, {tk}]",
                keep.len()
            )));
        }
        Ok(DenseMask {
            keep,
            batch: Some(batch),
            tq,
            tk,
        })
    }

    fn item(&self, b: usize) -> Option<&[bool]> {
        match self.batch {
            None => Some(&self.keep),
            Some(batch) if b < batch => {
                let n = self.tq * self.tk;
                self.keep.get(b * n..(b + 1) * n)
            }
            Some(_) => None,
        }
    }
}

/// What one attention call may see; see the [module docs](self) for the convention.
///
/// ```
/// use qkv::nn::{KeyPadding, Mask};
/// # fn main() -> qkv::Result<()> {
/// let pads = KeyPadding::from_lengths(&[3, 1], 4)?; // two sequences padded to 4
/// let mask = Mask::none().with_causal().with_padding(&pads);
/// assert!(mask.check(2, 4, 4).is_ok());
/// assert!(mask.check(3, 4, 4).is_err()); // the padding covers 2 sequences, not 3
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Mask<'m> {
    /// Causal masking.
    pub causal: bool,
    /// Per-key padding, `[B, T_k]`.
    pub padding: Option<&'m KeyPadding>,
    /// Dense `[T_q, T_k]` or `[B, T_q, T_k]` flags.
    pub dense: Option<&'m DenseMask>,
}

impl<'m> Mask<'m> {
    /// Everything visible.
    pub fn none() -> Self {
        Self::default()
    }

    /// Adds causal masking.
    pub fn with_causal(mut self) -> Self {
        self.causal = true;
        self
    }

    /// Sets causal masking on or off.
    pub fn causal_if(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Adds key padding.
    pub fn with_padding(mut self, padding: &'m KeyPadding) -> Self {
        self.padding = Some(padding);
        self
    }

    /// Adds a dense mask.
    pub fn with_dense(mut self, dense: &'m DenseMask) -> Self {
        self.dense = Some(dense);
        self
    }

    /// [`Error::Shape`] unless the parts fit `batch` sequences of `tq` queries and `tk` keys.
    pub fn check(&self, batch: usize, tq: usize, tk: usize) -> Result<()> {
        if let Some(p) = self.padding {
            if p.batch != batch || p.len != tk {
                return Err(Error::Shape(format!(
                    "key padding is [{}, {}] but the attention has batch {batch} and {tk} keys",
                    p.batch, p.len
                )));
            }
        }
        if let Some(d) = self.dense {
            if d.tq != tq || d.tk != tk || d.batch.is_some_and(|b| b != batch) {
                return Err(Error::Shape(format!(
                    "dense mask is [{}{}, {}] but the attention has batch {batch}, {tq} queries and {tk} keys",
                    d.batch.map(|b| format!("{b}, ")).unwrap_or_default(),
                    d.tq,
                    d.tk
                )));
            }
        }
        Ok(())
    }

    /// The kernel mask for batch element `b`, queries starting at absolute position `q_pos0`.
    /// [`Error::Shape`] when the padding or dense mask has no element `b`; call
    /// [`Mask::check`] first for the full shape check.
    pub fn for_item(&self, b: usize, q_pos0: usize) -> Result<AttentionMask<'m>> {
        let missing = |what: &str| Error::Shape(format!("the {what} has no batch element {b}"));
        Ok(AttentionMask {
            causal_offset: self.causal.then_some(q_pos0),
            key_keep: match self.padding {
                Some(p) => Some(p.keep(b).ok_or_else(|| missing("key padding"))?),
                None => None,
            },
            dense_keep: match self.dense {
                Some(d) => Some(d.item(b).ok_or_else(|| missing("dense mask"))?),
                None => None,
            },
            ..AttentionMask::default()
        })
    }
}
