//! Structured output in a request: OpenAI's `response_format` (`json_schema` with its
//! `strict`, `json_object`, `text`), and llama-server's top-level `json_schema` and `grammar`
//! (Lark) fields, read into one [`OutputConstraint`] (compiled by
//! [`crate::constraint::Grammars`]). Only one of them may be given. A JSON schema is compiled
//! with qkv's layout ([`with_layout`]), and so are the schemas of forced tool calls.
//!
//! ```
//! use qkv_server::body::Body;
//! use qkv_server::structured::{output_constraint, OutputConstraint};
//!
//! let b = Body::parse(br#"{"response_format": {"type": "json_object"}}"#)?;
//! let c = output_constraint(&b)?.unwrap();
//! assert_eq!(c.param(), "response_format");
//! let bad = Body::parse(br#"{"response_format": {"type": "xml"}}"#)?;
//! assert_eq!(output_constraint(&bad).err().unwrap().param.as_deref(), Some("response_format.type"));
//! # Ok::<(), qkv_server::error::ApiError>(())
//! ```

use crate::body::Body;
use crate::error::ApiError;
use serde_json::{json, Value};

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputConstraint {
    /// JSON that follows a schema.
    JsonSchema {
        /// The schema (`true` or an object).
        schema: Value,
        /// Unknown or unsupported schema keywords are an error instead of being ignored.
        strict: bool,
        /// The request field it came from, for errors.
        param: String,
    },
    /// Text that a Lark grammar (llguidance's dialect) derives.
    Lark {
        /// The grammar's source.
        grammar: String,
        /// The request field it came from, for errors.
        param: String,
    },
}

impl OutputConstraint {
    /// The request field the constraint came from.
    pub fn param(&self) -> &str {
        match self {
            OutputConstraint::JsonSchema { param, .. } | OutputConstraint::Lark { param, .. } => {
                param
            }
        }
    }
}

/// A schema must be an object or a boolean.
fn schema_value(param: &str, v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        _ => Err(ApiError::invalid(
            param,
            format!("a JSON schema must be an object, got {v}"),
        )),
    }
}

/// llama.cpp's GBNF (`name ::= …`, start symbol `root`) in llguidance's Lark dialect: each
/// rule head `name ::=` becomes `name:` (dashes in names become underscores, `root` becomes
/// `start`); the right-hand sides (strings, character classes, `|`, `*`, `+`, `?`, `{m,n}`,
/// parentheses) are read the same way by both. Text inside quotes or brackets is kept.
pub fn gbnf_to_lark(g: &str) -> String {
    let mut out = String::with_capacity(g.len());
    let (mut quote, mut class, mut escape) = (false, false, false);
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if !word.is_empty() {
            let w = word.replace('-', "_");
            out.push_str(if w == "root" { "start" } else { &w });
            word.clear();
        }
    };
    let chars: Vec<char> = g.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if quote || class {
            out.push(c);
            if escape {
                escape = false;
            } else if c == '\\' {
                escape = true;
            } else if (quote && c == '"') || (class && c == ']') {
                quote = false;
                class = false;
            }
        } else if c.is_ascii_alphanumeric() || c == '_' || (c == '-' && !word.is_empty()) {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            if c == ':' && chars.get(i + 1) == Some(&':') && chars.get(i + 2) == Some(&'=') {
                out.push(':');
                i += 3;
                continue;
            }
            if c == '#' {
                // A comment, to the end of the line.
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            quote = c == '"';
            class = c == '[';
            out.push(c);
        }
        i += 1;
    }
    flush(&mut word, &mut out);
    out
}

/// Reads `response_format`, `json_schema` and `grammar`; `None` when the output is free
/// text. A 400 naming the field for a wrong shape, or when more than one is given.
pub fn output_constraint(b: &Body) -> Result<Option<OutputConstraint>, ApiError> {
    let mut found: Vec<OutputConstraint> = Vec::new();
    if let Some(rf) = b.field("response_format") {
        let obj = rf.as_object().ok_or_else(|| {
            ApiError::invalid("response_format", "`response_format` must be an object")
        })?;
        match obj.get("type").and_then(Value::as_str) {
            Some("text") => {}
            // llama-server's extension: a `schema` beside `json_object` is followed as given.
            Some("json_object") => match obj.get("schema").filter(|s| !s.is_null()) {
                Some(sch) => found.push(OutputConstraint::JsonSchema {
                    schema: schema_value("response_format.schema", sch)?,
                    strict: false,
                    param: "response_format.schema".into(),
                }),
                None => found.push(OutputConstraint::JsonSchema {
                    schema: json!({"type": "object"}),
                    strict: false,
                    param: "response_format".into(),
                }),
            },
            Some("json_schema") => {
                let js = match obj.get("json_schema") {
                    Some(Value::Object(js)) => js,
                    _ => {
                        return Err(ApiError::invalid(
                            "response_format.json_schema",
                            "`json_schema` must be an object with a `schema`",
                        ))
                    }
                };
                if js
                    .get("name")
                    .is_some_and(|n| !n.is_string() && !n.is_null())
                {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.name",
                        "`name` must be a string",
                    ));
                }
                let strict = match js.get("strict") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(s)) => *s,
                    Some(_) => {
                        return Err(ApiError::invalid(
                            "response_format.json_schema.strict",
                            "`strict` must be a boolean",
                        ))
                    }
                };
                let param = "response_format.json_schema.schema";
                let schema = match js.get("schema") {
                    None | Some(Value::Null) => json!({}),
                    Some(s) => schema_value(param, s)?,
                };
                found.push(OutputConstraint::JsonSchema {
                    schema,
                    strict,
                    param: param.into(),
                });
            }
            _ => {
                return Err(ApiError::invalid(
                    "response_format.type",
                    "`type` must be `text`, `json_object` or `json_schema`",
                ))
            }
        }
    }
    if let Some(s) = b.field("json_schema") {
        found.push(OutputConstraint::JsonSchema {
            schema: schema_value("json_schema", s)?,
            strict: false,
            param: "json_schema".into(),
        });
    }
    if let Some(g) = b.str("grammar")? {
        if g.trim().is_empty() {
            return Err(ApiError::invalid("grammar", "`grammar` is empty"));
        }
        found.push(OutputConstraint::Lark {
            grammar: if g.contains("::=") {
                gbnf_to_lark(g)
            } else {
                g.to_owned()
            },
            param: "grammar".into(),
        });
    }
    if found.len() > 1 {
        return Err(ApiError::invalid(
            found[1].param(),
            "give only one of `response_format`, `json_schema` and `grammar`",
        ));
    }
    Ok(found.pop())
}

/// `schema` with qkv's JSON layout: one space after `:` and `,`, no other whitespace
/// (a small model left free to add whitespace may add it until its tokens run out), and
/// unknown keywords refused when `strict` (else ignored). A schema's own `x-guidance`
/// settings win.
pub fn with_layout(schema: &Value, strict: bool) -> Value {
    let layout = json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
        "lenient": !strict,
    });
    match schema {
        Value::Object(m) => {
            let mut m = m.clone();
            m.entry("x-guidance").or_insert(layout);
            Value::Object(m)
        }
        // `true`, `false`: any value, no value.
        other => json!({"allOf": [other], "x-guidance": layout}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> Result<Option<OutputConstraint>, ApiError> {
        output_constraint(&Body::parse(json.as_bytes()).unwrap())
    }

    #[test]
    fn each_field_is_read() {
        assert_eq!(read("{}").unwrap(), None);
        assert_eq!(
            read(r#"{"response_format": {"type": "text"}}"#).unwrap(),
            None
        );
        let c = read(
            r#"{"response_format": {"type": "json_schema", "json_schema":
                {"name": "x", "strict": true, "schema": {"type": "integer"}}}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            c,
            OutputConstraint::JsonSchema {
                schema: json!({"type": "integer"}),
                strict: true,
                param: "response_format.json_schema.schema".into()
            }
        );
        let c = read(r#"{"json_schema": {"type": "string"}}"#)
            .unwrap()
            .unwrap();
        assert_eq!(c.param(), "json_schema");
        // llama-server's `schema` beside `json_object`.
        let c = read(r#"{"response_format": {"type": "json_object", "schema": {"const": "42"}}}"#)
            .unwrap()
            .unwrap();
        assert_eq!(
            c,
            OutputConstraint::JsonSchema {
                schema: json!({"const": "42"}),
                strict: false,
                param: "response_format.schema".into()
            }
        );
        let e = read(r#"{"response_format": {"type": "json_object", "schema": 123}}"#);
        assert_eq!(
            e.unwrap_err().param.as_deref(),
            Some("response_format.schema")
        );
        // GBNF, as llama-server takes it.
        assert_eq!(
            gbnf_to_lark("root ::= \"a\"{5,5} my-rule # five\nmy-rule ::= [a-z:=]+ \"::=\""),
            "start : \"a\"{5,5} my_rule \nmy_rule : [a-z:=]+ \"::=\""
        );
        let c = read(r#"{"grammar": "start: \"a\""}"#).unwrap().unwrap();
        assert!(matches!(c, OutputConstraint::Lark { .. }));
    }

    #[test]
    fn wrong_shapes_name_their_field() {
        for (json, name) in [
            (r#"{"response_format": 3}"#, "response_format"),
            (r#"{"response_format": {}}"#, "response_format.type"),
            (
                r#"{"response_format": {"type": "json_schema"}}"#,
                "response_format.json_schema",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}"#,
                "response_format.json_schema.schema",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"strict": 1}}}"#,
                "response_format.json_schema.strict",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"name": 1}}}"#,
                "response_format.json_schema.name",
            ),
            (r#"{"json_schema": "x"}"#, "json_schema"),
            (r#"{"grammar": 1}"#, "grammar"),
            (r#"{"grammar": " "}"#, "grammar"),
            (
                r#"{"json_schema": {}, "grammar": "start: \"a\""}"#,
                "grammar",
            ),
        ] {
            let e = read(json).err().unwrap_or_else(|| panic!("{json}"));
            assert_eq!(e.param.as_deref(), Some(name), "{json}");
        }
    }

    #[test]
    fn layout_is_added_unless_the_schema_sets_its_own() {
        let s = with_layout(&json!({"type": "object"}), true);
        assert_eq!(s["x-guidance"]["whitespace_flexible"], false);
        assert_eq!(s["x-guidance"]["lenient"], false);
        let own = json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(with_layout(&own, false), own);
        let any = with_layout(&json!(true), false);
        assert_eq!(any["allOf"][0], true);
    }
}
