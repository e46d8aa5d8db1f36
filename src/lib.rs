//! # qkv
//!
//! A SIMD-optimized CPU inference runtime for attention models. The compute kernels live in
//! the `qkv-kernels` crate (re-exported as [`kernels`]); this crate holds the rest, in layers
//! that import only downward, each depending only on those listed before it:
//!
//! - [`error`] and `alloc` (buffers whose allocation may be refused): the bottom, which
//!   every layer may use;
//! - [`weights`]: GGUF and safetensors files mapped into named tensor views that know how
//!   they are stored (f32, f16, or GGUF quantized blocks run in place);
//! - [`nn`]: Linear, norms, FFN, embeddings, masks and the attention modules of the seeds;
//! - [`tokenizer`]: SentencePiece BPE, byte-level BPE and WordPiece, and chat templates;
//! - [`models`]: one decoder for the Llama, Qwen, Mistral, Phi-3 and Gemma families
//!   ([`models::decoder`]), BERT encoders ([`models::bert`]) and the seed-004 seq2seq Transformer;
//! - [`sample`], the samplers;
//! - [`speculative`]: drafting for speculative decoding (n-gram lookup), the governor that
//!   judges whether it pays, and the speculative-sampling rule that keeps or replaces drafts;
//! - [`load`], [`session`]: a model loaded from disk with its tokenizer and shared by
//!   sessions, and per-conversation sessions with their KV caches;
//! - [`engine`]: continuous batching of many sequences over one model, one pass per step;
//! - [`perplexity`]: perplexity and KL divergence over a text, as `llama-perplexity` scores;
//! - `testing` (only with the `testing` feature, for the tests of qkv and qkv-cli): the
//!   synthetic model.
//!
//! Inside a layer, a child module may use its ancestors' items and a parent its children's,
//! but the children of one module never import each other in a cycle. `tests/layering.rs`
//! checks both rules from the sources, against the same list of layers.
//!
//! Every fallible call returns [`Result`] with an [`Error`] that names the file, tensor,
//! dimension or token at fault. [`session`] has a runnable example.

#![warn(missing_docs)]
// Only `weights::mmap`, which maps files, may use `unsafe` (it says so with an `allow`).
#![deny(unsafe_code)]

mod alloc;
pub mod engine;
pub mod error;
pub mod load;
pub mod models;
pub mod nn;
pub mod perplexity;
pub mod sample;
pub mod session;
pub mod speculative;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};
pub use qkv_kernels as kernels;

/// README's Rust examples, compiled as doctests so that they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
