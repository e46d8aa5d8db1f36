//! `y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n])`: the `nn.Linear` product, with `W` stored f32 or
//! f16 in PyTorch's `[out_features, in_features]` layout and activations in f32.
//!
//! - Few rows (`m ≤` [`GEMV_MAX_ROWS`], decode): our own GEMV streams `W` once, converting
//!   f16 to f32 in registers, split across threads by rows of `W`.
//! - Many rows (prefill): the gemm crate in f32, parallel with rayon; the crate picks its
//!   AVX-512 micro-kernels at run time where the CPU has them (its `x86-v4` feature), else
//!   AVX2/FMA. f16 weights are converted to f32 one cache-sized panel of rows at a time
//!   inside the call, never as a whole-matrix copy.
//!
//! ```
//! use qkv_kernels::{linear, Weights};
//! // y = x·Wᵀ + b with x [1, 2], W [3, 2]
//! let x = [1.0, 2.0];
//! let w = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let b = [0.5, 0.5, 0.5];
//! let mut y = [0.0; 3];
//! linear(&mut y, &x, Weights::F32(&w), Some(&b), 1, 2, 3).unwrap();
//! assert_eq!(y, [1.5, 2.5, 3.5]);
//! ```

use crate::error::{check_len, check_nonzero, KernelError, Result};
use crate::SharedOut;
use half::f16;
use rayon::prelude::*;
use std::cell::RefCell;

/// Up to this many rows of `x`, [`linear`] takes the streaming GEMV instead of gemm.
pub const GEMV_MAX_ROWS: usize = 8;

/// A weight matrix `[n, k]` (row-major, one row per output feature) in a compute dtype.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    /// 32-bit floats.
    F32(&'a [f32]),
    /// IEEE half floats, widened to f32 inside the kernels.
    F16(&'a [f16]),
}

impl Weights<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Weights::F32(w) => w.len(),
            Weights::F16(w) => w.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes one element takes.
    pub fn elem_bytes(&self) -> usize {
        match self {
            Weights::F32(_) => 4,
            Weights::F16(_) => 2,
        }
    }

    /// Element `i` as f32.
    ///
    /// # Panics
    /// If `i ≥ self.len()`, like slice indexing. It is meant for loops whose bounds were
    /// validated (the scalar references); use [`try_get`](Self::try_get) for an index that
    /// may be out of range.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            Weights::F32(w) => w[i],
            Weights::F16(w) => w[i].to_f32(),
        }
    }

    /// Element `i` as f32, or `None` when `i ≥ self.len()`.
    #[inline]
    pub fn try_get(&self, i: usize) -> Option<f32> {
        match self {
            Weights::F32(w) => w.get(i).copied(),
            Weights::F16(w) => w.get(i).map(|v| v.to_f32()),
        }
    }
}

/// `a · b` for the shape product named `what` (e.g. `"m·k"`), or an error naming it.
fn product(what: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| KernelError::Invalid(format!("linear: {what} = {a} × {b} overflows usize")))
}

#[allow(clippy::too_many_arguments)]
fn validate(
    y: &[f32],
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    check_nonzero("m", m)?;
    check_nonzero("k", k)?;
    check_nonzero("n", n)?;
    // Checked: a wrapped product could match a short slice and let the kernels run off it.
    check_len("x", product("m·k", m, k)?, x.len())?;
    check_len("weights", product("n·k", n, k)?, w.len())?;
    check_len("y", product("m·n", m, n)?, y.len())?;
    if let Some(b) = bias {
        check_len("bias", n, b.len())?;
    }
    Ok(())
}

/// `y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias)`, overwriting `y`.
///
/// Picks the GEMV for `m ≤ GEMV_MAX_ROWS` and gemm otherwise; both use rayon's current pool.
/// Errors if a slice length disagrees with `m`, `k`, `n`, a dimension is zero, or a product
/// of them (`m·k`, `n·k`, `m·n`) overflows `usize`.
pub fn linear(
    y: &mut [f32],
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    validate(y, x, w, bias, m, k, n)?;
    if m <= GEMV_MAX_ROWS {
        gemv(y, x, w, bias, m, k, n);
    } else {
        match w {
            Weights::F32(w) => gemm_f32(y, x, w, bias, m, k, n),
            Weights::F16(w) => gemm_f16_panels(y, x, w, bias, m, k, n),
        }
    }
    Ok(())
}

/// The plain reference for [`linear`]: one dot product per output, f32 accumulation.
pub fn linear_scalar(
    y: &mut [f32],
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    validate(y, x, w, bias, m, k, n)?;
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for p in 0..k {
                acc += x[i * k + p] * w.get(j * k + p);
            }
            y[i * n + j] = acc + bias.map_or(0.0, |b| b[j]);
        }
    }
    Ok(())
}

/// One of several projections of the same input, for [`linear_many`].
pub struct Projection<'a, 'y> {
    /// The weight matrix `[n, k]`.
    pub w: Weights<'a>,
    /// Optional bias `[n]`.
    pub bias: Option<&'a [f32]>,
    /// Output features `n`.
    pub n: usize,
    /// The output `[m, n]`, overwritten.
    pub y: &'y mut [f32],
}

/// Several products of the same `x[m, k]` at once: `p.y = x·p.wᵀ (+ p.bias)` for every
/// projection `p` (Q, K and V; or gate and up). Equal to calling [`linear`] on each, but in
/// the GEMV regime the rows of all matrices are split across the threads as one range, so
/// the group costs one hand-off instead of one per matrix, and no weight is copied to fuse
/// them. Errors as [`linear`] would on any projection.
pub fn linear_many(
    x: &[f32],
    m: usize,
    k: usize,
    projections: &mut [Projection<'_, '_>],
) -> Result<()> {
    for p in projections.iter() {
        validate(p.y, x, p.w, p.bias, m, k, p.n)?;
    }
    if m > GEMV_MAX_ROWS {
        for p in projections.iter_mut() {
            linear(p.y, x, p.w, p.bias, m, k, p.n)?;
        }
        return Ok(());
    }
    if projections.len() > MAX_GROUP {
        for p in projections.iter_mut() {
            linear(p.y, x, p.w, p.bias, m, k, p.n)?;
        }
        return Ok(());
    }
    // On the stack: the decode step allocates nothing.
    let mut parts = [GemvPart::EMPTY; MAX_GROUP];
    for (part, p) in parts.iter_mut().zip(projections.iter_mut()) {
        *part = GemvPart {
            w: p.w,
            bias: p.bias,
            n: p.n,
            y: SharedOut(p.y.as_mut_ptr()),
        };
    }
    gemv_parts(&parts[..projections.len()], x, m, k);
    Ok(())
}

/// Projections [`linear_many`] runs as one GEMV group; larger groups run one by one.
const MAX_GROUP: usize = 8;

/// Calls the gemm crate for `dst[m, n] (row stride dst_rs) = x[m, k] · wt`, where `wt` is the
/// `[n, k]` row-major weight block read as its transpose. With `accumulate`, adds to `dst`.
#[allow(clippy::too_many_arguments)]
fn gemm_raw(
    dst: &mut [f32],
    dst_rs: usize,
    x: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
    accumulate: bool,
) {
    debug_assert!(dst.len() >= (m - 1) * dst_rs + n);
    debug_assert!(x.len() >= m * k && w.len() >= n * k);
    let threads = rayon::current_num_threads();
    // Saturating: m·n and n·k fit (validated), their product with k need not.
    let parallel = threads > 1 && m.saturating_mul(n).saturating_mul(k) >= 1 << 16;
    // Up to a few threads and prompt-sized m, one single-threaded gemm call per block of
    // columns beat the crate's own split: at m = 512 on SmolLM2's shapes, alternating, by
    // 1–3% on the large ones and 7–20% at n = 192, and a whole 512-token prefill by 4–8%.
    // Each call packs all of x, so very tall x or many threads keep gemm's split.
    let per = n.div_ceil(threads).div_ceil(16) * 16;
    if parallel && threads <= COLUMN_SPLIT_MAX_THREADS && m <= COLUMN_SPLIT_MAX_M && per >= 64 {
        let out = SharedOut(dst.as_mut_ptr());
        (0..n.div_ceil(per)).into_par_iter().for_each(|b| {
            let (j0, nb) = (b * per, per.min(n - b * per));
            // SAFETY: as below, for columns j0..j0+nb of dst and rows j0..j0+nb of w; the
            // blocks' columns are disjoint, so no two tasks write the same element.
            unsafe {
                gemm_call(
                    out.get().add(j0),
                    dst_rs,
                    x,
                    w.as_ptr().add(j0 * k),
                    m,
                    k,
                    nb,
                    accumulate,
                    gemm::Parallelism::None,
                )
            };
        });
        return;
    }
    let par = if parallel {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the debug-asserted bounds hold for every caller (validated in `linear`): dst
    // covers m rows of stride dst_rs with n columns, x is m·k row-major, w is n·k row-major
    // and read as the k×n matrix with row stride 1 and column stride k.
    unsafe {
        gemm_call(
            dst.as_mut_ptr(),
            dst_rs,
            x,
            w.as_ptr(),
            m,
            k,
            n,
            accumulate,
            par,
        )
    };
}

/// Most pool threads, and most rows of `x`, for which [`gemm_raw`] splits by columns itself.
const COLUMN_SPLIT_MAX_THREADS: usize = 4;
const COLUMN_SPLIT_MAX_M: usize = 2048;

/// `dst[m, n] (row stride dst_rs) (+)= x[m, k] · wt` through the gemm crate.
///
/// # Safety
/// `dst` must cover `m` rows of stride `dst_rs` with `n` columns that no one else touches
/// during the call, `x` holds `m·k` values and `wt` points to `n` rows of `k` values.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_call(
    dst: *mut f32,
    dst_rs: usize,
    x: &[f32],
    wt: *const f32,
    m: usize,
    k: usize,
    n: usize,
    accumulate: bool,
    par: gemm::Parallelism,
) {
    // SAFETY: the caller's contract; w is read as the k×n matrix with row stride 1 and
    // column stride k.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            x.as_ptr(),
            1,
            k as isize,
            wt,
            k as isize,
            1,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    }
}

fn fill_bias(y: &mut [f32], bias: Option<&[f32]>, n: usize) -> bool {
    match bias {
        Some(b) => {
            for row in y.chunks_exact_mut(n) {
                row.copy_from_slice(b);
            }
            true
        }
        None => false,
    }
}

fn gemm_f32(
    y: &mut [f32],
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) {
    let accumulate = fill_bias(y, bias, n);
    gemm_raw(y, n, x, w, m, k, n, accumulate);
}

thread_local! {
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// f32 elements per converted panel of `W` (4 MiB, well inside L3). Measured at m = 512:
/// 512 KiB panels left f16 13–21% behind f32, 4 MiB panels 3–7%.
const PANEL_ELEMS: usize = 1 << 20;

/// Rows of `W` converted per panel: about [`PANEL_ELEMS`] f32, a multiple of 16 rows. Large
/// panels keep gemm calls few (each packs `x` again); the panel still fits in L3.
fn panel_rows(k: usize, n: usize) -> usize {
    let rows = (PANEL_ELEMS / k).max(16) / 16 * 16;
    rows.min(n)
}

/// Widens a panel on every thread: the conversion is memory-bound and would otherwise leave
/// the other threads idle between gemm calls.
fn widen_panel(src: &[f16], dst: &mut [f32]) {
    const CHUNK: usize = 1 << 16;
    if src.len() <= CHUNK || rayon::current_num_threads() == 1 {
        crate::convert::f16_to_f32(src, dst).expect("panel lengths agree by construction");
        return;
    }
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| crate::convert::f16_to_f32(s, d).expect("chunk lengths agree"));
}

fn gemm_f16_panels(
    y: &mut [f32],
    x: &[f32],
    w: &[f16],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) {
    let accumulate = fill_bias(y, bias, n);
    let rows = panel_rows(k, n);
    // Taken out of the thread-local rather than borrowed: the widening and gemm run on the
    // pool, and while this thread waits there it may run another `linear` (another
    // session's prefill), which would find the buffer still borrowed. That call then
    // starts from an empty buffer of its own.
    let mut panel = PANEL.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if panel.len() < rows * k {
        panel.resize(rows * k, 0.0);
    }
    let mut j0 = 0;
    while j0 < n {
        let nr = rows.min(n - j0);
        let dst = &mut panel[..nr * k];
        widen_panel(&w[j0 * k..(j0 + nr) * k], dst);
        gemm_raw(&mut y[j0..], n, x, dst, m, k, nr, accumulate);
        j0 += nr;
    }
    PANEL.with(|p| {
        let mut kept = p.borrow_mut();
        if kept.len() < panel.len() {
            *kept = panel;
        }
    });
}

/// Minimum `n·k` below which the GEMV stays on one thread: smaller matrices finish before a
/// hand-off to another thread would pay for itself.
const GEMV_PAR_MIN_ELEMS: usize = 1 << 15;

/// Ranges of W rows per thread in the parallel GEMV.
const GEMV_CHUNKS_PER_THREAD: usize = 4;

/// One matrix of a GEMV group: its weights, bias, rows and output.
#[derive(Clone, Copy)]
struct GemvPart<'a> {
    w: Weights<'a>,
    bias: Option<&'a [f32]>,
    n: usize,
    y: SharedOut,
}

impl GemvPart<'_> {
    /// A part with no rows, to fill unused slots of a group.
    const EMPTY: GemvPart<'static> = GemvPart {
        w: Weights::F32(&[]),
        bias: None,
        n: 0,
        y: SharedOut(std::ptr::null_mut()),
    };
}

fn gemv(
    y: &mut [f32],
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) {
    let part = GemvPart {
        w,
        bias,
        n,
        y: SharedOut(y.as_mut_ptr()),
    };
    gemv_parts(std::slice::from_ref(&part), x, m, k);
}

/// The GEMV over a group of matrices sharing `x`: their rows, end to end, are one range split
/// across the threads. Each part's `y` must be `m·n` long (validated by the callers).
fn gemv_parts(parts: &[GemvPart<'_>], x: &[f32], m: usize, k: usize) {
    // Each part's n·k fits (validated); the sums of up to MAX_GROUP of them saturate rather
    // than wrap (they only steer the split, and cannot reach usize::MAX for real slices).
    let total = parts.iter().fold(0usize, |t, p| t.saturating_add(p.n));
    let total_elems = total.saturating_mul(k);
    // Rows j0..j1 of the concatenation, dispatched to the parts they cover.
    let run = |j0: usize, j1: usize| {
        let mut base = 0;
        for p in parts {
            let (a, b) = (j0.max(base), j1.min(base + p.n));
            if a < b {
                // SAFETY: `p.y` points to m·n floats (validated by the caller) that live for
                // this call; this task writes columns a−base..b−base of every row, which no
                // other task touches while it runs. The tasks' columns interleave within each
                // row, so each gets the raw pointer rather than a `&mut` over the whole.
                unsafe { gemv_columns(p.y, x, p.w, p.bias, m, k, p.n, a - base, b - base) };
            }
            base += p.n;
        }
    };
    let threads = rayon::current_num_threads();
    if threads <= 1 || total_elems < GEMV_PAR_MIN_ELEMS {
        run(0, total);
        return;
    }
    // Contiguous ranges of W rows, each streamed front to back exactly once. A few ranges per
    // thread (not one) let rayon's work stealing absorb a thread that the OS delays.
    let chunks = (threads * GEMV_CHUNKS_PER_THREAD)
        .min(total_elems / GEMV_PAR_MIN_ELEMS)
        .max(threads);
    let per = total.div_ceil(chunks);
    (0..chunks).into_par_iter().for_each(|t| {
        let j0 = (t * per).min(total);
        let j1 = ((t + 1) * per).min(total);
        if j0 < j1 {
            run(j0, j1);
        }
    });
}

/// Columns `j0..j1` of `y[m, n] = x[m, k]·Wᵀ (+ b)`.
///
/// # Safety
/// `y` must point to `m·n` writable floats, of which no one else reads or writes columns
/// `j0..j1` during the call; `x` is m·k, `w` n·k, `j1 ≤ n`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemv_columns(
    y: SharedOut,
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
    j0: usize,
    j1: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above); the bounds and the
        // exclusive columns are this function's contract.
        unsafe {
            match w {
                Weights::F32(w) => gemv_avx2::columns(y, x, w, bias, m, k, n, j0, j1),
                Weights::F16(w) => gemv_avx2::columns(y, x, w, bias, m, k, n, j0, j1),
            }
        }
        return;
    }
    for j in j0..j1 {
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            let mut acc = 0.0f32;
            for (p, &xv) in xr.iter().enumerate() {
                acc += xv * w.get(j * k + p);
            }
            // SAFETY: i < m and j < j1 ≤ n: inside y, in this call's own columns.
            unsafe { *y.get().add(i * n + j) = acc + bias.map_or(0.0, |b| b[j]) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod gemv_avx2 {
    use crate::simd::avx2::{hsum, Lane};
    use crate::SharedOut;
    use core::arch::x86_64::*;

    /// Columns `j0..j1` of `y[m, n] = x[m, k]·Wᵀ (+ b)`.
    ///
    /// W is read one row at a time, front to back: a single sequential stream is what the
    /// hardware prefetcher follows best (interleaving four rows measured 2.5× slower here).
    /// Each row meets up to 4 rows of `x` per pass; for m > 4 the next pass re-reads the
    /// row from L1, so W still comes from memory exactly once.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; `y` points to m·n floats whose columns
    /// `j0..j1` only this call touches, `x` is m·k, `w` n·k, `j1 ≤ n`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn columns<T: Lane>(
        y: SharedOut,
        x: &[f32],
        w: &[T],
        bias: Option<&[f32]>,
        m: usize,
        k: usize,
        n: usize,
        j0: usize,
        j1: usize,
    ) {
        debug_assert!(x.len() == m * k && w.len() == n * k && j1 <= n);
        for j in j0..j1 {
            let b = bias.map_or(0.0, |b| b[j]);
            let mut i = 0;
            while i < m {
                let mr = (m - i).min(4);
                // Accumulators: rows × k-unroll ≤ 8: enough independent FMA chains, and for
                // m = 1 a deep unroll keeps many loads of the stream in flight.
                match mr {
                    1 => row::<T, 1, 8>(y, x, w, k, n, i, j, b),
                    2 => row::<T, 2, 4>(y, x, w, k, n, i, j, b),
                    3 => row::<T, 3, 2>(y, x, w, k, n, i, j, b),
                    _ => row::<T, 4, 2>(y, x, w, k, n, i, j, b),
                }
                i += mr;
            }
        }
    }

    /// `y[i, j] = x[i, :]·W[j, :] + b` for `i` in `i0..i0+M`, with `U` accumulators per row.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row<T: Lane, const M: usize, const U: usize>(
        y: SharedOut,
        x: &[f32],
        w: &[T],
        k: usize,
        n: usize,
        i0: usize,
        j: usize,
        b: f32,
    ) {
        let wp = w.as_ptr().add(j * k);
        let xp = x.as_ptr().add(i0 * k);
        let mut acc = [[_mm256_setzero_ps(); U]; M];
        let step = 8 * U;
        let mut p = 0;
        while p + step <= k {
            for u in 0..U {
                // SAFETY: p + 8·U ≤ k, inside row j of W and rows i0.. of x.
                let wv = T::load8(wp.add(p + 8 * u));
                for (mi, a) in acc.iter_mut().enumerate() {
                    a[u] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(mi * k + p + 8 * u)), wv, a[u]);
                }
            }
            p += step;
        }
        while p + 8 <= k {
            let wv = T::load8(wp.add(p));
            for (mi, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(mi * k + p)), wv, a[0]);
            }
            p += 8;
        }
        for (mi, a) in acc.iter().enumerate() {
            let mut v = a[0];
            for au in &a[1..] {
                v = _mm256_add_ps(v, *au);
            }
            let mut s = hsum(v);
            for q in p..k {
                s += *xp.add(mi * k + q) * (*wp.add(q)).to_f32();
            }
            *y.get().add((i0 + mi) * n + j) = s + b;
        }
    }
}
