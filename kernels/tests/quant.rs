//! `linear` with quantized weights (the decode GEMV, m ≤ 8) against `linear_scalar`, which
//! dequantizes exactly to f32: every format, awkward shapes, pools of 1–3 threads.
//!
//! The GEMV quantizes `x` to integers per block of 32 (16 bits; for interleaved weights,
//! 16 or 8 as the operand asks, and the tests here ask for both), so each element of `x`
//! may be off by half a step of its block (`0.5·amax/32767`, or `/127`); the tolerance is
//! that error carried through the weights, `Σ|w|·0.5·step`, plus f32 rounding. Runs
//! whichever kernel the CPU and the ISA override select (`.ci/run` runs the file under
//! each).

use qkv_kernels::matmul::linear_scalar;
use qkv_kernels::quant::act::ActPrecision;
use qkv_kernels::quant::testing::{weight_blocks as random_blocks, Rng};
use qkv_kernels::{linear, linear_many, Projection, QuantFormat, Weights};

/// Activations with blocks of very different magnitudes, an all-zero block, and outliers.
fn activations(len: usize, rng: &mut Rng) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let block = i / 32;
            if block % 11 == 5 {
                0.0
            } else {
                let v = rng.uniform() * 10f32.powi((block % 4) as i32 - 2);
                if i % 53 == 0 {
                    v * 40.0
                } else {
                    v
                }
            }
        })
        .collect()
}

/// The bound on `|linear − exact|` for every output: `Σ_p |w[j, p]|·0.5·step(x[i], p)` (the
/// activation rounding, a step being a block's largest magnitude over `levels`: 32767 for
/// 16-bit activations, 127 for 8-bit) plus f32 slack on `Σ|w·x|`.
fn tolerance(x: &[f32], wf: &[f32], m: usize, k: usize, n: usize, levels: f32) -> Vec<f64> {
    let steps: Vec<f64> = x
        .chunks_exact(32)
        .map(|b| f64::from(b.iter().fold(0.0f32, |a, v| a.max(v.abs()))) / f64::from(levels))
        .collect();
    let mut tol = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut rounding, mut mag) = (0.0f64, 0.0f64);
            for p in 0..k {
                let w = f64::from(wf[j * k + p]).abs();
                rounding += w * 0.5 * steps[(i * k + p) / 32];
                mag += w * f64::from(x[i * k + p]).abs();
            }
            tol[i * n + j] = rounding * 1.001 + 2e-6 * mag + 1e-6;
        }
    }
    tol
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

#[test]
fn quantized_gemv_matches_exact_dequantization() {
    // Under Miri (about a million times slower): one and three threads, k = 256 (8 blocks,
    // or one super-block), one ragged n, one row and 11 (a GEMV group of 8, then 3).
    let pools = if cfg!(miri) {
        vec![pool(1), pool(3)]
    } else {
        vec![pool(1), pool(2), pool(3)]
    };
    let mut rng = Rng(0x0DDB_1A5E_5BAD_5EED);
    let mut checked = 0;
    let (ks, ns, ms): (&[usize], &[usize], &[usize]) = if cfg!(miri) {
        (&[256], &[3], &[1, 11])
    } else {
        (
            &[32, 96, 576, 256, 768, 1536],
            &[1, 7, 33, 300],
            &[1, 2, 3, 4, 5, 8, 11, 16],
        )
    };
    for format in QuantFormat::ALL {
        for &k in ks {
            if !k.is_multiple_of(format.block_elems()) {
                continue;
            }
            for &n in ns {
                let w = random_blocks(format, n, k, &mut rng);
                let weights = Weights::Quant(format, &w);
                let mut wf = vec![0.0f32; n * k];
                format.dequantize(&w, &mut wf).unwrap();
                let bias: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
                for &m in ms {
                    let x = activations(m * k, &mut rng);
                    let b = (m % 2 == 1).then_some(&bias[..]);
                    let mut want = vec![0.0f32; m * n];
                    linear_scalar(&mut want, &x, weights, b, m, k, n).unwrap();
                    let tol = tolerance(&x, &wf, m, k, n, 32767.0);
                    for (t, p) in pools.iter().enumerate() {
                        let mut got = vec![f32::NAN; m * n];
                        p.install(|| linear(&mut got, &x, weights, b, m, k, n))
                            .unwrap();
                        for (e, ((g, w), tl)) in got.iter().zip(&want).zip(&tol).enumerate() {
                            let err = f64::from((g - w).abs());
                            assert!(
                                err <= *tl,
                                "{format} m={m} k={k} n={n} threads={} at ({}, {}): {g} vs \
                                 {w} (error {err:e} > {tl:e})",
                                t + 1,
                                e / n,
                                e % n
                            );
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked >= if cfg!(miri) { 32 } else { 1000 });
}

/// Prompt-sized row counts in GGUF's layout, for every format: past the GEMV, `linear`
/// takes the integer GEMM where the CPU has AVX-512 VNNI, else widens panels of `W` to f32;
/// either must agree with the exact dequantization within the activations' rounding (the
/// f32 panels are far inside it).
#[test]
fn quantized_prefill_rows_match_exact_dequantization() {
    let mut rng = Rng(0x5EED_0F9E_F111);
    let (ks, ms): (&[usize], &[usize]) = if cfg!(miri) {
        (&[256], &[17])
    } else {
        (&[256, 576, 768], &[17, 40, 70])
    };
    let n = if cfg!(miri) { 5 } else { 37 };
    for format in QuantFormat::ALL {
        for &k in ks {
            if !k.is_multiple_of(format.block_elems()) {
                continue;
            }
            let w = random_blocks(format, n, k, &mut rng);
            let weights = Weights::Quant(format, &w);
            let mut wf = vec![0.0f32; n * k];
            format.dequantize(&w, &mut wf).unwrap();
            let bias: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
            for &m in ms {
                let x = activations(m * k, &mut rng);
                let mut want = vec![0.0f32; m * n];
                linear_scalar(&mut want, &x, weights, Some(&bias), m, k, n).unwrap();
                let tol = tolerance(&x, &wf, m, k, n, 32767.0);
                for threads in [1, 2] {
                    let mut got = vec![f32::NAN; m * n];
                    pool(threads)
                        .install(|| linear(&mut got, &x, weights, Some(&bias), m, k, n))
                        .unwrap();
                    for (e, ((g, w), tl)) in got.iter().zip(&want).zip(&tol).enumerate() {
                        assert!(
                            f64::from((g - w).abs()) <= *tl,
                            "{format} m={m} k={k} threads={threads} at ({}, {}): {g} vs {w}",
                            e / n,
                            e % n
                        );
                    }
                }
            }
        }
    }
}

/// `linear_many` over quantized parts of different formats equals `linear` on each.
#[test]
fn quantized_groups_match_single_products() {
    let mut rng = Rng(5);
    let k = if cfg!(miri) { 256 } else { 768 };
    let formats = [QuantFormat::Q4_K, QuantFormat::Q8_0, QuantFormat::Q6_K];
    // Under Miri, fewer rows of W (the part boundaries are what this test is about).
    let ns = if cfg!(miri) {
        [5usize, 9, 3]
    } else {
        [40usize, 300, 17]
    };
    let ws: Vec<Vec<u8>> = formats
        .iter()
        .zip(ns)
        .map(|(&f, n)| random_blocks(f, n, k, &mut rng))
        .collect();
    // 13 rows: two GEMV groups of rows (8 and 5).
    for m in [3usize, 13] {
        let x = activations(m * k, &mut rng);
        let mut ys: Vec<Vec<f32>> = ns.iter().map(|&n| vec![0.0; m * n]).collect();
        pool(2).install(|| {
            let mut parts: Vec<Projection<'_, '_>> = ys
                .iter_mut()
                .zip(&ws)
                .zip(formats.iter().zip(ns))
                .map(|((y, w), (&f, n))| Projection {
                    w: Weights::Quant(f, w),
                    bias: None,
                    n,
                    y,
                })
                .collect();
            linear_many(&x, m, k, &mut parts).unwrap();
        });
        for ((y, w), (&f, n)) in ys.iter().zip(&ws).zip(formats.iter().zip(ns)) {
            let mut one = vec![0.0; m * n];
            linear(&mut one, &x, Weights::Quant(f, w), None, m, k, n).unwrap();
            assert_eq!(y, &one, "{f} m={m}");
        }
    }
}

/// A NaN or infinity in `x` makes its row of `y` non-finite for every format (the GEMV
/// never hides one), while the other rows stay finite.
#[test]
fn non_finite_activations_are_never_hidden() {
    let mut rng = Rng(99);
    // Under Miri: fewer rows of W, one position and NaN only (the infinities take the same
    // path through the activation scale).
    let (m, k, n) = if cfg!(miri) {
        (3, 512, 3)
    } else {
        (3, 512, 40)
    };
    let ats: &[usize] = if cfg!(miri) {
        &[200]
    } else {
        &[0, 31, 200, 511]
    };
    let bads: &[f32] = if cfg!(miri) {
        &[f32::NAN]
    } else {
        &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]
    };
    for format in QuantFormat::ALL {
        let w = random_blocks(format, n, k, &mut rng);
        for &bad in bads {
            for &at in ats {
                let mut x = activations(m * k, &mut rng);
                x[k + at] = bad;
                let mut y = vec![0.0f32; m * n];
                pool(2)
                    .install(|| linear(&mut y, &x, Weights::Quant(format, &w), None, m, k, n))
                    .unwrap();
                for j in 0..n {
                    assert!(!y[n + j].is_finite(), "{format} x={bad} at {at}: y[1, {j}]");
                    assert!(y[j].is_finite() && y[2 * n + j].is_finite(), "{format}");
                }
                // One row, as a decode step runs it.
                let x1 = &x[k..2 * k];
                let mut y1 = vec![0.0f32; n];
                pool(2)
                    .install(|| linear(&mut y1, x1, Weights::Quant(format, &w), None, 1, k, n))
                    .unwrap();
                assert!(
                    y1.iter().all(|v| !v.is_finite()),
                    "{format} x={bad} at {at}, m = 1"
                );
            }
        }
    }
}

/// Weights with their rows interleaved ([`qkv_kernels::quant::x8`]) give what the same
/// blocks give in GGUF's layout, through every path of `linear`: the decode GEMV (1 row),
/// one pass in tiles of 8 rows for any number of rows (2–40), on 1–3 threads; `linear_many`
/// beside GGUF-layout parts and as a group of interleaved parts only; and `rows_to_f32`
/// row for row. Every format with the layout, at both precisions of the activations
/// (each held to its own bound).
#[test]
fn interleaved_weights_match_their_file_layout() {
    use qkv_kernels::quant::x8;
    let mut rng = Rng(0x8_8888);
    let (ns, ms): (&[usize], &[usize]) = if cfg!(miri) {
        (&[8], &[1, 3])
    } else {
        // 70 and 260 rows cross where interleaved weights leave their one-pass GEMV for the
        // integer GEMM at 16 bits (where AVX-512 VNNI runs it).
        (&[8, 40, 264], &[1, 2, 5, 8, 11, 16, 40, 70, 260])
    };
    let formats = [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
        QuantFormat::Q8_0,
    ];
    for format in formats {
        for k in [256usize, 768] {
            for &n in ns {
                let w = random_blocks(format, n, k, &mut rng);
                let mut p = vec![0u8; w.len()];
                x8::pack(format, &w, n, k, &mut p).unwrap();
                for precision in [ActPrecision::Wide, ActPrecision::Byte] {
                    let (plain, packed) = (
                        Weights::Quant(format, &w),
                        Weights::QuantX8(format, precision, &p),
                    );
                    let mut a = vec![0.0f32; 3 * k];
                    let mut b = vec![1.0f32; 3 * k];
                    plain.rows_to_f32(n - 3, 3, k, &mut a).unwrap();
                    packed.rows_to_f32(n - 3, 3, k, &mut b).unwrap();
                    assert_eq!(a, b, "{format} rows_to_f32");
                    let mut wf = vec![0.0f32; n * k];
                    plain.rows_to_f32(0, n, k, &mut wf).unwrap();
                    let bias: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
                    for &m in ms {
                        let x = activations(m * k, &mut rng);
                        let tol = tolerance(&x, &wf, m, k, n, precision.max());
                        let mut want = vec![0.0f32; m * n];
                        linear_scalar(&mut want, &x, plain, Some(&bias), m, k, n).unwrap();
                        for threads in 1..=3 {
                            let mut got = vec![f32::NAN; m * n];
                            pool(threads)
                                .install(|| linear(&mut got, &x, packed, Some(&bias), m, k, n))
                                .unwrap();
                            for (e, ((g, w), t)) in got.iter().zip(&want).zip(&tol).enumerate() {
                                assert!(
                                    f64::from((g - w).abs()) <= *t,
                                    "{format} {precision} k={k} n={n} m={m} threads={threads} at {e}: {g} vs {w}"
                                );
                            }
                        }
                        // Beside a part in the file's layout, in one group.
                        let mut y1 = vec![0.0f32; m * n];
                        let mut y2 = vec![0.0f32; m * n];
                        let mut parts = [
                            Projection {
                                w: packed,
                                bias: None,
                                n,
                                y: &mut y1,
                            },
                            Projection {
                                w: plain,
                                bias: None,
                                n,
                                y: &mut y2,
                            },
                        ];
                        pool(2)
                            .install(|| linear_many(&x, m, k, &mut parts))
                            .unwrap();
                        let mut one = vec![0.0f32; m * n];
                        linear(&mut one, &x, packed, None, m, k, n).unwrap();
                        assert_eq!(y1, one, "{format} {precision} n={n} m={m}: linear_many");
                        // Interleaved parts only: one group, all rows at once.
                        let mut biased = vec![0.0f32; m * n];
                        linear(&mut biased, &x, packed, Some(&bias), m, k, n).unwrap();
                        let (mut y3, mut y4) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
                        let mut parts = [
                            Projection {
                                w: packed,
                                bias: None,
                                n,
                                y: &mut y3,
                            },
                            Projection {
                                w: packed,
                                bias: Some(&bias),
                                n,
                                y: &mut y4,
                            },
                        ];
                        pool(2)
                            .install(|| linear_many(&x, m, k, &mut parts))
                            .unwrap();
                        assert_eq!(
                            y3, one,
                            "{format} {precision} n={n} m={m}: interleaved group"
                        );
                        assert_eq!(
                            y4, biased,
                            "{format} {precision} n={n} m={m}: interleaved group, bias"
                        );
                    }
                }
            }
        }
    }
    // A matrix whose rows do not come in groups of 8 is refused, not misread.
    let w = random_blocks(QuantFormat::Q4_0, 12, 64, &mut rng);
    let mut y = vec![0.0f32; 12];
    let x = vec![0.5f32; 64];
    assert!(linear(
        &mut y,
        &x,
        Weights::QuantX8(QuantFormat::Q4_0, ActPrecision::Byte, &w),
        None,
        1,
        64,
        12
    )
    .is_err());
    assert!(linear(
        &mut y,
        &x,
        Weights::QuantX8(QuantFormat::Q8_0, ActPrecision::Wide, &w),
        None,
        1,
        64,
        12
    )
    .is_err());
}

/// A group of interleaved parts (Q6_K, Q4_K, Q8_0, as a Q4_K_M file's layers mix them)
/// beside a part in GGUF's layout (Q5_K, always at 16 bits), the interleaved parts all at
/// 16 bits, all at 8, or mixed (so that the group needs both precisions): each part equals
/// its own `linear`, for the row counts of decode, a batched step and a prompt.
#[test]
fn interleaved_groups_mix_formats() {
    use qkv_kernels::quant::x8;
    let mut rng = Rng(0x6_6666);
    let (n, k) = (16, 512);
    let formats = [
        QuantFormat::Q6_K,
        QuantFormat::Q4_K,
        QuantFormat::Q8_0,
        QuantFormat::Q5_K,
    ];
    let blocks: Vec<Vec<u8>> = formats
        .iter()
        .map(|&f| {
            let w = random_blocks(f, n, k, &mut rng);
            if !x8::supports(f) {
                return w;
            }
            let mut p = vec![0u8; w.len()];
            x8::pack(f, &w, n, k, &mut p).unwrap();
            p
        })
        .collect();
    fn weights(f: QuantFormat, precision: ActPrecision, b: &[u8]) -> Weights<'_> {
        if qkv_kernels::quant::x8::supports(f) {
            Weights::QuantX8(f, precision, b)
        } else {
            Weights::Quant(f, b)
        }
    }
    use ActPrecision::{Byte, Wide};
    let ms: &[usize] = if cfg!(miri) { &[1] } else { &[1, 2, 16, 33] };
    let mixes = [[Wide; 4], [Byte; 4], [Byte, Wide, Byte, Wide]];
    for (&m, mix) in ms.iter().flat_map(|m| mixes.iter().map(move |x| (m, x))) {
        let x = activations(m * k, &mut rng);
        let mut ys = vec![vec![0.0f32; m * n]; formats.len()];
        let mut parts: Vec<Projection<'_, '_>> = formats
            .iter()
            .zip(&blocks)
            .zip(mix)
            .zip(ys.iter_mut())
            .map(|(((&f, b), &p), y)| Projection {
                w: weights(f, p, b),
                bias: None,
                n,
                y,
            })
            .collect();
        pool(2)
            .install(|| linear_many(&x, m, k, &mut parts))
            .unwrap();
        for (((&f, b), &p), y) in formats.iter().zip(&blocks).zip(mix).zip(&ys) {
            let mut one = vec![0.0f32; m * n];
            linear(&mut one, &x, weights(f, p, b), None, m, k, n).unwrap();
            assert_eq!(*y, one, "{f} {p} m={m}");
        }
    }
}

/// Each row of a batch through interleaved weights gets the bits it gets alone, at both
/// precisions, for the row counts a batch engine's step reaches (and past 64, where at 16
/// bits the integer GEMM may take them).
#[test]
fn interleaved_rows_in_a_batch_equal_the_rows_alone() {
    use qkv_kernels::quant::x8;
    let mut rng = Rng(0x0ba7_c4ed);
    let (n, k) = (24, 512);
    let ms: &[usize] = if cfg!(miri) {
        &[3]
    } else {
        &[3, 5, 8, 9, 10, 16, 33, 64, 72]
    };
    for format in QuantFormat::ALL.into_iter().filter(|&f| x8::supports(f)) {
        let w = random_blocks(format, n, k, &mut rng);
        let mut p = vec![0u8; w.len()];
        x8::pack(format, &w, n, k, &mut p).unwrap();
        for precision in [ActPrecision::Wide, ActPrecision::Byte] {
            let packed = Weights::QuantX8(format, precision, &p);
            for &m in ms {
                let x = activations(m * k, &mut rng);
                let mut batch = vec![0.0f32; m * n];
                linear(&mut batch, &x, packed, None, m, k, n).unwrap();
                for i in 0..m {
                    let mut alone = vec![0.0f32; n];
                    linear(&mut alone, &x[i * k..(i + 1) * k], packed, None, 1, k, n).unwrap();
                    let got = &batch[i * n..(i + 1) * n];
                    let differ = (0..n).find(|&j| got[j].to_bits() != alone[j].to_bits());
                    assert_eq!(differ, None, "{format} {precision} m={m} row {i}");
                }
            }
        }
    }
}
