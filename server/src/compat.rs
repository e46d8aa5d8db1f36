//! Other APIs' request bodies rewritten as chat-completion bodies, so that qkv-server
//! answers them through its one chat path: Anthropic's Messages API
//! ([`anthropic_to_chat`], for `POST /v1/messages` and `/v1/messages/count_tokens`) and
//! OpenAI's Responses API ([`responses_to_chat`], for `POST /v1/responses`).
//!
//! A field of the wrong shape is a 400 naming it in the caller's own spelling
//! (`messages[1].content[0].type`, `stop_sequences`, `input[2]`); an image is an
//! [`ApiError`] of status 500 that says the model reads no images, as llama-server answers it.
//! The chat path then checks what the two have in common (sampling ranges, tool schemas).
//!
//! ```
//! use qkv_server::compat::anthropic_to_chat;
//! use qkv_server::body::Body;
//!
//! let b = Body::parse(br#"{"model": "x", "max_tokens": 8, "system": "Be brief.",
//!     "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
//!     "stop_sequences": ["\n"]}"#)?;
//! let chat = anthropic_to_chat(&b)?;
//! assert_eq!(chat["messages"][0]["role"], "system");
//! assert_eq!(chat["messages"][1]["content"], "Hi");
//! assert_eq!(chat["stop"][0], "\n");
//! # Ok::<(), qkv_server::error::ApiError>(())
//! ```

use crate::body::Body;
use crate::error::ApiError;
use axum::http::StatusCode;
use serde_json::{json, Map, Value};

/// The error of an image given to a model that reads none (status 500, as llama-server).
fn no_images(param: &str) -> ApiError {
    ApiError {
        param: Some(param.to_owned()),
        ..ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "image input is not supported: this model reads text only",
        )
    }
}

/// The text of Anthropic text blocks (a string, or a list of `{"type": "text"}` blocks).
fn text_of(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (i, b) in blocks.iter().enumerate() {
                let at = format!("{param}[{i}]");
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => out.push_str(
                        b.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| ApiError::invalid(&at, "a text block needs `text`"))?,
                    ),
                    Some("image") => return Err(no_images(&at)),
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{at}.type"),
                            "only text blocks are supported here",
                        ))
                    }
                }
            }
            Ok(out)
        }
        Value::Null => Ok(String::new()),
        v => Err(ApiError::invalid(
            param,
            format!("must be a string or a list of text blocks, got {v}"),
        )),
    }
}

/// Anthropic message `i` as chat messages: the assistant's `tool_use` blocks become
/// `tool_calls` and its `thinking` blocks `reasoning_content`; a user's `tool_result`
/// blocks become `tool` messages (before the user's own text).
fn anthropic_message(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(&format!("{at}.role"), "`role` must be a string"))?;
    if role != "user" && role != "assistant" {
        return Err(ApiError::invalid(
            &format!("{at}.role"),
            format!("`role` must be `user` or `assistant`, got `{role}`"),
        ));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        other => {
            return Err(ApiError::invalid(
                &format!("{at}.content"),
                format!(
                    "`content` must be a string or a list of blocks, got {}",
                    other.unwrap_or(&Value::Null)
                ),
            ))
        }
    };
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for (k, b) in blocks.iter().enumerate() {
        let bat = format!("{at}.content[{k}]");
        let field = |f: &str| format!("{bat}.{f}");
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        match (kind, role) {
            ("text", _) => text.push_str(
                b.get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(&field("text"), "`text` must be a string"))?,
            ),
            ("image", _) => return Err(no_images(&bat)),
            ("thinking", "assistant") => {
                reasoning.push_str(b.get("thinking").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid(&field("thinking"), "`thinking` must be a string")
                })?)
            }
            ("redacted_thinking", "assistant") => {}
            ("tool_use", "assistant") => {
                let id = b
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(&field("id"), "`id` must be a string"))?;
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(&field("name"), "`name` must be a string"))?;
                let input = match b.get("input") {
                    None | Some(Value::Null) => json!({}),
                    Some(v @ Value::Object(_)) => v.clone(),
                    Some(v) => {
                        return Err(ApiError::invalid(
                            &field("input"),
                            format!("`input` must be an object, got {v}"),
                        ))
                    }
                };
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("tool_result", "user") => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::invalid(&field("tool_use_id"), "`tool_use_id` must be a string")
                    })?;
                let content = text_of(b.get("content").unwrap_or(&Value::Null), &field("content"))?;
                let error = match b.get("is_error") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(e)) => *e,
                    Some(_) => {
                        return Err(ApiError::invalid(
                            &field("is_error"),
                            "`is_error` must be a boolean",
                        ))
                    }
                };
                let content = if error {
                    format!("Error: {content}")
                } else {
                    content
                };
                results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            _ => {
                return Err(ApiError::invalid(
                    &field("type"),
                    format!("a `{role}` message cannot hold a `{kind}` block"),
                ))
            }
        }
    }
    out.extend(results);
    if role == "assistant" {
        let mut msg = Map::new();
        msg.insert("role".into(), json!("assistant"));
        msg.insert("content".into(), json!(text));
        if !reasoning.is_empty() {
            msg.insert("reasoning_content".into(), json!(reasoning));
        }
        if !calls.is_empty() {
            msg.insert("tool_calls".into(), json!(calls));
        }
        out.push(Value::Object(msg));
    } else if !text.is_empty() || blocks.is_empty() {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

/// Copies the fields both APIs spell alike from `b` into `out`.
fn copy(b: &Body, out: &mut Map<String, Value>, keys: &[&str]) {
    for k in keys {
        if let Some(v) = b.field(k) {
            out.insert((*k).into(), v.clone());
        }
    }
}

/// An Anthropic Messages request as a chat-completion body: `system` first, each message's
/// blocks translated (`tool_use`, `tool_result`, `thinking`), `max_tokens`, `stop_sequences` as `stop`,
/// the samplers, `tools` (`input_schema` as `parameters`) and `tool_choice` (`any` as
/// `required`, `{"type": "tool"}` as a named function, `disable_parallel_tool_use`), and
/// `stream` (with the usage chunk asked for), `output_config.format` (a JSON schema) as
/// `response_format`. `thinking` and `metadata` are checked and
/// otherwise left to the template. An empty `messages` list is one empty user turn, as
/// llama-server takes it.
pub fn anthropic_to_chat(b: &Body) -> Result<Value, ApiError> {
    let mut messages = Vec::new();
    if let Some(s) = b.field("system") {
        let text = text_of(s, "system")?;
        messages.push(json!({"role": "system", "content": text}));
    }
    let list = b
        .required("messages")?
        .as_array()
        .ok_or_else(|| ApiError::invalid("messages", "`messages` must be a list"))?;
    for (i, m) in list.iter().enumerate() {
        anthropic_message(i, m, &mut messages)?;
    }
    if !messages.iter().any(|m| m["role"] != "system") {
        messages.push(json!({"role": "user", "content": ""}));
    }
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(messages));
    copy(
        b,
        &mut out,
        &[
            "model",
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "repeat_penalty",
        ],
    );
    if let Some(s) = b.field("stop_sequences") {
        out.insert("stop".into(), s.clone());
    }
    if b.bool("stream", false)? {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(m) = b.field("metadata") {
        if !m.is_object() {
            return Err(ApiError::invalid(
                "metadata",
                "`metadata` must be an object",
            ));
        }
    }
    if let Some(t) = b.field("thinking") {
        let kind = t.get("type").and_then(Value::as_str);
        if !matches!(
            kind,
            Some("enabled" | "disabled" | "adaptive" | "between_tools")
        ) {
            return Err(ApiError::invalid(
                "thinking.type",
                "`thinking.type` must be `enabled`, `disabled`, `adaptive` or `between_tools`",
            ));
        }
    }
    if let Some(f) = b.field("output_config").and_then(|o| o.get("format")) {
        if f.is_null() {
        } else if f.get("type").and_then(Value::as_str) != Some("json_schema") {
            return Err(ApiError::invalid(
                "output_config.format.type",
                "`type` must be `json_schema`",
            ));
        } else {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"schema": f.get("schema")}}),
            );
        }
    }
    if let Some(tools) = b.field("tools") {
        let tools = tools
            .as_array()
            .ok_or_else(|| ApiError::invalid("tools", "`tools` must be a list"))?;
        let mut fns = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            let kind = t.get("type").and_then(Value::as_str);
            if !matches!(kind, None | Some("custom")) {
                return Err(ApiError::invalid(
                    &format!("tools[{i}].type"),
                    format!(
                        "server tools (`{}`) are not supported; give client tools with `input_schema`",
                        kind.unwrap_or("")
                    ),
                ));
            }
            let mut f = Map::new();
            f.insert("name".into(), t.get("name").cloned().unwrap_or(Value::Null));
            if let Some(d) = t.get("description") {
                f.insert("description".into(), d.clone());
            }
            f.insert(
                "parameters".into(),
                t.get("input_schema").cloned().unwrap_or(Value::Null),
            );
            if let Some(s) = t.get("strict") {
                f.insert("strict".into(), s.clone());
            }
            fns.push(json!({"type": "function", "function": f}));
        }
        out.insert("tools".into(), Value::Array(fns));
    }
    if let Some(c) = b.field("tool_choice") {
        let kind = c.get("type").and_then(Value::as_str);
        let choice = match kind {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => {
                let name = c.get("name").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid("tool_choice.name", "`name` must be a string")
                })?;
                json!({"type": "function", "function": {"name": name}})
            }
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    "`tool_choice.type` must be `auto`, `any`, `tool` or `none`",
                ))
            }
        };
        out.insert("tool_choice".into(), choice);
        match c.get("disable_parallel_tool_use") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(d)) => {
                out.insert("parallel_tool_calls".into(), json!(!d));
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "tool_choice.disable_parallel_tool_use",
                    "must be a boolean",
                ))
            }
        }
    }
    Ok(Value::Object(out))
}

/// A chat-path error renamed into the Anthropic request's spelling (`stop` is
/// `stop_sequences`, a tool's `function.parameters` is its `input_schema`).
pub fn anthropic_param(param: &str) -> String {
    if param == "stop" {
        return "stop_sequences".into();
    }
    if param.starts_with("response_format") {
        return "output_config.format.schema".into();
    }
    if let Some(rest) = param.strip_prefix("tools[") {
        if let Some((i, tail)) = rest.split_once(']') {
            let tail = tail
                .replace(".function.parameters", ".input_schema")
                .replace(".function.", ".");
            return format!("tools[{i}]{tail}");
        }
    }
    if let Some(rest) = param.strip_prefix("tool_choice.function.") {
        return format!("tool_choice.{rest}");
    }
    param.to_owned()
}

/// Text of a Responses API content list (`input_text` / `output_text` / `text` parts) or a
/// string.
fn responses_text(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                let at = format!("{param}[{i}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        out.push_str(p.get("text").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::invalid(&format!("{at}.text"), "`text` must be a string")
                        })?)
                    }
                    Some("input_image") => return Err(no_images(&at)),
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{at}.type"),
                            "only text parts are supported",
                        ))
                    }
                }
            }
            Ok(out)
        }
        v => Err(ApiError::invalid(
            param,
            format!("must be a string or a list of parts, got {v}"),
        )),
    }
}

/// A Responses API request as a chat-completion body: `instructions` as the system message,
/// `input` (a string, or a list of messages and of `function_call` /
/// `function_call_output` items), `max_output_tokens`, the samplers, function `tools`,
/// `tool_choice`, `text.format` as `response_format`, and `stream` (with the usage chunk).
/// `previous_response_id` is refused: the server keeps no responses.
pub fn responses_to_chat(b: &Body) -> Result<Value, ApiError> {
    if b.field("previous_response_id").is_some() {
        return Err(ApiError::invalid(
            "previous_response_id",
            "responses are not stored: send the whole conversation in `input`",
        ));
    }
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(responses_messages(b)?));
    copy(
        b,
        &mut out,
        &[
            "model",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "parallel_tool_calls",
        ],
    );
    if let Some(n) = b.field("max_output_tokens") {
        out.insert("max_tokens".into(), n.clone());
    }
    if b.bool("stream", false)? {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(tools) = b.field("tools") {
        out.insert("tools".into(), responses_tools(tools)?);
    }
    if let Some(c) = b.field("tool_choice") {
        out.insert("tool_choice".into(), responses_tool_choice(c)?);
    }
    if let Some(format) = b.field("text").and_then(|t| t.get("format")) {
        out.insert("response_format".into(), responses_format(format)?);
    }
    Ok(Value::Object(out))
}

/// `instructions` and `input` as chat messages; at least one that is not the system's.
fn responses_messages(b: &Body) -> Result<Vec<Value>, ApiError> {
    let mut messages = Vec::new();
    if let Some(i) = b.str("instructions")? {
        messages.push(json!({"role": "system", "content": i}));
    }
    match b.required("input")? {
        Value::String(s) => messages.push(json!({"role": "user", "content": s})),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                push_input_item(&mut messages, item, &format!("input[{i}]"))?;
            }
        }
        v => {
            return Err(ApiError::invalid(
                "input",
                format!("`input` must be a string or a list of items, got {v}"),
            ))
        }
    }
    if !messages.iter().any(|m| m["role"] != "system") {
        return Err(ApiError::invalid("input", "`input` holds no message"));
    }
    Ok(messages)
}

/// One `input` item (at `at`) as chat messages: a message, a `function_call` (consecutive
/// calls make one assistant turn) or a `function_call_output`.
fn push_input_item(messages: &mut Vec<Value>, item: &Value, at: &str) -> Result<(), ApiError> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match kind {
        "message" => {
            let role = item.get("role").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(&format!("{at}.role"), "`role` must be a string")
            })?;
            let role = match role {
                "developer" => "system",
                "user" | "assistant" | "system" => role,
                r => {
                    return Err(ApiError::invalid(
                        &format!("{at}.role"),
                        format!("unknown role `{r}`"),
                    ))
                }
            };
            let content = responses_text(
                item.get("content").unwrap_or(&Value::Null),
                &format!("{at}.content"),
            )?;
            messages.push(json!({"role": role, "content": content}));
        }
        "function_call" => {
            let get = |k: &str| {
                item.get(k)
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(&format!("{at}.{k}"), "must be a string"))
            };
            let call = json!({"id": get("call_id")?, "type": "function",
                "function": {"name": get("name")?, "arguments": get("arguments")?}});
            // Consecutive calls make one assistant turn.
            match messages.last_mut() {
                Some(m) if m["role"] == "assistant" && m.get("tool_calls").is_some() => {
                    if let Some(a) = m["tool_calls"].as_array_mut() {
                        a.push(call);
                    }
                }
                _ => {
                    messages.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}))
                }
            }
        }
        "function_call_output" => {
            let id = item
                .get("call_id")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid(&format!("{at}.call_id"), "must be a string"))?;
            let output = responses_text(
                item.get("output").unwrap_or(&Value::Null),
                &format!("{at}.output"),
            )?;
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
        }
        k => {
            return Err(ApiError::invalid(
                &format!("{at}.type"),
                format!("`{k}` items are not supported"),
            ))
        }
    }
    Ok(())
}

/// Responses' function `tools` in the chat shape.
fn responses_tools(tools: &Value) -> Result<Value, ApiError> {
    let tools = tools
        .as_array()
        .ok_or_else(|| ApiError::invalid("tools", "`tools` must be a list"))?;
    let mut fns = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid(
                &format!("tools[{i}].type"),
                "only `function` tools are supported",
            ));
        }
        let mut f = Map::new();
        for k in ["name", "description", "parameters", "strict"] {
            if let Some(v) = t.get(k) {
                f.insert(k.into(), v.clone());
            }
        }
        fns.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(fns))
}

/// Responses' `tool_choice` in the chat shape.
fn responses_tool_choice(c: &Value) -> Result<Value, ApiError> {
    let choice = match c {
        Value::String(_) => c.clone(),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            json!({"type": "function", "function": {"name": o.get("name")}})
        }
        v => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("`tool_choice` must be a string or a function, got {v}"),
            ))
        }
    };
    Ok(choice)
}

/// `text.format` as a chat `response_format`.
fn responses_format(format: &Value) -> Result<Value, ApiError> {
    let rf = match format.get("type").and_then(Value::as_str) {
        Some("text") => json!({"type": "text"}),
        Some("json_object") => json!({"type": "json_object"}),
        Some("json_schema") => json!({"type": "json_schema", "json_schema": {
            "name": format.get("name"), "schema": format.get("schema"),
            "strict": format.get("strict")}}),
        _ => {
            return Err(ApiError::invalid(
                "text.format.type",
                "`type` must be `text`, `json_object` or `json_schema`",
            ))
        }
    };
    Ok(rf)
}

/// A chat-path error renamed into the Responses request's spelling.
pub fn responses_param(param: &str) -> String {
    match param {
        "max_tokens" => "max_output_tokens".into(),
        "messages" => "input".into(),
        p if p.starts_with("response_format") => "text.format".into(),
        p => p.replace(".function.", "."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Body {
        Body::parse(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn anthropic_blocks_become_chat_messages() {
        let chat = anthropic_to_chat(&body(json!({
            "max_tokens": 10,
            "system": [{"type": "text", "text": "S"}],
            "messages": [
                {"role": "user", "content": "What's the weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Look it up.", "signature": ""},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "Here:"},
                    {"type": "tool_result", "tool_use_id": "t1", "is_error": true,
                     "content": [{"type": "text", "text": "no city"}]}]}
            ],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stream": true
        })))
        .unwrap();
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m[0], json!({"role": "system", "content": "S"}));
        assert_eq!(m[2]["reasoning_content"], "Look it up.");
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Paris"}"#
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "t1", "content": "Error: no city"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "Here:"}));
        assert_eq!(chat["tools"][0]["function"]["parameters"]["type"], "object");
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(chat["stream_options"]["include_usage"], true);
    }

    #[test]
    fn anthropic_faults_name_their_field() {
        for (v, name, status) in [
            (json!({}), "messages", 400),
            (json!({"messages": "x"}), "messages", 400),
            (
                json!({"messages": [{"role": "system", "content": "x"}]}),
                "messages[0].role",
                400,
            ),
            (
                json!({"messages": [{"role": "user", "content": 3}]}),
                "messages[0].content",
                400,
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use"}]}]}),
                "messages[0].content[0].type",
                400,
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages[0].content[0]",
                500,
            ),
            (
                json!({"messages": [], "tool_choice": {"type": "x"}}),
                "tool_choice.type",
                400,
            ),
            (
                json!({"messages": [], "thinking": {"type": "x"}}),
                "thinking.type",
                400,
            ),
            (
                json!({"messages": [], "tools": [{"type": "web_search_20250305"}]}),
                "tools[0].type",
                400,
            ),
            (json!({"messages": [], "system": 3}), "system", 400),
        ] {
            let e = anthropic_to_chat(&body(v.clone()))
                .err()
                .unwrap_or_else(|| panic!("{v}"));
            assert_eq!(e.param.as_deref(), Some(name), "{v}");
            assert_eq!(e.status.as_u16(), status, "{v}");
        }
        // An empty conversation is one empty user turn.
        let chat = anthropic_to_chat(&body(json!({"messages": []}))).unwrap();
        assert_eq!(chat["messages"], json!([{"role": "user", "content": ""}]));
        assert_eq!(
            anthropic_param("tools[2].function.parameters"),
            "tools[2].input_schema"
        );
        assert_eq!(anthropic_param("stop"), "stop_sequences");
    }

    #[test]
    fn responses_input_becomes_chat_messages() {
        let chat = responses_to_chat(&body(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "D"},
                {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "42"}
            ],
            "max_output_tokens": 8,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
        })))
        .unwrap();
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m[1], json!({"role": "system", "content": "D"}));
        assert_eq!(m[3]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(m[4]["role"], "tool");
        assert_eq!(chat["max_tokens"], 8);
        assert_eq!(
            chat["response_format"]["json_schema"]["schema"]["type"],
            "object"
        );
        assert_eq!(chat["tools"][0]["function"]["name"], "f");
        for (v, name) in [
            (json!({}), "input"),
            (json!({"input": 3}), "input"),
            (
                json!({"input": [{"role": "bot", "content": "x"}]}),
                "input[0].role",
            ),
            (
                json!({"input": [{"type": "web_search_call"}]}),
                "input[0].type",
            ),
            (
                json!({"input": "x", "previous_response_id": "r"}),
                "previous_response_id",
            ),
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"input": "x", "text": {"format": {"type": "xml"}}}),
                "text.format.type",
            ),
        ] {
            let e = responses_to_chat(&body(v.clone()))
                .err()
                .unwrap_or_else(|| panic!("{v}"));
            assert_eq!(e.param.as_deref(), Some(name), "{v}");
        }
    }
}
