//! The model architectures: [`decoder`] (decoder-only language models of the Llama, Qwen,
//! Mistral, Phi-3 and Gemma families),
//! [`seq2seq`] (seed 004's encoder–decoder Transformer) and [`bert`] (BERT encoders and
//! sentence embeddings).
pub mod bert;
pub mod decoder;
pub mod seq2seq;

use crate::error::{Error, Result};
use half::f16;

/// A number no other model loaded by this process has. States and encoder memories record
/// their model's, so that a model refuses another's, even one of the same shape.
pub(crate) fn next_model_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Element types for which all-zero bits are a valid value (0).
///
/// # Safety
/// Implement only for types where every all-zero bit pattern is a valid value.
pub(crate) unsafe trait ZeroBits: Copy {}
// SAFETY: all-zero bits are +0.0 in both formats.
unsafe impl ZeroBits for f32 {}
unsafe impl ZeroBits for f16 {}

/// `len` zeros for a cache, or [`Error::Config`] naming `what()` when the allocator refuses,
/// instead of the abort of `vec![0; len]`. The pages come zeroed from the OS as with `vec!`,
/// so a large cache costs memory only as positions fill.
pub(crate) fn zeroed<T: ZeroBits>(len: usize, what: impl Fn() -> String) -> Result<Vec<T>> {
    let refused = || {
        Error::Config(format!(
            "{} needs {} bytes, more than this machine gives; ask for a shorter context",
            what(),
            len.saturating_mul(std::mem::size_of::<T>())
        ))
    };
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| refused())?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the layout has a non-zero size. If the allocation succeeds, the pointer holds
    // `len` elements of `T` with `T`'s alignment (the layout `Vec<T>` itself would use), all
    // zero bits, which `ZeroBits` makes valid zeros; capacity and length are both `len`.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<T>();
        if ptr.is_null() {
            return Err(refused());
        }
        Ok(Vec::from_raw_parts(ptr, len, len))
    }
}
