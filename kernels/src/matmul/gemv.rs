//! The decode GEMV (`m ≤` [`GEMV_MAX_ROWS`](super::GEMV_MAX_ROWS)): every weight byte is
//! read once per call, the rows of `W` split across the pool's threads.
//!
//! f32, f16 and bf16 rows are streamed with f32 FMAs (f16 and bf16 widened in registers,
//! exactly, so bf16 gets the bits of the same values stored in f32). bf16 takes 512-bit
//! registers where [`crate::simd::Isa::prefer_512`] says so, two rows of `W` to a register,
//! with the bits of the 256-bit kernel. Quantized rows
//! go to [`crate::quant::gemv`] or [`crate::quant::x8`], after `x` is quantized to integers
//! per block of 32 (once per call, before the split, at each precision the matrices read:
//! [`Weights::act_precision`]); the kernels take integer dot products per block.

use super::Weights;
use crate::par::SharedOut;
use crate::quant::act::{ActPrecision, QuantizedActs};
use std::cell::RefCell;

/// Weights per piece of the parallel GEMV: 128 Ki elements (64 rows of 2048), 72 KiB of
/// Q4_0, 256 KiB of f16: small enough that the last pieces balance the threads, large enough
/// that claiming one costs nothing next to streaming it.
const GEMV_PIECE_ELEMS: usize = 1 << 17;

/// Minimum `n·k` below which the GEMV stays on one thread: smaller matrices finish before a
/// hand-off to another thread would pay for itself.
const GEMV_PAR_MIN_ELEMS: usize = 1 << 15;

/// One matrix of a GEMV group: its weights, bias, rows and output.
#[derive(Clone, Copy)]
pub(super) struct GemvPart<'a> {
    pub(super) w: Weights<'a>,
    pub(super) bias: Option<&'a [f32]>,
    pub(super) n: usize,
    pub(super) y: SharedOut,
}

impl GemvPart<'_> {
    /// A part with no rows, to fill unused slots of a group.
    pub(super) const EMPTY: GemvPart<'static> = GemvPart {
        w: Weights::F32(&[]),
        bias: None,
        n: 0,
        y: SharedOut(std::ptr::null_mut()),
    };
}

pub(super) fn gemv(
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

thread_local! {
    /// The calling thread's current GEMV's activations at 16 bits.
    static WIDE: RefCell<QuantizedActs> = RefCell::new(QuantizedActs::default());
    /// And at 8 bits.
    static BYTE: RefCell<QuantizedActs> = RefCell::new(QuantizedActs::default());
}

/// `x` quantized at each precision the parts of a group read ([`Weights::act_precision`]).
#[derive(Clone, Copy, Default)]
struct Acts<'a> {
    wide: Option<&'a QuantizedActs>,
    byte: Option<&'a QuantizedActs>,
}

impl<'a> Acts<'a> {
    /// The activations `w` reads, if it is quantized.
    fn of(&self, w: Weights<'_>) -> Option<&'a QuantizedActs> {
        match w.act_precision()? {
            ActPrecision::Wide => self.wide,
            ActPrecision::Byte => self.byte,
        }
    }
}

/// The GEMV over a group of matrices sharing `x`: their rows, end to end, are one range split
/// across the threads. Each part's `y` must be `m·n` long (validated by the callers).
pub(super) fn gemv_parts(parts: &[GemvPart<'_>], x: &[f32], m: usize, k: usize) {
    // Quantized parts read x as integers, at their precision: quantized once here for each
    // precision the group needs, before the split.
    let needs = |p: ActPrecision| parts.iter().any(|part| part.w.act_precision() == Some(p));
    // Interleaved 4-bit parts read the 16-bit integers' byte split, for however many rows
    // there are.
    let split = parts
        .iter()
        .any(|p| matches!(p.w, Weights::QuantX8(f, _, _) if crate::quant::x8::reads_tiles(f)));
    let run = |acts: Acts<'_>| gemv_parts_with(parts, x, acts, m, k);
    let wide = |f: &dyn Fn(&QuantizedActs)| with_quantized(x, m, k, ActPrecision::Wide, split, f);
    let byte = |f: &dyn Fn(&QuantizedActs)| with_quantized(x, m, k, ActPrecision::Byte, true, f);
    match (needs(ActPrecision::Wide), needs(ActPrecision::Byte)) {
        (false, false) => run(Acts::default()),
        (true, false) => wide(&|w| {
            run(Acts {
                wide: Some(w),
                byte: None,
            })
        }),
        (false, true) => byte(&|b| {
            run(Acts {
                wide: None,
                byte: Some(b),
            })
        }),
        (true, true) => wide(&|w| {
            byte(&|b| {
                run(Acts {
                    wide: Some(w),
                    byte: Some(b),
                })
            })
        }),
    }
}

/// Runs `f` on `x[m, k]` quantized per block of 32 at `precision` (with the byte split for
/// any `m` when `split`: [`QuantizedActs::add_split`]), in the calling thread's reused
/// buffers for that precision. They are taken out of the thread-local (not borrowed) for
/// the reason `gemm_panels` gives, and put back afterwards unless a larger set was put back
/// meanwhile.
pub(super) fn with_quantized<R>(
    x: &[f32],
    m: usize,
    k: usize,
    precision: ActPrecision,
    split: bool,
    f: impl FnOnce(&QuantizedActs) -> R,
) -> R {
    let slot = match precision {
        ActPrecision::Wide => &WIDE,
        ActPrecision::Byte => &BYTE,
    };
    let mut acts = slot.with(|a| std::mem::take(&mut *a.borrow_mut()));
    acts.quantize_validated(x, m, k, precision);
    if split {
        acts.add_split();
    }
    let out = f(&acts);
    slot.with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.q.capacity() < acts.q.capacity() {
            *kept = acts;
        }
    });
    out
}

fn gemv_parts_with(parts: &[GemvPart<'_>], x: &[f32], acts: Acts<'_>, m: usize, k: usize) {
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
                unsafe {
                    gemv_columns(
                        p.y,
                        x,
                        acts.of(p.w),
                        p.w,
                        p.bias,
                        m,
                        k,
                        p.n,
                        a - base,
                        b - base,
                    )
                };
            }
            base += p.n;
        }
    };
    let threads = rayon::current_num_threads();
    if threads <= 1 || total_elems < GEMV_PAR_MIN_ELEMS {
        run(0, total);
        return;
    }
    // Pieces of about GEMV_PIECE_ELEMS weights (whole groups of 8 rows), each thread taking
    // its own contiguous run of them in order and then what is left of the others' from
    // their ends ([`crate::par::runs`]): each thread streams one range of W, and a thread the
    // OS delays simply takes fewer. Small matrices still get at least 4 pieces per thread,
    // so the last ones balance. Every output is computed whole by one thread, so the split
    // never changes a result.
    let per = (GEMV_PIECE_ELEMS / k.max(1))
        .min(total.div_ceil(4 * threads))
        .max(8)
        .next_multiple_of(8);
    crate::par::runs(total.div_ceil(per), threads, |t| {
        run(t * per, ((t + 1) * per).min(total))
    });
}

/// Columns `j0..j1` of `y[m, n] = x[m, k]·Wᵀ (+ b)`.
///
/// # Safety
/// `y` must point to `m·n` writable floats, of which no one else reads or writes columns
/// `j0..j1` during the call; `x` is m·k, `w` n·k, `j1 ≤ n`; `acts` is `x` quantized at
/// [`Weights::act_precision`] when `w` is quantized.
#[allow(clippy::too_many_arguments)]
unsafe fn gemv_columns(
    y: SharedOut,
    x: &[f32],
    acts: Option<&QuantizedActs>,
    w: Weights<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
    j0: usize,
    j1: usize,
) {
    if let Weights::Quant(format, bytes) = w {
        let acts = acts.expect("gemv_parts quantizes x for quantized parts");
        // SAFETY: this function's contract, and `bytes` holds n rows of k (validated).
        unsafe { crate::quant::gemv::columns(y, acts, format, bytes, bias, n, j0, j1) };
        return;
    }
    if let Weights::QuantX8(format, _, bytes) = w {
        let acts = acts.expect("gemv_parts quantizes x for quantized parts");
        // SAFETY: this function's contract; `bytes` holds n interleaved rows of k
        // (validated), and `gemv_parts` gave `acts` its tiles for interleaved 4-bit parts
        // (the byte split at 16 bits; the bytes, always there at 8).
        unsafe { crate::quant::x8::columns(y, acts, format, bytes, bias, n, j0, j1) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let (Weights::BF16(w), true) = (w, crate::simd::isa().prefer_512()) {
        // SAFETY: the CPU has AVX-512 F/BW/VL besides AVX2, FMA and F16C (`prefer_512`
        // implies them all); the bounds and the exclusive columns are this function's
        // contract.
        unsafe { gemv_avx512::columns(y, x, w, bias, m, k, n, j0, j1) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above); the bounds and the
        // exclusive columns are this function's contract.
        unsafe {
            match w {
                Weights::F32(w) => gemv_avx2::columns(y, x, w, bias, m, k, n, j0, j1),
                Weights::F16(w) => gemv_avx2::columns(y, x, w, bias, m, k, n, j0, j1),
                Weights::BF16(w) => gemv_avx2::columns(y, x, w, bias, m, k, n, j0, j1),
                Weights::Quant(..) | Weights::QuantX8(..) => unreachable!("handled above"),
                Weights::F32T(_) => unreachable!("F32T always goes to gemm (`plan`)"),
            }
        }
        return;
    }
    let get = |i: usize| match w {
        Weights::F32(w) => w[i],
        Weights::F16(w) => w[i].to_f32(),
        Weights::BF16(w) => f32::from_bits(u32::from(w[i].to_bits()) << 16),
        Weights::Quant(..) | Weights::QuantX8(..) => unreachable!("handled above"),
        Weights::F32T(_) => unreachable!("F32T always goes to gemm (`plan`)"),
    };
    for j in j0..j1 {
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            let mut acc = 0.0f32;
            for (p, &xv) in xr.iter().enumerate() {
                acc += xv * get(j * k + p);
            }
            // SAFETY: i < m and j < j1 ≤ n: inside y, in this call's own columns.
            unsafe { *y.get().add(i * n + j) = acc + bias.map_or(0.0, |b| b[j]) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod gemv_avx2 {
    use crate::par::SharedOut;
    use crate::simd::avx2::{hsum, prefetch_far, Lane, FAR_AHEAD};
    use core::arch::x86_64::*;

    /// Columns `j0..j1` of `y[m, n] = x[m, k]·Wᵀ (+ b)`: 3 rows of `W` at a time against 4
    /// rows of `x` ([`tile`]), 12 accumulators in registers, so each 8 weights loaded (and
    /// widened, for f16) serve 4 rows of `x` and each 8 activations 3 rows of `W`.
    ///
    /// One row of `x` (decode) takes the same tiles, 1 row high: every output is one
    /// accumulator over `k` in steps of 8, summed across its lanes, then the tail, whatever
    /// the tile's height, so a row's bits never depend on the rows that share its call (a
    /// verify pass, a batched step). The 3 rows of `W` give 3 independent chains of FMAs.
    ///
    /// `W` goes in blocks of [`w_block_rows`] rows (about 48 KiB): every 4 rows of `x` meet
    /// the whole block before the next 4 do, so the block is read from memory once per call
    /// and from cache for the other rows of `x`, and each 4 rows of `x` stay in L1 across the
    /// block rather than being streamed again for every 3 rows of `W`.
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
        let block = w_block_rows(k, size_of::<T>());
        let mut jb = j0;
        while jb < j1 {
            let je = (jb + block).min(j1);
            let mut i = 0;
            while i < m {
                let mr = (m - i).min(4);
                let mut j = jb;
                while j < je {
                    let nc = (je - j).min(3);
                    macro_rules! go {
                        ($($r:literal, $c:literal);*) => {
                            match (mr, nc) {
                                $(($r, $c) => tile::<T, $r, $c>(y, x, w, bias, k, n, i, j),)*
                                _ => unreachable!("1 ≤ mr ≤ 4 and 1 ≤ nc ≤ 3"),
                            }
                        };
                    }
                    // SAFETY: i + mr ≤ m and j + nc ≤ je ≤ j1 ≤ n; the rest is the contract.
                    unsafe {
                        go!(1, 1; 1, 2; 1, 3; 2, 1; 2, 2; 2, 3; 3, 1; 3, 2; 3, 3; 4, 1; 4, 2; 4, 3)
                    };
                    j += nc;
                }
                i += mr;
            }
            jb = je;
        }
    }

    /// Rows of `W` per block of [`columns`]: a multiple of 3 (the tile's width), as many as
    /// fit in [`W_BLOCK_BYTES`] for rows of `k` elements of `size` bytes, and at least 3.
    fn w_block_rows(k: usize, size: usize) -> usize {
        (W_BLOCK_BYTES / (k * size).max(1)).max(3) / 3 * 3
    }

    /// The bytes of `W` in a block of [`columns`]: with 4 rows of `x` (9 KiB at k = 576) it
    /// stays within L1 and L2's nearest reach (24 to 96 KiB ran alike).
    const W_BLOCK_BYTES: usize = 48 << 10;

    /// `y[i0 + r, j0 + c] = x[i0 + r, :]·W[j0 + c, :] + b[j0 + c]` for `r < R`, `c < C`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `x` holds rows `i0..i0 + R` of `k`, `w` rows `j0..j0 + C` of `k`,
    /// and `y` points to `m·n` floats whose columns `j0..j0 + C` only this call touches, with
    /// `i0 + R ≤ m` and `j0 + C ≤ n`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<T: Lane, const R: usize, const C: usize>(
        y: SharedOut,
        x: &[f32],
        w: &[T],
        bias: Option<&[f32]>,
        k: usize,
        n: usize,
        i0: usize,
        j0: usize,
    ) {
        // SAFETY: every vector load reads 8 values at `p < k` with `p + 8 ≤ k` inside rows
        // j0..j0 + C of W and i0..i0 + R of x; the tail reads `q < k`; the stores write this
        // call's own columns (the contract).
        unsafe {
            let wp = w.as_ptr().add(j0 * k);
            let xp = x.as_ptr().add(i0 * k);
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            let ahead = (wp as *const u8).wrapping_add(FAR_AHEAD);
            let mut p = 0;
            while p + 8 <= k {
                let mut wv = [_mm256_setzero_ps(); C];
                // Rows j0..j0 + C of W lie back to back, and the tiles of a block follow
                // each other through them: one stream, asked for FAR_AHEAD bytes ahead into
                // L2 at the rate it is read (C·8 weights per step: one line for f16, two for
                // f32). This replaced a prefetch of each row 1024 elements ahead into L1,
                // which left the tile waiting on memory.
                for line in (0..C * 8 * size_of::<T>()).step_by(64) {
                    prefetch_far(ahead.wrapping_add(C * size_of::<T>() * p + line));
                }
                for (c, v) in wv.iter_mut().enumerate() {
                    *v = T::load8(wp.add(c * k + p));
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(xp.add(r * k + p));
                    for (a, v) in a.iter_mut().zip(&wv) {
                        *a = _mm256_fmadd_ps(xv, *v, *a);
                    }
                }
                p += 8;
            }
            for (r, a) in acc.iter().enumerate() {
                for (c, a) in a.iter().enumerate() {
                    let mut s = hsum(*a);
                    for q in p..k {
                        s += *xp.add(r * k + q) * (*wp.add(c * k + q)).to_f32();
                    }
                    let b = bias.map_or(0.0, |b| b[j0 + c]);
                    *y.get().add((i0 + r) * n + j0 + c) = s + b;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod gemv_avx512 {
    //! bf16 rows in 512-bit registers, with the bits of the AVX2 kernel (and so of the same
    //! values in f32): each 512-bit accumulator holds two rows of `W` side by side, each in
    //! its own 8 lanes, where the AVX2 kernel holds one row in a 256-bit accumulator. Lane
    //! `l` of a row still sums the products of `k ≡ l (mod 8)` in order with FMAs, the two
    //! halves are summed across their lanes as `hsum` does, then the tail and the bias are
    //! added as there: only the instructions per multiply-add are halved.
    use crate::par::SharedOut;
    use crate::simd::avx2::{hsum, prefetch_far, FAR_AHEAD};
    use core::arch::x86_64::*;
    use half::bf16;

    /// Columns `j0..j1` of `y[m, n] = x[m, k]·Wᵀ (+ b)` for bf16 `W`: 6 rows of `W` (3 pairs)
    /// at a time against 4 rows of `x` ([`tile`]), 12 accumulators, in blocks of `W` of
    /// about [`W_BLOCK_BYTES`] that every 4 rows of `x` meet in turn, as the AVX2 kernel
    /// walks them.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL must be available; `y` points to m·n floats whose
    /// columns `j0..j1` only this call touches, `x` is m·k, `w` n·k, `j1 ≤ n`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn columns(
        y: SharedOut,
        x: &[f32],
        w: &[bf16],
        bias: Option<&[f32]>,
        m: usize,
        k: usize,
        n: usize,
        j0: usize,
        j1: usize,
    ) {
        debug_assert!(x.len() == m * k && w.len() == n * k && j1 <= n);
        let block = (W_BLOCK_BYTES / (2 * k).max(1)).max(6) / 6 * 6;
        let mut jb = j0;
        while jb < j1 {
            let je = (jb + block).min(j1);
            let mut i = 0;
            while i < m {
                let mr = (m - i).min(4);
                let mut j = jb;
                while j < je {
                    let nc = (je - j).min(6);
                    macro_rules! go {
                        ($($r:literal, $p:literal);*) => {
                            match (mr, nc.div_ceil(2)) {
                                $(($r, $p) => tile::<$r, $p>(y, x, w, bias, k, n, i, j, nc),)*
                                _ => unreachable!("1 ≤ mr ≤ 4 and 1 ≤ pairs ≤ 3"),
                            }
                        };
                    }
                    // SAFETY: i + mr ≤ m and j + nc ≤ je ≤ j1 ≤ n; the rest is the contract.
                    unsafe {
                        go!(1, 1; 1, 2; 1, 3; 2, 1; 2, 2; 2, 3; 3, 1; 3, 2; 3, 3; 4, 1; 4, 2; 4, 3)
                    };
                    j += nc;
                }
                i += mr;
            }
            jb = je;
        }
    }

    /// The bytes of `W` in a block of [`columns`], as in the AVX2 kernel.
    const W_BLOCK_BYTES: usize = 48 << 10;

    /// `y[i0 + r, j0 + c] = x[i0 + r, :]·W[j0 + c, :] + b[j0 + c]` for `r < R`, `c < nc`,
    /// `nc` being `2·P` or `2·P − 1` (the last pair then reads its one row twice and keeps
    /// one result).
    ///
    /// # Safety
    /// As [`columns`]' features; `x` holds rows `i0..i0 + R` of `k`, `w` rows
    /// `j0..j0 + nc` of `k`, and `y` points to `m·n` floats whose columns `j0..j0 + nc`
    /// only this call touches, with `i0 + R ≤ m` and `j0 + nc ≤ n`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const P: usize>(
        y: SharedOut,
        x: &[f32],
        w: &[bf16],
        bias: Option<&[f32]>,
        k: usize,
        n: usize,
        i0: usize,
        j0: usize,
        nc: usize,
    ) {
        debug_assert!(nc == 2 * P || nc + 1 == 2 * P);
        // SAFETY: every load reads 8 values at `p` with `p + 8 ≤ k` of rows j0..j0 + nc of
        // W (the pairs' second rows are clamped to the last) and i0..i0 + R of x; the tail
        // reads `q < k`; the stores write this call's own columns (the contract).
        unsafe {
            let wp = w.as_ptr().add(j0 * k);
            let xp = x.as_ptr().add(i0 * k);
            let rows: [[*const bf16; 2]; P] =
                core::array::from_fn(|q| [wp.add(2 * q * k), wp.add((2 * q + 1).min(nc - 1) * k)]);
            let mut acc = [[_mm512_setzero_ps(); P]; R];
            let ahead = (wp as *const u8).wrapping_add(FAR_AHEAD);
            let mut p = 0;
            while p + 8 <= k {
                // The block's rows lie back to back: one stream, asked for ahead at the rate
                // it is read (nc·8 weights per step), as in the AVX2 kernel.
                for line in (0..nc * 16).step_by(64) {
                    prefetch_far(ahead.wrapping_add(nc * 2 * p + line));
                }
                let mut wv = [_mm512_setzero_ps(); P];
                for (v, [a, b]) in wv.iter_mut().zip(&rows) {
                    let lo = _mm_loadu_si128(a.add(p) as *const __m128i);
                    let hi = _mm_loadu_si128(b.add(p) as *const __m128i);
                    let h = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi);
                    *v = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    // The same 8 values of x in both halves.
                    let xv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(
                        xp.add(r * k + p) as *const f64,
                    )));
                    for (a, v) in a.iter_mut().zip(&wv) {
                        *a = _mm512_fmadd_ps(xv, *v, *a);
                    }
                }
                p += 8;
            }
            for (r, a) in acc.iter().enumerate() {
                for (q, a) in a.iter().enumerate() {
                    let halves = [
                        _mm512_castps512_ps256(*a),
                        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a))),
                    ];
                    for (h, half) in halves.iter().enumerate() {
                        let c = 2 * q + h;
                        if c >= nc {
                            break;
                        }
                        let mut s = hsum(*half);
                        for t in p..k {
                            let wt =
                                f32::from_bits(u32::from((*wp.add(c * k + t)).to_bits()) << 16);
                            s += *xp.add(r * k + t) * wt;
                        }
                        let b = bias.map_or(0.0, |b| b[j0 + c]);
                        *y.get().add((i0 + r) * n + j0 + c) = s + b;
                    }
                }
            }
        }
    }
}
