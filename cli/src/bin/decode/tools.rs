//! `decode`'s tools beside generation: `convert`, `perplexity`, `embed` and `tokenize`.

use super::{model_options, note, set_threads, weights_label, AnyResult, Out};
use clap::Args;
use qkv::kernels::quant::act::ActPrecision;
use qkv::load::Model;
use qkv::models::decoder::KvType;
use qkv::weights::{gguf, FloatType};
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Debug)]
pub(crate) struct TokenizeArgs {
    /// A GGUF file (vocab-only is enough), a Hugging Face directory or a tokenizer.json;
    /// default: SmolLM2-135M-Instruct, fetched once.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The text; read whole from stdin when absent (so any text, one starting with `-`
    /// included, can be given).
    #[arg(long)]
    prompt: Option<String>,
    /// Do not add the tokens the model puts around a text (BOS, or BERT's `[CLS]`/`[SEP]`).
    #[arg(long)]
    no_bos: bool,
    /// Split special tokens spelt in the text (`<|im_end|>`) like any other text.
    #[arg(long)]
    no_parse_special: bool,
}

#[derive(Args, Debug)]
pub(crate) struct EmbedArgs {
    /// A sentence-transformers directory (modules.json, config.json, model.safetensors,
    /// tokenizer.json), e.g. all-MiniLM-L6-v2.
    #[arg(long)]
    model: PathBuf,
    /// Texts per forward pass. Lines are gathered until 32 batches have arrived or no more
    /// input is waiting (so an interactive line gets its answer at once), then sorted by
    /// length and embedded a batch at a time, as sentence-transformers does.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Args, Debug)]
pub(crate) struct PerplexityArgs {
    /// A GGUF file or a Hugging Face directory; default: SmolLM2-135M-Instruct, fetched once.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The text to score (UTF-8).
    #[arg(long)]
    file: PathBuf,
    /// Tokens per window; the second half of each is scored.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Base log-probabilities: written by this run when FILE does not exist (run the
    /// reference, e.g. --dtype f32, first), compared with when it does.
    #[arg(long = "kl-base", value_name = "FILE")]
    kl_base: Option<PathBuf>,
    /// Widen every weight matrix to this dtype at load; by default each runs as stored.
    #[arg(long)]
    dtype: Option<FloatType>,
    /// How the KV cache stores keys and values: f32, f16 or q8_0 (Q8_0 blocks, as
    /// llama.cpp's `-ctk q8_0 -ctv q8_0`); default: the weights' compute dtype.
    #[arg(long = "kv-type", value_name = "TYPE")]
    kv_type: Option<KvType>,
    /// Activations meet interleaved weights as 8-bit or 16-bit integers (default 8; 16 is
    /// the exact mode).
    #[arg(long = "act-bits", value_name = "BITS", env = "QKV_ACT_BITS")]
    act_bits: Option<ActPrecision>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

pub(crate) fn convert(
    input: &std::path::Path,
    output: &std::path::Path,
    dtype: FloatType,
) -> AnyResult<()> {
    let start = Instant::now();
    gguf::convert(input, output, dtype)?;
    note(format_args!(
        "decode: wrote {} ({dtype}) in {:.1} s",
        output.display(),
        start.elapsed().as_secs_f64()
    ));
    Ok(())
}

pub(crate) fn perplexity(args: &PerplexityArgs) -> AnyResult<()> {
    use qkv::perplexity::{evaluate_with, Scoring};
    set_threads(args.threads)?;
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| format!("reading {}: {e}", args.file.display()))?;
    let path = match &args.model {
        Some(p) => p.clone(),
        None => qkv_fetch::default_model()?,
    };
    let start = Instant::now();
    let model = Arc::new(Model::load(
        &path,
        &model_options(args.dtype, args.act_bits),
    )?);
    let tokenizer = model.tokenizer().ok_or("the model has no tokenizer")?;
    let tokens = tokenizer.encode(&text)?;
    let scoring = match &args.kl_base {
        None => Scoring::Perplexity,
        Some(p) if p.exists() => Scoring::CompareBase(p),
        Some(p) => Scoring::SaveBase(p),
    };
    note(format_args!(
        "decode perplexity: {} ({}, KV {}), {} tokens, windows of {}",
        path.display(),
        weights_label(&model, args.dtype),
        args.kv_type.unwrap_or(model.decoder().kv_dtype().into()),
        tokens.len(),
        args.ctx
    ));
    let report = evaluate_with(
        &model,
        &tokens,
        args.ctx,
        args.kv_type,
        scoring,
        |w, ppl| {
            note(format_args!("[{w}] {ppl:.4}"));
        },
    )?;
    note(format_args!(
        "decode perplexity: PPL = {:.4} ± {:.4} over {} tokens in {:.1} s",
        report.ppl,
        report.ppl_err,
        report.scored,
        start.elapsed().as_secs_f64()
    ));
    if let (Some((k, ke)), Some((t, te))) = (report.kld, report.same_top) {
        note(format_args!(
            "decode perplexity: mean KLD = {k:.6} ± {ke:.6}, same top token {:.3} ± {:.3} %",
            100.0 * t,
            100.0 * te
        ));
    }
    println!("{}", report.to_json());
    Ok(())
}

/// Batches of texts `decode embed` gathers before embedding them, when that many are waiting.
const EMBED_WINDOW_BATCHES: usize = 32;

/// `decode embed`: stdin's lines embedded a window at a time, written in order as soon as
/// their window is done. A line is a text without its `\n` (and a `\r` before it); an empty line
/// is the empty text, embedded as sentence-transformers embeds it.
pub(crate) fn embed(args: &EmbedArgs) -> AnyResult<()> {
    use std::io::BufRead;
    set_threads(args.threads)?;
    let start = Instant::now();
    let embedder =
        qkv::models::bert::Embedder::load(&args.model)?.with_batch_size(args.batch_size)?;
    let load_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut input = std::io::BufReader::with_capacity(1 << 16, std::io::stdin().lock());
    let mut out = Out {
        stdout: std::io::stdout().lock(),
        closed: false,
    };
    let (mut texts, mut line, mut done) = (Vec::new(), Vec::new(), 0usize);
    let run_start = Instant::now();
    loop {
        line.clear();
        let eof = input.read_until(b'\n', &mut line)? == 0;
        if !eof {
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            let text = std::str::from_utf8(text)
                .map_err(|e| format!("stdin line {}: not UTF-8 ({e})", done + texts.len() + 1))?;
            texts.push(text.to_owned());
        }
        // A full window, the end, or nothing more waiting in the buffer: embed what there is.
        // The embedder sorts a window by length before cutting it into batches (as
        // sentence-transformers sorts its input), so windows many batches long pad little.
        let ready = texts.len() >= EMBED_WINDOW_BATCHES * args.batch_size
            || eof
            || input.buffer().is_empty();
        if ready && !texts.is_empty() {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let mut lines = String::new();
            for v in embedder.embed(&refs)? {
                lines += &serde_json::to_string(&v)?;
                lines.push('\n');
            }
            out.write(&lines)?;
            done += texts.len();
            texts.clear();
        }
        if eof || out.closed {
            break;
        }
    }
    let secs = run_start.elapsed().as_secs_f64();
    note(format_args!(
        "decode embed: {} (dimension {}, {} threads): load {load_ms:.0} ms | {done} texts in {secs:.2} s, {:.1} texts/s",
        args.model.display(),
        embedder.dim(),
        rayon::current_num_threads(),
        if secs > 0.0 { done as f64 / secs } else { 0.0 },
    ));
    Ok(())
}

/// `decode tokenize`: the ids of the prompt (or of all of stdin) as one JSON array.
pub(crate) fn tokenize(args: &TokenizeArgs) -> AnyResult<()> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => qkv_fetch::default_model()?,
    };
    let tokenizer = qkv::tokenizer::Tokenizer::load(&path)?;
    let text = match &args.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| format!("reading stdin: {e}"))?;
            s
        }
    };
    let opts = qkv::tokenizer::EncodeOptions {
        add_special: !args.no_bos,
        parse_special: !args.no_parse_special,
    };
    let ids = tokenizer.encode_with(&text, opts)?;
    let mut out = Out {
        stdout: std::io::stdout().lock(),
        closed: false,
    };
    out.write(&(serde_json::to_string(&ids)? + "\n"))?;
    Ok(())
}
