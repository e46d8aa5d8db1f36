//! llama-server's native request fields, read as llama-server reads them: the `/completion`
//! route's `prompt` forms (text, token ids, both mixed in one sequence, or a batch of
//! prompts), `n_predict`, `n_probs`, `logit_bias` (in llama-server's list form and OpenAI's
//! object form), `samplers`, `response_fields` and the fields accepted for compatibility
//! (`cache_prompt`, `id_slot`, `return_tokens`, `timings_per_token`, `post_sampling_probs`).
//! [`Biased`] applies a logit bias in the engine as a [`TokenConstraint`], around the
//! grammar constraint when there is one.
//!
//! Like [`crate::request`], nothing here needs a model, so any bytes can be fed to it (the
//! server-request fuzz target does).
//!
//! ```
//! use qkv_server::native_fields::{fields, logit_bias, prompts, BiasKey, PromptPart};
//! use qkv_server::body::Body;
//!
//! let b = Body::parse(br#"{"prompt": [1, 2, "three"], "n_predict": 4, "n_probs": 2,
//!     "logit_bias": [[5, -1.5], ["no", false]]}"#)?;
//! let p = prompts(&b)?;
//! assert_eq!(p, vec![vec![PromptPart::Id(1), PromptPart::Id(2), PromptPart::Text("three".into())]]);
//! let f = fields(&b)?;
//! assert_eq!((f.n_predict, f.n_probs), (Some(4), 2));
//! let bias = logit_bias(&b, "logit_bias")?;
//! assert_eq!(bias[0].key, BiasKey::Token(5));
//! assert_eq!(bias[1].bias, None, "false bans the token");
//! # Ok::<(), qkv_server::error::ApiError>(())
//! ```

use crate::body::Body;
use crate::error::ApiError;
use qkv::engine::TokenConstraint;
use serde_json::Value;

/// One piece of a prompt sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptPart {
    /// Text, tokenized by the server.
    Text(String),
    /// A token id, run as given.
    Id(u32),
}

/// The most prompts one request may batch.
pub const MAX_PROMPTS: usize = 64;

fn token_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|x| u32::try_from(x).ok())
}

/// One prompt sequence: a string, a `{"prompt_string": …}` object (a
/// `multimodal_data` beside it is refused: no model here reads images), or a list of token
/// ids and strings.
fn sequence(v: &Value, field: &str) -> Result<Vec<PromptPart>, ApiError> {
    match v {
        Value::String(s) => Ok(vec![PromptPart::Text(s.clone())]),
        Value::Object(o) => {
            if o.get("multimodal_data").is_some_and(|m| !m.is_null()) {
                return Err(ApiError::invalid(
                    &format!("{field}.multimodal_data"),
                    "this server has no multimodal model: `multimodal_data` cannot be read",
                ));
            }
            if let Some(parts) = o.get("content") {
                return content_parts(parts, &format!("{field}.content"));
            }
            match o.get("prompt_string") {
                Some(Value::String(s)) => Ok(vec![PromptPart::Text(s.clone())]),
                _ => Err(ApiError::invalid(
                    &format!("{field}.prompt_string"),
                    "a prompt object needs a string `prompt_string` or a list `content`",
                )),
            }
        }
        Value::Array(items) => items
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(PromptPart::Text(s.clone())),
                x => token_id(x).map(PromptPart::Id).ok_or_else(|| {
                    ApiError::invalid(
                        field,
                        format!("a prompt sequence holds token ids and strings, got {x}"),
                    )
                }),
            })
            .collect(),
        v => Err(ApiError::invalid(
            field,
            format!("a prompt must be a string, token ids, or an object, got {v}"),
        )),
    }
}

/// A `{"content": [...]}` prompt object's parts: text parts, their texts run together as
/// one text (llama-server's embedding input); any other kind of part is refused (no model
/// here reads images, audio or video).
fn content_parts(v: &Value, field: &str) -> Result<Vec<PromptPart>, ApiError> {
    let Value::Array(parts) = v else {
        return Err(ApiError::invalid(
            field,
            format!("`content` must be a list of text parts, got {v}"),
        ));
    };
    let mut text = String::new();
    for (i, p) in parts.iter().enumerate() {
        match (p.get("type").and_then(Value::as_str), p.get("text")) {
            (Some("text"), Some(Value::String(t))) => text.push_str(t),
            (Some("text"), _) => {
                return Err(ApiError::invalid(
                    &format!("{field}[{i}].text"),
                    "a text part needs a string `text`",
                ))
            }
            (kind, _) => {
                return Err(ApiError::invalid(
                    &format!("{field}[{i}].type"),
                    format!(
                        "only text parts can be read here, got {}",
                        kind.unwrap_or("no type")
                    ),
                ))
            }
        }
    }
    Ok(vec![PromptPart::Text(text)])
}

/// The `prompt` of `/completion`, as the sequences to run: a string or an object is one;
/// a list holding a token id (alone or with strings) is one mixed sequence; any other list
/// is a batch, each element a string, an object or a list of ids and strings.
pub fn prompts(b: &Body) -> Result<Vec<Vec<PromptPart>>, ApiError> {
    prompts_in(b, "prompt")
}

/// As [`prompts`], from the field `field` (`input` of llama-server's embeddings, say).
/// Objects may also be `{"content": [text parts]}`, their texts run together.
pub fn prompts_in(b: &Body, field: &str) -> Result<Vec<Vec<PromptPart>>, ApiError> {
    let p = b.required(field)?;
    let Value::Array(items) = p else {
        return Ok(vec![sequence(p, field)?]);
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            field,
            format!("`{field}` is an empty list"),
        ));
    }
    if items.iter().any(Value::is_number) {
        return Ok(vec![sequence(p, field)?]);
    }
    if items.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            field,
            format!("at most {MAX_PROMPTS} prompts per request"),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| sequence(v, &format!("{field}[{i}]")))
        .collect()
}

/// What a bias is applied to.
#[derive(Debug, Clone, PartialEq)]
pub enum BiasKey {
    /// A token id.
    Token(u32),
    /// Every token of this text's encoding.
    Text(String),
}

/// One logit bias.
#[derive(Debug, Clone, PartialEq)]
pub struct Bias {
    /// The token or text it applies to.
    pub key: BiasKey,
    /// Added to the logit; `None`: the token is banned (`false`, or -100 and below, which
    /// OpenAI documents as a ban).
    pub bias: Option<f32>,
}

fn bias_value(v: &Value, field: &str) -> Result<Option<f32>, ApiError> {
    match v {
        Value::Bool(false) => Ok(None),
        Value::Number(n) => match n.as_f64() {
            Some(x) if x.is_finite() && x <= -100.0 => Ok(None),
            Some(x) if x.is_finite() && x.abs() <= 1e6 => Ok(Some(x as f32)),
            _ => Err(ApiError::invalid(
                field,
                format!("a bias out of range: {n}"),
            )),
        },
        v => Err(ApiError::invalid(
            field,
            format!("a bias must be a number or false, got {v}"),
        )),
    }
}

/// The most biases one request may give.
pub const MAX_BIASES: usize = 4096;

/// `field` (`logit_bias`) as a list of biases: llama-server's `[[token or text, bias], …]`
/// or OpenAI's `{"token id or text": bias}`; absent or null is no bias.
pub fn logit_bias(b: &Body, field: &str) -> Result<Vec<Bias>, ApiError> {
    let key = |k: &Value| match k {
        Value::String(s) => Ok(match s.parse::<u32>() {
            Ok(id) => BiasKey::Token(id),
            Err(_) => BiasKey::Text(s.clone()),
        }),
        k => token_id(k).map(BiasKey::Token).ok_or_else(|| {
            ApiError::invalid(
                field,
                format!("a bias key must be a token id or text, got {k}"),
            )
        }),
    };
    let out: Vec<Bias> = match b.field(field) {
        None => Vec::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                Ok(Bias {
                    key: key(&Value::String(k.clone()))?,
                    bias: bias_value(v, field)?,
                })
            })
            .collect::<Result<_, ApiError>>()?,
        Some(Value::Array(items)) => items
            .iter()
            .map(|pair| match pair.as_array().map(Vec::as_slice) {
                Some([k, v]) => Ok(Bias {
                    key: key(k)?,
                    bias: bias_value(v, field)?,
                }),
                _ => Err(ApiError::invalid(
                    field,
                    format!("each bias is a [token or text, bias] pair, got {pair}"),
                )),
            })
            .collect::<Result<_, ApiError>>()?,
        Some(v) => {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` must be a list of pairs or an object, got {v}"),
            ))
        }
    };
    if out.len() > MAX_BIASES {
        return Err(ApiError::invalid(
            field,
            format!("at most {MAX_BIASES} biases"),
        ));
    }
    Ok(out)
}

/// The sampler names `samplers` may list (llama-server's chain; qkv runs its own fixed
/// order, penalties, top-k, top-p, min-p, temperature, whatever the list says).
pub const SAMPLER_NAMES: &[&str] = &[
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "typical_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
    "adaptive_p",
    "infill",
];

/// The native route's fields besides the sampling ones [`crate::request::params`] reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fields {
    /// `n_predict` (or `max_tokens`); `None` for -1 or absent: until the context or the
    /// server's `--n-predict` ends it.
    pub n_predict: Option<usize>,
    /// Top alternatives to report per token (`n_probs`), at most 100.
    pub n_probs: usize,
    /// Report probabilities (`prob`, `top_probs`) instead of log-probabilities.
    pub post_sampling_probs: bool,
    /// Put the generated token ids in `tokens`.
    pub return_tokens: bool,
    /// `cache_prompt` (default true): reuse a cached prefix. qkv's engine always reuses one;
    /// false is accepted and reported.
    pub cache_prompt: bool,
    /// `id_slot`: the slot asked for (-1: any). qkv's engine places sequences itself.
    pub id_slot: i64,
    /// `samplers`, as given (each one of [`SAMPLER_NAMES`]).
    pub samplers: Vec<String>,
    /// `response_fields`: answer with only these fields (`a/b` reads a nested one).
    pub response_fields: Vec<String>,
    /// Timings on every streamed chunk, not only the last.
    pub timings_per_token: bool,
    /// The stop strings (any number, unlike OpenAI's four).
    pub stop: Vec<String>,
}

/// The most stop strings a native request may give.
pub const MAX_STOPS: usize = 64;

/// Reads the native route's own fields (see [`Fields`]).
pub fn fields(b: &Body) -> Result<Fields, ApiError> {
    let n_predict = match b.field("n_predict").or_else(|| b.field("max_tokens")) {
        None => None,
        Some(v) => match v.as_i64() {
            Some(-1) => None,
            Some(n) if (1..=u32::MAX as i64).contains(&n) => Some(n as usize),
            _ => {
                return Err(ApiError::invalid(
                    "n_predict",
                    format!("`n_predict` must be -1 or a positive integer, got {v}"),
                ))
            }
        },
    };
    let n_probs = b.uint("n_probs", 100)?.unwrap_or(0) as usize;
    let id_slot = match b.field("id_slot") {
        None => -1,
        Some(v) => match v.as_i64() {
            Some(n) if n >= -1 => n,
            _ => {
                return Err(ApiError::invalid(
                    "id_slot",
                    format!("`id_slot` must be -1 or a slot number, got {v}"),
                ))
            }
        },
    };
    let strings = |k: &str, max: usize| -> Result<Vec<String>, ApiError> {
        match b.field(k) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) if a.len() <= max => a
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be a list of strings"))),
            Some(v) => Err(ApiError::invalid(
                k,
                format!("`{k}` must be up to {max} strings, got {v}"),
            )),
        }
    };
    let samplers = strings("samplers", 32)?;
    if let Some(s) = samplers
        .iter()
        .find(|s| !SAMPLER_NAMES.contains(&s.as_str()))
    {
        return Err(ApiError::invalid(
            "samplers",
            format!("unknown sampler `{s}`; known: {}", SAMPLER_NAMES.join(", ")),
        ));
    }
    let stop = strings("stop", MAX_STOPS)?;
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop string is empty"));
    }
    Ok(Fields {
        n_predict,
        n_probs,
        post_sampling_probs: b.bool("post_sampling_probs", false)?,
        return_tokens: b.bool("return_tokens", false)?,
        cache_prompt: b.bool("cache_prompt", true)?,
        id_slot,
        samplers,
        response_fields: strings("response_fields", 64)?,
        timings_per_token: b.bool("timings_per_token", false)?,
        stop,
    })
}

/// `value` cut down to `fields`: each `a/b` names a nested value, and the answer holds it
/// under the key `a/b` (a missing one is left out).
pub fn select_fields(value: &Value, fields: &[String]) -> Value {
    let mut out = serde_json::Map::new();
    for f in fields {
        let mut v = Some(value);
        for part in f.split('/') {
            v = v.and_then(|x| x.get(part));
        }
        if let Some(v) = v {
            out.insert(f.clone(), v.clone());
        }
    }
    Value::Object(out)
}

/// A logit bias applied in the engine, around an optional inner constraint (a grammar).
/// Every step takes the masked path, so that the bias is exact: the engine's first sample
/// is refused and the token is drawn again from the biased logits.
pub struct Biased {
    inner: Option<Box<dyn TokenConstraint>>,
    /// (token, bias); `f32::NEG_INFINITY` bans the token.
    bias: Vec<(u32, f32)>,
}

impl Biased {
    /// `bias` ((token, added logit), `f32::NEG_INFINITY` to ban) applied around `inner`.
    pub fn new(inner: Option<Box<dyn TokenConstraint>>, bias: Vec<(u32, f32)>) -> Biased {
        Biased { inner, bias }
    }
}

impl TokenConstraint for Biased {
    fn allows(&mut self, token: u32) -> bool {
        if self.bias.is_empty() {
            return self.inner.as_mut().is_none_or(|c| c.allows(token));
        }
        false
    }

    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        if let Some(c) = self.inner.as_mut() {
            c.mask(logits)?;
        }
        for &(t, b) in &self.bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if b == f32::NEG_INFINITY || *l == f32::MIN {
                    f32::MIN
                } else {
                    (*l + b).max(f32::MIN)
                };
            }
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        match self.inner.as_mut() {
            Some(c) => c.commit(token),
            None => Ok(()),
        }
    }

    fn is_complete(&self) -> bool {
        self.inner.as_ref().is_some_and(|c| c.is_complete())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> Body {
        Body::parse(json.as_bytes()).unwrap()
    }

    fn param<T: std::fmt::Debug>(r: Result<T, ApiError>) -> String {
        r.expect_err("expected a 400").param.unwrap_or_default()
    }

    #[test]
    fn prompt_forms_are_read_as_llama_server_reads_them() {
        let p = |j: &str| prompts(&body(j));
        use PromptPart::{Id, Text};
        assert_eq!(p(r#"{"prompt": "hi"}"#).unwrap(), [vec![Text("hi".into())]]);
        assert_eq!(p(r#"{"prompt": [1, 2]}"#).unwrap(), [vec![Id(1), Id(2)]]);
        assert_eq!(
            p(r#"{"prompt": [1, "a", 2]}"#).unwrap(),
            [vec![Id(1), Text("a".into()), Id(2)]]
        );
        let batch = p(r#"{"prompt": [[1, 2], "a", {"prompt_string": "b"}]}"#).unwrap();
        assert_eq!(
            batch,
            [
                vec![Id(1), Id(2)],
                vec![Text("a".into())],
                vec![Text("b".into())]
            ]
        );
        assert_eq!(
            p(r#"{"prompt": {"prompt_string": "x"}}"#).unwrap(),
            [vec![Text("x".into())]]
        );
        for (j, f) in [
            (r#"{}"#, "prompt"),
            (r#"{"prompt": []}"#, "prompt"),
            (r#"{"prompt": [1, -2]}"#, "prompt"),
            (r#"{"prompt": 5}"#, "prompt"),
            (r#"{"prompt": [[1, {}]]}"#, "prompt[0]"),
            (
                r#"{"prompt": {"prompt_string": "x", "multimodal_data": "AA=="}}"#,
                "prompt.multimodal_data",
            ),
            (r#"{"prompt": {"text": "x"}}"#, "prompt.prompt_string"),
        ] {
            assert_eq!(param(p(j)), f, "{j}");
        }
    }

    #[test]
    fn content_objects_run_their_text_parts_together() {
        let p = |j: &str| prompts_in(&body(j), "input");
        use PromptPart::Text;
        let got = p(
            r#"{"input": ["hello world", {"content": [{"type": "text", "text": "hello "},
            {"type": "text", "text": "world"}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            got,
            [
                vec![Text("hello world".into())],
                vec![Text("hello world".into())]
            ]
        );
        for (j, f) in [
            (r#"{"input": {"content": "string"}}"#, "input.content"),
            (
                r#"{"input": {"content": [{"type": "unknown"}]}}"#,
                "input.content[0].type",
            ),
            (
                r#"{"input": {"content": [{"type": "image_url", "image_url": {"url": "x"}}]}}"#,
                "input.content[0].type",
            ),
            (
                r#"{"input": {"content": [{"type": "text"}]}}"#,
                "input.content[0].text",
            ),
            (r#"{"input": []}"#, "input"),
        ] {
            assert_eq!(param(p(j)), f, "{j}");
        }
    }

    #[test]
    fn logit_bias_takes_both_shapes() {
        let b = body(r#"{"logit_bias": {"12": -100, " the": 2.5}}"#);
        let got = logit_bias(&b, "logit_bias").unwrap();
        assert!(got.contains(&Bias {
            key: BiasKey::Token(12),
            bias: None
        }));
        assert!(got.contains(&Bias {
            key: BiasKey::Text(" the".into()),
            bias: Some(2.5)
        }));
        let b = body(r#"{"logit_bias": [[3, 1], ["x", false]]}"#);
        let got = logit_bias(&b, "logit_bias").unwrap();
        assert_eq!(got[0].bias, Some(1.0));
        assert_eq!(got[1].key, BiasKey::Text("x".into()));
        for j in [
            r#"{"logit_bias": 3}"#,
            r#"{"logit_bias": [[1]]}"#,
            r#"{"logit_bias": [[1, "a"]]}"#,
            r#"{"logit_bias": [[1.5, 1]]}"#,
            r#"{"logit_bias": {"1": true}}"#,
        ] {
            assert_eq!(
                param(logit_bias(&body(j), "logit_bias")),
                "logit_bias",
                "{j}"
            );
        }
    }

    #[test]
    fn native_fields_are_checked() {
        let f = fields(&body(r#"{"n_predict": -1, "return_tokens": true}"#)).unwrap();
        assert_eq!(
            (f.n_predict, f.return_tokens, f.cache_prompt),
            (None, true, true)
        );
        let f = fields(&body(r#"{"max_tokens": 3, "stop": ["a","b","c","d","e"]}"#)).unwrap();
        assert_eq!((f.n_predict, f.stop.len()), (Some(3), 5));
        for (j, name) in [
            (r#"{"n_predict": 0}"#, "n_predict"),
            (r#"{"n_predict": -2}"#, "n_predict"),
            (r#"{"n_probs": 101}"#, "n_probs"),
            (r#"{"id_slot": -5}"#, "id_slot"),
            (r#"{"samplers": ["top_k", "magic"]}"#, "samplers"),
            (r#"{"stop": [""]}"#, "stop"),
            (r#"{"return_tokens": 1}"#, "return_tokens"),
        ] {
            assert_eq!(param(fields(&body(j))), name, "{j}");
        }
    }

    #[test]
    fn response_fields_pick_nested_values() {
        let v = serde_json::json!({"content": "x", "generation_settings": {"n_predict": 3}});
        let got = select_fields(
            &v,
            &[
                "content".into(),
                "generation_settings/n_predict".into(),
                "nope".into(),
            ],
        );
        assert_eq!(
            got,
            serde_json::json!({"content": "x", "generation_settings/n_predict": 3})
        );
    }

    /// A constraint that allows only even tokens.
    struct Even;
    impl TokenConstraint for Even {
        fn allows(&mut self, t: u32) -> bool {
            t.is_multiple_of(2)
        }
        fn mask(&mut self, l: &mut [f32]) -> Result<(), String> {
            for (i, x) in l.iter_mut().enumerate() {
                if !i.is_multiple_of(2) {
                    *x = f32::MIN;
                }
            }
            Ok(())
        }
        fn commit(&mut self, _: u32) -> Result<(), String> {
            Ok(())
        }
        fn is_complete(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_bias_masks_exactly_and_keeps_the_inner_constraint() {
        let mut c = Biased::new(Some(Box::new(Even)), vec![(0, f32::NEG_INFINITY), (2, 1.5)]);
        assert!(!c.allows(2), "a bias always takes the masked path");
        let mut l = vec![0.0; 4];
        c.mask(&mut l).unwrap();
        assert_eq!(l, [f32::MIN, f32::MIN, 1.5, f32::MIN]);
        let mut plain = Biased::new(Some(Box::new(Even)), Vec::new());
        assert!(plain.allows(2) && !plain.allows(3));
    }
}
