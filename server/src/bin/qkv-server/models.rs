//! The names the served model answers to, and `GET /v1/models` (and `/models`).
//!
//! Two ways to name it:
//! - `--model-name NAME`, repeatable: the first is the name responses report, and each is
//!   listed as a model of its own (clients that pick from the list find any of them);
//! - llama-server's `--alias a,b,c`: one model known by several names, listed once. As
//!   llama-server does, its `id` (and the name responses report) is the first of the names
//!   in sorted order, and `aliases` lists them all.
//!
//! `--tags t1,t2` are listed as the model's `tags`. Every entry carries `aliases` (every
//! name) and `tags`. A request may name any model: the server runs one.

use crate::{AppState, Shared};
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

/// What the model is called.
pub struct Names {
    /// The name responses report.
    pub served: String,
    /// The ids `/v1/models` lists.
    pub listed: Vec<String>,
    /// Every name the model answers to.
    pub aliases: Vec<String>,
    /// `--tags`.
    pub tags: Vec<String>,
}

/// Splits a comma-separated flag value, trimmed, empty items dropped.
fn list(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The names from `--model-name`s (`given`), `--alias` and `--tags`; without either kind of
/// name, the file or directory name. An empty or repeated name, or both kinds of name
/// given, is a startup error.
pub fn names(
    given: &[String],
    alias: Option<&str>,
    tags: Option<&str>,
    path: &Path,
) -> Result<Names, String> {
    let tags = list(tags);
    if let Some(alias) = alias {
        if !given.is_empty() {
            return Err("--alias and --model-name: give one or the other".into());
        }
        let mut aliases = list(Some(alias));
        if aliases.is_empty() {
            return Err("--alias: give at least one name".into());
        }
        for (i, name) in aliases.iter().enumerate() {
            if aliases[..i].contains(name) {
                return Err(format!("--alias {name}: given twice"));
            }
        }
        let served = aliases.iter().min().cloned().unwrap_or_default();
        aliases.sort();
        return Ok(Names {
            listed: vec![served.clone()],
            served,
            aliases,
            tags,
        });
    }
    if given.is_empty() {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "qkv".into());
        return Ok(Names {
            served: name.clone(),
            listed: vec![name.clone()],
            aliases: vec![name],
            tags,
        });
    }
    for (i, name) in given.iter().enumerate() {
        if name.trim().is_empty() {
            return Err("--model-name: a name is empty".into());
        }
        if given[..i].contains(name) {
            return Err(format!("--model-name {name}: given twice"));
        }
    }
    Ok(Names {
        served: given[0].clone(),
        listed: given.to_vec(),
        aliases: given.to_vec(),
        tags,
    })
}

/// The `/v1/models` answer: one entry per listed name, each the same model (`root`: the
/// served name), with `aliases`, `tags` and `meta`.
pub fn model_list(shared: &Shared, meta: Value) -> Json<Value> {
    let n = &shared.names;
    let data: Vec<Value> = n
        .listed
        .iter()
        .map(|name| {
            json!({
                "id": name, "object": "model", "created": 0, "owned_by": "qkv",
                "root": n.served, "aliases": n.aliases, "tags": n.tags, "meta": meta,
            })
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models` of a decoder.
pub async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    model_list(
        &state.shared,
        json!({"n_ctx": state.context, "n_vocab": state.model.vocab_size()}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alias_lists_one_model_named_as_llama_server_names_it() {
        let p = Path::new("/m/model.gguf");
        let n = names(&[], Some("tinyllama-2,fim, code"), Some("chat,small"), p).unwrap();
        assert_eq!(n.served, "code");
        assert_eq!(n.listed, ["code"]);
        assert_eq!(n.aliases, ["code", "fim", "tinyllama-2"]);
        assert_eq!(n.tags, ["chat", "small"]);
        let n = names(&["a".into(), "b".into()], None, None, p).unwrap();
        assert_eq!((n.served.as_str(), n.listed.len()), ("a", 2));
        assert!(n.tags.is_empty());
        assert_eq!(names(&[], None, None, p).unwrap().served, "model.gguf");
        assert!(names(&["a".into()], Some("b"), None, p).is_err());
        assert!(names(&[], Some(" , "), None, p).is_err());
        assert!(names(&[], Some("a,a"), None, p).is_err());
    }
}
