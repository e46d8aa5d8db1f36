//! (being written)
pub mod llama;
pub mod seq2seq;
