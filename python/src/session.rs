//! [`Session`]: one sequence on a [`Model`], generated as `decode` generates (the same
//! sampler over the same logits, so greedy runs give `decode`'s tokens): one token per call
//! for a stream, or a run of tokens per call for an answer returned whole, so that the
//! model's steps follow one another as closely as in `decode`, with no trip through Python
//! between them. Each call releases the GIL while the model runs; Python regains control
//! after each call, which a batch bounds in time, so Ctrl-C stops a generation promptly.

use crate::errors::{self, from_qkv};
use crate::model::{Model, Plan};
use pyo3::prelude::*;
use qkv::engine::TokenConstraint;
use qkv::sample::{Sampled, Sampler};
use qkv_server::token_text::TokenText;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A generation in progress.
struct Run {
    sampler: Sampler,
    /// In a mutex only so that the session may be shared between threads (Python objects
    /// may be); the session's `&mut` methods reach it without locking.
    constraint: Mutex<Option<Box<dyn TokenConstraint>>>,
    text: TokenText,
    remaining: usize,
    generated: usize,
    prompt_tokens: usize,
    ignore_eos: bool,
    top_logprobs: usize,
    stops: StopScan,
    finish: Option<&'static str>,
}

/// The stop strings of a run, looked for in its text as it grows; only the tail that could
/// still hold the start of one is kept.
struct StopScan {
    stops: Vec<String>,
    /// The longest stop string's length in bytes.
    longest: usize,
    tail: String,
}

impl StopScan {
    fn new(stops: &[String]) -> StopScan {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        StopScan {
            longest: stops.iter().map(String::len).max().unwrap_or(0),
            stops,
            tail: String::new(),
        }
    }

    /// Adds `piece` to the text; whether a stop string now appears in it (it ends in
    /// `piece`, since the text before was searched already).
    fn hit(&mut self, piece: &str) -> bool {
        if self.stops.is_empty() || piece.is_empty() {
            return false;
        }
        self.tail.push_str(piece);
        if self.stops.iter().any(|s| self.tail.contains(s.as_str())) {
            return true;
        }
        // Keep what could be the first bytes of a stop string, from a character boundary.
        let mut cut = self.tail.len().saturating_sub(self.longest - 1);
        while !self.tail.is_char_boundary(cut) {
            cut -= 1;
        }
        self.tail.drain(..cut);
        false
    }
}

/// One sequence's KV cache and the generation running in it.
#[pyclass(module = "qkv._native")]
pub struct Session {
    model: Arc<qkv::load::Model>,
    session: qkv::session::Session,
    run: Option<Run>,
    masked: Vec<f32>,
}

/// A token as [`Session::next`] returns it: id, text, log-probability, top alternatives.
type TokenTuple = (u32, String, f32, Vec<(u32, f32)>);

impl Session {
    fn check_started(&self) -> PyResult<()> {
        match self.run {
            Some(_) => Ok(()),
            None => Err(errors::invalid("no generation was started on this session")),
        }
    }

    /// One token of the started generation: sampled, its text, and the step that feeds it
    /// back unless it ends the generation (the end of sequence, a complete constraint, a
    /// stop string, the token limit); `None` once the generation has finished. Needs no GIL.
    fn advance(&mut self) -> qkv::Result<Option<TokenTuple>> {
        let run = self.run.as_mut().expect("checked by the caller");
        if run.finish.is_some() {
            return Ok(None);
        }
        if run.remaining == 0 || self.session.position() >= self.session.capacity() {
            run.finish = Some("length");
            return Ok(None);
        }
        let sampled = self.sample()?;
        let top = match self.run.as_ref().map_or(0, |r| r.top_logprobs) {
            0 => Vec::new(),
            k => qkv::engine::top_logprobs(self.session.logits(), k),
        };
        let tokenizer = self.model.tokenizer().expect("checked at load");
        let run = self.run.as_mut().expect("checked by the caller");
        run.generated += 1;
        run.remaining -= 1;
        let text = run.text.push(tokenizer, sampled.id);
        let eos = !run.ignore_eos && tokenizer.eos_id() == Some(sampled.id);
        // A constraint that is complete allows nothing more: the output ends as at EOS.
        let complete = run
            .constraint
            .get_mut()
            .is_ok_and(|c| c.as_ref().is_some_and(|c| c.is_complete()));
        let stopped = run.stops.hit(&text);
        let finish = if eos || complete || stopped {
            Some("stop")
        } else if run.remaining == 0 {
            Some("length")
        } else {
            None
        };
        match finish {
            Some(f) => run.finish = Some(f),
            None => {
                self.session.step(sampled.id)?;
            }
        }
        Ok(Some((sampled.id, text, sampled.logprob, top)))
    }

    fn sample(&mut self) -> qkv::Result<Sampled> {
        let run = self.run.as_mut().expect("checked by the caller");
        let logits = self.session.logits();
        let recent = self.session.tokens();
        let first = run.sampler.sample(logits, recent)?;
        let constraint = run
            .constraint
            .get_mut()
            .map_err(|_| qkv::Error::Config("constraint: poisoned".into()))?;
        let Some(c) = constraint.as_mut() else {
            return Ok(first);
        };
        let refused = |e: String| qkv::Error::Config(format!("constraint: {e}"));
        if c.allows(first.id) {
            c.commit(first.id).map_err(refused)?;
            return Ok(first);
        }
        self.masked.clear();
        self.masked.extend_from_slice(logits);
        c.mask(&mut self.masked).map_err(refused)?;
        let id = run.sampler.sample(&self.masked, recent)?.id;
        c.commit(id).map_err(refused)?;
        let lse = qkv::kernels::activation::log_sum_exp(logits);
        Ok(Sampled {
            id,
            logprob: (logits[id as usize] - lse).min(0.0),
        })
    }
}

#[pymethods]
impl Session {
    /// A session on `model` with a KV cache of `n_ctx` positions (`None`: the model's
    /// context length); `kv_type` (`"f16"`, `"f32"`, `"q8_0"`) says how keys and values are
    /// stored.
    #[new]
    #[pyo3(signature = (model, n_ctx = None, kv_type = None))]
    fn new(
        py: Python<'_>,
        model: &Model,
        n_ctx: Option<usize>,
        kv_type: Option<&str>,
    ) -> PyResult<Session> {
        let kv_dtype = match kv_type {
            None => None,
            Some(k) => Some(
                k.parse::<qkv::models::decoder::KvType>()
                    .map_err(|e| errors::invalid(format!("kv_type {k:?}: {e}")))?,
            ),
        };
        let options = qkv::session::SessionOptions {
            context: n_ctx,
            kv_dtype,
            prefill_chunk: None,
        };
        let inner = model.inner.clone();
        let session = py
            .allow_threads(|| qkv::session::Session::new(inner.clone(), options))
            .map_err(from_qkv)?;
        Ok(Session {
            model: inner,
            session,
            run: None,
            masked: Vec::new(),
        })
    }

    /// Positions the KV cache holds.
    #[getter]
    fn n_ctx(&self) -> usize {
        self.session.capacity()
    }

    /// Starts `plan` on an empty cache: reads its prompt (the GIL released meanwhile).
    /// A prompt that does not fit the cache is a `ContextLengthError`.
    fn start(&mut self, py: Python<'_>, plan: &Plan) -> PyResult<()> {
        let sampler = Sampler::new(plan.sampler.clone()).map_err(from_qkv)?;
        let capacity = self.session.capacity();
        if plan.prompt.len() >= capacity {
            return Err(from_qkv(qkv::Error::ContextFull {
                needed: plan.prompt.len() + 1,
                capacity,
            }));
        }
        self.run = None;
        self.session.reset();
        let session = &mut self.session;
        py.allow_threads(|| session.prefill(&plan.prompt).map(|_| ()))
            .map_err(from_qkv)?;
        let room = capacity - plan.prompt.len();
        self.run = Some(Run {
            sampler,
            constraint: Mutex::new(plan.take_constraint()),
            text: TokenText::new(plan.parse.is_some()),
            remaining: plan.max_tokens.unwrap_or(room),
            generated: 0,
            prompt_tokens: plan.prompt.len(),
            ignore_eos: plan.ignore_eos,
            top_logprobs: plan.top_logprobs,
            stops: StopScan::new(&plan.stop),
            finish: None,
        });
        Ok(())
    }

    /// The next token `(id, text, logprob, top)` of the generation, or `None` once it has
    /// finished (then [`finish_reason`](Self::finish_reason) says why and
    /// [`flush`](Self::flush) gives the text held back).
    fn next(&mut self, py: Python<'_>) -> PyResult<Option<TokenTuple>> {
        self.check_started()?;
        py.allow_threads(|| self.advance()).map_err(from_qkv)
    }

    /// The next tokens of the generation, as [`next`](Self::next) gives them, computed in
    /// one call: up to `limit` of them, fewer when the generation finishes or when `seconds`
    /// have passed (so that Python, and Ctrl-C, regain control); an empty list once it has
    /// finished.
    #[pyo3(signature = (limit = 64, seconds = 0.05))]
    fn next_batch(
        &mut self,
        py: Python<'_>,
        limit: usize,
        seconds: f64,
    ) -> PyResult<Vec<TokenTuple>> {
        self.check_started()?;
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(errors::invalid(format!(
                "seconds {seconds}: must be a finite number of seconds, 0 or more"
            )));
        }
        let budget = Duration::from_secs_f64(seconds.min(3600.0));
        py.allow_threads(|| {
            let start = Instant::now();
            let mut out = Vec::new();
            while out.len() < limit {
                match self.advance()? {
                    Some(t) => out.push(t),
                    None => break,
                }
                if start.elapsed() >= budget {
                    break;
                }
            }
            Ok(out)
        })
        .map_err(from_qkv)
    }

    /// Why the generation finished (`"stop"`, `"length"`), or `None` while it runs.
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        self.run.as_ref().and_then(|r| r.finish)
    }

    /// Ends the generation now (a stop string was met, the caller gave up): `reason` is
    /// reported as its finish reason.
    fn stop(&mut self, reason: &str) {
        if let Some(r) = self.run.as_mut() {
            r.finish = Some(if reason == "length" { "length" } else { "stop" });
        }
    }

    /// The text held back at the end (an unfinished character, as U+FFFD).
    fn flush(&mut self) -> String {
        self.run
            .as_mut()
            .map(|r| r.text.finish())
            .unwrap_or_default()
    }

    /// Tokens of the prompt of the current generation.
    #[getter]
    fn prompt_tokens(&self) -> usize {
        self.run.as_ref().map_or(0, |r| r.prompt_tokens)
    }

    /// Tokens generated so far.
    #[getter]
    fn generated(&self) -> usize {
        self.run.as_ref().map_or(0, |r| r.generated)
    }
}
