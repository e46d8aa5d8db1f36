//! (being written)
pub mod seq2seq;
