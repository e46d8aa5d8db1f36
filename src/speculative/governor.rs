//! When speculation pays: the [`Governor`] that adapts drafting to one sequence.

/// Passes of a draft before the governor judges whether speculation pays.
const JUDGE_AFTER: usize = 4;
/// Weight of the newest measurement in the governor's moving averages.
const EMA_NEW: f64 = 0.25;
/// Plain steps of the first pause after speculation did not pay; each later pause doubles,
/// up to [`MAX_PAUSE`].
const FIRST_PAUSE: usize = 16;
/// The longest pause, in plain steps.
const MAX_PAUSE: usize = 512;

/// Adapts speculation to one sequence: the draft length to what the model keeps, and whether
/// to draft at all to what a verify pass costs on this machine against a one-row step, as
/// measured while generating. A pass of `1 + k` rows that keeps `a` drafts yields `1 + a`
/// tokens where plain decoding yields one per step; with a step taking `s` and each extra row
/// `r`, it pays while `a / k > r / s`. When it does not, drafting pauses for a while (longer
/// each time), then is tried again: the text may start copying later.
#[derive(Clone, Debug)]
pub(crate) struct Governor {
    max_draft: usize,
    /// Longest draft to propose next.
    draft_len: usize,
    /// Moving average of a one-row step's seconds, once measured.
    step_secs: Option<f64>,
    /// Moving average of the seconds each extra row adds to a verify pass, once measured.
    row_secs: Option<f64>,
    /// Moving average of kept drafts per drafted token, over the passes since drafting
    /// (re)started.
    acceptance: Option<f64>,
    /// Verify passes since drafting (re)started.
    passes: usize,
    /// Plain steps left before drafting again.
    paused: usize,
    /// The next pause's length.
    pause_len: usize,
}

fn ema(old: Option<f64>, new: f64) -> Option<f64> {
    Some(old.map_or(new, |o| o + EMA_NEW * (new - o)))
}

impl Governor {
    /// A governor allowing drafts of up to `max_draft` tokens.
    pub(crate) fn new(max_draft: usize) -> Governor {
        Governor {
            max_draft,
            draft_len: max_draft,
            step_secs: None,
            row_secs: None,
            acceptance: None,
            passes: 0,
            paused: 0,
            pause_len: FIRST_PAUSE,
        }
    }

    /// The longest draft the next step may run: 0 while paused, and 0 once to measure a
    /// one-row step when drafts have kept it from ever being measured.
    pub(crate) fn next_limit(&mut self) -> usize {
        if self.paused > 0 {
            self.paused -= 1;
            return 0;
        }
        if self.step_secs.is_none() && self.passes >= JUDGE_AFTER {
            return 0;
        }
        self.draft_len
    }

    /// A one-row step took `secs`.
    pub(crate) fn record_step(&mut self, secs: f64) {
        self.step_secs = ema(self.step_secs, secs);
    }

    /// A verify pass of `drafted` tokens (and the one before them) took `secs` and kept
    /// `kept` of them.
    pub(crate) fn record_pass(&mut self, drafted: usize, kept: usize, secs: f64) {
        self.record_shared_pass(drafted, kept, Some((secs, drafted)));
    }

    /// A verify pass ran `drafted` tokens of this sequence and kept `kept` of them, in a
    /// pass shared with other sequences (a batched step): `timing` is the whole pass's
    /// seconds and the drafted rows of every sequence in it, so that each drafted row is
    /// charged its share of what the pass cost over a one-row-per-sequence step; `None`
    /// when the pass cannot be timed as such (it read prompt chunks too).
    pub(crate) fn record_shared_pass(
        &mut self,
        drafted: usize,
        kept: usize,
        timing: Option<(f64, usize)>,
    ) {
        if drafted == 0 {
            return;
        }
        if let (Some(step), Some((secs, rows))) = (self.step_secs, timing) {
            let row = (secs - step) / rows.max(drafted) as f64;
            self.row_secs = ema(self.row_secs, row.max(0.0));
        }
        self.acceptance = ema(self.acceptance, kept as f64 / drafted as f64);
        self.passes += 1;
        // A draft kept whole may have been cut short: try longer. Otherwise propose one past
        // what was kept, which is where the model parted from the text.
        self.draft_len = if kept == drafted {
            (self.draft_len * 2).min(self.max_draft)
        } else {
            (kept + 1).min(self.max_draft)
        };
        if let (Some(step), Some(row), Some(rate)) =
            (self.step_secs, self.row_secs, self.acceptance)
        {
            if self.passes >= JUDGE_AFTER && rate * step < row {
                self.paused = self.pause_len;
                self.pause_len = (self.pause_len * 2).min(MAX_PAUSE);
                self.passes = 0;
                self.acceptance = None;
                self.draft_len = self.max_draft;
            }
        }
    }

    /// Whether drafting is paused now.
    #[cfg(test)]
    fn is_paused(&self) -> bool {
        self.paused > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draft_length_follows_what_is_kept() {
        let mut g = Governor::new(8);
        g.record_step(0.010);
        assert_eq!(g.next_limit(), 8);
        g.record_pass(8, 2, 0.012);
        assert_eq!(g.next_limit(), 3);
        g.record_pass(3, 3, 0.011);
        assert_eq!(g.next_limit(), 6);
        g.record_pass(6, 6, 0.011);
        assert_eq!(g.next_limit(), 8, "never past the most allowed");
    }

    #[test]
    fn speculation_pauses_when_rows_cost_more_than_the_kept_tokens_save() {
        // Each extra row costs half a step; a fifth of the drafts are kept: it does not pay.
        let mut g = Governor::new(4);
        g.record_step(0.010);
        for _ in 0..JUDGE_AFTER {
            assert!(g.next_limit() > 0);
            let k = g.draft_len;
            g.record_pass(k, 0, 0.010 + 0.005 * k as f64);
        }
        assert!(g.is_paused());
        for _ in 0..FIRST_PAUSE {
            assert_eq!(g.next_limit(), 0);
        }
        // Then it tries again, and pauses twice as long if it still does not pay.
        assert_eq!(g.next_limit(), 4);
        for _ in 0..JUDGE_AFTER {
            let k = g.next_limit();
            g.record_pass(k, 0, 0.010 + 0.005 * k as f64);
        }
        assert_eq!(g.paused, 2 * FIRST_PAUSE);
    }

    #[test]
    fn cheap_rows_and_kept_drafts_keep_it_on() {
        let mut g = Governor::new(4);
        g.record_step(0.010);
        for _ in 0..50 {
            let k = g.next_limit();
            assert!(k > 0);
            g.record_pass(k, k / 2, 0.010 + 0.001 * k as f64);
        }
        assert!(!g.is_paused());
    }

    #[test]
    fn a_shared_pass_charges_each_drafted_row_its_share() {
        // Three sequences drafted 4 rows each in a pass that took 6 ms more than a step of
        // one row each: every drafted row cost 0.5 ms, whoever drafted it.
        let mut g = Governor::new(4);
        g.record_step(0.010);
        g.record_shared_pass(4, 2, Some((0.016, 12)));
        assert!((g.row_secs.unwrap() - 0.0005).abs() < 1e-12);
        // A pass that read prompts too is not timed; what was kept still counts.
        g.record_shared_pass(4, 0, None);
        assert!((g.row_secs.unwrap() - 0.0005).abs() < 1e-12);
        assert_eq!(g.passes, 2);
        assert_eq!(g.next_limit(), 1);
    }

    #[test]
    fn a_step_is_measured_when_drafts_never_let_one_run() {
        let mut g = Governor::new(4);
        for _ in 0..JUDGE_AFTER {
            let k = g.next_limit();
            g.record_pass(k, 0, 0.05);
        }
        assert_eq!(g.next_limit(), 0, "a plain step to measure");
        g.record_step(0.010);
        assert!(g.next_limit() > 0);
    }
}
