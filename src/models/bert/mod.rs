//! BERT: a bidirectional Transformer encoder, and sentence embeddings from it as
//! sentence-transformers computes them (all-MiniLM-L6-v2 and its kin).
//!
//! The network (Hugging Face `BertModel`, weights by its names, with or without a `bert.`
//! prefix):
//! - embeddings: `word_embeddings[id] + token_type_embeddings[0] + position_embeddings[t]`,
//!   then `embeddings.LayerNorm`;
//! - each layer, post-norm: `x = LN(x + attn(x))` with bidirectional multi-head attention
//!   whose keys are masked by the batch's padding (in the one attention kernel, through
//!   [`Mask`] and [`KeyPadding`]), then `x = LN(x + W₂·gelu(W₁·x))` with the exact erf GELU;
//! - no pooler: sentence-transformers pools the last hidden states itself ([`Pooling`]),
//!   then L2-normalises them ([`l2_normalize`]).
//!
//! [`Bert::forward`] runs a padded batch of token ids into a [`BertWorkspace`] that keeps
//! every activation buffer between calls, so repeated batches allocate nothing once the
//! largest has been seen. [`SentenceEncoder`] adds the pooling and normalisation of a
//! sentence-transformers directory, [`Embedder`] the tokenizer, truncation and batching.
//!
//! ```no_run
//! use qkv::models::bert::Embedder;
//! # fn main() -> qkv::Result<()> {
//! let embedder = Embedder::load("all-MiniLM-L6-v2".as_ref())?;
//! let vectors = embedder.embed(&["A short one.", "A longer sentence about cats and dogs."])?;
//! assert_eq!(vectors.len(), 2);
//! assert_eq!(vectors[0].len(), embedder.dim()); // 384, of unit length
//! # Ok(())
//! # }
//! ```

pub(crate) mod config;
mod cross;
mod embedder;
mod pooling;

pub use config::{BertConfig, SentenceConfig};
pub use cross::CrossEncoder;
pub use embedder::{Embedder, SentenceEncoder, PASS_TOKENS};
pub use pooling::{l2_normalize, Pooling, PoolingMode};

use crate::error::{Error, Result};
use crate::models::seq2seq::TokenBatch;
use crate::nn::attention::{AttentionDims, ProjectionNames};
use crate::nn::{
    AttentionCore, AttentionScratch, Embedding, KeyPadding, LayerNorm, Linear, Mask, Seq,
};
use crate::weights::safetensors::SafeTensorsFile;
use crate::weights::{Scope, TensorSource};
use qkv_kernels::activation::{add_inplace, gelu_erf_inplace};
use qkv_kernels::{linear_many, AttentionMask};
use rayon::prelude::*;
use std::path::Path;

#[derive(Debug)]
struct BertLayer {
    /// `attention.self.{query,key,value}` and `attention.output.dense`.
    attn: AttentionCore,
    /// `attention.output.LayerNorm`.
    attn_norm: LayerNorm,
    /// `intermediate.dense`, `hidden → intermediate`.
    up: Linear,
    /// `output.dense`, `intermediate → hidden`.
    down: Linear,
    /// `output.LayerNorm`.
    out_norm: LayerNorm,
}

/// A BERT encoder: token ids in, last hidden states out.
#[derive(Debug)]
pub struct Bert {
    cfg: BertConfig,
    words: Embedding,
    /// `position_embeddings.weight`, `[max_positions, hidden]`.
    positions: Vec<f32>,
    /// `token_type_embeddings.weight`, `[type_vocab_size, hidden]`: row 0 for a single
    /// text, row 1 for a pair's second text ([`Bert::forward_packed_pairs`]).
    segments: Vec<f32>,
    embed_norm: LayerNorm,
    layers: Vec<BertLayer>,
}

/// The activations of [`Bert::forward`], grown to the largest batch seen and then reused:
/// the hidden states, a sublayer's output, the feed-forward inner activations, and the
/// attention's Q, K, V and context.
#[derive(Debug, Default)]
pub struct BertWorkspace {
    x: Vec<f32>,
    delta: Vec<f32>,
    inner: Vec<f32>,
    attn: AttentionScratch,
    /// Q, K, V and context of a packed pass ([`Bert::forward_packed`]).
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    ctx: Vec<f32>,
}

/// The first `n` values of `buf`, grown (zero-filled) when it is shorter.
fn grown(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// [`Error::MissingTensor`] unless `scope` holds `name`: BERT has a bias everywhere, and a
/// checkpoint without one is not read as if it were zero.
fn require(scope: &Scope<'_>, name: &str) -> Result<()> {
    if scope.contains(name) {
        Ok(())
    } else {
        Err(Error::MissingTensor {
            name: scope.name(name),
        })
    }
}

/// From this many values on, the GELU is split across rayon's pool (whole 64-value runs,
/// so the result is the one pass's).
const GELU_PAR_MIN: usize = 1 << 15;

fn gelu(x: &mut [f32]) {
    if x.len() < GELU_PAR_MIN || rayon::current_num_threads() < 2 {
        gelu_erf_inplace(x);
    } else {
        let piece = x
            .len()
            .div_ceil(4 * rayon::current_num_threads())
            .div_ceil(64)
            * 64;
        x.par_chunks_mut(piece).for_each(gelu_erf_inplace);
    }
}

impl Bert {
    /// Loads `dir/config.json` and `dir/model.safetensors` (mapped, not copied).
    ///
    /// Errors: those of [`BertConfig::from_json_file`]; [`Error::Io`] / [`Error::Format`]
    /// for the weights file; [`Error::InFile`] around a missing tensor or a wrong shape.
    pub fn load(dir: &Path) -> Result<Bert> {
        let cfg = BertConfig::from_json_file(&dir.join("config.json"))?;
        Self::load_weights(dir, cfg)
    }

    /// Loads `dir/model.safetensors` for an already read configuration.
    pub(crate) fn load_weights(dir: &Path, cfg: BertConfig) -> Result<Bert> {
        let path = dir.join("model.safetensors");
        let file = SafeTensorsFile::open(&path)?;
        Self::from_source(&file, cfg).map_err(|e| match e {
            Error::MissingTensor { .. }
            | Error::TensorShape { .. }
            | Error::UnsupportedDType { .. } => Error::InFile {
                path,
                source: Box::new(e),
            },
            other => other,
        })
    }

    /// Loads every weight from `source` by its Hugging Face name, under `bert.` when the
    /// source has that prefix (a checkpoint of `BertFor…` rather than `BertModel`).
    ///
    /// Errors: [`Error::Config`] for an inconsistent `cfg`, [`Error::MissingTensor`] and
    /// [`Error::TensorShape`] naming the tensor at fault.
    pub fn from_source(source: &dyn TensorSource, cfg: BertConfig) -> Result<Bert> {
        cfg.validate()?;
        let root = Scope::new(source);
        let root = if source.contains("bert.embeddings.word_embeddings.weight") {
            root.pp("bert")
        } else {
            root
        };
        let (d, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        let emb = root.pp("embeddings");
        let norm = |s: &Scope<'_>, name: &str| -> Result<LayerNorm> {
            require(&s.pp(name), "bias")?;
            LayerNorm::load(s, name, d, eps)
        };
        let words = Embedding::load(&emb, "word_embeddings", cfg.vocab_size, d)?;
        let positions = emb
            .pp("position_embeddings")
            .tensor_shaped("weight", &[cfg.max_positions, d])?
            .to_f32_vec()?;
        let types = emb
            .pp("token_type_embeddings")
            .tensor_shaped("weight", &[cfg.type_vocab_size, d])?
            .to_f32_vec()?;
        let embed_norm = norm(&emb, "LayerNorm")?;
        let dims = AttentionDims {
            q_in: d,
            kv_in: d,
            dim_qk: d,
            dim_v: d,
            heads: cfg.heads,
            out_dim: Some(d),
        };
        let layers = (0..cfg.layers)
            .map(|i| {
                let l = root.pp("encoder").pp("layer").pp(&i.to_string());
                let a = l.pp("attention");
                for p in ["self.query", "self.key", "self.value", "output.dense"] {
                    require(&a.pp(p), "bias")?;
                }
                let names = ProjectionNames {
                    q: "self.query",
                    k: "self.key",
                    v: "self.value",
                    out: Some("output.dense"),
                };
                // An encoder: every product sees a whole batch, so f32 weights are kept
                // transposed for gemm.
                Ok(BertLayer {
                    attn: AttentionCore::load(&a, names, dims)?.for_many_rows()?,
                    attn_norm: norm(&a.pp("output"), "LayerNorm")?,
                    up: Linear::load_with_bias(
                        &l.pp("intermediate"),
                        "dense",
                        d,
                        cfg.intermediate_size,
                    )?
                    .for_many_rows()?,
                    down: Linear::load_with_bias(
                        &l.pp("output"),
                        "dense",
                        cfg.intermediate_size,
                        d,
                    )?
                    .for_many_rows()?,
                    out_norm: norm(&l.pp("output"), "LayerNorm")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Bert {
            segments: types,
            words,
            positions,
            embed_norm,
            layers,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// The last hidden states `[batch, len, hidden]` of a padded batch of token ids (pads at
    /// the tail of each sequence, after its `lengths[b]` real tokens), written into `ws` and
    /// borrowed from it. Real tokens never attend to padding, so a sequence's states do not
    /// depend on what else is in the batch, nor on how far it is padded; the states at padded
    /// positions are computed but meaningless. Every token is in segment 0.
    ///
    /// Errors: [`Error::Shape`] when the padded length exceeds `max_position_embeddings`,
    /// [`Error::TokenOutOfRange`] for an id outside the vocabulary.
    pub fn forward<'w>(
        &self,
        tokens: &TokenBatch<'_>,
        ws: &'w mut BertWorkspace,
    ) -> Result<Seq<'w>> {
        let (b, t, d) = (tokens.batch(), tokens.len(), self.cfg.hidden_size);
        if t > self.cfg.max_positions {
            return Err(Error::Shape(format!(
                "bert: {t} tokens, more than the model's {} positions (`max_position_embeddings`)",
                self.cfg.max_positions
            )));
        }
        let padding = tokens.padding()?;
        let rows = b * t;
        qkv_kernels::on_pool(|| self.run(tokens.ids(), b, t, &padding, ws))?;
        Seq::new(&ws.x[..rows * d], b, t, d)
    }

    /// The last hidden states of sequences packed back to back, without padding: `ids` is
    /// their concatenation and `lengths` their lengths; the result is `[Σ lengths, hidden]`,
    /// borrowed from `ws`. Every matrix product runs over the real tokens of all sequences at
    /// once, and attention runs per sequence over its own tokens, so a batch of mixed lengths
    /// costs what its tokens cost (a padded batch pays for its longest sequence times its
    /// size). The states equal [`forward`](Self::forward)'s at the real positions, up to the
    /// order of f32 additions.
    ///
    /// Errors: [`Error::Shape`] when the lengths do not add up to `ids.len()`, or one is 0
    /// or past `max_position_embeddings`; [`Error::TokenOutOfRange`] for an id outside the
    /// vocabulary.
    pub fn forward_packed<'w>(
        &self,
        ids: &[u32],
        lengths: &[usize],
        ws: &'w mut BertWorkspace,
    ) -> Result<&'w [f32]> {
        self.check_packed(ids, lengths)?;
        qkv_kernels::on_pool(|| self.run_packed(ids, None, lengths, ws))?;
        Ok(&ws.x[..ids.len() * self.cfg.hidden_size])
    }

    /// As [`forward_packed`](Self::forward_packed), for pairs of texts read together (a
    /// cross-encoder's query and document): `segments[i]` is the segment of `ids[i]`, 0 for
    /// the first text, 1 for the second (Hugging Face's `token_type_ids`).
    ///
    /// Errors: those of `forward_packed`, and [`Error::Shape`] when `segments` is not as long
    /// as `ids` or names a segment past `type_vocab_size`.
    pub fn forward_packed_pairs<'w>(
        &self,
        ids: &[u32],
        segments: &[u8],
        lengths: &[usize],
        ws: &'w mut BertWorkspace,
    ) -> Result<&'w [f32]> {
        if segments.len() != ids.len() {
            return Err(Error::Shape(format!(
                "bert: {} segments for {} ids",
                segments.len(),
                ids.len()
            )));
        }
        if let Some(&s) = segments
            .iter()
            .find(|&&s| usize::from(s) >= self.cfg.type_vocab_size)
        {
            return Err(Error::Shape(format!(
                "bert: segment {s}, past the model's {} (`type_vocab_size`)",
                self.cfg.type_vocab_size
            )));
        }
        self.check_packed(ids, lengths)?;
        qkv_kernels::on_pool(|| self.run_packed(ids, Some(segments), lengths, ws))?;
        Ok(&ws.x[..ids.len() * self.cfg.hidden_size])
    }

    /// [`Error::Shape`] unless `lengths` add up to `ids.len()`, each in
    /// `1..=max_position_embeddings`.
    fn check_packed(&self, ids: &[u32], lengths: &[usize]) -> Result<()> {
        let max = self.cfg.max_positions;
        if let Some(&l) = lengths.iter().find(|&&l| l == 0 || l > max) {
            return Err(Error::Shape(format!(
                "bert: a sequence of {l} tokens, outside 1..={max} (`max_position_embeddings`)"
            )));
        }
        if lengths.iter().sum::<usize>() != ids.len() {
            return Err(Error::Shape(format!(
                "bert: lengths {lengths:?} do not add up to the {} packed ids",
                ids.len()
            )));
        }
        Ok(())
    }

    /// The packed pass, on a rayon worker.
    fn run_packed(
        &self,
        ids: &[u32],
        segments: Option<&[u8]>,
        lengths: &[usize],
        ws: &mut BertWorkspace,
    ) -> Result<()> {
        let d = self.cfg.hidden_size;
        let rows = ids.len();
        let BertWorkspace {
            x,
            delta,
            inner,
            q,
            k,
            v,
            ctx,
            ..
        } = ws;
        let x = grown(x, rows * d);
        let delta = grown(delta, rows * d);
        let inner = grown(inner, rows * self.cfg.intermediate_size);
        let first = self.layers.first().map(|l| &l.attn);
        let (dq, dv) = first.map_or((0, 0), |a| {
            (a.dims().heads * a.head_dim_qk(), a.heads() * a.head_dim_v())
        });
        let (q, k, v, ctx) = (
            grown(q, rows * dq),
            grown(k, rows * dq),
            grown(v, rows * dv),
            grown(ctx, rows * dv),
        );

        // Embeddings, summed in PyTorch's order: (word + segment) + position, positions
        // counted from each sequence's start.
        self.words.lookup_into(ids, delta)?;
        let mut row = 0;
        for &len in lengths {
            for (p, r) in delta[row * d..(row + len) * d]
                .chunks_exact_mut(d)
                .enumerate()
            {
                let pos = &self.positions[p * d..(p + 1) * d];
                let seg = segments.map_or(0, |s| usize::from(s[row + p]));
                let seg = &self.segments[seg * d..(seg + 1) * d];
                for ((v, &s), &e) in r.iter_mut().zip(seg).zip(pos) {
                    *v = (*v + s) + e;
                }
            }
            row += len;
        }
        self.embed_norm.forward_into(delta, x)?;

        for layer in &self.layers {
            let a = &layer.attn;
            linear_many(
                x,
                rows,
                d,
                &mut [
                    a.q_proj().projection(q),
                    a.k_proj().projection(k),
                    a.v_proj().projection(v),
                ],
            )?;
            let mut row = 0;
            for &len in lengths {
                let (qs, ks) = (
                    &q[row * dq..(row + len) * dq],
                    &k[row * dq..(row + len) * dq],
                );
                let vs = &v[row * dv..(row + len) * dv];
                a.attend(
                    &a.query_view(qs, len),
                    &a.key_view(ks, len),
                    &a.value_view(vs, len),
                    &AttentionMask::none(),
                    &mut ctx[row * dv..(row + len) * dv],
                )?;
                row += len;
            }
            a.project_out(ctx, rows, delta)?;
            add_inplace(delta, x)?;
            layer.attn_norm.forward_into(delta, x)?;
            layer.up.forward_into(x, rows, inner)?;
            gelu(inner);
            layer.down.forward_into(inner, rows, delta)?;
            add_inplace(delta, x)?;
            layer.out_norm.forward_into(delta, x)?;
        }
        Ok(())
    }

    /// The pass itself, on a rayon worker (its parallel kernels then queue work locally).
    fn run(
        &self,
        ids: &[u32],
        b: usize,
        t: usize,
        padding: &KeyPadding,
        ws: &mut BertWorkspace,
    ) -> Result<()> {
        let d = self.cfg.hidden_size;
        let rows = b * t;
        let BertWorkspace {
            x,
            delta,
            inner,
            attn,
            ..
        } = ws;
        let x = grown(x, rows * d);
        let delta = grown(delta, rows * d);
        let inner = grown(inner, rows * self.cfg.intermediate_size);

        // Embeddings, summed in PyTorch's order: (word + segment) + position.
        self.words.lookup_into(ids, delta)?;
        for (i, row) in delta.chunks_exact_mut(d).enumerate() {
            let pos = &self.positions[(i % t) * d..(i % t + 1) * d];
            for ((v, &s), &p) in row.iter_mut().zip(&self.segments[..d]).zip(pos) {
                *v = (*v + s) + p;
            }
        }
        self.embed_norm.forward_into(delta, x)?;

        let mask = Mask::none().with_padding(padding);
        for layer in &self.layers {
            let h = Seq::new(x, b, t, d)?;
            layer.attn.forward_into(h, h, h, &mask, attn, delta)?;
            add_inplace(delta, x)?;
            layer.attn_norm.forward_into(delta, x)?;
            layer.up.forward_into(x, rows, inner)?;
            gelu(inner);
            layer.down.forward_into(inner, rows, delta)?;
            add_inplace(delta, x)?;
            layer.out_norm.forward_into(delta, x)?;
        }
        Ok(())
    }
}
