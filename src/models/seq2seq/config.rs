//! The sizes of a [`Seq2Seq`](super::Seq2Seq) model and the token batches it takes.

use super::MAX_LEN;
use crate::error::{Error, Result};
use crate::nn::KeyPadding;
use std::collections::HashMap;

/// Sizes of a [`Seq2Seq`](super::Seq2Seq) model.
#[derive(Clone, Debug, PartialEq)]
pub struct Seq2SeqConfig {
    /// Hidden size `d_model` (the seed's `hidden_size`).
    pub d_model: usize,
    /// Attention heads; must divide `d_model`.
    pub heads: usize,
    /// Encoder layers.
    pub encoder_layers: usize,
    /// Decoder layers.
    pub decoder_layers: usize,
    /// FFN inner size is `ffn_scale · d_model` (the seed's integer `ffn_scale`).
    pub ffn_scale: usize,
    /// Source vocabulary.
    pub src_vocab: usize,
    /// Target vocabulary.
    pub tgt_vocab: usize,
    /// Longest source (the encoder's positional-encoding `max_len`).
    pub max_src_len: usize,
    /// Longest target (the decoder's positional-encoding `max_len`).
    pub max_tgt_len: usize,
    /// LayerNorm epsilon (PyTorch's default 1e-5).
    pub norm_eps: f32,
}

impl Seq2SeqConfig {
    /// [`Error::Config`] when a size is zero, `heads` does not divide `d_model`, the FFN
    /// size `ffn_scale · d_model` overflows, or a maximum length exceeds [`MAX_LEN`].
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [
            ("d_model", self.d_model),
            ("heads", self.heads),
            ("encoder_layers", self.encoder_layers),
            ("decoder_layers", self.decoder_layers),
            ("ffn_scale", self.ffn_scale),
            ("src_vocab", self.src_vocab),
            ("tgt_vocab", self.tgt_vocab),
            ("max_src_len", self.max_src_len),
            ("max_tgt_len", self.max_tgt_len),
        ] {
            if v == 0 {
                return Err(Error::Config(format!("seq2seq: {what} must not be zero")));
            }
        }
        for (what, v) in [
            ("max_src_len", self.max_src_len),
            ("max_tgt_len", self.max_tgt_len),
        ] {
            if v > MAX_LEN {
                return Err(Error::Config(format!(
                    "seq2seq: {what} = {v} is past the {MAX_LEN} positions qkv supports"
                )));
            }
        }
        if self.d_model.checked_mul(self.ffn_scale).is_none() {
            return Err(Error::Config(format!(
                "seq2seq: the FFN size {} × {} overflows",
                self.ffn_scale, self.d_model
            )));
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(Error::Config(format!(
                "seq2seq: d_model = {} is not divisible by heads = {}",
                self.d_model, self.heads
            )));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return Err(Error::Config(format!(
                "seq2seq: norm_eps must be positive, got {}",
                self.norm_eps
            )));
        }
        Ok(())
    }

    /// Reads the configuration from a safetensors `__metadata__` map with the keys
    /// `d_model`, `heads`, `encoder_layers`, `decoder_layers`, `ffn_scale`, `src_vocab`,
    /// `tgt_vocab`, `max_src_len`, `max_tgt_len` and optionally `norm_eps` (default 1e-5),
    /// as `tools/seq2seq_fixtures.py` writes them.
    pub fn from_metadata(meta: &HashMap<String, String>) -> Result<Self> {
        let int = |key: &str| -> Result<usize> {
            let v = meta
                .get(key)
                .ok_or_else(|| Error::Config(format!("seq2seq: metadata lacks `{key}`")))?;
            v.trim().parse().map_err(|_| {
                Error::Config(format!(
                    "seq2seq: metadata `{key}` = {v:?} is not an integer"
                ))
            })
        };
        let norm_eps = match meta.get("norm_eps") {
            None => 1e-5,
            Some(v) => v.trim().parse().map_err(|_| {
                Error::Config(format!(
                    "seq2seq: metadata `norm_eps` = {v:?} is not a number"
                ))
            })?,
        };
        let cfg = Seq2SeqConfig {
            d_model: int("d_model")?,
            heads: int("heads")?,
            encoder_layers: int("encoder_layers")?,
            decoder_layers: int("decoder_layers")?,
            ffn_scale: int("ffn_scale")?,
            src_vocab: int("src_vocab")?,
            tgt_vocab: int("tgt_vocab")?,
            max_src_len: int("max_src_len")?,
            max_tgt_len: int("max_tgt_len")?,
            norm_eps,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The metadata map [`Seq2SeqConfig::from_metadata`] reads.
    pub fn to_metadata(&self) -> HashMap<String, String> {
        [
            ("d_model", self.d_model.to_string()),
            ("heads", self.heads.to_string()),
            ("encoder_layers", self.encoder_layers.to_string()),
            ("decoder_layers", self.decoder_layers.to_string()),
            ("ffn_scale", self.ffn_scale.to_string()),
            ("src_vocab", self.src_vocab.to_string()),
            ("tgt_vocab", self.tgt_vocab.to_string()),
            ("max_src_len", self.max_src_len.to_string()),
            ("max_tgt_len", self.max_tgt_len.to_string()),
            ("norm_eps", self.norm_eps.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// Token ids `[batch, len]`, row-major, with each sequence's real length (the rest is
/// padding at the tail). For pads elsewhere, use the `*_with_padding` methods.
#[derive(Clone, Copy, Debug)]
pub struct TokenBatch<'a> {
    ids: &'a [u32],
    batch: usize,
    len: usize,
    lengths: &'a [usize],
}

impl<'a> TokenBatch<'a> {
    /// [`Error::Shape`] unless `ids` holds `batch·len` ids, `lengths` has `batch` entries, and
    /// every length lies in `1..=len`.
    pub fn new(ids: &'a [u32], batch: usize, len: usize, lengths: &'a [usize]) -> Result<Self> {
        if batch == 0 || len == 0 || Some(ids.len()) != batch.checked_mul(len) {
            return Err(Error::Shape(format!(
                "tokens: {} ids for [{batch}, {len}]",
                ids.len()
            )));
        }
        if lengths.len() != batch {
            return Err(Error::Shape(format!(
                "tokens: {} lengths for a batch of {batch}",
                lengths.len()
            )));
        }
        if let Some((b, &l)) = lengths.iter().enumerate().find(|(_, &l)| l == 0 || l > len) {
            return Err(Error::Shape(format!(
                "tokens: sequence {b} has length {l}, outside 1..={len}"
            )));
        }
        Ok(TokenBatch {
            ids,
            batch,
            len,
            lengths,
        })
    }

    /// Batch size.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Padded length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a batch has at least one token.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The ids.
    pub fn ids(&self) -> &'a [u32] {
        self.ids
    }

    /// The padding mask from the lengths. [`Error::Shape`] when a length exceeds the padded
    /// length (already refused by [`TokenBatch::new`]).
    pub fn padding(&self) -> Result<KeyPadding> {
        KeyPadding::from_lengths(self.lengths, self.len)
    }
}
