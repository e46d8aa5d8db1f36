//! Speculative decoding in the batch engine: a sequence that speculates runs its last token
//! and a draft (n-gram lookup over its own tokens, or a draft model's tokens) as one segment
//! of the step's pass, with logits for every row, beside the other sequences' single rows
//! and prompt chunks. A draft that is not drawn at random (n-gram, greedy drafting) is
//! verified by sampling each row as plain decoding would sample it (the constraint, if any,
//! checking it), keeping the drafts while they agree with those choices; the first choice
//! that disagrees, or the one after the last draft, is the pass's bonus token. A draft model
//! that samples (the sequence samples) hands over the distributions it drew from, and each
//! draft is kept or replaced by the speculative-sampling rule against the target's
//! distribution after every transform and the constraint
//! ([`sampling`](crate::speculative::sampling)). The cache then forgets the positions of
//! the rejected drafts.
//!
//! A draft model runs per sequence on a session of its own (its own KV cache), kept with the
//! slot so that the next sequence there reuses its prefix as the target's cache does.
//!
//! Each sequence has its own [`Governor`]: the draft length follows what the model keeps,
//! and drafting pauses while the kept tokens do not make up for what the drafted rows add
//! to a pass. A pass's cost is shared among the sequences that drafted in it, row for row,
//! against the passes in which every sequence ran one row; passes that read prompts too are
//! not timed.

use super::after_pass::{constrained_distribution, fail, report, sample_next};
use super::{Engine, Event, GenRequest, Planned, Slot};
use crate::error::{Error, Result};
use crate::load::Model;
use crate::sample::{Sampled, SamplerConfig};
use crate::session::{draft_from, DraftSampling, Session, SessionOptions};
use crate::speculative::sampling::{verify_draft, Verdict};
use crate::speculative::{ngram, Governor, SpecStats, Speculation, MAX_DRAFT};
use std::sync::Arc;

/// What a sequence's speculation holds between steps.
pub(super) struct SpecState {
    options: Speculation,
    governor: Governor,
    /// Tokens drafted for the step being run (appended to the slot's tokens, after the token
    /// to run); 0 between steps.
    pub(super) drafted: usize,
    /// What speculation did for the sequence so far.
    pub(super) stats: SpecStats,
    /// A draft model's sampling, when the sequence drafts with one and samples.
    sampling: Option<DraftSampling>,
}

impl SpecState {
    /// The state of a sequence that speculates as `options` say and samples as `sampler`
    /// says, or `None` when it does not speculate. [`Error::AllocationRefused`] when the
    /// draft distributions cannot be had.
    pub(super) fn new(
        options: Speculation,
        sampler: &SamplerConfig,
        vocab: usize,
    ) -> Result<Option<SpecState>> {
        if options == Speculation::Off {
            return Ok(None);
        }
        let sampling = match options {
            Speculation::Draft(o) => DraftSampling::new(sampler, o.max_draft, vocab)?,
            _ => None,
        };
        Ok(Some(SpecState {
            options,
            governor: Governor::new(options.max_draft()),
            drafted: 0,
            stats: SpecStats::default(),
            sampling,
        }))
    }
}

/// The session a slot's sequences draft on with `draft` (made now if the slot has none):
/// of the engine's `context`, or the draft model's when that is shorter (drafting then
/// stops where its cache ends).
pub(super) fn draft_session<'a>(
    held: &'a mut Option<Session>,
    draft: &Arc<Model>,
    context: usize,
) -> Result<&'a mut Session> {
    if held.is_none() {
        let options = SessionOptions {
            context: Some(context.min(draft.config().context)),
            // A draft catches up on a prompt in chunks of this many positions: its scratch
            // stays small beside a slot's cache.
            prefill_chunk: Some(64),
            ..SessionOptions::default()
        };
        *held = Some(Session::new(draft.clone(), options)?);
    }
    Ok(held.as_mut().expect("made above"))
}

/// Drafts up to `budget` tokens for a decoding sequence and appends them to its slot's
/// tokens, after the token it runs next; returns how many. None when the sequence does not
/// speculate, when the governor pauses it, when no draft is found (or it is shorter than
/// the sequence's minimum), or when the draft could not be kept within its token limit or
/// the cache.
pub(super) fn draft(slot: &mut Slot, context: usize, budget: usize) -> usize {
    let Some(r) = slot.running.as_mut() else {
        return 0;
    };
    let Some(spec) = r.spec.as_mut() else {
        return 0;
    };
    spec.drafted = 0;
    let limit = spec.options.ask(spec.governor.next_limit());
    // The pass yields up to one token past its drafts: keep them within the token limit
    // (`generated` counts the token to run) and the cache (positions n - 1 ..= n - 1 + k).
    let n = slot.tokens.len();
    let left = r.request.max_tokens.saturating_sub(r.generated);
    let most = limit
        .min(budget)
        .min(left.saturating_sub(1))
        .min(context.saturating_sub(n))
        .min(MAX_DRAFT);
    let k = match spec.options {
        Speculation::Ngram(o) => {
            let found = ngram::find(&slot.tokens, o.min_ngram, o.max_ngram, most);
            let k = found.len();
            slot.tokens.extend_from_within(found);
            k
        }
        Speculation::Draft(_) => match slot.draft.as_mut() {
            Some(d) if most > 0 => draft_from(d, &mut slot.tokens, most, spec.sampling.as_mut()),
            _ => 0,
        },
        Speculation::Off => 0,
    };
    if k > 0 && k < spec.options.min_draft() {
        slot.tokens.truncate(n);
        return 0;
    }
    spec.drafted = k;
    k
}

/// After the pass, for a sequence that ran `k` drafts after its last token: `rows` holds
/// `k + 1` rows of logits, one after each of those tokens. Chooses each row's token as
/// plain decoding would (or, for a draft drawn from a distribution, by the
/// speculative-sampling rule), reporting the tokens, while they agree with the drafts;
/// forgets the cache positions of the drafts that were not kept. Returns how many drafts
/// were kept. `masked` and `tmp` are scratch (`tmp` of a row's length).
pub(super) fn verify(
    slot: &mut Slot,
    rows: &[f32],
    masked: &mut Vec<f32>,
    tmp: &mut Vec<f32>,
    eos_id: Option<u32>,
    events: &mut Vec<Event>,
) -> usize {
    let r = slot.running.as_mut().expect("planned slots run");
    let spec = r
        .spec
        .as_mut()
        .expect("a draft comes from a speculating sequence");
    let k = std::mem::take(&mut spec.drafted);
    spec.stats.draft_tokens += k;
    spec.stats.verify_passes += 1;
    let n = slot.tokens.len() - k;
    let mut draft = [0u32; MAX_DRAFT];
    draft[..k].copy_from_slice(&slot.tokens[n..]);
    // The history each row's choice reads: the tokens before it (the drafts it agrees with
    // come back one by one as they are chosen).
    slot.tokens.truncate(n);
    let vocab = rows.len() / (k + 1);
    if spec.sampling.is_some() && tmp.len() < vocab {
        tmp.resize(vocab, 0.0);
    }
    let mut kept = 0;
    for (i, row) in rows.chunks_exact(vocab).enumerate() {
        let chosen = if i < k {
            let drafted = Drafted {
                index: i,
                token: draft[i],
            };
            choose(slot, drafted, row, masked, tmp, eos_id, events)
        } else {
            sample_next(slot, row, masked, eos_id, events)
        };
        let Some(token) = chosen else {
            break; // failed: its event is out, the slot is free.
        };
        let agrees = i < k && token == draft[i];
        kept += usize::from(agrees);
        match slot.running.as_mut() {
            Some(r) if agrees => {
                if let Some(s) = r.spec.as_mut() {
                    s.stats.accepted_tokens += 1;
                }
            }
            Some(_) => break,
            None => {
                // Finished on this row: its Done event, just pushed, counts the kept draft.
                if let Some(Event::Done { spec, .. }) = events.last_mut() {
                    spec.accepted_tokens += usize::from(agrees);
                }
                break;
            }
        }
    }
    // Positions in the cache that hold tokens of the sequence: all of them but the token to
    // run next, if it goes on.
    let valid = slot.tokens.len() - usize::from(slot.running.is_some());
    slot.cache.truncate(valid);
    kept
}

/// A drafted token and its index among the drafts (that of the row of logits that checks
/// it).
#[derive(Clone, Copy)]
struct Drafted {
    index: usize,
    token: u32,
}

/// The token of draft row `i` (drafted: `x`), whose logits are `row`: without a draft
/// distribution, sampled as plain decoding samples it; with one, `x` kept or replaced by the
/// speculative-sampling rule against the target's distribution (the constraint's included),
/// the token committed to the constraint. Reported; `None` when the sequence failed.
fn choose(
    slot: &mut Slot,
    Drafted { index: i, token: x }: Drafted,
    row: &[f32],
    masked: &mut Vec<f32>,
    tmp: &mut [f32],
    eos_id: Option<u32>,
    events: &mut Vec<Event>,
) -> Option<u32> {
    let r = slot.running.as_mut().expect("planned slots run");
    let Some(d) = r.spec.as_mut().and_then(|s| s.sampling.as_mut()) else {
        return sample_next(slot, row, masked, eos_id, events);
    };
    let vocab = row.len();
    let p = &mut d.p[..vocab];
    let chosen = constrained_distribution(
        &mut r.sampler,
        &mut r.constraint,
        row,
        &slot.tokens,
        masked,
        p,
        &mut tmp[..vocab],
    )
    .and_then(|()| {
        let q = &d.q[i * vocab..(i + 1) * vocab];
        let id = match verify_draft(p, q, x, &mut r.sampler, &mut d.residual[..vocab]) {
            Verdict::Kept => x,
            Verdict::Replaced(y) => y,
        };
        if let Some(c) = r.constraint.as_mut() {
            c.commit(id)
                .map_err(|e| Error::Config(format!("constraint: {e}")))?;
        }
        Ok(id)
    });
    match chosen {
        Ok(id) => {
            let logprob = crate::sample::logprob(row, id);
            Some(report(slot, Sampled { id, logprob }, row, eos_id, events))
        }
        Err(e) => {
            fail(slot, e, events);
            None
        }
    }
}

/// Feeds each speculating sequence's governor what the step's pass told: a pass of one row
/// per sequence (no drafts, no prompt chunks) times a plain step; a pass with drafts charges
/// its drafted rows, shared out, unless prompt chunks ran in it too.
pub(super) fn govern(slots: &mut [Slot], plan: &[Planned], secs: f64) {
    let prompts = plan.iter().any(|p| !p.decode);
    let drafted: usize = plan.iter().map(|p| p.drafted).sum();
    for p in plan {
        let Some(spec) = slots[p.slot].running.as_mut().and_then(|r| r.spec.as_mut()) else {
            continue;
        };
        if p.drafted > 0 {
            let timing = (!prompts).then_some((secs, drafted));
            spec.governor.record_shared_pass(p.drafted, p.kept, timing);
        } else if p.decode && !prompts && drafted == 0 {
            spec.governor.record_step(secs);
        }
    }
}

impl Engine {
    /// Checks a speculating request and makes room for the logits of verify passes: a row
    /// per drafted token too, as many as a step's budget lets the drafts take.
    pub(super) fn prepare_speculation(&mut self, request: &GenRequest) -> Result<()> {
        request.speculation.validate()?;
        if matches!(request.speculation, Speculation::Draft(_)) && self.draft_model.is_none() {
            return Err(Error::Config(
                "speculative decoding with a draft model: the engine has none \
                 (Engine::set_draft_model)"
                    .into(),
            ));
        }
        let vocab = self.model.vocab_size();
        let drafts = self
            .options
            .step_tokens
            .min(self.max_slots.saturating_mul(MAX_DRAFT));
        let rows = self.max_slots + drafts;
        if self.logits.len() < rows.saturating_mul(vocab) {
            self.logits = crate::alloc::zeroed_for(&[rows, vocab], || {
                format!("the logits of {rows} rows of verify passes")
            })?;
        }
        Ok(())
    }

    /// Lets requests draft with `draft` ([`Speculation::Draft`]): a model of this engine's
    /// vocabulary, run on a session of its own per slot (its KV cache is not counted in
    /// [`EngineOptions::kv_budget`](super::EngineOptions::kv_budget)). [`Error::Config`]
    /// naming both models when the vocabularies differ
    /// ([`check_draft_vocabulary`](crate::session::check_draft_vocabulary)); the draft
    /// sessions of an earlier draft model are dropped.
    pub fn set_draft_model(&mut self, draft: Arc<Model>) -> Result<()> {
        crate::session::check_draft_vocabulary(&self.model, &draft)?;
        for slot in &mut self.slots {
            slot.draft = None;
        }
        self.draft_model = Some(draft);
        Ok(())
    }

    /// The draft model set by [`set_draft_model`](Self::set_draft_model), if any.
    pub fn draft_model(&self) -> Option<&Arc<Model>> {
        self.draft_model.as_ref()
    }

    /// After a pass that failed: the planned drafts leave the slots' tokens.
    pub(super) fn drop_drafts(&mut self) {
        for p in &self.plan {
            let slot = &mut self.slots[p.slot];
            let keep = slot.tokens.len() - p.drafted;
            slot.tokens.truncate(keep);
            if let Some(s) = slot.running.as_mut().and_then(|r| r.spec.as_mut()) {
                s.drafted = 0;
            }
        }
    }
}
