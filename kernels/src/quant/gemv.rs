//! The quantized GEMV: `y[m, n] = x[m, k]·Wᵀ (+ b)` with `W` in whole blocks of a
//! [`QuantFormat`] and `x` already quantized per 32 ([`QuantizedActs`]).
//!
//! Every format is, per group of 32 weights, `w = a·q + c` with small integers `q` (the
//! symmetric formats' offsets −8, −16, −32 and Q3_K's −4 folded into them; for IQ4_NL and
//! IQ4_XS the table's entries, −127..113), a scale `a` (one per 16 for Q6_K and Q3_K) and a
//! constant `c` (the minimum of Q4_1/Q5_1, `−dmin·mn` for Q4_K/Q5_K, else 0; Q2_K has a scale
//! and a constant `−dmin·mn` per 16, its integers 0..3).
//! With `x ≈ xs·xq` over the same 32 elements, a group contributes
//! `xs·a·Σ q·xq + c·Σ x`: an integer dot product, two multiplies and one add. Where `c` is
//! per 16 (Q2_K), `Σx` of each 16 is taken as `xs·Σxq` of its integers
//! ([`QuantizedActs::isum16`]), since the activations keep no f32 sums per 16.
//!
//! `columns` dispatches to the fastest kernel for the CPU: AVX-512 (F, BW, VL) where
//! 512-bit operations run at full width ([`crate::simd::Isa::prefer_512`]; not on Zen 4, which
//! splits them and where the AVX2 kernel measured faster), else AVX2, else the scalar loop.
//! AVX-512 VNNI's `vpdpwssd` would fuse a `madd` with the add after it, but a group of 32 is
//! one 512-bit `madd` with no add to fuse (each group keeps its own scale), so it is not
//! used. `columns_scalar` is the plain reference that the SIMD kernels are tested
//! against. The SIMD kernels (`avx2`, `avx512`) compute the same integer dot products and
//! differ from it only in the order of their f32 additions and in applying `xs·a` as one
//! product.

/// Rows of `x` a quantized GEMV kernel takes per call at most: `matmul` calls them with up
/// to its `GEMV_MAX_ROWS` rows, and checks that at compile time.
pub(crate) const MAX_ROWS: usize = 8;

#[cfg(target_arch = "x86_64")]
pub(in crate::quant) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
use super::act::{QuantizedActs, ACT_BLOCK};
use super::blocks::{
    f16_at, iq4_xs_scale, k_scale_min, q2_k_value, q3_k_scale, q3_k_value, q6_k_value, IQ4_TABLE,
};
use super::QuantFormat;
use crate::par::SharedOut;

/// One group of 32 weights as integers and scales: `w[e] = a[e / 16]·q[e] + c[e / 16]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Group {
    /// The integers, offsets included.
    pub q: [i8; 32],
    /// The scale of elements 0–15 and of 16–31 (equal except in Q6_K).
    pub a: [f32; 2],
    /// The additive constant of elements 0–15 and of 16–31 (equal except in Q2_K).
    pub c: [f32; 2],
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
            out.c = [f16_at(block, 2); 2];
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
                out.c = [f16_at(block, 2); 2];
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
            out.c = [-(dmin * f32::from(mn)); 2];
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
        QuantFormat::Q2_K => {
            let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
            for (l, v) in out.q.iter_mut().enumerate() {
                *v = q2_k_value(block, 32 * g + l) as i8;
            }
            let sc = |s: usize| d * f32::from(block[s] & 0x0F);
            let mn = |s: usize| -(dmin * f32::from(block[s] >> 4));
            out.a = [sc(2 * g), sc(2 * g + 1)];
            out.c = [mn(2 * g), mn(2 * g + 1)];
        }
        QuantFormat::Q3_K => {
            let d = f16_at(block, 108);
            for (l, v) in out.q.iter_mut().enumerate() {
                *v = q3_k_value(block, 32 * g + l);
            }
            let sc = |s: usize| d * f32::from(q3_k_scale(&block[96..108], s) as i8 - 32);
            out.a = [sc(2 * g), sc(2 * g + 1)];
        }
        QuantFormat::IQ4_NL | QuantFormat::IQ4_XS => {
            let (qs, a) = if format == QuantFormat::IQ4_NL {
                (&block[2..18], f16_at(block, 0))
            } else {
                let sc = f32::from(iq4_xs_scale(block, g) as i8 - 32);
                (&block[8 + 16 * g..24 + 16 * g], f16_at(block, 0) * sc)
            };
            for (j, &b) in qs.iter().enumerate() {
                out.q[j] = IQ4_TABLE[usize::from(b & 0x0F)];
                out.q[j + 16] = IQ4_TABLE[usize::from(b >> 4)];
            }
            out.a = [a; 2];
        }
        _ => out.a = super::blocks::iq::group(format, block, g, &mut out.q),
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
    let row_bytes = k / format.block_elems() * format.block_bytes();
    // Rows of x in runs of up to MAX_ROWS (any m: this is also the prefill product's
    // reference). Each row's sums are its own, so the run length changes no result.
    const RUN: usize = MAX_ROWS;
    let mut acc = [0.0f32; RUN];
    for (i0, j) in (0..m)
        .step_by(RUN)
        .flat_map(|i0| (j0..j1).map(move |j| (i0, j)))
    {
        let rows = RUN.min(m - i0);
        acc[..rows].fill(0.0);
        row_scalar(
            acts,
            format,
            &w[j * row_bytes..(j + 1) * row_bytes],
            i0,
            &mut acc[..rows],
        );
        for (i, a) in (i0..).zip(&acc[..rows]) {
            // SAFETY: i < m and j < j1 ≤ n: inside y, in this call's own columns.
            unsafe { *y.get().add(i * n + j) = a + bias.map_or(0.0, |b| b[j]) };
        }
    }
}

/// Adds `x[i]·row` to `acc[i − i0]` for the rows `i0..i0 + acc.len()` of `x`, with `row`
/// one row of `W` (`acts.k` elements of `format`): the scalar reference's arithmetic, group
/// by group.
pub(crate) fn row_scalar(
    acts: &QuantizedActs,
    format: QuantFormat,
    row: &[u8],
    i0: usize,
    acc: &mut [f32],
) {
    let (be, bb) = (format.block_elems(), format.block_bytes());
    let bpr = acts.blocks_per_row();
    for (b, block) in row.chunks_exact(bb).enumerate() {
        for g in 0..be / ACT_BLOCK {
            let grp = group(format, block, g);
            let ab = (b * be) / ACT_BLOCK + g; // activation block within the row
            for (i, a) in (i0..).zip(acc.iter_mut()) {
                let at = i * bpr + ab;
                let xq = &acts.q[at * ACT_BLOCK..(at + 1) * ACT_BLOCK];
                let dot = grp.a[0] * idot16(&grp.q, xq, 0) as f32
                    + grp.a[1] * idot16(&grp.q, xq, 16) as f32;
                let xs = acts.scale[at];
                let constant = if format.half_mins() {
                    // A constant per 16 meets the sum of those 16 activations, `xs·Σxq`.
                    let half =
                        |lo: usize| xq[lo..lo + 16].iter().map(|&v| i32::from(v)).sum::<i32>();
                    grp.c[0] * (xs * half(0) as f32) + grp.c[1] * (xs * half(16) as f32)
                } else {
                    grp.c[0] * acts.sum[at]
                };
                *a += xs * dot + constant;
            }
        }
    }
}

/// Columns `j0..j1` of `y[m, n] = x·Wᵀ (+ b)` with the fastest kernel for this CPU.
///
/// # Safety
/// As `columns_scalar`.
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
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::isa().prefer_512() {
            // SAFETY: AVX-512 F/BW/VL, AVX2, FMA and F16C were detected; the rest is the
            // caller's contract.
            unsafe { avx512::columns(y, acts, format, w, bias, n, j0, j1) };
            return;
        }
        if crate::simd::isa().avx2_fma_f16c {
            // SAFETY: AVX2, FMA and F16C were detected; the rest is the caller's contract.
            unsafe { avx2::columns(y, acts, format, w, bias, n, j0, j1) };
            return;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { columns_scalar(y, acts, format, w, bias, n, j0, j1) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::{weight_blocks as random_blocks, Rng};

    use crate::quant::testing::{check_split_columns, ColumnsKernel as Kernel};

    /// The SIMD kernels this CPU runs, by name, whatever the environment says.
    fn kernels() -> Vec<(&'static str, Kernel)> {
        let mut out: Vec<(&'static str, Kernel)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let isa = crate::simd::Isa::detect();
            if isa.avx2_fma_f16c {
                out.push(("avx2", avx2::columns));
            }
            if isa.avx512 {
                out.push(("avx512", avx512::columns));
            }
        }
        out.push(("dispatch", columns));
        out
    }

    /// Every SIMD kernel against the scalar reference on the same integers: only the order
    /// of the f32 additions differs, so the tolerance is a few f32 roundings of the terms'
    /// magnitude. Column ranges are split unevenly to check the edges.
    #[test]
    fn simd_matches_scalar_reference() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut worst = 0.0f64;
        // Under Miri (about a million times slower) a few shapes still cover one
        // super-block, a run of 8 blocks plus a tail (k = 288), 1 and 5 rows and a split of
        // the columns.
        let (ks, shapes): (&[usize], &[(usize, usize)]) = if cfg!(miri) {
            (&[256, 288], &[(1, 12), (5, 1)])
        } else {
            (
                &[32, 96, 576, 256, 768, 1536, 2560],
                &[(1, 1), (1, 27), (2, 7), (3, 33), (4, 9), (5, 4), (8, 17)],
            )
        };
        for format in QuantFormat::ALL {
            for &k in ks {
                if !k.is_multiple_of(format.block_elems()) {
                    continue;
                }
                for &(m, n) in shapes {
                    let w = random_blocks(format, n, k, &mut rng);
                    let x: Vec<f32> = (0..m * k)
                        .map(|i| rng.uniform() * if i % 97 == 0 { 30.0 } else { 1.0 })
                        .collect();
                    let bias: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
                    let mut acts = QuantizedActs::default();
                    acts.quantize(&x, m, k).unwrap();
                    let mut want = vec![f32::NAN; m * n];
                    // SAFETY: want is m·n, w holds n rows of k, all columns are ours.
                    unsafe {
                        columns_scalar(
                            SharedOut(want.as_mut_ptr()),
                            &acts,
                            format,
                            &w,
                            Some(&bias),
                            n,
                            0,
                            n,
                        )
                    };
                    // A constant per 16 reads the activations' sums per 16, which the
                    // kernels make themselves where `quantize` left none.
                    let mut bare = acts.clone();
                    bare.isum16.clear();
                    let variants: &[&QuantizedActs] = if format.half_mins() {
                        &[&acts, &bare]
                    } else {
                        &[&acts]
                    };
                    for (&acts, (name, kernel)) in variants
                        .iter()
                        .flat_map(|a| kernels().into_iter().map(move |k| (a, k)))
                    {
                        // SAFETY: `kernels` lists only what this CPU runs; w holds n rows
                        // of k in GGUF's layout, which every kernel here reads.
                        let err = unsafe {
                            check_split_columns(
                                name,
                                kernel,
                                acts,
                                format,
                                &w,
                                &w,
                                Some(&bias),
                                n,
                                n / 3,
                                &want,
                            )
                        };
                        worst = worst.max(err);
                    }
                }
            }
        }
        eprintln!("worst relative error against the scalar kernel: {worst:e}");
    }

    /// A NaN or infinity in `x` makes its row of `y` non-finite in every kernel.
    #[test]
    fn non_finite_x_stays_visible() {
        let mut rng = Rng(77);
        for format in QuantFormat::ALL {
            // Two super-blocks; under Miri one, one column and no −inf (+inf takes the same
            // path through the activation scale).
            let (m, n, k) = if cfg!(miri) { (3, 1, 256) } else { (3, 5, 512) };
            let bads: &[f32] = if cfg!(miri) {
                &[f32::NAN, f32::INFINITY]
            } else {
                &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]
            };
            let w = random_blocks(format, n, k, &mut rng);
            for &bad in bads {
                let mut x: Vec<f32> = (0..m * k).map(|_| rng.uniform()).collect();
                x[k + k / 2 + 44] = bad;
                let mut acts = QuantizedActs::default();
                acts.quantize(&x, m, k).unwrap();
                for (name, kernel) in kernels() {
                    let mut y = vec![0.0f32; m * n];
                    // SAFETY: y is m·n, w holds n rows of k; the CPU runs `kernel`.
                    unsafe { kernel(SharedOut(y.as_mut_ptr()), &acts, format, &w, None, n, 0, n) };
                    for j in 0..n {
                        assert!(!y[n + j].is_finite(), "{name} {format} {bad}: y[1, {j}]");
                        assert!(
                            y[j].is_finite() && y[2 * n + j].is_finite(),
                            "{name} {format}"
                        );
                    }
                }
            }
        }
    }
}
