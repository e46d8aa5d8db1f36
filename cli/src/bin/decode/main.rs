//! `decode`: generate text with a decoder-only model (Llama, Qwen, Mistral, Phi-3 and Gemma
//! families), streaming tokens to stdout.
//!
//! ```text
//! decode [--model PATH] [--prompt TEXT | text on stdin] [-n N] [--chat] [--temperature T]
//!        [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--repeat-last-n N]
//!        [--seed S] [--threads N] [--dtype f16|f32] [--ctx N] [--depth N] [--warmup]
//!        [--act-bits 8|16] [--spec ngram|draft [--model-draft FILE]] [--spec-max N]
//!        [--ignore-eos] [--json]
//! decode convert IN OUT --dtype f16|f32
//! decode perplexity --file TEXT [--model PATH] [--ctx N] [--kl-base FILE] [--dtype f16|f32]
//!        [--threads N] [--act-bits 8|16]
//! decode embed --model DIR [--batch-size N] [--threads N]
//! decode tokenize [--model PATH] [--prompt TEXT | text on stdin] [--no-bos]
//!        [--no-parse-special]
//! ```
//!
//! Without `--model` it runs the default model (SmolLM2-135M-Instruct), fetched once into the
//! cache directory (see `qkv_fetch::default_model`). Statistics go to stderr; with `--json`,
//! one object per token (and, when generation stopped inside a character, a `{"text": …}` line
//! with the rest) and a final `{"stats": …}` object go to stdout; text mode leaves special
//! tokens (end of turn, role markers) out, JSON reports every token. Errors print on stderr
//! and exit 1.
//! Generation that fills the context stops there: the text so far and the statistics are
//! printed, with a note on stderr, and the exit code is 0.

#![forbid(unsafe_code)]

mod tools;

use clap::{Args, Parser, Subcommand};
use qkv::kernels::quant::{act::ActPrecision, x8};
use qkv::load::{Model, ModelOptions};
use qkv::models::decoder::KvType;
use qkv::sample::SamplerConfig;
use qkv::session::{Piece, Session, SessionOptions};
use qkv::speculative::{DraftOptions, NgramOptions, SpecStats, Speculation};
use qkv::tokenizer::{ChatMessage, Tokenizer};
use qkv::weights::FloatType;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use tools::{EmbedArgs, PerplexityArgs, TokenizeArgs};

#[derive(Parser, Debug)]
#[command(
    name = "decode",
    version,
    about = "Generate text with a decoder-only language model on the CPU (qkv)",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Convert a GGUF file (any supported dtype, quantized included) to an f16 or f32 GGUF.
    Convert {
        /// The GGUF file to read.
        input: PathBuf,
        /// The GGUF file to write.
        output: PathBuf,
        /// The dtype of the output's matrices (1-D tensors stay f32).
        #[arg(long, default_value = "f16")]
        dtype: FloatType,
    },
    /// Perplexity of a text over non-overlapping windows, as `llama-perplexity` computes it;
    /// with --kl-base, also the KL divergence from (and top-token agreement with) a base run.
    Perplexity(PerplexityArgs),
    /// Sentence embeddings: one text per line on stdin, one JSON array of floats per line on
    /// stdout, in the same order.
    Embed(EmbedArgs),
    /// Token ids of a text as one JSON array, as `llama-tokenize --ids` prints them. Needs
    /// only the tokenizer: vocab-only GGUF files work.
    Tokenize(TokenizeArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// A GGUF file or a Hugging Face directory; default: SmolLM2-135M-Instruct, fetched once.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt; read from stdin when absent.
    #[arg(long)]
    prompt: Option<String>,
    /// Most tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128)]
    n: usize,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Drop tokens less likely than P × the most likely (0 = off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalty for recently seen tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// How many recent tokens the repetition penalty considers.
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// RNG seed: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Widen every weight matrix to this dtype at load (f16 or f32); by default each runs
    /// as stored in the file, quantized blocks included.
    #[arg(long)]
    dtype: Option<FloatType>,
    /// KV cache capacity in tokens (default: the model's context length).
    #[arg(long)]
    ctx: Option<usize>,
    /// How the KV cache stores keys and values: f32, f16 or q8_0 (Q8_0 blocks, as
    /// llama.cpp's `-ctk q8_0 -ctv q8_0`: about half the memory of f16); default: the
    /// weights' compute dtype (f16 unless they are f32).
    #[arg(long = "kv-type", value_name = "TYPE")]
    kv_type: Option<KvType>,
    /// Benchmarking: prefill N context tokens (the prompt's tokens, repeated) before the
    /// prompt, untimed, so that the prompt and generation figures are measured on top of N
    /// cached positions (as `llama-bench -d N` does).
    #[arg(long, default_value_t = 0)]
    depth: usize,
    /// Activations meet interleaved weights (Q3_K, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, IQ4_NL,
    /// IQ4_XS) as 8-bit or 16-bit integers (default 8, as llama.cpp does; 16 is the exact
    /// mode, slower on prompts).
    #[arg(long = "act-bits", value_name = "BITS", env = "QKV_ACT_BITS")]
    act_bits: Option<ActPrecision>,
    /// Benchmarking: run the prompt once, untimed, then start over, so that the figures
    /// leave out one-time costs (first touches of the mapped weights and of the buffers,
    /// the threads' start), as `llama-bench`'s warm-up run does.
    #[arg(long)]
    warmup: bool,
    /// Keep generating past the end-of-sequence token (text mode still leaves it out, as it
    /// does every special token; `--json` reports it).
    #[arg(long)]
    ignore_eos: bool,
    /// One JSON object per token on stdout (a last `{"text": …}` one for text held back at
    /// the end, inside a character), then a stats object.
    #[arg(long)]
    json: bool,
    /// Speculative decoding, in the exact mode (16-bit activations, the default): `ngram`
    /// drafts the tokens that followed the latest earlier occurrence of the text's last few
    /// tokens (prompt lookup) and checks them in one pass; `draft` drafts with a second,
    /// smaller model of the same vocabulary (--model-draft), its tokens sampled under the
    /// same settings. Greedy, the text is the same as without it; sampling, drafts are kept
    /// by the speculative-sampling rule, so the text has the distribution of plain sampling
    /// (with `ngram`, the very text of the same --seed).
    #[arg(long, value_name = "KIND", value_parser = ["ngram", "draft"])]
    spec: Option<String>,
    /// The draft model of --spec draft (a GGUF file or a Hugging Face directory, loaded as
    /// --model is); its vocabulary must be the model's.
    #[arg(long = "model-draft", value_name = "FILE")]
    model_draft: Option<PathBuf>,
    /// Most tokens per draft with --spec, 1 to 7 (default 7).
    #[arg(long = "spec-max", value_name = "N")]
    spec_max: Option<usize>,
}

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            e.print().ok();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Some(Command::Convert {
            input,
            output,
            dtype,
        }) => tools::convert(&input, &output, dtype),
        Some(Command::Perplexity(args)) => tools::perplexity(&args),
        Some(Command::Embed(args)) => tools::embed(&args),
        Some(Command::Tokenize(args)) => tools::tokenize(&args),
        None => run(&cli.run),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            note(format_args!("decode: error: {e}"));
            ExitCode::from(1)
        }
    }
}

/// The model's options from `--dtype`, `--act-bits` (or `QKV_ACT_BITS`, which clap reads
/// as the flag's default) and `QKV_NO_INTERLEAVE=1` (every matrix kept as the file stores
/// it): the program reads its environment, the library none.
fn model_options(dtype: Option<FloatType>, act_bits: Option<ActPrecision>) -> ModelOptions {
    ModelOptions {
        dtype,
        act_precision: act_bits.unwrap_or(x8::DEFAULT_ACT_PRECISION),
        interleave: std::env::var_os("QKV_NO_INTERLEAVE").is_none_or(|v| v == "0"),
    }
}

/// Sets the global pool's size from `--threads`, refusing absurd counts.
fn set_threads(threads: Option<usize>) -> AnyResult<()> {
    if let Some(n) = threads {
        if !(1..=MAX_THREADS).contains(&n) {
            return Err(format!("--threads {n}: must be between 1 and {MAX_THREADS}").into());
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .map_err(|e| format!("--threads {n}: {e}"))?;
    }
    Ok(())
}

/// A line on stderr. Unlike `eprintln!`, a closed stderr (`decode … 2>&1 | head`) is not a
/// panic: the line is dropped.
fn note(line: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(line).and_then(|()| err.write_all(b"\n"));
}

/// Stdout that stops quietly when the reader goes away (`decode … | head`).
struct Out {
    stdout: std::io::StdoutLock<'static>,
    closed: bool,
}

impl Out {
    fn write(&mut self, text: &str) -> AnyResult<()> {
        if self.closed {
            return Ok(());
        }
        match self
            .stdout
            .write_all(text.as_bytes())
            .and_then(|()| self.stdout.flush())
        {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(format!("writing to stdout: {e}").into()),
        }
    }
}

/// The most worker threads `--threads` accepts: far past any machine this runs on, and
/// small enough that a typo cannot make the process spawn threads for minutes.
const MAX_THREADS: usize = 1024;

/// `decode [--prompt …]`: generate from a prompt, as a list of steps.
fn run(args: &RunArgs) -> AnyResult<()> {
    // Checked before anything is loaded, so a typo costs nothing.
    let config = sampler_config(args)?;
    let spec = speculation(args)?;
    set_threads(args.threads)?;
    let prompt = read_prompt(args)?;
    let Loaded {
        path,
        model,
        mut session,
        load_ms,
    } = load(args)?;
    let tokenizer = model.tokenizer().ok_or("the model has no tokenizer")?;
    let ids = prompt_ids(tokenizer, prompt, args.chat)?;
    prepare_context(&mut session, &ids, args)?;
    let prompt_start = Instant::now();
    session.prefill(&ids)?;
    let prompt_s = prompt_start.elapsed().as_secs_f64();
    let mut out = Out {
        stdout: std::io::stdout().lock(),
        closed: false,
    };
    let mut draft = draft_session(args, &model, &session)?;
    let sessions = (&mut session, draft.as_mut());
    let generated = generate(sessions, tokenizer, config, spec, args, &mut out)?;
    let timing = Timing {
        load_ms,
        prompt_tokens: ids.len(),
        prompt_s,
    };
    report(&model, &session, &path, args, &timing, &generated, &mut out)
}

/// The sampler `args` ask for, validated.
fn sampler_config(args: &RunArgs) -> AnyResult<SamplerConfig> {
    let config = SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed: args.seed,
    };
    config.validate()?;
    Ok(config)
}

/// The speculation `--spec` and `--spec-max` ask for; with sampling, drafts are verified by
/// the speculative-sampling rule, so the text has the distribution of plain sampling.
fn speculation(args: &RunArgs) -> AnyResult<Speculation> {
    if args.model_draft.is_some() != (args.spec.as_deref() == Some("draft")) {
        return Err("--spec draft and --model-draft FILE go together".into());
    }
    let spec = match (args.spec.as_deref(), args.spec_max) {
        (None, None) => return Ok(Speculation::Off),
        (None, Some(_)) => return Err("--spec-max needs --spec".into()),
        (Some("draft"), max) => Speculation::Draft(DraftOptions {
            max_draft: max.unwrap_or(DraftOptions::default().max_draft),
            ..DraftOptions::default()
        }),
        (Some(_), max) => Speculation::Ngram(NgramOptions {
            max_draft: max.unwrap_or(NgramOptions::default().max_draft),
            ..NgramOptions::default()
        }),
    };
    spec.validate()?;
    Ok(spec)
}

/// `--prompt`, or all of stdin; never empty.
fn read_prompt(args: &RunArgs) -> AnyResult<String> {
    let prompt = match &args.prompt {
        Some(p) => p.clone(),
        None => {
            let mut stdin = std::io::stdin();
            if stdin.is_terminal() {
                note(format_args!(
                    "decode: reading the prompt from stdin (end with Ctrl-D), or pass --prompt"
                ));
            }
            let mut text = String::new();
            stdin
                .read_to_string(&mut text)
                .map_err(|e| format!("reading the prompt from stdin: {e}"))?;
            text
        }
    };
    if prompt.is_empty() {
        return Err("the prompt is empty (pass --prompt TEXT or text on stdin)".into());
    }
    Ok(prompt)
}

/// The model and a session on it, with the time they took.
struct Loaded {
    path: PathBuf,
    model: Arc<Model>,
    session: Session,
    load_ms: f64,
}

/// Loads `--model` (or the default model) and opens a session with `--ctx` and `--kv-type`.
fn load(args: &RunArgs) -> AnyResult<Loaded> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => qkv_fetch::default_model()?,
    };
    let load_start = Instant::now();
    let model = Arc::new(Model::load(
        &path,
        &model_options(args.dtype, args.act_bits),
    )?);
    model.tokenizer().ok_or("the model has no tokenizer")?;
    let options = SessionOptions {
        context: args.ctx,
        kv_dtype: args.kv_type,
        prefill_chunk: None,
    };
    let session = Session::new(model.clone(), options)?;
    let load_ms = load_start.elapsed().as_secs_f64() * 1e3;
    Ok(Loaded {
        path,
        model,
        session,
        load_ms,
    })
}

/// With `--model-draft`: a session on the draft model (loaded as the model is, its
/// vocabulary checked against the model's), of the model session's context.
fn draft_session(args: &RunArgs, model: &Model, session: &Session) -> AnyResult<Option<Session>> {
    let Some(path) = &args.model_draft else {
        return Ok(None);
    };
    let draft = Arc::new(Model::load(
        path,
        &model_options(args.dtype, args.act_bits),
    )?);
    qkv::session::check_draft_vocabulary(model, &draft)?;
    let options = SessionOptions {
        context: Some(session.capacity().min(draft.config().context)),
        kv_dtype: args.kv_type,
        prefill_chunk: None,
    };
    Ok(Some(Session::new(draft, options)?))
}

/// The prompt's token ids, wrapped in the chat template as a user message with `--chat`.
fn prompt_ids(tokenizer: &Tokenizer, prompt: String, chat: bool) -> AnyResult<Vec<u32>> {
    let text = if chat {
        let messages = [ChatMessage {
            role: "user".into(),
            content: prompt,
        }];
        tokenizer.apply_chat_template(&messages, true)?
    } else {
        prompt
    };
    let ids = tokenizer.encode(&text)?;
    if ids.is_empty() {
        return Err("the prompt encodes to no tokens".into());
    }
    Ok(ids)
}

/// The untimed work before the prompt: `--warmup`'s run, then `--depth` context tokens.
fn prepare_context(session: &mut Session, ids: &[u32], args: &RunArgs) -> AnyResult<()> {
    if args.warmup {
        session.prefill(ids)?;
        session.reset();
    }
    if args.depth > 0 {
        // Before building the context, so an absurd depth allocates nothing.
        let needed = args.depth.saturating_add(ids.len());
        if needed > session.capacity() {
            return Err(format!(
                "--depth {}: {}",
                args.depth,
                qkv::Error::ContextFull {
                    needed,
                    capacity: session.capacity()
                }
            )
            .into());
        }
        let context: Vec<u32> = ids.iter().copied().cycle().take(args.depth).collect();
        session
            .prefill(&context)
            .map_err(|e| format!("--depth {}: {e}", args.depth))?;
    }
    Ok(())
}

/// What generation did.
struct Generated {
    tokens: usize,
    secs: f64,
    /// The context's capacity, when generation stopped because it was full.
    full: Option<usize>,
    /// Drafted and kept tokens (zeros without `--spec`).
    spec: SpecStats,
}

/// Generates up to `-n` tokens after the prefilled prompt, writing each as it comes, then the
/// text held back at the end.
fn generate(
    (session, draft): (&mut Session, Option<&mut Session>),
    tokenizer: &Tokenizer,
    config: SamplerConfig,
    spec: Speculation,
    args: &RunArgs,
    out: &mut Out,
) -> AnyResult<Generated> {
    let gen_start = Instant::now();
    let mut generated = 0usize;
    let stream = session
        .generate_tokens(&[], config)?
        .max_tokens(args.n)
        .ignore_eos(args.ignore_eos);
    let mut stream = match draft {
        Some(d) => stream.speculate_with_draft(spec, d)?,
        None => stream.speculate(spec)?,
    };
    let mut full = None;
    for piece in stream.by_ref() {
        let piece = match piece {
            Ok(piece) => piece,
            // The cache is full: a stop like the end of text, not a failure.
            Err(qkv::Error::ContextFull { capacity, .. }) => {
                full = Some(capacity);
                break;
            }
            Err(e) => return Err(e.into()),
        };
        generated += 1;
        write_piece(out, tokenizer, &piece, args.json)?;
        if out.closed {
            break;
        }
    }
    let spec = stream.spec_stats();
    let rest = stream.finish();
    let secs = gen_start.elapsed().as_secs_f64();
    if args.json {
        // Text held back at the end (generation stopped inside a character), so that the
        // texts of all lines join to the whole output.
        if !rest.is_empty() {
            out.write(&format!("{{\"text\":{}}}\n", serde_json::to_string(&rest)?))?;
        }
    } else {
        out.write(&rest)?;
        out.write("\n")?;
    }
    Ok(Generated {
        tokens: generated,
        secs,
        full,
        spec,
    })
}

/// One generated token: a JSON line, or its text (special tokens left out).
fn write_piece(out: &mut Out, tokenizer: &Tokenizer, piece: &Piece, json: bool) -> AnyResult<()> {
    if json {
        // Written by hand to keep the keys in this order; the text is escaped by serde.
        let text = serde_json::to_string(&piece.text)?;
        let logprob = serde_json::to_string(&piece.logprob)?;
        out.write(&format!(
            "{{\"id\":{},\"text\":{text},\"logprob\":{logprob}}}\n",
            piece.id
        ))
    } else if tokenizer.is_special(piece.id) {
        // Text shows what a reader should see: no end-of-turn or role markers. Bytes held
        // back before one (an unfinished character) come out in its piece, and stay.
        let own = tokenizer.decode(&[piece.id])?;
        out.write(piece.text.strip_suffix(own.as_str()).unwrap_or(""))
    } else {
        out.write(&piece.text)
    }
}

/// The times before generation.
struct Timing {
    load_ms: f64,
    prompt_tokens: usize,
    prompt_s: f64,
}

/// The statistics: a JSON object on stdout with `--json`, and a line on stderr (after a note
/// when the context filled up).
fn report(
    model: &Model,
    session: &Session,
    path: &std::path::Path,
    args: &RunArgs,
    timing: &Timing,
    generated: &Generated,
    out: &mut Out,
) -> AnyResult<()> {
    let per_s = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    let prompt_tps = per_s(timing.prompt_tokens, timing.prompt_s);
    let gen_tps = per_s(generated.tokens, generated.secs);
    let load_ms = timing.load_ms;
    if args.json {
        let (_, weight_bytes) = model.decoder().weight_formats();
        let stats = serde_json::json!({"stats": {
            "load_ms": round2(load_ms),
            "depth": args.depth,
            "prompt_tokens": timing.prompt_tokens,
            "prompt_tokens_per_s": round2(prompt_tps),
            "generated_tokens": generated.tokens,
            "generated_tokens_per_s": round2(gen_tps),
            "weight_bytes": weight_bytes,
            "kv_cache_bytes": session.cache_bytes(),
            "kv_type": session.kv_dtype().to_string(),
            "kv_bytes_per_token": model.decoder().kv_bytes_per_position(session.kv_dtype()),
            "peak_rss_bytes": peak_rss_bytes(),
            "draft_tokens": generated.spec.draft_tokens,
            "accepted_tokens": generated.spec.accepted_tokens,
        }});
        out.write(&format!("{stats}\n"))?;
    }
    if let Some(capacity) = generated.full {
        note(format_args!(
            "decode: stopped after {} tokens: the context ({capacity} positions) is full \
             (--ctx sets it)",
            generated.tokens
        ));
    }
    note(format_args!(
        "decode: {} ({}, KV {}, {} threads): load {load_ms:.0} ms | prompt {} tokens, {prompt_tps:.1} tok/s | generated {} tokens, {gen_tps:.1} tok/s",
        path.display(),
        weights_label(model, args.dtype),
        session.kv_dtype(),
        rayon::current_num_threads(),
        timing.prompt_tokens,
        generated.tokens,
    ));
    Ok(())
}

/// What the weights run as, for the stats line: the widened dtype, or the stored formats
/// with the bytes a step reads (e.g. "Q4_1+Q8_0, 98 MB").
fn weights_label(model: &Model, widened: Option<FloatType>) -> String {
    let (formats, bytes) = model.decoder().weight_formats();
    let mut names: Vec<String> = Vec::new();
    for (_, f) in &formats {
        let f = f.to_string();
        if !names.contains(&f) {
            names.push(f);
        }
    }
    let stored = format!("{}, {:.0} MB", names.join("+"), bytes as f64 / 1e6);
    match widened {
        Some(d) => format!("widened to {d}: {stored}"),
        None => stored,
    }
}

/// The process's peak resident memory (`VmHWM` in /proc/self/status), where Linux tells it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
