//! [`Engine`]: continuous batching. Many sequences advance together, one forward pass per
//! step: the decode token of every running sequence and chunks of the prompts that are
//! being read become the rows of one matrix product per weight, so each weight is read once
//! per step for all of them, while attention runs per sequence over its own KV cache.
//!
//! - Requests wait in a bounded queue and are admitted between steps while a slot (a KV
//!   cache) is free under the memory budget; finished, cancelled or failed sequences leave
//!   between steps without disturbing the others.
//! - Prompts are read in chunks under a per-step token budget, after the decode tokens of
//!   the running sequences, so a long prompt never stalls the streams already running by
//!   more than one small chunk a step ([`EngineOptions::step_tokens`], which is also what
//!   each reading prompt may take of a step when several read at once). A step in which at
//!   least as many sequences read their prompts as decode (none decodes, or a burst of
//!   requests just arrived) reads the prompts together under the larger
//!   [`EngineOptions::prefill_step_tokens`], so that streams that arrive together start
//!   together, and none of them is stalled by its neighbours' prompts afterwards.
//! - A finished sequence's cache is kept: a new prompt that starts with its tokens (the same
//!   system prompt, the previous turn of a chat) reuses those positions instead of running
//!   them again ([`Event::Done`] reports how many).
//! - Sampling is per sequence, with its own settings and seed: a sequence gets the same
//!   tokens in a batch as alone (up to the order of f32 additions in the logits).
//! - A sequence may carry a [`TokenConstraint`] (a grammar, a JSON schema): the sampled
//!   token is checked against it, and only when it is refused are the logits masked to the
//!   tokens it allows and sampled again, so that the full mask is paid for only on the
//!   steps that need it. A constraint that is complete ends its sequence.
//! - A sequence may speculate ([`GenRequest::speculation`]): its last token and a draft of
//!   the tokens that may follow (n-gram lookup, or a draft model set with
//!   [`Engine::set_draft_model`], on a KV cache of its own per slot) run as one segment of
//!   the step's pass, with logits for each, and the drafts verification keeps are kept,
//!   with the token after them: several tokens for one read of the weights. Greedy, they
//!   are exactly those of plain decoding; sampling, drafts are kept or replaced by the
//!   speculative-sampling rule, so the tokens have the distribution of plain sampling. The
//!   cache forgets the rejected drafts' positions; each sequence's drafting adapts to what
//!   it keeps and pauses when it does not pay (`speculate.rs`).
//!
//! Once every slot's cache exists, a step that admits no new sequence allocates nothing
//! but the events it returns.
//!
//! ```
//! use qkv::engine::{Engine, EngineOptions, Event, GenRequest};
//! use qkv::load::Model;
//! use qkv::models::decoder::{Decoder, DecoderConfig, WeightLayout};
//! use qkv::sample::SamplerConfig;
//! use qkv::weights::FloatType;
//! use std::sync::Arc;
//!
//! let config = DecoderConfig::llama(32, 2, 4, 2, 64, 50, 128, WeightLayout::Gguf);
//! let model = Arc::new(Model::from_parts(Decoder::synthetic(config, 1, FloatType::F32)?, None));
//! let mut engine = Engine::new(model, EngineOptions { context: 64, ..EngineOptions::default() })?;
//! let a = engine.submit(GenRequest::new(vec![1, 2, 3], SamplerConfig::greedy(), 5))?;
//! let b = engine.submit(GenRequest::new(vec![4, 5], SamplerConfig::greedy(), 3))?;
//! let mut events = Vec::new();
//! while !engine.is_idle() {
//!     engine.step(&mut events)?;
//! }
//! let tokens = |id| events.iter().filter(|e| matches!(e, Event::Token { seq, .. } if *seq == id)).count();
//! assert_eq!((tokens(a), tokens(b)), (5, 3));
//! # Ok::<(), qkv::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::load::Model;
use crate::models::decoder::{KvCache, KvType, ScaledLora, Scratch, Segment};
use crate::sample::{Sampler, SamplerConfig};
use crate::session::Session;
use crate::speculative::{SpecStats, Speculation};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

mod after_pass;
mod shift;
mod slots;
mod speculate;
pub use after_pass::top_logprobs;
use after_pass::{done, read_prompt_chunk, sample_next};
pub use slots::SavedSlot;
use speculate::SpecState;

/// How an [`Engine`] is sized.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Most sequences running at once (each holds a KV cache).
    pub max_sequences: usize,
    /// KV cache capacity of each sequence, in positions (prompt and generated tokens).
    pub context: usize,
    /// Most bytes all KV caches may take together; `None` = `max_sequences` caches. Fewer
    /// sequences run at once when the budget does not hold that many.
    pub kv_budget: Option<usize>,
    /// Most tokens one step runs while more sequences decode than read their prompts
    /// (decode tokens first, then prompt chunks): what bounds the inter-token latency of
    /// running streams when a new prompt arrives. Decode tokens always run, even past it;
    /// the drafts of speculating sequences take what they leave, before prompt chunks.
    /// When several prompts read at once, each may take this many tokens of a step (all of
    /// them together at most [`prefill_step_tokens`](Self::prefill_step_tokens)), so that
    /// a burst that lands among many running streams is not read at a trickle.
    pub step_tokens: usize,
    /// Most tokens a step runs when at least as many sequences are reading their prompts as
    /// are decoding (none decodes, or a burst just arrived); the larger of this and
    /// [`step_tokens`](Self::step_tokens) is used. Sizes the scratch with it.
    pub prefill_step_tokens: usize,
    /// Most requests waiting for a slot; [`Engine::submit`] refuses more.
    pub queue: usize,
    /// How the KV caches store keys and values; `None` = the model's default (see
    /// [`SessionOptions::kv_dtype`](crate::session::SessionOptions::kv_dtype)). With
    /// [`KvType::Q8_0`] each cache takes about half the bytes of f16, so a
    /// [`kv_budget`](Self::kv_budget) admits about twice the sequences.
    pub kv_dtype: Option<KvType>,
}

impl Default for EngineOptions {
    /// 16 sequences of 2048 positions, 64 waiting; 128 tokens a step while sequences
    /// decode, 2048 in a step of prompts only (the defaults measured in BENCHMARKS.md,
    /// "Serving at 1 to 64 streams").
    fn default() -> Self {
        EngineOptions {
            max_sequences: 16,
            context: 2048,
            kv_budget: None,
            step_tokens: 128,
            prefill_step_tokens: 2048,
            queue: 64,
            kv_dtype: None,
        }
    }
}

/// One generation to run.
#[derive(Clone, Debug)]
pub struct GenRequest {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// How to pick tokens.
    pub sampler: SamplerConfig,
    /// Most tokens to generate (at least one).
    pub max_tokens: usize,
    /// Keep going past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Report the log-probabilities of this many most likely tokens at each step (0: none).
    pub top_logprobs: usize,
    /// Whether to draft tokens and verify them in the step's pass: the tokens are those of
    /// plain decoding when greedy, of its distribution when sampling, several per pass when
    /// drafts are kept. [`Speculation::Draft`] needs [`Engine::set_draft_model`].
    pub speculation: Speculation,
    /// Run in this slot (`0..`[`Engine::max_running`]), as llama-server's `id_slot` asks:
    /// the request waits until that slot is free, and reuses what it caches (a restored
    /// [`Engine::restore_slot`] file, say). `None`: any free slot, the one sharing the
    /// longest prefix with the prompt first.
    pub slot: Option<usize>,
    /// Context shift, with the number of leading tokens to keep (llama-server's `n_keep`,
    /// at most the context less 4): when the sequence's tokens fill its context, the tokens
    /// after the first `n_keep` are halved (the older half dropped) and the rest are run
    /// again at their new positions, so that it goes on generating (see
    /// [`Event::Shifted`]). `None`: the prompt and `max_tokens` must fit the context.
    pub context_shift: Option<usize>,
    /// The LoRA adapters applied to this sequence, each at its scale (loaded for the
    /// engine's model with [`Decoder::load_lora`](crate::models::decoder::Decoder::load_lora)):
    /// sequences with different adapters, or none, share each step's pass. A cached prefix
    /// is reused only from a sequence that ran under the same adapters and scales.
    pub lora: Vec<ScaledLora>,
}

impl GenRequest {
    /// A request with the given prompt, sampler and token limit; EOS ends it, no top
    /// log-probabilities.
    pub fn new(prompt: Vec<u32>, sampler: SamplerConfig, max_tokens: usize) -> GenRequest {
        GenRequest {
            prompt,
            sampler,
            max_tokens,
            ignore_eos: false,
            top_logprobs: 0,
            speculation: Speculation::Off,
            slot: None,
            context_shift: None,
            lora: Vec::new(),
        }
    }
}

/// A sequence's handle, unique within an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It generated the end-of-sequence token (reported as its last token).
    Eos,
    /// It generated `max_tokens` tokens.
    Length,
    /// [`Engine::cancel`] ended it.
    Cancelled,
    /// Its [`TokenConstraint`] is complete: no token may follow the last one.
    Complete,
}

/// Which tokens a sequence may generate next: a grammar or a schema that follows the
/// tokens as they are generated. The engine asks [`allows`](Self::allows) about each
/// sampled token, and [`mask`](Self::mask)s the logits only when the token is refused; the
/// token kept is then [`commit`](Self::commit)ted. Errors are messages for the client (the
/// sequence fails with them).
pub trait TokenConstraint: Send {
    /// Whether `token` may come next.
    fn allows(&mut self, token: u32) -> bool;
    /// Lowers the logit of every token that may not come next to `f32::MIN` (finite, so that
    /// the sampler still reads the row); `logits` may be longer than the vocabulary the
    /// constraint knows, and the ids past it are refused.
    fn mask(&mut self, logits: &mut [f32]) -> std::result::Result<(), String>;
    /// Advances past `token`, which came next.
    fn commit(&mut self, token: u32) -> std::result::Result<(), String>;
    /// True when the output is complete and nothing more may follow.
    fn is_complete(&self) -> bool;
}

/// What a step reports.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A sequence generated a token.
    Token {
        /// The sequence.
        seq: SeqId,
        /// The token id.
        token: u32,
        /// Its log-probability under the model's distribution.
        logprob: f32,
        /// The `top_logprobs` most likely tokens and their log-probabilities, best first.
        top: Vec<(u32, f32)>,
    },
    /// A sequence ended; no event about it follows.
    Done {
        /// The sequence.
        seq: SeqId,
        /// Why.
        reason: FinishReason,
        /// Tokens of its prompt.
        prompt_tokens: usize,
        /// Of those, how many were reused from a cached sequence instead of being run.
        cached_tokens: usize,
        /// Tokens generated.
        generated: usize,
        /// What speculation did for it: tokens drafted, of those kept, verify passes.
        spec: SpecStats,
    },
    /// A sequence's prompt advanced: `read` of its `total` prompt tokens are in its cache,
    /// `cached` of them reused from an earlier sequence. Sent when the sequence takes a slot
    /// (then `read == cached`) and after each chunk of its prompt runs (the last with
    /// `read == total`, before its first token), so a server can report progress through a
    /// long prompt.
    Prompt {
        /// The sequence.
        seq: SeqId,
        /// Prompt tokens reused from a cached sequence.
        cached: usize,
        /// Prompt tokens in the cache now, the reused ones included.
        read: usize,
        /// Tokens of the prompt.
        total: usize,
    },
    /// A sequence with [`GenRequest::context_shift`] filled its context: the `dropped`
    /// tokens after its first `kept` were forgotten, and the tokens after them are run again
    /// at their new positions before it samples its next token (exactly as a sequence
    /// whose prompt were the shifted tokens would).
    Shifted {
        /// The sequence.
        seq: SeqId,
        /// Leading tokens kept in place.
        kept: usize,
        /// Tokens dropped after them.
        dropped: usize,
    },
    /// A sequence failed (its logits were not finite, say); no event about it follows.
    Failed {
        /// The sequence.
        seq: SeqId,
        /// What went wrong.
        error: String,
    },
}

/// A sequence in a slot.
struct Running {
    seq: SeqId,
    request: GenRequest,
    sampler: Sampler,
    /// Tokens of the request's prompt (`request.prompt` is replaced by the tokens to run
    /// again after a context shift).
    prompt_len: usize,
    /// Prompt tokens already in the cache.
    read: usize,
    /// How many of them came from the cache of an earlier sequence.
    cached: usize,
    /// Tokens generated so far; the last one has not run through the model yet.
    generated: usize,
    /// The token to run at the next step (the last one generated), once the prompt is read.
    next: Option<u32>,
    cancelled: bool,
    constraint: Option<Box<dyn TokenConstraint>>,
    /// Its speculation, when it speculates.
    spec: Option<SpecState>,
}

/// A KV cache and what it holds.
struct Slot {
    cache: KvCache,
    /// The tokens whose keys and values the cache holds, in order.
    tokens: Vec<u32>,
    /// The adapters they ran under.
    lora: Vec<ScaledLora>,
    running: Option<Running>,
    /// The draft model's session of the sequences here that draft with it, once one has.
    draft: Option<Session>,
}

/// Continuous batching over one shared [`Model`]; see the [module docs](self).
pub struct Engine {
    model: Arc<Model>,
    options: EngineOptions,
    kv_dtype: KvType,
    /// Slots made so far (at most `max_slots`).
    slots: Vec<Slot>,
    max_slots: usize,
    queue: VecDeque<Waiting>,
    next_id: u64,
    scratch: Scratch,
    /// One row of logits per sequence of a step.
    logits: Vec<f32>,
    /// The segments of the next step, in slot order.
    plan: Vec<Planned>,
    /// The segments of a step, kept empty between steps so that its allocation is reused.
    segments: Vec<Segment<'static>>,
    /// A row of logits masked by a sequence's constraint.
    masked: Vec<f32>,
    /// What speculation did, over every sequence so far.
    spec_totals: SpecStats,
    /// The model of [`Speculation::Draft`], if set.
    draft_model: Option<Arc<Model>>,
    /// Scratch of a row's length for verifying drafts drawn from a distribution.
    spec_tmp: Vec<f32>,
}

/// One segment of a step's pass: which slot runs, how many of its tokens, and how many of
/// the last ones' logits are wanted (a decode token and its drafts, or the last chunk of a
/// prompt).
#[derive(Clone, Copy, Debug)]
struct Planned {
    slot: usize,
    tokens: usize,
    logits: usize,
    /// A decode token (with `drafted` drafts after it), not a prompt chunk.
    decode: bool,
    drafted: usize,
    /// Of the drafts, how many the model kept (known after the pass).
    kept: usize,
}

/// A request waiting for a slot, with its constraint.
type Waiting = (SeqId, GenRequest, Option<Box<dyn TokenConstraint>>);

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("options", &self.options)
            .field("slots", &self.slots.len())
            .field("running", &self.running())
            .field("queued", &self.queue.len())
            .finish()
    }
}

impl Engine {
    /// An engine over `model` (with or without a tokenizer: ids in, ids out; the tokenizer's
    /// end-of-sequence token, when there is one, ends a sequence). [`Error::Config`] when a
    /// size is 0, when `context` exceeds the model's context length, or when the KV budget
    /// does not hold one cache; [`Error::AllocationRefused`] when the memory of a KV cache,
    /// the scratch or the logits cannot be had.
    pub fn new(model: Arc<Model>, options: EngineOptions) -> Result<Engine> {
        let o = &options;
        for (what, v) in [
            ("max_sequences", o.max_sequences),
            ("context", o.context),
            ("step_tokens", o.step_tokens),
        ] {
            if v == 0 {
                return Err(Error::Config(format!("engine: {what} is 0")));
            }
        }
        let decoder = model.decoder();
        let kv_dtype = o.kv_dtype.unwrap_or(decoder.kv_dtype().into());
        // One cache, to learn its size (and to fail early when the context is too long).
        let first = decoder.new_cache(o.context, kv_dtype)?;
        let max_slots = match o.kv_budget {
            None => o.max_sequences,
            Some(budget) => {
                let n = budget / first.bytes().max(1);
                if n == 0 {
                    return Err(Error::Config(format!(
                        "engine: a KV budget of {budget} bytes does not hold one cache of {} \
                         positions ({} bytes)",
                        o.context,
                        first.bytes()
                    )));
                }
                n.min(o.max_sequences)
            }
        };
        let vocab = model.vocab_size();
        let scratch =
            decoder.new_scratch(o.step_tokens.max(o.prefill_step_tokens).max(max_slots))?;
        let logits = crate::alloc::zeroed_for(&[max_slots, vocab], || {
            format!("the logits of {max_slots} sequences")
        })?;
        Ok(Engine {
            logits,
            slots: vec![Slot {
                cache: first,
                tokens: Vec::new(),
                lora: Vec::new(),
                running: None,
                draft: None,
            }],
            max_slots,
            queue: VecDeque::new(),
            next_id: 0,
            scratch,
            plan: Vec::with_capacity(max_slots),
            segments: Vec::with_capacity(max_slots),
            masked: Vec::new(),
            spec_totals: SpecStats::default(),
            draft_model: None,
            spec_tmp: Vec::new(),
            model,
            options,
            kv_dtype,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The options, with `max_sequences` as the KV budget allows.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Most sequences that run at once (the KV budget may allow fewer than `max_sequences`).
    pub fn max_running(&self) -> usize {
        self.max_slots
    }

    /// Sequences running now.
    pub fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.running.is_some()).count()
    }

    /// Requests waiting for a slot.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// KV cache positions the running sequences hold now (prompt tokens read and tokens
    /// generated); the prefixes that finished sequences leave for reuse are not counted, as
    /// any new sequence may take their slot.
    pub fn kv_positions_used(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.running.is_some())
            .map(|s| s.tokens.len().min(self.options.context))
            .sum()
    }

    /// KV cache positions of every sequence that may run at once: [`Engine::max_running`]
    /// caches of `context` positions (allocated or not yet).
    pub fn kv_positions_capacity(&self) -> usize {
        self.max_slots.saturating_mul(self.options.context)
    }

    /// What speculation did over every sequence so far: tokens drafted, of those kept,
    /// verify passes (a sequence's own share comes in its [`Event::Done`]).
    pub fn spec_stats(&self) -> SpecStats {
        self.spec_totals
    }

    /// True when nothing runs and nothing waits.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.running() == 0
    }

    /// Frees the KV caches of an idle engine (nothing running or waiting) but the first,
    /// and forgets the prefixes they held, so that an idle server gives their memory back;
    /// later requests make caches again as they need them. Returns how many caches were
    /// freed (0 when the engine is not idle).
    pub fn release_caches(&mut self) -> usize {
        if !self.is_idle() {
            return 0;
        }
        let freed = self.slots.len().saturating_sub(1);
        self.slots.truncate(1);
        if let Some(first) = self.slots.first_mut() {
            first.tokens.clear();
            first.draft = None;
        }
        freed
    }

    /// Queues a request. Errors, with nothing queued: [`Error::Shape`] for an empty prompt
    /// or `max_tokens` 0, [`Error::TokenOutOfRange`] for an id outside the vocabulary,
    /// [`Error::ContextFull`] when the prompt and `max_tokens` do not fit the context,
    /// [`Error::Config`] for sampler or speculation settings out of range or for a draft
    /// model's speculation without one ([`set_draft_model`](Self::set_draft_model)),
    /// [`Error::AllocationRefused`] when the logits of verify passes cannot be had,
    /// [`Error::QueueFull`] when the queue is full.
    pub fn submit(&mut self, request: GenRequest) -> Result<SeqId> {
        self.submit_constrained(request, None)
    }

    /// As [`submit`](Self::submit), with a constraint on the tokens the sequence generates
    /// (see [`TokenConstraint`]); `None` is the same as `submit`.
    pub fn submit_constrained(
        &mut self,
        request: GenRequest,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<SeqId> {
        if request.prompt.is_empty() || request.max_tokens == 0 {
            return Err(Error::Shape(
                "engine: a request needs a prompt and max_tokens ≥ 1".into(),
            ));
        }
        let vocab = self.model.vocab_size();
        if let Some(&id) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { id, vocab });
        }
        // The last generated token is never run, so prompt + max_tokens − 1 positions; with
        // context shift, the prompt and one token.
        let needed = match request.context_shift {
            None => request.prompt.len().saturating_add(request.max_tokens - 1),
            Some(_) => request.prompt.len() + 1,
        };
        if needed > self.options.context {
            return Err(Error::ContextFull {
                needed,
                capacity: self.options.context,
            });
        }
        if let Some(slot) = request.slot {
            self.check_slot(slot)?;
        }
        request.sampler.validate()?;
        self.model.decoder().check_lora(&request.lora)?;
        if request.speculation != Speculation::Off {
            self.prepare_speculation(&request)?;
        }
        if self.queue.len() >= self.options.queue {
            return Err(Error::QueueFull {
                capacity: self.options.queue,
            });
        }
        let seq = SeqId(self.next_id);
        self.next_id += 1;
        self.queue.push_back((seq, request, constraint));
        Ok(seq)
    }

    /// Ends a sequence: a waiting one leaves the queue at once (its [`Event::Done`] comes
    /// with the next step), a running one leaves at the next step and its cache is free for
    /// the next request. False when no such sequence waits or runs.
    pub fn cancel(&mut self, seq: SeqId) -> bool {
        for slot in &mut self.slots {
            if let Some(r) = slot.running.as_mut().filter(|r| r.seq == seq) {
                r.cancelled = true;
                return true;
            }
        }
        if let Some(i) = self.queue.iter().position(|(s, ..)| *s == seq) {
            let (seq, request, _) = self.queue.remove(i).expect("present");
            // Run it as cancelled from the start: it leaves at the next step.
            self.queue.push_front((
                seq,
                GenRequest {
                    max_tokens: 0,
                    ..request
                },
                None,
            ));
            return true;
        }
        false
    }

    /// One step: admits waiting requests, runs one forward pass over every running
    /// sequence's next tokens, samples, and appends what happened to `events` (which it does
    /// not clear). Errors only for failures of the pass itself; a sequence whose logits are
    /// not finite fails alone with [`Event::Failed`], whose message is that of
    /// [`Error::NonFiniteLogits`] naming the token and the position.
    pub fn step(&mut self, events: &mut Vec<Event>) -> Result<()> {
        self.retire_cancelled(events);
        self.admit(events)?;
        shift::shift_full(&mut self.slots, self.options.context, events);
        if !self.plan_step() {
            return Ok(());
        }
        let start = Instant::now();
        let ran = self.run_pass();
        let secs = start.elapsed().as_secs_f64();
        if let Err(e) = ran {
            // Take the drafts back out: the sequences stand as before the step.
            self.drop_drafts();
            return Err(e);
        }
        self.take_results(events);
        speculate::govern(&mut self.slots, &self.plan, secs);
        Ok(())
    }

    /// Fills `plan` with the step's segments in slot order: decode tokens first, then prompt
    /// chunks, under the token budget. False when nothing is to run.
    fn plan_step(&mut self) -> bool {
        self.plan.clear();
        let mut budget = self.options.step_tokens;
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.running.as_ref().is_some_and(|r| r.next.is_some()) {
                self.plan.push(Planned {
                    slot: i,
                    tokens: 1,
                    logits: 1,
                    decode: true,
                    drafted: 0,
                    kept: 0,
                });
                // Decode tokens always run (the scratch holds max_running rows at least).
                budget = budget.saturating_sub(1);
            }
        }
        // Drafts of the speculating sequences, from what the decode tokens leave of the
        // budget, before prompt chunks.
        for p in &mut self.plan {
            let k = speculate::draft(&mut self.slots[p.slot], self.options.context, budget);
            budget -= k;
            (p.tokens, p.logits, p.drafted) = (1 + k, 1 + k, k);
        }
        // A step's prompt tokens delay the decoding sequences and speed up the ones still
        // reading. When no fewer are reading than decoding (nobody decodes, or a burst of
        // requests has just arrived), read the prompts together under the larger budget;
        // otherwise each reading prompt still gets up to `step_tokens` a step, so that a
        // burst that lands among many running streams is not read at a trickle (the
        // decode tokens count against the larger budget too: the scratch holds no more).
        let reading = self
            .slots
            .iter()
            .filter(|s| s.running.as_ref().is_some_and(|r| r.next.is_none()))
            .count();
        let decoding = self.plan.len();
        let decode_rows: usize = self.plan.iter().map(|p| p.tokens).sum();
        let prefill = self.options.prefill_step_tokens.saturating_sub(decode_rows);
        if reading >= decoding {
            budget = budget.max(prefill);
        } else {
            let per_prompt = reading.saturating_mul(self.options.step_tokens);
            budget = budget.max(per_prompt.min(prefill));
        }
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(r) = &slot.running else { continue };
            if r.next.is_none() && budget > 0 {
                let left = r.request.prompt.len() - r.read;
                let n = left.min(budget);
                budget -= n;
                self.plan.push(Planned {
                    slot: i,
                    tokens: n,
                    logits: usize::from(n == left),
                    decode: false,
                    drafted: 0,
                    kept: 0,
                });
            }
        }
        // Segments in slot order (the logits rows follow it).
        self.plan.sort_unstable_by_key(|p| p.slot);
        !self.plan.is_empty()
    }

    /// The forward pass over the planned segments, leaving one row of logits per segment
    /// that wants them in `logits`.
    fn run_pass(&mut self) -> Result<()> {
        let vocab = self.model.vocab_size();
        let decoder = self.model.decoder();
        let wanted: usize = self.plan.iter().map(|p| p.logits).sum();
        let mut segments = crate::alloc::recycle(std::mem::take(&mut self.segments));
        let mut plan = self.plan.iter().peekable();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Some(&Planned {
                tokens: n,
                logits: wants,
                drafted,
                ..
            }) = plan.next_if(|p| p.slot == i)
            else {
                continue;
            };
            let r = slot.running.as_ref().expect("planned slots run");
            let (tokens, pos0): (&[u32], usize) = if r.next.is_some() {
                // The token to run, and the drafts after it.
                let last = slot.tokens.len() - 1 - drafted;
                (&slot.tokens[last..], last)
            } else {
                (&r.request.prompt[r.read..r.read + n], r.read)
            };
            segments.push(Segment {
                cache: &mut slot.cache,
                tokens,
                pos0,
                logits: wants,
                lora: &r.request.lora,
            });
        }
        // On a rayon worker, the others kept awake (`on_pool`), so that the kernels'
        // parallel calls queue work locally instead of injecting every one into the pool
        // from outside and waiting for sleeping threads.
        let (scratch, logits) = (&mut self.scratch, &mut self.logits[..wanted * vocab]);
        let result = qkv_kernels::on_pool(|| decoder.forward_batch(&mut segments, scratch, logits));
        self.segments = crate::alloc::recycle(segments);
        result
    }

    /// Bookkeeping after the pass: prompt progress for the segments that read their prompt,
    /// and a sampled token for each that wanted logits.
    fn take_results(&mut self, events: &mut Vec<Event>) {
        let vocab = self.model.vocab_size();
        let eos_id = self.model.tokenizer().and_then(|t| t.eos_id());
        let mut row = 0;
        for p in &mut self.plan {
            let slot = &mut self.slots[p.slot];
            read_prompt_chunk(slot, p.tokens, events);
            let logits = &self.logits[row * vocab..(row + p.logits) * vocab];
            row += p.logits;
            if p.drafted > 0 {
                let (masked, tmp) = (&mut self.masked, &mut self.spec_tmp);
                p.kept = speculate::verify(slot, logits, masked, tmp, eos_id, events);
                self.spec_totals.draft_tokens += p.drafted;
                self.spec_totals.accepted_tokens += p.kept;
                self.spec_totals.verify_passes += 1;
            } else if p.logits > 0 {
                sample_next(slot, logits, &mut self.masked, eos_id, events);
            }
        }
    }

    /// Ends the running sequences marked cancelled.
    fn retire_cancelled(&mut self, events: &mut Vec<Event>) {
        for slot in &mut self.slots {
            if slot.running.as_ref().is_some_and(|r| r.cancelled) {
                let r = slot.running.take().expect("running");
                events.push(done(&r, FinishReason::Cancelled));
            }
        }
    }
}

/// Whether two sequences' adapters give the same keys and values: the same adapters at
/// the same scales, in the same order, those at scale 0 aside.
fn same_lora(a: &[ScaledLora], b: &[ScaledLora]) -> bool {
    let on = |l: &&ScaledLora| l.scale != 0.0;
    a.iter().filter(on).count() == b.iter().filter(on).count()
        && a.iter()
            .filter(on)
            .zip(b.iter().filter(on))
            .all(|(x, y)| Arc::ptr_eq(&x.adapter, &y.adapter) && x.scale == y.scale)
}

/// Length of the common prefix of two token sequences.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
