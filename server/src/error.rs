//! The error every route answers with, in OpenAI's shape: `{"error": {"message", "type",
//! "param", "code"}}`, with the HTTP status it goes with. Engine errors map onto it
//! (a full queue is a 429, a prompt past the context a 400 naming `messages`, …).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

/// An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status answered.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// The request field at fault, when there is one (`messages[2].role`, say).
    pub param: Option<String>,
    /// OpenAI's machine-readable code, when one applies (`context_length_exceeded`, …).
    pub code: Option<&'static str>,
    /// The error's `type`, when it is not the one its status implies
    /// (`exceed_context_size_error`, as llama-server names a prompt past the context).
    pub kind: Option<&'static str>,
    /// More fields of the error object (`n_prompt_tokens`, `n_ctx`).
    pub extra: Option<Box<Map<String, Value>>>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)?;
        if let Some(p) = &self.param {
            write!(f, " (param `{p}`)")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_owned()),
            code: None,
            kind: None,
            extra: None,
        }
    }

    /// An error of `status` with no parameter named.
    pub fn status(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            kind: None,
            extra: None,
        }
    }

    /// A 400 for a prompt of `n_prompt_tokens` that does not fit a context of `n_ctx`
    /// positions: type `exceed_context_size_error` with both numbers, as llama-server
    /// answers, and OpenAI's code `context_length_exceeded`.
    pub fn exceeds_context(n_prompt_tokens: usize, n_ctx: usize) -> ApiError {
        let mut e = ApiError::invalid(
            "messages",
            format!(
                "the request exceeds the available context size: {n_prompt_tokens} prompt \
                 tokens, {n_ctx} positions per sequence"
            ),
        )
        .with_code("context_length_exceeded");
        e.kind = Some("exceed_context_size_error");
        let mut extra = Map::new();
        extra.insert("n_prompt_tokens".into(), json!(n_prompt_tokens));
        extra.insert("n_ctx".into(), json!(n_ctx));
        e.extra = Some(Box::new(extra));
        e
    }

    /// A 401 (`authentication_error`, code `invalid_api_key`), as OpenAI answers a missing
    /// or wrong key.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::status(StatusCode::UNAUTHORIZED, message).with_code("invalid_api_key")
    }

    fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }
}

impl From<qkv::Error> for ApiError {
    fn from(e: qkv::Error) -> ApiError {
        use qkv::Error as E;
        match &e {
            E::QueueFull { .. } => ApiError::status(StatusCode::TOO_MANY_REQUESTS, e.to_string())
                .with_code("queue_full"),
            E::ContextFull { needed, capacity } => ApiError::exceeds_context(*needed, *capacity),
            E::TokenOutOfRange { .. }
            | E::Config(_)
            | E::Shape(_)
            | E::ChatTemplate { .. }
            | E::SlotState(_)
            | E::Slot { .. } => ApiError::status(StatusCode::BAD_REQUEST, e.to_string()),
            // The engine thread gone, or no memory for this request's cache now.
            E::Unsupported(_) | E::AllocationRefused { .. } => {
                ApiError::status(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
            _ => ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status.as_u16() {
            400 | 404 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            429 => "rate_limit_error",
            503 => "unavailable_error",
            _ => "server_error",
        };
        let mut error = json!({
            "message": self.message,
            "type": self.kind.unwrap_or(kind),
            "param": self.param,
            "code": self.code,
        });
        if let (Value::Object(o), Some(extra)) = (&mut error, self.extra) {
            o.extend(*extra);
        }
        let body = json!({ "error": error });
        (self.status, axum::Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_openai_statuses() {
        let full = ApiError::from(qkv::Error::QueueFull { capacity: 1 });
        assert_eq!((full.status.as_u16(), full.code), (429, Some("queue_full")));
        let ctx = ApiError::from(qkv::Error::ContextFull {
            needed: 9,
            capacity: 8,
        });
        assert_eq!(ctx.code, Some("context_length_exceeded"));
        assert_eq!(ctx.kind, Some("exceed_context_size_error"));
        assert_eq!(
            (
                ctx.extra.as_ref().unwrap()["n_prompt_tokens"].as_u64(),
                ctx.extra.as_ref().unwrap()["n_ctx"].as_u64()
            ),
            (Some(9), Some(8))
        );
        assert_eq!(ctx.param.as_deref(), Some("messages"));
        let memory = ApiError::from(qkv::Error::AllocationRefused {
            what: "KV cache".into(),
            bytes: 1 << 40,
        });
        assert_eq!(memory.status.as_u16(), 503);
    }
}
