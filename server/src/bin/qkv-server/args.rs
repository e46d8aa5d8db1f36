//! `qkv-server`'s command line.

use crate::llama_flags;
use clap::{CommandFactory, Parser};
use qkv::engine::EngineOptions;
use qkv::models::decoder::KvType;
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
    #[arg(short = 'm', long)]
    pub(crate) model: Option<PathBuf>,
    /// A LoRA adapter (a GGUF file as llama.cpp's convert_lora_to_gguf.py writes it) applied
    /// at scale 1 to every request that does not choose its own (repeatable; ids count from
    /// 0 in command-line order, with --lora-scaled).
    #[arg(long = "lora", value_name = "FILE")]
    pub(crate) lora: Vec<PathBuf>,
    /// A LoRA adapter applied at SCALE (repeatable).
    #[arg(
        long = "lora-scaled",
        num_args = 2,
        value_names = ["FILE", "SCALE"],
        allow_negative_numbers = true
    )]
    pub(crate) lora_scaled: Vec<String>,
    /// Load the adapters at scale 0: none applies until POST /lora-adapters or a request's
    /// `lora` field sets a scale.
    #[arg(long = "lora-init-without-apply")]
    pub(crate) lora_init_without_apply: bool,
    /// Which of `--lora` (false) and `--lora-scaled` (true) came in which order.
    #[arg(skip)]
    pub(crate) lora_order: Vec<bool>,
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
    /// Worker threads for the model (default, or -1: one per core).
    #[arg(short = 't', long, allow_negative_numbers = true)]
    pub(crate) threads: Option<i64>,
    /// Activations meet interleaved weights (Q3_K, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, IQ4_NL,
    /// IQ4_XS) as 8-bit or 16-bit integers (default 8, as llama.cpp does; 16 is the exact
    /// mode, slower on prompts and batched steps).
    #[arg(long = "act-bits", value_name = "BITS", env = "QKV_ACT_BITS")]
    pub(crate) act_bits: Option<qkv::kernels::quant::act::ActPrecision>,
    /// Most sequences generated at once.
    #[arg(long, default_value_t = 16)]
    pub(crate) max_sequences: usize,
    /// llama-server's slots (`-np`): the most sequences generated at once, among which
    /// `--ctx-size` is split unless `--kv-unified` (-1: llama-server's automatic choice,
    /// here `--max-sequences` with a unified cache).
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        conflicts_with = "max_sequences"
    )]
    pub(crate) parallel: Option<i64>,
    /// Most megabytes all KV caches may take together (default: max-sequences caches).
    #[arg(long, value_name = "MB")]
    pub(crate) kv_budget: Option<usize>,
    /// Positions per sequence (prompt and generated tokens); default 2048.
    #[arg(long, conflicts_with = "ctx_size")]
    pub(crate) ctx: Option<usize>,
    /// llama-server's `-c`: positions of all slots together (0: the model's context), split
    /// among `--parallel` slots unless `--kv-unified`.
    #[arg(short = 'c', long, value_name = "N")]
    pub(crate) ctx_size: Option<usize>,
    /// Each sequence may fill the whole `--ctx-size`, as in llama-server's unified cache
    /// (the default when `--parallel` is not given).
    #[arg(long, overrides_with = "no_kv_unified")]
    pub(crate) kv_unified: bool,
    /// `--ctx-size` is split among the `--parallel` slots (the default with `--parallel`).
    #[arg(long)]
    pub(crate) no_kv_unified: bool,
    /// How the KV caches store keys and values: f32, f16 or q8_0 (Q8_0 blocks, as
    /// llama.cpp's `-ctk q8_0 -ctv q8_0`: about half the bytes of f16, so a --kv-budget holds
    /// twice the sequences); default: the weights' compute dtype.
    #[arg(long = "kv-type", value_name = "TYPE")]
    pub(crate) kv_type: Option<qkv::models::decoder::KvType>,
    /// llama-server's `-ctk`: the keys' cache type (f32, f16 or q8_0; the same as the
    /// values', which default to f16).
    #[arg(long, value_name = "TYPE")]
    pub(crate) cache_type_k: Option<String>,
    /// llama-server's `-ctv`: the values' cache type (as the keys').
    #[arg(long, value_name = "TYPE")]
    pub(crate) cache_type_v: Option<String>,
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
    /// llama-server's `-b`: the most tokens one step runs (sets `--prefill-step-tokens`,
    /// and caps `--step-tokens`).
    #[arg(short = 'b', long, value_name = "N")]
    pub(crate) batch_size: Option<usize>,
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
    #[arg(short = 'a', long, value_name = "NAMES")]
    pub(crate) alias: Option<String>,
    /// Tags `/v1/models` lists for the model, comma-separated.
    #[arg(long, value_name = "TAGS")]
    pub(crate) tags: Option<String>,
    /// Seconds running requests get to finish after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 30)]
    pub(crate) grace: u64,
    /// A key clients must send as `Authorization: Bearer KEY` (repeatable, or several
    /// comma-separated). With any key, every route but `/health` needs one (`/metrics`
    /// too, unless `--metrics-public`).
    #[arg(long = "api-key", value_name = "KEY")]
    pub(crate) api_keys: Vec<String>,
    /// A file of keys, one per line (blank lines and lines starting with `#` are skipped);
    /// taken with any `--api-key`.
    #[arg(long, value_name = "PATH")]
    pub(crate) api_key_file: Option<PathBuf>,
    /// Serve `/metrics` (Prometheus text, with llama-server's `llamacpp:` names too); without
    /// it (or one of the `--metrics-…` flags) `/metrics` answers 501, as llama-server's does.
    #[arg(long)]
    pub(crate) metrics: bool,
    /// Serve `/metrics` without a key even when keys are set (implies `--metrics`).
    #[arg(long)]
    pub(crate) metrics_public: bool,
    /// Also export the request and KV cache gauges under vLLM's names
    /// (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:gpu_cache_usage_perc`);
    /// implies `--metrics`.
    #[arg(long)]
    pub(crate) metrics_vllm_names: bool,
    /// Serve `/metrics` with llama-server's names (`llamacpp:…`): the same as `--metrics`.
    #[arg(long)]
    pub(crate) metrics_llamacpp_names: bool,
    /// Add `__verbose` (the prompt as text, the raw output) to every OpenAI-shaped answer,
    /// as llama-server's `--verbose` does.
    #[arg(short = 'v', long)]
    pub(crate) verbose: bool,
    /// Browser origins allowed to call the server (CORS), comma-separated: `*` for any,
    /// `localhost` for localhost, 127.0.0.1 and `[::1]` on any port, or origins as written.
    /// Default: `*`, as llama-server's (the calling origin is echoed, with credentials).
    #[arg(long, value_name = "ORIGINS")]
    pub(crate) cors_origins: Option<String>,
    /// Do not serve `/metrics` (it answers 501; the default without `--metrics`).
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
    /// The sampling seed of requests that set none (default, or -1: a new one per request).
    #[arg(short = 's', long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) seed: Option<i128>,
    /// The most tokens a request generates when it does not say (-1: until the context).
    #[arg(short = 'n', long, value_name = "N", allow_negative_numbers = true)]
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
    /// `rank` is `--reranking`'s.
    #[arg(long, value_name = "none|mean|cls|last|rank", default_value = "last")]
    pub(crate) pooling: String,
    /// After this many seconds without a request, free the idle KV caches (and the prompt
    /// prefixes they hold) until the next request, as llama-server's sleep; `/props` then
    /// says `is_sleeping` (-1, the default: never).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub(crate) sleep_idle_seconds: Option<i64>,
    /// Serve `POST /slots/{id}?action=save|restore|erase`, keeping saved slots (a slot's
    /// tokens and KV cache) as files in this directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) slot_save_path: Option<PathBuf>,
    /// When a sequence fills its context, keep its first `--keep` tokens (or the request's
    /// `n_keep`), drop the older half of the rest and go on generating (off by default: a
    /// full context ends the sequence, and a prompt longer than it is refused).
    #[arg(long, overrides_with = "no_context_shift")]
    pub(crate) context_shift: bool,
    /// A full context ends the sequence (the default).
    #[arg(long, overrides_with = "context_shift")]
    pub(crate) no_context_shift: bool,
    /// Tokens of the prompt a context shift keeps, for requests that do not say (`n_keep`;
    /// default 0, -1: the whole prompt).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub(crate) keep: i64,
    /// `/infill` in suffix-prefix-middle order (the default is prefix-suffix-middle).
    #[arg(long)]
    pub(crate) spm_infill: bool,
    /// Serve `POST /rerank`, `/reranking` and `/v1/rerank` (also `--rerank`, or `--pooling
    /// rank`): a decoder that answers yes or no, as Qwen3-Reranker, scores each document.
    #[arg(long)]
    pub(crate) reranking: bool,
    // Speculative decoding (qkv_server::speculative): the default of requests that do not
    // say, with llama-server's spellings as aliases.
    /// Speculative decoding for requests that do not say: `ngram` (drafts looked up in the
    /// prompt and the text so far, verified in one pass: faster on text that copies its
    /// input), `draft` (drafts of --model-draft) or `off` (the default, or `draft` with
    /// --model-draft). Greedy requests get the tokens they get without it; sampled ones
    /// the same distribution (the speculative-sampling rule). llama-server's `--spec-type`
    /// names are taken too (`ngram-simple`, `ngram-map-k`, `ngram-mod`, `ngram-cache`:
    /// n-gram lookup; `draft-simple`: the draft model; `none`: off).
    #[arg(
        long = "spec",
        visible_alias = "spec-type",
        value_name = "ngram|draft|off"
    )]
    pub(crate) spec: Option<String>,
    /// Most tokens per draft, 1 to 7 (default 7); alone, turns `--spec ngram` on. A request
    /// may ask for fewer (`speculative.n_max`).
    #[arg(
        long = "spec-max",
        visible_aliases = ["draft-max", "spec-draft-n-max"],
        value_name = "N"
    )]
    pub(crate) spec_max: Option<usize>,
    /// Fewest tokens a draft must hold to be verified (default 0: any); a shorter draft is
    /// dropped and the token runs alone. A request may say otherwise (`speculative.n_min`).
    #[arg(
        long = "spec-min",
        visible_aliases = ["draft-min", "spec-draft-n-min"],
        value_name = "N"
    )]
    pub(crate) spec_min: Option<usize>,
    /// A draft model (GGUF file or Hugging Face directory, loaded as --model is) of the
    /// model's vocabulary: requests that speculate draft with its tokens, each sequence on a
    /// KV cache of its own (`-md`, as llama-server). Makes `--spec draft` the default.
    #[arg(long = "model-draft", value_name = "FILE")]
    pub(crate) model_draft: Option<PathBuf>,
    /// Router mode: serve every model of this directory (GGUF files, and subdirectories
    /// holding one model), each started on its first request; give no `--model`.
    #[arg(long, value_name = "DIR")]
    pub(crate) models_dir: Option<PathBuf>,
    /// Router mode: the models of this INI file (llama-server's presets: a section per
    /// model, keys are flags; `[*]` for all).
    #[arg(long, value_name = "FILE")]
    pub(crate) models_preset: Option<PathBuf>,
    /// Router mode: most models running at once (0: no limit); the least recently used idle
    /// one is stopped to make room.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub(crate) models_max: usize,
    /// Router mode: start a model on its first request (the default).
    #[arg(long, overrides_with = "no_models_autoload")]
    pub(crate) models_autoload: bool,
    /// Router mode: start models only by `POST /models/load`.
    #[arg(long)]
    pub(crate) no_models_autoload: bool,
    /// The command line as clap read it (after llama_flags.rs), program name first: router
    /// mode passes it on to the instances.
    #[arg(skip)]
    pub(crate) argv: Vec<std::ffi::OsString>,
}

/// Whether a flag of qkv-server's (`--long` or `-s`) takes a value.
pub(crate) fn takes_value() -> impl Fn(&str) -> bool {
    let command = Args::command();
    move |flag: &str| {
        command.get_arguments().any(|a| {
            let long = flag
                .strip_prefix("--")
                .is_some_and(|l| a.get_long() == Some(l));
            let short = flag.len() == 2
                && flag.starts_with('-')
                && a.get_short().is_some_and(|c| flag.ends_with(c));
            (long || short) && a.get_action().takes_values()
        })
    }
}

impl Args {
    /// The process's command line and environment read as llama-server's (llama_flags.rs),
    /// then by clap; each note is printed on stderr. Exits with clap's message on a bad
    /// line, or with the error naming a refused flag.
    pub(crate) fn parse_llama() -> Args {
        let takes_value = takes_value();
        let env = |k: &str| std::env::var(k).ok();
        match llama_flags::expand(std::env::args_os(), &env, &takes_value) {
            Ok(e) => {
                for n in &e.notes {
                    eprintln!("qkv-server: note: {n}");
                }
                let order = lora_order(&e.args);
                let mut args = Args::parse_from(&e.args);
                args.lora_order = order;
                args.argv = e.args;
                args
            }
            Err(e) => {
                eprintln!("qkv-server: error: {e}");
                std::process::exit(2);
            }
        }
    }

    /// The LoRA adapters of the command line in its order, each with its starting scale
    /// (0 under `--lora-init-without-apply`). An error names a scale that is not a finite
    /// number.
    pub(crate) fn lora_adapters(&self) -> Result<Vec<(PathBuf, f32)>, String> {
        let mut plain = self.lora.iter();
        let mut scaled = self.lora_scaled.chunks(2);
        let mut out = Vec::new();
        // Without the recorded order (tests build `Args` directly), --lora ones come first.
        let order = if self.lora_order.len() == self.lora.len() + self.lora_scaled.len() / 2 {
            self.lora_order.clone()
        } else {
            let mut o = vec![false; self.lora.len()];
            o.resize(self.lora.len() + self.lora_scaled.len() / 2, true);
            o
        };
        for is_scaled in order {
            let (path, scale) = if is_scaled {
                let Some([path, scale]) = scaled.next() else {
                    break;
                };
                let s: f32 = scale
                    .parse()
                    .ok()
                    .filter(|s: &f32| s.is_finite())
                    .ok_or_else(|| {
                        format!("--lora-scaled {path} {scale}: the scale is not a number")
                    })?;
                (PathBuf::from(path), s)
            } else {
                let Some(path) = plain.next() else { break };
                (path.clone(), 1.0)
            };
            out.push((
                path,
                if self.lora_init_without_apply {
                    0.0
                } else {
                    scale
                },
            ));
        }
        Ok(out)
    }

    /// How many sequences run at once: `--parallel` (as llama-server's `-np`), else
    /// `--max-sequences`.
    pub(crate) fn sequences(&self) -> Result<usize, String> {
        match self.parallel {
            Some(n) if n > 0 => usize::try_from(n).map_err(|_| format!("--parallel {n}: too many")),
            Some(-1) | None => Ok(self.max_sequences),
            Some(n) => Err(format!("--parallel {n}: give a count of slots, or -1")),
        }
    }

    /// Positions per sequence, for a model of `model_context` positions: `--ctx`, else
    /// llama-server's `--ctx-size` (0: the model's) split among the `--parallel` slots
    /// unless the cache is unified (`--kv-unified`, or no `--parallel`), else 2048.
    pub(crate) fn context(&self, model_context: usize) -> Result<usize, String> {
        let per_sequence = match (self.ctx, self.ctx_size) {
            (Some(c), _) => c,
            (None, Some(total)) => {
                let total = if total == 0 { model_context } else { total };
                let unified = self.kv_unified || (self.parallel.is_none() && !self.no_kv_unified);
                if unified {
                    total
                } else {
                    total / self.sequences()?
                }
            }
            (None, None) => 2048,
        };
        if per_sequence == 0 {
            return Err(format!(
                "--ctx-size {}: fewer positions than the {} slots",
                self.ctx_size.unwrap_or(0),
                self.sequences()?
            ));
        }
        Ok(per_sequence.min(model_context))
    }

    /// The KV cache's type: `--kv-type`, or llama-server's `-ctk`/`-ctv` (each f16 when the
    /// other is given alone), which must agree, since qkv stores keys and values alike.
    pub(crate) fn kv_cache_type(&self) -> Result<Option<KvType>, String> {
        if self.cache_type_k.is_none() && self.cache_type_v.is_none() {
            return Ok(self.kv_type);
        }
        let k = self.cache_type_k.as_deref().unwrap_or("f16");
        let v = self.cache_type_v.as_deref().unwrap_or("f16");
        let parse = |flag: &str, t: &str| -> Result<KvType, String> {
            t.parse::<KvType>().map_err(|_| {
                format!(
                    "{flag} {t}: qkv-server does not support this cache type (it has {})",
                    KvType::NAMES.join(", ")
                )
            })
        };
        let (kt, vt) = (parse("--cache-type-k", k)?, parse("--cache-type-v", v)?);
        if kt != vt {
            return Err(format!(
                "--cache-type-k {k} with --cache-type-v {v}: qkv-server does not support \
                 keys and values of different types"
            ));
        }
        match self.kv_type {
            Some(t) if t != kt => Err(format!("--kv-type and --cache-type-k {k} disagree")),
            _ => Ok(Some(kt)),
        }
    }

    /// Whether `/metrics` is served: `--metrics` or one of its options, and not
    /// `--no-metrics`.
    pub(crate) fn metrics_on(&self) -> bool {
        !self.no_metrics
            && (self.metrics
                || self.metrics_public
                || self.metrics_vllm_names
                || self.metrics_llamacpp_names)
    }

    /// `--step-tokens` and `--prefill-step-tokens`, with llama-server's `--batch-size`.
    pub(crate) fn step_tokens(&self) -> (usize, usize) {
        match self.batch_size {
            Some(b) => (self.step_tokens.min(b.max(1)), b.max(1)),
            None => (self.step_tokens, self.prefill_step_tokens),
        }
    }

    /// The default sampling seed (`None`: a new one per request, as `--seed -1`).
    pub(crate) fn seed(&self) -> Result<Option<u64>, String> {
        match self.seed {
            None | Some(-1) => Ok(None),
            Some(s) => u64::try_from(s)
                .map(Some)
                .map_err(|_| format!("--seed {s}: give 0 to 2^64-1, or -1")),
        }
    }
}

/// In which order `--lora` (false) and `--lora-scaled` (true) appear on a command line.
fn lora_order(args: &[std::ffi::OsString]) -> Vec<bool> {
    args.iter()
        .skip(1)
        .filter_map(|a| a.to_str())
        .filter_map(|a| match a.split_once('=').map_or(a, |(n, _)| n) {
            "--lora" => Some(false),
            "--lora-scaled" => Some(true),
            _ => None,
        })
        .collect()
}
