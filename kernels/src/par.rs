//! Splitting work across rayon's pool: when a row-wise or elementwise job is worth
//! splitting and into what pieces ([`par_rows`], [`par_elems`]), and the shared output
//! pointer ([`SharedOut`]) the parallel kernels write their disjoint parts through.

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
