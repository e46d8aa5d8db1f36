//! # qkv-kernels
//!
//! The compute kernels of qkv: slices and shapes in, slices out. Nothing here knows what a
//! model is. Every SIMD kernel has a plain scalar reference beside it (`*_scalar`) that the
//! tests compare it with; the references (and `quant::testing`, the tests' random blocks)
//! are public only with the `testing` feature, which the tests and benches turn on.
//!
//! - [`matmul`]: `y = x·Wᵀ (+ b)` with `W` in the PyTorch `nn.Linear` layout, stored f32,
//!   f16, bf16 or in a GGUF quantized format ([`quant`]); the gemm crate for many rows, our own
//!   streaming GEMV for few rows.
//! - [`mod@attention`]: one streaming-softmax attention kernel with fused causal, padding and
//!   dense masks, for self-, cross- and causal attention, MHA/GQA/MQA, prefill and decode.
//! - [`norm`], [`activation`], [`rope`], [`position`], [`convert`]: the rest of a
//!   transformer layer.
//! - [`probe`]: the machine's read bandwidth and FMA peak, the ceilings the kernels are
//!   measured against.
//!
//! Run-time dispatch: the generic kernels go through [`pulp::Arch`]; the f16 and attention
//! micro-kernels need F16C and a vector `exp`, which pulp's portable trait does not offer,
//! so they are written for AVX2+FMA+F16C behind a run-time check ([`simd::isa`], detected once)
//! with a scalar fallback on every other machine.
//!
//! The crate reads one environment variable, a debugging override of that check:
//! `QKV_ISA=scalar` (every kernel on its scalar path), `avx2` (no AVX-512 code) or `avx512`
//! (512-bit code even where the CPU splits it); see [`simd`]. Everything else that changes
//! a result (the activations' precision, the weights' layout) is an argument of the call.
//!
//! ## Layers
//!
//! Modules import only downward, and never in a circle. From the bottom: `macros`,
//! `error`, [`simd`], `par` (splitting work across the pool), [`convert`], [`probe`],
//! [`quant`], [`matmul`], [`norm`], [`activation`], [`rope`], [`position`],
//! [`mod@attention`]; each uses only those before it. Inside a module, a child may use its
//! ancestors' items and a parent its children's, but the children of one module never
//! import each other in a cycle (the quantized kernels' shared frame is its own module,
//! `quant::frame`, below the GEMV and the GEMM that use it). This file only declares and
//! re-exports. `tests/layering.rs` at the workspace root checks all of this from the
//! sources.

#![warn(missing_docs)]
// Every `unsafe` operation sits in its own block with a `// SAFETY:` comment saying why it is
// sound there, and every `unsafe fn` states its contract under `# Safety`.
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

#[macro_use]
mod macros;

pub mod activation;
pub mod attention;
pub mod convert;
pub mod error;
pub mod matmul;
pub mod norm;
pub mod pages;
mod par;
pub mod position;
pub mod probe;
pub mod quant;
pub mod rope;
pub mod simd;

pub use attention::{
    attention, attention_many, attention_with_probs, AttentionCall, AttentionMask, KvData, KvView,
    QueryView,
};
pub use error::{KernelError, Result};
pub use half::{bf16, f16};
pub use matmul::{linear, linear_many, Projection, Weights};
pub use norm::{layer_norm, rms_norm};
pub use par::on_pool;
pub use quant::QuantFormat;
pub use rope::{RopeStyle, RopeTable};

/// Number of threads the kernels split work across (rayon's current pool).
pub fn threads() -> usize {
    rayon::current_num_threads()
}
