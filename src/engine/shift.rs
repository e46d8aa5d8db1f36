//! Context shift: a sequence that asked for it ([`GenRequest::context_shift`](super::GenRequest))
//! and whose tokens fill its context keeps its first `n_keep` tokens, forgets the older half
//! of the rest, and runs the newer half again at its new positions before sampling on.
//!
//! The kept keys are recomputed rather than re-rotated: rotating cached keys to new RoPE
//! positions would round them again (in f16 or in Q8_0 blocks) and give logits that no
//! fresh run reproduces, whereas recomputing gives exactly what a sequence whose prompt were
//! the shifted tokens gives, which the tests check bit for bit. It costs one prompt read of
//! about half the context per shift.

use super::{Event, Slot};

/// Shifts every running sequence with context shift whose next token would fill its
/// context (as llama-server does: when the cached positions and the next one reach the
/// context), reporting [`Event::Shifted`]; the sequence then reads the kept tokens again
/// as a prompt, from the first dropped position on.
pub(super) fn shift_full(slots: &mut [Slot], context: usize, events: &mut Vec<Event>) {
    for slot in slots {
        let Some(r) = slot.running.as_mut() else {
            continue;
        };
        let (Some(n_keep), Some(_)) = (r.request.context_shift, r.next) else {
            continue;
        };
        // `tokens` ends with the token to run next, which is not cached yet.
        let cached = slot.tokens.len() - 1;
        if cached + 1 < context {
            continue;
        }
        let keep = n_keep.min(context.saturating_sub(4)).min(cached);
        let left = cached - keep;
        let dropped = (left / 2).min(left.saturating_sub(1));
        if dropped == 0 {
            continue;
        }
        slot.tokens.drain(keep..keep + dropped);
        slot.cache.truncate(keep);
        // Run the kept tokens and the pending one again; the last row's logits give the
        // next token, as at the end of a prompt.
        r.request.prompt.clone_from(&slot.tokens);
        slot.tokens.truncate(keep);
        r.read = keep;
        r.next = None;
        events.push(Event::Shifted {
            seq: r.seq,
            kept: keep,
            dropped,
        });
    }
}
