//! The quantized GEMV with 256-bit vectors (AVX2, FMA, F16C), on the frame of
//! [`crate::quant::frame`], and the per-ISA step ([`Isa`]) the 512-bit kernel also fills in.
//!
//! A row of `W` is taken in chunks of up to [`CHUNK`] groups of 32. Per chunk:
//!
//! 1. **Scales.** The blocks' f16 scales (and minimums) are gathered into small arrays and
//!    widened 8 at a time with F16C ([`Format::scales`]); then, per row `i` of `x`, the
//!    products `S = xs·a` of the activation and weight scales are formed 8 at a time, and the
//!    constant terms `Σ c·Σx` summed with vector FMAs. This touches only a few bytes of each
//!    block, which the next step reads from L1 anyway.
//! 2. **Integers.** Each group's weights are unpacked once into 16-bit integers
//!    ([`Unpack`]) and multiplied with up to 4 rows of `xq` (`madd`: 32 products summed in
//!    pairs into i32 lanes, never across groups), the lanes converted to f32 and fused into
//!    the row's f32 accumulator with the group's scale `S` broadcast from the array. Groups
//!    alternate between two accumulators per row so that consecutive FMAs do not wait on
//!    each other.
//!
//! The instruction-set-specific parts are the [`Isa`] (how a group meets a row of `xq`) and
//! the [`Unpack`] implementations; [`columns_with`] is the pass over the chunks, inlined
//! into each ISA's `#[target_feature]` entry point.

use crate::par::SharedOut;
use crate::quant::act::{QuantizedActs, ACT_BLOCK};
use crate::quant::frame::{Chunk, Format, Sink, Unpack, CHUNK, ROWS, W2};
use core::arch::x86_64::*;

/// The instruction-set-specific step: one unpacked group against one row of `xq`.
pub(super) trait Isa {
    /// One group's 32 integers, unpacked.
    type W: Copy;
    /// A row's f32 accumulator.
    type Acc: Copy;
    /// A zero accumulator.
    ///
    /// # Safety
    /// The CPU has this ISA's features.
    unsafe fn zero() -> Self::Acc;
    /// `acc + Σ_e w[e]·x[e]·s[e / 16]` (`s[0]` only unless `halves`).
    ///
    /// # Safety
    /// `x` points to 32 readable i16, `s` to 1 (2 with `halves`) f32; the CPU has this ISA.
    unsafe fn group(
        acc: Self::Acc,
        w: Self::W,
        x: *const i16,
        s: *const f32,
        halves: bool,
    ) -> Self::Acc;
    /// The sum of all lanes of `a + b`.
    ///
    /// # Safety
    /// The CPU has this ISA.
    unsafe fn hsum2(a: Self::Acc, b: Self::Acc) -> f32;
}

/// Columns `j0..j1` of `y[m, n] = x·Wᵀ (+ b)` for format `F` with instruction set `I`.
///
/// # Safety
/// The CPU has `I`'s features (and AVX2, FMA, F16C); the rest as
/// `super::columns_scalar`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn columns_with<I: Isa, F: Unpack<I::W>>(
    y: SharedOut,
    acts: &QuantizedActs,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    let m = acts.m;
    let row_bytes = acts.k / F::BE * F::BB;
    debug_assert!(j1 <= n && w.len() >= n * row_bytes && m <= super::MAX_ROWS);
    // The activations' integer sums per 16, for a constant per 16 (Q2_K): `quantize` leaves
    // them for the few rows a GEMV takes; made here otherwise.
    let made;
    let half: &[i32] = if F::MIN16 && acts.isum16.len() != m * acts.k / 16 {
        made = crate::quant::frame::half_sums(&acts.q);
        &made
    } else {
        &acts.isum16
    };
    let mut ch = Chunk::new();
    for j in j0..j1 {
        // SAFETY: j < n, so the row lies inside w (the caller's contract).
        let row = unsafe { w.as_ptr().add(j * row_bytes) };
        let b = bias.map_or(0.0, |b| b[j]);
        let mut i0 = 0;
        while i0 < m {
            let mr = (m - i0).min(ROWS);
            // SAFETY: rows i0..i0+mr of x exist; the rest is this function's contract.
            unsafe {
                match mr {
                    1 => pass::<I, F, 1>(y, acts, half, row, &mut ch, n, j, i0, b),
                    2 => pass::<I, F, 2>(y, acts, half, row, &mut ch, n, j, i0, b),
                    3 => pass::<I, F, 3>(y, acts, half, row, &mut ch, n, j, i0, b),
                    _ => pass::<I, F, 4>(y, acts, half, row, &mut ch, n, j, i0, b),
                }
            }
            i0 += mr;
        }
    }
}

/// `y[i, j]` for the `M` rows `i0..i0 + M` of `x` and one row `row` of `W`.
///
/// # Safety
/// As [`columns_with`]; `row` is row `j` of `W`, `i0 + M ≤ m`; with [`Format::MIN16`],
/// `half` holds the `m·k / 16` sums of the activations' integers per 16.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pass<I: Isa, F: Unpack<I::W>, const M: usize>(
    y: SharedOut,
    acts: &QuantizedActs,
    half: &[i32],
    row: *const u8,
    ch: &mut Chunk,
    n: usize,
    j: usize,
    i0: usize,
    b: f32,
) {
    // SAFETY: the caller has the features and the shapes (this function's contract):
    // `row` holds `k / BE` blocks, read a chunk of `nb` blocks at a time from block `b0`;
    // activation scales and sums are read at `(i0 + r)·bpr + g0 + t` with `t < ng`, and the
    // integers at row `i0 + r`, group `g0 + g < k / 32`, all inside `acts` for rows `< m`; the
    // `Chunk` arrays hold `CHUNK ≥ ng` groups.
    unsafe {
        let k = acts.k;
        let bpr = acts.blocks_per_row();
        let nblocks = k / F::BE;
        let gpb = F::BE / ACT_BLOCK;
        let per_chunk = CHUNK / gpb;
        let mut acc0 = [I::zero(); M];
        let mut acc1 = [I::zero(); M];
        let mut cv = [_mm256_setzero_ps(); M];
        let mut cs = [0.0f32; M];
        let (xq, xs, xsum) = (acts.q.as_ptr(), acts.scale.as_ptr(), acts.sum.as_ptr());
        let mut b0 = 0;
        while b0 < nblocks {
            let nb = per_chunk.min(nblocks - b0);
            let (g0, ng) = (b0 * gpb, nb * gpb);
            let p = row.add(b0 * F::BB);
            F::scales(p, nb, ch);
            for r in 0..M {
                let at = (i0 + r) * bpr + g0;
                combine::<F>(xs.add(at), ch, r, ng);
                if F::MIN {
                    constants(xsum.add(at), &ch.c, ng, &mut cv[r], &mut cs[r]);
                }
                if F::MIN16 {
                    let h = half.as_ptr().add(2 * at);
                    constants16(xs.add(at), h, &ch.c, ng, &mut cv[r], &mut cs[r]);
                }
            }
            let mut x = [xq; M];
            for (r, xr) in x.iter_mut().enumerate() {
                *xr = xq.add((i0 + r) * k + g0 * ACT_BLOCK);
            }
            let mut sink = Groups::<I, M> {
                acc0,
                acc1,
                x,
                s: &ch.s,
                base: 0,
                halves: F::HALVES,
            };
            if gpb == 1 {
                // One group per block: alternate the accumulators by block.
                let mut bi = 0;
                while bi + 2 <= nb {
                    sink.base = bi;
                    F::block(p.add(bi * F::BB), &mut sink);
                    sink.base = bi + 1;
                    F::block(p.add((bi + 1) * F::BB), &mut Odd(&mut sink));
                    bi += 2;
                }
                if bi < nb {
                    sink.base = bi;
                    F::block(p.add(bi * F::BB), &mut sink);
                }
            } else {
                for bi in 0..nb {
                    sink.base = bi * gpb;
                    F::block(p.add(bi * F::BB), &mut sink);
                }
            }
            (acc0, acc1) = (sink.acc0, sink.acc1);
            b0 += nb;
        }
        for r in 0..M {
            let mut v = I::hsum2(acc0[r], acc1[r]);
            if F::MIN || F::MIN16 {
                v += crate::simd::avx2::hsum(cv[r]) + cs[r];
            }
            // i0 + r < m and j < n: inside y, in this call's own column j.
            *y.get().add((i0 + r) * n + j) = v + b;
        }
    }
}

/// The accumulators of a pass: groups of the chunk meet `M` rows of `xq`.
struct Groups<'a, I: Isa, const M: usize> {
    acc0: [I::Acc; M],
    acc1: [I::Acc; M],
    /// Row `r`'s quantized activations at the chunk's first group.
    x: [*const i16; M],
    /// `xs·a` per row, group (or half-group) of the chunk.
    s: &'a [[f32; 2 * CHUNK]; ROWS],
    /// The current block's first group within the chunk.
    base: usize,
    halves: bool,
}

impl<I: Isa, const M: usize> Sink<I::W> for Groups<'_, I, M> {
    #[inline(always)]
    unsafe fn group(&mut self, g: usize, odd: bool, w: I::W) {
        // SAFETY: the caller has the ISA (the trait's contract); `x[r]` points at the chunk's
        // first group of row `r` and `base + g` is a group of this chunk, so the 32 activations and
        // the scale (two with `halves`) read lie inside `acts` and `s[r]`.
        unsafe {
            let g = self.base + g;
            let step = if self.halves { 2 } else { 1 };
            let acc = if odd { &mut self.acc1 } else { &mut self.acc0 };
            for (r, a) in acc.iter_mut().enumerate() {
                let x = self.x[r].add(g * ACT_BLOCK);
                *a = I::group(*a, w, x, self.s[r].as_ptr().add(step * g), self.halves);
            }
        }
    }
}

/// A sink that sends every group to the second accumulator.
struct Odd<'s, S>(&'s mut S);

impl<W, S: Sink<W>> Sink<W> for Odd<'_, S> {
    #[inline(always)]
    unsafe fn group(&mut self, g: usize, _: bool, w: W) {
        // SAFETY: forwarded with this function's own contract.
        unsafe {
            self.0.group(g, true, w);
        }
    }
}

/// `ch.s[r][..] = xs·a` for the chunk's `ng` groups (`2·ng` half-groups for Q6_K).
///
/// # Safety
/// `xs` points to `ng` activation scales; AVX2.
#[inline(always)]
unsafe fn combine<F: Format>(xs: *const f32, ch: &mut Chunk, r: usize, ng: usize) {
    // SAFETY: the caller has AVX2 and `ng` readable scales at `xs` (this function's
    // contract); `ch.a` and `ch.s[r]` hold `2·CHUNK ≥ 2·ng` values and every load or store
    // reads 8 (or 4) at `t` with `t + 8 ≤ ng` (or `2t + 8 ≤ 2ng`).
    unsafe {
        let a = ch.a.as_ptr();
        let s = ch.s[r].as_mut_ptr();
        let mut t = 0;
        if F::HALVES {
            // ng is a multiple of 8 (whole super-blocks); each xs serves two half-groups.
            let dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
            while t + 4 <= ng {
                let x4 = _mm256_castps128_ps256(_mm_loadu_ps(xs.add(t)));
                let x8 = _mm256_permutevar8x32_ps(x4, dup);
                _mm256_storeu_ps(
                    s.add(2 * t),
                    _mm256_mul_ps(x8, _mm256_loadu_ps(a.add(2 * t))),
                );
                t += 4;
            }
            debug_assert_eq!(t, ng);
            return;
        }
        while t + 8 <= ng {
            let v = _mm256_mul_ps(_mm256_loadu_ps(xs.add(t)), _mm256_loadu_ps(a.add(t)));
            _mm256_storeu_ps(s.add(t), v);
            t += 8;
        }
        while t < ng {
            *s.add(t) = *xs.add(t) * *a.add(t);
            t += 1;
        }
    }
}

/// Adds `Σ c·Σx` over the chunk's `ng` groups to `cv` (8 lanes) and `cs`.
///
/// # Safety
/// `sum` points to `ng` activation sums; AVX2 and FMA.
#[inline(always)]
unsafe fn constants(
    sum: *const f32,
    c: &[f32; 2 * CHUNK],
    ng: usize,
    cv: &mut __m256,
    cs: &mut f32,
) {
    // SAFETY: the caller has AVX2 and FMA and `ng ≤ CHUNK` readable sums at `sum` (this
    // function's contract); the loads read 8 at `t` with `t + 8 ≤ ng`, inside both.
    unsafe {
        let mut t = 0;
        while t + 8 <= ng {
            *cv = _mm256_fmadd_ps(
                _mm256_loadu_ps(c.as_ptr().add(t)),
                _mm256_loadu_ps(sum.add(t)),
                *cv,
            );
            t += 8;
        }
        while t < ng {
            *cs += c[t] * *sum.add(t);
            t += 1;
        }
    }
}

/// Adds `Σ c·xs·Σxq` over the chunk's `2·ng` half-groups to `cv` (8 lanes) and `cs`: a
/// constant per 16 meets the integer sum of those 16 activations times their block's scale.
///
/// # Safety
/// `xs` points to `ng` activation scales and `half` to their `2·ng` sums per 16; AVX2 and
/// FMA.
#[inline(always)]
unsafe fn constants16(
    xs: *const f32,
    half: *const i32,
    c: &[f32; 2 * CHUNK],
    ng: usize,
    cv: &mut __m256,
    cs: &mut f32,
) {
    // SAFETY: the caller has AVX2 and FMA and guarantees `ng ≤ CHUNK` scales at `xs` and
    // `2·ng` sums at `half`; the vector loop reads 4 scales at `t` and 8 sums and constants
    // at `2t` with `t + 4 ≤ ng`, inside all three (`c` holds `2·CHUNK`).
    unsafe {
        // Each activation scale serves the two halves of its group.
        let dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
        let mut t = 0;
        while t + 4 <= ng {
            let x4 = _mm256_castps128_ps256(_mm_loadu_ps(xs.add(t)));
            let x8 = _mm256_permutevar8x32_ps(x4, dup);
            let h8 = _mm256_cvtepi32_ps(_mm256_loadu_si256(half.add(2 * t) as *const __m256i));
            let c8 = _mm256_loadu_ps(c.as_ptr().add(2 * t));
            *cv = _mm256_fmadd_ps(c8, _mm256_mul_ps(x8, h8), *cv);
            t += 4;
        }
        while t < ng {
            let x = *xs.add(t);
            *cs += c[2 * t] * (x * *half.add(2 * t) as f32)
                + c[2 * t + 1] * (x * *half.add(2 * t + 1) as f32);
            t += 1;
        }
    }
}

/// AVX2: `madd` of each half, the halves' i32 lanes added (same scale) or scaled apart.
pub(super) struct Avx2;

impl Isa for Avx2 {
    type W = W2;
    type Acc = __m256;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the caller has AVX (the trait's contract).
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn group(acc: __m256, w: W2, x: *const i16, s: *const f32, halves: bool) -> __m256 {
        // SAFETY: the trait's contract: AVX2 and FMA, 32 readable i16 at `x` (two unaligned
        // loads of 16) and 1 (2 with `halves`) readable f32 at `s`.
        unsafe {
            let p0 = _mm256_madd_epi16(w.0, _mm256_loadu_si256(x as *const __m256i));
            let p1 = _mm256_madd_epi16(w.1, _mm256_loadu_si256(x.add(16) as *const __m256i));
            if halves {
                let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_broadcast_ss(&*s), acc);
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_broadcast_ss(&*s.add(1)), acc)
            } else {
                // |q| ≤ 128 and |xq| ≤ 32767: 32 products sum well inside i32.
                let p = _mm256_add_epi32(p0, p1);
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&*s), acc)
            }
        }
    }

    #[inline(always)]
    unsafe fn hsum2(a: __m256, b: __m256) -> f32 {
        // SAFETY: the caller has AVX2 (the trait's contract).
        unsafe { crate::simd::avx2::hsum(_mm256_add_ps(a, b)) }
    }
}

/// Dispatches on the format to [`columns_with`] for ISA `I`, whose `W` every format unpacks.
macro_rules! dispatch {
    ($isa:ty, $format:expr, $y:expr, $acts:expr, $w:expr, $bias:expr, $n:expr, $j0:expr, $j1:expr) => {{
        use $crate::quant::frame;
        use $crate::quant::gemv::avx2 as gemv;
        use $crate::quant::QuantFormat as Qf;
        match $format {
            Qf::Q8_0 => gemv::columns_with::<$isa, frame::Q8_0>($y, $acts, $w, $bias, $n, $j0, $j1),
            Qf::Q4_0 => gemv::columns_with::<$isa, frame::Q4_0>($y, $acts, $w, $bias, $n, $j0, $j1),
            Qf::Q4_1 => gemv::columns_with::<$isa, frame::Q4_1>($y, $acts, $w, $bias, $n, $j0, $j1),
            Qf::Q5_0 => gemv::columns_with::<$isa, frame::Q5_0>($y, $acts, $w, $bias, $n, $j0, $j1),
            Qf::Q5_1 => gemv::columns_with::<$isa, frame::Q5_1>($y, $acts, $w, $bias, $n, $j0, $j1),
            Qf::Q4_K => gemv::columns_with::<$isa, frame::Q4_K>($y, $acts, $w, $bias, $n, $j0, $j1),
            Qf::Q5_K => gemv::columns_with::<$isa, frame::Q5_K>($y, $acts, $w, $bias, $n, $j0, $j1),
            Qf::Q6_K => gemv::columns_with::<$isa, frame::Q6_K>($y, $acts, $w, $bias, $n, $j0, $j1),
            Qf::Q2_K => gemv::columns_with::<$isa, frame::Q2_K>($y, $acts, $w, $bias, $n, $j0, $j1),
            Qf::Q3_K => gemv::columns_with::<$isa, frame::Q3_K>($y, $acts, $w, $bias, $n, $j0, $j1),
            Qf::IQ4_NL => {
                gemv::columns_with::<$isa, frame::IQ4_NL>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
            Qf::IQ4_XS => {
                gemv::columns_with::<$isa, frame::IQ4_XS>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
            Qf::IQ2_XXS => {
                gemv::columns_with::<$isa, frame::IQ2_XXS>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
            Qf::IQ2_XS => {
                gemv::columns_with::<$isa, frame::IQ2_XS>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
            Qf::IQ2_S => {
                gemv::columns_with::<$isa, frame::IQ2_S>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
            Qf::IQ3_XXS => {
                gemv::columns_with::<$isa, frame::IQ3_XXS>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
            Qf::IQ3_S => {
                gemv::columns_with::<$isa, frame::IQ3_S>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
            Qf::IQ1_S => {
                gemv::columns_with::<$isa, frame::IQ1_S>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
            Qf::IQ1_M => {
                gemv::columns_with::<$isa, frame::IQ1_M>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
            Qf::TQ1_0 => {
                gemv::columns_with::<$isa, frame::TQ1_0>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
            Qf::TQ2_0 => {
                gemv::columns_with::<$isa, frame::TQ2_0>($y, $acts, $w, $bias, $n, $j0, $j1)
            }
        }
    }};
}
pub(super) use dispatch;

/// Columns `j0..j1` of `y = x·Wᵀ (+ b)` with 256-bit vectors.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; the rest as `super::columns_scalar`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn columns(
    y: SharedOut,
    acts: &QuantizedActs,
    format: crate::quant::QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    // SAFETY: the features are enabled on this function; the rest is the caller's
    // contract.
    unsafe { dispatch!(Avx2, format, y, acts, w, bias, n, j0, j1) }
}
