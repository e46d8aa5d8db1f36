//! Prompt-lookup drafting: no second model, only the sequence itself. Text that copies from
//! its input (an edit, a quote, an extraction into fields, a repeated turn) continues the
//! way an earlier occurrence of its last few tokens continued, so those following tokens
//! are the draft.

use std::ops::Range;

/// The draft for `history` (the prompt and the tokens generated so far): for `n` from
/// `max_ngram` down to `min_ngram`, the most recent earlier occurrence of the last `n`
/// tokens, and up to `max_draft` of the tokens that followed it; the first `n` that has
/// such an occurrence wins. Empty when none has, or when `max_draft` is 0. A slice of
/// `history`: nothing is allocated.
///
/// ```
/// use qkv::speculative::ngram::draft;
/// //              0  1  2  3  4  5  6  7  8
/// let history = [5, 6, 7, 8, 9, 1, 5, 6, 7];
/// // The last 3 tokens, [5, 6, 7], occurred at 0..3; [8, 9, 1] followed them.
/// assert_eq!(draft(&history, 2, 3, 3), &[8, 9, 1]);
/// assert_eq!(draft(&history, 2, 3, 1), &[8]);
/// assert!(draft(&[1, 2, 3], 1, 2, 4).is_empty());
/// ```
pub fn draft(history: &[u32], min_ngram: usize, max_ngram: usize, max_draft: usize) -> &[u32] {
    &history[find(history, min_ngram, max_ngram, max_draft)]
}

/// Where in `history` its [`draft`] lies (an empty range when there is none): what a caller
/// appending the draft to the very buffer it searched needs.
pub fn find(history: &[u32], min_ngram: usize, max_ngram: usize, max_draft: usize) -> Range<usize> {
    let len = history.len();
    if max_draft == 0 || min_ngram == 0 {
        return 0..0;
    }
    for n in (min_ngram..=max_ngram.min(len.saturating_sub(1))).rev() {
        let suffix = &history[len - n..];
        // The latest start whose match is followed by at least one token before the suffix's
        // own start is `len - n - 1`; scanning from there backwards finds the most recent.
        let found = (0..len - n).rev().find(|&i| &history[i..i + n] == suffix);
        if let Some(i) = found {
            let from = i + n;
            return from..len.min(from + max_draft);
        }
    }
    0..0
}

#[cfg(test)]
mod tests {
    use super::draft;

    #[test]
    fn the_longest_matching_suffix_wins() {
        // [3] occurs last at 6 (followed by 9), [2, 3] only at 1..3 (followed by 4).
        let h = [1, 2, 3, 4, 5, 0, 3, 9, 2, 3];
        assert_eq!(draft(&h, 1, 2, 2), &[4, 5]);
        assert_eq!(draft(&h, 1, 1, 2), &[9, 2]);
        // No 3-gram [9, 2, 3] earlier: falls back to 2.
        assert_eq!(draft(&h, 1, 3, 1), &[4]);
        // Only n ≥ 3 allowed: nothing.
        assert!(draft(&h, 3, 4, 4).is_empty());
    }

    #[test]
    fn the_most_recent_occurrence_wins() {
        let h = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(draft(&h, 2, 2, 1), &[2]);
        assert_eq!(draft(&h, 2, 2, 5), &[2, 7, 8]);
    }

    #[test]
    fn a_draft_stops_at_the_end_of_the_history() {
        // A run of one token: the match just before the suffix has one token after it.
        let h = [4, 4, 4, 4];
        assert_eq!(draft(&h, 1, 3, 8), &[4]);
        let h = [1, 2, 1, 2, 1, 2];
        assert_eq!(draft(&h, 2, 2, 8), &[1, 2]);
    }

    #[test]
    fn short_or_empty_histories_and_zero_limits_draft_nothing() {
        assert!(draft(&[], 1, 4, 4).is_empty());
        assert!(draft(&[3], 1, 4, 4).is_empty());
        assert_eq!(draft(&[3, 3], 1, 4, 4), &[3]);
        assert!(draft(&[3, 3], 1, 4, 0).is_empty());
        assert!(draft(&[3, 3], 0, 4, 4).is_empty());
        // max below min: no n to try.
        assert!(draft(&[3, 3, 3], 3, 2, 4).is_empty());
    }
}
