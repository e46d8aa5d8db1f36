//! [`Session`]: one sequence being generated on a shared [`Model`].
//!
//! A server holds one `Arc<Model>` and gives every conversation its own `Session`, which owns
//! the KV cache (capacity = the context length unless told otherwise) and every scratch
//! buffer. Sessions never touch each other's state, so they run on as many threads as
//! wanted. After the first step, [`Session::step`] allocates nothing.
//!
//! ```
//! use qkv::models::decoder::{Decoder, DecoderConfig, WeightLayout};
//! use qkv::load::Model;
//! use qkv::session::{Session, SessionOptions};
//! use qkv::weights::FloatType;
//! use std::sync::Arc;
//!
//! # fn main() -> qkv::Result<()> {
//! // A tiny model with made-up weights (a real one comes from `Model::load`).
//! // dim 16, 2 layers, 4 heads over 2 KV heads, FFN 32, vocabulary 50, context 64.
//! let config = DecoderConfig::llama(16, 2, 4, 2, 32, 50, 64, WeightLayout::Gguf);
//! let model = Arc::new(Model::from_parts(Decoder::synthetic(config, 7, FloatType::F32)?, None));
//!
//! let mut session = Session::new(model.clone(), SessionOptions::default())?;
//! let logits = session.prefill(&[1, 2, 3])?.to_vec(); // logits of the last prompt token
//! assert_eq!(logits.len(), 50);
//! let next = qkv::sample::argmax(&logits);
//! session.step(next)?;
//! assert_eq!(session.position(), 4);
//!
//! // Reuse the shared prefix [1, 2] for another continuation.
//! session.truncate(2)?;
//! session.step(9)?;
//! assert_eq!(session.tokens(), &[1, 2, 9]);
//!
//! // Bad input is an error, never a panic.
//! assert!(matches!(session.step(50), Err(qkv::Error::TokenOutOfRange { .. })));
//! session.reset();
//! assert!(matches!(session.prefill(&[0; 65]), Err(qkv::Error::ContextFull { .. })));
//! # Ok(())
//! # }
//! ```

use crate::error::{Error, Result};
use crate::load::Model;
use crate::models::decoder::{DecoderState, KvType, ScaledLora};
use crate::sample::{Sampled, Sampler, SamplerConfig};
use crate::speculative::sampling::{verify_draft, Verdict};
use crate::speculative::{ngram, Governor, SpecStats, Speculation};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Prompt positions per matrix pass unless [`SessionOptions::prefill_chunk`] says otherwise.
/// A 512-token prompt prefills faster in one chunk of 512 than in two of 256.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// How to size a [`Session`].
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// KV cache capacity in positions; `None` = the model's context length.
    pub context: Option<usize>,
    /// How the KV cache stores keys and values; `None` = the model's compute dtype (f16 for
    /// f16, bf16 and quantized weights, f32 for f32 weights). [`KvType::Q8_0`] stores them in
    /// Q8_0 blocks as llama.cpp's `-ctk q8_0 -ctv q8_0` does: about half the bytes of f16
    /// per position (1.0625 bytes per element), for a small change in the logits
    /// (BENCHMARKS.md, "KV cache in Q8_0"). A [`FloatType`](crate::weights::FloatType)
    /// converts with `.into()`.
    pub kv_dtype: Option<KvType>,
    /// Most prompt positions run in one matrix pass; `None` = [`DEFAULT_PREFILL_CHUNK`].
    /// Longer chunks widen each f16 weight panel once for more rows and give gemm taller
    /// blocks; the scratch grows by ~30 KB per position for SmolLM2-135M.
    pub prefill_chunk: Option<usize>,
}

/// One generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    /// The token id.
    pub id: u32,
    /// The text it adds (may be empty while a multi-byte character is incomplete).
    pub text: String,
    /// The model's log-probability of this token (raw distribution, before sampling filters).
    pub logprob: f32,
}

/// One sequence's state on a shared [`Model`]: KV cache, scratch, the tokens so far, and the
/// logits of the last position.
pub struct Session {
    model: Arc<Model>,
    core: Core,
}

/// The mutable part of a session, apart from the model so that a [`Generate`] can borrow the
/// model's tokenizer and the state at once.
struct Core {
    state: DecoderState,
    tokens: Vec<u32>,
    logits: Vec<f32>,
    /// How many tokens `logits` follow (they predict that position), if any were computed.
    logits_at: Option<usize>,
}

impl Core {
    fn prefill(&mut self, model: &Model, tokens: &[u32]) -> Result<()> {
        let pos = self.tokens.len();
        let (state, logits) = (&mut self.state, &mut self.logits);
        // The whole pass runs on one of rayon's workers, the others kept awake
        // (`on_pool`): the kernels' parallel loops then queue their jobs locally instead of
        // injecting ~200 jobs per token into the global queue from outside the pool (which
        // costs wake-ups and, every 63 jobs, an allocation of the injector's next block).
        qkv_kernels::on_pool(|| model.decoder().forward(state, tokens, pos, Some(logits)))?;
        self.tokens.extend_from_slice(tokens);
        self.logits_at = Some(self.tokens.len());
        Ok(())
    }

    /// Makes `logits` those of the current position: after a truncate or a reset they belong
    /// to another one, so the last token runs again (its cache entry comes out the same).
    fn refresh_logits(&mut self, model: &Model) -> Result<()> {
        if self.logits_at == Some(self.tokens.len()) {
            return Ok(());
        }
        let Some(last) = self.tokens.pop() else {
            return Err(Error::Shape("no token to predict from".into()));
        };
        // It fitted at this position before, so this cannot fail on the context or the id;
        // should it fail anyway, the sequence is left as it was.
        self.prefill(model, &[last])
            .inspect_err(|_| self.tokens.push(last))
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("position", &self.position())
            .field("state", &self.core.state)
            .finish()
    }
}

impl Session {
    /// A session with an empty cache. Allocates the whole KV cache and scratch now.
    ///
    /// [`Error::Config`] when the requested context exceeds the model's or when the context or
    /// the prefill chunk is 0; [`Error::AllocationRefused`] when the memory of the KV cache,
    /// the scratch or the logits cannot be had; [`Error::Kernel`]
    /// when the attention kernel's per-thread scratch cannot be allocated.
    pub fn new(model: Arc<Model>, options: SessionOptions) -> Result<Session> {
        let config = model.config();
        let capacity = options.context.unwrap_or(config.context);
        let kv_dtype = options
            .kv_dtype
            .unwrap_or(model.decoder().kv_dtype().into());
        let chunk = options.prefill_chunk.unwrap_or(DEFAULT_PREFILL_CHUNK);
        let state = model.decoder().new_state(capacity, kv_dtype, chunk)?;
        // The attention kernel keeps per-thread buffers; size them on every pool thread now
        // so that a step allocates nothing whichever thread it lands on.
        qkv_kernels::attention::reserve_scratch(
            config.heads,
            config.kv_heads,
            config.head_dim,
            config.head_dim,
        )?;
        let vocab = config.vocab;
        Ok(Session {
            model,
            core: Core {
                state,
                tokens: Vec::with_capacity(capacity),
                logits: crate::alloc::zeroed(vocab, || "the logits of a session".into())?,
                logits_at: None,
            },
        })
    }

    /// The model this session runs on.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Positions in the cache: the next token goes at this position.
    pub fn position(&self) -> usize {
        self.core.tokens.len()
    }

    /// Positions the cache holds in all.
    pub fn capacity(&self) -> usize {
        self.core.state.capacity()
    }

    /// How the cached keys and values are stored.
    pub fn kv_dtype(&self) -> KvType {
        self.core.state.kv_type()
    }

    /// The tokens in the cache, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.core.tokens
    }

    /// The logits after the last [`prefill`](Self::prefill) or [`step`](Self::step) (zeros
    /// before the first; stale after [`truncate`](Self::truncate) or [`reset`](Self::reset)).
    pub fn logits(&self) -> &[f32] {
        &self.core.logits
    }

    /// Bytes held by the KV cache.
    pub fn cache_bytes(&self) -> usize {
        self.core.state.cache_bytes()
    }

    /// Appends `tokens` to the sequence, running them as matrices, and returns the logits of
    /// the last one. Nothing changes on error: [`Error::TokenOutOfRange`] for an id outside
    /// the vocabulary, [`Error::ContextFull`] when they do not fit, [`Error::Shape`] when
    /// `tokens` is empty.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.core.prefill(&self.model, tokens)?;
        Ok(&self.core.logits)
    }

    /// As [`prefill`](Self::prefill), but writes the logits after every one of `tokens` into
    /// `logits` (`tokens.len()·vocab`, row `i` predicting the token after `tokens[i]`): what
    /// perplexity and KL-divergence scoring read. [`Error::Shape`] when `logits` has another
    /// length; nothing changes on error.
    pub fn prefill_all(&mut self, tokens: &[u32], logits: &mut [f32]) -> Result<()> {
        let core = &mut self.core;
        let pos = core.tokens.len();
        let model = &self.model;
        qkv_kernels::on_pool(|| {
            model
                .decoder()
                .forward_all(&mut core.state, tokens, pos, logits)
        })?;
        core.tokens.extend_from_slice(tokens);
        let vocab = model.vocab_size();
        core.logits.copy_from_slice(&logits[logits.len() - vocab..]);
        core.logits_at = Some(core.tokens.len());
        Ok(())
    }

    /// Appends one token and returns the logits of the next position. Allocates nothing.
    /// Same errors as [`prefill`](Self::prefill).
    pub fn step(&mut self, token: u32) -> Result<&[f32]> {
        self.prefill(std::slice::from_ref(&token))
    }

    /// Applies LoRA adapters, each at its scale, to the session's passes from now on (an
    /// empty list: the base model). The cached positions were made under the adapters
    /// before, so the session starts again at position 0, as [`reset`](Self::reset) does.
    /// [`Error::ForeignState`] for an adapter loaded for another model, [`Error::Config`]
    /// for a scale that is not finite; the session is then left as it was.
    ///
    /// ```
    /// use qkv::load::Model;
    /// use qkv::models::decoder::{Decoder, DecoderConfig, ScaledLora, WeightLayout};
    /// use qkv::session::{Session, SessionOptions};
    /// use qkv::weights::FloatType;
    /// use std::sync::Arc;
    /// let config = DecoderConfig::llama(64, 2, 4, 2, 128, 100, 256, WeightLayout::Gguf);
    /// let model = Arc::new(Model::from_parts(Decoder::synthetic(config, 7, FloatType::F32)?, None));
    /// // Rank 4, alpha 8: applied at scale s, each delta is s · 8/4 · B·(A·x).
    /// let adapter = Arc::new(model.decoder().synthetic_lora(4, 8.0, 1)?);
    /// let options = SessionOptions { context: Some(64), ..SessionOptions::default() };
    /// let mut session = Session::new(model.clone(), options)?;
    /// let base = session.prefill(&[1, 2, 3])?.to_vec();
    /// session.set_lora(vec![ScaledLora { adapter, scale: 1.0 }])?;
    /// let adapted = session.prefill(&[1, 2, 3])?.to_vec();
    /// assert_ne!(base, adapted);
    /// session.set_lora(Vec::new())?;
    /// assert_eq!(session.prefill(&[1, 2, 3])?, &base[..]);
    /// # Ok::<(), qkv::Error>(())
    /// ```
    pub fn set_lora(&mut self, adapters: Vec<ScaledLora>) -> Result<()> {
        self.model.decoder().check_lora(&adapters)?;
        self.core.state.set_lora(adapters);
        self.core.tokens.clear();
        Ok(())
    }

    /// The LoRA adapters the session applies, with their scales.
    pub fn lora(&self) -> &[ScaledLora] {
        self.core.state.lora()
    }

    /// Forgets everything: position 0. The cache memory is kept.
    pub fn reset(&mut self) {
        self.core.tokens.clear();
    }

    /// Keeps the first `n` positions (a shared prefix) and forgets the rest. Errors with
    /// [`Error::Shape`] when `n` is beyond the current position.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.position() {
            return Err(Error::Shape(format!(
                "cannot truncate to {n} positions, the session holds {}",
                self.position()
            )));
        }
        self.core.tokens.truncate(n);
        Ok(())
    }

    /// Encodes `prompt`, appends it to the sequence and returns an iterator that samples one
    /// token per call until the end-of-sequence token (unless [`Generate::ignore_eos`]),
    /// [`Generate::max_tokens`], or a full context (which yields [`Error::ContextFull`] once).
    ///
    /// Every yielded token has been appended to the session (EOS included), so a later
    /// `generate` continues the conversation. The prompt is prefilled here, so its errors
    /// come back at once. [`Error::Unsupported`] when the model has no tokenizer,
    /// [`Error::Config`] when `config` is out of range (see
    /// [`SamplerConfig::validate`](crate::sample::SamplerConfig::validate)); a step whose
    /// logits are not all finite yields [`Error::NonFiniteLogits`] (naming the position they
    /// follow) and ends the iteration.
    pub fn generate(&mut self, prompt: &str, config: SamplerConfig) -> Result<Generate<'_>> {
        let ids = tokenizer_of(&self.model)?.encode(prompt)?;
        self.generate_tokens(&ids, config)
    }

    /// As [`generate`](Self::generate), from token ids. An empty `ids` continues the
    /// sequence as it is: from the logits already there after a prefill, step or generate,
    /// or, after a [`truncate`](Self::truncate), from the last kept token run again.
    pub fn generate_tokens(&mut self, ids: &[u32], config: SamplerConfig) -> Result<Generate<'_>> {
        let tokenizer = tokenizer_of(&self.model)?;
        let sampler = Sampler::new(config)?;
        if ids.is_empty() && self.core.tokens.is_empty() {
            return Err(Error::Shape(
                "generate: empty prompt on an empty session".into(),
            ));
        }
        if ids.is_empty() {
            self.core.refresh_logits(&self.model)?;
        } else {
            self.core.prefill(&self.model, ids)?;
        }
        Ok(Generate {
            model: &self.model,
            core: &mut self.core,
            sampler,
            decoder: StreamDecoder::new(tokenizer),
            eos: tokenizer.eos_id(),
            ignore_eos: false,
            remaining: usize::MAX,
            done: false,
            spec: Speculation::Off,
            spec_logits: Vec::new(),
            pending: VecDeque::new(),
            stats: SpecStats::default(),
            governor: None,
            draft: None,
            forced: None,
            drafter: None,
        })
    }
}

/// [`Error::Config`] naming both models unless `draft` has the vocabulary of `target` (the
/// same number of tokens, and the same bytes for each token where both have a tokenizer):
/// a draft model's tokens must mean what the target's do.
pub fn check_draft_vocabulary(target: &Model, draft: &Model) -> Result<()> {
    let name = |m: &Model| {
        if m.path().as_os_str().is_empty() {
            "a model built in memory".to_string()
        } else {
            m.path().display().to_string()
        }
    };
    let (n, m) = (target.vocab_size(), draft.vocab_size());
    let differs = match (target.tokenizer(), draft.tokenizer()) {
        _ if n != m => Some(format!("{m} tokens against {n}")),
        (Some(a), Some(b)) => (0..n as u32)
            .find(|&id| a.token_bytes(id).ok() != b.token_bytes(id).ok())
            .map(|id| format!("token {id} differs")),
        _ => None,
    };
    match differs {
        None => Ok(()),
        Some(why) => Err(Error::Config(format!(
            "speculation: the draft model {} has another vocabulary than the model {} \
             ({why})",
            name(draft),
            name(target)
        ))),
    }
}

/// How a draft model picks its tokens when the sequence samples: its own sampler (the
/// sequence's settings, another seed) and the distributions it drew from, one row of the
/// vocabulary per drafted token, which the verifier reads as `q`.
pub(crate) struct DraftSampling {
    /// The drafter's sampler.
    pub(crate) sampler: Sampler,
    /// `q`: the distribution each drafted token was drawn from, row after row.
    pub(crate) q: Vec<f32>,
    /// `p`, the target's distribution at the row being verified.
    pub(crate) p: Vec<f32>,
    /// Scratch of the rule's residual distribution.
    pub(crate) residual: Vec<f32>,
}

/// What a drafter's seed is made from the sequence's: another stream of random numbers, so
/// that the drafter's draws and the verifier's are not the same numbers.
const DRAFT_SEED: u64 = 0x5DEE_CE66_D1CE_D00D;

impl DraftSampling {
    /// The drafting of a sequence sampled as `config` says, for drafts of up to `rows`
    /// tokens over `vocab` tokens; `None` when `config` is greedy (the draft model's argmax
    /// then, a draft the verifier compares with its own choices).
    pub(crate) fn new(config: &SamplerConfig, rows: usize, vocab: usize) -> Result<Option<Self>> {
        if config.is_greedy() {
            return Ok(None);
        }
        let sampler = Sampler::new(SamplerConfig {
            seed: config.seed ^ DRAFT_SEED,
            ..config.clone()
        })?;
        let what = || format!("the draft distributions of {rows} rows");
        Ok(Some(DraftSampling {
            sampler,
            q: crate::alloc::zeroed_for(&[rows, vocab], what)?,
            p: crate::alloc::zeroed(vocab, || "a verified distribution".into())?,
            residual: crate::alloc::zeroed(vocab, || "a residual distribution".into())?,
        }))
    }
}

/// Appends to `tokens` up to `most` tokens of the draft model after them, run on `draft` (a
/// session on it, which first takes the tokens it does not hold yet); returns how many.
/// Greedy tokens without `sampling`; with it, each drawn by its sampler from the draft
/// model's distribution (penalties reading the tokens before it), which is kept as that
/// token's row of `q`. Fewer when the draft session's cache ends, none when it cannot run:
/// a draft is only ever a guess.
pub(crate) fn draft_from(
    draft: &mut Session,
    tokens: &mut Vec<u32>,
    most: usize,
    mut sampling: Option<&mut DraftSampling>,
) -> usize {
    let n = tokens.len();
    // The draft session holds n + most - 1 tokens at the end.
    let most = most.min((draft.capacity() + 1).saturating_sub(n));
    if most == 0 {
        return 0;
    }
    let same = draft
        .tokens()
        .iter()
        .zip(tokens.iter())
        .take_while(|(a, b)| a == b)
        .count();
    // What the draft session lacks of the tokens already in this one's cache runs as one
    // chunk (the prompt, as this session read it), the newest token as a step of its own:
    // the draft model then computes what this one does, bit for bit when it is this model.
    let keep = same.min(n - 1);
    let caught_up = draft.truncate(keep).is_ok()
        && (keep == n - 1 || draft.prefill(&tokens[keep..n - 1]).is_ok())
        && draft.step(tokens[n - 1]).is_ok();
    if !caught_up {
        return 0;
    }
    let vocab = draft.logits().len();
    for i in 0..most {
        let t = match sampling.as_deref_mut() {
            None => crate::sample::argmax(draft.logits()),
            Some(s) => {
                let Some(q) = s.q.get_mut(i * vocab..(i + 1) * vocab) else {
                    return i;
                };
                if s.sampler.distribution(draft.logits(), tokens, q).is_err() {
                    return i;
                }
                match s.sampler.draw_from(q) {
                    Some(t) => t,
                    None => return i,
                }
            }
        };
        tokens.push(t);
        if i + 1 < most && draft.step(t).is_err() {
            return i + 1;
        }
    }
    most
}

/// `e` with the position of the logits it is about, when it is about logits (they follow the
/// token at `tokens - 1`).
fn at_position(e: Error, tokens: usize) -> Error {
    match e {
        Error::NonFiniteLogits {
            sequence,
            position: None,
            token,
            value,
        } => Error::NonFiniteLogits {
            sequence,
            position: tokens.checked_sub(1),
            token,
            value,
        },
        other => other,
    }
}

fn tokenizer_of(model: &Model) -> Result<&Tokenizer> {
    model
        .tokenizer()
        .ok_or_else(|| Error::Unsupported("text generation: the model has no tokenizer".into()))
}

/// The iterator [`Session::generate`] returns: each `next()` samples a token from the current
/// logits, appends it to the session (running the model once), and yields it with its text.
///
/// With [`speculate`](Generate::speculate), a step may run drafted tokens too and keep those
/// the model agrees with; they are yielded by the following calls without running the model.
/// Dropping the iterator before they are yielded takes them back out of the session, so that
/// the session always holds exactly the tokens yielded.
pub struct Generate<'a> {
    model: &'a Model,
    core: &'a mut Core,
    sampler: Sampler,
    decoder: StreamDecoder<'a>,
    eos: Option<u32>,
    ignore_eos: bool,
    remaining: usize,
    done: bool,
    spec: Speculation,
    /// The logits of a verify pass: (most drafted tokens + 1) rows.
    spec_logits: Vec<f32>,
    /// Kept tokens already in the session, not yet yielded, with their log-probabilities.
    pending: VecDeque<(u32, f32)>,
    stats: SpecStats,
    /// Adapts the draft length, and pauses drafting when it does not pay.
    governor: Option<Governor>,
    /// The session of the draft model, with [`Speculation::Draft`].
    draft: Option<&'a mut Session>,
    /// The token verification chose for the position after the kept drafts (a rejected
    /// draft's replacement), to yield next instead of sampling that row again.
    forced: Option<Sampled>,
    /// A draft model's sampling and the verifier's scratch, when the sequence samples.
    drafter: Option<DraftSampling>,
}

impl Drop for Generate<'_> {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let keep = self.core.tokens.len() - self.pending.len();
            self.core.tokens.truncate(keep);
            // The logits follow the last kept token, which is no longer the last one.
            self.core.logits_at = None;
        }
    }
}

impl std::fmt::Debug for Generate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generate")
            .field("position", &self.core.tokens.len())
            .field("remaining", &self.remaining)
            .field("done", &self.done)
            .finish()
    }
}

impl Generate<'_> {
    /// Stops after `n` tokens.
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.remaining = n;
        self
    }

    /// Keeps going past the end-of-sequence token (which is still yielded).
    pub fn ignore_eos(mut self, yes: bool) -> Self {
        self.ignore_eos = yes;
        self
    }

    /// Text held back because it ended inside a multi-byte character; call once the
    /// iterator is exhausted to flush it.
    pub fn finish(mut self) -> String {
        self.decoder.finish()
    }

    /// Drafts tokens as `spec` says and verifies them in one pass each. Greedy, the tokens
    /// are exactly those of plain decoding; sampling, drafts are kept or replaced by the
    /// speculative-sampling rule ([`sampling`](crate::speculative::sampling)), so the
    /// tokens have the distribution of plain sampling under the same settings (with n-gram
    /// drafts, they are the very tokens plain sampling draws with the same seed), and the
    /// same seed gives the same tokens. The draft length then follows how many drafted
    /// tokens the model keeps, and drafting pauses (for a while, longer each time) when the
    /// kept tokens do not make up for what the extra rows of a pass cost, as timed here.
    /// [`Error::Config`] when the settings are out of range; [`Error::AllocationRefused`]
    /// when the logits of a verify pass (or the draft distributions) cannot be had.
    pub fn speculate(mut self, spec: Speculation) -> Result<Self> {
        spec.validate()?;
        if matches!(spec, Speculation::Draft(_)) && self.draft.is_none() {
            return Err(Error::Config(
                "speculation with a draft model needs its session: speculate_with_draft".into(),
            ));
        }
        let rows = spec.max_draft() + 1;
        let vocab = self.model.vocab_size();
        let len = rows.saturating_mul(vocab);
        if self.spec_logits.len() < len {
            self.spec_logits = crate::alloc::zeroed(len, || {
                format!("the logits of a verify pass of {rows} rows")
            })?;
        }
        self.drafter = match spec {
            Speculation::Draft(o) => DraftSampling::new(self.sampler.config(), o.max_draft, vocab)?,
            _ => None,
        };
        self.spec = spec;
        self.governor = (spec != Speculation::Off).then(|| Governor::new(spec.max_draft()));
        Ok(self)
    }

    /// What speculation did so far: tokens drafted, and of those kept.
    pub fn spec_stats(&self) -> SpecStats {
        self.stats
    }

    /// Yields a token already in the session: counts it, marks the end at the end-of-sequence
    /// token, and decodes its text.
    fn emit(&mut self, id: u32, logprob: f32) -> Result<Piece> {
        self.remaining -= 1;
        if Some(id) == self.eos && !self.ignore_eos {
            self.done = true;
        }
        let text = self.decoder.push(id).inspect_err(|_| self.done = true)?;
        Ok(Piece { id, text, logprob })
    }

    /// Appends `sampled` and, when a draft follows it, runs them together and keeps the
    /// drafted tokens verification keeps (queued in `pending`), leaving the logits after
    /// the last kept token, and in `forced` the token that replaces a rejected draft. Without
    /// a draft, one decode step.
    fn advance(&mut self, sampled: &Sampled) -> Result<()> {
        let core = &mut *self.core;
        let n = core.tokens.len();
        let is_eos = Some(sampled.id) == self.eos && !self.ignore_eos;
        let room = core.state.capacity().saturating_sub(n + 1);
        let Some(governor) = self.governor.as_mut() else {
            return core.prefill(self.model, &[sampled.id]);
        };
        let limit = self.spec.ask(governor.next_limit());
        let most = if is_eos {
            0
        } else {
            limit.min(room).min(self.remaining - 1)
        };
        // A pass is timed from its drafting on: a draft model's steps are part of its cost.
        let start = Instant::now();
        core.tokens.push(sampled.id);
        let k = match self.spec {
            Speculation::Ngram(o) => {
                let found = ngram::find(&core.tokens, o.min_ngram, o.max_ngram, most);
                let k = found.len();
                core.tokens.extend_from_within(found);
                k
            }
            Speculation::Draft(_) => match self.draft.as_deref_mut() {
                Some(d) if most > 0 => draft_from(d, &mut core.tokens, most, self.drafter.as_mut()),
                _ => 0,
            },
            Speculation::Off => 0,
        };
        if k == 0 || k < self.spec.min_draft() {
            core.tokens.truncate(n);
            let start = Instant::now();
            core.prefill(self.model, &[sampled.id])?;
            governor.record_step(start.elapsed().as_secs_f64());
            return Ok(());
        }
        let vocab = self.model.vocab_size();
        let rows = &mut self.spec_logits[..(k + 1) * vocab];
        let (state, pass) = (&mut core.state, &core.tokens[n..]);
        let decoder = self.model.decoder();
        // On the pool, as a decode step runs (see `Core::prefill`).
        if let Err(e) = qkv_kernels::on_pool(|| decoder.forward_all(state, pass, n, rows)) {
            core.tokens.truncate(n);
            return Err(e);
        }
        let secs = start.elapsed().as_secs_f64();
        let mut kept = 0;
        while kept < k {
            let row = &rows[kept * vocab..(kept + 1) * vocab];
            let at = n + 1 + kept;
            let drafted = core.tokens[at];
            // The sampler sees the history it would have seen stepping one by one. A row it
            // refuses (non-finite logits) is left for the next call to report, at its
            // position, as plain decoding would.
            let verdict = match self.drafter.as_mut() {
                // A draft drawn from q: the speculative-sampling rule against p.
                Some(d) => match self.sampler.distribution(row, &core.tokens[..at], &mut d.p) {
                    Ok(()) => {
                        let q = &d.q[kept * vocab..(kept + 1) * vocab];
                        verify_draft(&d.p, q, drafted, &mut self.sampler, &mut d.residual)
                    }
                    Err(_) => break,
                },
                // A draft that is not drawn at random (q one-hot): the model's own choice,
                // drawn as plain decoding draws it, keeps it or replaces it.
                None => match self.sampler.sample(row, &core.tokens[..at]) {
                    Ok(c) if c.id == drafted => Verdict::Kept,
                    Ok(c) => Verdict::Replaced(c.id),
                    Err(_) => break,
                },
            };
            let id = match verdict {
                Verdict::Kept => drafted,
                Verdict::Replaced(id) => {
                    self.forced = Some(Sampled {
                        id,
                        logprob: crate::sample::logprob(row, id),
                    });
                    break;
                }
            };
            self.pending
                .push_back((id, crate::sample::logprob(row, id)));
            kept += 1;
            if Some(id) == self.eos && !self.ignore_eos {
                break;
            }
        }
        core.logits
            .copy_from_slice(&rows[kept * vocab..(kept + 1) * vocab]);
        core.tokens.truncate(n + 1 + kept);
        core.logits_at = Some(core.tokens.len());
        self.stats.draft_tokens += k;
        self.stats.accepted_tokens += kept;
        self.stats.verify_passes += 1;
        governor.record_pass(k, kept, secs);
        Ok(())
    }
}

impl<'a> Generate<'a> {
    /// As [`speculate`](Self::speculate), drafting with a second, smaller model of the same
    /// vocabulary: `spec` is [`Speculation::Draft`], and `draft` a session on the draft
    /// model (of a context at least this session's, else drafting stops where its cache
    /// ends), which follows this sequence: each draft is its tokens after the sequence's,
    /// greedy when this sequence is, else drawn under the same sampler settings (another
    /// seed) and verified by the speculative-sampling rule. Greedy, the tokens yielded are
    /// still exactly those of plain decoding; sampling, they have its distribution. Errors as
    /// `speculate`, and [`Error::Config`] when `spec` is another kind or when the draft
    /// model's vocabulary is not this model's ([`check_draft_vocabulary`], naming both).
    pub fn speculate_with_draft(
        mut self,
        spec: Speculation,
        draft: &'a mut Session,
    ) -> Result<Self> {
        if !matches!(spec, Speculation::Draft(_)) {
            return Err(Error::Config(format!(
                "speculation: {spec:?} is not drafting with a model"
            )));
        }
        check_draft_vocabulary(self.model, draft.model())?;
        self.draft = Some(draft);
        self.speculate(spec)
    }
}

impl Iterator for Generate<'_> {
    type Item = Result<Piece>;

    fn next(&mut self) -> Option<Result<Piece>> {
        if self.done || self.remaining == 0 {
            return None;
        }
        if let Some((id, logprob)) = self.pending.pop_front() {
            return Some(self.emit(id, logprob));
        }
        let forced = self.forced.take();
        let core = &mut *self.core;
        let capacity = core.state.capacity();
        if core.tokens.len() >= capacity {
            self.done = true;
            return Some(Err(Error::ContextFull {
                needed: capacity + 1,
                capacity,
            }));
        }
        let sampled =
            match forced.map_or_else(|| self.sampler.sample(&core.logits, &core.tokens), Ok) {
                Ok(s) => s,
                Err(e) => {
                    self.done = true;
                    return Some(Err(at_position(e, core.tokens.len())));
                }
            };
        if let Err(e) = self.advance(&sampled) {
            self.done = true;
            return Some(Err(e));
        }
        Some(self.emit(sampled.id, sampled.logprob))
    }
}
