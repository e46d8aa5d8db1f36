//! Perplexity and KL divergence over a text, the way `llama-perplexity` measures them.
//!
//! The text's tokens are cut into non-overlapping windows of `ctx` tokens (a tail shorter
//! than a window is dropped). Each window runs from an empty cache, and only its second half
//! is scored: the logits after token `j` predict token `j + 1` for `j` in `ctx/2 .. ctx−1`,
//! so every scored token sees at least `ctx/2` tokens of context. Perplexity is
//! `exp(mean NLL)` over the scored tokens.
//!
//! With a base run saved ([`Scoring::SaveBase`]: a header naming the window size, window
//! count and vocabulary, the tokens, then every scored position's log-probabilities over the
//! whole vocabulary as f16), another run of the same tokens — a quantized file against the f32
//! weights, say — reports the mean KL divergence `Σ p_base · (log p_base − log p)` and how
//! often both runs agree on the most likely token ("same top p" in llama.cpp's words).
//!
//! ```no_run
//! use qkv::load::{Model, ModelOptions};
//! use qkv::perplexity::{evaluate, Scoring};
//! use std::sync::Arc;
//!
//! let path = std::path::Path::new("model.gguf"); // any GGUF file or Hugging Face directory
//! let model = Arc::new(Model::load(path, &ModelOptions::default())?);
//! let tokens = model.tokenizer().unwrap().encode("some long English text …")?;
//! let report = evaluate(&model, &tokens, 512, Scoring::Perplexity, |_, _| {})?;
//! println!("PPL = {:.4} ± {:.4}", report.ppl, report.ppl_err);
//! # Ok::<(), qkv::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::load::Model;
use crate::models::decoder::KvType;
use crate::session::{Session, SessionOptions};
use half::f16;
use rayon::prelude::*;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

/// The magic and version at the start of a [`KlBase`] file.
const MAGIC: &[u8; 8] = b"QKVKLB01";

/// What a run does besides perplexity.
pub enum Scoring<'a> {
    /// Perplexity only.
    Perplexity,
    /// Also write every scored position's log-probabilities to a base file.
    SaveBase(&'a Path),
    /// Also compare with a base file written by an earlier run of the same tokens.
    CompareBase(&'a Path),
}

/// The figures of a run, each mean with its standard error.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Windows evaluated.
    pub windows: usize,
    /// Tokens per window.
    pub ctx: usize,
    /// Tokens scored.
    pub scored: usize,
    /// Perplexity, `exp(mean NLL)`.
    pub ppl: f64,
    /// Its standard error.
    pub ppl_err: f64,
    /// With a base: mean KL divergence from the base, in nats, and its standard error.
    pub kld: Option<(f64, f64)>,
    /// With a base: the share of scored positions whose most likely token is the base's, and
    /// its standard error.
    pub same_top: Option<(f64, f64)>,
    /// With a base: the base run's perplexity.
    pub base_ppl: Option<f64>,
}

impl Report {
    /// One JSON object with every figure.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "windows": self.windows,
            "ctx": self.ctx,
            "scored": self.scored,
            "ppl": self.ppl,
            "ppl_err": self.ppl_err,
            "kld": self.kld.map(|k| k.0),
            "kld_err": self.kld.map(|k| k.1),
            "same_top": self.same_top.map(|k| k.0),
            "same_top_err": self.same_top.map(|k| k.1),
            "base_ppl": self.base_ppl,
        })
    }
}

/// Running mean and standard error of a sample.
#[derive(Default)]
struct Moments {
    n: usize,
    sum: f64,
    sum2: f64,
}

impl Moments {
    fn add(&mut self, v: f64) {
        self.n += 1;
        self.sum += v;
        self.sum2 += v * v;
    }

    fn mean_err(&self) -> (f64, f64) {
        let n = self.n as f64;
        let mean = self.sum / n;
        let var = (self.sum2 / n - mean * mean).max(0.0);
        (
            mean,
            if self.n > 1 {
                (var / (n - 1.0)).sqrt()
            } else {
                0.0
            },
        )
    }
}

/// `log_softmax(logits)` into `out` (f64 sums), returning nothing; errors on a non-finite
/// logit, which would otherwise turn every figure into NaN without saying where.
fn log_softmax(logits: &[f32], out: &mut [f64]) -> std::result::Result<(), usize> {
    if let Some(i) = crate::sample::first_non_finite(logits) {
        return Err(i);
    }
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    for (o, &v) in out.iter_mut().zip(logits) {
        *o = v as f64 - log_z;
    }
    Ok(())
}

/// What one scored position gives.
struct Scored {
    /// −log p(target).
    nll: f64,
    /// Against a base: the base's −log p(target), the KL divergence, and whether both put the
    /// same token first.
    vs_base: Option<(f64, f64, bool)>,
    /// When saving a base: the log-probabilities as little-endian f16.
    log_probs: Vec<u8>,
}

/// Scores one position's `logits` for `target`, against `base` (f16 log-probabilities) when
/// given; `Err` when a logit is not finite.
fn score(
    logits: &[f32],
    target: usize,
    base: Option<&[u8]>,
    save: bool,
) -> std::result::Result<Scored, usize> {
    let mut lp = vec![0.0f64; logits.len()];
    log_softmax(logits, &mut lp)?;
    let vs_base = base.map(|bytes| {
        let mut kld = 0.0f64;
        let mut best = (f32::NEG_INFINITY, 0usize);
        for (v, b) in bytes.chunks_exact(2).enumerate() {
            let lb = f16::from_le_bytes([b[0], b[1]]).to_f32();
            if lb > best.0 {
                best = (lb, v);
            }
            kld += f64::from(lb).exp() * (f64::from(lb) - lp[v]);
        }
        let tb = [bytes[2 * target], bytes[2 * target + 1]];
        let base_nll = -f64::from(f16::from_le_bytes(tb).to_f32());
        (base_nll, kld, best.1 == argmax(logits))
    });
    let log_probs = if save {
        lp.iter()
            .flat_map(|&v| f16::from_f64(v).to_le_bytes())
            .collect()
    } else {
        Vec::new()
    };
    Ok(Scored {
        nll: -lp[target],
        vs_base,
        log_probs,
    })
}

/// The index of the largest value (the first, on ties).
fn argmax<T: PartialOrd + Copy>(v: &[T]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// The start of a base file: magic, window size, window count, vocabulary (u32 each), then
/// the tokens. `vocab` f16 log-probabilities per scored position follow it.
fn base_header(ctx: usize, windows: usize, vocab: usize, tokens: &[u32]) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    for v in [ctx, windows, vocab] {
        h.extend((v as u32).to_le_bytes());
    }
    h.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    h
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// Runs `tokens` in windows of `ctx` and scores them (see the module docs). `progress` is
/// called after each window with its number and the running perplexity.
///
/// Errors: [`Error::Config`] when there are fewer than `2·ctx` tokens, or `ctx` is below 8 or
/// past the model's context; [`Error::Format`] when a base file is not one, or was made from
/// other tokens, another context or another vocabulary; [`Error::NonFiniteLogits`] when a
/// logit is not finite (its `sequence` is the window, its `position` the token it follows in
/// the window); [`Error::AllocationRefused`] when the logits of a window do not fit in
/// memory; the session's errors otherwise.
pub fn evaluate(
    model: &Arc<Model>,
    tokens: &[u32],
    ctx: usize,
    scoring: Scoring<'_>,
    progress: impl FnMut(usize, f64),
) -> Result<Report> {
    evaluate_with(model, tokens, ctx, None, scoring, progress)
}

/// [`evaluate`] with the KV cache stored as `kv_type` (`None`: the model's default), e.g.
/// to measure a Q8_0 cache's KL divergence against an f16 cache's base file.
pub fn evaluate_with(
    model: &Arc<Model>,
    tokens: &[u32],
    ctx: usize,
    kv_type: Option<KvType>,
    scoring: Scoring<'_>,
    mut progress: impl FnMut(usize, f64),
) -> Result<Report> {
    if ctx < 8 || ctx > model.config().context {
        return Err(Error::Config(format!(
            "perplexity context {ctx} must be at least 8 and at most the model's {}",
            model.config().context
        )));
    }
    let windows = tokens.len() / ctx;
    if windows < 2 {
        return Err(Error::Config(format!(
            "perplexity over windows of {ctx} needs at least {} tokens, the text has {}",
            2 * ctx,
            tokens.len()
        )));
    }
    let vocab = model.vocab_size();
    let used = &tokens[..windows * ctx];
    let header = base_header(ctx, windows, vocab, used);
    let mut writer = None;
    let mut reader = None;
    match scoring {
        Scoring::Perplexity => {}
        Scoring::SaveBase(path) => {
            let file = std::fs::File::create(path).map_err(io_err(path))?;
            let mut w = BufWriter::with_capacity(1 << 20, file);
            w.write_all(&header).map_err(io_err(path))?;
            writer = Some((w, path));
        }
        Scoring::CompareBase(path) => {
            let file = std::fs::File::open(path).map_err(io_err(path))?;
            let mut r = BufReader::with_capacity(1 << 20, file);
            let mut got = vec![0u8; header.len()];
            r.read_exact(&mut got).map_err(|_| Error::Format {
                path: path.to_owned(),
                msg: "too short for a KL base of this text".into(),
            })?;
            if got[..8] != MAGIC[..] {
                return Err(Error::Format {
                    path: path.to_owned(),
                    msg: "not a qkv KL base file (written by `decode perplexity --kl-base`)".into(),
                });
            }
            if got != header {
                let num =
                    |i: usize| u32::from_le_bytes([got[i], got[i + 1], got[i + 2], got[i + 3]]);
                return Err(Error::Format {
                    path: path.to_owned(),
                    msg: format!(
                        "made from other tokens: ctx {}, {} windows, vocab {} (this run: ctx {ctx}, {windows} windows, vocab {vocab}), or another text or tokenizer",
                        num(8),
                        num(12),
                        num(16)
                    ),
                });
            }
            reader = Some((r, path));
        }
    }

    let options = SessionOptions {
        context: Some(ctx),
        kv_dtype: kv_type,
        prefill_chunk: Some(ctx),
    };
    let mut session = Session::new(model.clone(), options)?;
    let first = ctx / 2;
    let n_scored = ctx - 1 - first;
    let mut logits = crate::alloc::zeroed_for(&[ctx, vocab], || {
        format!("the logits of a window of {ctx} tokens")
    })?;
    let mut base_bytes = if reader.is_some() {
        crate::alloc::zeroed_for(&[n_scored, vocab, 2], || {
            format!("the base log-probabilities of a window of {ctx} tokens")
        })?
    } else {
        Vec::new()
    };
    let mut nll = Moments::default();
    let mut base_nll = Moments::default();
    let mut kld = Moments::default();
    let mut same = Moments::default();
    for w in 0..windows {
        let window = &used[w * ctx..(w + 1) * ctx];
        session.reset();
        session.prefill_all(window, &mut logits)?;
        if let Some((r, path)) = reader.as_mut() {
            r.read_exact(&mut base_bytes).map_err(|_| Error::Format {
                path: path.to_path_buf(),
                msg: format!("ends inside window {w}"),
            })?;
        }
        // The scored positions, in parallel; each gives its figures or the non-finite logit.
        let base = reader.as_ref().map(|_| &base_bytes[..]);
        let save = writer.is_some();
        let rows: Vec<Result<Scored>> = (0..n_scored)
            .into_par_iter()
            .map(|s| {
                let j = first + s;
                let row = &logits[j * vocab..(j + 1) * vocab];
                let base = base.map(|b| &b[s * vocab * 2..(s + 1) * vocab * 2]);
                score(row, window[j + 1] as usize, base, save).map_err(|token| {
                    Error::NonFiniteLogits {
                        sequence: Some(w),
                        position: Some(j),
                        token,
                        value: row[token],
                    }
                })
            })
            .collect();
        for r in rows {
            let scored = r?;
            nll.add(scored.nll);
            if let Some((b_nll, k, top)) = scored.vs_base {
                base_nll.add(b_nll);
                kld.add(k);
                same.add(if top { 1.0 } else { 0.0 });
            }
            if let Some((wr, path)) = writer.as_mut() {
                wr.write_all(&scored.log_probs).map_err(io_err(path))?;
            }
        }
        progress(w + 1, nll.mean_err().0.exp());
    }
    if let Some((mut wr, path)) = writer {
        wr.flush().map_err(io_err(path))?;
    }
    let (mean, err) = nll.mean_err();
    let ppl = mean.exp();
    let compared = reader.is_some();
    Ok(Report {
        windows,
        ctx,
        scored: nll.n,
        ppl,
        ppl_err: ppl * err,
        kld: compared.then(|| kld.mean_err()),
        same_top: compared.then(|| same.mean_err()),
        base_ppl: compared.then(|| base_nll.mean_err().0.exp()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalises_and_flags_non_finite() {
        let mut out = [0.0f64; 3];
        log_softmax(&[1.0, 2.0, 3.0], &mut out).unwrap();
        let total: f64 = out.iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert!((out[2] - out[1] - 1.0).abs() < 1e-12);
        assert_eq!(log_softmax(&[1.0, f32::NAN, 0.0], &mut out), Err(1));
    }

    #[test]
    fn moments_give_mean_and_standard_error() {
        let mut m = Moments::default();
        for v in [1.0, 2.0, 3.0, 4.0] {
            m.add(v);
        }
        let (mean, err) = m.mean_err();
        assert_eq!(mean, 2.5);
        // Sample variance 1.25·4/3; the standard error divides by n.
        assert!((err - (1.25f64 / 3.0).sqrt()).abs() < 1e-12);
    }
}
