//! Reading a Hugging Face `tokenizer.json` (and the `tokenizer_config.json` beside it) into
//! the parts of a byte-level BPE [`Tokenizer`](super::Tokenizer).

use super::Parts;
use crate::error::{Error, Result};
use serde_json::Value;
use std::path::Path;

fn read_json(path: &Path) -> Result<Value> {
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

/// Checks the pre-tokenizer is `ByteLevel` (no prefix space, with its regex), optionally
/// after `Digits(individual_digits)`; returns whether digits are split.
fn pre_tokenizer(v: &Value, fail: &dyn Fn(String) -> Error) -> Result<bool> {
    let steps: Vec<&Value> = match v.get("type").and_then(Value::as_str) {
        Some("Sequence") => v
            .get("pretokenizers")
            .and_then(Value::as_array)
            .ok_or_else(|| fail("pre_tokenizer Sequence without `pretokenizers`".into()))?
            .iter()
            .collect(),
        Some(_) => vec![v],
        None => {
            return Err(fail(
                "the tokenizer has no pre_tokenizer (not byte-level BPE)".into(),
            ))
        }
    };
    let mut split_digits = false;
    let mut byte_level = false;
    for step in steps {
        match step.get("type").and_then(Value::as_str) {
            Some("Digits") if !byte_level => {
                if step.get("individual_digits").and_then(Value::as_bool) != Some(true) {
                    return Err(Error::Unsupported(
                        "pre-tokenizer Digits without individual_digits".into(),
                    ));
                }
                split_digits = true;
            }
            Some("ByteLevel") if !byte_level => {
                if step.get("add_prefix_space").and_then(Value::as_bool) == Some(true) {
                    return Err(Error::Unsupported(
                        "ByteLevel pre-tokenizer with add_prefix_space".into(),
                    ));
                }
                if step.get("use_regex").and_then(Value::as_bool) == Some(false) {
                    return Err(Error::Unsupported(
                        "ByteLevel pre-tokenizer without its regex".into(),
                    ));
                }
                byte_level = true;
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "pre-tokenizer step {} (qkv supports [Digits(individual_digits)], ByteLevel)",
                    other.unwrap_or("without a type")
                )))
            }
        }
    }
    if !byte_level {
        return Err(fail("the pre-tokenizer has no ByteLevel step".into()));
    }
    Ok(split_digits)
}

pub(super) fn load(path: &Path) -> Result<Parts> {
    let fail = |msg: String| Error::Format {
        path: path.to_owned(),
        msg,
    };
    let json = read_json(path)?;
    let model = json.get("model").ok_or_else(|| fail("no `model`".into()))?;
    match model.get("type").and_then(Value::as_str) {
        Some("BPE") | None if model.get("merges").is_some() => {}
        other => {
            return Err(Error::Unsupported(format!(
                "{}: tokenizer model {} (qkv supports byte-level BPE)",
                path.display(),
                other.unwrap_or("?")
            )))
        }
    }
    if !json.get("normalizer").is_none_or(Value::is_null) {
        return Err(Error::Unsupported(format!(
            "{}: tokenizers with a normalizer",
            path.display()
        )));
    }
    let split_digits = pre_tokenizer(json.get("pre_tokenizer").unwrap_or(&Value::Null), &fail)?;

    // Vocabulary: model.vocab, then added tokens (which may extend it).
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| fail("model.vocab is not an object".into()))?;
    let mut entries: Vec<(usize, String, bool)> = Vec::with_capacity(vocab.len() + 32);
    for (tok, id) in vocab {
        let id = id
            .as_u64()
            .filter(|&i| i < u32::MAX as u64)
            .ok_or_else(|| fail(format!("model.vocab[{tok:?}] is not a token id")))?;
        entries.push((id as usize, tok.clone(), false));
    }
    if model.get("ignore_merges").and_then(Value::as_bool) == Some(true) {
        return Err(Error::Unsupported(format!(
            "{}: BPE with ignore_merges",
            path.display()
        )));
    }
    let added = match json.get("added_tokens") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(list)) => &list[..],
        Some(other) => return Err(fail(format!("added_tokens is {other}, not a list"))),
    };
    for a in added {
        let id = a.get("id").and_then(Value::as_u64);
        let content = a.get("content").and_then(Value::as_str);
        let (Some(id), Some(content)) = (id, content) else {
            return Err(fail(format!("added token {a} lacks an id or content")));
        };
        // These change how the text around the token is split; qkv matches added tokens
        // exactly, so a file that asks for them is refused rather than misread.
        for flag in ["lstrip", "rstrip", "single_word"] {
            if a.get(flag).and_then(Value::as_bool) == Some(true) {
                return Err(Error::Unsupported(format!(
                    "{}: added token {content:?} with {flag}",
                    path.display()
                )));
            }
        }
        if id >= u32::MAX as u64 {
            return Err(fail(format!("added token {content:?} has id {id}")));
        }
        entries.push((id as usize, content.to_owned(), true));
    }
    let n = entries.iter().map(|e| e.0 + 1).max().unwrap_or(0);
    if n > entries.len() {
        return Err(fail(format!(
            "token ids run to {} but only {} tokens are defined",
            n - 1,
            entries.len()
        )));
    }
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut special = vec![false; n];
    for (id, tok, added) in entries {
        match &tokens[id] {
            Some(existing) if *existing != tok => {
                return Err(fail(format!(
                    "token id {id} is both {existing:?} and {tok:?}"
                )))
            }
            _ => tokens[id] = Some(tok),
        }
        special[id] |= added;
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| fail(format!("no token has id {i}"))))
        .collect::<Result<_>>()?;

    let mut merges = Vec::new();
    for (i, m) in model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| fail("model.merges is not an array".into()))?
        .iter()
        .enumerate()
    {
        let pair = match m {
            Value::String(s) => s.split_once(' ').map(|(a, b)| (a.to_owned(), b.to_owned())),
            Value::Array(v) if v.len() == 2 => match (v[0].as_str(), v[1].as_str()) {
                (Some(a), Some(b)) => Some((a.to_owned(), b.to_owned())),
                _ => None,
            },
            _ => None,
        };
        merges.push(pair.ok_or_else(|| fail(format!("model.merges[{i}] = {m} is not a pair")))?);
    }

    // tokenizer_config.json beside it: special token names, add_bos, the chat template.
    let config_path = path.with_file_name("tokenizer_config.json");
    let config = if config_path.is_file() {
        read_json(&config_path)?
    } else {
        Value::Null
    };
    let config_fail = |msg: String| Error::Format {
        path: config_path.clone(),
        msg,
    };
    if !(config.is_null() || config.is_object()) {
        return Err(config_fail("not a JSON object".into()));
    }
    let find = |key: &str| -> Result<Option<u32>> {
        let text = match config.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                token_text(v)
                    .ok_or_else(|| config_fail(format!("{key} is {v}, not a token's text")))?,
            ),
        };
        match text {
            None => Ok(None),
            Some(text) => tokens
                .iter()
                .position(|t| t == text)
                .map(|i| Some(i as u32))
                .ok_or_else(|| Error::Format {
                    path: config_path.clone(),
                    msg: format!("{key} {text:?} is not in the vocabulary"),
                }),
        }
    };
    let bos = find("bos_token")?;
    let eos = find("eos_token")?;
    let pad = find("pad_token")?;
    let chat_template = match config.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    };
    // BOS/EOS insertion: tokenizer_config's flags, else the post-processor's template.
    let template_single = json
        .get("post_processor")
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("TemplateProcessing"))
        .and_then(|p| p.get("single"))
        .and_then(Value::as_array);
    let is_special_piece = |v: Option<&Value>| v.is_some_and(|v| v.get("SpecialToken").is_some());
    let flag = |key: &str| -> Result<Option<bool>> {
        match config.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(config_fail(format!("{key} is {v}, not true or false"))),
        }
    };
    let add_bos = flag("add_bos_token")?
        .unwrap_or_else(|| template_single.is_some_and(|s| is_special_piece(s.first())));
    let add_eos = flag("add_eos_token")?.unwrap_or_else(|| {
        template_single.is_some_and(|s| s.len() > 1 && is_special_piece(s.last()))
    });

    Ok(Parts {
        tokens,
        special,
        merges,
        split_digits,
        bos,
        eos,
        pad,
        add_bos,
        add_eos,
        chat_template,
        source: path.display().to_string(),
    })
}
