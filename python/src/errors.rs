//! qkv's errors raised as the exception classes of `qkv.errors` (pure Python, so that a class
//! may also derive from `ValueError` or `RuntimeError`): `QkvError` is the base of all;
//! `InvalidRequestError` (a `ValueError`) names bad input, `ContextLengthError` a prompt past
//! the context, `OverloadedError` (a `RuntimeError`, retryable) a full queue,
//! `ModelLoadError` a model that cannot be loaded, `EngineClosedError` an engine shut down.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use qkv_server::error::ApiError;

/// An exception of class `kind` of `qkv.errors` carrying `message` (a `RuntimeError` naming
/// the class when `qkv.errors` cannot be imported).
pub fn err(kind: &str, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::with_gil(|py| {
        let class = py
            .import("qkv.errors")
            .and_then(|m| m.getattr(kind))
            .and_then(|c| c.downcast_into::<PyType>().map_err(PyErr::from));
        match class {
            Ok(class) => PyErr::from_type(class, message),
            Err(_) => PyRuntimeError::new_err(format!("{kind}: {message}")),
        }
    })
}

/// An `InvalidRequestError` (a `ValueError`).
pub fn invalid(message: impl Into<String>) -> PyErr {
    err("InvalidRequestError", message)
}

/// The class an error of HTTP `status` (and OpenAI `code`) is raised as.
fn kind_of(status: u16, code: Option<&str>) -> &'static str {
    match (status, code) {
        (_, Some("context_length_exceeded")) => "ContextLengthError",
        (400 | 404 | 422, _) => "InvalidRequestError",
        (429 | 503, _) => "OverloadedError",
        _ => "QkvError",
    }
}

/// A request error of qkv-server's readers, the field at fault before its message.
pub fn from_api(e: ApiError) -> PyErr {
    let message = match &e.param {
        Some(p) => format!("{p}: {}", e.message),
        None => e.message.clone(),
    };
    err(kind_of(e.status.as_u16(), e.code), message)
}

/// A qkv error, classed as qkv-server answers it (a full queue is retryable, a prompt past
/// the context a `ContextLengthError`, bad input an `InvalidRequestError`).
pub fn from_qkv(e: qkv::Error) -> PyErr {
    let (kind, message) = classify(e);
    err(kind, message)
}

/// The exception class of `qkv.errors` a qkv error is raised as (see [`from_qkv`]), and its
/// message: what a thread without the GIL keeps to raise later.
pub fn classify(e: qkv::Error) -> (&'static str, String) {
    let message = e.to_string();
    let api = ApiError::from(e);
    (kind_of(api.status.as_u16(), api.code), message)
}
