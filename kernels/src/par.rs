//! Splitting work across rayon's pool: when a row-wise or elementwise job is worth
//! splitting and into what pieces ([`par_rows`], [`par_elems`]), how a weight stream is cut
//! into one contiguous run per thread ([`runs`]), the shared output pointer ([`SharedOut`])
//! the parallel kernels write their disjoint parts through, and [`on_pool`], which runs a
//! model's step on the pool with its threads kept awake.

use std::sync::atomic::{AtomicBool, Ordering};

/// A raw pointer to an output that tasks on several threads write at once, each its own
/// disjoint elements (every user says which, where it writes).
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: the pointer is only dereferenced by tasks that write disjoint elements of a buffer
// that outlives them; no task reads what another writes.
unsafe impl Send for SharedOut {}
// SAFETY: as for `Send`: sharing the wrapper only shares the address, and every task that
// dereferences it writes its own disjoint elements.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer. Taking `self` makes closures capture the whole wrapper, not the raw field.
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// From this many elements on, the row-wise and elementwise kernels (norms, SwiGLU, residual
/// adds, RoPE) split their work across the pool; below it (a decode step's single rows) a
/// hand-off would cost more than it saves.
const PAR_MIN_ELEMS: usize = 1 << 16;

/// Units per parallel piece when a job of `units` units of `unit_len` elements is split
/// across the pool (about four pieces per thread), or `None` when it should stay on the
/// calling thread. Units are whole rows, so the pieces compute exactly what one pass would.
pub(crate) fn par_rows(units: usize, unit_len: usize) -> Option<usize> {
    let threads = rayon::current_num_threads();
    (threads > 1 && units > 1 && units.saturating_mul(unit_len) >= PAR_MIN_ELEMS)
        .then(|| units.div_ceil(4 * threads))
}

/// Elements per parallel piece of an elementwise job over `len` elements, or `None` to stay
/// serial: a multiple of 64, so every piece but the last is whole SIMD vectors and the
/// result is bitwise the one pass's.
pub(crate) fn par_elems(len: usize) -> Option<usize> {
    par_rows(len.div_ceil(64), 64).map(|runs| runs * 64)
}

/// Runs `f` on one of the pool's threads, with the pool's other threads kept awake for its
/// parallel work while it runs, and returns what `f` returns.
///
/// A model's step hands work to the pool dozens of times per layer. Called from outside the
/// pool, each hand-off puts the caller to sleep until the work is done; and between two
/// hand-offs the pool's idle threads soon go to sleep themselves, so each hand-off also
/// waits for them to be woken, which on a virtual machine takes tens of microseconds, against
/// a few from inside the pool. So `f` runs on a worker, where a split queues its work
/// locally, and every other worker spins looking for work (through
/// [`rayon::yield_now`]) until `f` returns. Spinning uses those cores only while `f` runs,
/// and keeps a decode step's cores busy between its hand-offs.
///
/// Inside the pool already, `f` simply runs. A spinning thread may take up work that another
/// caller handed the pool (another session's step on another thread); `f`'s return then
/// waits until that piece of work is done. A panic in `f` is passed on once the spinning
/// threads have stopped. Allocates nothing beyond the one job it hands the pool from
/// outside (the spinners are `join` halves, on the stack).
///
/// ```
/// let threads = qkv_kernels::on_pool(rayon::current_num_threads);
/// assert_eq!(threads, rayon::current_num_threads());
/// ```
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let done = AtomicBool::new(false);
    rayon::scope(|_| {
        let caller = rayon::current_thread_index();
        with_spinners(rayon::current_num_threads() - 1, caller, &done, f)
    })
}

/// Runs `f` beside `n` spinners, each the second half of a `join` that another thread takes
/// (the oldest jobs of a deque are the ones stolen first, so they go before any of `f`'s).
fn with_spinners<R: Send>(
    n: usize,
    caller: Option<usize>,
    done: &AtomicBool,
    f: impl FnOnce() -> R + Send,
) -> R {
    if n == 0 {
        /// Sets the flag when dropped, so the spinners stop even if `f` panics.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let _stop = Stop(done);
        return f();
    }
    let spin = || {
        // A spinner the caller's own thread takes back returns at once: after `f` that is
        // the end anyway, and during `f` (waiting inside a split) it would keep the
        // caller here, above `f`, for good.
        if rayon::current_thread_index() == caller {
            return;
        }
        while !done.load(Ordering::Acquire) {
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                std::hint::spin_loop();
            }
        }
    };
    rayon::join(|| with_spinners(n - 1, caller, done, f), spin).0
}

/// Most runs [`runs`] keeps track of (on the stack): it uses at most this many threads.
const MAX_RUNS: usize = 256;

/// Calls `f(piece)` exactly once for every piece `0..pieces`, on up to `workers` of the pool's
/// threads, so that each thread walks one contiguous range: the pieces are cut into one run
/// per worker, each worker takes its own run's pieces in order from the front, and a worker
/// whose run is done takes the others' remaining pieces one at a time from their backs, so
/// the threads still finish together.
///
/// This is the split for streaming weights from memory: a thread that moves on to the next
/// piece of its own range keeps the hardware prefetcher's stream going, where handing out
/// pieces in turn from one counter made every thread restart its stream at every piece, and
/// left a large matrix well short of the memory's rate.
pub(crate) fn runs(pieces: usize, workers: usize, f: impl Fn(usize) + Sync) {
    use rayon::prelude::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let workers = workers.min(pieces).min(MAX_RUNS);
    let Ok(total) = u32::try_from(pieces) else {
        // Never for real matrices (a piece is at least 8 rows); correct, if slow.
        (0..pieces).for_each(f);
        return;
    };
    if workers <= 1 {
        (0..pieces).for_each(f);
        return;
    }
    // Run r holds its pieces front..back as `front | back << 32`.
    let pack = |front: u32, back: u32| u64::from(front) | u64::from(back) << 32;
    let bounds: [AtomicU64; MAX_RUNS] = [const { AtomicU64::new(0) }; MAX_RUNS];
    let cut = |r: usize| (u64::from(total) * r as u64 / workers as u64) as u32;
    for (r, b) in bounds[..workers].iter().enumerate() {
        b.store(pack(cut(r), cut(r + 1)), Relaxed);
    }
    // One piece from the front (`own`) or the back of run `b`, while it has any.
    let take = |b: &AtomicU64, own: bool| {
        let mut v = b.load(Relaxed);
        loop {
            let (front, back) = (v as u32, (v >> 32) as u32);
            if front >= back {
                return None;
            }
            let (next, piece) = match own {
                true => (pack(front + 1, back), front),
                false => (pack(front, back - 1), back - 1),
            };
            match b.compare_exchange_weak(v, next, Relaxed, Relaxed) {
                Ok(_) => return Some(piece as usize),
                Err(now) => v = now,
            }
        }
    };
    (0..workers).into_par_iter().for_each(|r| {
        while let Some(p) = take(&bounds[r], true) {
            f(p);
        }
        for other in (1..workers).map(|i| (r + i) % workers) {
            while let Some(p) = take(&bounds[other], false) {
                f(p);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{on_pool, runs};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    #[test]
    fn runs_call_every_piece_once() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("a pool");
        for (pieces, workers) in [(0, 3), (1, 3), (2, 3), (7, 3), (100, 3), (1000, 2), (5, 1)] {
            let seen: Vec<AtomicUsize> = (0..pieces).map(|_| AtomicUsize::new(0)).collect();
            pool.install(|| {
                runs(pieces, workers, |p| {
                    seen[p].fetch_add(1, Relaxed);
                })
            });
            assert!(
                seen.iter().all(|s| s.load(Relaxed) == 1),
                "{pieces} pieces on {workers} workers"
            );
        }
    }

    #[test]
    fn on_pool_runs_on_a_worker_and_returns() {
        use rayon::prelude::*;
        // From the test's own thread, outside the pool: the spinning path (on the global
        // pool, which has more than one thread wherever the machine has more than one
        // core), with parallel work inside and a nested call, which simply runs.
        let sum = on_pool(|| {
            assert!(rayon::current_thread_index().is_some());
            let inner = on_pool(|| (0..1000u64).into_par_iter().sum::<u64>());
            inner + (0..1000u64).into_par_iter().map(|x| x * 2).sum::<u64>()
        });
        assert_eq!(sum, 499_500 * 3);
        // Many short calls in a row, as a decode loop makes them.
        for i in 0..200u64 {
            assert_eq!(
                on_pool(|| (0..i).into_par_iter().sum::<u64>()),
                i * i.saturating_sub(1) / 2
            );
        }
    }

    #[test]
    fn on_pool_passes_a_panic_on() {
        let caught = std::panic::catch_unwind(|| on_pool(|| panic!("in the step")));
        assert!(caught.is_err());
        // The pool still works: the spinning threads stopped.
        assert_eq!(on_pool(|| 7), 7);
    }
}
