//! The quantized GEMV: `y[m, n] = x[m, k]·Wᵀ (+ b)` with `W` in whole blocks of a
//! [`QuantFormat`] and `x` already quantized per 32 ([`QuantizedActs`]).
//!
//! Every format is, per group of 32 weights, `w = a·q + c` with small integers `q` (the
//! symmetric formats' offsets −8, −16 and −32 folded into them), a scale `a` (one per 16 for
//! Q6_K) and a constant `c` (the minimum of Q4_1/Q5_1, `−dmin·mn` for Q4_K/Q5_K, else 0).
//! With `x ≈ xs·xq` over the same 32 elements, a group contributes
//! `xs·a·Σ q·xq + c·Σ x`: an integer dot product, two multiplies and one add.
//!
//! [`columns`] dispatches to the widest kernel the CPU has; [`columns_scalar`] is the plain
//! reference that the SIMD kernels are tested against.

use super::act::{QuantizedActs, ACT_BLOCK};
use super::blocks::{f16_at, k_scale_min, q6_k_value};
use super::QuantFormat;
use crate::SharedOut;

/// One group of 32 weights as integers and scales: `w[e] = a[e / 16]·q[e] + c`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Group {
    /// The integers, offsets included.
    pub q: [i8; 32],
    /// The scale of elements 0–15 and of 16–31 (equal except in Q6_K).
    pub a: [f32; 2],
    /// The additive constant.
    pub c: f32,
}

/// Group `g` (0..block_elems / 32) of one block of `format`.
pub fn group(format: QuantFormat, block: &[u8], g: usize) -> Group {
    let mut out = Group::default();
    let nibbles = |qs: &[u8], q: &mut [i8; 32], offset: i8| {
        for (j, &b) in qs[..16].iter().enumerate() {
            q[j] = (b & 0x0F) as i8 - offset;
            q[j + 16] = (b >> 4) as i8 - offset;
        }
    };
    let fifth = |qh: u32, q: &mut [i8; 32]| {
        for (e, v) in q.iter_mut().enumerate() {
            *v |= (((qh >> e) & 1) as i8) << 4;
        }
    };
    match format {
        QuantFormat::Q8_0 => {
            for (o, &b) in out.q.iter_mut().zip(&block[2..34]) {
                *o = b as i8;
            }
            out.a = [f16_at(block, 0); 2];
        }
        QuantFormat::Q4_0 => {
            nibbles(&block[2..18], &mut out.q, 8);
            out.a = [f16_at(block, 0); 2];
        }
        QuantFormat::Q4_1 => {
            nibbles(&block[4..20], &mut out.q, 0);
            out.a = [f16_at(block, 0); 2];
            out.c = f16_at(block, 2);
        }
        QuantFormat::Q5_0 | QuantFormat::Q5_1 => {
            let with_min = format == QuantFormat::Q5_1;
            let at = if with_min { 4 } else { 2 };
            let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
            nibbles(&block[at + 4..at + 20], &mut out.q, 0);
            fifth(qh, &mut out.q);
            if !with_min {
                for v in &mut out.q {
                    *v -= 16;
                }
            }
            out.a = [f16_at(block, 0); 2];
            if with_min {
                out.c = f16_at(block, 2);
            }
        }
        QuantFormat::Q4_K | QuantFormat::Q5_K => {
            let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
            let (sc, mn) = k_scale_min(&block[4..16], g);
            let q5 = format == QuantFormat::Q5_K;
            let qs = if q5 { &block[48..176] } else { &block[16..144] };
            let shift = 4 * (g % 2);
            for (l, v) in out.q.iter_mut().enumerate() {
                let mut q = (qs[32 * (g / 2) + l] >> shift) & 0x0F;
                if q5 {
                    q |= ((block[16 + l] >> g) & 1) << 4;
                }
                *v = q as i8;
            }
            out.a = [d * f32::from(sc); 2];
            out.c = -(dmin * f32::from(mn));
        }
        QuantFormat::Q6_K => {
            let d = f16_at(block, 208);
            let (h, e0) = (g / 4, 32 * (g % 4));
            for (l, v) in out.q.iter_mut().enumerate() {
                *v = q6_k_value(block, h, e0 + l);
            }
            let sc = |s: usize| d * f32::from(block[192 + s] as i8);
            out.a = [sc(2 * g), sc(2 * g + 1)];
        }
    }
    out
}

/// `Σ q·xq` over elements `lo..lo + 16` of a group.
#[inline(always)]
fn idot16(q: &[i8; 32], xq: &[i16], lo: usize) -> i32 {
    q[lo..lo + 16]
        .iter()
        .zip(&xq[lo..lo + 16])
        .map(|(&a, &b)| i32::from(a) * i32::from(b))
        .sum()
}

/// The plain reference: columns `j0..j1` of `y[m, n] = x·Wᵀ (+ b)`.
///
/// # Safety
/// `y` points to `m·n` floats (`m = acts.m`) of which no one else touches columns `j0..j1`
/// during the call; `w` holds `n` rows of `acts.k` elements of `format`; `j1 ≤ n`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn columns_scalar(
    y: SharedOut,
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    let (m, k) = (acts.m, acts.k);
    let (be, bb) = (format.block_elems(), format.block_bytes());
    let row_bytes = k / be * bb;
    let bpr = acts.blocks_per_row();
    let mut acc = [0.0f32; crate::matmul::GEMV_MAX_ROWS];
    for j in j0..j1 {
        let row = &w[j * row_bytes..(j + 1) * row_bytes];
        acc[..m].fill(0.0);
        for (b, block) in row.chunks_exact(bb).enumerate() {
            for g in 0..be / ACT_BLOCK {
                let grp = group(format, block, g);
                let ab = (b * be) / ACT_BLOCK + g; // activation block within the row
                for (i, a) in acc[..m].iter_mut().enumerate() {
                    let at = i * bpr + ab;
                    let xq = &acts.q[at * ACT_BLOCK..(at + 1) * ACT_BLOCK];
                    let dot = grp.a[0] * idot16(&grp.q, xq, 0) as f32
                        + grp.a[1] * idot16(&grp.q, xq, 16) as f32;
                    *a += acts.scale[at] * dot + grp.c * acts.sum[at];
                }
            }
        }
        for (i, a) in acc[..m].iter().enumerate() {
            // SAFETY: i < m and j < j1 ≤ n: inside y, in this call's own columns.
            unsafe { *y.get().add(i * n + j) = a + bias.map_or(0.0, |b| b[j]) };
        }
    }
}

/// Columns `j0..j1` of `y[m, n] = x·Wᵀ (+ b)` with the widest kernel this CPU runs.
///
/// # Safety
/// As [`columns_scalar`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn columns(
    y: SharedOut,
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { columns_scalar(y, acts, format, w, bias, n, j0, j1) }
}
