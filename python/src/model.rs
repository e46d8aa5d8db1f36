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
use qkv_server::chat_prompt::{self, ChatSetup, Post};
use qkv_server::constraint::Grammars;
use qkv_server::error::ApiError;
use qkv_server::request::{self, Prompt};
use qkv_server::tools::{self, ToolFormat};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// A decoder-only model and its tokenizer (a GGUF file or a Hugging Face directory).
#[pyclass(module = "qkv._native", frozen)]
pub struct Model {
    pub(crate) inner: Arc<qkv::load::Model>,
    /// The grammar compiler over the vocabulary, made on the first request that needs it.
    grammars: OnceLock<Result<Grammars, String>>,
}

impl Model {
    /// The tokenizer (checked at load).
    pub(crate) fn tokenizer(&self) -> &qkv::tokenizer::Tokenizer {
        self.inner.tokenizer().expect("checked at load")
    }

    /// The grammar compiler over the vocabulary, built on the first request that needs it.
    fn grammars(&self) -> Result<&Grammars, &str> {
        match self
            .grammars
            .get_or_init(|| Grammars::new(self.inner.clone()))
        {
            Ok(g) => Ok(g),
            Err(e) => Err(e.as_str()),
        }
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
        let grammars = || self.grammars();
        let post = chat_prompt::completion_post(&self.setup(&grammars, false), &b)?;
        Plan::new(prompt, params, post)
    }

    /// Reads a chat body (OpenAI's `/v1/chat/completions` fields) into a plan, as
    /// qkv-server's chat route reads it: the messages through the model's template (with the
    /// tools), the output constraint (a schema, a grammar, forced tool calls, strict calls),
    /// and how the reply is parsed.
    fn chat_plan(&self, body: &str, seed: u64, no_reasoning: bool) -> Result<Plan, ApiError> {
        let b = Body::parse(body.as_bytes())?;
        let params = request::params(&b, true, || seed)?;
        check_supported(&params)?;
        let grammars = || self.grammars();
        let (prompt, post) = chat_prompt::prepare(&self.setup(&grammars, no_reasoning), &b)?;
        Plan::new(prompt, params, post)
    }

    /// The model as the library's chat preparation takes it: its own template, the grammar
    /// compiler `grammars` hands out.
    fn setup<'a>(
        &'a self,
        grammars: &'a dyn Fn() -> Result<&'a Grammars, &'a str>,
        no_reasoning: bool,
    ) -> ChatSetup<'a> {
        ChatSetup {
            model: &self.inner,
            template: None,
            no_reasoning,
            grammars,
        }
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
    fn new(prompt: Vec<u32>, p: request::Params, post: Post) -> Result<Plan, ApiError> {
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
            constraint: Mutex::new(post.constraint),
            parse: post.parse.map(|r| (r.format, r.names)),
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
