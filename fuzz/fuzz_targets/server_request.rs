//! qkv-server's request bodies: a body is parsed (`qkv_server::body::Body::parse`), read as
//! each route reads it (chat `messages`, completion `prompt` forms, tokenize and detokenize
//! fields, the embeddings route's `input` forms and `encoding_format`, the shared parameters
//! in chat and legacy spellings), and, when accepted, the
//! generation answered (`openai::generate`: stop strings, log probabilities, usage, whole or
//! streamed as SSE) on a tiny synthetic model whose context (64 positions) bounds every run.
//! llama-server's native fields (`qkv_server::native_fields`: the `/completion` prompt forms,
//! `n_predict`, `n_probs`, `logit_bias` in both shapes, `samplers`, `response_fields`) are
//! read too, `logit_bias` reaches the engine through the shared parameters (`n` as well),
//! and `chat::render` renders what `/apply-template` answers.
//! The structured-output and tool fields (`response_format`, `json_schema`, `grammar`,
//! `tools`, `tool_choice`, `parallel_tool_calls`) are read and compiled with llguidance as
//! the chat route does (`chat::prepare`), the generation then follows the constraint, and
//! the text fields are also fed to the tool-call parser of every family format, whole and as a
//! stream read prefix by prefix (`qkv_server::tool_stream`). Anthropic Messages and Responses
//! bodies are rewritten as chat bodies (`qkv_server::compat`), which are then read and prepared
//! as the chat route does; `strict` tools under `auto` compile their lazy constraint there.
//!
//! The response code is a binary's module (server/src/bin/qkv-server/), compiled in with
//! `#[path]` below; the parsing is qkv-server's library.
#![no_main]

#[allow(dead_code)]
#[path = "../../server/src/bin/qkv-server/chat.rs"]
mod chat;
#[allow(dead_code)]
#[path = "../../server/src/bin/qkv-server/generation.rs"]
mod generation;
#[allow(dead_code)]
#[path = "../../server/src/bin/qkv-server/metrics.rs"]
mod metrics;
#[allow(dead_code)]
#[path = "../../server/src/bin/qkv-server/openai.rs"]
mod openai;
#[allow(dead_code)]
#[path = "../../server/src/bin/qkv-server/worker.rs"]
mod worker;

use libfuzzer_sys::fuzz_target;
use qkv::engine::{Engine, EngineOptions};
use qkv::load::Model;
use qkv::models::decoder::{Decoder, DecoderConfig, WeightLayout};
use qkv::tokenizer::Tokenizer;
use qkv::weights::gguf::{write_gguf, GgufFile, MetaValue, MetaValueType};
use qkv::weights::FloatType;
use qkv_server::body::Body;
use qkv_server::request::{self, Prompt};
use std::sync::{Arc, OnceLock};

/// What the generation handlers see: the fields of `AppState` in
/// server/src/bin/qkv-server/main.rs that openai.rs reads.
pub struct AppState {
    pub model: Arc<Model>,
    pub model_name: String,
    pub context: usize,
    pub worker: worker::Worker,
    pub grammars: Result<qkv_server::constraint::Grammars, String>,
    pub options: chat::ServeOptions,
    pub lora: NoAdapters,
}

/// The adapters of a server started without `--lora` (the binary's `lora::Adapters` is made
/// from files, and its routes need the binary's root): a request naming an adapter is
/// refused, as that server refuses it, and none runs.
pub struct NoAdapters;

impl NoAdapters {
    pub fn for_request(
        &self,
        asked: Option<&[(usize, f32)]>,
    ) -> Result<Vec<qkv::models::decoder::ScaledLora>, qkv_server::error::ApiError> {
        match asked.and_then(|l| l.first()) {
            Some((id, _)) => Err(qkv_server::error::ApiError::invalid(
                "lora",
                format!("no adapter has id {id}: the server has none"),
            )),
            None => Ok(Vec::new()),
        }
    }
}

const CONTEXT: usize = 64;

/// A byte-level vocabulary (the 256 bytes and ChatML's markers) and a one-layer Llama of
/// width 8 over it, with random weights.
fn setup() -> (tokio::runtime::Runtime, Arc<AppState>) {
    let mut tokens: Vec<String> = qkv::tokenizer::gpt2_byte_chars()
        .iter()
        .map(char::to_string)
        .collect();
    tokens.extend(["<|im_start|>", "<|im_end|>"].map(String::from));
    let mut types = vec![MetaValue::I32(1); 256];
    types.extend([MetaValue::I32(3), MetaValue::I32(3)]);
    let vocab = tokens.len();
    let meta = vec![
        (
            "tokenizer.ggml.model".to_string(),
            MetaValue::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_string(),
            MetaValue::Array(
                MetaValueType::String,
                tokens.into_iter().map(MetaValue::String).collect(),
            ),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            MetaValue::Array(MetaValueType::I32, types),
        ),
        (
            "tokenizer.ggml.merges".to_string(),
            MetaValue::Array(MetaValueType::String, Vec::new()),
        ),
        (
            "tokenizer.ggml.eos_token_id".to_string(),
            MetaValue::U32(257),
        ),
    ];
    let path = qkv_fuzz::scratch_dir().join("server-vocab.gguf");
    write_gguf(&path, &meta, &[]).expect("writing the vocabulary");
    let tokenizer = Tokenizer::from_gguf(&GgufFile::open(&path).expect("reading it back"))
        .expect("building the tokenizer");
    let config = DecoderConfig {
        head_dim: 4,
        ..DecoderConfig::llama(8, 1, 2, 1, 16, vocab, CONTEXT, WeightLayout::Gguf)
    };
    let decoder = Decoder::synthetic(config, 1, FloatType::F32).expect("a synthetic decoder");
    let model = Arc::new(Model::from_parts(decoder, Some(tokenizer)));
    let options = EngineOptions {
        max_sequences: 2,
        context: CONTEXT,
        step_tokens: 64,
        ..EngineOptions::default()
    };
    let engine = Engine::new(model.clone(), options).expect("an engine");
    let state = AppState {
        grammars: qkv_server::constraint::Grammars::new(model.clone()),
        model,
        model_name: "tiny".into(),
        context: CONTEXT,
        worker: worker::Worker::spawn(engine, Arc::new(metrics::Metrics::default()), None),
        options: chat::ServeOptions::default(),
        lora: NoAdapters,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    (runtime, Arc::new(state))
}

static STATE: OnceLock<(tokio::runtime::Runtime, Arc<AppState>)> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let (runtime, state) = STATE.get_or_init(setup);
    let Ok(body) = Body::parse(data) else {
        return;
    };
    // What each route reads of a body, besides the shared parameters.
    let _ = request::chat_messages(&body);
    let _ = request::tokenize_fields(&body);
    let _ = request::detokenize_tokens(&body);
    let _ = body.str("suffix");
    let _ = body.bool("echo", false);
    if let Ok(f) = qkv_server::embedding::fields(&body) {
        if let qkv_server::embedding::Input::Ids(seqs) = &f.input {
            for s in seqs {
                let v: Vec<f32> = s.iter().map(|&t| f32::from_bits(t)).collect();
                let _ = qkv_server::embedding::base64_f32(&v);
            }
        }
    }
    let _ = qkv_server::structured::output_constraint(&body);
    // llama-server's native fields: the prompt forms, n_predict, n_probs, logit_bias,
    // samplers, response_fields, stop lists, cache_prompt, id_slot, return_tokens.
    let _ = qkv_server::native_fields::prompts(&body);
    // The decoder's embeddings read `input` (or `content`) as prompts, with content parts.
    let _ = qkv_server::native_fields::prompts_in(&body, "input");
    let _ = qkv_server::native_fields::prompts_in(&body, "content");
    let _ = qkv_server::embedding::format(&body);
    let _ = qkv_server::native_fields::logit_bias(&body, "logit_bias");
    if let Ok(f) = qkv_server::native_fields::fields(&body) {
        let _ = body
            .field("content")
            .map(|v| qkv_server::native_fields::select_fields(v, &f.response_fields));
    }
    // The chat prompt as /apply-template renders it (message order, prefill,
    // continue_final_message and add_generation_prompt).
    let _ = chat::render(&state, &body);
    let raw_tools = body.field("tools").and_then(|t| t.as_array()).cloned();
    let names: Vec<String> = match qkv_server::tools::tool_request(&body, raw_tools.as_deref()) {
        Ok(Some(t)) => {
            for f in [
                qkv_server::tools::ToolFormat::Hermes,
                qkv_server::tools::ToolFormat::Llama3,
                qkv_server::tools::ToolFormat::Mistral,
                qkv_server::tools::ToolFormat::Generic,
            ] {
                let _ = t.forced_grammar(f);
            }
            t.tools.iter().map(|t| t.name.clone()).collect()
        }
        _ => Vec::new(),
    };
    for text in [body.str("prompt"), body.str("content")]
        .into_iter()
        .flatten()
        .flatten()
    {
        for f in [
            qkv_server::tools::ToolFormat::Hermes,
            qkv_server::tools::ToolFormat::Mistral,
            qkv_server::tools::ToolFormat::Generic,
        ] {
            let _ = qkv_server::tools::parse_reply(f, text, &names);
            let mut stream = qkv_server::tool_stream::ReplyStream::new(f, names.clone());
            for (k, _) in text.char_indices().step_by(3) {
                let _ = stream.update(&text[..k]);
            }
            let _ = stream.finish(text);
        }
    }
    // The other APIs' bodies, rewritten as chat bodies and read as the chat route reads them.
    for translated in [
        qkv_server::compat::anthropic_to_chat(&body),
        qkv_server::compat::responses_to_chat(&body),
    ]
    .into_iter()
    .flatten()
    {
        if let Ok(b) = Body::parse(translated.to_string().as_bytes()) {
            let _ = request::params(&b, true, || 7);
            if let Ok((ids, post)) = chat::prepare(&state, &b) {
                drop((ids, post));
            }
        }
    }
    let chat_params = request::params(&body, true, || 7);
    let legacy_params = request::params(&body, false, || 7);
    let tokenizer = state.model.tokenizer().expect("the model has a tokenizer");
    let prompt = match request::completion_prompt(&body) {
        Ok(Prompt::Text(text)) => tokenizer.encode(&text).unwrap_or_default(),
        Ok(Prompt::Ids(ids)) if !ids.is_empty() && ids.len() < CONTEXT => ids,
        _ => vec![256, 72, 105, 257],
    };
    for (kind, params) in [
        (generation::Kind::Chat, chat_params),
        (generation::Kind::Completion, legacy_params),
    ] {
        let Ok(params) = params else { continue };
        // The chat route's prompt and constraint, when its fields are accepted.
        let (prompt, post) = match kind {
            generation::Kind::Chat => match chat::prepare(&state, &body) {
                Ok((ids, post)) if !ids.is_empty() && ids.len() < CONTEXT => (ids, post),
                Ok(_) => continue,
                Err(_) => (prompt.clone(), chat::Post::default()),
            },
            generation::Kind::Completion => match chat::completion_post(&state, &body) {
                Ok(post) => (prompt.clone(), post),
                Err(_) => continue,
            },
        };
        runtime.block_on(async {
            if let Ok(response) =
                openai::generate(state.clone(), kind, prompt.clone(), params, post).await
            {
                let _ = axum::body::to_bytes(response.into_body(), usize::MAX).await;
            }
        });
    }
});
