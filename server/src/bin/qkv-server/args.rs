//! `qkv-server`'s command line.

use clap::Parser;
use qkv::engine::EngineOptions;
use std::path::PathBuf;

// The flags of `qkv-server` (the routes are in main.rs's introduction). A plain comment:
// clap would print a doc comment in `--help`.
#[derive(Parser, Debug)]
#[command(
    name = "qkv-server",
    version,
    about = "OpenAI-compatible server for qkv models"
)]
pub(crate) struct Args {
    /// A GGUF file or a Hugging Face directory; default: SmolLM2-135M-Instruct, fetched once.
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    /// Widen every weight matrix to this dtype at load (f16 or f32); by default each runs as
    /// stored, quantized blocks included.
    #[arg(long)]
    pub(crate) dtype: Option<qkv::weights::FloatType>,
    /// Addresses to listen on, comma-separated (`127.0.0.1,::1`), all on `--port`.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub(crate) port: u16,
    /// Worker threads for the model (default: one per core).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Activations meet interleaved weights (Q4_0, Q4_1, Q4_K, Q6_K, Q8_0) as 8-bit or 16-bit
    /// integers (default 8, as llama.cpp does; 16 is the exact mode, slower on prompts and
    /// batched steps).
    #[arg(long = "act-bits", value_name = "BITS", env = "QKV_ACT_BITS")]
    pub(crate) act_bits: Option<qkv::kernels::quant::act::ActPrecision>,
    /// Most sequences generated at once.
    #[arg(long, default_value_t = 16)]
    pub(crate) max_sequences: usize,
    /// Most megabytes all KV caches may take together (default: max-sequences caches).
    #[arg(long, value_name = "MB")]
    pub(crate) kv_budget: Option<usize>,
    /// Positions per sequence (prompt and generated tokens).
    #[arg(long, default_value_t = 2048)]
    pub(crate) ctx: usize,
    /// How the KV caches store keys and values: f32, f16 or q8_0 (Q8_0 blocks, as
    /// llama.cpp's `-ctk q8_0 -ctv q8_0`: about half the bytes of f16, so a --kv-budget holds
    /// twice the sequences); default: the weights' compute dtype.
    #[arg(long = "kv-type", value_name = "TYPE")]
    pub(crate) kv_type: Option<qkv::models::decoder::KvType>,
    /// Most requests waiting for a free sequence; more get 429.
    #[arg(long, default_value_t = 64)]
    pub(crate) queue: usize,
    /// Most tokens one engine step runs while more sequences decode than read prompts
    /// (decode tokens first, then prompt chunks): bounds how long a new prompt stalls the
    /// running streams. Several prompts read at once take up to this many each.
    #[arg(long, default_value_t = EngineOptions::default().step_tokens)]
    pub(crate) step_tokens: usize,
    /// Most tokens a step runs when as many sequences read prompts as decode (a burst).
    #[arg(long, default_value_t = EngineOptions::default().prefill_step_tokens)]
    pub(crate) prefill_step_tokens: usize,
    /// Largest request body accepted, in KiB; larger ones get 413.
    #[arg(long, value_name = "KB", default_value_t = 1024)]
    pub(crate) body_limit: usize,
    /// A name of the model in the API (default: the file or directory name). Repeatable:
    /// the first is the name responses report, and every one is listed by `/v1/models`. A
    /// request may name any model: this server runs one and answers with it.
    #[arg(long = "model-name", value_name = "NAME")]
    pub(crate) model_names: Vec<String>,
    /// llama-server's form: the model's names, comma-separated. `/v1/models` lists it once,
    /// as the first name in sorted order (the name responses report), with every name in
    /// `aliases`. Not with `--model-name`.
    #[arg(long, value_name = "NAMES")]
    pub(crate) alias: Option<String>,
    /// Tags `/v1/models` lists for the model, comma-separated.
    #[arg(long, value_name = "TAGS")]
    pub(crate) tags: Option<String>,
    /// Seconds running requests get to finish after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 30)]
    pub(crate) grace: u64,
    /// A key clients must send as `Authorization: Bearer KEY` (repeatable). With any key,
    /// every route but `/health` needs one (`/metrics` too, unless `--metrics-public`).
    #[arg(long = "api-key", value_name = "KEY")]
    pub(crate) api_keys: Vec<String>,
    /// A file of keys, one per line (blank lines and lines starting with `#` are skipped);
    /// taken with any `--api-key`.
    #[arg(long, value_name = "PATH")]
    pub(crate) api_key_file: Option<PathBuf>,
    /// Serve `/metrics` without a key even when keys are set.
    #[arg(long)]
    pub(crate) metrics_public: bool,
    /// Also export the request and KV cache gauges under vLLM's names
    /// (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:gpu_cache_usage_perc`).
    #[arg(long)]
    pub(crate) metrics_vllm_names: bool,
    /// Also export llama-server's counters and gauges under its names (`llamacpp:…`).
    #[arg(long)]
    pub(crate) metrics_llamacpp_names: bool,
    /// Add `__verbose` (the prompt as text, the raw output) to every OpenAI-shaped answer,
    /// as llama-server's `--verbose` does.
    #[arg(long)]
    pub(crate) verbose: bool,
    /// Browser origins allowed to call the server (CORS), comma-separated: `*` for any,
    /// `localhost` for localhost, 127.0.0.1 and `[::1]` on any port, or origins as written.
    /// Default: none (no CORS headers are sent).
    #[arg(long, value_name = "ORIGINS")]
    pub(crate) cors_origins: Option<String>,
    /// Do not serve `/metrics` (it answers 501).
    #[arg(long)]
    pub(crate) no_metrics: bool,
    /// Serve `GET /slots` (the default).
    #[arg(long, overrides_with = "no_slots")]
    pub(crate) slots: bool,
    /// Do not serve `GET /slots` (it answers 501).
    #[arg(long)]
    pub(crate) no_slots: bool,
    /// The temperature of requests that set none (default 0.8).
    #[arg(long, value_name = "T")]
    pub(crate) temp: Option<f32>,
    /// The sampling seed of requests that set none (default: a new one per request).
    #[arg(long, value_name = "N")]
    pub(crate) seed: Option<u64>,
    /// The most tokens a request generates when it does not say (-1: until the context).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) n_predict: Option<i64>,
    /// A Jinja chat template to render chats with instead of the model's.
    #[arg(long, value_name = "PATH")]
    pub(crate) chat_template_file: Option<PathBuf>,
    /// A chat template given inline (Jinja), or a format by name: `chatml`, `llama3`,
    /// `command-r` (any other value is taken as the template itself).
    #[arg(long, value_name = "JINJA|NAME", conflicts_with = "chat_template_file")]
    pub(crate) chat_template: Option<String>,
    /// Thinking in templates that support it: `off` renders them with
    /// `enable_thinking: false` and closes an opened thinking block; `on`/`auto` (default)
    /// leave the template's default.
    #[arg(long, value_name = "on|off|auto", default_value = "auto")]
    pub(crate) reasoning: String,
    /// Serve embeddings from this generative model (`POST /v1/embeddings`, and
    /// llama-server's `POST /embeddings`): its final hidden states, pooled by `--pooling`.
    #[arg(long)]
    pub(crate) embeddings: bool,
    /// How `--embeddings` pools a sequence's hidden states: `last` (the default), `mean`,
    /// `cls` (the first token), or `none` (every token's, on `/embeddings` only).
    #[arg(long, value_name = "none|mean|cls|last", default_value = "last")]
    pub(crate) pooling: String,
    // Speculative decoding (qkv_server::speculative): the default of requests that do not
    // say, with llama-server's spellings as aliases.
    /// Speculative decoding for greedy requests that do not say: `ngram` (drafts looked up
    /// in the prompt and the text so far, verified in one pass: the same tokens, faster on
    /// text that copies its input) or `off` (the default). llama-server's `--spec-type`
    /// names are taken too (`ngram-simple`, `ngram-map-k`, `ngram-mod`, `ngram-cache`:
    /// n-gram lookup; `none`: off).
    #[arg(long = "spec", visible_alias = "spec-type", value_name = "ngram|off")]
    pub(crate) spec: Option<String>,
    /// Most tokens per draft, 1 to 7 (default 7); alone, turns `--spec ngram` on. A request
    /// may ask for fewer (`speculative.n_max`).
    #[arg(
        long = "spec-max",
        visible_aliases = ["draft-max", "spec-draft-n-max"],
        value_name = "N"
    )]
    pub(crate) spec_max: Option<usize>,
}
