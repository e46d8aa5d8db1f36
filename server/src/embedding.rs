//! The `/v1/embeddings` body, read as [`crate::request`] reads the others (a wrong type or
//! value is an [`ApiError`] naming the field), the base64 form of an embedding, and how a
//! generative model's hidden states are pooled into one ([`Pooling`], [`pool`]).
//!
//! ```
//! use qkv_server::embedding::{base64_f32, fields, Format, Input};
//! use qkv_server::body::Body;
//!
//! let b = Body::parse(br#"{"input": ["a cat", "a dog"], "encoding_format": "base64"}"#)?;
//! let f = fields(&b)?;
//! assert_eq!(f.input, Input::Texts(vec!["a cat".into(), "a dog".into()]));
//! assert_eq!(f.format, Format::Base64);
//! // Little-endian f32 bytes: 1.0 is 00 00 80 3f.
//! assert_eq!(base64_f32(&[1.0]), "AACAPw==");
//! let bad = Body::parse(br#"{"input": []}"#)?;
//! assert_eq!(fields(&bad).err().unwrap().param.as_deref(), Some("input"));
//! # Ok::<(), qkv_server::error::ApiError>(())
//! ```

use crate::body::Body;
use crate::error::ApiError;
use serde_json::Value;

/// Most inputs one request may hold (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// What to embed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Texts, each tokenized as sentence-transformers tokenizes it.
    Texts(Vec<String>),
    /// Token id sequences, each run as given (its special tokens included).
    Ids(Vec<Vec<u32>>),
}

impl Input {
    /// How many embeddings the request asks for.
    pub fn len(&self) -> usize {
        match self {
            Input::Texts(t) => t.len(),
            Input::Ids(s) => s.len(),
        }
    }

    /// True when there is nothing to embed (never so for what [`fields`] returns).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How embeddings are written in the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A JSON array of numbers.
    Float,
    /// The little-endian f32 bytes, in standard base64 (with padding).
    Base64,
}

/// The fields of an embeddings request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    /// `input`: a string, a list of strings, a list of token ids, or a list of lists of ids.
    pub input: Input,
    /// `encoding_format`: `float` (the default) or `base64`.
    pub format: Format,
    /// `dimensions`, when given (the server accepts only the model's own).
    pub dimensions: Option<usize>,
}

/// A token id list (`what` names it in errors); `None` when `v` is not a list of numbers.
fn ids(v: &[Value], what: &str) -> Result<Vec<u32>, ApiError> {
    if v.is_empty() {
        return Err(ApiError::invalid(
            what,
            format!("`{what}` is an empty list"),
        ));
    }
    v.iter()
        .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| {
            ApiError::invalid(
                what,
                format!("`{what}` must hold token ids (integers from 0 to 2^32 − 1)"),
            )
        })
}

/// Reads `input`, `encoding_format` and `dimensions` (`model` may be any string, `user` is
/// ignored). Errors are 400s naming the field: `input` missing, empty, of another type,
/// or with more than [`MAX_INPUTS`] items; `input[i]` for an empty string or list or an item
/// of another kind than the first; `encoding_format` other than `float` or `base64`;
/// `dimensions` that is not a positive integer.
pub fn fields(b: &Body) -> Result<Fields, ApiError> {
    b.str("model")?;
    b.str("user")?;
    let input = match b.required("input")? {
        Value::String(s) if s.is_empty() => {
            return Err(ApiError::invalid("input", "`input` is an empty string"))
        }
        Value::String(s) => Input::Texts(vec![s.clone()]),
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::invalid("input", "`input` is an empty list"))
        }
        Value::Array(items) if items.len() > MAX_INPUTS => {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "`input` holds {} items; at most {MAX_INPUTS} per request",
                    items.len()
                ),
            ))
        }
        Value::Array(items) => match &items[0] {
            Value::String(_) => {
                let mut texts = Vec::with_capacity(items.len());
                for (i, v) in items.iter().enumerate() {
                    let what = format!("input[{i}]");
                    match v {
                        Value::String(s) if s.is_empty() => {
                            return Err(ApiError::invalid(&what, format!("`{what}` is empty")))
                        }
                        Value::String(s) => texts.push(s.clone()),
                        _ => {
                            return Err(ApiError::invalid(
                                &what,
                                format!("`{what}` must be a string like the first item"),
                            ))
                        }
                    }
                }
                Input::Texts(texts)
            }
            Value::Array(_) => {
                let mut seqs = Vec::with_capacity(items.len());
                for (i, v) in items.iter().enumerate() {
                    let what = format!("input[{i}]");
                    match v {
                        Value::Array(a) => seqs.push(ids(a, &what)?),
                        _ => {
                            return Err(ApiError::invalid(
                                &what,
                                format!("`{what}` must be a list of token ids like the first item"),
                            ))
                        }
                    }
                }
                Input::Ids(seqs)
            }
            Value::Number(_) => Input::Ids(vec![ids(items, "input")?]),
            v => {
                return Err(ApiError::invalid(
                    "input[0]",
                    format!("`input[0]` must be a string, a token id or a list of ids, got {v}"),
                ))
            }
        },
        v => {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "`input` must be a string, a list of strings, a list of token ids or a \
                     list of lists of token ids, got {v}"
                ),
            ))
        }
    };
    let format = format(b)?;
    let dimensions = match b.uint("dimensions", u32::MAX as u64)? {
        Some(0) => {
            return Err(ApiError::invalid(
                "dimensions",
                "`dimensions` must be at least 1",
            ))
        }
        d => d.map(|d| d as usize),
    };
    Ok(Fields {
        input,
        format,
        dimensions,
    })
}

/// `encoding_format`: `float` (the default) or `base64`; a 400 naming it otherwise.
pub fn format(b: &Body) -> Result<Format, ApiError> {
    match b.str("encoding_format")? {
        None | Some("float") => Ok(Format::Float),
        Some("base64") => Ok(Format::Base64),
        Some(other) => Err(ApiError::invalid(
            "encoding_format",
            format!("`encoding_format` must be \"float\" or \"base64\", got {other:?}"),
        )),
    }
}

/// `v`'s little-endian f32 bytes in standard base64 with padding, as OpenAI writes an
/// embedding when asked for `encoding_format: "base64"` (numpy's `frombuffer(…, "<f4")`
/// reads it back).
pub fn base64_f32(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64(&bytes)
}

/// Standard base64 (RFC 4648, `+/`, `=` padding).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> shift) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// How a sequence's hidden states become its embedding (`--pooling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's vector, unpooled (llama-server's `/embeddings` only).
    None,
    /// The mean over the tokens.
    Mean,
    /// The first token's.
    Cls,
    /// The last token's (what decoder embedding models such as Qwen3-Embedding use).
    Last,
}

impl Pooling {
    /// Reads `--pooling`: `none`, `mean`, `cls` or `last`.
    pub fn parse(s: &str) -> Result<Pooling, String> {
        match s {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            other => Err(format!(
                "--pooling {other}: give none, mean, cls or last (rank is not served)"
            )),
        }
    }
}

/// Pools `hidden` (`rows` of `dim`) by `pooling`: one vector, or every row for `None`.
pub fn pool(hidden: &[f32], dim: usize, pooling: Pooling) -> Vec<Vec<f32>> {
    let rows: Vec<&[f32]> = hidden.chunks_exact(dim).collect();
    match pooling {
        Pooling::None => rows.iter().map(|r| r.to_vec()).collect(),
        Pooling::Cls => rows.first().map(|r| r.to_vec()).into_iter().collect(),
        Pooling::Last => rows.last().map(|r| r.to_vec()).into_iter().collect(),
        Pooling::Mean => {
            let mut sum = vec![0f64; dim];
            for r in &rows {
                for (s, x) in sum.iter_mut().zip(r.iter()) {
                    *s += f64::from(*x);
                }
            }
            let n = rows.len().max(1) as f64;
            vec![sum.into_iter().map(|s| (s / n) as f32).collect()]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> Result<Fields, ApiError> {
        fields(&Body::parse(json.as_bytes()).unwrap())
    }

    #[test]
    fn every_input_form_is_read() {
        let texts = |v: &[&str]| Input::Texts(v.iter().map(|s| s.to_string()).collect());
        assert_eq!(read(r#"{"input": "hi"}"#).unwrap().input, texts(&["hi"]));
        assert_eq!(
            read(r#"{"input": ["a", "b"]}"#).unwrap().input,
            texts(&["a", "b"])
        );
        assert_eq!(
            read(r#"{"input": [101, 7, 102]}"#).unwrap().input,
            Input::Ids(vec![vec![101, 7, 102]])
        );
        let f = read(r#"{"input": [[1, 2], [3]], "model": "any", "dimensions": 384}"#).unwrap();
        assert_eq!(f.input, Input::Ids(vec![vec![1, 2], vec![3]]));
        assert_eq!((f.format, f.dimensions), (Format::Float, Some(384)));
        let f = read(r#"{"input": "x", "encoding_format": "base64", "user": "u"}"#).unwrap();
        assert_eq!(f.format, Format::Base64);
    }

    #[test]
    fn bad_inputs_name_their_field() {
        let many = format!(
            r#"{{"input": [{}]}}"#,
            vec!["\"a\""; MAX_INPUTS + 1].join(",")
        );
        for (json, name) in [
            (r#"{}"#, "input"),
            (r#"{"input": null}"#, "input"),
            (r#"{"input": ""}"#, "input"),
            (r#"{"input": []}"#, "input"),
            (r#"{"input": 5}"#, "input"),
            (r#"{"input": {"text": "a"}}"#, "input"),
            (r#"{"input": ["a", ""]}"#, "input[1]"),
            (r#"{"input": ["a", 5]}"#, "input[1]"),
            (r#"{"input": [[1], []]}"#, "input[1]"),
            (r#"{"input": [[1], "a"]}"#, "input[1]"),
            (r#"{"input": [[1, -2]]}"#, "input[0]"),
            (r#"{"input": [1, "a"]}"#, "input"),
            (r#"{"input": [4294967296]}"#, "input"),
            (r#"{"input": [true]}"#, "input[0]"),
            (r#"{"input": [null]}"#, "input[0]"),
            (many.as_str(), "input"),
            (
                r#"{"input": "a", "encoding_format": "int8"}"#,
                "encoding_format",
            ),
            (r#"{"input": "a", "encoding_format": 1}"#, "encoding_format"),
            (r#"{"input": "a", "dimensions": 0}"#, "dimensions"),
            (r#"{"input": "a", "dimensions": "8"}"#, "dimensions"),
            (r#"{"input": "a", "model": 1}"#, "model"),
        ] {
            let e = read(json).err().unwrap_or_else(|| panic!("{json} passed"));
            assert_eq!(e.status.as_u16(), 400, "{json}");
            assert_eq!(e.param.as_deref(), Some(name), "{json}: {e}");
        }
    }

    #[test]
    fn base64_is_rfc_4648_of_little_endian_f32() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xfb, 0xff, 0xbf]), "+/+/");
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
    }
}
