//! Per-thread scratch of the streaming kernel, sized for the largest item the planner makes.

use super::plan::max_key_splits;
use super::{KB, ROWS_TARGET};
use std::cell::RefCell;
use std::collections::TryReserveError;

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

#[cfg(test)]
mod tests {
    use super::ScratchSizes;

    #[test]
    fn scratch_does_not_grow_with_the_thread_count() {
        // Llama-like decode shape: 32 heads over 8 KV heads, d = 128.
        let size = |threads| {
            ScratchSizes::new(32, 8, 128, 128, threads)
                .unwrap()
                .partials
        };
        // 64: the planner's cap on key splits.
        let bound = 8 * 64 * 4 * 130;
        assert!(size(1000) <= bound && size(100_000) == size(1000));
        assert!(size(usize::MAX) <= bound);
        // Up to the cap, as before: 8 KV heads × 2·⌈16/8⌉ splits on 8 threads.
        assert_eq!(size(8), 8 * 4 * 4 * 130);
    }
}
