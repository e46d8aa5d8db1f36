//! The JSON files of a BERT sentence-transformers directory, read into checked configurations:
//! `config.json` ([`BertConfig`]), `modules.json`, `sentence_bert_config.json` and the pooling
//! module's `config.json` ([`SentenceConfig`]).
//!
//! What qkv cannot run exactly is refused with [`Error::Unsupported`] naming the file, the key
//! and its value; a key of the wrong type or a missing required key is [`Error::Format`]; sizes
//! that do not fit together are [`Error::Config`] inside [`Error::InFile`].

use super::pooling::{Pooling, PoolingMode};
use crate::error::{Error, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A parsed JSON file that remembers where it came from, for errors that name it.
pub(crate) struct JsonFile {
    path: PathBuf,
    value: Value,
}

impl JsonFile {
    /// Reads and parses `path`. [`Error::Io`] when it cannot be read, [`Error::Format`] when
    /// it is not JSON.
    pub(crate) fn open(path: &Path) -> Result<JsonFile> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        let value = serde_json::from_str(&text).map_err(|e| Error::Format {
            path: path.to_owned(),
            msg: format!("not valid JSON: {e}"),
        })?;
        Ok(JsonFile {
            path: path.to_owned(),
            value,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn value(&self) -> &Value {
        &self.value
    }

    /// [`Error::Format`] about this file.
    pub(crate) fn format_error(&self, msg: String) -> Error {
        Error::Format {
            path: self.path.clone(),
            msg,
        }
    }

    /// [`Error::Unsupported`]: `file: key = value (why)`.
    pub(crate) fn unsupported(&self, key: &str, value: &Value, why: &str) -> Error {
        Error::Unsupported(format!(
            "{}: `{key}` = {value} ({why})",
            self.path.display()
        ))
    }

    /// The value of `key`, `None` when absent or `null`.
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.value.get(key).filter(|v| !v.is_null())
    }

    /// A non-negative integer `key`, `None` when absent.
    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        self.format_error(format!("`{key}` = {v} is not a non-negative integer"))
                    })
            })
            .transpose()
    }

    /// A required non-negative integer `key`.
    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.format_error(format!("`{key}` is missing")))
    }

    /// A number `key`, or `default` when absent.
    pub(crate) fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| self.format_error(format!("`{key}` = {v} is not a number"))),
        }
    }

    /// A boolean `key`, or `default` when absent.
    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.format_error(format!("`{key}` = {v} is not a boolean"))),
        }
    }

    /// A string `key`, `None` when absent.
    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.format_error(format!("`{key}` = {v} is not a string")))
            })
            .transpose()
    }

    /// Unless `key` is absent or one of `allowed`, [`Error::Unsupported`] naming it.
    fn expect_str(&self, key: &str, allowed: &[&str], why: &str) -> Result<()> {
        match self.opt_str(key)? {
            Some(s) if !allowed.contains(&s) => Err(self.unsupported(key, &self.value[key], why)),
            _ => Ok(()),
        }
    }
}

/// The hyper-parameters of a BERT encoder (Hugging Face `BertModel`'s `config.json`).
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Word-piece vocabulary (`vocab_size`).
    pub vocab_size: usize,
    /// Hidden size (`hidden_size`).
    pub hidden_size: usize,
    /// Encoder layers (`num_hidden_layers`).
    pub layers: usize,
    /// Attention heads (`num_attention_heads`); they divide `hidden_size`.
    pub heads: usize,
    /// Feed-forward inner size (`intermediate_size`).
    pub intermediate_size: usize,
    /// Learned positions (`max_position_embeddings`): the longest input.
    pub max_positions: usize,
    /// Segment types (`type_vocab_size`); qkv feeds segment 0, as for a single text.
    pub type_vocab_size: usize,
    /// LayerNorm epsilon (`layer_norm_eps`, default 1e-12).
    pub layer_norm_eps: f32,
}

impl BertConfig {
    /// [`Error::Config`] when a size is zero, `heads` does not divide `hidden_size`, or the
    /// epsilon is not finite and positive.
    pub fn validate(&self) -> Result<()> {
        for (key, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.layers),
            ("num_attention_heads", self.heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_positions),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if v == 0 {
                return Err(Error::Config(format!("bert: `{key}` = 0")));
            }
        }
        if !self.hidden_size.is_multiple_of(self.heads) {
            return Err(Error::Config(format!(
                "bert: `hidden_size` = {} is not divisible by `num_attention_heads` = {}",
                self.hidden_size, self.heads
            )));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return Err(Error::Config(format!(
                "bert: `layer_norm_eps` = {} is not a positive number",
                self.layer_norm_eps
            )));
        }
        Ok(())
    }

    /// Reads `config.json`. Refused with [`Error::Unsupported`] naming the key and value:
    /// a `model_type` other than `bert`, a `hidden_act` other than `gelu` (exact, erf-based),
    /// a `position_embedding_type` other than `absolute`, `is_decoder` or
    /// `add_cross_attention`. Errors: [`Error::Io`], [`Error::Format`] for a missing or
    /// mistyped key, [`Error::InFile`] around [`Error::Config`] for inconsistent sizes.
    pub fn from_json_file(path: &Path) -> Result<BertConfig> {
        let json = JsonFile::open(path)?;
        json.expect_str("model_type", &["bert"], "qkv's encoder runs `bert`")?;
        json.expect_str(
            "hidden_act",
            &["gelu"],
            "qkv's BERT runs the exact erf GELU, `gelu`",
        )?;
        json.expect_str(
            "position_embedding_type",
            &["absolute"],
            "qkv's BERT runs learned absolute positions",
        )?;
        for flag in ["is_decoder", "add_cross_attention"] {
            if json.bool_or(flag, false)? {
                return Err(json.unsupported(flag, &Value::Bool(true), "qkv's BERT is an encoder"));
            }
        }
        let eps = json.f64_or("layer_norm_eps", 1e-12)?;
        let cfg = BertConfig {
            vocab_size: json.usize("vocab_size")?,
            hidden_size: json.usize("hidden_size")?,
            layers: json.usize("num_hidden_layers")?,
            heads: json.usize("num_attention_heads")?,
            intermediate_size: json.usize("intermediate_size")?,
            max_positions: json.usize("max_position_embeddings")?,
            type_vocab_size: json.opt_usize("type_vocab_size")?.unwrap_or(2),
            layer_norm_eps: eps as f32,
        };
        cfg.validate().map_err(|e| Error::InFile {
            path: path.to_owned(),
            source: Box::new(e),
        })?;
        Ok(cfg)
    }
}

/// What sentence-transformers does around the encoder: from `modules.json`, the Transformer
/// module's `sentence_bert_config.json` and the Pooling module's `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct SentenceConfig {
    /// The Transformer module's directory (holding `config.json`, `model.safetensors`,
    /// `tokenizer.json`): the model directory itself for `"path": ""`.
    pub transformer_dir: PathBuf,
    /// Longest input in tokens, special tokens included; longer texts are truncated.
    pub max_seq_length: usize,
    /// Lower-case texts before tokenizing (`do_lower_case`).
    pub lower_case: bool,
    /// How token vectors become one vector.
    pub pooling: Pooling,
    /// Scale each embedding to unit L2 norm (a `Normalize` module follows the pooling).
    pub normalize: bool,
}

/// The module kinds of `modules.json` that qkv runs, by the class name at the end of `type`
/// (`sentence_transformers.models.Pooling`, or the longer paths of newer releases).
fn module_kind(ty: &str) -> Option<&str> {
    let name = ty
        .strip_prefix("sentence_transformers.")?
        .rsplit('.')
        .next()?;
    ["Transformer", "Pooling", "Normalize"]
        .into_iter()
        .find(|&k| k == name)
}

impl SentenceConfig {
    /// Reads `dir/modules.json`, which must list a `Transformer`, then a `Pooling`, then
    /// optionally a `Normalize` module, nothing else; then the Transformer's
    /// `sentence_bert_config.json` (`max_seq_length`, `do_lower_case`) and the Pooling
    /// module's `config.json`; also the encoder's own `config.json` ([`BertConfig`]),
    /// returned beside: the pooling dimension must equal its hidden size, and `max_seq_length` (when absent: the smaller of
    /// `max_position_embeddings` and `tokenizer_config.json`'s `model_max_length`, as
    /// sentence-transformers does) must fit its positions.
    ///
    /// Errors: [`Error::Io`] for a missing file, [`Error::Format`] for malformed JSON or keys,
    /// [`Error::Unsupported`] naming the file, key and value of anything else (another module
    /// type, a pooling mode qkv does not run), [`Error::InFile`] around [`Error::Config`] for
    /// sizes that disagree.
    pub fn from_dir(dir: &Path) -> Result<(SentenceConfig, BertConfig)> {
        let modules = JsonFile::open(&dir.join("modules.json"))?;
        let list = modules
            .value()
            .as_array()
            .ok_or_else(|| modules.format_error("expected a list of modules".into()))?;
        let mut kinds = Vec::with_capacity(list.len());
        for (i, m) in list.iter().enumerate() {
            let ty = m["type"]
                .as_str()
                .ok_or_else(|| modules.format_error(format!("module {i} has no string `type`")))?;
            let kind = module_kind(ty).ok_or_else(|| {
                modules.unsupported(
                    &format!("[{i}].type"),
                    &m["type"],
                    "qkv runs Transformer, Pooling and Normalize modules",
                )
            })?;
            let path = m["path"].as_str().unwrap_or("");
            kinds.push((kind, dir.join(path)));
        }
        let order: Vec<&str> = kinds.iter().map(|(k, _)| *k).collect();
        if !matches!(
            order.as_slice(),
            ["Transformer", "Pooling"] | ["Transformer", "Pooling", "Normalize"]
        ) {
            return Err(Error::Unsupported(format!(
                "{}: modules {order:?} (qkv runs Transformer, Pooling and an optional Normalize, in that order)",
                modules.path().display()
            )));
        }
        let transformer_dir = kinds[0].1.clone();
        let bert = BertConfig::from_json_file(&transformer_dir.join("config.json"))?;

        let st = JsonFile::open(&transformer_dir.join("sentence_bert_config.json"))?;
        let in_st = |e: Error| Error::InFile {
            path: st.path().to_owned(),
            source: Box::new(e),
        };
        let max_seq_length = match st.opt_usize("max_seq_length")? {
            Some(n) => n,
            None => {
                let tc = JsonFile::open(&transformer_dir.join("tokenizer_config.json"))?;
                match tc.get("model_max_length").and_then(Value::as_f64) {
                    // Huge placeholders (1e30) mean "no limit": the positions decide.
                    Some(m) if m >= 1.0 => {
                        bert.max_positions.min(m.min(usize::MAX as f64) as usize)
                    }
                    _ => bert.max_positions,
                }
            }
        };
        if max_seq_length < 2 || max_seq_length > bert.max_positions {
            return Err(in_st(Error::Config(format!(
                "`max_seq_length` = {max_seq_length} is outside 2..={} (`max_position_embeddings`)",
                bert.max_positions
            ))));
        }
        let lower_case = st.bool_or("do_lower_case", false)?;

        let pool = JsonFile::open(&kinds[1].1.join("config.json"))?;
        let pooling = pooling_from_json(&pool)?;
        if pooling.dim() != bert.hidden_size {
            return Err(Error::InFile {
                path: pool.path().to_owned(),
                source: Box::new(Error::Config(format!(
                    "the pooling dimension {} is not the encoder's `hidden_size` = {}",
                    pooling.dim(),
                    bert.hidden_size
                ))),
            });
        }
        Ok((
            SentenceConfig {
                transformer_dir,
                max_seq_length,
                lower_case,
                pooling,
                normalize: kinds.len() == 3,
            },
            bert,
        ))
    }
}

/// sentence-transformers' legacy boolean keys, in the order it concatenates their outputs.
const LEGACY_MODES: [(&str, &str); 6] = [
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
];

/// The Pooling module's `config.json`, in either of sentence-transformers' layouts: the
/// legacy `word_embedding_dimension` with one boolean `pooling_mode_*` key per mode, or
/// `embedding_dimension` with `pooling_mode` (a name or a list of names).
fn pooling_from_json(json: &JsonFile) -> Result<Pooling> {
    let dim = match json.opt_usize("embedding_dimension")? {
        Some(d) => d,
        None => json.usize("word_embedding_dimension")?,
    };
    // (the key a mode was read from, the key's value, the mode's name)
    let mut names: Vec<(String, Value, Option<&str>)> = Vec::new();
    match json.get("pooling_mode") {
        Some(v @ Value::String(s)) => names.push(("pooling_mode".into(), v.clone(), Some(s))),
        Some(Value::Array(list)) => {
            for (i, v) in list.iter().enumerate() {
                names.push((format!("pooling_mode[{i}]"), v.clone(), v.as_str()));
            }
        }
        Some(v) => {
            return Err(json.format_error(format!(
                "`pooling_mode` = {v} is neither a name nor a list of names"
            )))
        }
        None => {
            for (key, mode) in LEGACY_MODES {
                if json.bool_or(key, false)? {
                    names.push((key.to_owned(), Value::Bool(true), Some(mode)));
                }
            }
        }
    }
    if names.is_empty() {
        return Err(json.format_error("no pooling mode is set".into()));
    }
    let mut modes = Vec::with_capacity(names.len());
    for (key, value, name) in &names {
        let mode = name.and_then(PoolingMode::from_name).ok_or_else(|| {
            json.unsupported(
                key,
                value,
                "qkv pools with `cls`, `max`, `mean` and `mean_sqrt_len_tokens`",
            )
        })?;
        modes.push(mode);
    }
    Pooling::new(modes, dim).map_err(|e| Error::InFile {
        path: json.path().to_owned(),
        source: Box::new(e),
    })
}
