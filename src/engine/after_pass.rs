//! After a step's pass: each segment's prompt progress, and each sampled token with what
//! it ends.

use super::{Event, FinishReason, Running, Slot, TokenConstraint};
use crate::error::{Error, Result};
use crate::sample::Sampler;
use crate::speculative::SpecStats;

/// Samples a token from `logits`; with a constraint, checks that token, and when it is
/// refused masks a copy of the logits (in `masked`) and samples again from it. The token
/// kept is committed to the constraint; its log-probability is the model's own. A
/// constraint's error is an [`Error::Config`].
fn sample_constrained(
    sampler: &mut Sampler,
    constraint: &mut Option<Box<dyn TokenConstraint>>,
    logits: &[f32],
    recent: &[u32],
    masked: &mut Vec<f32>,
) -> Result<crate::sample::Sampled> {
    let first = sampler.sample(logits, recent)?;
    let Some(c) = constraint.as_mut() else {
        return Ok(first);
    };
    let refused = |e: String| Error::Config(format!("constraint: {e}"));
    if c.allows(first.id) {
        c.commit(first.id).map_err(refused)?;
        return Ok(first);
    }
    masked.clear();
    masked.extend_from_slice(logits);
    c.mask(masked).map_err(refused)?;
    let id = sampler.sample(masked, recent)?.id;
    c.commit(id).map_err(refused)?;
    let lse = qkv_kernels::activation::log_sum_exp(logits);
    Ok(crate::sample::Sampled {
        id,
        logprob: (logits[id as usize] - lse).min(0.0),
    })
}

/// After a pass: a slot that read `n` prompt tokens (rather than its last sampled token)
/// records them and reports its progress.
pub(super) fn read_prompt_chunk(slot: &mut Slot, n: usize, events: &mut Vec<Event>) {
    let r = slot.running.as_mut().expect("planned slots run");
    if r.next.take().is_none() {
        slot.tokens
            .extend_from_slice(&r.request.prompt[r.read..r.read + n]);
        r.read += n;
        // After a context shift the tokens run again are not the prompt's progress.
        if r.generated == 0 {
            events.push(Event::Prompt {
                seq: r.seq,
                cached: r.cached,
                read: r.read,
                total: r.prompt_len,
            });
        }
    }
}

/// The distribution [`sample_constrained`] draws from: the sampler's, where the tokens the
/// constraint refuses give their probability to a second draw from the masked logits
/// (`P(x) = p(x)·[allowed x] + P(refused)·p_masked(x)`), written into `out` (`tmp`, as
/// long, is scratch). What verifying a draft drawn from another distribution needs.
pub(super) fn constrained_distribution(
    sampler: &mut Sampler,
    constraint: &mut Option<Box<dyn TokenConstraint>>,
    logits: &[f32],
    recent: &[u32],
    masked: &mut Vec<f32>,
    out: &mut [f32],
    tmp: &mut [f32],
) -> Result<()> {
    sampler.distribution(logits, recent, out)?;
    let Some(c) = constraint.as_mut() else {
        return Ok(());
    };
    let mut refused = 0.0;
    for (id, p) in out.iter_mut().enumerate() {
        if *p > 0.0 && !c.allows(id as u32) {
            refused += *p;
            *p = 0.0;
        }
    }
    if refused > 0.0 {
        masked.clear();
        masked.extend_from_slice(logits);
        c.mask(masked)
            .map_err(|e| Error::Config(format!("constraint: {e}")))?;
        sampler.distribution(masked, recent, tmp)?;
        for (o, &t) in out.iter_mut().zip(tmp.iter()) {
            *o += refused * t;
        }
    }
    Ok(())
}

/// Samples a slot's next token from its row of `logits` and reports it; the sequence
/// finishes (at its end of sequence, a complete constraint or its token limit) or fails
/// alone when sampling fails. Returns the token, or `None` when it failed.
pub(super) fn sample_next(
    slot: &mut Slot,
    logits: &[f32],
    masked: &mut Vec<f32>,
    eos_id: Option<u32>,
    events: &mut Vec<Event>,
) -> Option<u32> {
    let r = slot.running.as_mut().expect("planned slots run");
    let recent = &slot.tokens[slot
        .tokens
        .len()
        .saturating_sub(r.sampler.config().repeat_last_n)..];
    match sample_constrained(&mut r.sampler, &mut r.constraint, logits, recent, masked) {
        Ok(s) => Some(report(slot, s, logits, eos_id, events)),
        Err(e) => {
            fail(slot, e, events);
            None
        }
    }
}

/// Ends a slot's sequence with `e` (its logits following the slot's last token).
pub(super) fn fail(slot: &mut Slot, e: Error, events: &mut Vec<Event>) {
    let Some(r) = slot.running.take() else {
        return;
    };
    let e = match e {
        Error::NonFiniteLogits { token, value, .. } => Error::NonFiniteLogits {
            sequence: None,
            position: slot.tokens.len().checked_sub(1),
            token,
            value,
        },
        other => other,
    };
    events.push(Event::Failed {
        seq: r.seq,
        error: e.to_string(),
    });
}

/// Reports the token chosen for a slot's sequence from the row `logits` (already committed
/// to its constraint): the sequence finishes (at its end of sequence, a complete constraint
/// or its token limit) or takes it as its next token. Returns the token.
pub(super) fn report(
    slot: &mut Slot,
    sampled: crate::sample::Sampled,
    logits: &[f32],
    eos_id: Option<u32>,
    events: &mut Vec<Event>,
) -> u32 {
    let r = slot.running.as_mut().expect("planned slots run");
    r.generated += 1;
    let top = match r.request.top_logprobs {
        0 => Vec::new(),
        k => top_logprobs(logits, k),
    };
    events.push(Event::Token {
        seq: r.seq,
        token: sampled.id,
        logprob: sampled.logprob,
        top,
    });
    let reason = if !r.request.ignore_eos && eos_id == Some(sampled.id) {
        Some(FinishReason::Eos)
    } else if r.constraint.as_ref().is_some_and(|c| c.is_complete()) {
        Some(FinishReason::Complete)
    } else if r.generated >= r.request.max_tokens {
        Some(FinishReason::Length)
    } else {
        None
    };
    match reason {
        Some(reason) => {
            let r = slot.running.take().expect("running");
            events.push(done(&r, reason));
        }
        None => {
            slot.tokens.push(sampled.id);
            r.next = Some(sampled.id);
        }
    }
    sampled.id
}

/// The [`Event::Done`] of a sequence.
pub(super) fn done(r: &Running, reason: FinishReason) -> Event {
    Event::Done {
        seq: r.seq,
        reason,
        prompt_tokens: r.prompt_len,
        cached_tokens: r.cached,
        generated: r.generated,
        spec: r.spec.as_ref().map_or_else(SpecStats::default, |s| s.stats),
    }
}

/// The `n` most likely tokens of `logits` with their log-probabilities, best first.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let lse = qkv_kernels::activation::log_sum_exp(logits);
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    for (i, &l) in logits.iter().enumerate() {
        if best.len() < n || best.last().is_some_and(|b| l > b.1) {
            let at = best.partition_point(|b| b.1 >= l);
            best.insert(at, (i as u32, l));
            best.truncate(n);
        }
    }
    best.into_iter().map(|(i, l)| (i, l - lse)).collect()
}
