use super::*;
use crate::quant::act::ActPrecision;
use crate::quant::gemv::columns_scalar as gguf_scalar;
use crate::quant::testing::{
    any_blocks, check_split_columns, weight_blocks, ColumnsKernel as Kernel, Rng,
};

const FORMATS: [QuantFormat; 9] = [
    QuantFormat::Q4_0,
    QuantFormat::Q4_1,
    QuantFormat::Q4_K,
    QuantFormat::Q6_K,
    QuantFormat::Q8_0,
    QuantFormat::Q3_K,
    QuantFormat::Q5_K,
    QuantFormat::IQ4_NL,
    QuantFormat::IQ4_XS,
];

fn packed(format: QuantFormat, w: &[u8], n: usize, k: usize) -> Vec<u8> {
    let mut out = vec![0u8; w.len()];
    pack(format, w, n, k, &mut out).unwrap();
    out
}

#[test]
fn pack_and_unpack_are_inverse_on_any_bytes() {
    let mut rng = Rng(0xA5A5_1234);
    for format in FORMATS {
        for (n, k) in [(8, 256), (16, 512), (24, 768)] {
            let blocks = n * k / format.block_elems();
            let w = any_blocks(format, blocks, &mut rng);
            let p = packed(format, &w, n, k);
            assert_ne!(p, w, "{format}: the layout moves bytes");
            let mut back = vec![0u8; w.len()];
            unpack_rows(format, &p, k, 0, n, &mut back).unwrap();
            assert_eq!(back, w, "{format} n={n} k={k}");
            // Single rows from the middle of a group.
            let rb = format.row_bytes(k).unwrap();
            let mut one = vec![0u8; 3 * rb];
            unpack_rows(format, &p, k, 5, 3, &mut one).unwrap();
            assert_eq!(one, w[5 * rb..8 * rb], "{format} rows 5..8");
        }
    }
}

#[test]
fn bad_shapes_are_refused() {
    let w = vec![0u8; 7 * 18];
    let mut out = vec![0u8; w.len()];
    assert!(pack(QuantFormat::Q4_0, &w, 7, 32, &mut out).is_err());
    assert!(pack(QuantFormat::Q5_0, &[0; 8 * 22], 8, 32, &mut [0; 8 * 22]).is_err());
    assert!(pack(QuantFormat::Q4_0, &[0; 144], 8, 32, &mut [0; 143]).is_err());
    assert!(pack(QuantFormat::Q4_K, &[0; 8 * 144], 8, 128, &mut [0; 8 * 144]).is_err());
    let p = vec![0u8; 8 * 18];
    assert!(unpack_rows(QuantFormat::Q4_0, &p, 32, 7, 2, &mut [0; 36]).is_err());
    assert!(unpack_rows(QuantFormat::Q4_0, &p, 32, usize::MAX, 2, &mut [0; 36]).is_err());
    assert!(unpack_rows(QuantFormat::Q4_0, &p[..100], 32, 0, 1, &mut [0; 18]).is_err());
}

/// `x[m, k]` quantized at each precision the interleaved kernels take (8 and 16 bits, for
/// every format), with the tiles they read: the byte split at 16 bits only where `format`
/// reads it ([`reads_tiles`]), so that a kernel reading tiles it was not given would fail.
fn each_precision(x: &[f32], m: usize, k: usize, format: QuantFormat) -> Vec<QuantizedActs> {
    [ActPrecision::Wide, ActPrecision::Byte]
        .into_iter()
        .map(|p| {
            let mut acts = QuantizedActs::default();
            acts.quantize_at(x, m, k, p).unwrap();
            if reads_tiles(format) {
                acts.add_split();
            }
            acts
        })
        .collect()
}

fn kernels() -> Vec<(&'static str, Kernel)> {
    let mut out: Vec<(&'static str, Kernel)> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    if crate::simd::Isa::detect().avx2_fma_f16c {
        out.push(("avx2", avx2::columns));
        // As the dispatch decides (`QKV_ISA=avx2` turns it off): where it runs, Q6_K's
        // activations carry the byte split this kernel reads ([`reads_tiles`]).
        if crate::simd::isa().avx512_vnni {
            out.push(("vnni", avx2::columns_vnni));
        }
    }
    out.push(("dispatch", columns));
    out
}

/// The interleaved reference equals the GGUF-layout reference bit for bit, and every SIMD
/// kernel equals it up to the order of f32 additions, at both precisions, on rows of x from
/// 1 to 72 (one tile, several, a short last one), k of 1 to 8 super-blocks (the formats of
/// 32-element blocks also 1, 3 and 9 blocks), n of one group of 8 to 8 groups, column ranges that
/// cut groups of 8, and x with outliers and an all-zero block.
#[test]
fn simd_matches_scalar_reference() {
    let mut rng = Rng(0x51DE_5EED);
    let mut worst = 0.0f64;
    let (ks, shapes): (&[usize], &[(usize, usize)]) = if cfg!(miri) {
        (&[256], &[(1, 8), (3, 16)])
    } else {
        (
            &[32, 96, 256, 288, 512, 768, 2048],
            &[
                (1, 8),
                (1, 64),
                (1, 40),
                (2, 16),
                (3, 24),
                (4, 8),
                (5, 16),
                (7, 8),
                (8, 32),
                (11, 8),
                (16, 8),
                (17, 16),
                (33, 8),
                (64, 16),
                (72, 8),
            ],
        )
    };
    for format in FORMATS {
        for &k in ks
            .iter()
            .filter(|&&k| k.is_multiple_of(format.block_elems()))
        {
            for &(m, n) in shapes {
                let w = weight_blocks(format, n, k, &mut rng);
                let p = packed(format, &w, n, k);
                let x: Vec<f32> = (0..m * k)
                    .map(|i| {
                        if (i / 32) % 7 == 3 {
                            0.0
                        } else {
                            rng.uniform() * if i % 97 == 0 { 30.0 } else { 1.0 }
                        }
                    })
                    .collect();
                let bias: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
                for acts in each_precision(&x, m, k, format) {
                    let mut want = vec![f32::NAN; m * n];
                    let mut same = vec![f32::NAN; m * n];
                    // SAFETY: want and same are m·n; w and p hold n rows of k; every column is
                    // ours.
                    unsafe {
                        gguf_scalar(
                            SharedOut(want.as_mut_ptr()),
                            &acts,
                            format,
                            &w,
                            Some(&bias),
                            n,
                            0,
                            n,
                        );
                        columns_scalar(
                            SharedOut(same.as_mut_ptr()),
                            &acts,
                            format,
                            &p,
                            Some(&bias),
                            n,
                            0,
                            n,
                        );
                    }
                    assert_eq!(
                        same.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{format} {:?} m={m} k={k} n={n}: interleaved reference",
                        acts.precision
                    );
                    for (name, kernel) in kernels() {
                        let cut = (n / 3).max(1) | 1; // odd: cuts a group of 8
                                                      // SAFETY: `kernels` lists only what this CPU runs; p holds n interleaved
                                                      // rows of k, w the same in GGUF's layout.
                        let err = unsafe {
                            check_split_columns(
                                name,
                                kernel,
                                &acts,
                                format,
                                &p,
                                &w,
                                Some(&bias),
                                n,
                                cut,
                                &want,
                            )
                        };
                        worst = worst.max(err);
                    }
                }
            }
        }
    }
    eprintln!("worst relative error against the scalar kernel: {worst:e}");
}

/// Activations at the ends of their range (±32767, ±127), against weights at their
/// format's largest magnitude: where the 16-bit sums of the kernels are closest to
/// overflowing.
#[test]
fn extreme_activations_are_exact() {
    // One row (the decode kernels) and two; every weight at one end of its format's range,
    // then at the other: nibbles of 15 and 0, Q6_K's −32 (all bits 0) and 31 (all bits 1),
    // Q8_0's −128 and 127, Q3_K's −4 (all bits 0) and 3, Q5_K's 31 and 0, the IQ4 table's −127 (nibble 0)
    // and 113 (nibble 15).
    for (format, m, top) in FORMATS
        .into_iter()
        .flat_map(|f| [(f, 1, false), (f, 1, true), (f, 2, false), (f, 2, true)])
    {
        let (n, k) = (8, 256);
        let mut rng = Rng(3);
        let mut w = weight_blocks(format, n, k, &mut rng);
        for block in w.chunks_exact_mut(format.block_bytes()) {
            let (qs, byte) = match format {
                QuantFormat::Q4_0 => (2..18, 0xFF),
                QuantFormat::Q4_1 => (4..20, 0xFF),
                QuantFormat::Q6_K => (0..192, 0),
                QuantFormat::Q8_0 => (2..34, 0x80),
                QuantFormat::Q3_K => (0..96, 0),
                QuantFormat::Q5_K => (16..176, 0xFF),
                QuantFormat::IQ4_NL => (2..18, 0),
                QuantFormat::IQ4_XS => (8..136, 0),
                _ => (16..144, 0xFF),
            };
            let byte = match (top, format) {
                (false, _) => byte,
                (true, QuantFormat::Q8_0) => 0x7F,
                (true, _) => !byte,
            };
            block[qs].fill(byte);
        }
        let p = packed(format, &w, n, k);
        for sign in [1.0f32, -1.0] {
            // Every element at the block's maximum: q = ±32767 or ±127.
            let x = vec![sign; m * k];
            for acts in each_precision(&x, m, k, format) {
                let mut want = vec![0.0f32; m * n];
                // SAFETY: want is m·n, w holds n rows of k.
                unsafe {
                    gguf_scalar(
                        SharedOut(want.as_mut_ptr()),
                        &acts,
                        format,
                        &w,
                        None,
                        n,
                        0,
                        n,
                    )
                };
                for (name, kernel) in kernels() {
                    let mut got = vec![0.0f32; m * n];
                    // SAFETY: as above.
                    unsafe {
                        kernel(
                            SharedOut(got.as_mut_ptr()),
                            &acts,
                            format,
                            &p,
                            None,
                            n,
                            0,
                            n,
                        )
                    };
                    for (g, e) in got.iter().zip(&want) {
                        assert!(
                            (g - e).abs() <= 1e-5 * e.abs().max(1.0),
                            "{name} {format} m={m} top={top}: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }
}

/// A NaN or infinity in `x` makes its row of `y` non-finite, and only its row.
#[test]
fn non_finite_x_stays_visible() {
    let mut rng = Rng(77);
    for format in FORMATS {
        let (m, n, k) = (3, 8, 512);
        let w = packed(format, &weight_blocks(format, n, k, &mut rng), n, k);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x: Vec<f32> = (0..m * k).map(|_| rng.uniform()).collect();
            x[k + k / 2 + 44] = bad;
            for acts in each_precision(&x, m, k, format) {
                for (name, kernel) in kernels() {
                    let mut y = vec![0.0f32; m * n];
                    // SAFETY: y is m·n, w holds n rows of k.
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

/// At 8 bits every SIMD kernel stays as close to the f32 product of the exact weights and
/// the unrounded activations as the rounding allows: each activation moves by at most half
/// a step of its block, `amax/254`, so `y[i, j]` by at most `Σ |w|·amax/254` over the row,
/// plus f32 roundings (1e-5 of `Σ |w·x|`). The bound is no blanket: the same products at
/// 16 bits land within 1/200 of it, and at 8 bits the worst error reaches a few percent of
/// it (a sum of independent roundings grows as the square root of `k`, the bound as `k`).
#[test]
fn eight_bit_results_stay_within_the_rounding_of_f32() {
    let mut rng = Rng(0xB17E);
    let mut worst = 0.0f64;
    let shapes: &[(usize, usize, usize)] = if cfg!(miri) {
        &[(2, 8, 256)]
    } else {
        &[(1, 8, 256), (3, 16, 512), (9, 24, 768), (20, 8, 2048)]
    };
    for format in FORMATS {
        for &(m, n, k) in shapes {
            let w = weight_blocks(format, n, k, &mut rng);
            let p = packed(format, &w, n, k);
            let mut wf = vec![0.0f32; n * k];
            format.dequantize(&w, &mut wf).unwrap();
            let x: Vec<f32> = (0..m * k)
                .map(|i| rng.uniform() * if i % 61 == 0 { 20.0 } else { 1.0 })
                .collect();
            // Per row of x and row of W: the f64 product, the bound and the magnitude.
            let exact = |i: usize, j: usize| {
                let (xr, wr) = (&x[i * k..(i + 1) * k], &wf[j * k..(j + 1) * k]);
                let (mut y, mut bound, mut mag) = (0.0f64, 0.0f64, 0.0f64);
                for (xb, wb) in xr.chunks_exact(32).zip(wr.chunks_exact(32)) {
                    let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    for (&xv, &wv) in xb.iter().zip(wb) {
                        y += f64::from(xv) * f64::from(wv);
                        bound += f64::from(wv.abs()) * f64::from(amax) / 254.0;
                        mag += f64::from((xv * wv).abs());
                    }
                }
                (y, bound, mag)
            };
            for (name, kernel) in kernels() {
                for precision in [ActPrecision::Byte, ActPrecision::Wide] {
                    let mut acts = QuantizedActs::default();
                    acts.quantize_at(&x, m, k, precision).unwrap();
                    acts.add_split();
                    let mut got = vec![f32::NAN; m * n];
                    // SAFETY: `kernels` lists only what this CPU runs; got is m·n, p holds n
                    // interleaved rows of k.
                    unsafe {
                        kernel(
                            SharedOut(got.as_mut_ptr()),
                            &acts,
                            format,
                            &p,
                            None,
                            n,
                            0,
                            n,
                        )
                    };
                    let share = if precision == ActPrecision::Byte {
                        1.0
                    } else {
                        1.0 / 200.0
                    };
                    for i in 0..m {
                        for j in 0..n {
                            let (y, bound, mag) = exact(i, j);
                            let err = (f64::from(got[i * n + j]) - y).abs();
                            if precision == ActPrecision::Byte {
                                worst = worst.max(err / bound);
                            }
                            assert!(
                                err <= share * bound + 1e-5 * mag,
                                "{name} {format} {precision:?} m={m} k={k} ({i},{j}): {} vs \
                                 {y} (bound {bound})",
                                got[i * n + j]
                            );
                        }
                    }
                }
            }
        }
    }
    eprintln!("worst 8-bit error: {worst:.3} of the bound");
    assert!(
        worst > 0.01,
        "8-bit errors of {worst} of the bound: is x rounded at all?"
    );
}
