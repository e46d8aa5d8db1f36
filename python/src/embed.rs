//! [`Embedder`]: sentence embeddings of an encoder model (a sentence-transformers directory
//! such as all-MiniLM-L6-v2), made as `decode embed` makes them.

use crate::errors::{self, from_qkv};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;

/// A sentence encoder with its tokenizer and pooling.
#[pyclass(module = "qkv._native", frozen)]
pub struct Embedder {
    inner: qkv::models::bert::Embedder,
}

#[pymethods]
impl Embedder {
    /// Loads the sentence-transformers directory `path`; `batch_size` texts run per pass.
    #[new]
    #[pyo3(signature = (path, batch_size = 32))]
    fn new(py: Python<'_>, path: PathBuf, batch_size: usize) -> PyResult<Embedder> {
        let inner = py
            .allow_threads(|| qkv::models::bert::Embedder::load(&path)?.with_batch_size(batch_size))
            .map_err(|e| errors::err("ModelLoadError", e.to_string()))?;
        Ok(Embedder { inner })
    }

    /// Dimension of an embedding.
    #[getter]
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    /// The token ids the encoder sees for `text` (truncated to its longest sequence).
    fn tokenize(&self, text: &str) -> PyResult<Vec<u32>> {
        self.inner.token_ids(text).map_err(from_qkv)
    }

    /// The token ids of `text` before truncation.
    fn untruncated_ids(&self, text: &str) -> PyResult<Vec<u32>> {
        self.inner.untruncated_ids(text).map_err(from_qkv)
    }

    /// The bytes of `ids` as the tokenizer spells them.
    fn detokenize<'py>(&self, py: Python<'py>, ids: Vec<u32>) -> PyResult<Bound<'py, PyBytes>> {
        let text = self.inner.tokenizer().decode(&ids).map_err(from_qkv)?;
        Ok(PyBytes::new(py, text.as_bytes()))
    }

    /// The embeddings of `texts`, in order, as the little-endian f32 bytes of a
    /// `len(texts) × dim` row-major matrix (the GIL released while they are computed).
    fn embed<'py>(&self, py: Python<'py>, texts: Vec<String>) -> PyResult<Bound<'py, PyBytes>> {
        let rows = py
            .allow_threads(|| {
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                self.inner.embed(&refs)
            })
            .map_err(from_qkv)?;
        let mut bytes = Vec::with_capacity(rows.len() * self.inner.dim() * 4);
        for row in &rows {
            for x in row {
                bytes.extend_from_slice(&x.to_le_bytes());
            }
        }
        Ok(PyBytes::new(py, &bytes))
    }
}
