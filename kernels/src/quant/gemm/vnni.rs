//! The AVX-512 VNNI kernel of [`super::gemm`]: pack a panel of [`NR`] rows of `W`, then run
//! tiles of up to [`MR`] rows of `x` against it.
//!
//! **Packed panel.** For group `g` (32 elements of `k`) and element pair `p` (0–15), the
//! panel holds one `u32` per row `c` of the panel: the two 16-bit integers `q[2p]`,
//! `q[2p + 1]` of that row's group. The `NR` of them for one `(g, p)` are two 512-bit
//! vectors, the operand `vpdpwssd` multiplies with a broadcast pair of activations. Beside
//! them: the scale per group (per half-group for Q6_K) and the additive constant per group,
//! each `NR` floats. Rows past `n` are packed as zeros and never stored.
//!
//! **Tile.** For each group, `MR × 2` vectors of i32 sums collect 16 `vpdpwssd` each (one
//! per pair; 8 per half for Q6_K), then are converted to f32 and fused into the f32
//! accumulators with the product of the weight scales (a vector) and the row's activation
//! scale (a broadcast). The constants' term `c·Σx` is one more FMA per group. The integer
//! sums cannot overflow: a group adds 32 products of `|q| ≤ 128` and `|xq| ≤ 32767`.

use super::NR;
use crate::par::SharedOut;
use crate::quant::act::{QuantizedActs, ACT_BLOCK};
use crate::quant::frame::{self, Chunk, Format, Sink, Unpack, CHUNK};
use crate::quant::frame::{
    IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0,
};
use crate::quant::QuantFormat;
use core::arch::x86_64::*;
use rayon::prelude::*;
use std::cell::RefCell;

/// Rows of `x` per tile.
const MR: usize = 4;

/// One packed panel (see the module doc), reused across calls by each thread.
#[derive(Default)]
struct Panel {
    /// `[group][pair][NR]` pairs of i16.
    q: Vec<u32>,
    /// `[group][half][NR]` scales (`half` only for Q6_K).
    a: Vec<f32>,
    /// `[group][NR]` additive constants.
    c: Vec<f32>,
    /// The panel's rows of `W` in GGUF's layout, where `W` comes interleaved.
    rows: Vec<u8>,
}

thread_local! {
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
}

/// See [`super::gemm`] and [`super::gemm_interleaved`] (`interleaved`: `w` in
/// [`x8`](crate::quant::x8)'s layout, each panel's rows taken back to GGUF's layout as the
/// panel is packed); shapes already checked, and the CPU has AVX-512 F, BW, VL, VNNI.
pub(super) fn gemm(
    y: &mut [f32],
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    interleaved: bool,
    bias: Option<&[f32]>,
    n: usize,
) {
    let out = SharedOut(y.as_mut_ptr());
    let panels = n.div_ceil(NR);
    let row_bytes = acts.k / format.block_elems() * format.block_bytes();
    let run = |panel: usize| {
        PANEL.with(|buf| {
            let mut buf = buf.borrow_mut();
            let (j0, j1) = (panel * NR, ((panel + 1) * NR).min(n));
            let mut unpacked = std::mem::take(&mut buf.rows);
            let rows = if interleaved {
                unpacked.resize((j1 - j0) * row_bytes, 0);
                // Panels are whole groups of 8 rows (NR is a multiple of 8, and so is n).
                crate::quant::x8::unpack_rows(format, w, acts.k, j0, j1 - j0, &mut unpacked)
                    .expect("the panel's rows lie inside the checked matrix");
                &unpacked[..]
            } else {
                &w[j0 * row_bytes..j1 * row_bytes]
            };
            // SAFETY: the CPU has the features (the caller's contract, checked by
            // `super::gemm`); `rows` holds rows j0..j1 of acts.k elements, y is m·n, and
            // panel `panel` writes only its own columns j0..j1.
            unsafe { panel_product(out, acts, format, rows, bias, n, j0, j1, &mut buf) };
            buf.rows = unpacked;
        })
    };
    if rayon::current_num_threads() > 1 && panels > 1 {
        (0..panels).into_par_iter().for_each(run);
    } else {
        (0..panels).for_each(run);
    }
}

/// Packs rows `j0..j1` of `W` (`w`, in GGUF's layout, holds those rows only) and writes
/// columns `j0..j1` of `y`.
///
/// # Safety
/// AVX-512 F, BW, VL, VNNI, AVX2, FMA, F16C; `w` holds `j1 - j0` rows of `acts.k` elements
/// of `format`; `y` points to `acts.m·n` floats whose columns `j0..j1` no one else touches;
/// `j1 - j0 ≤ NR`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_product(
    y: SharedOut,
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
    panel: &mut Panel,
) {
    macro_rules! with {
        ($f:ty) => {
            // SAFETY: the caller's contract.
            unsafe { product::<$f>(y, acts, w, bias, n, j0, j1, panel) }
        };
    }
    match format {
        QuantFormat::Q8_0 => with!(Q8_0),
        QuantFormat::Q4_0 => with!(Q4_0),
        QuantFormat::Q4_1 => with!(Q4_1),
        QuantFormat::Q5_0 => with!(Q5_0),
        QuantFormat::Q5_1 => with!(Q5_1),
        QuantFormat::Q4_K => with!(Q4_K),
        QuantFormat::Q5_K => with!(Q5_K),
        QuantFormat::Q6_K => with!(Q6_K),
        QuantFormat::Q2_K => with!(Q2_K),
        QuantFormat::Q3_K => with!(Q3_K),
        QuantFormat::IQ4_NL => with!(IQ4_NL),
        QuantFormat::IQ4_XS => with!(IQ4_XS),
        QuantFormat::IQ2_XXS => with!(frame::IQ2_XXS),
        QuantFormat::IQ2_XS => with!(frame::IQ2_XS),
        QuantFormat::IQ2_S => with!(frame::IQ2_S),
        QuantFormat::IQ3_XXS => with!(frame::IQ3_XXS),
        QuantFormat::IQ3_S => with!(frame::IQ3_S),
        QuantFormat::IQ1_S => with!(frame::IQ1_S),
        QuantFormat::IQ1_M => with!(frame::IQ1_M),
        QuantFormat::TQ1_0 => with!(frame::TQ1_0),
        QuantFormat::TQ2_0 => with!(frame::TQ2_0),
    }
}

/// [`panel_product`] for one format.
///
/// # Safety
/// As [`panel_product`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn product<F: Unpack<__m512i>>(
    y: SharedOut,
    acts: &QuantizedActs,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
    panel: &mut Panel,
) {
    // SAFETY: the caller's contract.
    unsafe { pack::<F>(acts.k, w, j1 - j0, panel) };
    let m = acts.m;
    let mut i0 = 0;
    while i0 < m {
        let mr = (m - i0).min(MR);
        // SAFETY: rows i0..i0 + mr exist; the rest is the caller's contract.
        unsafe {
            match mr {
                1 => tile::<F, 1>(y, acts, panel, bias, n, i0, j0, j1),
                2 => tile::<F, 2>(y, acts, panel, bias, n, i0, j0, j1),
                3 => tile::<F, 3>(y, acts, panel, bias, n, i0, j0, j1),
                _ => tile::<F, MR>(y, acts, panel, bias, n, i0, j0, j1),
            }
        }
        i0 += mr;
    }
}

/// Stores each unpacked group of one row of `W` into its column of the panel.
struct Store {
    /// The panel's pairs at this row's column.
    q: *mut u32,
    /// The current block's first group.
    base: usize,
}

impl Sink<__m512i> for Store {
    #[inline(always)]
    unsafe fn group(&mut self, g: usize, _: bool, w: __m512i) {
        let mut pairs = [0u32; 16];
        // SAFETY: 16 u32 fit `pairs`; group base + g of this column lies inside the panel
        // (sized by `pack` for every group of the row).
        unsafe {
            _mm512_storeu_si512(pairs.as_mut_ptr() as *mut __m512i, w);
            let dst = self.q.add((self.base + g) * 16 * NR);
            for (p, &v) in pairs.iter().enumerate() {
                *dst.add(p * NR) = v;
            }
        }
    }
}

/// Unpacks the `cols` rows of `W` in `w` into `panel`, zeros for the rest of its `NR`
/// columns.
///
/// # Safety
/// AVX-512 F and BW, AVX2, F16C; `w` holds `cols ≤ NR` rows of `k` elements of `F`.
#[inline(always)]
unsafe fn pack<F: Unpack<__m512i>>(k: usize, w: &[u8], cols: usize, panel: &mut Panel) {
    let groups = k / ACT_BLOCK;
    let halves = if F::HALVES { 2 } else { 1 };
    let nblocks = k / F::BE;
    let gpb = F::BE / ACT_BLOCK;
    let row_bytes = nblocks * F::BB;
    panel.q.clear();
    panel.q.resize(groups * 16 * NR, 0);
    panel.a.clear();
    panel.a.resize(groups * halves * NR, 0.0);
    panel.c.clear();
    let consts = if F::MIN16 { 2 } else { 1 };
    if F::MIN || F::MIN16 {
        panel.c.resize(groups * consts * NR, 0.0);
    }
    let mut ch = Chunk::new();
    let per_chunk = CHUNK / gpb;
    for col in 0..cols {
        // SAFETY: row col < cols lies inside w (the caller's contract).
        let row = unsafe { w.as_ptr().add(col * row_bytes) };
        let mut sink = Store {
            // SAFETY: column col < NR of the panel.
            q: unsafe { panel.q.as_mut_ptr().add(col) },
            base: 0,
        };
        let mut b0 = 0;
        while b0 < nblocks {
            let nb = per_chunk.min(nblocks - b0);
            let g0 = b0 * gpb;
            // SAFETY: blocks b0..b0 + nb of the row; nb·BE ≤ 32·CHUNK.
            unsafe { F::scales(row.add(b0 * F::BB), nb, &mut ch) };
            for t in 0..nb * gpb * halves {
                panel.a[(g0 * halves + t) * NR + col] = ch.a[t];
            }
            if F::MIN || F::MIN16 {
                for t in 0..nb * gpb * consts {
                    panel.c[(g0 * consts + t) * NR + col] = ch.c[t];
                }
            }
            for b in b0..b0 + nb {
                sink.base = b * gpb;
                // SAFETY: block b of the row; the sink writes inside the panel.
                unsafe { F::block(row.add(b * F::BB), &mut sink) };
            }
            b0 += nb;
        }
    }
}

/// `y[i0..i0 + M, j0..j1]` from the packed panel.
///
/// # Safety
/// As [`panel_product`], with the panel packed for `F` and rows `i0..i0 + M` inside `x`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<F: Format, const M: usize>(
    y: SharedOut,
    acts: &QuantizedActs,
    panel: &Panel,
    bias: Option<&[f32]>,
    n: usize,
    i0: usize,
    j0: usize,
    j1: usize,
) {
    let k = acts.k;
    let groups = k / ACT_BLOCK;
    let (halves, pairs) = if F::HALVES { (2, 8) } else { (1, 16) };
    // SAFETY: (every pointer below) rows i0..i0 + M of the activations and groups < groups
    // of the panel exist (the caller's contract and `pack`'s sizes); the CPU features are
    // the caller's contract too.
    unsafe {
        let xq = acts.q.as_ptr().add(i0 * k);
        let xs = acts.scale.as_ptr().add(i0 * groups);
        let xsum = acts.sum.as_ptr().add(i0 * groups);
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        for g in 0..groups {
            for h in 0..halves {
                let mut dot = [[_mm512_setzero_si512(); 2]; M];
                let q = panel.q.as_ptr().add((g * 16 + h * pairs) * NR);
                let x = xq.add(g * ACT_BLOCK + 2 * h * pairs);
                for p in 0..pairs {
                    let w0 = _mm512_loadu_si512(q.add(p * NR) as *const __m512i);
                    let w1 = _mm512_loadu_si512(q.add(p * NR + 16) as *const __m512i);
                    for (r, d) in dot.iter_mut().enumerate() {
                        let pair = (x.add(r * k + 2 * p) as *const i32).read_unaligned();
                        let xv = _mm512_set1_epi32(pair);
                        d[0] = _mm512_dpwssd_epi32(d[0], w0, xv);
                        d[1] = _mm512_dpwssd_epi32(d[1], w1, xv);
                    }
                }
                let a = panel.a.as_ptr().add((g * halves + h) * NR);
                let (a0, a1) = (_mm512_loadu_ps(a), _mm512_loadu_ps(a.add(16)));
                for (r, (acc, d)) in acc.iter_mut().zip(&dot).enumerate() {
                    let s = _mm512_set1_ps(*xs.add(r * groups + g));
                    acc[0] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[0]), _mm512_mul_ps(a0, s), acc[0]);
                    acc[1] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[1]), _mm512_mul_ps(a1, s), acc[1]);
                }
            }
            if F::MIN16 {
                // A constant per 16 meets `xs·Σxq` of those 16 activations: one `madd` with
                // ones gives 8 pair sums per half, reduced under a mask.
                let c = panel.c.as_ptr().add(2 * g * NR);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm512_loadu_si512(xq.add(r * k + g * ACT_BLOCK) as *const __m512i);
                    let pairs = _mm512_madd_epi16(x, _mm512_set1_epi16(1));
                    let xsr = *xs.add(r * groups + g);
                    for (h, lanes) in [0x00FFu16, 0xFF00].into_iter().enumerate() {
                        let s = _mm512_mask_reduce_add_epi32(lanes, pairs);
                        let sx = _mm512_set1_ps(xsr * s as f32);
                        let ch = c.add(h * NR);
                        acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(ch), sx, acc[0]);
                        acc[1] = _mm512_fmadd_ps(_mm512_loadu_ps(ch.add(16)), sx, acc[1]);
                    }
                }
            }
            if F::MIN {
                let c = panel.c.as_ptr().add(g * NR);
                let (c0, c1) = (_mm512_loadu_ps(c), _mm512_loadu_ps(c.add(16)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let sx = _mm512_set1_ps(*xsum.add(r * groups + g));
                    acc[0] = _mm512_fmadd_ps(c0, sx, acc[0]);
                    acc[1] = _mm512_fmadd_ps(c1, sx, acc[1]);
                }
            }
        }
        let cols = j1 - j0;
        let mask = if cols >= NR {
            u32::MAX
        } else {
            (1u32 << cols) - 1
        };
        for (r, acc) in acc.iter().enumerate() {
            let out = y.get().add((i0 + r) * n + j0);
            for (h, &v) in acc.iter().enumerate() {
                let m16 = (mask >> (16 * h)) as u16;
                if m16 == 0 {
                    continue;
                }
                let v = match bias {
                    Some(b) => {
                        _mm512_add_ps(v, _mm512_maskz_loadu_ps(m16, b.as_ptr().add(j0 + 16 * h)))
                    }
                    None => v,
                };
                _mm512_mask_storeu_ps(out.add(16 * h), m16, v);
            }
        }
    }
}
