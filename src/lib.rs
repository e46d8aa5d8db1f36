//! # qkv
//!
//! A SIMD-optimized CPU inference runtime for attention models. The compute kernels live in
//! the `qkv-kernels` crate (re-exported as [`kernels`]); this crate holds the weights loaders,
//! the neural-network modules, the models and the session API.

#![warn(missing_docs)]

pub mod error;
pub mod fetch;
pub mod weights;

pub use error::{Error, Result};
pub use qkv_kernels as kernels;
pub mod model;
pub mod models;
pub mod nn;
pub mod sample;
pub mod session;
pub mod tokenizer;
