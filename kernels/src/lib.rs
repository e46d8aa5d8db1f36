//! # qkv-kernels
//!
//! The compute kernels of qkv: slices and shapes in, slices out. Nothing here knows what a
//! model is. Every SIMD kernel has a plain scalar reference beside it (`*_scalar`) that the
//! tests compare it with.
//!
//! - [`matmul`]: `y = x·Wᵀ (+ b)` with `W` in the PyTorch `nn.Linear` layout, stored f32,
//!   f16 or in a GGUF quantized format ([`quant`]); the gemm crate for many rows, our own
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
//! so they are written for AVX2+FMA+F16C behind a run-time check ([`simd::has_avx2_fma_f16c`])
//! with a scalar fallback on every other machine.

#![warn(missing_docs)]
// Every `unsafe` operation sits in its own block with a `// SAFETY:` comment saying why it is
// sound there, and every `unsafe fn` states its contract under `# Safety`.
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

pub mod activation;
pub mod attention;
pub mod convert;
pub mod error;
pub mod matmul;
pub mod norm;
pub mod position;
pub mod probe;
pub mod quant;
pub mod rope;
pub mod simd;

pub use attention::{attention, attention_with_probs, AttentionMask, KvData, KvView, QueryView};
pub use error::{KernelError, Result};
pub use half::f16;
pub use matmul::{linear, linear_many, Projection, Weights};
pub use norm::{layer_norm, rms_norm};
pub use quant::QuantFormat;
pub use rope::{RopeStyle, RopeTable};

/// Number of threads the kernels split work across (rayon's current pool).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// A raw pointer to an output that tasks on several threads write at once, each its own
/// disjoint elements (every user says which, where it writes).
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: the pointer is only dereferenced by tasks that write disjoint elements of a buffer
// that outlives them; no task reads what another writes.
unsafe impl Send for SharedOut {}
// SAFETY: as for `Send`: sharing the wrapper only shares the address, and every task that
// dereferences it writes its own disjoint elements.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer. Taking `self` makes closures capture the whole wrapper, not the raw field.
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// From this many elements on, the row-wise and elementwise kernels (norms, SwiGLU, residual
/// adds, RoPE) split their work across the pool; below it (a decode step's single rows) a
/// hand-off would cost more than it saves.
const PAR_MIN_ELEMS: usize = 1 << 16;

/// Units per parallel piece when a job of `units` units of `unit_len` elements is split
/// across the pool (about four pieces per thread), or `None` when it should stay on the
/// calling thread. Units are whole rows, so the pieces compute exactly what one pass would.
pub(crate) fn par_rows(units: usize, unit_len: usize) -> Option<usize> {
    let threads = rayon::current_num_threads();
    (threads > 1 && units > 1 && units.saturating_mul(unit_len) >= PAR_MIN_ELEMS)
        .then(|| units.div_ceil(4 * threads))
}

/// Elements per parallel piece of an elementwise job over `len` elements, or `None` to stay
/// serial: a multiple of 64, so every piece but the last is whole SIMD vectors and the
/// result is bitwise the one pass's.
pub(crate) fn par_elems(len: usize) -> Option<usize> {
    par_rows(len.div_ceil(64), 64).map(|runs| runs * 64)
}
