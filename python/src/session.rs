//! [`Session`]: one sequence on a [`Model`], generated one token per call as `decode`
//! generates (the same sampler over the same logits, so greedy runs give `decode`'s tokens).
//! Each call releases the GIL while the model runs; Python regains control between tokens,
//! so Ctrl-C stops a generation at the next token.

use crate::errors::{self, from_qkv};
use crate::model::{Model, Plan};
use pyo3::prelude::*;
use qkv::engine::TokenConstraint;
use qkv::sample::{Sampled, Sampler};
use qkv_server::token_text::TokenText;
use std::sync::{Arc, Mutex};

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
    finish: Option<&'static str>,
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
            finish: None,
        });
        Ok(())
    }

    /// The next token `(id, text, logprob, top)` of the generation, or `None` once it has
    /// finished (then [`finish_reason`](Self::finish_reason) says why and
    /// [`flush`](Self::flush) gives the text held back).
    fn next(&mut self, py: Python<'_>) -> PyResult<Option<TokenTuple>> {
        let Some(run) = self.run.as_ref() else {
            return Err(errors::invalid("no generation was started on this session"));
        };
        if run.finish.is_some() {
            return Ok(None);
        }
        if run.remaining == 0 || self.session.position() >= self.session.capacity() {
            self.run.as_mut().expect("checked").finish = Some("length");
            return Ok(None);
        }
        let sampled = self.sample().map_err(from_qkv)?;
        let top = match self.run.as_ref().map_or(0, |r| r.top_logprobs) {
            0 => Vec::new(),
            k => qkv::engine::top_logprobs(self.session.logits(), k),
        };
        let tokenizer = self.model.tokenizer().expect("checked at load");
        let run = self.run.as_mut().expect("checked");
        run.generated += 1;
        run.remaining -= 1;
        let text = run.text.push(tokenizer, sampled.id);
        let eos = !run.ignore_eos && tokenizer.eos_id() == Some(sampled.id);
        // A constraint that is complete allows nothing more: the output ends as at EOS.
        let complete = run
            .constraint
            .get_mut()
            .is_ok_and(|c| c.as_ref().is_some_and(|c| c.is_complete()));
        let finish = if eos || complete {
            Some("stop")
        } else if run.remaining == 0 {
            Some("length")
        } else {
            None
        };
        match finish {
            Some(f) => run.finish = Some(f),
            None => {
                let session = &mut self.session;
                py.allow_threads(|| session.step(sampled.id).map(|_| ()))
                    .map_err(from_qkv)?;
            }
        }
        Ok(Some((sampled.id, text, sampled.logprob, top)))
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
