//! Tool calls: the request's `tools`, `tool_choice` and `parallel_tool_calls`
//! ([`tool_request`]), the Lark grammar that forces a call in the model family's own format
//! when the choice is `required` or a named function ([`ToolRequest::forced_grammar`]), and
//! the calls parsed out of a reply ([`parse_reply`]), with Qwen3-style `<think>…</think>`
//! split off as reasoning.
//!
//! Formats ([`ToolFormat`], picked from the chat template): Hermes / Qwen2.5 / Qwen3
//! (`<tool_call>{"name": …, "arguments": …}</tool_call>`), Llama 3.x (a bare
//! `{"name": …, "parameters": …}`, after `<|python_tag|>` or not), Mistral
//! (`[TOOL_CALLS][{"name": …, "arguments": …}]`, or the newer `[TOOL_CALLS]name[ARGS]{…}`),
//! and a generic JSON fallback (`{"tool_calls": [{"name": …, "arguments": …}]}`).
//!
//! ```
//! use qkv_server::tools::{parse_reply, ToolFormat};
//!
//! let names = ["get_weather".to_owned()];
//! let r = parse_reply(
//!     ToolFormat::Hermes,
//!     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
//!     &names,
//! );
//! assert_eq!(r.calls[0].name, "get_weather");
//! assert_eq!(r.calls[0].arguments, r#"{"city":"Oslo"}"#);
//! assert_eq!(r.content, "");
//! ```

use crate::body::Body;
use crate::error::ApiError;
use serde_json::{json, Map, Value};

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name", "arguments"}</tool_call>`: Hermes, Qwen2.5, Qwen3.
    Hermes,
    /// A bare `{"name", "parameters"}` object: Llama 3.x.
    Llama3,
    /// `[TOOL_CALLS][{"name", "arguments"}, …]`: Mistral.
    Mistral,
    /// `{"tool_calls": [{"name", "arguments"}, …]}`: any other model.
    Generic,
}

impl ToolFormat {
    /// The format a chat template's model was trained on, from the markers it writes.
    pub fn from_template(template: Option<&str>) -> ToolFormat {
        let t = template.unwrap_or("");
        if t.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if t.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if t.contains("<|python_tag|>") || t.contains("ipython") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    /// The key a call's arguments go under.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }
}

/// Special tokens that are part of a reply's markup (kept in the text the parser reads even
/// though special tokens are otherwise dropped from replies).
pub const MARKUP_TOKENS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_tag|>",
    "<think>",
    "</think>",
];

/// A function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// The JSON schema of its arguments.
    pub parameters: Value,
    /// `function.strict`: the arguments must follow the schema exactly.
    pub strict: bool,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default with tools).
    Auto,
    /// No call: the tools are not shown to the model.
    None,
    /// At least one call.
    Required,
    /// A call of this function.
    Named(String),
}

/// The tool fields of a chat request.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    /// The functions, in order.
    pub tools: Vec<Tool>,
    /// What the model may or must do.
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): more than one call in a reply.
    pub parallel: bool,
}

/// Most calls a forced reply may hold when parallel calls are allowed.
pub const MAX_PARALLEL_CALLS: usize = 4;

/// Reads `tools` (already checked to be a list), `tool_choice` and `parallel_tool_calls`.
/// `None` when no tools are given (a `tool_choice` other than `none` or `auto` is then a
/// 400). Every fault is a 400 naming its field: a tool that is not a function with a name
/// and an object schema, a repeated name, an unknown `tool_choice` or an unknown function in
/// it.
pub fn tool_request(b: &Body, tools: Option<&[Value]>) -> Result<Option<ToolRequest>, ApiError> {
    let parallel = b.bool("parallel_tool_calls", true)?;
    let choice = match b.field("tool_choice") {
        None => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                    "`tool_choice` must be `auto`, `none`, `required` or a function, got `{other}`"
                ),
                ))
            }
        }),
        Some(Value::Object(o)) => {
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    "a named `tool_choice` must have `type: \"function\"`",
                ));
            }
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice.function.name",
                        "the function's name is missing",
                    )
                })?;
            Some(ToolChoice::Named(name.to_owned()))
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("`tool_choice` must be a string or an object, got {v}"),
            ))
        }
    };
    let Some(list) = tools.filter(|t| !t.is_empty()) else {
        return match choice {
            None | Some(ToolChoice::Auto) | Some(ToolChoice::None) => Ok(None),
            Some(_) => Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` asks for a call but no `tools` are given",
            )),
        };
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let field = |k: &str| format!("tools[{i}]{k}");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid(
                &field(".type"),
                "a tool must have `type: \"function\"`",
            ));
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                ApiError::invalid(&field(".function"), "`function` must be an object")
            })?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty() && n.len() <= 64)
            .ok_or_else(|| {
                ApiError::invalid(
                    &field(".function.name"),
                    "`name` must be a non-empty string of at most 64 characters",
                )
            })?;
        if out.iter().any(|t: &Tool| t.name == name) {
            return Err(ApiError::invalid(
                &field(".function.name"),
                format!("two tools are named `{name}`"),
            ));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(v) => {
                return Err(ApiError::invalid(
                    &field(".function.parameters"),
                    format!("`parameters` must be a JSON schema object, got {v}"),
                ))
            }
        };
        let strict = match f.get("strict") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(s)) => *s,
            Some(_) => {
                return Err(ApiError::invalid(
                    &field(".function.strict"),
                    "`strict` must be a boolean",
                ))
            }
        };
        out.push(Tool {
            name: name.to_owned(),
            parameters,
            strict,
        });
    }
    let choice = choice.unwrap_or(ToolChoice::Auto);
    if let ToolChoice::Named(n) = &choice {
        if !out.iter().any(|t| &t.name == n) {
            return Err(ApiError::invalid(
                "tool_choice.function.name",
                format!("no tool is named `{n}`"),
            ));
        }
    }
    Ok(Some(ToolRequest {
        tools: out,
        choice,
        parallel,
    }))
}

impl ToolRequest {
    /// The tools as the chat template reads them (OpenAI's `{"type": "function",
    /// "function": …}` objects), or none when the choice is `none`.
    pub fn template_tools(&self, original: &[Value]) -> Option<Vec<Value>> {
        (self.choice != ToolChoice::None).then(|| original.to_vec())
    }

    /// The Lark grammar (llguidance's dialect) of a reply that is only calls, in `format`:
    /// a call of the named function, or with `required` of any tool (up to
    /// [`MAX_PARALLEL_CALLS`] of them when parallel calls are allowed), each call's arguments
    /// following its function's schema. `None` when the model is free (`auto`, `none`).
    pub fn forced_grammar(&self, format: ToolFormat) -> Option<String> {
        let tools: Vec<&Tool> = match &self.choice {
            ToolChoice::Auto | ToolChoice::None => return None,
            ToolChoice::Required => self.tools.iter().collect(),
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
        };
        let key = format.arguments_key();
        let calls: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, key: t.parameters},
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let one = crate::structured::with_layout(&json!({"anyOf": calls}), false);
        let max = if self.parallel && self.choice == ToolChoice::Required {
            MAX_PARALLEL_CALLS
        } else {
            1
        };
        let list = crate::structured::with_layout(
            &json!({"type": "array", "items": {"anyOf": calls}, "minItems": 1, "maxItems": max}),
            false,
        );
        Some(match format {
            ToolFormat::Hermes => {
                let more = if max > 1 {
                    format!(" (\"\\n\" block){{0,{}}}", max - 1)
                } else {
                    String::new()
                };
                format!(
                    "start: block{more}\nblock: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {one}\n"
                )
            }
            ToolFormat::Llama3 => format!("start: call\ncall: %json {one}\n"),
            ToolFormat::Mistral => format!("start: \"[TOOL_CALLS]\" calls\ncalls: %json {list}\n"),
            ToolFormat::Generic => {
                let wrapper = crate::structured::with_layout(
                    &json!({
                        "type": "object",
                        "properties": {"tool_calls": {"type": "array",
                            "items": {"anyOf": tools.iter().map(|t| json!({
                                "type": "object",
                                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                                "required": ["name", "arguments"],
                                "additionalProperties": false,
                            })).collect::<Vec<_>>()},
                            "minItems": 1, "maxItems": max}},
                        "required": ["tool_calls"],
                        "additionalProperties": false,
                    }),
                    false,
                );
                format!("start: calls\ncalls: %json {wrapper}\n")
            }
        })
    }
}

/// A call parsed out of a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as compact JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// A reply split into its parts.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Reply {
    /// The text meant for the user (without calls and reasoning), trimmed.
    pub content: String,
    /// What the model wrote between `<think>` and `</think>`, trimmed.
    pub reasoning: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ToolCall>,
}

/// Splits `<think>…</think>` off the front of `text`: (reasoning, the rest). A reply cut
/// inside its reasoning is all reasoning; a reply without `<think>` has none.
pub fn split_reasoning(text: &str) -> (Option<String>, &str) {
    let t = text.trim_start();
    let body = t.strip_prefix("<think>");
    match (body, t.find("</think>")) {
        (Some(_), Some(end)) => (
            Some(t["<think>".len()..end].trim().to_owned()),
            &t[end + "</think>".len()..],
        ),
        // Templates that open the think block themselves leave only the closing tag.
        (None, Some(end)) => (
            Some(t[..end].trim().to_owned()),
            &t[end + "</think>".len()..],
        ),
        (Some(b), None) => (Some(b.trim().to_owned()), ""),
        (None, None) => (None, text),
    }
}

/// The first JSON value at the start of `s` (after whitespace) and the bytes it took.
fn json_prefix(s: &str) -> Option<(Value, usize)> {
    let start = s.len() - s.trim_start().len();
    let mut it = serde_json::Deserializer::from_str(&s[start..]).into_iter::<Value>();
    match it.next() {
        Some(Ok(v)) => Some((v, start + it.byte_offset())),
        _ => None,
    }
}

/// A call from a `{"name", "arguments" | "parameters"}` object naming a known tool.
fn call_of(v: &Value, names: &[String]) -> Option<ToolCall> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?;
    if !names.iter().any(|n| n == name) {
        return None;
    }
    let args = o
        .get("arguments")
        .or_else(|| o.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    // Some models write the arguments as a JSON string.
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).unwrap_or(Value::String(s)),
        v => v,
    };
    Some(ToolCall {
        name: name.to_owned(),
        arguments: args.to_string(),
    })
}

/// Every call in a list of call objects; `None` if any is not a known tool's call.
fn calls_of(items: &[Value], names: &[String]) -> Option<Vec<ToolCall>> {
    items.iter().map(|v| call_of(v, names)).collect()
}

/// `<tool_call>…</tool_call>` blocks: (content outside them, calls).
fn parse_hermes(text: &str, names: &[String]) -> Option<(String, Vec<ToolCall>)> {
    let mut calls = Vec::new();
    let mut content = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("<tool_call>") {
        content.push_str(&rest[..at]);
        let after = &rest[at + "<tool_call>".len()..];
        let (v, used) = json_prefix(after)?;
        calls.push(call_of(&v, names)?);
        let tail = after[used..].trim_start();
        rest = tail.strip_prefix("</tool_call>").unwrap_or(tail);
    }
    content.push_str(rest);
    (!calls.is_empty()).then_some((content, calls))
}

/// `[TOOL_CALLS][…]` or `[TOOL_CALLS]name[ARGS]{…}`.
fn parse_mistral(text: &str, names: &[String]) -> Option<(String, Vec<ToolCall>)> {
    let at = text.find("[TOOL_CALLS]")?;
    let content = text[..at].to_owned();
    let mut rest = &text[at + "[TOOL_CALLS]".len()..];
    if let Some((Value::Array(items), _)) = json_prefix(rest) {
        return Some((content, calls_of(&items, names)?));
    }
    let mut calls = Vec::new();
    loop {
        let args_at = rest.find("[ARGS]")?;
        let name = rest[..args_at].trim();
        let (args, used) = json_prefix(&rest[args_at + "[ARGS]".len()..])?;
        calls.push(call_of(&json!({"name": name, "arguments": args}), names)?);
        rest = rest[args_at + "[ARGS]".len() + used..].trim_start();
        match rest.strip_prefix("[TOOL_CALLS]") {
            Some(r) => rest = r,
            None => break,
        }
    }
    Some((content, calls))
}

/// JSON objects that are calls (Llama 3's, separated by `;` or whitespace), or a generic
/// `{"tool_calls": […]}` / `{"tool_call": {…}}` wrapper, making up the whole text.
fn parse_json_calls(text: &str, names: &[String]) -> Option<Vec<ToolCall>> {
    let mut rest = text.trim();
    rest = rest.strip_prefix("<|python_tag|>").unwrap_or(rest);
    let mut calls = Vec::new();
    while !rest.trim().is_empty() {
        let (v, used) = json_prefix(rest)?;
        match v.get("tool_calls").and_then(Value::as_array) {
            Some(items) => calls.extend(calls_of(items, names)?),
            None => match v.get("tool_call") {
                Some(c) => calls.push(call_of(c, names)?),
                None => calls.push(call_of(&v, names)?),
            },
        }
        rest = rest[used..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest);
    }
    (!calls.is_empty()).then_some(calls)
}

/// Splits a reply: reasoning first, then the calls of `format` to the functions `names`
/// (any other format's markers are tried too, then bare JSON), the rest being content. Text
/// that only looks like a call (an unknown function, broken JSON) stays content.
pub fn parse_reply(format: ToolFormat, text: &str, names: &[String]) -> Reply {
    let (reasoning, rest) = split_reasoning(text);
    let mut reply = Reply {
        content: rest.trim().to_owned(),
        reasoning,
        calls: Vec::new(),
    };
    if names.is_empty() {
        return reply;
    }
    let marked = match format {
        ToolFormat::Mistral => parse_mistral(rest, names).or_else(|| parse_hermes(rest, names)),
        _ => parse_hermes(rest, names).or_else(|| parse_mistral(rest, names)),
    };
    if let Some((content, calls)) = marked {
        reply.content = content.trim().to_owned();
        reply.calls = calls;
    } else if let Some(calls) = parse_json_calls(rest, names) {
        reply.content.clear();
        reply.calls = calls;
    }
    reply
}

/// A chat message as the template reads it: an assistant's `tool_calls` with their
/// `function.arguments` parsed from JSON text into objects (as chat templates expect them),
/// and a missing or null `content` as an empty string. For a template that does not read
/// `tool_calls` (`reads_calls` false), the calls are written into the content in the
/// generic format, so that the model still sees what it called.
pub fn template_message(mut m: Value, reads_calls: bool) -> Value {
    let mut generic = Vec::new();
    if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for c in calls {
            let Some(f) = c.get_mut("function") else {
                continue;
            };
            if let Some(a) = f.get_mut("arguments") {
                if let Some(v) = a
                    .as_str()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                {
                    *a = v;
                }
            }
            generic.push(json!({"name": f.get("name"), "arguments": f.get("arguments")}));
        }
    }
    if let Some(o) = m.as_object_mut() {
        if o.get("content").is_none_or(Value::is_null) {
            o.insert("content".into(), json!(""));
        }
        if !reads_calls && !generic.is_empty() {
            let text = json!({"tool_calls": generic}).to_string();
            let content = match o.get("content").and_then(Value::as_str) {
                Some(c) if !c.is_empty() => format!("{c}\n{text}"),
                _ => text,
            };
            o.insert("content".into(), json!(content));
        }
    }
    m
}

/// The OpenAI objects of `calls` (`id`, `type`, `function`), ids made from `prefix`.
pub fn openai_calls(calls: &[ToolCall], prefix: &str) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut f = Map::new();
            f.insert("name".into(), json!(c.name));
            f.insert("arguments".into(), json!(c.arguments));
            json!({"id": format!("call_{prefix}_{i}"), "type": "function", "function": f})
        })
        .collect()
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
