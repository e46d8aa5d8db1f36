//! Neural-network modules: each holds its weight [`Tensor`](crate::weights::Tensor)s, loaded by
//! their PyTorch names through a [`Scope`](crate::weights::Scope), and calls the kernels of [`qkv_kernels`].
//!
//! - [`Seq`] / [`SeqBuf`]: activations `[batch, len, dim]` in f32, row-major, shapes explicit.
//! - [`Mask`], [`KeyPadding`], [`DenseMask`]: one masking convention for the whole API,
//!   **`true` = visible** (the kernel's). See [`mask`] for what a fully masked row returns.
//! - [`Linear`], [`LayerNorm`], [`FeedForward`], [`Embedding`], [`PositionalEncoding`].
//! - Attention modules of the seeds ([`seeds`]): [`SelfAttention`], [`MultiHeadAttention`],
//!   [`CrossAttention`], [`MultiHeadCrossAttention`], [`Attention`],
//!   [`MultiHeadAttentionWithProbs`], [`TransformerAttention`]; they are rows of one table
//!   ([`seeds::SEED_MODULES`]) over one [`AttentionCore`] ([`attention`]), and all attention
//!   goes through the one kernel [`qkv_kernels::attention()`].
//!
//! ```
//! use qkv::nn::{Linear, Seq};
//! use qkv::weights::Tensor;
//! # fn main() -> qkv::Result<()> {
//! // y = x·Wᵀ + b for a [1, 1, 2] input and a 2 → 1 layer.
//! let w = Tensor::from_f32("w", vec![1, 2], vec![1.0, 2.0])?;
//! let lin = Linear::from_tensors(w, Some(vec![0.5]))?;
//! let x = Seq::new(&[3.0, 4.0], 1, 1, 2)?;
//! assert_eq!(lin.forward(x)?.data(), &[11.5]);
//! # Ok(())
//! # }
//! ```

pub mod attention;
pub mod embedding;
pub mod ffn;
pub mod linear;
pub mod mask;
pub mod norm;
pub mod seeds;
pub mod seq;

pub use attention::{AttentionCore, AttentionScratch};
pub use embedding::{Embedding, PositionalEncoding};
pub use ffn::FeedForward;
pub use linear::Linear;
pub use mask::{DenseMask, KeyPadding, Mask};
pub use norm::{LayerNorm, RmsNorm};
pub use seeds::{
    Attention, CrossAttention, MultiHeadAttention, MultiHeadAttentionWithProbs,
    MultiHeadCrossAttention, SelfAttention, TransformerAttention,
};
pub use seq::{Seq, SeqBuf};
