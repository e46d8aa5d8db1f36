//! The model architectures: [`decoder`] (decoder-only language models of the Llama, Qwen,
//! Mistral, Phi-3 and Gemma families),
//! [`seq2seq`] (seed 004's encoder–decoder Transformer) and [`bert`] (BERT encoders and
//! sentence embeddings).
pub mod bert;
pub mod decoder;
pub mod seq2seq;

/// A number no other model loaded by this process has. States and encoder memories record
/// their model's, so that a model refuses another's, even one of the same shape.
pub(crate) fn next_model_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
