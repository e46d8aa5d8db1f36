//! [`Model`]: a decoder and its tokenizer, loaded once and shared by every session and
//! engine made from it; requests read into [`Plan`]s with qkv-server's readers, and
//! [`ReplyParser`], which splits a chat reply into reasoning, content and tool calls.

use crate::errors::{self, from_api, from_qkv};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use qkv::engine::TokenConstraint;
use qkv::load::ModelOptions;
use qkv::sample::SamplerConfig;
use qkv_server::body::Body;
use qkv_server::constraint::Grammars;
use qkv_server::error::ApiError;
use qkv_server::request::{self, Prompt};
use qkv_server::structured::{output_constraint, OutputConstraint};
use qkv_server::tools::{self, ToolChoice, ToolFormat};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// A decoder-only model and its tokenizer (a GGUF file or a Hugging Face directory).
#[pyclass(module = "qkv._native", frozen)]
pub struct Model {
    pub(crate) inner: Arc<qkv::load::Model>,
    /// The grammar compiler over the vocabulary, made on the first constrained request.
    grammars: OnceLock<Result<Arc<Grammars>, String>>,
}

impl Model {
    /// The tokenizer (checked at load).
    pub(crate) fn tokenizer(&self) -> &qkv::tokenizer::Tokenizer {
        self.inner.tokenizer().expect("checked at load")
    }

    fn compile(&self, c: &OutputConstraint) -> Result<Box<dyn TokenConstraint>, ApiError> {
        let g = self.grammar_compiler().map_err(|e| {
            ApiError::invalid(
                c.param(),
                format!("constrained output is not available: {e}"),
            )
        })?;
        Ok(Box::new(g.compile(c)?))
    }

    fn grammar_compiler(&self) -> Result<Arc<Grammars>, String> {
        self.grammars
            .get_or_init(|| Grammars::new(self.inner.clone()).map(Arc::new))
            .clone()
    }

    /// Reads a completion body (OpenAI's `/v1/completions` fields) into a plan.
    fn completion_plan(&self, body: &str, seed: u64) -> Result<Plan, ApiError> {
        let b = Body::parse(body.as_bytes())?;
        let params = request::params(&b, false, || seed)?;
        check_supported(&params)?;
        let prompt = match request::completion_prompt(&b)? {
            Prompt::Text(t) => self.tokenizer().encode(&t)?,
            Prompt::Ids(ids) => ids,
        };
        let constraint = match output_constraint(&b)? {
            Some(c) => Some(self.compile(&c)?),
            None => None,
        };
        Plan::new(prompt, params, constraint, None)
    }

    /// Reads a chat body (OpenAI's `/v1/chat/completions` fields) into a plan: the messages
    /// through the model's template (with the tools), the output constraint (a schema, a
    /// grammar, forced tool calls, strict calls), and how the reply is parsed.
    fn chat_plan(&self, body: &str, seed: u64, no_reasoning: bool) -> Result<Plan, ApiError> {
        let b = Body::parse(body.as_bytes())?;
        let params = request::params(&b, true, || seed)?;
        check_supported(&params)?;
        let (msgs, raw_tools) = request::chat_messages(&b)?;
        let tool_req = tools::tool_request(&b, raw_tools.as_deref())?;
        let output = output_constraint(&b)?;
        let template = self.tokenizer().chat_template();
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
                    self.compile(&c)?;
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
                constraint = Some(self.compile(&c)?);
            }
        }
        if let Some(o) = &output {
            constraint = Some(self.compile(o)?);
        }
        if let (Some(t), None) = (&tool_req, &output) {
            if let Ok(g) = self.grammar_compiler() {
                if let Some(c) =
                    qkv_server::strict_calls::strict_calls(t, format, &g, self.inner.clone())?
                {
                    constraint = Some(Box::new(c));
                }
            }
        }
        let names: Vec<String> = match &tool_req {
            Some(t) if t.choice != ToolChoice::None => {
                t.tools.iter().map(|t| t.name.clone()).collect()
            }
            _ => Vec::new(),
        };
        let think = template.is_some_and(|t| t.contains("<think>"));
        let parse = (!names.is_empty() || think).then_some((format, names));
        let text = self.render(&b, msgs, raw_tools, tool_req.as_ref(), no_reasoning)?;
        let prompt = self.tokenizer().encode(&text)?;
        Plan::new(prompt, params, constraint, parse)
    }

    /// The chat prompt's text, rendered as qkv-server renders it: a last assistant message
    /// is continued rather than closed, the template gets the tools, `enable_thinking` and
    /// today's date.
    fn render(
        &self,
        b: &Body,
        msgs: Vec<Value>,
        raw_tools: Option<Vec<Value>>,
        tool_req: Option<&tools::ToolRequest>,
        no_reasoning: bool,
    ) -> Result<String, ApiError> {
        let tokenizer = self.tokenizer();
        let template = tokenizer.chat_template();
        let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
        let n = msgs.len();
        if n >= 2
            && role(&msgs[n - 1]).as_deref() == Some("assistant")
            && role(&msgs[n - 2]).as_deref() == Some("assistant")
        {
            return Err(ApiError::invalid(
                &format!("messages[{}]", n - 1),
                "two assistant messages in a row end the conversation: only the last one may \
                 be continued",
            ));
        }
        let prefill = match msgs.last() {
            Some(m) if role(m).as_deref() == Some("assistant") && m.get("tool_calls").is_none() => {
                m.get("content").and_then(Value::as_str).map(str::to_owned)
            }
            _ => None,
        };
        let mut msgs = msgs;
        if prefill.is_some() {
            msgs.pop();
        }
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), Value::Bool(!no_reasoning));
        let date = |format| Value::from(qkv::tokenizer::strftime_now(format));
        extra.insert("date_string".into(), date("%d %b %Y"));
        extra.insert("datetime".into(), date("%b %d %Y"));
        let functions = match raw_tools.as_deref() {
            Some(t) if !t.is_empty() => serde_json::to_string_pretty(t).unwrap_or_default(),
            _ => String::new(),
        };
        extra.insert("functions".into(), Value::String(functions));
        let _ = b;
        let options = qkv::tokenizer::ChatOptions {
            add_generation_prompt: true,
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
        let mut text = tokenizer
            .render_chat(&msgs, &options)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        if no_reasoning && text.trim_end().ends_with("<think>") {
            text.push_str("</think>");
        }
        if let Some(p) = prefill {
            text.push_str(&p);
        }
        Ok(text)
    }
}

/// Refuses what a plan cannot carry out: several choices, a logit bias.
fn check_supported(p: &request::Params) -> Result<(), ApiError> {
    if p.n != 1 {
        return Err(ApiError::invalid(
            "n",
            "only one choice per request (`n: 1`)",
        ));
    }
    if !p.logit_bias.is_empty() {
        return Err(ApiError::invalid(
            "logit_bias",
            "`logit_bias` is not supported here",
        ));
    }
    Ok(())
}

#[pymethods]
impl Model {
    /// Loads `path` (a GGUF file or a Hugging Face directory), or the default model when it
    /// is `None`. `act_bits` (16 or 8) is the precision at which activations meet quantized
    /// weights; `dtype` (`"f32"`, `"f16"`) widens or rounds the weight matrices at load.
    #[new]
    #[pyo3(signature = (path = None, act_bits = None, dtype = None))]
    fn new(
        py: Python<'_>,
        path: Option<PathBuf>,
        act_bits: Option<u8>,
        dtype: Option<&str>,
    ) -> PyResult<Model> {
        use qkv::kernels::quant::{act::ActPrecision, x8};
        let act_precision = match act_bits {
            None => x8::DEFAULT_ACT_PRECISION,
            Some(b) => ActPrecision::try_from(b)
                .map_err(|e| errors::invalid(format!("act_bits {b}: {e}")))?,
        };
        let dtype = match dtype {
            None => None,
            Some(d) => Some(
                d.parse::<qkv::weights::FloatType>()
                    .map_err(|e| errors::invalid(format!("dtype {d:?}: {e}")))?,
            ),
        };
        let options = ModelOptions {
            dtype,
            act_precision,
            interleave: std::env::var_os("QKV_NO_INTERLEAVE").is_none_or(|v| v == "0"),
        };
        let loaded = py.allow_threads(|| -> Result<qkv::load::Model, String> {
            let path = match path {
                Some(p) => p,
                None => qkv_fetch::default_model().map_err(|e| e.to_string())?,
            };
            let model = qkv::load::Model::load(&path, &options).map_err(|e| e.to_string())?;
            if model.tokenizer().is_none() {
                return Err(format!("{}: the model has no tokenizer", path.display()));
            }
            Ok(model)
        });
        let inner = loaded.map_err(|e| errors::err("ModelLoadError", e))?;
        Ok(Model {
            inner: Arc::new(inner),
            grammars: OnceLock::new(),
        })
    }

    /// The file or directory the model was loaded from.
    #[getter]
    fn path(&self) -> String {
        self.inner.path().to_string_lossy().into_owned()
    }

    /// The context length the model was trained with.
    #[getter]
    fn n_ctx_train(&self) -> usize {
        self.inner.config().context
    }

    /// Tokens in the vocabulary (the length of a row of logits).
    #[getter]
    fn n_vocab(&self) -> usize {
        self.inner.vocab_size()
    }

    /// The end-of-sequence token, if the tokenizer has one.
    #[getter]
    fn token_eos(&self) -> Option<u32> {
        self.tokenizer().eos_id()
    }

    /// The beginning-of-sequence token, if the tokenizer has one.
    #[getter]
    fn token_bos(&self) -> Option<u32> {
        self.tokenizer().bos_id()
    }

    /// The model's chat template (Jinja source), if it has one.
    #[getter]
    fn chat_template(&self) -> Option<String> {
        self.tokenizer().chat_template().map(str::to_owned)
    }

    /// The token ids of `text`; `add_special` adds the tokenizer's BOS (and suffix) tokens,
    /// `parse_special` reads control-token texts (`<|im_end|>`) as those tokens.
    #[pyo3(signature = (text, add_special = true, parse_special = true))]
    fn tokenize(
        &self,
        py: Python<'_>,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> PyResult<Vec<u32>> {
        let opts = qkv::tokenizer::EncodeOptions {
            add_special,
            parse_special,
        };
        py.allow_threads(|| self.tokenizer().encode_with(text, opts))
            .map_err(from_qkv)
    }

    /// The bytes of `ids` as the model spells them, special tokens included.
    fn detokenize<'py>(&self, py: Python<'py>, ids: Vec<u32>) -> PyResult<Bound<'py, PyBytes>> {
        let tokenizer = self.tokenizer();
        let mut out = Vec::new();
        for id in ids {
            out.extend_from_slice(tokenizer.token_bytes(id).map_err(from_qkv)?);
        }
        Ok(PyBytes::new(py, &out))
    }

    /// Whether `id` is a control token (end of turn, role markers).
    fn is_special(&self, id: u32) -> bool {
        self.tokenizer().is_special(id)
    }

    /// A completion request (a JSON object with OpenAI's `/v1/completions` fields) read into
    /// a plan; `seed` is the sampler's seed when the request sets none.
    #[pyo3(signature = (body, seed = 0))]
    fn plan_completion(&self, py: Python<'_>, body: &str, seed: u64) -> PyResult<Plan> {
        py.allow_threads(|| self.completion_plan(body, seed))
            .map_err(from_api)
    }

    /// A chat request (a JSON object with OpenAI's `/v1/chat/completions` fields) read into a
    /// plan; `no_reasoning` renders the template with `enable_thinking: false`.
    #[pyo3(signature = (body, seed = 0, no_reasoning = false))]
    fn plan_chat(
        &self,
        py: Python<'_>,
        body: &str,
        seed: u64,
        no_reasoning: bool,
    ) -> PyResult<Plan> {
        py.allow_threads(|| self.chat_plan(body, seed, no_reasoning))
            .map_err(from_api)
    }

    fn __repr__(&self) -> String {
        format!("<qkv Model {}>", self.inner.path().display())
    }
}

/// A request read and checked: its prompt ids, sampling, limits, and the constraint its
/// output follows. A plan runs once (its constraint is taken by the run).
#[pyclass(module = "qkv._native", frozen)]
pub struct Plan {
    /// The prompt's token ids.
    #[pyo3(get)]
    pub prompt: Vec<u32>,
    pub(crate) sampler: SamplerConfig,
    /// Most tokens to generate (`None`: until the context is full).
    #[pyo3(get)]
    pub max_tokens: Option<usize>,
    /// Stop strings.
    #[pyo3(get)]
    pub stop: Vec<String>,
    /// Whether the answer streams.
    #[pyo3(get)]
    pub stream: bool,
    /// Whether a streamed answer ends with a usage chunk.
    #[pyo3(get)]
    pub include_usage: bool,
    /// Keep going past the end-of-sequence token.
    #[pyo3(get)]
    pub ignore_eos: bool,
    /// Whether log-probabilities are wanted.
    #[pyo3(get)]
    pub logprobs: bool,
    /// How many alternatives per token with their log-probabilities.
    #[pyo3(get)]
    pub top_logprobs: usize,
    pub(crate) constraint: Mutex<Option<Box<dyn TokenConstraint>>>,
    pub(crate) parse: Option<(ToolFormat, Vec<String>)>,
}

impl Plan {
    fn new(
        prompt: Vec<u32>,
        p: request::Params,
        constraint: Option<Box<dyn TokenConstraint>>,
        parse: Option<(ToolFormat, Vec<String>)>,
    ) -> Result<Plan, ApiError> {
        if prompt.is_empty() {
            return Err(ApiError::invalid(
                "prompt",
                "the prompt encodes to no tokens",
            ));
        }
        Ok(Plan {
            prompt,
            sampler: p.sampler,
            max_tokens: p.max_tokens,
            stop: p.stop,
            stream: p.stream,
            include_usage: p.include_usage,
            ignore_eos: p.ignore_eos,
            logprobs: p.logprobs,
            top_logprobs: p.top_logprobs,
            constraint: Mutex::new(constraint),
            parse,
        })
    }

    /// The constraint, taken (a plan runs once).
    pub(crate) fn take_constraint(&self) -> Option<Box<dyn TokenConstraint>> {
        self.constraint.lock().ok().and_then(|mut c| c.take())
    }
}

#[pymethods]
impl Plan {
    /// Whether the output follows a constraint (a schema, a grammar, forced tool calls).
    #[getter]
    fn constrained(&self) -> bool {
        self.constraint.lock().is_ok_and(|c| c.is_some())
    }

    /// The sampler's temperature.
    #[getter]
    fn temperature(&self) -> f32 {
        self.sampler.temperature
    }

    /// The sampler's seed.
    #[getter]
    fn seed(&self) -> u64 {
        self.sampler.seed
    }

    /// A parser of the reply (tool calls, reasoning), or `None` when the reply is plain text.
    fn reply_parser(&self) -> Option<ReplyParser> {
        self.parse.as_ref().map(|(format, names)| ReplyParser {
            format: *format,
            names: names.clone(),
            stream: Mutex::new(qkv_server::tool_stream::ReplyStream::new(
                *format,
                names.clone(),
            )),
        })
    }
}

/// A chat reply read into reasoning, content and tool calls, whole or while it streams.
#[pyclass(module = "qkv._native", frozen)]
pub struct ReplyParser {
    format: ToolFormat,
    names: Vec<String>,
    stream: Mutex<qkv_server::tool_stream::ReplyStream>,
}

type PieceTuple = (String, Option<usize>, String);

fn pieces(ps: Vec<qkv_server::tool_stream::Piece>) -> Vec<PieceTuple> {
    use qkv_server::tool_stream::Piece;
    ps.into_iter()
        .map(|p| match p {
            Piece::Reasoning(t) => ("reasoning".to_string(), None, t),
            Piece::Content(t) => ("content".to_string(), None, t),
            Piece::CallStart { index, name } => ("call_start".to_string(), Some(index), name),
            Piece::CallArgs { index, fragment } => ("call_args".to_string(), Some(index), fragment),
        })
        .collect()
}

fn reply_json(reply: &tools::Reply, id_prefix: &str) -> String {
    serde_json::json!({
        "content": reply.content,
        "reasoning": reply.reasoning,
        "tool_calls": tools::openai_calls(&reply.calls, id_prefix),
    })
    .to_string()
}

#[pymethods]
impl ReplyParser {
    /// The new pieces of a streamed reply whose whole text so far is `text`: tuples
    /// `(kind, call index or None, text)`, kind one of `reasoning`, `content`, `call_start`
    /// (the text is the function's name) and `call_args` (a fragment of its JSON arguments).
    fn update(&self, text: &str) -> PyResult<Vec<PieceTuple>> {
        let mut s = self
            .stream
            .lock()
            .map_err(|_| errors::err("QkvError", "reply parser poisoned"))?;
        Ok(pieces(s.update(text)))
    }

    /// The last pieces of the streamed reply whose whole text is `text`, and the reply read
    /// whole as JSON text (`content`, `reasoning`, `tool_calls` in OpenAI's shape with ids
    /// made from `id_prefix`).
    fn finish(&self, text: &str, id_prefix: &str) -> PyResult<(Vec<PieceTuple>, String)> {
        let mut s = self
            .stream
            .lock()
            .map_err(|_| errors::err("QkvError", "reply parser poisoned"))?;
        let (ps, reply) = s.finish(text);
        Ok((pieces(ps), reply_json(&reply, id_prefix)))
    }

    /// A whole reply read at once, as JSON text (see [`finish`](Self::finish)).
    fn parse(&self, text: &str, id_prefix: &str) -> String {
        let reply = tools::parse_reply(self.format, text, &self.names);
        reply_json(&reply, id_prefix)
    }
}
