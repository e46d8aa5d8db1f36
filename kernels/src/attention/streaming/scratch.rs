//! Per-thread scratch of the streaming kernel, and how a decode call splits its keys
//! (which bounds that scratch).

use super::{KB, ROWS_TARGET};
use std::cell::RefCell;
use std::collections::TryReserveError;

/// Work items per thread a decode call aims for when it splits the keys.
pub(super) const SPLIT_ITEMS_PER_THREAD: usize = 2;
/// Key splits are at least this many keys long.
const MIN_SPLIT_KEYS: usize = 4 * KB;

/// Per-thread buffers, grown once and reused: the decode path allocates nothing after warm-up.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) q: Vec<f32>,
    pub(super) kt: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) s: Vec<f32>,
    pub(super) o: Vec<f32>,
    pub(super) m: Vec<f32>,
    pub(super) l: Vec<f32>,
    pub(super) corr: Vec<f32>,
}

impl Scratch {
    /// [`prepare`](Self::prepare) that fails instead of aborting when memory runs out; the
    /// products must not overflow (checked by [`ScratchSizes::new`]).
    fn try_prepare(
        &mut self,
        rows: usize,
        d: usize,
        dvp: usize,
    ) -> std::result::Result<(), TryReserveError> {
        try_grow(&mut self.q, rows * d)?;
        try_grow(&mut self.kt, d * KB)?;
        try_grow(&mut self.v, KB * dvp)?;
        try_grow(&mut self.s, rows * KB)?;
        try_grow(&mut self.o, rows * dvp)?;
        try_grow(&mut self.m, rows)?;
        try_grow(&mut self.l, rows)?;
        try_grow(&mut self.corr, rows)
    }

    pub(super) fn prepare(&mut self, rows: usize, d: usize, dvp: usize) {
        fn grow(v: &mut Vec<f32>, n: usize) {
            if v.len() < n {
                v.resize(n, 0.0);
            }
        }
        grow(&mut self.q, rows * d);
        grow(&mut self.kt, d * KB);
        grow(&mut self.v, KB * dvp);
        grow(&mut self.s, rows * KB);
        grow(&mut self.o, rows * dvp);
        grow(&mut self.m, rows);
        grow(&mut self.l, rows);
        grow(&mut self.corr, rows);
    }
}

thread_local! {
    pub(super) static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    pub(super) static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    pub(super) static PACKED: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The most ranges a call splits its keys into, whatever the thread count: it bounds the
/// per-thread `PARTIALS` buffer (which holds every split of a call), so that memory does not
/// grow with the pool. Above every split count of pools up to 16 threads (at most
/// `2 · split_guess ≤ 4 · threads`), so those split exactly as without the cap.
const MAX_KEY_SPLITS: usize = 64;

/// Floats of one thread's buffers for calls with `heads` query heads over `kv_heads`, sized
/// for the largest work item such a call makes (any query count) and for split decode
/// calls on `threads` threads; `None` when a size overflows `usize`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScratchSizes {
    rows: usize,
    d: usize,
    dvp: usize,
    partials: usize,
}

impl ScratchSizes {
    /// The sizes, or `None` on overflow. `kv_heads` must be non-zero.
    pub(crate) fn new(
        heads: usize,
        kv_heads: usize,
        d_qk: usize,
        d_v: usize,
        threads: usize,
    ) -> Option<ScratchSizes> {
        let group = heads / kv_heads.max(1);
        // `run_with` makes items of `group · qb` rows, `qb ≤ max(ROWS_TARGET / group, 1)`.
        let rows = group.checked_mul((ROWS_TARGET / group.max(1)).max(1))?;
        let dvp = d_v.checked_next_multiple_of(8)?;
        // Split decode: `key_splits` never goes past its bound, whatever the key count.
        let items = kv_heads.checked_mul(max_key_splits(kv_heads, threads))?;
        let partials = items.checked_mul(group)?.checked_mul(d_v.checked_add(2)?)?;
        // Every product `Scratch::prepare` forms must fit too.
        let _ = rows
            .checked_mul(d_qk)?
            .checked_add(rows.checked_mul(dvp)?)?;
        let _ = KB.checked_mul(d_qk)?.checked_add(KB.checked_mul(dvp)?)?;
        Some(ScratchSizes {
            rows,
            d: d_qk,
            dvp,
            partials,
        })
    }
}

/// Sizes this thread's buffers to `sizes`, so that decode calls of that shape allocate
/// nothing later. See [`crate::attention::reserve_scratch`]. Errors, growing nothing further, when an
/// allocation fails.
pub(crate) fn reserve(sizes: ScratchSizes) -> std::result::Result<(), TryReserveError> {
    let ScratchSizes {
        rows,
        d,
        dvp,
        partials,
    } = sizes;
    SCRATCH.with(|sc| sc.borrow_mut().try_prepare(rows, d, dvp))?;
    PARTIALS.with(|p| try_grow(&mut p.borrow_mut(), partials))
}

/// Grows `v` to at least `n` zeros, failing instead of aborting when memory runs out.
pub(super) fn try_grow(v: &mut Vec<f32>, n: usize) -> std::result::Result<(), TryReserveError> {
    if v.len() < n {
        v.try_reserve_exact(n - v.len())?;
        v.resize(n, 0.0);
    }
    Ok(())
}

/// How many ranges a decode call splits its keys into, given `base` (KV head, query block)
/// items: about [`SPLIT_ITEMS_PER_THREAD`] items per thread, and a multiple of the thread
/// count when the key count allows it, never more than twice the first guess.
///
/// Cache-cold decode calls, 3 KV heads on 2 threads, alternating in one process: at
/// tk = 2048, 6 items took 61–63 µs, 12 items 67–70 and 9 items (one thread idle for the
/// last) 70–73; at tk = 8192, 6 and 12 items tied and 24 were 10% slower.
pub(super) fn key_splits(base: usize, tk: usize, threads: usize) -> usize {
    let most = (tk / MIN_SPLIT_KEYS).clamp(1, MAX_KEY_SPLITS);
    let want = split_guess(base, threads).min(most);
    let balanced = |s: &usize| (base * s).is_multiple_of(threads.max(1));
    (want..=most.min(2 * want))
        .find(balanced)
        .or_else(|| (1..want).rev().find(balanced))
        .unwrap_or(want)
}

/// [`key_splits`]' first guess: enough ranges for about [`SPLIT_ITEMS_PER_THREAD`] items
/// per thread.
fn split_guess(base: usize, threads: usize) -> usize {
    SPLIT_ITEMS_PER_THREAD
        .saturating_mul(threads)
        .div_ceil(base.max(1))
}

/// The most ranges [`key_splits`] returns for `base` items: twice its first guess, and
/// never more than [`MAX_KEY_SPLITS`].
fn max_key_splits(base: usize, threads: usize) -> usize {
    split_guess(base, threads)
        .saturating_mul(2)
        .min(MAX_KEY_SPLITS)
}

#[cfg(test)]
mod tests {
    use super::{key_splits, ScratchSizes, MAX_KEY_SPLITS, MIN_SPLIT_KEYS, SPLIT_ITEMS_PER_THREAD};

    /// `key_splits` as it was before [`MAX_KEY_SPLITS`]: no bound but the key count.
    fn uncapped_key_splits(base: usize, tk: usize, threads: usize) -> usize {
        let most = (tk / MIN_SPLIT_KEYS).max(1);
        let guess = (SPLIT_ITEMS_PER_THREAD * threads).div_ceil(base.max(1));
        let want = guess.min(most);
        let balanced = |s: &usize| (base * s).is_multiple_of(threads.max(1));
        (want..=most.min(2 * want))
            .find(balanced)
            .or_else(|| (1..want).rev().find(balanced))
            .unwrap_or(want)
    }

    #[test]
    fn the_split_cap_changes_nothing_up_to_sixteen_threads() {
        for threads in 1..=16 {
            for base in 1..=40 {
                for tk in [1, 255, 256, 700, 2048, 8192, 65_536, 1 << 20, usize::MAX] {
                    assert_eq!(
                        key_splits(base, tk, threads),
                        uncapped_key_splits(base, tk, threads),
                        "base {base}, tk {tk}, threads {threads}"
                    );
                }
            }
        }
        // Wider pools are capped.
        assert_eq!(key_splits(1, 1 << 20, 1000), MAX_KEY_SPLITS);
    }

    #[test]
    fn scratch_does_not_grow_with_the_thread_count() {
        // Llama-like decode shape: 32 heads over 8 KV heads, d = 128.
        let size = |threads| {
            ScratchSizes::new(32, 8, 128, 128, threads)
                .unwrap()
                .partials
        };
        let bound = 8 * MAX_KEY_SPLITS * 4 * 130;
        assert!(size(1000) <= bound && size(100_000) == size(1000));
        assert!(size(usize::MAX) <= bound);
        // Up to the cap, as before: 8 KV heads × 2·⌈16/8⌉ splits on 8 threads.
        assert_eq!(size(8), 8 * 4 * 4 * 130);
    }

    #[test]
    fn key_splits_give_a_multiple_of_the_threads_when_they_can() {
        // 3 KV heads on 2 threads: 6 items, whatever the (long enough) key count.
        assert_eq!(key_splits(3, 2048, 2), 2);
        assert_eq!(key_splits(3, 8192, 2), 2);
        // Too few keys to split: one range, even if that leaves the items unbalanced.
        assert_eq!(key_splits(3, 300, 2), 1);
        // One KV head: 4 ranges for 2 threads; 5 heads: 2 ranges (10 items, not 5).
        assert_eq!(key_splits(1, 4096, 2), 4);
        assert_eq!(key_splits(5, 4096, 2), 2);
        // 3 heads on 4 threads: 8 wanted → ⌈8/3⌉ = 3 ranges (9 items) is odd; 4 ranges
        // give 12, a multiple of 4.
        assert_eq!(key_splits(3, 8192, 4), 4);
        // Capped by the key count: 768 keys allow 3 ranges at most, and no count of 1–3
        // ranges makes 3 heads a multiple of 4 threads, so the first guess stands.
        assert_eq!(key_splits(3, 768, 4), 3);
        // 2 heads on 4 threads, 512 keys: 2 ranges wanted and allowed, 4 items.
        assert_eq!(key_splits(2, 512, 4), 2);
    }
}
