//! # qkv-cli
//!
//! The `decode` command line around the `qkv` library (generate text, tokenize, score
//! perplexity, embed, convert), and what only it needs beyond the library:
//!
//! - [`act_bits`]: `--act-bits`, the activations' precision for interleaved weights.
//!
//! The default model comes from the `qkv-fetch` crate; the HTTP server is the `qkv-server`
//! crate, which shares nothing with this one but the library and the fetch.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod act_bits;
