//! The planner: how one call's work is cut into items (KV head × query block × key range),
//! whether it runs on the pool, whether the keys are split (decode) and whether key blocks
//! are packed once up front (prefill). Nothing here touches the data.

use super::{Dims, Item, KB, ROWS_TARGET};
use crate::attention::AttentionMask;

/// Work items per thread a decode call aims for when it splits the keys.
pub(super) const SPLIT_ITEMS_PER_THREAD: usize = 2;
/// Key splits are at least this many keys long.
const MIN_SPLIT_KEYS: usize = 4 * KB;
/// Below this many multiply-adds the call runs on the calling thread alone.
const PARALLEL_MIN_WORK: usize = 1 << 17;

/// The most ranges a call splits its keys into, whatever the thread count: it bounds the
/// per-thread `PARTIALS` buffer (which holds every split of a call), so that memory does not
/// grow with the pool. Above every split count of pools up to 16 threads (at most
/// `2 · split_guess ≤ 4 · threads`), so those split exactly as without the cap.
const MAX_KEY_SPLITS: usize = 64;

/// How one call is cut into work items.
#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    /// Query rows per query block.
    pub(super) qb: usize,
    /// (KV head, query block) pairs: the items before any key split.
    pub(super) base_items: usize,
    /// Key ranges each (KV head, query block) is split into (1: no split).
    pub(super) splits: usize,
    /// Keys before this one are before every query's sliding window, seen by no query.
    pub(super) k_lo: usize,
    /// Whether the items run on rayon's pool.
    pub(super) parallel: bool,
    /// The call's multiply-adds, roughly (saturating): what `parallel` was decided on.
    pub(super) work: usize,
    /// Whether every key block is worth packing once up front (three or more query blocks
    /// would each pack it again), memory allowing.
    pub(super) pack_up_front: bool,
}

impl Plan {
    /// The plan of a call of these shapes and mask on `threads` threads.
    pub(super) fn new(dims: &Dims, mask: &AttentionMask<'_>, threads: usize) -> Plan {
        let group = dims.heads / dims.kv_heads;
        let qb = (ROWS_TARGET / group).clamp(1, dims.tq);
        let q_blocks = dims.tq.div_ceil(qb);
        let base_items = dims.kv_heads * q_blocks;
        let k_lo = mask.window_start(0).min(dims.tk);
        // Saturating: with zero-stride views tq·tk need not fit, and this only picks the split.
        let work = dims
            .tq
            .saturating_mul(dims.tk)
            .saturating_mul(dims.heads)
            .saturating_mul(dims.d_qk.saturating_add(dims.d_v));
        let parallel = worth_parallel(work, threads);
        // Too few items to keep every thread busy (decode): split the keys as well.
        let splits = if parallel && base_items < SPLIT_ITEMS_PER_THREAD * threads {
            key_splits(base_items, dims.tk - k_lo, threads)
        } else {
            1
        };
        Plan {
            qb,
            base_items,
            splits,
            k_lo,
            parallel,
            work,
            pack_up_front: splits == 1 && q_blocks >= 3,
        }
    }

    /// All items: `base_items · splits`.
    pub(super) fn items(&self) -> usize {
        self.base_items * self.splits
    }

    /// Item `idx`: split `idx % splits` of (KV head, query block) `idx / splits`, KV heads
    /// varying fastest.
    pub(super) fn item(&self, idx: usize, dims: &Dims) -> Item {
        let split = idx % self.splits;
        let rest = idx / self.splits;
        let (g, qblk) = (rest % dims.kv_heads, rest / dims.kv_heads);
        let i0 = qblk * self.qb;
        let per = (dims.tk - self.k_lo).div_ceil(self.splits);
        Item {
            g,
            i0,
            nq: self.qb.min(dims.tq - i0),
            j0: (self.k_lo + split * per).min(dims.tk),
            j1: (self.k_lo + (split + 1) * per).min(dims.tk),
        }
    }
}

/// Whether `work` multiply-adds are worth handing to a pool of `threads`.
pub(super) fn worth_parallel(work: usize, threads: usize) -> bool {
    threads > 1 && work >= PARALLEL_MIN_WORK
}

/// How many ranges a decode call splits its keys into, given `base` (KV head, query block)
/// items: about [`SPLIT_ITEMS_PER_THREAD`] items per thread, and a multiple of the thread
/// count when the key count allows it, never more than twice the first guess.
/// (In cache-cold decode calls more items than that only added overhead, and a count that
/// is not a multiple of the threads left one idle at the end.)
fn key_splits(base: usize, tk: usize, threads: usize) -> usize {
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
pub(super) fn max_key_splits(base: usize, threads: usize) -> usize {
    split_guess(base, threads)
        .saturating_mul(2)
        .min(MAX_KEY_SPLITS)
}

#[cfg(test)]
mod tests {
    use super::{key_splits, MAX_KEY_SPLITS, MIN_SPLIT_KEYS, SPLIT_ITEMS_PER_THREAD};

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
        let (threads_max, bases) = if cfg!(miri) { (3, 4) } else { (16, 40) };
        for threads in 1..=threads_max {
            for base in 1..=bases {
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
