//! [`Model`]: a language model loaded from disk, ready to be shared by many sessions.
//!
//! [`Model::load`] takes either
//!
//! - a GGUF file (`general.architecture = llama`), whose metadata gives the configuration and
//!   the tokenizer, or
//! - a Hugging Face directory with `config.json`, one or more `*.safetensors` files and
//!   `tokenizer.json`.
//!
//! A `Model` is immutable, `Send + Sync`, and meant to live in an [`Arc`](std::sync::Arc):
//! every [`Session`](crate::session::Session) holds one and owns its own KV cache.

use crate::error::{Error, Result};
use crate::models::llama::{Llama, LlamaConfig, WeightLayout};
use crate::tokenizer::Tokenizer;
use crate::weights::gguf::GgufFile;
use crate::weights::safetensors::SafeTensorsFile;
use crate::weights::{FloatType, Tensor, TensorSource};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// How to load a model.
#[derive(Clone, Debug, Default)]
pub struct ModelOptions {
    /// `None` (the default): every weight matrix runs as it is stored — f32, f16 or
    /// quantized blocks, mapped without a copy. `Some(dtype)`: matrices are widened (or
    /// rounded) to `dtype` at load, as `decode --dtype` asks; those already in it stay
    /// mapped.
    pub dtype: Option<FloatType>,
}

/// A loaded decoder-only language model and its tokenizer.
pub struct Model {
    llama: Llama,
    tokenizer: Option<Tokenizer>,
    path: PathBuf,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("llama", &self.llama)
            .field("tokenizer", &self.tokenizer.is_some())
            .finish()
    }
}

impl Model {
    /// Loads a GGUF file or a Hugging Face directory (see the module docs).
    ///
    /// Errors name the file at fault: [`Error::Io`] for an unreadable path, [`Error::Format`]
    /// for a malformed file, [`Error::Unsupported`] for another architecture, and
    /// [`Error::InFile`] around [`Error::MissingTensor`], [`Error::TensorShape`],
    /// [`Error::UnsupportedDType`] or [`Error::Config`] for weights or hyper-parameters that
    /// do not fit.
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
        let arch = file.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(Error::Unsupported(format!(
                "{}: architecture `{arch}` (qkv runs `llama`)",
                path.display()
            )));
        }
        let config = gguf_config(&file)?;
        let llama = Llama::load(config, &file, options.dtype).map_err(|e| in_file(path, e))?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        Ok(Model {
            llama,
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
        let config = hf_config(&config_path, &text)?;
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
        let llama = Llama::load(config, &source, options.dtype).map_err(|e| in_file(dir, e))?;
        let tokenizer = Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json"))?;
        Ok(Model {
            llama,
            tokenizer: Some(tokenizer),
            path: dir.to_owned(),
        })
    }

    /// A model from parts already built: for tests, benchmarks and embedders that make their
    /// own weights. Without a tokenizer, text generation is unavailable but token-level calls
    /// ([`Session::prefill`](crate::session::Session::prefill), `step`) work.
    pub fn from_parts(llama: Llama, tokenizer: Option<Tokenizer>) -> Model {
        Model {
            llama,
            tokenizer,
            path: PathBuf::new(),
        }
    }

    /// The network.
    pub fn llama(&self) -> &Llama {
        &self.llama
    }

    /// Its hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        self.llama.config()
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
        self.llama.config().vocab
    }
}

/// Wraps the typed errors that do not carry a file name (tensor and configuration errors)
/// in [`Error::InFile`].
fn in_file(path: &Path, e: Error) -> Error {
    match e {
        Error::MissingTensor { .. }
        | Error::TensorShape { .. }
        | Error::UnsupportedDType { .. }
        | Error::Config(_) => Error::InFile {
            path: path.to_owned(),
            source: Box::new(e),
        },
        other => other,
    }
}

/// The Llama configuration from GGUF metadata (`llama.*` keys).
fn gguf_config(file: &GgufFile) -> Result<LlamaConfig> {
    let key = |k: &str| format!("llama.{k}");
    let u = |k: &str| -> Result<usize> { Ok(file.get_u32(&key(k))? as usize) };
    let dim = u("embedding_length")?;
    let heads = u("attention.head_count")?;
    let kv_heads = match file.metadata(&key("attention.head_count_kv")) {
        Some(_) => u("attention.head_count_kv")?,
        None => heads,
    };
    let head_dim = dim.checked_div(heads).unwrap_or(0);
    if let Some(v) = file.metadata(&key("rope.dimension_count")) {
        if v.as_u32().map(|n| n as usize) != Some(head_dim) {
            return Err(Error::Unsupported(format!(
                "{}: partial rotary embedding (rope.dimension_count {v:?}, head dim {head_dim})",
                file.path().display()
            )));
        }
    }
    let vocab = match file.metadata(&key("vocab_size")) {
        Some(_) => u("vocab_size")?,
        None => file.get_array("tokenizer.ggml.tokens")?.len(),
    };
    let rope_base = match file.metadata(&key("rope.freq_base")) {
        Some(_) => file.get_f32(&key("rope.freq_base"))?,
        None => 10000.0,
    };
    let config = LlamaConfig {
        dim,
        layers: u("block_count")?,
        heads,
        kv_heads,
        head_dim,
        ffn_dim: u("feed_forward_length")?,
        vocab,
        context: u("context_length")?,
        rope_base,
        rms_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        layout: WeightLayout::Gguf,
    };
    config.validate().map_err(|e| in_file(file.path(), e))?;
    Ok(config)
}

/// The Llama configuration from a Hugging Face `config.json`.
fn hf_config(path: &Path, text: &str) -> Result<LlamaConfig> {
    let bad = |msg: String| Error::Format {
        path: path.to_owned(),
        msg,
    };
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let model_type = json["model_type"].as_str().unwrap_or("");
    if model_type != "llama" && model_type != "mistral" {
        return Err(Error::Unsupported(format!(
            "{}: model_type `{model_type}` (qkv runs `llama`)",
            path.display()
        )));
    }
    let uint = |k: &str| -> Result<usize> {
        json[k]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| bad(format!("`{k}` is missing or not an integer")))
    };
    let float = |k: &str, default: f64| -> Result<f32> {
        match &json[k] {
            serde_json::Value::Null => Ok(default as f32),
            v => v
                .as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| bad(format!("`{k}` is not a number"))),
        }
    };
    // What qkv's Llama computes: SwiGLU with SiLU, no biases. Anything else is refused
    // rather than run wrong.
    if let Some(act) = json.get("hidden_act").filter(|v| !v.is_null()) {
        if act.as_str() != Some("silu") {
            return Err(Error::Unsupported(format!(
                "{}: hidden_act {act} (qkv's Llama uses silu)",
                path.display()
            )));
        }
    }
    for flag in ["attention_bias", "mlp_bias"] {
        if json[flag].as_bool() == Some(true) {
            return Err(Error::Unsupported(format!(
                "{}: `{flag}: true` (qkv's Llama has no bias terms)",
                path.display()
            )));
        }
    }
    // transformers < 5 writes `rope_theta` and `rope_scaling`; 5 nests both in
    // `rope_parameters` (`rope_theta`, `rope_type`). Only plain RoPE is implemented.
    let rope = &json["rope_parameters"];
    let rope_type = rope["rope_type"].as_str().unwrap_or("default");
    if !json["rope_scaling"].is_null() || rope_type != "default" {
        return Err(Error::Unsupported(format!(
            "{}: RoPE scaling (rope_scaling {}, rope_type `{rope_type}`)",
            path.display(),
            json["rope_scaling"]
        )));
    }
    let rope_base = match rope["rope_theta"].as_f64() {
        Some(theta) => theta as f32,
        None => float("rope_theta", 10000.0)?,
    };
    let dim = uint("hidden_size")?;
    let heads = uint("num_attention_heads")?;
    let kv_heads = if json["num_key_value_heads"].is_null() {
        heads
    } else {
        uint("num_key_value_heads")?
    };
    let head_dim = if json["head_dim"].is_null() {
        dim.checked_div(heads).unwrap_or(0)
    } else {
        uint("head_dim")?
    };
    let config = LlamaConfig {
        dim,
        layers: uint("num_hidden_layers")?,
        heads,
        kv_heads,
        head_dim,
        ffn_dim: uint("intermediate_size")?,
        vocab: uint("vocab_size")?,
        context: uint("max_position_embeddings")?,
        rope_base,
        rms_eps: float("rms_norm_eps", 1e-6)?,
        layout: WeightLayout::HuggingFace,
    };
    config.validate().map_err(|e| in_file(path, e))?;
    Ok(config)
}

/// All `*.safetensors` files of a directory as one tensor source.
struct SafeTensorsDir {
    files: Vec<SafeTensorsFile>,
    /// Tensor name → index into `files`.
    index: HashMap<String, usize>,
}

impl SafeTensorsDir {
    fn open(dir: &Path) -> Result<SafeTensorsDir> {
        let io = |source| Error::Io {
            path: dir.to_owned(),
            source,
        };
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(Error::Format {
                path: dir.to_owned(),
                msg: "no *.safetensors file in the directory".into(),
            });
        }
        let mut files = Vec::with_capacity(paths.len());
        let mut index = HashMap::new();
        for p in paths {
            let f = SafeTensorsFile::open(&p)?;
            for name in f.names() {
                index.insert(name, files.len());
            }
            files.push(f);
        }
        Ok(SafeTensorsDir { files, index })
    }
}

impl TensorSource for SafeTensorsDir {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        match self.index.get(name) {
            Some(&i) => self.files[i].tensor(name),
            None => Err(Error::MissingTensor {
                name: name.to_owned(),
            }),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        self.files.iter().flat_map(|f| f.names()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn _assert_send_sync() {
        fn is<T: Send + Sync>() {}
        is::<Model>();
    }

    #[test]
    fn hf_config_reads_smollm_style_json() {
        let text = r#"{"model_type":"llama","hidden_size":576,"num_hidden_layers":30,
            "num_attention_heads":9,"num_key_value_heads":3,"intermediate_size":1536,
            "vocab_size":49152,"max_position_embeddings":8192,"rope_theta":100000.0,
            "rms_norm_eps":1e-5,"tie_word_embeddings":true}"#;
        let c = hf_config(Path::new("config.json"), text).unwrap();
        assert_eq!((c.dim, c.heads, c.kv_heads, c.head_dim), (576, 9, 3, 64));
        assert_eq!(c.layout, WeightLayout::HuggingFace);
        assert_eq!(c.rope_base, 100000.0);
        // transformers 5 nests the RoPE parameters.
        let v5 = text.replace(
            r#""rope_theta":100000.0"#,
            r#""rope_parameters":{"rope_theta":50000.0,"rope_type":"default"}"#,
        );
        assert_eq!(
            hf_config(Path::new("c.json"), &v5).unwrap().rope_base,
            50000.0
        );
        let scaled = text.replace(
            r#""rope_theta":100000.0"#,
            r#""rope_parameters":{"rope_theta":50000.0,"rope_type":"llama3"}"#,
        );
        let e = hf_config(Path::new("c.json"), &scaled).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
        // Activations and biases qkv does not compute are refused, not run wrong.
        for (from, to) in [
            ("}", r#","hidden_act":"gelu"}"#),
            ("}", r#","attention_bias":true}"#),
            ("}", r#","mlp_bias":true}"#),
        ] {
            let e = hf_config(Path::new("c.json"), &text.replacen(from, to, 1)).unwrap_err();
            assert!(matches!(e, Error::Unsupported(_)), "{e}");
        }
        let ok = text.replacen('}', r#","hidden_act":"silu","attention_bias":false}"#, 1);
        assert!(hf_config(Path::new("c.json"), &ok).is_ok());
    }

    #[test]
    fn hf_config_rejects_other_architectures_and_bad_json() {
        let e = hf_config(Path::new("c.json"), r#"{"model_type":"bert"}"#).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
        let e = hf_config(Path::new("c.json"), "{").unwrap_err();
        assert!(e.to_string().contains("c.json"), "{e}");
        let e = hf_config(Path::new("c.json"), r#"{"model_type":"llama"}"#).unwrap_err();
        assert!(e.to_string().contains("hidden_size"), "{e}");
    }
}
