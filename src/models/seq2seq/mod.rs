//! The encoder–decoder Transformer of seed 004, made a usable seq2seq model.
//!
//! The network, top to bottom:
//! - `src_embedding` (token → `d_model`), then the sinusoidal positional encoding;
//! - encoder layers, pre-norm: `h = x + attn(norm1(x))` with the source padding mask,
//!   `out = h + FFN(norm2(h))`; no final norm;
//! - `tgt_embedding`, positional encoding, decoder layers, pre-norm with three norms:
//!   causal self-attention (with the target's padding too), cross-attention over the encoder
//!   output masked by the **source** padding (the seed used the decoder lengths there, a bug),
//!   then the FFN;
//! - `generator`: `Linear(d_model → tgt_vocab)`, the logits.
//!
//! Weight names are the seed's PyTorch names (`Encoder.Layers.0.attn.wq.weight`,
//! `Decoder.Layers.1.cross_attn.output_layer.bias`, `Decoder.Layers.0.FFN.linear1.weight`,
//! `Encoder.Layers.0.norm1.weight`, …) plus three of ours: `src_embedding.weight`
//! `[src_vocab, d_model]`, `tgt_embedding.weight` `[tgt_vocab, d_model]` and
//! `generator.weight` / `generator.bias` `[tgt_vocab, d_model]` / `[tgt_vocab]`. Embeddings
//! are not scaled by √d_model. The positional-encoding buffers (`*.pos_embedding.pe`) are
//! optional; when present their shape is checked against the configuration.
//!
//! Incremental decoding: [`Seq2Seq::encode`] runs the encoder once and projects every decoder
//! layer's cross-attention K and V once ([`EncoderMemory`]); [`Seq2Seq::start`] sizes a
//! [`DecodeState`] (self-attention KV cache per layer and every scratch buffer) once; each
//! [`Seq2Seq::step`] then costs one new row per sequence and allocates nothing in this crate.
//!
//! ```no_run
//! use qkv::models::seq2seq::{Seq2Seq, Seq2SeqConfig, TokenBatch};
//! use qkv::weights::safetensors::SafeTensorsFile;
//! # fn main() -> qkv::Result<()> {
//! let file = SafeTensorsFile::open("model.safetensors")?;
//! let config = Seq2SeqConfig::from_metadata(&file.metadata())?;
//! let model = Seq2Seq::load(&file, config)?;
//! // Two sources, padded to 4 tokens: lengths 4 and 2.
//! let src = TokenBatch::new(&[5, 6, 7, 8, 9, 3, 0, 0], 2, 4, &[4, 2])?;
//! let out = model.greedy(&src, 1, 2, 20)?; // BOS = 1, EOS = 2, at most 20 tokens
//! println!("{out:?}");
//! # Ok(())
//! # }
//! ```

use crate::error::{Error, Result};
use crate::nn::{
    AttentionCore, AttentionScratch, Embedding, FeedForward, KeyPadding, LayerNorm, Linear, Mask,
    PositionalEncoding, Seq, SeqBuf, TransformerAttention,
};
use crate::weights::{Scope, TensorSource};
use qkv_kernels::activation::add_inplace;

mod config;
mod incremental;

pub use config::{Seq2SeqConfig, TokenBatch};
pub use incremental::DecodeState;

/// One set of activations for every layer of a full-sequence pass (encoder, teacher-forced
/// decoder): multi-megabyte buffers allocated per layer went back to the OS and were
/// page-faulted in again each time (~8% of the encoder's time).
#[derive(Default)]
struct Activations {
    /// A normalised input, `[rows, d]`.
    h: Vec<f32>,
    /// A sublayer's output before the residual add, `[rows, d]`.
    delta: Vec<f32>,
    /// The feed-forward block's inner activations, `[rows, inner]`.
    hidden: Vec<f32>,
    /// Q, K, V and context of the attention sublayers.
    scratch: AttentionScratch,
}

impl Activations {
    /// Buffers for `x` of `rows` positions of width `d`, and a feed-forward block of width
    /// `inner`.
    fn new(rows: usize, d: usize, inner: usize) -> Self {
        let mut act = Activations::default();
        act.fit(rows, d, inner);
        act
    }

    /// Sizes the buffers for `rows` positions, keeping their memory when it suffices (the
    /// attention scratch sizes itself).
    fn fit(&mut self, rows: usize, d: usize, inner: usize) {
        for (buf, n) in [
            (&mut self.h, rows * d),
            (&mut self.delta, rows * d),
            (&mut self.hidden, rows * inner),
        ] {
            buf.resize(n, 0.0);
        }
    }

    /// The pre-norm residual attention sublayer, `x += attn(norm(x), kv, kv)`, where `kv` is
    /// `memory` (cross-attention) or `norm(x)` itself (self-attention).
    fn attention(
        &mut self,
        x: &mut SeqBuf,
        norm: &LayerNorm,
        attn: &AttentionCore,
        memory: Option<Seq<'_>>,
        mask: &Mask<'_>,
    ) -> Result<()> {
        norm.forward_into(x.data(), &mut self.h)?;
        let h = Seq::new(&self.h, x.batch(), x.len(), x.dim())?;
        let kv = memory.unwrap_or(h);
        attn.forward_into(h, kv, kv, mask, &mut self.scratch, &mut self.delta)?;
        add(x.data_mut(), &self.delta)
    }

    /// The pre-norm residual feed-forward sublayer, `x += ffn(norm(x))`.
    fn feed_forward(&mut self, x: &mut SeqBuf, norm: &LayerNorm, ffn: &FeedForward) -> Result<()> {
        norm.forward_into(x.data(), &mut self.h)?;
        let rows = x.batch() * x.len();
        ffn.forward_into(&self.h, rows, &mut self.hidden, &mut self.delta)?;
        add(x.data_mut(), &self.delta)
    }
}

/// The buffers of a full-sequence encoder pass, kept by the caller from one call of
/// [`Seq2Seq::encode_embedded_in`] to the next. Empty until first used; sized for the largest
/// batch seen.
#[derive(Default)]
pub struct Workspace {
    act: Activations,
    /// The residual stream, `[B, S, d_model]`; the output after a pass.
    x: Vec<f32>,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace")
            .field("positions_x_width", &self.x.len())
            .finish()
    }
}

#[derive(Debug)]
struct EncoderLayer {
    attn: TransformerAttention,
    ffn: FeedForward,
    norm1: LayerNorm,
    norm2: LayerNorm,
}

#[derive(Debug)]
struct DecoderLayer {
    self_attn: TransformerAttention,
    cross_attn: TransformerAttention,
    ffn: FeedForward,
    norm1: LayerNorm,
    norm2: LayerNorm,
    norm3: LayerNorm,
}

/// The longest source or target a [`Seq2SeqConfig`] may declare (as for the Llama context).
pub const MAX_LEN: usize = 1 << 20;

/// Seed 004's Transformer with token embeddings and an output projection.
#[derive(Debug)]
pub struct Seq2Seq {
    /// Unique per loaded model: encoder memories and decode states carry it, so that one
    /// model never runs on another's (its cross-attention K/V, its layer count).
    id: u64,
    cfg: Seq2SeqConfig,
    src_embedding: Embedding,
    tgt_embedding: Embedding,
    src_pe: PositionalEncoding,
    tgt_pe: PositionalEncoding,
    encoder: Vec<EncoderLayer>,
    decoder: Vec<DecoderLayer>,
    generator: Linear,
}

/// The encoder's result for a batch of sources, kept for the whole decode: the encoder
/// output, the source padding, and every decoder layer's cross-attention K and V.
#[derive(Debug)]
pub struct EncoderMemory {
    /// The [`Seq2Seq::id`] of the model that made it.
    model: u64,
    output: SeqBuf,
    padding: KeyPadding,
    /// Per decoder layer, `[B, S, d_model]`.
    cross_k: Vec<Vec<f32>>,
    cross_v: Vec<Vec<f32>>,
}

impl EncoderMemory {
    /// The encoder output `[B, S, d_model]`.
    pub fn output(&self) -> &SeqBuf {
        &self.output
    }

    /// The source padding.
    pub fn padding(&self) -> &KeyPadding {
        &self.padding
    }

    /// Number of sources.
    pub fn batch(&self) -> usize {
        self.output.batch()
    }
}

fn add(dst: &mut [f32], src: &[f32]) -> Result<()> {
    add_inplace(dst, src)?;
    Ok(())
}

impl Seq2Seq {
    /// Loads every weight from `source` by its PyTorch name (see the [module docs](self)).
    ///
    /// Errors: [`Error::Config`] for an inconsistent `cfg`, [`Error::MissingTensor`] and
    /// [`Error::TensorShape`] naming the tensor at fault.
    pub fn load(source: &dyn TensorSource, cfg: Seq2SeqConfig) -> Result<Self> {
        cfg.validate()?;
        let root = Scope::new(source);
        let d = cfg.d_model;
        let eps = cfg.norm_eps;
        // The checkpoint's own `pe` buffers when it has them: PyTorch's table, to the bit.
        let positions = |side: &str, max_len: usize| -> Result<PositionalEncoding> {
            let pe = root.pp(side).pp("pos_embedding");
            if pe.contains("pe") {
                let table = pe.tensor_shaped("pe", &[1, max_len, d])?.to_f32_vec()?;
                PositionalEncoding::from_table(d, max_len, table)
            } else {
                PositionalEncoding::new(d, max_len)
            }
        };
        let (src_pe, tgt_pe) = (
            positions("Encoder", cfg.max_src_len)?,
            positions("Decoder", cfg.max_tgt_len)?,
        );
        let enc = root.pp("Encoder").pp("Layers");
        let encoder = (0..cfg.encoder_layers)
            .map(|i| {
                let l = enc.pp(&i.to_string());
                // The encoder only ever sees whole sources: its weights kept for gemm.
                Ok(EncoderLayer {
                    attn: TransformerAttention::load(&l.pp("attn"), d, cfg.heads)?
                        .for_many_rows()?,
                    ffn: FeedForward::load(&l.pp("FFN"), d, cfg.ffn_scale)?.for_many_rows()?,
                    norm1: LayerNorm::load(&l, "norm1", d, eps)?,
                    norm2: LayerNorm::load(&l, "norm2", d, eps)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let dec = root.pp("Decoder").pp("Layers");
        let decoder = (0..cfg.decoder_layers)
            .map(|i| {
                let l = dec.pp(&i.to_string());
                Ok(DecoderLayer {
                    self_attn: TransformerAttention::load(&l.pp("self_attn"), d, cfg.heads)?,
                    // K and V project the whole encoder output, once per source.
                    cross_attn: TransformerAttention::load(&l.pp("cross_attn"), d, cfg.heads)?
                        .kv_for_many_rows()?,
                    ffn: FeedForward::load(&l.pp("FFN"), d, cfg.ffn_scale)?,
                    norm1: LayerNorm::load(&l, "norm1", d, eps)?,
                    norm2: LayerNorm::load(&l, "norm2", d, eps)?,
                    norm3: LayerNorm::load(&l, "norm3", d, eps)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Seq2Seq {
            id: super::next_model_id(),
            src_embedding: Embedding::load(&root, "src_embedding", cfg.src_vocab, d)?,
            tgt_embedding: Embedding::load(&root, "tgt_embedding", cfg.tgt_vocab, d)?,
            src_pe,
            tgt_pe,
            generator: Linear::load(&root, "generator", d, cfg.tgt_vocab)?,
            encoder,
            decoder,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Seq2SeqConfig {
        &self.cfg
    }

    /// [`Error::ForeignState`] unless this model made `memory` (directly or through a decode
    /// state): another model's has other cross-attention K/V, perhaps another layer count.
    fn check_memory(&self, memory: &EncoderMemory) -> Result<()> {
        if memory.model != self.id {
            return Err(Error::ForeignState {
                state: "encoder memory",
                made_by: memory.model,
                used_with: self.id,
            });
        }
        Ok(())
    }

    /// The seed's `Encoder.forward`: positional encoding added to the already embedded `x`
    /// `[B, S, d_model]`, then the layers with `padding` (`[B, S]`, `true` = real token).
    ///
    /// [`Error::Shape`] when `x` does not have `d_model` features or `padding` is not
    /// `[B, S]`; [`Error::ContextFull`] when `S` exceeds `max_src_len`.
    pub fn encode_embedded(&self, x: Seq<'_>, padding: &KeyPadding) -> Result<SeqBuf> {
        let mut ws = Workspace::default();
        let out = self.encode_embedded_in(x, padding, &mut ws)?;
        SeqBuf::new(out.data().to_vec(), out.batch(), out.len(), out.dim())
    }

    /// As [`encode_embedded`](Self::encode_embedded), with every buffer taken from `ws`
    /// (grown on first use, then reused): a server or a benchmark encoding batch after batch
    /// allocates nothing after the first call, so no multi-megabyte buffer goes back to the
    /// OS and is page-faulted in again. The output is a view into `ws`, valid until its next
    /// use. The same errors as `encode_embedded`.
    pub fn encode_embedded_in<'w>(
        &self,
        x: Seq<'_>,
        padding: &KeyPadding,
        ws: &'w mut Workspace,
    ) -> Result<Seq<'w>> {
        self.check_dim(x)?;
        let (b, t, d) = (x.batch(), x.len(), x.dim());
        let mut buf = std::mem::take(&mut ws.x);
        buf.clear();
        buf.extend_from_slice(x.data());
        let mut x = SeqBuf::new(buf, b, t, d)?;
        let mask = Mask::none().with_padding(padding);
        let inner = self.encoder.first().map_or(0, |l| l.ffn.inner_dim());
        let act = &mut ws.act;
        act.fit(b * t, d, inner);
        let layers = || -> Result<()> {
            self.src_pe.forward(&mut x)?;
            for layer in &self.encoder {
                act.attention(&mut x, &layer.norm1, layer.attn.core(), None, &mask)?;
                act.feed_forward(&mut x, &layer.norm2, &layer.ffn)?;
            }
            Ok(())
        };
        // On a rayon worker, as `step` runs.
        let result = qkv_kernels::on_pool(layers);
        ws.x = x.into_vec();
        result?;
        Seq::new(&ws.x, b, t, d)
    }

    /// The seed's `Decoder.forward`, teacher-forced, on the already embedded target `y`
    /// `[B, T, d_model]`: causal self-attention masked by `tgt_padding` too, cross-attention
    /// over `enc_out` masked by `src_padding`. Returns the hidden states `[B, T, d_model]`.
    ///
    /// [`Error::Shape`] when `y` or `enc_out` does not have `d_model` features, their batches
    /// differ, or a padding's shape does not match its sequence; [`Error::ContextFull`] when
    /// `T` exceeds `max_tgt_len`.
    pub fn decode_embedded(
        &self,
        y: Seq<'_>,
        enc_out: Seq<'_>,
        src_padding: &KeyPadding,
        tgt_padding: &KeyPadding,
    ) -> Result<SeqBuf> {
        self.check_dim(y)?;
        self.check_dim(enc_out)?;
        let (b, t, d) = (y.batch(), y.len(), y.dim());
        let mut x = SeqBuf::new(y.data().to_vec(), b, t, d)?;
        self.tgt_pe.forward(&mut x)?;
        let self_mask = Mask::none().with_causal().with_padding(tgt_padding);
        let cross_mask = Mask::none().with_padding(src_padding);
        let inner = self.decoder.first().map_or(0, |l| l.ffn.inner_dim());
        let mut act = Activations::new(b * t, d, inner);
        let layers = || -> Result<()> {
            for l in &self.decoder {
                act.attention(&mut x, &l.norm1, l.self_attn.core(), None, &self_mask)?;
                act.attention(
                    &mut x,
                    &l.norm2,
                    l.cross_attn.core(),
                    Some(enc_out),
                    &cross_mask,
                )?;
                act.feed_forward(&mut x, &l.norm3, &l.ffn)?;
            }
            Ok(())
        };
        qkv_kernels::on_pool(layers)?;
        Ok(x)
    }

    fn check_dim(&self, x: Seq<'_>) -> Result<()> {
        if x.dim() != self.cfg.d_model {
            return Err(Error::Shape(format!(
                "seq2seq: input has {} features, d_model is {}",
                x.dim(),
                self.cfg.d_model
            )));
        }
        Ok(())
    }

    /// Runs the encoder once over `src` and projects every decoder layer's cross-attention
    /// K and V. [`Error::TokenOutOfRange`] for an id outside the source vocabulary,
    /// [`Error::ContextFull`] for a source longer than `max_src_len`.
    pub fn encode(&self, src: &TokenBatch<'_>) -> Result<EncoderMemory> {
        self.encode_with_padding(src.ids(), src.batch(), src.len(), src.padding()?)
    }

    /// As [`Seq2Seq::encode`] with explicit padding flags (pads anywhere). The same errors,
    /// and [`Error::Shape`] when `ids` is not `batch · len` long or `padding` not
    /// `[batch, len]`.
    pub fn encode_with_padding(
        &self,
        ids: &[u32],
        batch: usize,
        len: usize,
        padding: KeyPadding,
    ) -> Result<EncoderMemory> {
        if len > self.cfg.max_src_len {
            return Err(Error::ContextFull {
                needed: len,
                capacity: self.cfg.max_src_len,
            });
        }
        let x = self.src_embedding.forward(ids, batch, len)?;
        let output = self.encode_embedded(x.view(), &padding)?;
        let rows = batch * len;
        let d = self.cfg.d_model;
        let mut cross_k = Vec::with_capacity(self.decoder.len());
        let mut cross_v = Vec::with_capacity(self.decoder.len());
        for layer in &self.decoder {
            let core = layer.cross_attn.core();
            let mut k = vec![0.0; rows * d];
            let mut v = vec![0.0; rows * d];
            core.k_proj().forward_into(output.data(), rows, &mut k)?;
            core.v_proj().forward_into(output.data(), rows, &mut v)?;
            cross_k.push(k);
            cross_v.push(v);
        }
        Ok(EncoderMemory {
            model: self.id,
            output,
            padding,
            cross_k,
            cross_v,
        })
    }

    /// Teacher-forced logits `[B, T, tgt_vocab]` for targets `tgt` over an encoded source.
    ///
    /// [`Error::ForeignState`] when `memory` was made by another model; [`Error::Shape`] when
    /// it holds another number of sources; [`Error::TokenOutOfRange`] for an id outside the
    /// target vocabulary; [`Error::ContextFull`] for targets longer than `max_tgt_len`.
    pub fn decode_teacher_forced(
        &self,
        memory: &EncoderMemory,
        tgt: &TokenBatch<'_>,
    ) -> Result<SeqBuf> {
        self.decode_teacher_forced_with_padding(
            memory,
            tgt.ids(),
            tgt.batch(),
            tgt.len(),
            &tgt.padding()?,
        )
    }

    /// As [`Seq2Seq::decode_teacher_forced`] with explicit target padding flags. The same
    /// errors, and [`Error::Shape`] when `ids` or `padding` do not match `batch × len`.
    pub fn decode_teacher_forced_with_padding(
        &self,
        memory: &EncoderMemory,
        ids: &[u32],
        batch: usize,
        len: usize,
        padding: &KeyPadding,
    ) -> Result<SeqBuf> {
        self.check_memory(memory)?;
        if batch != memory.batch() {
            return Err(Error::Shape(format!(
                "seq2seq: {batch} targets for {} sources",
                memory.batch()
            )));
        }
        if len > self.cfg.max_tgt_len {
            return Err(Error::ContextFull {
                needed: len,
                capacity: self.cfg.max_tgt_len,
            });
        }
        let y = self.tgt_embedding.forward(ids, batch, len)?;
        let h = self.decode_embedded(y.view(), memory.output.view(), &memory.padding, padding)?;
        self.generator.forward(h.view())
    }

    /// The whole model, teacher-forced: logits `[B, T, tgt_vocab]`. The errors of
    /// [`Seq2Seq::encode`] and [`Seq2Seq::decode_teacher_forced`].
    pub fn forward(&self, src: &TokenBatch<'_>, tgt: &TokenBatch<'_>) -> Result<SeqBuf> {
        let memory = self.encode(src)?;
        self.decode_teacher_forced(&memory, tgt)
    }
}
