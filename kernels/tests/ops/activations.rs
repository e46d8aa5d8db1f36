//! The activations, softmax, log-sum-exp, argmax, erf and the elementwise add: each fast
//! kernel against its scalar reference, known values (several from PyTorch 2.x in f32), and
//! the edge cases.

use super::{assert_close, Rng, SIZES};
use qkv_kernels::activation::{
    add_inplace, add_inplace_scalar, argmax, argmax_scalar, erf, erf_f64, erfc, erfc_f64,
    geglu_tanh, geglu_tanh_scalar, gelu_erf_inplace, gelu_erf_inplace_scalar, gelu_tanh_inplace,
    gelu_tanh_inplace_scalar, log_sum_exp, log_sum_exp_scalar, relu_inplace, relu_inplace_scalar,
    silu_inplace, silu_inplace_scalar, softcap_inplace, softcap_inplace_scalar, softmax_inplace,
    softmax_inplace_scalar, swiglu, swiglu_scalar,
};

/// Runs an in-place fast kernel and its reference on the same random data.
fn check_map(
    name: &str,
    fast: fn(&mut [f32]),
    slow: fn(&mut [f32]),
    lo: f32,
    hi: f32,
    abs: f32,
    rel: f32,
) {
    let mut rng = Rng::new(name.len() as u64 * 7919);
    for &n in SIZES {
        let x = rng.vec(n, lo, hi);
        let mut a = x.clone();
        let mut b = x.clone();
        fast(&mut a);
        slow(&mut b);
        assert_close(&format!("{name} n {n}"), &a, &b, abs, rel);
    }
}

#[test]
fn relu_matches_scalar() {
    // Exact operation: bitwise equal.
    check_map(
        "relu",
        relu_inplace,
        relu_inplace_scalar,
        -5.0,
        5.0,
        0.0,
        0.0,
    );
}

#[test]
fn silu_matches_scalar() {
    // Vector exp (rel err < 2.5e-7) against std exp: a few ulps, so 1e-6 relative + 1e-7 abs.
    check_map(
        "silu",
        silu_inplace,
        silu_inplace_scalar,
        -10.0,
        10.0,
        1e-7,
        1e-6,
    );
    // Far tails: silu(x) → 0 for x ≪ 0, → x for x ≫ 0.
    check_map(
        "silu wide",
        silu_inplace,
        silu_inplace_scalar,
        -100.0,
        100.0,
        1e-7,
        1e-6,
    );
}

#[test]
fn gelu_tanh_matches_scalar() {
    // Fast: x·sigmoid(2u); reference: 0.5x(1 + tanh u) whose 1 + tanh cancels for x < 0.
    // The difference is the reference's rounding: ~6e-8 in (1 + tanh) times |x|/2, so
    // 2e-7·|x| is covered by 2e-6 absolute on |x| ≤ 10, plus 1e-6 relative.
    check_map(
        "gelu_tanh",
        gelu_tanh_inplace,
        gelu_tanh_inplace_scalar,
        -10.0,
        10.0,
        2e-6,
        1e-6,
    );
}

#[test]
fn gelu_erf_matches_scalar() {
    // Fast erf is a fitted polynomial (abs err ~1e-7 in erf, relative ~2e-7 in erfc);
    // the reference is f64. 3e-7 absolute plus 1e-6 relative.
    check_map(
        "gelu_erf",
        gelu_erf_inplace,
        gelu_erf_inplace_scalar,
        -6.0,
        6.0,
        3e-7,
        1e-6,
    );
    // Across the branch point |x| = √2 and the far tails (down to where erfc underflows).
    check_map(
        "gelu_erf wide",
        gelu_erf_inplace,
        gelu_erf_inplace_scalar,
        -14.0,
        14.0,
        3e-7,
        1e-6,
    );
    // The negative tail keeps relative accuracy (it is computed from erfc directly):
    // gelu(-8) = -8·0.5·erfc(8/√2) ≈ -5.1e-15. 2e-6 relative.
    let mut a = [-8.0f32, -10.0, -4.0, -12.0];
    let mut b = a;
    gelu_erf_inplace(&mut a);
    gelu_erf_inplace_scalar(&mut b);
    assert_close("gelu_erf tail", &a, &b, 0.0, 2e-6);
}

#[test]
fn gelu_silu_known_values() {
    let x = [1.0f32, -1.0, 2.0, 0.5, -3.0];
    // PyTorch 2.x f32 values; 1 ulp-ish tolerance (2e-7 relative + 1e-9 absolute).
    // Except at x = -3, where PyTorch's f32 `1 + erf` cancels (it gives -0.004050225 for
    // GELU and -0.003637433 for the tanh form): there the exact values (mpmath) are used.
    let gelu = [
        0.841_344_7,
        -0.158_655_26,
        1.954_499_7,
        0.345_731_23,
        -0.004_049_694,
    ];
    let gelu_tanh = [
        0.841_192,
        -0.158_808,
        1.954_597_7,
        0.345_714,
        -0.003_637_392,
    ];
    let silu = [
        0.731_058_6,
        -0.268_941_43,
        1.761_594,
        0.311_229_68,
        -0.142_277_61,
    ];
    for (f, want, name, rel) in [
        (gelu_erf_inplace as fn(&mut [f32]), gelu, "gelu_erf", 4e-7),
        (gelu_erf_inplace_scalar, gelu, "gelu_erf_scalar", 2e-7),
        (gelu_tanh_inplace, gelu_tanh, "gelu_tanh", 4e-7),
        // The literal PyTorch formula shares PyTorch's cancellation at -3 (1.1e-5 rel).
        (
            gelu_tanh_inplace_scalar,
            gelu_tanh,
            "gelu_tanh_scalar",
            2e-5,
        ),
        (silu_inplace, silu, "silu", 4e-7),
        (silu_inplace_scalar, silu, "silu_scalar", 2e-7),
    ] {
        let mut v = x;
        f(&mut v);
        assert_close(name, &v, &want, 1e-9, rel);
    }
    let mut zero = [0.0f32; 9];
    gelu_erf_inplace(&mut zero);
    assert_eq!(zero, [0.0; 9]);
}

#[test]
fn erf_known_values() {
    // Reference values from PyTorch f64 `torch.special.erf` / `erfc` (i.e. libm).
    for (x, want) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (-3.0, -0.999_977_909_503_001_4),
        (0.0, 0.0),
    ] {
        // f64: 1e-15 absolute.
        assert!(
            (erf_f64(x) - want).abs() <= 1e-15,
            "erf_f64({x}) = {}",
            erf_f64(x)
        );
        // f32: correctly rounded here.
        assert_eq!(erf(x as f32), want as f32, "erf({x})");
    }
    for (x, want) in [
        (3.0, 2.209_049_699_858_544e-5),
        (5.0, 1.537_459_794_428_035e-12),
        (10.0, 2.088_487_583_762_545e-45),
    ] {
        // Relative 1e-13 even where erfc is tiny.
        let got = erfc_f64(x);
        assert!(((got - want) / want).abs() < 1e-13, "erfc_f64({x}) = {got}");
    }
    assert_eq!(erfc(0.0), 1.0);
    assert_eq!(erfc_f64(-3.0), 2.0 - 2.209_049_699_858_544e-5);
    assert!(erf(f32::NAN).is_nan());
    assert_eq!(erf(f32::INFINITY), 1.0);
    assert_eq!(erf(f32::NEG_INFINITY), -1.0);
    // Odd symmetry and continuity across the series / continued-fraction switch at 2.5.
    let below = erf_f64(2.5 - 1e-12);
    let above = erf_f64(2.5);
    assert!((above - below).abs() < 1e-14);
    assert_eq!(erf_f64(-1.7), -erf_f64(1.7));
}

#[test]
fn swiglu_matches_scalar() {
    let mut rng = Rng::new(5);
    for &n in SIZES {
        let g = rng.vec(n, -8.0, 8.0);
        let u = rng.vec(n, -3.0, 3.0);
        let mut a = vec![0.0; n];
        let mut b = vec![0.0; n];
        swiglu(&mut a, &g, &u).unwrap();
        swiglu_scalar(&mut b, &g, &u).unwrap();
        // silu differs by a few ulps (vector exp); then one exact-rounded multiply.
        assert_close(&format!("swiglu n {n}"), &a, &b, 1e-7, 1e-6);
    }
    let mut out = [0.0f32; 3];
    assert!(swiglu(&mut out, &[0.0; 2], &[0.0; 3]).is_err());
    assert!(swiglu(&mut out, &[0.0; 3], &[0.0; 4]).is_err());
    assert!(swiglu_scalar(&mut out, &[0.0; 3], &[0.0; 2]).is_err());
}

#[test]
fn geglu_matches_scalar() {
    let mut rng = Rng::new(15);
    for &n in SIZES {
        let g = rng.vec(n, -8.0, 8.0);
        let u = rng.vec(n, -3.0, 3.0);
        let mut a = vec![0.0; n];
        let mut b = vec![0.0; n];
        geglu_tanh(&mut a, &g, &u).unwrap();
        geglu_tanh_scalar(&mut b, &g, &u).unwrap();
        // As gelu_tanh (2e-7·|g| from the reference's cancellation, ≤ 1.6e-6 here), times
        // |u| ≤ 3, plus the vector exp's ulps.
        assert_close(&format!("geglu n {n}"), &a, &b, 5e-6, 1e-6);
        // The gate is gelu_tanh exactly: the same arithmetic as the vector GELU.
        let mut gelu = g.clone();
        gelu_tanh_inplace(&mut gelu);
        let prod: Vec<f32> = gelu.iter().zip(&u).map(|(x, y)| x * y).collect();
        assert_eq!(a, prod, "geglu n {n} against gelu_tanh · up");
    }
    let mut out = [0.0f32; 3];
    assert!(geglu_tanh(&mut out, &[0.0; 2], &[0.0; 3]).is_err());
    assert!(geglu_tanh_scalar(&mut out, &[0.0; 3], &[0.0; 4]).is_err());
}

#[test]
fn softcap_matches_scalar() {
    // Gemma 2's caps (50 for attention scores, 30 for the final logits) over values well
    // past them, and a small cap whose tanh argument crosses the polynomial's 1/4 boundary.
    for (cap, lo, hi) in [
        (50.0f32, -400.0, 400.0),
        (30.0, -90.0, 90.0),
        (1.0, -2.0, 2.0),
    ] {
        let mut rng = Rng::new(cap as u64);
        for &n in SIZES {
            let x = rng.vec(n, lo, hi);
            let (mut a, mut b) = (x.clone(), x.clone());
            softcap_inplace(&mut a, cap);
            softcap_inplace_scalar(&mut b, cap);
            // tanh's vector form: below 1e-6 relative (see the sweep below), plus the f32
            // rounding of the reference.
            assert_close(&format!("softcap {cap} n {n}"), &a, &b, 1e-7, 1.2e-6);
        }
    }
    // A dense sweep of tanh's argument over [-8, 8], through both branches and far out,
    // against f64 (under Miri 8,001 points, 125 of them in the polynomial's branch).
    let (half, step) = if cfg!(miri) {
        (4_000, 2e-3)
    } else {
        (400_000, 2e-5)
    };
    let xs: Vec<f32> = (-half..=half).map(|i| i as f32 * step).collect();
    let mut got = xs.clone();
    softcap_inplace(&mut got, 1.0);
    let worst = xs
        .iter()
        .zip(&got)
        .map(|(&x, &g)| {
            let want = (x as f64).tanh();
            if want == 0.0 {
                (g as f64).abs()
            } else {
                ((g as f64 - want) / want).abs()
            }
        })
        .fold(0.0f64, f64::max);
    assert!(worst < 1e-6, "tanh: worst relative error {worst:e}");
    // Exact at 0, saturates at ±cap, keeps NaN and the infinities' limits.
    let mut edge = [
        0.0f32,
        -0.0,
        1e30,
        -1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    softcap_inplace(&mut edge, 30.0);
    assert_eq!(edge[..6], [0.0, -0.0, 30.0, -30.0, 30.0, -30.0]);
    assert!(edge[1].is_sign_negative() && edge[6].is_nan());
}

#[test]
fn add_matches_scalar() {
    let mut rng = Rng::new(6);
    for &n in SIZES {
        let d = rng.vec(n, -1.0, 1.0);
        let s = rng.vec(n, -1.0, 1.0);
        let (mut a, mut b) = (d.clone(), d.clone());
        add_inplace(&mut a, &s).unwrap();
        add_inplace_scalar(&mut b, &s).unwrap();
        // One rounded add per element either way: bitwise equal.
        assert_eq!(a, b, "add n {n}");
    }
    assert!(add_inplace(&mut [0.0; 3], &[0.0; 2]).is_err());
    assert!(add_inplace_scalar(&mut [0.0; 3], &[0.0; 4]).is_err());
}

#[test]
fn softmax_matches_scalar() {
    let mut rng = Rng::new(7);
    for &n in SIZES {
        let mut x = rng.vec(n, -10.0, 10.0);
        // Mask a few entries, as the attention kernels do.
        for i in (0..n).step_by(5) {
            x[i] = f32::NEG_INFINITY;
        }
        if n == 1 {
            x[0] = 3.0;
        }
        let (mut a, mut b) = (x.clone(), x.clone());
        softmax_inplace(&mut a);
        softmax_inplace_scalar(&mut b);
        // Vector exp (2.5e-7 rel) and an f32 lane sum over ≤1536 terms against f64: 2e-6
        // relative, 1e-9 absolute floor for the tiniest probabilities.
        assert_close(&format!("softmax n {n}"), &a, &b, 1e-9, 2e-6);
        let sum: f32 = a.iter().sum();
        assert!((sum - 1.0).abs() < 1e-5, "softmax n {n} sums to {sum}");
        for i in (0..n).step_by(5).filter(|_| n > 1) {
            assert_eq!(a[i], 0.0, "masked entry {i}");
        }
    }
}

#[test]
fn log_sum_exp_and_argmax_match_scalar() {
    let mut rng = Rng::new(11);
    let long: &[usize] = if cfg!(miri) {
        &[0, 16]
    } else {
        &[0, 16, 49152, 49155]
    };
    let sizes = SIZES.iter().chain(long).copied();
    for n in sizes {
        let mut x = rng.vec(n, -30.0, 30.0);
        for i in (0..n).step_by(7) {
            x[i] = f32::NEG_INFINITY;
        }
        // Ties: the maximum written twice (over the stripes), the first copy must win.
        if n > 3 {
            let (a, b) = (n / 3, 2 * n / 3);
            x[a] = 40.0;
            x[b] = 40.0;
            assert_eq!(argmax(&x), a, "first of two ties, n {n}");
        }
        assert_eq!(argmax(&x), argmax_scalar(&x), "argmax n {n}");
        let (fast, slow) = (log_sum_exp(&x), log_sum_exp_scalar(&x));
        if n == 0 || n == 1 {
            assert_eq!(fast, f32::NEG_INFINITY, "n {n}");
            assert_eq!(slow, f32::NEG_INFINITY, "n {n}");
        } else {
            // Vector exp (2.5e-7 rel) and an f32 lane sum against f64; lse ≥ max ≈ 30–40.
            assert!(
                (fast - slow).abs() <= 2e-6 * slow.abs(),
                "lse n {n}: {fast} vs {slow}"
            );
        }
    }
    // Known value and shift invariance.
    let lse = log_sum_exp(&[1.0, 2.0, 3.0]);
    assert!((lse - 3.407_606).abs() < 1e-6, "{lse}"); // ln(e + e² + e³)
    let lse = log_sum_exp(&[1001.0, 1002.0, 1003.0]);
    assert!((lse - 1_003.407_6).abs() < 1e-3, "{lse}");
    // NaN anywhere → NaN; +inf → +inf; all -inf → -inf.
    for n in [3usize, 8, 9, 20] {
        for at in [0, n / 2, n - 1] {
            let mut x = vec![1.0f32; n];
            x[at] = f32::NAN;
            assert!(log_sum_exp(&x).is_nan() && log_sum_exp_scalar(&x).is_nan());
            assert_ne!(argmax(&x), at, "NaN chosen, n {n}");
            assert_eq!(argmax(&x), argmax_scalar(&x));
            x[at] = f32::INFINITY;
            assert_eq!(log_sum_exp(&x), f32::INFINITY);
            assert_eq!(log_sum_exp_scalar(&x), f32::INFINITY);
            assert_eq!(argmax(&x), at);
        }
        let x = vec![f32::NEG_INFINITY; n];
        assert_eq!(log_sum_exp(&x), f32::NEG_INFINITY);
        assert_eq!(argmax(&x), 0);
        let x = vec![f32::NAN; n];
        assert_eq!((argmax(&x), argmax_scalar(&x)), (0, 0));
    }
}

#[test]
fn softmax_edge_cases() {
    // Fully masked rows become zeros, never NaN.
    for &n in SIZES {
        let mut a = vec![f32::NEG_INFINITY; n];
        let mut b = a.clone();
        softmax_inplace(&mut a);
        softmax_inplace_scalar(&mut b);
        assert_eq!(a, vec![0.0; n], "all -inf n {n}");
        assert_eq!(b, vec![0.0; n], "all -inf scalar n {n}");
    }
    // Empty row: nothing to do.
    softmax_inplace(&mut []);
    // PyTorch 2.x f32: softmax([1, 2, 3]); 2e-7 relative.
    let mut x = [1.0f32, 2.0, 3.0];
    softmax_inplace(&mut x);
    assert_close(
        "softmax [1,2,3]",
        &x,
        &[0.090_030_57, 0.244_728_48, 0.665_240_94],
        0.0,
        2e-7,
    );
    // Large values do not overflow: shift invariance.
    let mut big = [1000.0f32, 1001.0, 1002.0];
    softmax_inplace(&mut big);
    assert_close("softmax big", &big, &x, 0.0, 2e-7);
    // A NaN anywhere poisons the row (as in PyTorch), on both paths, any length.
    for &n in &[3usize, 9, 17] {
        let mut a = vec![0.5f32; n];
        a[1] = f32::NAN;
        softmax_inplace(&mut a);
        assert!(a.iter().all(|v| v.is_nan()), "NaN row n {n}");
    }
    // So does a +inf (exp(inf − inf) is NaN, and it spreads through the sum), wherever it
    // sits: in a vector lane or in the tail.
    for &n in &[3usize, 9, 17] {
        for at in [0, n / 2, n - 1] {
            let mut a = vec![0.5f32; n];
            a[at] = f32::INFINITY;
            let mut b = a.clone();
            softmax_inplace(&mut a);
            softmax_inplace_scalar(&mut b);
            assert!(a.iter().all(|v| v.is_nan()), "+inf at {at} of {n}: {a:?}");
            assert!(
                b.iter().all(|v| v.is_nan()),
                "+inf at {at} of {n}, scalar: {b:?}"
            );
        }
    }
}

#[test]
fn relu_turns_nan_into_zero() {
    for &n in SIZES {
        let mut a: Vec<f32> = (0..n)
            .map(|i| match i % 3 {
                0 => f32::NAN,
                1 => -1.5,
                _ => 2.5,
            })
            .collect();
        let mut b = a.clone();
        relu_inplace(&mut a);
        relu_inplace_scalar(&mut b);
        let want: Vec<f32> = (0..n).map(|i| if i % 3 == 2 { 2.5 } else { 0.0 }).collect();
        assert_eq!(a, want, "n {n}");
        assert_eq!(b, want, "scalar n {n}");
    }
}
