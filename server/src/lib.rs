//! # qkv-server
//!
//! qkv's HTTP server: the `qkv-server` binary (OpenAI's chat, completion, embedding and
//! Responses routes, llama-server's native routes and Anthropic's Messages, over one model
//! and the batch engine), and this library: the requests it is sent, read into typed
//! parameters or an error naming the field at fault, and what the engine needs from them
//! (grammars compiled with llguidance, the logit bias, tool calls parsed out of replies).
//! Reading a request needs no model, so any bytes can be fed to it (the server-request fuzz
//! target does).
//!
//! - [`error`]: the error every route answers with, in OpenAI's shape; [`body`]: a request's
//!   JSON body, read field by field, each error naming the field at fault;
//! - [`request`]: the completion routes' bodies read into typed parameters (sampling,
//!   messages, prompts, the tokenizer routes); [`embedding`]: the same for `/v1/embeddings`;
//! - [`structured`]: `response_format`, `json_schema` and `grammar` read into one
//!   constraint, which [`constraint`] compiles with llguidance for the engine; [`tools`]:
//!   tool definitions, `tool_choice`, the grammar of forced calls, and the calls parsed out
//!   of each model family's own format; [`tool_stream`]: a reply's reasoning, content and
//!   calls read while it streams; [`strict_calls`]: `strict` functions held to their schema
//!   under `tool_choice: "auto"` once a call starts;
//! - [`native_fields`]: llama-server's own request fields (`/completion`'s prompt forms,
//!   `n_predict`, `n_probs`, `logit_bias`, …) and the logit bias applied in the engine;
//! - [`speculative`]: the server's default speculation (`--spec`) and a request's
//!   (`speculative.n_max`, …);
//! - [`compat`]: Anthropic Messages and OpenAI Responses requests rewritten as chat
//!   bodies;
//! - [`token_text`]: a generated sequence's text, token by token, as it streams;
//! - [`chat_prompt`]: a chat request rendered through the chat template and encoded, with
//!   the constraint its output follows and how its reply is read back (what the server's
//!   chat routes and the Python package share);
//! - [`auth`]: the API keys, from the command line or a key file, checked in constant time.
//!
//! The default model (fetched when no `--model` is given) comes from the `qkv-fetch` crate.
//!
//! ## Layers
//!
//! Modules import only downward, and never in a circle. From the bottom: [`error`],
//! [`body`], [`auth`], [`native_fields`], [`speculative`], [`request`], [`embedding`],
//! [`structured`], [`tools`], [`tool_stream`], [`constraint`], [`strict_calls`], [`compat`],
//! [`token_text`], [`chat_prompt`]; each uses only those before it. This file only
//! declares. The binary's modules are layered the same way (its main.rs lists them), and no
//! two modules of the library and the binary share a name. `tests/layering.rs` at the
//! workspace root checks all of this from the sources.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod body;
pub mod chat_prompt;
pub mod compat;
pub mod constraint;
pub mod embedding;
pub mod error;
pub mod native_fields;
pub mod request;
pub mod speculative;
pub mod strict_calls;
pub mod structured;
pub mod token_text;
pub mod tool_stream;
pub mod tools;
