//! The prefill product for f16 and bf16 weights (more rows than
//! [`FLOAT_ONE_PASS_MAX_ROWS`](super::FLOAT_ONE_PASS_MAX_ROWS)): our own blocked GEMM with
//! AVX2/FMA, reading `W` in its 16 bits and widening it (F16C for f16, a shift for bf16) once
//! per call, straight into the layout the micro-kernel reads. The two formats differ only
//! in how 8 values are widened ([`Lane::load8`]).
//!
//! - `x` is packed once per call into panels of [`MR`] rows, [`KC`] values of `k` at a time
//!   (`k`-major inside a panel): one read of `x` serves every block of `W`.
//! - Each thread claims blocks of up to [`NC`] rows of `W` from a shared counter; for each
//!   [`KC`]-slice of `k` it widens the block into micro-panels of [`NR`] rows (or [`NR512`]),
//!   transposed so that one step of `k` is one micro-panel row of f32 (256 KiB at most: it
//!   stays in L2).
//! - The micro-kernel keeps a tile of `y` (6 rows of `x` × 16 rows of `W`) in 12 registers:
//!   per step of `k`, 2 loads of `W` and 6 broadcasts of `x` feed 12 FMAs. Where the CPU has
//!   AVX-512 the tile is 6 × [`NR512`] in 512-bit registers, the same 12 FMAs doing twice
//!   the work.
//!
//! Each output is one FMA chain over `k` in order, starting from the bias (or zero): the
//! sum of the scalar reference in the same order, with the bias added first.
//!
//! Why not the gemm crate on widened panels of `W`: it packed `x` again for every panel on
//! every thread (16 times per call at k = 8192); this kernel packs `x` once, in the order it
//! is stored, and reaches about 92% of the FMA peak at the 1B shapes
//! ([BENCHMARKS.md](../../../BENCHMARKS.md), Kernels). Broadcasting straight from unpacked
//! rows of `x` was slower; 12-row tiles and other `KC` were no better.

use crate::par::SharedOut;
use crate::simd::avx2::{transpose8, Lane};
use core::arch::x86_64::*;
use rayon::prelude::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Rows of `x` per micro-tile.
const MR: usize = 6;
/// Rows of `W` (columns of `y`) per micro-tile: two 8-lane vectors.
const NR: usize = 16;
/// Rows of `W` per micro-tile of the 512-bit kernel: two 16-lane vectors.
const NR512: usize = 32;
/// Values of `k` per slice: a packed panel of `x` (6 KiB) stays in L1 while the tile walks
/// the block of `W`.
const KC: usize = 256;
/// Most rows of `W` per block: the widened block, NC·KC f32 (256 KiB), stays in L2 next to
/// the tiles of `y` it updates.
const NC: usize = 256;

/// Most values of packed `x` per call (16 MiB of f32: 512 rows at k = 8192); taller `x` is
/// taken in chunks of rows, each widening `W` again (a small cost next to the chunk's FMAs).
const X_PACK_MAX_ELEMS: usize = 1 << 22;

thread_local! {
    /// The calling thread's packed `x`, reused across calls (taken out while in use, as
    /// `gemm_panels` does with its panel).
    static PACKED_X: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// True when this CPU runs [`gemm`]: AVX2, FMA and F16C (and not `QKV_ISA=scalar`).
pub(super) fn available() -> bool {
    crate::simd::isa().avx2_fma_f16c
}

/// `y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias)` for f16 or bf16 `W`, on the pool's threads. The shapes are
/// validated by the caller; [`available`] must be true.
pub(super) fn gemm<T: Lane>(
    y: &mut [f32],
    x: &[f32],
    w: &[T],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) {
    assert!(available(), "the 16-bit gemm needs AVX2, FMA and F16C");
    assert!(y.len() == m * n && x.len() == m * k && w.len() == n * k);
    assert!(bias.is_none_or(|b| b.len() == n));
    // Tall x runs in chunks of rows, so that its packed copy stays bounded (and in L3).
    let chunk = (X_PACK_MAX_ELEMS / k).max(16 * MR) / MR * MR;
    if m > chunk {
        for i0 in (0..m).step_by(chunk) {
            let rows = chunk.min(m - i0);
            let (ys, xs) = (&mut y[i0 * n..(i0 + rows) * n], &x[i0 * k..(i0 + rows) * k]);
            gemm(ys, xs, w, bias, rows, k, n);
        }
        return;
    }
    let panels = m.div_ceil(MR);
    let m_pad = panels * MR;
    let mut xp = PACKED_X.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if xp.len() < m_pad * k {
        xp.resize(m_pad * k, 0.0);
    }
    pack_x(&mut xp[..m_pad * k], x, m, k);

    if crate::simd::isa().prefer_512() {
        // SAFETY: AVX-512 F and VL are present (prefer_512 implies avx512), besides
        // AVX2/FMA/F16C.
        unsafe { run_blocks::<T, NR512>(y, &xp[..m_pad * k], w, bias, m, k, n) };
    } else {
        // SAFETY: AVX2/FMA/F16C are present (asserted above).
        unsafe { run_blocks::<T, NR>(y, &xp[..m_pad * k], w, bias, m, k, n) };
    }
    PACKED_X.with(|p| {
        let mut kept = p.borrow_mut();
        if kept.len() < xp.len() {
            *kept = xp;
        }
    });
}

/// The blocks of `W`, claimed from a shared counter by the pool's threads, each multiplied by
/// [`block_avx512`] when `R` is [`NR512`], else by [`block_avx2`] (`R` is [`NR`]).
///
/// # Safety
/// The CPU has the features of the block kernel taken; `xp` is `x` packed by [`pack_x`].
#[allow(clippy::too_many_arguments)]
unsafe fn run_blocks<T: Lane, const R: usize>(
    y: &mut [f32],
    xp_ref: &[f32],
    w: &[T],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) {
    let threads = rayon::current_num_threads();
    let nc = NC.min(n.div_ceil(threads).next_multiple_of(R));
    let blocks = n.div_ceil(nc);
    let next = AtomicUsize::new(0);
    let out = SharedOut(y.as_mut_ptr());
    let work = || {
        let mut wb = vec![0.0f32; nc.next_multiple_of(R) * KC];
        loop {
            let b = next.fetch_add(1, Ordering::Relaxed);
            if b >= blocks {
                break;
            }
            let j0 = b * nc;
            let j1 = (j0 + nc).min(n);
            // SAFETY: the kernel's features are present (the contract); this task alone
            // writes columns j0..j1 of y (blocks are claimed once each); the shapes were
            // asserted by the caller.
            unsafe {
                if R == NR512 {
                    block_avx512(out, xp_ref, w, bias, m, k, n, j0, j1, &mut wb)
                } else {
                    block_avx2(out, xp_ref, w, bias, m, k, n, j0, j1, &mut wb)
                }
            };
        }
    };
    if threads <= 1 || blocks <= 1 {
        work();
    } else {
        (0..threads.min(blocks))
            .into_par_iter()
            .for_each(|_| work());
    }
}

/// Packs `x[m, k]` into `xp` (`m_pad·k` values, `m_pad` = `m` rounded up to [`MR`]): for each
/// slice of [`KC`] values of `k` starting at `p0`, at offset `p0·m_pad`, the panels of [`MR`]
/// rows one after the other, each `kc × MR` (`k`-major), rows past `m` zero.
fn pack_x(xp: &mut [f32], x: &[f32], m: usize, k: usize) {
    const ZEROS: [f32; KC] = [0.0; KC];
    let panels = m.div_ceil(MR);
    let m_pad = panels * MR;
    debug_assert_eq!(xp.len(), m_pad * k);
    let out = SharedOut(xp.as_mut_ptr());
    let pack = |ip: usize| {
        let mut p0 = 0;
        while p0 < k {
            let kc = KC.min(k - p0);
            let base = p0 * m_pad + ip * MR * kc;
            // SAFETY: base + MR·kc ≤ (p0 + kc)·m_pad ≤ m_pad·k = xp.len(); each panel ip
            // writes only its own MR·kc values of each slice.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(base), MR * kc) };
            // Rows past m read as zeros.
            let rows: [&[f32]; MR] = core::array::from_fn(|r| {
                let i = ip * MR + r;
                if i < m {
                    &x[i * k + p0..][..kc]
                } else {
                    &ZEROS[..kc]
                }
            });
            // In the order of the packed panel, so the writes run sequentially.
            for (p, d) in dst.chunks_exact_mut(MR).enumerate() {
                for (d, row) in d.iter_mut().zip(&rows) {
                    *d = row[p];
                }
            }
            p0 += kc;
        }
    };
    if rayon::current_num_threads() > 1 && m * k >= 1 << 16 {
        (0..panels).into_par_iter().for_each(pack);
    } else {
        (0..panels).for_each(pack);
    }
}

/// Columns `j0..j1` of `y`: for each slice of `k`, rows `j0..j1` of `W` widened into `wb`,
/// then every tile of `x`'s panels against them.
///
/// # Safety
/// AVX2, FMA and F16C; `y` points to `m·n` floats whose columns `j0..j1` only this call
/// touches; `xp` is `x` packed by [`pack_x`]; `w` is `n·k`; `wb` holds at least
/// `(j1 − j0)` rounded up to the micro-tile's rows of `W` ([`NR`] here, [`NR512`] for
/// [`block_avx512`]) times [`KC`] values.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2<T: Lane>(
    y: SharedOut,
    xp: &[f32],
    w: &[T],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
    j0: usize,
    j1: usize,
    wb: &mut [f32],
) {
    // SAFETY: the contract, with this function's features.
    unsafe { block::<T, NR>(y, xp, w, bias, m, k, n, j0, j1, wb) }
}

/// [`block_avx2`] with micro-tiles of [`NR512`] rows of `W` in 512-bit vectors: half the
/// instructions per multiply-add, which CPUs that split 512-bit operations (Zen 4) also
/// turn into a higher rate, as the FMA probe shows (BENCHMARKS.md, Kernels).
///
/// # Safety
/// As [`block_avx2`], and AVX-512 F and VL.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn block_avx512<T: Lane>(
    y: SharedOut,
    xp: &[f32],
    w: &[T],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
    j0: usize,
    j1: usize,
    wb: &mut [f32],
) {
    // SAFETY: the contract, with this function's features.
    unsafe { block::<T, NR512>(y, xp, w, bias, m, k, n, j0, j1, wb) }
}

/// The body of [`block_avx2`] and [`block_avx512`], for micro-tiles of `R` rows of `W`.
///
/// # Safety
/// As theirs; inlined into them, it runs with their features.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block<T: Lane, const R: usize>(
    y: SharedOut,
    xp: &[f32],
    w: &[T],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
    j0: usize,
    j1: usize,
    wb: &mut [f32],
) {
    let panels = m.div_ceil(MR);
    let m_pad = panels * MR;
    let micro = (j1 - j0).div_ceil(R);
    debug_assert!(wb.len() >= micro * R * KC);
    let mut p0 = 0;
    while p0 < k {
        let kc = KC.min(k - p0);
        for jp in 0..micro {
            let jr = j0 + jp * R;
            // SAFETY: the micro-panel jp of wb holds kc·R values (wb's size, above); rows
            // jr.. of W lie in w (only those below j1 ≤ n are read).
            unsafe {
                pack_w::<T, R>(
                    &mut wb[jp * R * kc..(jp + 1) * R * kc],
                    w,
                    k,
                    jr,
                    j1,
                    p0,
                    kc,
                )
            };
        }
        let first = p0 == 0;
        for ip in 0..panels {
            let a = &xp[p0 * m_pad + ip * MR * kc..][..MR * kc];
            let i0 = ip * MR;
            let rows = MR.min(m - i0);
            for jp in 0..micro {
                let jr = j0 + jp * R;
                let cols = R.min(j1 - jr);
                let bp = &wb[jp * R * kc..][..R * kc];
                let mut init = [0.0f32; R];
                if let (true, Some(b)) = (first, bias) {
                    init[..cols].copy_from_slice(&b[jr..jr + cols]);
                }
                // SAFETY: rows i0..i0 + rows < m and columns jr..jr + cols ≤ j1 of y are
                // inside y and this call's own (the contract).
                unsafe {
                    let c = y.get().add(i0 * n + jr);
                    if rows == MR && cols == R {
                        tile::<R>(kc, a, bp, c, n, !first, &init);
                    } else {
                        // A ragged tile runs on a full-size copy, then writes back its part.
                        let mut t = [0.0f32; MR * NR512];
                        if !first {
                            for r in 0..rows {
                                for q in 0..cols {
                                    t[r * R + q] = *c.add(r * n + q);
                                }
                            }
                        }
                        tile::<R>(kc, a, bp, t.as_mut_ptr(), R, !first, &init);
                        for r in 0..rows {
                            for q in 0..cols {
                                *c.add(r * n + q) = t[r * R + q];
                            }
                        }
                    }
                }
            }
        }
        p0 += kc;
    }
}

/// Widens rows `jr..jr + R` (those below `j_end`; the rest zero) and values `p0..p0 + kc` of
/// `W[n, k]` into `dst` (`kc·R`), `k`-major: `dst[p·R + c] = W[jr + c, p0 + p]`.
///
/// # Safety
/// AVX2 and F16C; rows `jr..min(jr + R, j_end)` of `w` exist, `p0 + kc ≤ k`.
#[inline(always)]
unsafe fn pack_w<T: Lane, const R: usize>(
    dst: &mut [f32],
    w: &[T],
    k: usize,
    jr: usize,
    j_end: usize,
    p0: usize,
    kc: usize,
) {
    debug_assert_eq!(dst.len(), kc * R);
    let full = jr + R <= j_end;
    let mut p = 0;
    if full {
        // Eight rows by eight values at a time: widened, then transposed in registers.
        while p + 8 <= kc {
            for part in 0..R / 8 {
                // SAFETY: rows jr + 8·half + r < j_end ≤ n and values p0 + p..p0 + p + 8 ≤ k
                // lie inside w; the stores write dst[(p + q)·R + 8·half..+8] < kc·R.
                unsafe {
                    let mut rows = [_mm256_setzero_ps(); 8];
                    for (r, v) in rows.iter_mut().enumerate() {
                        *v = T::load8(w.as_ptr().add((jr + 8 * part + r) * k + p0 + p));
                    }
                    let t = transpose8(rows);
                    for (q, v) in t.iter().enumerate() {
                        _mm256_storeu_ps(dst.as_mut_ptr().add((p + q) * R + 8 * part), *v);
                    }
                }
            }
            p += 8;
        }
    }
    for p in p..kc {
        for c in 0..R {
            let j = jr + c;
            dst[p * R + c] = if j < j_end {
                w[j * k + p0 + p].to_f32()
            } else {
                0.0
            };
        }
    }
}

/// The micro-kernel: `c[r, q] = init + Σ_p a[p·MR + r] · b[p·R + q]` over `p < kc` for the
/// 6 × `R` tile at `c` (row stride `ldc`), where `init` is `c` itself when `load`, else
/// `bias`. `R` is [`NR`] (256-bit vectors) or [`NR512`] (512-bit).
///
/// # Safety
/// AVX2 and FMA (and AVX-512 F when `R` is [`NR512`]); `a` holds `kc·MR` values, `b` `kc·R`,
/// and `c` 6 rows of `R` writable floats at stride `ldc`.
#[inline(always)]
unsafe fn tile<const R: usize>(
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: *mut f32,
    ldc: usize,
    load: bool,
    bias: &[f32; R],
) {
    debug_assert!(a.len() >= kc * MR && b.len() >= kc * R);
    // SAFETY: the loads read a[p·MR + r] and b[p·R..+R] for p < kc (inside the slices);
    // c's rows are the contract.
    unsafe {
        if R == NR512 {
            let mut acc = [[_mm512_setzero_ps(); 2]; MR];
            if load {
                for (r, acc) in acc.iter_mut().enumerate() {
                    acc[0] = _mm512_loadu_ps(c.add(r * ldc));
                    acc[1] = _mm512_loadu_ps(c.add(r * ldc + 16));
                }
            } else {
                let b0 = _mm512_loadu_ps(bias.as_ptr());
                let b1 = _mm512_loadu_ps(bias.as_ptr().add(16));
                for acc in acc.iter_mut() {
                    *acc = [b0, b1];
                }
            }
            let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
            for _ in 0..kc {
                let b0 = _mm512_loadu_ps(bp);
                let b1 = _mm512_loadu_ps(bp.add(16));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(r));
                    acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
                }
                ap = ap.add(MR);
                bp = bp.add(R);
            }
            for (r, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(c.add(r * ldc), acc[0]);
                _mm512_storeu_ps(c.add(r * ldc + 16), acc[1]);
            }
            return;
        }
        debug_assert_eq!(R, NR);
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        if load {
            for (r, acc) in acc.iter_mut().enumerate() {
                acc[0] = _mm256_loadu_ps(c.add(r * ldc));
                acc[1] = _mm256_loadu_ps(c.add(r * ldc + 8));
            }
        } else {
            let b0 = _mm256_loadu_ps(bias.as_ptr());
            let b1 = _mm256_loadu_ps(bias.as_ptr().add(8));
            for acc in acc.iter_mut() {
                *acc = [b0, b1];
            }
        }
        let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
        for _ in 0..kc {
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(r));
                acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
            }
            ap = ap.add(MR);
            bp = bp.add(R);
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(c.add(r * ldc), acc[0]);
            _mm256_storeu_ps(c.add(r * ldc + 8), acc[1]);
        }
    }
}
