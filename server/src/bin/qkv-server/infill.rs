//! `POST /infill`: code completion between a prefix and a suffix, for editor plugins, with
//! the model's fill-in-the-middle tokens ([`qkv::tokenizer::FimTokens`]), laid out as
//! llama-server lays them out so that both servers give a model the same tokens:
//!
//! - `input_extra` files first (repository-level: the repository marker and `myproject`,
//!   then each file's separator and name, then its text; a model without those markers
//!   gets each text after a `--- snippet ---` line), as much of their end as the context
//!   leaves past one batch and twice the server's `--n-predict`;
//! - then the prefix marker, the end of `input_prefix` (up to three quarters of the batch
//!   size) and `prompt`; the suffix marker and the start of `input_suffix` (up to a quarter
//!   of it, less the prompt) — in that order, or the suffix first with `--spm-infill`; the
//!   beginning-of-text token before them when the model adds one;
//! - the middle marker last, after which the model writes.
//!
//! The rest of the request is `/completion`'s, and so is the answer.

use crate::native::answer;
use crate::{body, counted, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use qkv::tokenizer::{EncodeOptions, Tokenizer};
use qkv_server::body::Body;
use qkv_server::error::ApiError;
use serde_json::Value;
use std::sync::Arc;

/// Text encoded as is: no special tokens added, none parsed out of it.
const LITERAL: EncodeOptions = EncodeOptions {
    add_special: false,
    parse_special: false,
};

/// `input_prefix` or `input_suffix`: a string, or a list of strings and token ids, encoded
/// with no special tokens parsed.
fn part(b: &Body, tokenizer: &Tokenizer, field: &str) -> Result<Vec<u32>, ApiError> {
    let vocab = tokenizer.vocab_size();
    let bad = || {
        ApiError::invalid(
            field,
            format!("`{field}` must be a string, or a list of strings and token ids"),
        )
    };
    match b.required(field)? {
        Value::String(s) => Ok(tokenizer.encode_with(s, LITERAL)?),
        Value::Array(items) => {
            let mut ids = Vec::new();
            for item in items {
                match item {
                    Value::String(s) => ids.extend(tokenizer.encode_with(s, LITERAL)?),
                    Value::Number(n) => match n.as_u64() {
                        Some(t) if (t as usize) < vocab => ids.push(t as u32),
                        _ => return Err(bad()),
                    },
                    _ => return Err(bad()),
                }
            }
            Ok(ids)
        }
        _ => Err(bad()),
    }
}

/// `input_extra`: a list of `{"text": string, "filename": string (optional)}`.
fn extra(b: &Body) -> Result<Vec<(String, String)>, ApiError> {
    let shape = "`input_extra` must be a list of {\"filename\": string, \"text\": string}";
    let items = match b.field("input_extra") {
        None => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::invalid("input_extra", shape)),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let text = chunk.get("text").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(
                    "input_extra",
                    format!("input_extra[{i}] needs a string `text`: {shape}"),
                )
            })?;
            let name = match chunk.get("filename") {
                None => "tmp",
                Some(Value::String(s)) => s,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "input_extra",
                        format!("input_extra[{i}]'s `filename` must be a string"),
                    ))
                }
            };
            Ok((name.to_owned(), text.to_owned()))
        })
        .collect()
}

/// The infill prompt's tokens (see the [module docs](self)).
fn layout(state: &AppState, b: &Body, tokenizer: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    let fim = tokenizer.fim();
    let (Some(pre), Some(suf), Some(mid)) = (fim.prefix, fim.suffix, fim.middle) else {
        let missing: Vec<&str> = [
            ("prefix", fim.prefix),
            ("suffix", fim.suffix),
            ("middle", fim.middle),
        ]
        .iter()
        .filter(|(_, t)| t.is_none())
        .map(|(n, _)| *n)
        .collect();
        return Err(ApiError::status(
            axum::http::StatusCode::NOT_IMPLEMENTED,
            format!(
                "infill needs the model's fill-in-the-middle tokens; this vocabulary has no {} \
                 token",
                missing.join(", no ")
            ),
        ));
    };
    let prompt = match b.field("prompt") {
        None => Vec::new(),
        Some(Value::String(s)) => tokenizer.encode_with(
            s,
            EncodeOptions {
                add_special: false,
                parse_special: true,
            },
        )?,
        Some(_) => return Err(ApiError::invalid("prompt", "`prompt` must be a string")),
    };
    let mut prefix = part(b, tokenizer, "input_prefix")?;
    let mut suffix = part(b, tokenizer, "input_suffix")?;
    let files = extra(b)?;
    let mut extra_ids = Vec::new();
    if let Some(repo) = fim.repo {
        extra_ids.push(repo);
        extra_ids.extend(tokenizer.encode_with("myproject\n", LITERAL)?);
    }
    for (name, text) in &files {
        match fim.file_sep {
            Some(sep) => {
                extra_ids.push(sep);
                extra_ids.extend(tokenizer.encode_with(&format!("{name}\n"), LITERAL)?);
            }
            None => extra_ids.extend(tokenizer.encode_with("\n\n--- snippet ---\n\n", LITERAL)?),
        }
        extra_ids.extend(tokenizer.encode_with(text, LITERAL)?);
    }
    if let Some(sep) = fim.file_sep {
        extra_ids.push(sep);
        extra_ids.extend(tokenizer.encode_with("filename\n", LITERAL)?);
    }
    // Prefix and suffix share one batch, three quarters and one quarter (the prompt and
    // two markers come out of the suffix's share); the files get what the context leaves
    // past a batch and twice the server's token limit (-1 without one, as llama-server).
    let n_batch = state.options.n_batch as i64;
    let n_predict = state.options.n_predict.map_or(-1, |n| n as i64);
    let take_prefix = prefix.len().min((3 * (n_batch / 4)) as usize);
    let take_suffix = (n_batch / 4 - (2 + prompt.len() as i64)).max(0) as usize;
    let take_suffix = suffix.len().min(take_suffix);
    let take_extra = (state.context as i64 - n_batch - 2 * n_predict).max(0) as usize;
    let take_extra = extra_ids.len().min(take_extra);
    prefix.drain(..prefix.len() - take_prefix);
    suffix.truncate(take_suffix);
    let prefix: Vec<u32> = std::iter::once(pre).chain(prefix).chain(prompt).collect();
    let suffix: Vec<u32> = std::iter::once(suf).chain(suffix).collect();
    let (first, second) = match state.options.spm_infill {
        false => (prefix, suffix),
        true => (suffix, prefix),
    };
    let mut ids = extra_ids[extra_ids.len() - take_extra..].to_vec();
    if tokenizer.adds_bos() {
        ids.extend(tokenizer.bos_id());
    }
    ids.extend(first);
    ids.extend(second);
    ids.push(mid);
    Ok(ids)
}

/// `POST /infill`.
pub async fn infill(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let b = body(&state.shared, raw)?;
        let tokenizer = state.model.tokenizer().expect("checked at start");
        let ids = layout(&state, &b, tokenizer)?;
        answer(&state, &b, vec![ids]).await
    }
    .await;
    counted(&state.shared, r)
}
