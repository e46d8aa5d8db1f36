//! Reading the `tokenizer_config.json` beside a Hugging Face `tokenizer.json`: the special
//! tokens it names, `add_bos_token` / `add_eos_token`, and the chat template.

use crate::error::{Error, Result};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// `tokenizer_config.json` beside `tokenizer.json`: special token names, `add_bos_token` /
/// `add_eos_token` and the chat template. A missing file reads as an empty one.
pub(super) struct Config {
    path: std::path::PathBuf,
    json: Value,
}

/// The special tokens `tokenizer_config.json` names.
pub(super) struct Specials {
    pub(super) bos: Option<u32>,
    pub(super) eos: Option<u32>,
    pub(super) pad: Option<u32>,
    pub(super) sep: Option<u32>,
}

impl Config {
    pub(super) fn read(tokenizer_json: &Path) -> Result<Config> {
        let path = tokenizer_json.with_file_name("tokenizer_config.json");
        let json = if path.is_file() {
            read_json(&path)?
        } else {
            Value::Null
        };
        let config = Config { path, json };
        if !(config.json.is_null() || config.json.is_object()) {
            return Err(config.format("not a JSON object".into()));
        }
        Ok(config)
    }

    /// A format error naming this file.
    fn format(&self, msg: String) -> Error {
        Error::Format {
            path: self.path.clone(),
            msg,
        }
    }

    /// The id of the token `key` names, if it names one.
    fn token(&self, key: &str, index: &HashMap<&str, u32>) -> Result<Option<u32>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                let text = token_text(v)
                    .ok_or_else(|| self.format(format!("{key} is {v}, not a token's text")))?;
                index
                    .get(text)
                    .map(|&i| Some(i))
                    .ok_or_else(|| self.format(format!("{key} {text:?} is not in the vocabulary")))
            }
        }
    }

    /// BOS (else CLS), EOS, padding and separator.
    pub(super) fn specials(&self, index: &HashMap<&str, u32>) -> Result<Specials> {
        let bos = match self.token("bos_token", index)? {
            Some(b) => Some(b),
            None => self.token("cls_token", index)?,
        };
        Ok(Specials {
            bos,
            eos: self.token("eos_token", index)?,
            pad: self.token("pad_token", index)?,
            sep: self.token("sep_token", index)?,
        })
    }

    /// The chat template: a string, or the one named `default` of a list.
    pub(super) fn chat_template(&self) -> Option<String> {
        match self.json.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            _ => None,
        }
    }

    fn flag(&self, key: &str) -> Result<Option<bool>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.format(format!("{key} is {v}, not true or false"))),
        }
    }

    /// The tokens around the text: `add_bos_token` / `add_eos_token` replace what the
    /// post-processor put before / after it.
    pub(super) fn around(
        &self,
        specials: &Specials,
        prefix: &mut Vec<u32>,
        suffix: &mut Vec<u32>,
    ) -> Result<()> {
        let need = |key: &str, id: Option<u32>| {
            id.ok_or_else(|| self.format(format!("{key} is set but there is no such token")))
        };
        if let Some(add) = self.flag("add_bos_token")? {
            *prefix = if add {
                vec![need("add_bos_token", specials.bos)?]
            } else {
                Vec::new()
            };
        }
        if let Some(add) = self.flag("add_eos_token")? {
            *suffix = if add {
                vec![need("add_eos_token", specials.eos)?]
            } else {
                Vec::new()
            };
        }
        Ok(())
    }
}

/// A JSON file, or an error naming it.
pub(super) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Format {
        path: path.to_owned(),
        msg: format!("invalid JSON: {e}"),
    })
}

/// A token given as `"<s>"` or `{"content": "<s>", …}` in `tokenizer_config.json`.
fn token_text(v: &Value) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(Value::as_str))
}
