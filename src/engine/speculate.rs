//! Speculative decoding in the batch engine: a sequence that speculates runs its last token
//! and a draft (n-gram lookup over its own tokens) as one segment of the step's pass, with
//! logits for every row, beside the other sequences' single rows and prompt chunks. The
//! model's choice at each row is sampled as plain decoding would sample it (the constraint,
//! if any, checking it), and the drafts are kept while they agree with those choices; the
//! first choice that disagrees, or the one after the last draft, is the pass's bonus token.
//! The cache then forgets the positions of the rejected drafts.
//!
//! Each sequence has its own [`Governor`]: the draft length follows what the model keeps,
//! and drafting pauses while the kept tokens do not make up for what the drafted rows add
//! to a pass. A pass's cost is shared among the sequences that drafted in it, row for row,
//! against the passes in which every sequence ran one row; passes that read prompts too are
//! not timed.

use super::after_pass::sample_next;
use super::{Engine, Event, GenRequest, Planned, Slot};
use crate::error::{Error, Result};
use crate::speculative::{ngram, Governor, SpecStats, Speculation, MAX_DRAFT};

/// What a sequence's speculation holds between steps.
pub(super) struct SpecState {
    options: Speculation,
    governor: Governor,
    /// Tokens drafted for the step being run (appended to the slot's tokens, after the token
    /// to run); 0 between steps.
    pub(super) drafted: usize,
    /// What speculation did for the sequence so far.
    pub(super) stats: SpecStats,
}

impl SpecState {
    /// The state of a sequence that speculates as `options` say, or `None` when it does not.
    pub(super) fn new(options: Speculation) -> Option<SpecState> {
        (options != Speculation::Off).then(|| SpecState {
            options,
            governor: Governor::new(options.max_draft()),
            drafted: 0,
            stats: SpecStats::default(),
        })
    }
}

/// Drafts up to `budget` tokens for a decoding sequence and appends them to its slot's
/// tokens, after the token it runs next; returns how many. None when the sequence does not
/// speculate, when the governor pauses it, when no earlier occurrence of its last tokens is
/// found, or when the draft could not be kept within its token limit or the cache.
pub(super) fn draft(slot: &mut Slot, context: usize, budget: usize) -> usize {
    let Some(r) = slot.running.as_mut() else {
        return 0;
    };
    let Some(spec) = r.spec.as_mut() else {
        return 0;
    };
    spec.drafted = 0;
    let limit = spec.governor.next_limit();
    let Speculation::Ngram(o) = spec.options else {
        return 0;
    };
    // The pass yields up to one token past its drafts: keep them within the token limit
    // (`generated` counts the token to run) and the cache (positions n - 1 ..= n - 1 + k).
    let n = slot.tokens.len();
    let left = r.request.max_tokens.saturating_sub(r.generated);
    let most = limit
        .min(budget)
        .min(left.saturating_sub(1))
        .min(context.saturating_sub(n))
        .min(MAX_DRAFT);
    let found = ngram::find(&slot.tokens, o.min_ngram, o.max_ngram, most);
    let k = found.len();
    slot.tokens.extend_from_within(found);
    spec.drafted = k;
    k
}

/// After the pass, for a sequence that ran `k` drafts after its last token: `rows` holds
/// `k + 1` rows of logits, one after each of those tokens. Samples each row as plain
/// decoding would, reporting the tokens, while the choices agree with the drafts; forgets
/// the cache positions of the drafts that were not kept. Returns how many drafts were kept.
pub(super) fn verify(
    slot: &mut Slot,
    rows: &[f32],
    masked: &mut Vec<f32>,
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
    // come back one by one as they are sampled).
    slot.tokens.truncate(n);
    let vocab = rows.len() / (k + 1);
    let mut kept = 0;
    for (i, row) in rows.chunks_exact(vocab).enumerate() {
        let Some(token) = sample_next(slot, row, masked, eos_id, events) else {
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
        if matches!(request.speculation, Speculation::Draft(_)) {
            return Err(Error::Unsupported(
                "speculative decoding with a draft model in the batch engine: it drafts by \
                 n-gram lookup"
                    .into(),
            ));
        }
        if !request.sampler.is_greedy() {
            return Err(Error::Unsupported(
                "speculative decoding with sampling (temperature > 0): only greedy decoding \
                 is verified"
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
