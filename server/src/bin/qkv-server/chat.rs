//! The server's settings the handlers read, and its chat requests prepared by the library's
//! [`qkv_server::chat_prompt`] (the prompt, the constraint its output follows, how the
//! reply is read back) with the server's model, template and grammar compiler.

use crate::AppState;
use qkv_server::body::Body;
use qkv_server::chat_prompt::{self, ChatSetup};
use qkv_server::error::ApiError;

pub use qkv_server::chat_prompt::{Post, ReplyParse};

/// The server's settings the handlers read besides the model (qkv-server's flags).
#[derive(Default, Clone)]
pub struct ServeOptions {
    /// A chat template that replaces the model's (`--chat-template-file`), and its path.
    pub template: Option<(String, String)>,
    /// `--reasoning off`: templates render with `enable_thinking: false`, and a prompt that
    /// ends inside an opened thinking block gets it closed.
    pub no_reasoning: bool,
    /// The most tokens a request that does not say generates (`--n-predict`; `None`: until
    /// the context).
    pub n_predict: Option<usize>,
    /// The default temperature and seed of requests that give none (`--temp`, `--seed`).
    pub temperature: Option<f32>,
    pub seed: Option<u64>,
    /// `--verbose`: every OpenAI answer carries `__verbose` (prompt text, raw output).
    pub verbose: bool,
    /// Whether `/slots` and `/metrics` answer.
    pub slots: bool,
    pub metrics: bool,
    /// The model's path, and how many sequences run at once (for `/props`).
    pub model_path: String,
    pub max_sequences: usize,
    /// `--embeddings`: how embeddings pool the hidden states (`None`: not served).
    pub pooling: Option<qkv_server::embedding::Pooling>,
    /// `--spec`, `--spec-max`, `--spec-min`, `--model-draft`: the speculation of requests
    /// that do not say.
    pub speculation: qkv::speculative::Speculation,
    /// `--model-draft`: whether requests may draft with a second model.
    pub draft_model: bool,
    /// `--slot-save-path`: where `POST /slots/{id}` keeps saved slots (`None`: the route
    /// answers 501).
    pub slot_save_path: Option<std::path::PathBuf>,
    /// `--context-shift`, and `--keep`: the `n_keep` of requests that give none.
    pub context_shift: bool,
    pub n_keep: i64,
    /// `--spm-infill`: `/infill` puts the suffix before the prefix.
    pub spm_infill: bool,
    /// llama-server's batch size (`--batch-size`, default 2048), which sizes `/infill`'s
    /// prefix and suffix.
    pub n_batch: usize,
}

/// The chat template the server renders with: `--chat-template-file`'s, else the model's.
pub fn template_source(state: &AppState) -> Option<&str> {
    match &state.options.template {
        Some((_, source)) => Some(source.as_str()),
        None => state.model.tokenizer()?.chat_template(),
    }
}

/// The server's model, template, grammar compiler and reasoning setting, as the library's
/// chat preparation takes them; `grammars` is the closure that hands out `state.grammars`.
fn setup<'a>(
    state: &'a AppState,
    grammars: &'a dyn Fn() -> Result<&'a qkv_server::constraint::Grammars, &'a str>,
) -> ChatSetup<'a> {
    ChatSetup {
        model: &state.model,
        template: state
            .options
            .template
            .as_ref()
            .map(|(path, source)| (path.as_str(), source.as_str())),
        no_reasoning: state.options.no_reasoning,
        grammars,
    }
}

/// The completion route's constraint (`response_format`, `json_schema` or `grammar`).
pub fn completion_post(state: &AppState, b: &Body) -> Result<Post, ApiError> {
    let grammars = || state.grammars.as_ref().map_err(String::as_str);
    chat_prompt::completion_post(&setup(state, &grammars), b)
}

/// The chat prompt's text for `b` (what `/apply-template` answers).
pub fn render(state: &AppState, b: &Body) -> Result<String, ApiError> {
    let grammars = || state.grammars.as_ref().map_err(String::as_str);
    chat_prompt::render(&setup(state, &grammars), b)
}

/// The chat route's prompt (the messages, with tool calls and tool results, through the
/// server's template) and its [`Post`].
pub fn prepare(state: &AppState, b: &Body) -> Result<(Vec<u32>, Post), ApiError> {
    let grammars = || state.grammars.as_ref().map_err(String::as_str);
    chat_prompt::prepare(&setup(state, &grammars), b)
}
