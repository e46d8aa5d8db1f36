//! The model architectures: [`decoder`] (decoder-only language models of the Llama, Qwen,
//! Mistral, Phi-3 and Gemma families),
//! [`seq2seq`] (seed 004's encoder–decoder Transformer) and [`bert`] (BERT encoders and
//! sentence embeddings).
pub mod bert;
pub mod decoder;
pub mod seq2seq;

use crate::error::{Error, Result};

/// A number no other model loaded by this process has. States and encoder memories record
/// their model's, so that a model refuses another's, even one of the same shape.
pub(crate) fn next_model_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `len` zeros for a large buffer (a KV cache, scratch, logits, widened weights), or
/// [`Error::AllocationRefused`] naming `what()` and the bytes asked for when the allocator
/// refuses, instead of the abort of `vec![0; len]`. The pages come zeroed from the OS as with
/// `vec!`, so a large cache costs memory only as positions fill.
pub(crate) fn zeroed<T: bytemuck::Zeroable>(
    len: usize,
    what: impl Fn() -> String,
) -> Result<Vec<T>> {
    bytemuck::allocation::try_zeroed_vec(len).map_err(|()| Error::AllocationRefused {
        what: what(),
        bytes: len.saturating_mul(std::mem::size_of::<T>()),
    })
}

/// As [`zeroed`], for `dims.iter().product()` elements; a product that overflows is refused
/// as well (with `bytes` saturated to `usize::MAX`).
pub(crate) fn zeroed_for<T: bytemuck::Zeroable>(
    dims: &[usize],
    what: impl Fn() -> String,
) -> Result<Vec<T>> {
    match dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) {
        Some(len) => zeroed(len, what),
        None => Err(Error::AllocationRefused {
            what: what(),
            bytes: usize::MAX,
        }),
    }
}
