//! `linear` (GEMV and gemm paths, f32 and f16 weights, f32 stored transposed) against its
//! scalar reference and an f64 reference written here, on awkward shapes.

use qkv_kernels::matmul::{linear_scalar, FLOAT_ONE_PASS_MAX_ROWS, GEMV_MAX_ROWS};
use qkv_kernels::{bf16, f16, linear, KernelError, Weights};

struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

/// How [`check_stored`] stores `W`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stored {
    F32,
    F16,
    BF16,
    /// f32 transposed, `[k, n]`.
    F32T,
}

/// `w` `[n, k]` stored as `[k, n]`.
fn transposed(w: &[f32], n: usize, k: usize) -> Vec<f32> {
    (0..k * n).map(|i| w[(i % n) * k + i / n]).collect()
}

/// [`check_stored`] with `W` in f16 or f32.
fn check(m: usize, k: usize, n: usize, half: bool, with_bias: bool, rng: &mut Rng) {
    let stored = if half { Stored::F16 } else { Stored::F32 };
    check_stored(m, k, n, stored, with_bias, rng);
}

/// Checks `linear` and `linear_scalar` against an f64 reference. Tolerance per element:
/// 1e-6 · Σ|x·w| + 1e-6, well above f32 rounding of a k-term sum (~√k·6e-8 relative) and far
/// below any indexing mistake.
fn check_stored(m: usize, k: usize, n: usize, stored: Stored, with_bias: bool, rng: &mut Rng) {
    let x = rng.vec(m * k);
    let w32 = rng.vec(n * k);
    let w16: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
    let wb16: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
    let wref: Vec<f32> = match stored {
        Stored::F16 => w16.iter().map(|v| v.to_f32()).collect(),
        Stored::BF16 => wb16.iter().map(|v| v.to_f32()).collect(),
        _ => w32.clone(),
    };
    let bias = rng.vec(n);
    let b = with_bias.then_some(&bias[..]);
    let wt = if stored == Stored::F32T {
        transposed(&w32, n, k)
    } else {
        Vec::new()
    };
    let w = match stored {
        Stored::F16 => Weights::F16(&w16),
        Stored::BF16 => Weights::BF16(&wb16),
        Stored::F32 => Weights::F32(&w32),
        Stored::F32T => Weights::F32T(&wt),
    };
    let mut fast = vec![f32::NAN; m * n];
    let mut scalar = vec![f32::NAN; m * n];
    linear(&mut fast, &x, w, b, m, k, n).unwrap();
    linear_scalar(&mut scalar, &x, w, b, m, k, n).unwrap();
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut mag) = (0.0f64, 0.0f64);
            for p in 0..k {
                let t = x[i * k + p] as f64 * wref[j * k + p] as f64;
                exact += t;
                mag += t.abs();
            }
            if with_bias {
                exact += bias[j] as f64;
            }
            let tol = 1e-6 * mag + 1e-6;
            for (name, got) in [("fast", fast[i * n + j]), ("scalar", scalar[i * n + j])] {
                let err = (got as f64 - exact).abs();
                assert!(
                    err <= tol,
                    "{name} m={m} k={k} n={n} {stored:?} bias={with_bias} at ({i},{j}): {got} vs {exact} (err {err:e} > {tol:e})"
                );
            }
        }
    }
}

#[test]
fn gemv_shapes() {
    let mut rng = Rng(1);
    // Under Miri (about a million times slower): k around the 8-lane width and its unrolls,
    // n around the thread split, every row count.
    let (ks, ns): (&[usize], &[usize]) = if cfg!(miri) {
        (&[1, 9, 17, 33], &[1, 3, 5])
    } else {
        (&[1, 7, 8, 9, 17, 64, 577], &[1, 2, 3, 5, 63, 64, 65, 129])
    };
    // Past GEMV_MAX_ROWS, f32 and f16 rows still go to the GEMV in one pass (register tiles
    // of 4 rows of x by 3 of W), up to FLOAT_ONE_PASS_MAX_ROWS: ragged tiles both ways.
    let more: &[usize] = if cfg!(miri) {
        &[]
    } else {
        &[11, 16, 33, FLOAT_ONE_PASS_MAX_ROWS]
    };
    for m in (1..=GEMV_MAX_ROWS).chain(more.iter().copied()) {
        for &k in ks {
            for &n in ns {
                check(m, k, n, (m + k + n) % 2 == 0, n % 3 != 0, &mut rng);
            }
        }
    }
}

#[test]
fn gemv_large_parallel() {
    // Large enough to split across threads; n not a multiple of the tile or thread count.
    // Under Miri one shape just past the split threshold (n·k ≥ 2¹⁵).
    let mut rng = Rng(2);
    let shapes: &[(usize, usize, usize)] = if cfg!(miri) {
        &[(1, 64, 513)]
    } else {
        &[
            (1, 576, 1537),
            (3, 576, 2049),
            (8, 1536, 577),
            (1, 1000, 4099),
            // Several blocks of W's rows in the multi-row GEMV (24 rows of f16 at k = 1000,
            // 12 of f32), ragged at both ends of each thread's range.
            (16, 1000, 203),
        ]
    };
    for &(m, k, n) in shapes {
        check(m, k, n, true, true, &mut rng);
        check(m, k, n, false, false, &mut rng);
    }
}

#[test]
fn gemm_shapes() {
    let mut rng = Rng(3);
    if cfg!(miri) {
        // Under Miri: the gemm path (m past the GEMV rows) on f32 and f16 weights, small.
        for &(k, n) in &[(1, 7), (9, 5)] {
            check(GEMV_MAX_ROWS + 1, k, n, false, true, &mut rng);
            check(GEMV_MAX_ROWS + 1, k, n, true, false, &mut rng);
        }
        return;
    }
    for &m in &[GEMV_MAX_ROWS + 1, 17, 64, FLOAT_ONE_PASS_MAX_ROWS + 1] {
        for &k in &[1, 9, 576] {
            for &n in &[1, 7, 300] {
                check(m, k, n, false, true, &mut rng);
                check(m, k, n, true, n != 7, &mut rng);
            }
        }
    }
    check(33, 576, 1000, true, true, &mut rng);
    check(20, 1536, 333, true, false, &mut rng);
    // f16 panels hold 2^20 elements: at k = 64 that is 16384 rows, so n = 20001 spans two
    // panels with a ragged tail.
    check(9, 64, 20001, true, true, &mut rng);
    // Taller than the column split takes (gemm's own parallel split), and a column split
    // whose last block is ragged (n = 300 over 2 threads: 160 + 140 columns).
    check(2049, 9, 300, false, true, &mut rng);
    check(512, 64, 300, true, false, &mut rng);
}

/// f16 weights past the one-pass rows (or past the elements of `x` one pass keeps) go to the
/// blocked f16 GEMM (with AVX2, FMA and F16C): rows of `x` around its tile height of 6, `k`
/// around the 8-value transposes and the slices of 256, `n` around the micro-panels of 16
/// (AVX2) and 32 (AVX-512) and the blocks of up to 256, on pools of 1 to 3 threads (the
/// blocks are sized by the thread count), with and without bias. CI runs it again with
/// `QKV_ISA=avx2`, for the AVX2 kernel.
#[test]
fn f16_gemm_awkward_shapes() {
    let mut rng = Rng(7);
    let first = FLOAT_ONE_PASS_MAX_ROWS + 1;
    let (ms, ks, ns): (&[usize], &[usize], &[usize]) = if cfg!(miri) {
        (&[first], &[9], &[17])
    } else {
        (
            &[first, first + 1, first + 5, 300],
            &[1, 7, 8, 9, 255, 256, 257, 520],
            &[1, 15, 16, 17, 31, 33, 300],
        )
    };
    for threads in 1..=3 {
        pool(threads).install(|| {
            for &m in ms {
                for &k in ks {
                    for &n in ns {
                        check(m, k, n, true, (m + k + n) % 2 == 0, &mut rng);
                    }
                }
            }
        });
    }
    if !cfg!(miri) {
        // Several blocks of 256 rows per thread, a ragged last block, three k-slices; few
        // enough rows for one pass, but too long an `x` for L2 (ONE_PASS_X_ELEMS).
        check(130, 2100, 1100, true, true, &mut rng);
        check(40, 7000, 33, true, false, &mut rng);
        // Taller than one packed chunk of x (2^22 values: 1020 rows at k = 4096): two
        // chunks, the second ragged.
        check(1031, 4096, 17, true, true, &mut rng);
    }
}

/// bf16 weights on every path: the GEMV (every row count up to its limit, ragged tiles), the
/// one pass, and past it the 16-bit GEMM (f16's, widening by a shift) around its tiles,
/// slices and blocks, on pools of 1 to 3 threads; against the f64 reference and the scalar
/// one. CI runs it again with `QKV_ISA=avx2` and `scalar`.
#[test]
fn bf16_awkward_shapes() {
    let mut rng = Rng(0xbf);
    let first = FLOAT_ONE_PASS_MAX_ROWS + 1;
    let (ms, ks, ns): (&[usize], &[usize], &[usize]) = if cfg!(miri) {
        (&[1, first], &[9], &[17])
    } else {
        (
            &[1, 2, 5, GEMV_MAX_ROWS, 13, first, first + 5],
            &[1, 7, 8, 9, 255, 257, 520],
            &[1, 15, 17, 33, 300],
        )
    };
    for threads in 1..=3 {
        pool(threads).install(|| {
            for &m in ms {
                for &k in ks {
                    for &n in ns {
                        let bias = (m + k + n) % 2 == 0;
                        check_stored(m, k, n, Stored::BF16, bias, &mut rng);
                    }
                }
            }
        });
    }
    if !cfg!(miri) {
        // Too long an `x` for one pass (ONE_PASS_X_ELEMS): the GEMM at few rows.
        check_stored(40, 7000, 33, Stored::BF16, true, &mut rng);
    }
}

/// f32 stored transposed goes to gemm for every row count, one row included, and splits by
/// columns on pools of 1 to 5 threads (column blocks start at an offset into each row).
#[test]
fn transposed_f32_shapes() {
    let mut rng = Rng(6);
    let (ms, ks, ns): (&[usize], &[usize], &[usize]) = if cfg!(miri) {
        (&[1, GEMV_MAX_ROWS + 1], &[1, 9], &[5, 37])
    } else {
        (&[1, 2, 8, 9, 64], &[1, 9, 576], &[1, 7, 300])
    };
    for &m in ms {
        for &k in ks {
            for &n in ns {
                check_stored(m, k, n, Stored::F32T, n != 7, &mut rng);
            }
        }
    }
    for threads in 1..=5 {
        pool(threads).install(|| {
            if cfg!(miri) {
                check_stored(GEMV_MAX_ROWS + 2, 4, 37, Stored::F32T, true, &mut rng);
                return;
            }
            check_stored(512, 64, 300, Stored::F32T, false, &mut rng);
            check_stored(3, 576, 1537, Stored::F32T, true, &mut rng);
        });
    }
    if !cfg!(miri) {
        // Taller than the column split takes: gemm's own split.
        check_stored(2049, 9, 300, Stored::F32T, true, &mut rng);
    }
}

/// Rows of a transposed matrix read back as rows of `W` (its reference and embedding path),
/// and rows past its end are an error.
#[test]
fn transposed_rows_to_f32() {
    let (k, n) = (3, 4);
    let w: Vec<f32> = (0..n * k).map(|v| v as f32).collect(); // W[j][p] = j·k + p
    let wt = transposed(&w, n, k);
    let mut got = vec![0.0; 2 * k];
    Weights::F32T(&wt).rows_to_f32(1, 2, k, &mut got).unwrap();
    assert_eq!(got, w[k..3 * k]);
    assert!(Weights::F32T(&wt).rows_to_f32(3, 2, k, &mut got).is_err());
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
}

/// The splits depend on the pool: the column split of the gemm path runs for 2–4 threads
/// only, and the GEMV's row ranges change with the thread count. The default pool has as many
/// threads as the machine has cores, so the cases above may miss them; here every split runs
/// on pools of 1 to 5 threads, with ragged last blocks.
#[test]
fn splits_on_pools_of_one_to_five_threads() {
    let mut rng = Rng(4);
    for threads in 1..=5 {
        pool(threads).install(|| {
            if cfg!(miri) {
                // Under Miri: the column split of the gemm path (m past the GEMV rows, small
                // k) and a GEMV just past its split threshold, both ragged.
                check(GEMV_MAX_ROWS + 2, 4, 37, true, false, &mut rng);
                check(1, 64, 513, false, true, &mut rng);
                return;
            }
            check(512, 64, 300, true, false, &mut rng);
            check(96, 576, 191, false, true, &mut rng);
            check(1, 576, 1537, true, true, &mut rng);
            check(4, 1000, 4099, false, false, &mut rng);
        });
    }
}

/// Many f16 prefills at once on one pool, as concurrent sessions make them: a thread that
/// waits inside one call's parallel sections runs others, which once found the thread's
/// panel buffer still borrowed and panicked.
#[test]
fn concurrent_f16_calls_on_one_pool_nest_safely() {
    // Under Miri: a small prefill (still the f16 panel path) and fewer concurrent calls.
    let (m, k, n) = if cfg!(miri) {
        (12, 16, 40)
    } else {
        (200, 512, 2048)
    };
    let calls = if cfg!(miri) { 6 } else { 64 };
    let mut rng = Rng(5);
    let x = rng.vec(m * k);
    let w: Vec<f16> = rng.vec(n * k).iter().map(|&v| f16::from_f32(v)).collect();
    let mut want = vec![0.0; m * n];
    linear_scalar(&mut want, &x, Weights::F16(&w), None, m, k, n).unwrap();
    pool(4).install(|| {
        use rayon::prelude::*;
        (0..calls).into_par_iter().for_each(|_| {
            let mut y = vec![0.0; m * n];
            linear(&mut y, &x, Weights::F16(&w), None, m, k, n).unwrap();
            let worst = y
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-3, "max difference {worst}");
        });
    });
}

#[test]
fn bad_shapes_are_errors() {
    let x = vec![0.0; 6];
    let w = vec![0.0; 6];
    let mut y = vec![0.0; 4];
    assert!(linear(&mut y, &x, Weights::F32(&w), None, 2, 3, 2).is_ok());
    assert!(matches!(
        linear(&mut y, &x, Weights::F32(&w), None, 2, 3, 3),
        Err(KernelError::Length {
            what: "weights",
            ..
        })
    ));
    assert!(matches!(
        linear(&mut y[..3], &x, Weights::F32(&w), None, 2, 3, 2),
        Err(KernelError::Length { what: "y", .. })
    ));
    assert!(matches!(
        linear(&mut y, &x, Weights::F32(&w), Some(&[0.0; 3]), 2, 3, 2),
        Err(KernelError::Length { what: "bias", .. })
    ));
    assert!(matches!(
        linear(&mut y, &x, Weights::F32(&w), None, 0, 3, 2),
        Err(KernelError::ZeroDim(_))
    ));
}

#[test]
fn linear_many_equals_separate_calls() {
    use qkv_kernels::{linear_many, Projection};
    let mut rng = Rng(4);
    // Q/K/V-like group (n = 576, 192, 192) and a ragged one, in GEMV and gemm regimes.
    // Under Miri: the same regimes (one row, a GEMV group, the gemm path) with small shapes.
    let (mks, groups): (&[(usize, usize)], &[&[usize]]) = if cfg!(miri) {
        (&[(1, 24), (3, 9), (12, 8)], &[&[9, 3, 3], &[1, 5, 17]])
    } else {
        (
            &[(1, 576), (3, 64), (8, 130), (12, 64)],
            &[&[576, 192, 192], &[1, 37, 1000]],
        )
    };
    for &(m, k) in mks {
        for &ns in groups {
            let x = rng.vec(m * k);
            let ws: Vec<Vec<f16>> = ns
                .iter()
                .map(|&n| rng.vec(n * k).iter().map(|&v| f16::from_f32(v)).collect())
                .collect();
            let biases: Vec<Vec<f32>> = ns.iter().map(|&n| rng.vec(n)).collect();
            let mut together: Vec<Vec<f32>> = ns.iter().map(|&n| vec![f32::NAN; m * n]).collect();
            let mut projections: Vec<Projection> = together
                .iter_mut()
                .zip(ns)
                .enumerate()
                .map(|(i, (y, &n))| Projection {
                    w: Weights::F16(&ws[i]),
                    bias: (i != 1).then_some(&biases[i][..]),
                    n,
                    y,
                })
                .collect();
            linear_many(&x, m, k, &mut projections).unwrap();
            for (i, &n) in ns.iter().enumerate() {
                let mut alone = vec![0.0; m * n];
                let bias = (i != 1).then_some(&biases[i][..]);
                linear(&mut alone, &x, Weights::F16(&ws[i]), bias, m, k, n).unwrap();
                // Same kernel on the same rows: bitwise equal.
                assert_eq!(together[i], alone, "m={m} k={k} n={ns:?} part {i}");
            }
        }
    }
    // One bad projection fails the whole call before anything runs.
    let x = vec![0.0; 4];
    let w = vec![0.0f32; 8];
    let (mut a, mut b) = (vec![0.0; 2], vec![0.0; 3]);
    let mut bad = [
        Projection {
            w: Weights::F32(&w),
            bias: None,
            n: 2,
            y: &mut a,
        },
        Projection {
            w: Weights::F32(&w),
            bias: None,
            n: 3,
            y: &mut b,
        },
    ];
    assert!(linear_many(&x, 1, 4, &mut bad).is_err());
}

/// Shapes whose products overflow `usize` are typed errors naming the product; before the
/// check, `m·k` wrapped to 0 and the call ran off the empty slices.
#[test]
fn overflowing_shapes_are_errors() {
    use qkv_kernels::{linear_many, Projection};
    let is_invalid_naming = |r: Result<(), KernelError>, what: &str| match r {
        Err(KernelError::Invalid(msg)) => assert!(msg.contains(what), "{msg}"),
        other => panic!("expected an Invalid error naming {what}, got {other:?}"),
    };
    let mut y = [0.0f32; 16];
    // m·k = 4 · 2⁶² wraps to 0, matching the empty x and weights.
    is_invalid_naming(
        linear(&mut y, &[], Weights::F32(&[]), None, 4, 1 << 62, 4),
        "m·k",
    );
    is_invalid_naming(
        linear_scalar(&mut y, &[], Weights::F16(&[]), None, 4, 1 << 62, 4),
        "m·k",
    );
    // n·k = 2⁶² · 4 wraps to 0 with x itself the right length.
    let x = [0.0f32; 4];
    is_invalid_naming(
        linear(&mut y[..0], &x, Weights::F32(&[]), None, 1, 4, 1 << 62),
        "n·k",
    );
    let mut projections = [Projection {
        w: Weights::F32(&[]),
        bias: None,
        n: 1 << 62,
        y: &mut y[..0],
    }];
    is_invalid_naming(linear_many(&x, 1, 4, &mut projections), "n·k");
    let mut empty: [f32; 0] = [];
    let mut projections = [Projection {
        w: Weights::F32(&[]),
        bias: None,
        n: 4,
        y: &mut empty,
    }];
    is_invalid_naming(linear_many(&[], 4, 1 << 62, &mut projections), "m·k");
}

/// `Weights::rows_to_f32` widens whole rows exactly and refuses rows past the matrix.
#[test]
fn weights_rows_to_f32_is_checked() {
    let w = [1.0f32, 2.0, 3.0, 4.0];
    let h = [f16::from_f32(3.0), f16::from_f32(-0.5)];
    let mut out = [0.0f32; 2];
    Weights::F32(&w).rows_to_f32(1, 1, 2, &mut out).unwrap();
    assert_eq!(out, [3.0, 4.0]);
    Weights::F16(&h).rows_to_f32(0, 1, 2, &mut out).unwrap();
    assert_eq!(out, [3.0, -0.5]);
    assert!(Weights::F32(&w).rows_to_f32(2, 1, 2, &mut out).is_err());
    assert!(Weights::F16(&h)
        .rows_to_f32(usize::MAX, 1, 2, &mut out)
        .is_err());
    assert!(Weights::F32(&w).rows_to_f32(0, 1, 3, &mut out).is_err());
    // One Q8_0 row of 32: scale 2 (f16 0x4000), q = 0..32.
    let mut block = vec![0x00u8, 0x40];
    block.extend(0..32u8);
    let mut row = [0.0f32; 32];
    let q = Weights::Quant(qkv_kernels::QuantFormat::Q8_0, &block);
    q.rows_to_f32(0, 1, 32, &mut row).unwrap();
    assert_eq!(row[31], 62.0);
    assert!(q.rows_to_f32(1, 1, 32, &mut row).is_err());
    assert!(
        q.check_shape(1, 48).is_err(),
        "a row of 48 is not whole blocks"
    );
}
