//! A chat request turned into a prompt and what shapes its answer: the constraint its
//! output follows (a schema, a Lark grammar, or the grammar of forced tool calls), and how
//! the reply is read back (tool calls in the model family's format, `<think>` reasoning).
//!
//! What qkv-server's chat routes and the Python package's plans share: both describe their
//! model, template and grammar compiler in a [`ChatSetup`] and call [`prepare`],
//! [`render`] or [`completion_post`].

use crate::body::Body;
use crate::constraint::Grammars;
use crate::error::ApiError;
use crate::request;
use crate::structured::{output_constraint, OutputConstraint};
use crate::tools::{self, ToolChoice, ToolFormat};
use qkv::engine::TokenConstraint;
use qkv::load::Model;
use qkv::tokenizer::Tokenizer;
use serde_json::Value;
use std::sync::Arc;

/// What rendering and constraining a request needs from its caller: the model, the
/// template that may replace the model's, the grammar compiler, and whether reasoning is off.
pub struct ChatSetup<'a> {
    /// The model, whose tokenizer renders (unless `template` is given) and encodes.
    pub model: &'a Arc<Model>,
    /// A chat template that replaces the model's: its path (for its error messages) and its
    /// source.
    pub template: Option<(&'a str, &'a str)>,
    /// Reasoning off: templates render with `enable_thinking: false`, and a prompt that
    /// ends inside an opened thinking block gets it closed.
    pub no_reasoning: bool,
    /// The grammar compiler over the model's vocabulary, or why there is none; called only
    /// when a request needs it, so that a caller may build it on first use.
    pub grammars: &'a dyn Fn() -> Result<&'a Grammars, &'a str>,
}

impl ChatSetup<'_> {
    /// The chat template requests render with: the replacement, else the model's.
    pub fn template_source(&self) -> Option<&str> {
        match self.template {
            Some((_, source)) => Some(source),
            None => self.tokenizer().ok()?.chat_template(),
        }
    }

    fn tokenizer(&self) -> Result<&Tokenizer, ApiError> {
        self.model
            .tokenizer()
            .ok_or_else(|| ApiError::invalid("messages", "the model has no tokenizer"))
    }

    /// Compiles `c` (a 400 naming `c`'s field when it cannot compile, or when there is no
    /// grammar compiler).
    fn compile(&self, c: &OutputConstraint) -> Result<Box<dyn TokenConstraint>, ApiError> {
        let grammars = (self.grammars)().map_err(|e| {
            ApiError::invalid(
                c.param(),
                format!("constrained output is not available: {e}"),
            )
        })?;
        Ok(Box::new(grammars.compile(c)?))
    }
}

/// How a reply is read back into its parts.
pub struct ReplyParse {
    /// The model family's tool-call format.
    pub format: ToolFormat,
    /// The functions that may be called (none: no call is parsed).
    pub names: Vec<String>,
    /// The reply read as it streams.
    pub stream: crate::tool_stream::ReplyStream,
}

/// What shapes a generation besides its sampling parameters.
#[derive(Default)]
pub struct Post {
    /// The constraint on the tokens generated.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// How the whole reply is split (chat only): `None` streams text as it comes.
    pub parse: Option<ReplyParse>,
}

/// The completion route's constraint (`response_format`, `json_schema` or `grammar`).
pub fn completion_post(setup: &ChatSetup<'_>, b: &Body) -> Result<Post, ApiError> {
    let constraint = match output_constraint(b)? {
        Some(c) => Some(setup.compile(&c)?),
        None => None,
    };
    Ok(Post {
        constraint,
        parse: None,
    })
}

/// The chat prompt's text for `b` (what `/apply-template` answers).
pub fn render(setup: &ChatSetup<'_>, b: &Body) -> Result<String, ApiError> {
    let (msgs, raw_tools) = request::chat_messages(b)?;
    let tool_req = tools::tool_request(b, raw_tools.as_deref())?;
    render_messages(setup, b, msgs, raw_tools, tool_req.as_ref())
}

/// Renders `msgs` through the setup's template, as llama-server does: a last assistant
/// message is continued (prefilled) rather than closed; `add_generation_prompt` (default
/// true) and `continue_final_message` may not both be true; two assistant messages may not
/// end the conversation.
fn render_messages(
    setup: &ChatSetup<'_>,
    b: &Body,
    msgs: Vec<Value>,
    raw_tools: Option<Vec<Value>>,
    tool_req: Option<&tools::ToolRequest>,
) -> Result<String, ApiError> {
    let tokenizer = setup.tokenizer()?;
    let template = setup.template_source();
    let continue_final = b.bool("continue_final_message", false)?;
    let add_generation = b.bool("add_generation_prompt", true)?;
    if continue_final && b.field("add_generation_prompt").is_some() && add_generation {
        return Err(ApiError::invalid(
            "continue_final_message",
            "`continue_final_message` and `add_generation_prompt` cannot both be true",
        ));
    }
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
    let n = msgs.len();
    if n >= 2
        && role(&msgs[n - 1]).as_deref() == Some("assistant")
        && role(&msgs[n - 2]).as_deref() == Some("assistant")
    {
        return Err(ApiError::invalid(
            &format!("messages[{}]", n - 1),
            "two assistant messages in a row end the conversation: only the last one may be \
             continued",
        ));
    }
    // A final assistant message with text is continued: the rest renders with the
    // generation prompt, and its text follows.
    let prefill = match msgs.last() {
        Some(m)
            if role(m).as_deref() == Some("assistant")
                && m.get("tool_calls").is_none()
                && (continue_final || b.field("add_generation_prompt").is_none()) =>
        {
            m.get("content").and_then(Value::as_str).map(str::to_owned)
        }
        _ => None,
    };
    let mut msgs = msgs;
    if prefill.is_some() {
        msgs.pop();
    }
    // What llama-server gives every template besides the messages: whether to think,
    // and today's date in the two spellings templates read.
    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".into(), Value::Bool(!setup.no_reasoning));
    let date = |format| Value::from(qkv::tokenizer::strftime_now(format));
    extra.insert("date_string".into(), date("%d %b %Y"));
    extra.insert("datetime".into(), date("%b %d %Y"));
    // Templates written for a `functions` variable (FireFunction v2's) read the tools as
    // indented JSON text, empty without tools.
    let functions = match raw_tools.as_deref() {
        Some(t) if !t.is_empty() => serde_json::to_string_pretty(t).unwrap_or_default(),
        _ => String::new(),
    };
    extra.insert("functions".into(), Value::String(functions));
    let options = qkv::tokenizer::ChatOptions {
        add_generation_prompt: add_generation || prefill.is_some(),
        tools: match tool_req {
            Some(t) => t.template_tools(raw_tools.as_deref().unwrap_or(&[])),
            None => raw_tools.filter(|t| !t.is_empty()),
        },
        extra,
        ..Default::default()
    };
    let reads_calls = template.is_some_and(|t| t.contains("tool_calls"));
    let msgs: Vec<Value> = msgs
        .into_iter()
        .map(|m| tools::template_message(m, reads_calls))
        .collect();
    // A template that refuses the conversation, or a model without one: the request's
    // fault, a 400 whatever the error's kind.
    let rendered = match setup.template {
        Some((path, source)) => {
            let name = |id: Option<u32>| id.and_then(|id| tokenizer.token_str(id).ok());
            qkv::tokenizer::ChatTemplate::new(path, source)
                .with_special_tokens(name(tokenizer.bos_id()), name(tokenizer.eos_id()))
                .render(&msgs, &options)
        }
        None => tokenizer.render_chat(&msgs, &options),
    };
    let mut text = rendered.map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    if setup.no_reasoning && options.add_generation_prompt {
        close_thinking(&mut text, template.unwrap_or(""));
    }
    if let Some(p) = prefill {
        text.push_str(&p);
    }
    Ok(text)
}

/// With reasoning off: a generation prompt that opens a thinking block (`<think>`) gets it
/// closed, and a template with Command R7B's thinking markers gets an empty block, so that
/// the model answers at once.
fn close_thinking(text: &mut String, template: &str) {
    if text.trim_end().ends_with("<think>") {
        text.push_str("</think>");
    } else if template.contains("<|START_THINKING|>") && !text.ends_with("<|END_THINKING|>") {
        text.push_str("<|START_THINKING|><|END_THINKING|>");
    }
}

/// The chat route's prompt (the messages, with tool calls and tool results, through the
/// setup's template) and its [`Post`].
pub fn prepare(setup: &ChatSetup<'_>, b: &Body) -> Result<(Vec<u32>, Post), ApiError> {
    let (msgs, raw_tools) = request::chat_messages(b)?;
    let tool_req = tools::tool_request(b, raw_tools.as_deref())?;
    let output = output_constraint(b)?;
    let tokenizer = setup.tokenizer()?;
    let template = setup.template_source();
    let format = ToolFormat::from_template(template);
    let mut constraint = None;
    if let Some(t) = &tool_req {
        if t.choice != ToolChoice::None {
            // Each schema compiles on its own, so that a bad one is named.
            for (i, tool) in t.tools.iter().enumerate() {
                let c = OutputConstraint::JsonSchema {
                    schema: tool.parameters.clone(),
                    strict: tool.strict,
                    param: format!("tools[{i}].function.parameters"),
                };
                let grammar = setup.compile(&c)?;
                drop(grammar);
            }
        }
        if let Some(g) = t.forced_grammar(format) {
            if let Some(o) = &output {
                return Err(ApiError::invalid(
                    o.param(),
                    "a forced tool call cannot also follow an output format",
                ));
            }
            let c = OutputConstraint::Lark {
                grammar: g,
                param: "tools".into(),
            };
            constraint = Some(setup.compile(&c)?);
        }
    }
    if let Some(o) = &output {
        constraint = Some(setup.compile(o)?);
    }
    // `strict` functions under `auto`: each call, once started, follows its schema.
    if let (Some(t), None) = (&tool_req, &output) {
        if let Ok(g) = (setup.grammars)() {
            if let Some(c) = crate::strict_calls::strict_calls(t, format, g, setup.model.clone())? {
                constraint = Some(Box::new(c));
            }
        }
    }
    let names: Vec<String> = match &tool_req {
        Some(t) if t.choice != ToolChoice::None => t.tools.iter().map(|t| t.name.clone()).collect(),
        _ => Vec::new(),
    };
    let think = template.is_some_and(|t| t.contains("<think>"));
    let parse = (!names.is_empty() || think).then(|| ReplyParse {
        format,
        stream: crate::tool_stream::ReplyStream::new(format, names.clone()),
        names,
    });
    let text = render_messages(setup, b, msgs, raw_tools, tool_req.as_ref())?;
    let ids = tokenizer.encode(&text)?;
    Ok((ids, Post { constraint, parse }))
}
