//! A request's JSON body, parsed once and read field by field: each accessor names the field
//! at fault in the [`ApiError`] it returns (a 400), never panics.
//!
//! ```
//! use qkv_server::body::Body;
//!
//! let b = Body::parse(br#"{"temperature": 0.5, "stream": true}"#)?;
//! assert_eq!(b.number("temperature", 0.0..=2.0)?, Some(0.5));
//! assert!(b.bool("stream", false)?);
//! let e = b.uint("temperature", 10).err().unwrap();
//! assert_eq!(e.param.as_deref(), Some("temperature"));
//! # Ok::<(), qkv_server::error::ApiError>(())
//! ```

use crate::error::ApiError;
use axum::http::StatusCode;
use serde_json::{Map, Value};

/// The parsed body, with typed accessors that name the field at fault.
pub struct Body(Map<String, Value>);

impl Body {
    /// Parses a JSON object; a 400 otherwise.
    pub fn parse(bytes: &[u8]) -> Result<Body, ApiError> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(m)) => Ok(Body(m)),
            Ok(_) => Err(ApiError::status(
                StatusCode::BAD_REQUEST,
                "the body must be a JSON object",
            )),
            Err(e) => Err(ApiError::status(
                StatusCode::BAD_REQUEST,
                format!("the body is not valid JSON: {e}"),
            )),
        }
    }

    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    /// The body without the fields `keys` (to read the rest with another route's rules).
    pub fn without(&self, keys: &[&str]) -> Body {
        let mut m = self.0.clone();
        for k in keys {
            m.remove(*k);
        }
        Body(m)
    }

    /// A field, `None` when absent or null.
    pub fn field(&self, k: &str) -> Option<&Value> {
        self.get(k)
    }

    /// A field that must be present.
    pub fn required(&self, k: &str) -> Result<&Value, ApiError> {
        self.get(k)
            .ok_or_else(|| ApiError::invalid(k, format!("`{k}` is required")))
    }

    /// An optional boolean, `default` when absent or null.
    pub fn bool(&self, k: &str, default: bool) -> Result<bool, ApiError> {
        match self.get(k) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be a boolean, got {v}"))),
        }
    }

    /// An optional number, which must lie in `range`.
    pub fn number(
        &self,
        k: &str,
        range: std::ops::RangeInclusive<f64>,
    ) -> Result<Option<f64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if range.contains(&x) => Ok(Some(x)),
                _ => Err(ApiError::invalid(
                    k,
                    format!(
                        "`{k}` must be a number in [{}, {}], got {v}",
                        range.start(),
                        range.end()
                    ),
                )),
            },
        }
    }

    /// An optional non-negative integer, at most `max`.
    pub fn uint(&self, k: &str, max: u64) -> Result<Option<u64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(x) if x <= max => Ok(Some(x)),
                _ => Err(ApiError::invalid(
                    k,
                    format!("`{k}` must be an integer in [0, {max}], got {v}"),
                )),
            },
        }
    }

    /// An optional string.
    pub fn str(&self, k: &str) -> Result<Option<&str>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be a string, got {v}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_that_are_not_json_objects_are_400s() {
        for bytes in [
            &b"not json"[..],
            b"[1, 2]",
            b"\"text\"",
            b"",
            b"{\"a\": ",
            b"\xff\xfe",
        ] {
            let e = Body::parse(bytes).err().unwrap();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert_eq!(e.param, None);
        }
        assert!(Body::parse(b"{}").is_ok());
    }
}
