//! A chat request turned into a prompt and what shapes its answer: the constraint its
//! output follows (a schema, a Lark grammar, or the grammar of forced tool calls), and how
//! the reply is read back (tool calls in the model family's format, `<think>` reasoning).

use crate::AppState;
use qkv::engine::TokenConstraint;
use qkv_cli::request::{self, ApiError, Body};
use qkv_cli::structured::{output_constraint, OutputConstraint};
use qkv_cli::tools::{self, ToolChoice, ToolFormat};
use serde_json::Value;

/// How a reply is read back into its parts.
pub struct ReplyParse {
    /// The model family's tool-call format.
    pub format: ToolFormat,
    /// The functions that may be called (none: no call is parsed).
    pub names: Vec<String>,
    /// The reply read as it streams.
    pub stream: qkv_cli::tool_stream::ReplyStream,
}

/// What shapes a generation besides its sampling parameters.
#[derive(Default)]
pub struct Post {
    /// The constraint on the tokens generated.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// How the whole reply is split (chat only): `None` streams text as it comes.
    pub parse: Option<ReplyParse>,
}

/// Compiles `c` with the server's grammar compiler (a 400 naming `c`'s field when it cannot
/// compile, or when the server has none).
fn compile(state: &AppState, c: &OutputConstraint) -> Result<Box<dyn TokenConstraint>, ApiError> {
    let grammars = state.grammars.as_ref().map_err(|e| {
        ApiError::invalid(
            c.param(),
            format!("constrained output is not available: {e}"),
        )
    })?;
    Ok(Box::new(grammars.compile(c)?))
}

/// The completion route's constraint (`response_format`, `json_schema` or `grammar`).
pub fn completion_post(state: &AppState, b: &Body) -> Result<Post, ApiError> {
    let constraint = match output_constraint(b)? {
        Some(c) => Some(compile(state, &c)?),
        None => None,
    };
    Ok(Post {
        constraint,
        parse: None,
    })
}

/// The chat route's prompt (the messages, with tool calls and tool results, through the
/// model's own template) and its [`Post`].
pub fn prepare(state: &AppState, b: &Body) -> Result<(Vec<u32>, Post), ApiError> {
    let (msgs, raw_tools) = request::chat_messages(b)?;
    let tool_req = tools::tool_request(b, raw_tools.as_deref())?;
    let output = output_constraint(b)?;
    let tokenizer = state.model.tokenizer().expect("checked at start");
    let template = tokenizer.chat_template();
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
                let grammar = compile(state, &c)?;
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
            constraint = Some(compile(state, &c)?);
        }
    }
    if let Some(o) = &output {
        constraint = Some(compile(state, o)?);
    }
    // `strict` functions under `auto`: each call, once started, follows its schema.
    if let (Some(t), None, Ok(g)) = (&tool_req, &output, &state.grammars) {
        if let Some(c) = qkv_cli::strict_calls::strict_calls(t, format, g, state.model.clone())? {
            constraint = Some(Box::new(c));
        }
    }
    let names: Vec<String> = match &tool_req {
        Some(t) if t.choice != ToolChoice::None => t.tools.iter().map(|t| t.name.clone()).collect(),
        _ => Vec::new(),
    };
    let think = template.is_some_and(|t| t.contains("<think>"));
    let parse = (!names.is_empty() || think).then(|| ReplyParse {
        format,
        stream: qkv_cli::tool_stream::ReplyStream::new(format, names.clone()),
        names,
    });
    let options = qkv::tokenizer::ChatOptions {
        add_generation_prompt: true,
        tools: match &tool_req {
            Some(t) => t.template_tools(raw_tools.as_deref().unwrap_or(&[])),
            None => raw_tools,
        },
        ..Default::default()
    };
    let reads_calls = template.is_some_and(|t| t.contains("tool_calls"));
    let msgs: Vec<Value> = msgs
        .into_iter()
        .map(|m| tools::template_message(m, reads_calls))
        .collect();
    // A template that refuses the conversation, or a model without one: the request's
    // fault, a 400 whatever the error's kind.
    let text = tokenizer
        .render_chat(&msgs, &options)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let ids = tokenizer.encode(&text)?;
    Ok((ids, Post { constraint, parse }))
}
