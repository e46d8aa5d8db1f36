//! The model architectures: [`llama`] (decoder-only language models such as SmolLM2) and
//! [`seq2seq`] (seed 004's encoder–decoder Transformer).
pub mod llama;
pub mod seq2seq;

/// A number no other model loaded by this process has. States and encoder memories record
/// their model's, so that a model refuses another's, even one of the same shape.
pub(crate) fn next_model_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
