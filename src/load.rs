//! [`Model`]: a language model loaded from disk, ready to be shared by many sessions.
//!
//! [`Model::load`] takes either
//!
//! - a GGUF file of one of the [decoder families](crate::models::decoder) (`general.architecture`
//!   `llama`, `qwen2`, `qwen3`, `phi3`, `gemma2` or `gemma3`), whose metadata gives the configuration and
//!   the tokenizer, or
//! - a Hugging Face directory with `config.json`, one or more `*.safetensors` files and
//!   `tokenizer.json`.
//!
//! A `Model` is immutable, `Send + Sync`, and meant to live in an [`Arc`](std::sync::Arc):
//! every [`Session`](crate::session::Session) holds one and owns its own KV cache.

use crate::error::{Error, Result};
use crate::models::decoder::config::in_file;
use crate::models::decoder::{Decoder, DecoderConfig};
use crate::tokenizer::Tokenizer;
use crate::weights::gguf::GgufFile;
use crate::weights::hf_dir::SafeTensorsDir;
use crate::weights::{FloatType, MatrixOptions, TensorSource};
use qkv_kernels::quant::act::ActPrecision;
use std::path::{Path, PathBuf};

/// How to load a model. Every choice that changes its numbers is here, per model: two
/// models in one process may differ.
///
/// ```
/// use qkv::kernels::quant::act::ActPrecision;
/// use qkv::load::ModelOptions;
/// let exact = ModelOptions {
///     act_precision: ActPrecision::try_from(16).unwrap(),
///     ..ModelOptions::default()
/// };
/// assert_eq!(exact.act_precision, ActPrecision::Wide);
/// ```
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// `None` (the default): every weight matrix runs as it is stored — f32, f16 or
    /// quantized blocks, mapped without a copy. `Some(dtype)`: matrices are widened (or
    /// rounded) to `dtype` at load, as `decode --dtype` asks; those already in it stay
    /// mapped.
    pub dtype: Option<FloatType>,
    /// The precision at which activations meet the interleaved quantized matrices (Q3_K,
    /// Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, IQ4_NL, IQ4_XS), on every path, alone or batched (`--act-bits`):
    /// [`ActPrecision::Wide`] (16 bits) is the exact mode, whose rounding is far below the
    /// weights' own; [`ActPrecision::Byte`] (8 bits) is faster where a matrix meets many
    /// rows (prompts, batched steps). Default:
    /// [`DEFAULT_ACT_PRECISION`](qkv_kernels::quant::x8::DEFAULT_ACT_PRECISION).
    pub act_precision: ActPrecision,
    /// Whether matrices are copied at load into the layout the products read fastest
    /// ([`MatrixOptions::interleave`]; default on; `QKV_NO_INTERLEAVE=1` turns it off for
    /// `decode` and `qkv-server`).
    pub interleave: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            dtype: None,
            act_precision: MatrixOptions::default().act_precision,
            interleave: MatrixOptions::default().interleave,
        }
    }
}

impl ModelOptions {
    /// How the loader prepares the matrices for the kernels.
    fn matrices(&self) -> MatrixOptions {
        MatrixOptions {
            act_precision: self.act_precision,
            interleave: self.interleave,
        }
    }
}

/// A loaded decoder-only language model and its tokenizer.
pub struct Model {
    decoder: Decoder,
    tokenizer: Option<Tokenizer>,
    path: PathBuf,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("decoder", &self.decoder)
            .field("tokenizer", &self.tokenizer.is_some())
            .finish()
    }
}

impl Model {
    /// Loads a GGUF file or a Hugging Face directory (see the module docs).
    ///
    /// Errors name the file at fault: [`Error::Io`] for an unreadable path, [`Error::Format`]
    /// for a malformed file, [`Error::TensorPastEnd`] for a tensor whose data runs past the end
    /// of its file, [`Error::AllocationRefused`] when weights widened at load (to `options.dtype`)
    /// or copied onto pages of their own do not fit in memory, [`Error::Unsupported`] for another
    /// architecture, and [`Error::InFile`] around [`Error::MissingTensor`],
    /// [`Error::TensorShape`], [`Error::UnsupportedDType`] or [`Error::Config`] for weights or
    /// hyper-parameters that do not fit.
    ///
    /// The weights are memory-mapped and read in place, so the files must not be truncated
    /// or rewritten in place while the model lives (see [`map_file`](crate::weights::map_file));
    /// replacing them by a rename is safe.
    pub fn load(path: &Path, options: &ModelOptions) -> Result<Model> {
        let meta = std::fs::metadata(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        if meta.is_dir() {
            Self::load_hf_dir(path, options)
        } else {
            Self::load_gguf(path, options)
        }
    }

    fn load_gguf(path: &Path, options: &ModelOptions) -> Result<Model> {
        let file = GgufFile::open(path)?;
        let config = DecoderConfig::from_gguf(&file)?;
        let decoder = Decoder::load(config, &file, options.dtype, &options.matrices())
            .map_err(|e| in_file(path, e))?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        Ok(Model {
            decoder,
            tokenizer: Some(tokenizer),
            path: path.to_owned(),
        })
    }

    fn load_hf_dir(dir: &Path, options: &ModelOptions) -> Result<Model> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(Error::Format {
                path: dir.to_owned(),
                msg: "a directory loads as a Hugging Face model, but it has no config.json \
                      (pass a GGUF file or a directory with config.json, *.safetensors and \
                      tokenizer.json)"
                    .into(),
            });
        }
        let text = std::fs::read_to_string(&config_path).map_err(|source| Error::Io {
            path: config_path.clone(),
            source,
        })?;
        let config = DecoderConfig::from_hf_json(&config_path)?;
        let source = SafeTensorsDir::open(dir)?;
        // An untied head must be in the files: never fall back to the embedding silently.
        let untied = serde_json::from_str::<serde_json::Value>(&text)
            .is_ok_and(|j| j["tie_word_embeddings"] == serde_json::Value::Bool(false));
        if untied && !source.contains("lm_head.weight") {
            return Err(in_file(
                dir,
                Error::MissingTensor {
                    name: "lm_head.weight (config.json sets tie_word_embeddings: false)".into(),
                },
            ));
        }
        let decoder = Decoder::load(config, &source, options.dtype, &options.matrices())
            .map_err(|e| in_file(dir, e))?;
        let tokenizer = Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json"))?;
        Ok(Model {
            decoder,
            tokenizer: Some(tokenizer),
            path: dir.to_owned(),
        })
    }

    /// A model from parts already built: for tests, benchmarks and embedders that make their
    /// own weights. Without a tokenizer, text generation is unavailable but token-level calls
    /// ([`Session::prefill`](crate::session::Session::prefill), `step`) work.
    pub fn from_parts(decoder: Decoder, tokenizer: Option<Tokenizer>) -> Model {
        Model {
            decoder,
            tokenizer,
            path: PathBuf::new(),
        }
    }

    /// The network.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// Its hyper-parameters.
    pub fn config(&self) -> &DecoderConfig {
        self.decoder.config()
    }

    /// The tokenizer, when the model has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The file or directory it was loaded from (empty for [`Model::from_parts`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Vocabulary size of the network (length of a logits vector).
    pub fn vocab_size(&self) -> usize {
        self.decoder.config().vocab
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn _assert_send_sync() {
        fn is<T: Send + Sync>() {}
        is::<Model>();
    }
}
