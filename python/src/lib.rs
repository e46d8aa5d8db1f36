//! # qkv-python
//!
//! The native half of the `qkv` Python package (`qkv._native`), built by maturin as one abi3
//! extension for every CPython ≥ 3.10. The Python half (`python/qkv/`) shapes what this
//! module returns into llama-cpp-python's and OpenAI's dicts; this half holds everything
//! that touches the model:
//!
//! - [`model::Model`]: a decoder loaded once (the default model when no path is given),
//!   its tokenizer, and requests read into [`model::Plan`]s by qkv-server's own readers
//!   (sampling fields, chat messages through the chat template, tools, `response_format`
//!   compiled into a token constraint);
//! - [`session::Session`]: one sequence generated token by token, as `decode` generates;
//! - [`engine::Engine`]: the batch engine on a thread of its own, many requests at once;
//! - [`embed::Embedder`]: sentence embeddings of an encoder model, as `decode embed` makes them.
//!
//! Every call that computes releases the GIL. Errors are raised as the exception classes of
//! `qkv.errors` (all under `qkv.QkvError`), carrying qkv's message.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod embed;
pub mod engine;
pub mod errors;
pub mod model;
pub mod session;

use pyo3::prelude::*;

/// Sets the number of compute threads (rayon's global pool), once per process. Asking again
/// for the count already in force is a no-op; asking for another one is a `ValueError`.
#[pyfunction]
#[pyo3(signature = (n))]
fn set_threads(n: usize) -> PyResult<usize> {
    const MAX_THREADS: usize = 1024;
    if !(1..=MAX_THREADS).contains(&n) {
        return Err(errors::invalid(format!(
            "n_threads {n}: must be between 1 and {MAX_THREADS}"
        )));
    }
    match rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
    {
        Ok(()) => Ok(n),
        Err(_) if rayon::current_num_threads() == n => Ok(n),
        Err(_) => Err(errors::invalid(format!(
            "n_threads {n}: this process already computes on {} threads (the count is set \
             once per process, by the first model loaded or qkv.set_threads)",
            rayon::current_num_threads()
        ))),
    }
}

/// The number of compute threads in force.
#[pyfunction]
fn threads() -> usize {
    rayon::current_num_threads()
}

/// The path of the default model (SmolLM2-135M-Instruct, Q4_1), fetched into the cache on
/// first use exactly as `decode` fetches it.
#[pyfunction]
fn default_model_path(py: Python<'_>) -> PyResult<String> {
    let path = py
        .allow_threads(qkv_fetch::default_model)
        .map_err(|e| errors::err("ModelLoadError", e.to_string()))?;
    Ok(path.to_string_lossy().into_owned())
}

/// For the package's tests: writes qkv's synthetic model (a 2-layer Llama with a 267-token
/// byte-level vocabulary and a ChatML template, random weights) stored as `storage` (`"f32"`,
/// `"f16"` or a block format such as `"q4_0"`) into this process's temporary directory, and
/// returns its path.
#[pyfunction]
#[pyo3(signature = (storage = "f32"))]
fn _synthetic_model(py: Python<'_>, storage: &str) -> PyResult<String> {
    use qkv::testing::synthetic::{model_file, Storage};
    let want = storage.to_ascii_uppercase();
    let found = Storage::all().into_iter().find(|s| {
        let name = match s {
            Storage::F32 => "F32".to_string(),
            Storage::F16 => "F16".to_string(),
            Storage::Quant(q) => q.name().to_ascii_uppercase(),
        };
        name == want
    });
    let Some(s) = found else {
        return Err(errors::invalid(format!(
            "storage {storage:?}: not one of f32, f16 or a block format qkv runs"
        )));
    };
    let path = py.allow_threads(|| model_file(s));
    Ok(path.to_string_lossy().into_owned())
}

/// The module `qkv._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_threads, m)?)?;
    m.add_function(wrap_pyfunction!(threads, m)?)?;
    m.add_function(wrap_pyfunction!(default_model_path, m)?)?;
    m.add_function(wrap_pyfunction!(_synthetic_model, m)?)?;
    m.add_class::<model::Model>()?;
    m.add_class::<model::Plan>()?;
    m.add_class::<model::ReplyParser>()?;
    m.add_class::<session::Session>()?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<embed::Embedder>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
