//! The server's request bodies, read field by field: a wrong type or an out-of-range value is
//! an [`ApiError`] (a 400 in OpenAI's shape, [`crate::error`]) naming the field, never a
//! panic.
//!
//! [`Body::parse`](crate::body::Body::parse) takes the raw bytes; [`params`] reads the
//! sampling and output fields both completion routes share; [`chat_messages`] and
//! [`completion_prompt`] read what each route generates from; [`tokenize_fields`] and
//! [`detokenize_tokens`] read the tokenizer routes' bodies. None of them needs a model, so any bytes can be fed to them (the fuzz target does).
//!
//! ```
//! use qkv_server::body::Body;
//! use qkv_server::request::{chat_messages, params};
//!
//! let body = Body::parse(br#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}"#)?;
//! let p = params(&body, true, || 7)?;
//! assert_eq!((p.max_tokens, p.sampler.seed), (Some(8), 7));
//! let (messages, tools) = chat_messages(&body)?;
//! assert_eq!((messages.len(), tools), (1, None));
//! // A wrong type is a 400 naming the field.
//! let bad = Body::parse(br#"{"temperature": "hot"}"#)?;
//! let e = params(&bad, true, || 0).err().unwrap();
//! assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("temperature")));
//! # Ok::<(), qkv_server::error::ApiError>(())
//! ```

use crate::body::Body;
use crate::error::ApiError;
use qkv::sample::SamplerConfig;
use serde_json::Value;

/// What a completion request asks for beyond the prompt.
#[derive(Clone)]
pub struct Params {
    /// Temperature, top-k, top-p, min-p, repeat penalty and seed.
    pub sampler: SamplerConfig,
    /// `max_completion_tokens`, else `max_tokens`; `None`: until the context is full.
    pub max_tokens: Option<usize>,
    /// Up to 4 non-empty stop strings.
    pub stop: Vec<String>,
    /// Answer with SSE chunks.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
    /// Keep generating past the end-of-text token.
    pub ignore_eos: bool,
    /// Log-probabilities wanted.
    pub logprobs: bool,
    /// How many alternatives per token, with their log-probabilities (at most 20).
    pub top_logprobs: usize,
    /// `n`: how many choices to generate for the prompt (1 to [`MAX_CHOICES`]).
    pub n: usize,
    /// `logit_bias`, in OpenAI's object form or llama-server's list form.
    pub logit_bias: Vec<crate::native_fields::Bias>,
    /// llama-server's `verbose`: add `__verbose` (the prompt as text, the raw output) to
    /// the answer.
    pub verbose: bool,
    /// llama-server's `return_progress`: a streamed reply also sends a `prompt_progress`
    /// chunk when the prompt takes its slot and after each chunk of it is read.
    pub return_progress: bool,
    /// Speculative decoding asked for (`speculative`, `speculative.n_max`, …).
    pub speculative: crate::speculative::SpecFields,
    /// llama-server's `id_slot`: run in this slot (`None`, or -1: any).
    pub id_slot: Option<usize>,
    /// llama-server's `n_keep`: prompt tokens a context shift keeps (-1: all of the
    /// prompt; `None`: the server's `--keep`).
    pub n_keep: Option<i64>,
    /// llama-server's `lora`: the LoRA adapters for this request as `(id, scale)`, the
    /// server's adapters not listed at scale 0; `None` (absent or empty): the server's
    /// scales.
    pub lora: Option<Vec<(usize, f32)>>,
}

/// The most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// Reads the parameters shared by both routes; `chat` picks the chat spelling of
/// log-probabilities (`logprobs: bool` + `top_logprobs`) over the legacy one (`logprobs: n`).
/// A `model` field, when given, must be a string; any name is accepted (a server of one
/// model answers to every name, as llama-server does, and reports its own). `seed` gives the
/// sampler's seed when the request sets none.
pub fn params(b: &Body, chat: bool, seed: impl FnOnce() -> u64) -> Result<Params, ApiError> {
    b.str("model")?;
    let n = match b.uint("n", MAX_CHOICES as u64)? {
        Some(0) => return Err(ApiError::invalid("n", "`n` must be at least 1")),
        Some(n) => n as usize,
        None => 1,
    };
    for k in ["presence_penalty", "frequency_penalty"] {
        if b.number(k, -2.0..=2.0)?.is_some_and(|x| x != 0.0) {
            return Err(ApiError::invalid(
                k,
                format!("`{k}` is not supported; use repeat_penalty"),
            ));
        }
    }
    let d = SamplerConfig::default();
    let seed = match b.uint("seed", u64::MAX)? {
        Some(s) => s,
        None => seed(),
    };
    let sampler = SamplerConfig {
        temperature: b
            .number("temperature", 0.0..=2.0)?
            .map_or(d.temperature, |x| x as f32),
        top_p: match b.number("top_p", 0.0..=1.0)? {
            Some(x) if x > 0.0 => x as f32,
            Some(_) => return Err(ApiError::invalid("top_p", "`top_p` must be above 0")),
            None => d.top_p,
        },
        top_k: b
            .uint("top_k", u32::MAX as u64)?
            .map_or(d.top_k, |k| k as usize),
        min_p: b.number("min_p", 0.0..=1.0)?.map_or(d.min_p, |x| x as f32),
        repeat_penalty: b
            .number("repeat_penalty", 0.01..=10.0)?
            .map_or(d.repeat_penalty, |x| x as f32),
        repeat_last_n: d.repeat_last_n,
        seed,
    };
    let max_tokens = match b.uint("max_completion_tokens", u32::MAX as u64)? {
        Some(n) => Some(n),
        None => b.uint("max_tokens", u32::MAX as u64)?,
    };
    if max_tokens == Some(0) {
        return Err(ApiError::invalid(
            "max_tokens",
            "`max_tokens` must be at least 1",
        ));
    }
    let stop = match b.field("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if items.len() <= 4 => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::invalid("stop", "`stop` must be strings"))?,
        Some(v) => {
            return Err(ApiError::invalid(
                "stop",
                format!("`stop` must be a string or up to 4 strings, got {v}"),
            ))
        }
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop string is empty"));
    }
    let include_usage = match b.field("stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(x)) => *x,
            Some(v) => {
                return Err(ApiError::invalid(
                    "stream_options.include_usage",
                    format!("must be a boolean, got {v}"),
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("`stream_options` must be an object, got {v}"),
            ))
        }
    };
    let (logprobs, top_logprobs) = if chat {
        let on = b.bool("logprobs", false)?;
        let top = b.uint("top_logprobs", 20)?.unwrap_or(0) as usize;
        if top > 0 && !on {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ));
        }
        (on, top)
    } else {
        match b.uint("logprobs", 5)? {
            Some(n) => (true, n as usize),
            None => (false, 0),
        }
    };
    Ok(Params {
        sampler,
        max_tokens: max_tokens.map(|n| n as usize),
        stop,
        stream: b.bool("stream", false)?,
        include_usage,
        ignore_eos: b.bool("ignore_eos", false)?,
        logprobs,
        top_logprobs,
        n,
        logit_bias: crate::native_fields::logit_bias(b, "logit_bias")?,
        verbose: b.bool("verbose", false)?,
        return_progress: b.bool("return_progress", false)?,
        speculative: crate::speculative::spec_fields(b)?,
        id_slot: match b.field("id_slot") {
            None => None,
            Some(v) => match v.as_i64() {
                Some(-1) => None,
                Some(n) if n >= 0 => Some(n as usize),
                _ => {
                    return Err(ApiError::invalid(
                        "id_slot",
                        format!("`id_slot` must be -1 or a slot number, got {v}"),
                    ))
                }
            },
        },
        n_keep: match b.field("n_keep") {
            None => None,
            Some(v) => match v.as_i64() {
                Some(n) if n >= -1 => Some(n),
                _ => {
                    return Err(ApiError::invalid(
                        "n_keep",
                        format!("`n_keep` must be -1 (the whole prompt) or a count, got {v}"),
                    ))
                }
            },
        },
        lora: match b.field("lora") {
            None => None,
            Some(v) => Some(lora_list(v, "lora")?).filter(|l| !l.is_empty()),
        },
    })
}

/// A list of `{"id": n, "scale": x}` objects, as llama-server's `lora` field and the body of
/// `POST /lora-adapters` give them (a missing scale is 0, as there); a 400 naming `param`
/// for anything else. An id listed twice keeps its last scale.
pub fn lora_list(v: &Value, param: &str) -> Result<Vec<(usize, f32)>, ApiError> {
    let bad = |why: String| ApiError::invalid(param, format!("`{param}`: {why}"));
    let list = v.as_array().ok_or_else(|| {
        bad(format!(
            "must be a list of {{\"id\", \"scale\"}} objects, got {v}"
        ))
    })?;
    let mut out: Vec<(usize, f32)> = Vec::with_capacity(list.len());
    for entry in list {
        let id = entry
            .get("id")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok())
            .ok_or_else(|| bad(format!("{entry} has no `id` that is an adapter's number")))?;
        let scale = match entry.get("scale") {
            None | Some(Value::Null) => 0.0,
            Some(s) => s
                .as_f64()
                .map(|s| s as f32)
                .filter(|s| s.is_finite())
                .ok_or_else(|| bad(format!("{entry}: `scale` must be a finite number")))?,
        };
        out.retain(|(i, _)| *i != id);
        out.push((id, scale));
    }
    Ok(out)
}

/// The chat route's `messages` (each checked by [`message`]) and `tools` (a list, when
/// given).
pub fn chat_messages(b: &Body) -> Result<(Vec<Value>, Option<Vec<Value>>), ApiError> {
    let messages = b
        .required("messages")?
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::invalid("messages", "`messages` must be a non-empty list"))?;
    let msgs = messages
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = match b.field("tools") {
        None => None,
        Some(Value::Array(t)) => Some(t.clone()),
        Some(v) => {
            return Err(ApiError::invalid(
                "tools",
                format!("`tools` must be a list, got {v}"),
            ))
        }
    };
    Ok((msgs, tools))
}

/// Chat message `i`, checked: a `role` string and a `content` that is a string, a list of
/// text parts (joined into one string with a blank line between parts, as llama-server
/// joins them for templates that take string content), or null.
pub fn message(i: usize, m: &Value) -> Result<Value, ApiError> {
    let field = |k: &str| format!("messages[{i}].{k}");
    let obj = m.as_object().ok_or_else(|| {
        ApiError::invalid(&format!("messages[{i}]"), "a message must be an object")
    })?;
    if !obj.get("role").is_some_and(Value::is_string) {
        return Err(ApiError::invalid(&field("role"), "`role` must be a string"));
    }
    let mut out = obj.clone();
    match obj.get("content") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => {
                        // llama-server joins the parts of a string-content template so.
                        if !text.is_empty() {
                            text.push_str("\n\n");
                        }
                        text.push_str(t)
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &field("content"),
                            "only text content parts are supported",
                        ))
                    }
                }
            }
            out.insert("content".into(), Value::String(text));
        }
        Some(v) => {
            return Err(ApiError::invalid(
                &field("content"),
                format!("`content` must be a string or a list of parts, got {v}"),
            ))
        }
    }
    Ok(Value::Object(out))
}

/// What the completion route generates from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text, to be tokenized.
    Text(String),
    /// Token ids, run as given.
    Ids(Vec<u32>),
}

/// The completion route's `prompt` (a string, a list of one string, or a list of token
/// ids); `echo` and `suffix` are refused.
pub fn completion_prompt(b: &Body) -> Result<Prompt, ApiError> {
    if b.bool("echo", false)? {
        return Err(ApiError::invalid("echo", "`echo` is not supported"));
    }
    if b.str("suffix")?.is_some() {
        return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
    }
    match b.required("prompt")? {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(items) if items.iter().all(Value::is_u64) => items
            .iter()
            .map(|v| u32::try_from(v.as_u64().unwrap_or(u64::MAX)))
            .collect::<Result<Vec<u32>, _>>()
            .map(Prompt::Ids)
            .map_err(|_| ApiError::invalid("prompt", "a token id is out of range")),
        Value::Array(items) if items.len() == 1 && items[0].is_string() => {
            Ok(Prompt::Text(items[0].as_str().unwrap_or("").to_owned()))
        }
        v => Err(ApiError::invalid(
            "prompt",
            format!("`prompt` must be a string or a list of token ids, got {v}"),
        )),
    }
}

/// The `/tokenize` route's `content` and its encoding options (`add_special`, default
/// false; `parse_special`, default true).
pub fn tokenize_fields(b: &Body) -> Result<(&str, qkv::tokenizer::EncodeOptions), ApiError> {
    let content = b
        .str("content")?
        .ok_or_else(|| ApiError::invalid("content", "`content` is required"))?;
    let options = qkv::tokenizer::EncodeOptions {
        add_special: b.bool("add_special", false)?,
        parse_special: b.bool("parse_special", true)?,
    };
    Ok((content, options))
}

/// The `/detokenize` route's `tokens`: a list of token ids.
pub fn detokenize_tokens(b: &Body) -> Result<Vec<u32>, ApiError> {
    b.required("tokens")?
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
                .collect::<Option<Vec<u32>>>()
        })
        .ok_or_else(|| ApiError::invalid("tokens", "`tokens` must be a list of token ids"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn body(json: &str) -> Body {
        Body::parse(json.as_bytes()).unwrap()
    }

    /// The 400 of `r`, with the field it names.
    fn field<T>(r: Result<T, ApiError>) -> Option<String> {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => {
                assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e}");
                e.param
            }
        }
    }

    #[test]
    fn every_parameter_of_the_wrong_type_or_range_is_named() {
        let seed = || 0;
        for (json, name) in [
            (r#"{"model": 3}"#, "model"),
            (r#"{"n": 0}"#, "n"),
            (r#"{"n": 17}"#, "n"),
            (r#"{"logit_bias": [1]}"#, "logit_bias"),
            (r#"{"presence_penalty": 1}"#, "presence_penalty"),
            (r#"{"temperature": 2.5}"#, "temperature"),
            (r#"{"temperature": "hot"}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_k": -1}"#, "top_k"),
            (r#"{"min_p": 1.5}"#, "min_p"),
            (r#"{"repeat_penalty": 0}"#, "repeat_penalty"),
            (r#"{"seed": 1.5}"#, "seed"),
            (r#"{"max_tokens": 0}"#, "max_tokens"),
            (r#"{"max_tokens": 1e30}"#, "max_tokens"),
            (r#"{"stop": ["a", "b", "c", "d", "e"]}"#, "stop"),
            (r#"{"stop": [""]}"#, "stop"),
            (r#"{"stop": [1]}"#, "stop"),
            (r#"{"stream": "yes"}"#, "stream"),
            (r#"{"stream_options": []}"#, "stream_options"),
            (
                r#"{"stream_options": {"include_usage": 1}}"#,
                "stream_options.include_usage",
            ),
            (r#"{"top_logprobs": 3}"#, "top_logprobs"),
            (r#"{"logprobs": true, "top_logprobs": 21}"#, "top_logprobs"),
        ] {
            let got = field(params(&body(json), true, seed));
            assert_eq!(got.as_deref(), Some(name), "{json}");
        }
        // The legacy route's `logprobs` is a count up to 5.
        let got = field(params(&body(r#"{"logprobs": 6}"#), false, seed));
        assert_eq!(got.as_deref(), Some("logprobs"));
    }

    #[test]
    fn parameters_are_read_with_their_defaults() {
        let p = params(&body("{}"), true, || 42).unwrap();
        let d = SamplerConfig::default();
        assert_eq!(
            (p.sampler.temperature, p.sampler.top_p, p.sampler.seed),
            (d.temperature, d.top_p, 42)
        );
        assert_eq!((p.max_tokens, p.stream, p.logprobs), (None, false, false));
        let json = r#"{"model": "qkv", "temperature": 0, "seed": 7, "max_tokens": 5,
            "max_completion_tokens": 9, "stop": "\n", "stream": true, "ignore_eos": true,
            "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2}"#;
        let p = params(&body(json), true, || unreachable!()).unwrap();
        assert_eq!((p.sampler.temperature, p.sampler.seed), (0.0, 7));
        assert_eq!(p.max_tokens, Some(9), "max_completion_tokens wins");
        assert_eq!(p.stop, ["\n"]);
        assert!(p.stream && p.include_usage && p.ignore_eos && p.logprobs);
        assert_eq!(p.top_logprobs, 2);
        let p = params(&body(r#"{"logprobs": 3}"#), false, || 0).unwrap();
        assert_eq!((p.logprobs, p.top_logprobs), (true, 3));
        // Any model name is accepted: the server answers with its own.
        assert!(params(&body(r#"{"model": "gpt-4"}"#), true, || 0).is_ok());
    }

    #[test]
    fn messages_are_checked_one_by_one() {
        for (json, name) in [
            (r#"{}"#, "messages"),
            (r#"{"messages": []}"#, "messages"),
            (r#"{"messages": "hi"}"#, "messages"),
            (r#"{"messages": [3]}"#, "messages[0]"),
            (r#"{"messages": [{"content": "hi"}]}"#, "messages[0].role"),
            (
                r#"{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 5}]}"#,
                "messages[1].content",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
                "messages[0].content",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "a"}], "tools": {}}"#,
                "tools",
            ),
        ] {
            assert_eq!(
                field(chat_messages(&body(json))).as_deref(),
                Some(name),
                "{json}"
            );
        }
        let json = r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
            {"type": "text", "text": "b"}]}, {"role": "assistant", "content": null}],
            "tools": [{"type": "function"}]}"#;
        let (msgs, tools) = chat_messages(&body(json)).unwrap();
        assert_eq!(msgs[0]["content"], "a\n\nb", "text parts are joined");
        assert!(msgs[1]["content"].is_null());
        assert_eq!(tools.map(|t| t.len()), Some(1));
    }

    #[test]
    fn prompts_are_text_or_token_ids() {
        let prompt = |json: &str| completion_prompt(&body(json));
        assert_eq!(
            prompt(r#"{"prompt": "hi"}"#).unwrap(),
            Prompt::Text("hi".into())
        );
        assert_eq!(
            prompt(r#"{"prompt": ["hi"]}"#).unwrap(),
            Prompt::Text("hi".into())
        );
        assert_eq!(
            prompt(r#"{"prompt": [1, 2]}"#).unwrap(),
            Prompt::Ids(vec![1, 2])
        );
        for (json, name) in [
            (r#"{}"#, "prompt"),
            (r#"{"prompt": [4294967296]}"#, "prompt"),
            (r#"{"prompt": [1, "a"]}"#, "prompt"),
            (r#"{"prompt": {}}"#, "prompt"),
            (r#"{"prompt": "a", "echo": true}"#, "echo"),
            (r#"{"prompt": "a", "suffix": "b"}"#, "suffix"),
        ] {
            assert_eq!(field(prompt(json)).as_deref(), Some(name), "{json}");
        }
    }

    #[test]
    fn tokenizer_routes_read_their_fields() {
        let b = body(r#"{"content": "x", "add_special": true}"#);
        let (content, o) = tokenize_fields(&b).unwrap();
        assert_eq!((content, o.add_special, o.parse_special), ("x", true, true));
        assert_eq!(
            field(tokenize_fields(&body("{}"))).as_deref(),
            Some("content")
        );
        assert_eq!(
            detokenize_tokens(&body(r#"{"tokens": [0, 7]}"#)).unwrap(),
            [0, 7]
        );
        for json in [
            r#"{}"#,
            r#"{"tokens": [-1]}"#,
            r#"{"tokens": [4294967296]}"#,
        ] {
            assert_eq!(
                field(detokenize_tokens(&body(json))).as_deref(),
                Some("tokens")
            );
        }
    }
}
