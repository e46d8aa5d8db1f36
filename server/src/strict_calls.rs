//! `strict: true` functions under `tool_choice: "auto"`: the model writes freely until it
//! starts a call, and from there the call follows the grammar of a forced call
//! ([`ToolRequest::forced_grammar`]), the strict functions' arguments held to their schemas.
//!
//! A call starts, for the formats with a marker, when the text generated ends with the
//! marker (`<tool_call>` for Hermes / Qwen, `[TOOL_CALLS]` for Mistral): the grammar of what
//! follows the marker takes over until it is complete, after which the text is free again
//! (up to [`MAX_PARALLEL_CALLS`] calls are held to a grammar when parallel calls are allowed,
//! one otherwise). For the formats whose calls are the whole reply (Llama 3's bare JSON,
//! the generic `{"tool_calls": …}`), a reply whose first visible token opens with `{` is a
//! call from its first token on; any other first token leaves the reply free.
//!
//! A marker that a token overshoots (one token holding the marker and more text) does not
//! start the grammar: the call is then read as written.

use crate::constraint::{Grammar, Grammars};
use crate::error::ApiError;
use crate::structured::OutputConstraint;
use crate::tools::{ToolChoice, ToolFormat, ToolRequest, MARKUP_TOKENS, MAX_PARALLEL_CALLS};
use qkv::engine::TokenConstraint;
use qkv::load::Model;
use serde_json::json;
use std::collections::VecDeque;
use std::sync::Arc;

/// Where a call starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trigger {
    /// The reply's first visible token opens with `{`.
    Start,
    /// The text ends with this marker.
    Marker(&'static str),
}

/// The grammar of what follows a call's start in `format`, for `t` as if every call were
/// forced; the functions that are not strict keep only `{"type": "object"}` arguments.
fn after_start(t: &ToolRequest, format: ToolFormat) -> Option<(Trigger, String)> {
    let mut forced = t.clone();
    forced.choice = ToolChoice::Required;
    for tool in &mut forced.tools {
        if !tool.strict {
            tool.parameters = json!({"type": "object"});
        }
    }
    let whole = forced.forced_grammar(format)?;
    Some(match format {
        ToolFormat::Hermes => {
            let call = whole.lines().find(|l| l.starts_with("call: "))?;
            (
                Trigger::Marker("<tool_call>"),
                format!("start: \"\\n\" call \"\\n</tool_call>\"\n{call}\n"),
            )
        }
        ToolFormat::Mistral => (
            Trigger::Marker("[TOOL_CALLS]"),
            whole.replacen("start: \"[TOOL_CALLS]\" calls", "start: calls", 1),
        ),
        ToolFormat::Llama3 | ToolFormat::Generic => (Trigger::Start, whole),
    })
}

/// The constraint of a request whose choice is `auto` and whose tools include a strict
/// one: `None` when no tool is strict or the choice is not `auto`. A grammar that does not
/// compile is a 400 naming `tools`.
pub fn strict_calls(
    t: &ToolRequest,
    format: ToolFormat,
    grammars: &Grammars,
    model: Arc<Model>,
) -> Result<Option<StrictCalls>, ApiError> {
    if t.choice != ToolChoice::Auto || !t.tools.iter().any(|x| x.strict) {
        return Ok(None);
    }
    let Some((trigger, grammar)) = after_start(t, format) else {
        return Ok(None);
    };
    let n = if t.parallel && trigger != Trigger::Start {
        MAX_PARALLEL_CALLS
    } else {
        1
    };
    let c = OutputConstraint::Lark {
        grammar,
        param: "tools".into(),
    };
    let waiting = (0..n)
        .map(|_| grammars.compile(&c))
        .collect::<Result<VecDeque<_>, _>>()?;
    Ok(Some(StrictCalls {
        model,
        trigger,
        waiting,
        mode: Mode::Free,
        text: String::new(),
        started: false,
    }))
}

/// Where the reply is.
enum Mode {
    /// Free text.
    Free,
    /// Inside a call, held to its grammar.
    Call(Box<Grammar>),
    /// Free to the end.
    Off,
}

/// The constraint: free text, and each call (once started) held to its grammar.
pub struct StrictCalls {
    model: Arc<Model>,
    trigger: Trigger,
    /// The grammars of the calls still to come.
    waiting: VecDeque<Grammar>,
    mode: Mode,
    /// The free text since the last call (its tail), for the marker.
    text: String,
    /// A visible token was generated.
    started: bool,
}

impl StrictCalls {
    /// A token's text: its bytes, or for a special token its spelling if it is markup, else
    /// nothing.
    fn piece(&self, token: u32) -> String {
        let Some(t) = self.model.tokenizer() else {
            return String::new();
        };
        if t.is_special(token) {
            return t
                .token_str(token)
                .ok()
                .filter(|s| MARKUP_TOKENS.contains(s))
                .unwrap_or("")
                .to_owned();
        }
        t.token_bytes(token)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    }

    /// Before the first visible token of a reply whose calls are the whole reply: whether
    /// `token` would start a call.
    fn opens_call(&self, token: u32) -> bool {
        self.trigger == Trigger::Start
            && !self.started
            && self.piece(token).trim_start().starts_with('{')
    }
}

impl TokenConstraint for StrictCalls {
    fn allows(&mut self, token: u32) -> bool {
        if self.opens_call(token) {
            return match self.waiting.front_mut() {
                Some(g) => g.allows(token),
                None => true,
            };
        }
        match &mut self.mode {
            Mode::Call(g) => g.allows(token),
            Mode::Free | Mode::Off => true,
        }
    }

    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        if let Mode::Call(g) = &mut self.mode {
            return g.mask(logits);
        }
        if self.trigger != Trigger::Start || self.started {
            return Ok(());
        }
        // The first visible token: a token opening with `{` must be one the call's grammar
        // allows; any other is free.
        let Some(g) = self.waiting.front_mut() else {
            return Ok(());
        };
        let mut masked = logits.to_vec();
        g.mask(&mut masked)?;
        for (id, l) in logits.iter_mut().enumerate() {
            if self.piece(id as u32).trim_start().starts_with('{') {
                *l = masked[id];
            }
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        if self.opens_call(token) {
            if let Some(mut g) = self.waiting.pop_front() {
                g.commit(token)?;
                self.mode = Mode::Call(Box::new(g));
            }
            self.started = true;
            return Ok(());
        }
        match &mut self.mode {
            Mode::Call(g) => {
                g.commit(token)?;
                // A marker's call, once complete, gives the text back.
                if self.trigger != Trigger::Start && (g.is_accepting() || g.is_complete()) {
                    self.mode = if self.waiting.is_empty() {
                        Mode::Off
                    } else {
                        Mode::Free
                    };
                }
            }
            Mode::Off => {}
            Mode::Free => {
                let piece = self.piece(token);
                if !piece.trim().is_empty() {
                    self.started = true;
                }
                if let Trigger::Marker(m) = self.trigger {
                    self.text.push_str(&piece);
                    if self.text.ends_with(m) {
                        self.text.clear();
                        if let Some(g) = self.waiting.pop_front() {
                            self.mode = Mode::Call(Box::new(g));
                        }
                    } else if self.text.len() > 64 {
                        let cut = self.text.len() - 32;
                        let cut = (cut..self.text.len())
                            .find(|&i| self.text.is_char_boundary(i))
                            .unwrap_or(self.text.len());
                        self.text.drain(..cut);
                    }
                } else if self.started {
                    self.mode = Mode::Off;
                }
            }
        }
        Ok(())
    }

    fn is_complete(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Tool;

    fn request(strict: bool) -> ToolRequest {
        ToolRequest {
            tools: vec![
                Tool {
                    name: "get_weather".into(),
                    parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"]}),
                    strict,
                },
                Tool {
                    name: "other".into(),
                    parameters: json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
                    strict: false,
                },
            ],
            choice: ToolChoice::Auto,
            parallel: true,
        }
    }

    #[test]
    fn each_format_has_the_grammar_of_what_follows_its_start() {
        let t = request(true);
        let (trigger, g) = after_start(&t, ToolFormat::Hermes).unwrap();
        assert_eq!(trigger, Trigger::Marker("<tool_call>"));
        assert!(
            g.starts_with("start: \"\\n\" call \"\\n</tool_call>\"\ncall: %json"),
            "{g}"
        );
        assert!(g.contains("\"city\""), "the strict schema is kept: {g}");
        assert!(!g.contains("\"x\""), "a non-strict schema is not: {g}");
        let (trigger, g) = after_start(&t, ToolFormat::Mistral).unwrap();
        assert_eq!(trigger, Trigger::Marker("[TOOL_CALLS]"));
        assert!(g.starts_with("start: calls\n"), "{g}");
        for f in [ToolFormat::Llama3, ToolFormat::Generic] {
            assert_eq!(after_start(&t, f).unwrap().0, Trigger::Start);
        }
    }
}
