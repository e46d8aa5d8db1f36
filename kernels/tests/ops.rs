//! Elementwise and norm kernels: each fast kernel against its scalar reference on awkward
//! sizes, known values (several taken from PyTorch 2.x in f32, marked as such), and the
//! error cases.

use qkv_kernels::activation::{
    add_inplace, add_inplace_scalar, argmax, argmax_scalar, erf, erf_f64, erfc, erfc_f64,
    geglu_tanh, geglu_tanh_scalar, gelu_erf_inplace, gelu_erf_inplace_scalar, gelu_tanh_inplace,
    gelu_tanh_inplace_scalar, log_sum_exp, log_sum_exp_scalar, relu_inplace, relu_inplace_scalar,
    silu_inplace, silu_inplace_scalar, softcap_inplace, softcap_inplace_scalar, softmax_inplace,
    softmax_inplace_scalar, swiglu, swiglu_scalar,
};
use qkv_kernels::convert::{f16_to_f32, f16_to_f32_scalar, f32_to_f16, f32_to_f16_scalar};
use qkv_kernels::f16;
use qkv_kernels::norm::{
    layer_norm, layer_norm_scalar, rms_norm, rms_norm_inplace, rms_norm_scalar,
};
use qkv_kernels::position::{add_sinusoidal_inplace, sinusoidal_table};
use qkv_kernels::rope::{RopeStyle, RopeTable};
use qkv_kernels::KernelError;

// Under Miri, which interprets every element (about a million times slower), the lengths
// around the 8-lane vector width and one past 64 (pulp's widest register run) keep every
// body/tail split without the model-sized rows.
const SIZES: &[usize] = if cfg!(miri) {
    &[1, 7, 8, 9, 17, 65]
} else {
    &[1, 3, 7, 8, 9, 15, 17, 63, 64, 65, 576, 1000, 1536]
};

/// SplitMix64: small, deterministic, good enough for test data.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Asserts `|got − want| ≤ abs + rel·|want|` elementwise.
#[track_caller]
fn assert_close(what: &str, got: &[f32], want: &[f32], abs: f32, rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= abs + rel * w.abs() || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}[{i}]: got {g}, want {w} (abs {abs}, rel {rel})");
    }
}

// ---------------------------------------------------------------------------------------
// f16 ⇄ f32
// ---------------------------------------------------------------------------------------

/// Both conversions are exact operations (widening is lossless, narrowing rounds to nearest
/// even), so the vector forms must agree with the scalar ones bit for bit, on every length
/// (vector bodies and scalar tails) and on the edge values: subnormals, the largest finite
/// half, overflow to infinity, infinities, NaN and signed zeros.
#[test]
fn conversions_match_scalar_bitwise() {
    let mut rng = Rng::new(11);
    let edges = [
        0.0f32,
        -0.0,
        1.0,
        -2.5,
        65504.0,
        65520.0,
        -70000.0,
        6.0e-8,
        -3.0e-5,
        1.0e-9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        // Halfway between two halves: 1 + 2^-11 rounds to even (1.0).
        1.0 + 1.0 / 2048.0,
    ];
    for &n in SIZES {
        let mut x = rng.vec(n, -70.0, 70.0);
        for (v, e) in x.iter_mut().zip(edges.iter().cycle().step_by(3)) {
            if rng.uniform(0.0, 1.0) < 0.3 {
                *v = *e;
            }
        }
        let (mut fast, mut slow) = (vec![f16::ZERO; n], vec![f16::ZERO; n]);
        f32_to_f16(&x, &mut fast).unwrap();
        f32_to_f16_scalar(&x, &mut slow).unwrap();
        let bits = |h: &[f16]| h.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast), bits(&slow), "f32_to_f16, n = {n}");

        let (mut wide, mut wide_ref) = (vec![0.0f32; n], vec![0.0f32; n]);
        f16_to_f32(&slow, &mut wide).unwrap();
        f16_to_f32_scalar(&slow, &mut wide_ref).unwrap();
        let fbits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(fbits(&wide), fbits(&wide_ref), "f16_to_f32, n = {n}");
    }
    let mut short = [0.0f32; 2];
    assert!(matches!(
        f16_to_f32(&[f16::ONE; 3], &mut short),
        Err(KernelError::Length { .. })
    ));
    // The scalar references refuse a wrong length too, naming both lengths.
    assert_eq!(
        f16_to_f32_scalar(&[f16::ONE; 3], &mut short),
        Err(KernelError::Length {
            what: "dst",
            expected: 3,
            actual: 2
        })
    );
    let mut short_h = [f16::ZERO; 4];
    assert_eq!(
        f32_to_f16_scalar(&[1.0; 5], &mut short_h),
        Err(KernelError::Length {
            what: "dst",
            expected: 5,
            actual: 4
        })
    );
    assert!(matches!(
        f32_to_f16(&[1.0; 9], &mut short_h),
        Err(KernelError::Length { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// norms
// ---------------------------------------------------------------------------------------

#[test]
fn layer_norm_matches_scalar() {
    let mut rng = Rng::new(1);
    for &dim in SIZES {
        for rows in [1, 3] {
            // A mean of 100 and a spread of ±3: a one-pass variance (E[x²] − mean², which
            // cancels ~10⁴ against ~10⁴ in f32) would miss the tolerance by far.
            let x: Vec<f32> = rng.vec(rows * dim, 97.0, 103.0);
            let w = rng.vec(dim, 0.5, 1.5);
            let b = rng.vec(dim, -1.0, 1.0);
            for bias in [None, Some(&b[..])] {
                let mut fast = vec![0.0; rows * dim];
                let mut slow = vec![0.0; rows * dim];
                layer_norm(&mut fast, &x, &w, bias, 1e-5, dim).unwrap();
                layer_norm_scalar(&mut slow, &x, &w, bias, 1e-5, dim).unwrap();
                // f32 sums against f64 sums: outputs are O(1), 2e-5 covers the mean/rstd
                // rounding over 1536 terms with margin.
                assert_close(&format!("layer_norm dim {dim}"), &fast, &slow, 2e-5, 2e-5);
            }
        }
    }
}

#[test]
fn rms_norm_matches_scalar() {
    let mut rng = Rng::new(2);
    for &dim in SIZES {
        for rows in [1, 3] {
            let x = rng.vec(rows * dim, -3.0, 3.0);
            let w = rng.vec(dim, -2.0, 2.0);
            let mut fast = vec![0.0; rows * dim];
            let mut slow = vec![0.0; rows * dim];
            rms_norm(&mut fast, &x, &w, 1e-6, dim).unwrap();
            rms_norm_scalar(&mut slow, &x, &w, 1e-6, dim).unwrap();
            // Only the sum of squares differs (f32 lanes vs f64): relative 1e-6 of rstd,
            // so 4e-6 relative plus a small absolute floor for near-zero outputs.
            assert_close(&format!("rms_norm dim {dim}"), &fast, &slow, 1e-6, 4e-6);

            let mut inplace = x.clone();
            rms_norm_inplace(&mut inplace, &w, 1e-6, dim).unwrap();
            // Same code path as `rms_norm`: bitwise equal.
            assert_eq!(inplace, fast, "rms_norm_inplace dim {dim}");
        }
    }
}

#[test]
fn norm_known_values() {
    // RMSNorm of a constant vector with a negligible eps is the weight (|c|/sqrt(c²) = 1;
    // 1 ulp slack). eps must be positive; f32::MIN_POSITIVE vanishes next to c².
    for &dim in SIZES {
        let x = vec![-2.5f32; dim];
        let w: Vec<f32> = (0..dim).map(|i| i as f32 * 0.25 - 3.0).collect();
        let mut out = vec![0.0; dim];
        rms_norm(&mut out, &x, &w, f32::MIN_POSITIVE, dim).unwrap();
        let neg_w: Vec<f32> = w.iter().map(|v| -v).collect();
        assert_close("rms_norm const", &out, &neg_w, 1e-6, 2e-7);
        // LayerNorm of a constant vector is the bias (x − mean = 0 exactly).
        let b: Vec<f32> = (0..dim).map(|i| i as f32).collect();
        layer_norm(&mut out, &x, &w, Some(&b), 1e-5, dim).unwrap();
        assert_eq!(out, b, "layer_norm const dim {dim}");
    }
    // PyTorch 2.x f32: F.layer_norm([1, 2, 3, 4], (4,), eps=0); eps must be positive here,
    // and f32::MIN_POSITIVE vanishes next to the variance 1.25.
    let mut out = [0.0f32; 4];
    layer_norm(
        &mut out,
        &[1.0, 2.0, 3.0, 4.0],
        &[1.0; 4],
        None,
        f32::MIN_POSITIVE,
        4,
    )
    .unwrap();
    assert_close(
        "layer_norm [1,2,3,4]",
        &out,
        &[-1.3416407, -0.4472136, 0.4472136, 1.3416407],
        1e-7,
        1e-7,
    );
}

#[test]
fn norm_errors() {
    let x = [1.0f32; 12];
    let w4 = [1.0f32; 4];
    let mut out = [0.0f32; 12];
    // dim 0
    assert_eq!(
        layer_norm(&mut out, &x, &[], None, 1e-5, 0),
        Err(KernelError::ZeroDim("dim"))
    );
    assert!(rms_norm(&mut out, &x, &[], 1e-5, 0).is_err());
    // 12 is not a multiple of 5
    assert!(layer_norm(&mut out, &x, &[1.0; 5], None, 1e-5, 5).is_err());
    assert!(rms_norm_scalar(&mut out, &x, &[1.0; 5], 1e-5, 5).is_err());
    // wrong weight / bias / out lengths
    assert!(layer_norm(&mut out, &x, &[1.0; 3], None, 1e-5, 4).is_err());
    assert!(layer_norm(&mut out, &x, &w4, Some(&[0.0; 3]), 1e-5, 4).is_err());
    assert!(layer_norm_scalar(&mut out[..8], &x, &w4, None, 1e-5, 4).is_err());
    assert!(rms_norm(&mut out[..11], &x, &w4, 1e-5, 4).is_err());
    assert!(rms_norm_inplace(&mut out, &[1.0; 5], 1e-5, 4).is_err());
    // Empty input is zero rows: fine.
    assert!(rms_norm(&mut [], &[], &w4, 1e-5, 4).is_ok());
}

/// `eps` must be finite and positive: with 0 (or a negative, NaN or infinite eps) a
/// constant or all-zero row came out NaN from an `Ok` call.
#[test]
fn norm_rejects_bad_eps() {
    let x = [0.0f32; 8]; // two all-zero rows: var = mean(x²) = 0
    let w = [1.0f32; 4];
    let b = [0.0f32; 4];
    let mut out = [0.0f32; 8];
    for eps in [0.0, -0.0, -1e-5, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let is_eps_error = |r: Result<(), KernelError>| match r {
            Err(KernelError::Invalid(msg)) => assert!(msg.contains("eps"), "{msg}"),
            other => panic!("eps {eps}: expected an Invalid error naming eps, got {other:?}"),
        };
        is_eps_error(rms_norm(&mut out, &x, &w, eps, 4));
        is_eps_error(rms_norm_scalar(&mut out, &x, &w, eps, 4));
        is_eps_error(rms_norm_inplace(&mut out, &w, eps, 4));
        is_eps_error(layer_norm(&mut out, &x, &w, Some(&b), eps, 4));
        is_eps_error(layer_norm_scalar(&mut out, &x, &w, None, eps, 4));
    }
    // The smallest positive eps keeps zero rows finite (zero).
    rms_norm(&mut out, &x, &w, f32::from_bits(1), 4).unwrap();
    assert_eq!(out, [0.0; 8]);
    layer_norm(&mut out, &x, &w, Some(&b), f32::from_bits(1), 4).unwrap();
    assert_eq!(out, [0.0; 8]);
}

// ---------------------------------------------------------------------------------------
// activations
// ---------------------------------------------------------------------------------------

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
    // A dense sweep of tanh's argument through both branches and far out, against f64.
    let xs: Vec<f32> = (-400_000..=400_000).map(|i| i as f32 * 2e-5).collect();
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

// ---------------------------------------------------------------------------------------
// RoPE
// ---------------------------------------------------------------------------------------

// Under Miri: one below, at and above the 8-lane width, and a real head size.
const HEAD_DIMS: &[usize] = if cfg!(miri) {
    &[2, 8, 18, 64]
} else {
    &[2, 4, 6, 8, 14, 16, 18, 64, 96, 128]
};
const STYLES: [RopeStyle; 2] = [RopeStyle::AdjacentPairs, RopeStyle::SplitHalf];

#[test]
fn rope_matches_scalar_bitwise() {
    let mut rng = Rng::new(8);
    for &d in HEAD_DIMS {
        let table = RopeTable::new(d, 10000.0, 64).unwrap();
        for heads in [1, 3] {
            for (rows, pos0) in [(1, 0), (1, 63), (5, 7), (17, 40)] {
                let x = rng.vec(rows * heads * d, -2.0, 2.0);
                for style in STYLES {
                    let (mut a, mut b) = (x.clone(), x.clone());
                    table.apply(&mut a, rows, heads, pos0, style).unwrap();
                    table
                        .apply_scalar(&mut b, rows, heads, pos0, style)
                        .unwrap();
                    // Same products, same roundings, no FMA: bitwise equal.
                    assert_eq!(a, b, "rope d {d} heads {heads} rows {rows} {style:?}");
                }
            }
        }
    }
}

#[test]
fn rope_position_zero_is_identity_and_norms_are_kept() {
    let mut rng = Rng::new(9);
    for &d in HEAD_DIMS {
        let table = RopeTable::new(d, 500000.0, 300).unwrap();
        for style in STYLES {
            let x = rng.vec(2 * d, -3.0, 3.0);
            let mut a = x.clone();
            table.apply(&mut a, 1, 2, 0, style).unwrap();
            assert_eq!(a, x, "position 0, d {d}, {style:?}");

            let mut y = x.clone();
            table.apply(&mut y, 2, 1, 298, style).unwrap();
            // Each rotated pair keeps its length; cos²+sin² = 1 to ~1e-7 and the products
            // round, so 1e-6 relative on the squared norm of each head.
            for (h0, h1) in x.chunks(d).zip(y.chunks(d)) {
                let n0: f32 = h0.iter().map(|v| v * v).sum();
                let n1: f32 = h1.iter().map(|v| v * v).sum();
                assert!((n0 - n1).abs() <= 1e-6 * n0 + 1e-6, "norm d {d} {style:?}");
            }
        }
    }
}

#[test]
fn rope_split_half_is_adjacent_pairs_permuted() {
    // With y[i] = x[2i] and y[i + d/2] = x[2i + 1], SplitHalf on y equals AdjacentPairs on
    // x under the same permutation, bitwise (same pairs, same angles).
    let mut rng = Rng::new(10);
    for &d in HEAD_DIMS {
        let half = d / 2;
        let table = RopeTable::new(d, 10000.0, 32).unwrap();
        let heads = 2;
        let x = rng.vec(3 * heads * d, -1.0, 1.0);
        let perm = |src: &[f32]| -> Vec<f32> {
            let mut out = vec![0.0; src.len()];
            for (o, s) in out.chunks_mut(d).zip(src.chunks(d)) {
                for i in 0..half {
                    o[i] = s[2 * i];
                    o[i + half] = s[2 * i + 1];
                }
            }
            out
        };
        let mut adj = x.clone();
        table
            .apply(&mut adj, 3, heads, 5, RopeStyle::AdjacentPairs)
            .unwrap();
        let mut split = perm(&x);
        table
            .apply(&mut split, 3, heads, 5, RopeStyle::SplitHalf)
            .unwrap();
        assert_eq!(split, perm(&adj), "d {d}");
    }
}

#[test]
fn rope_known_values_match_hugging_face() {
    // head_dim 2: θ₀ = 1, so position 1 rotates (1, 0) by one radian.
    let t = RopeTable::new(2, 10000.0, 4).unwrap();
    let mut x = [1.0f32, 0.0];
    t.apply(&mut x, 1, 1, 1, RopeStyle::AdjacentPairs).unwrap();
    assert_eq!(x, [1f64.cos() as f32, 1f64.sin() as f32]);

    // cos/sin of HF LlamaRotaryEmbedding (head_dim 128, base 10000) from PyTorch 2.x f32.
    // The angle is HF's f32 product, so these agree to ~1 ulp even at position 4000
    // (an f64 angle would be off by ~1e-4 there). Tolerance 2e-7 absolute.
    let t = RopeTable::new(128, 10000.0, 4001).unwrap();
    let want: [(usize, usize, f32, f32); 9] = [
        (4000, 0, -0.729_947, -0.683_503_8),
        (4000, 1, -0.248_877_67, 0.968_534_95),
        (4000, 10, 0.977_708_1, -0.209_968_66),
        (4000, 31, -0.595_740_2, 0.803_177_2),
        (4000, 63, 0.895_201_7, 0.445_661_25),
        (123, 10, -0.626_639_8, -0.779_309_03),
        (123, 63, 0.999_899_15, 0.014_203_34),
        (1, 1, 0.647_905_8, 0.761_720_4),
        (1, 63, 1.0, 0.000_115_478_19),
    ];
    for (p, i, c, s) in want {
        let (gc, gs) = (t.cos(p).unwrap()[i], t.sin(p).unwrap()[i]);
        assert!(
            (gc - c).abs() <= 2e-7 && (gs - s).abs() <= 2e-7,
            "pos {p} pair {i}: {gc} {gs}"
        );
    }
    assert!(t.cos(4001).is_none());
    assert_eq!(t.head_dim(), 128);
    assert_eq!(t.max_positions(), 4001);
}

#[test]
fn rope_strided_matches_contiguous() {
    // A fused QKV buffer: each row is [q (heads·d) | k (kv·d) | v (kv·d)] plus 3 spare.
    let mut rng = Rng::new(11);
    let (d, heads, kv, rows, pos0) = (64, 4, 2, 5, 9);
    let stride = (heads + 2 * kv) * d + 3;
    let table = RopeTable::new(d, 10000.0, 32).unwrap();
    for style in STYLES {
        let fused = rng.vec(rows * stride, -1.0, 1.0);
        let mut got = fused.clone();
        table
            .apply_strided(&mut got, rows, heads, stride, pos0, style)
            .unwrap();
        table
            .apply_strided(&mut got[heads * d..], rows, kv, stride, pos0, style)
            .unwrap();
        let mut got_scalar = fused.clone();
        table
            .apply_strided_scalar(&mut got_scalar, rows, heads, stride, pos0, style)
            .unwrap();
        table
            .apply_strided_scalar(&mut got_scalar[heads * d..], rows, kv, stride, pos0, style)
            .unwrap();
        assert_eq!(got, got_scalar, "{style:?}");
        for r in 0..rows {
            let row = &fused[r * stride..][..stride];
            let mut q = row[..heads * d].to_vec();
            let mut k = row[heads * d..][..kv * d].to_vec();
            table.apply(&mut q, 1, heads, pos0 + r, style).unwrap();
            table.apply(&mut k, 1, kv, pos0 + r, style).unwrap();
            let g = &got[r * stride..][..stride];
            assert_eq!(&g[..heads * d], &q[..], "q row {r}");
            assert_eq!(&g[heads * d..][..kv * d], &k[..], "k row {r}");
            // v and the spare tail are untouched.
            assert_eq!(
                &g[(heads + kv) * d..],
                &row[(heads + kv) * d..],
                "v row {r}"
            );
        }
    }
}

#[test]
fn rope_errors() {
    assert!(RopeTable::new(0, 10000.0, 8).is_err());
    assert!(RopeTable::new(7, 10000.0, 8).is_err());
    assert!(RopeTable::new(8, 10000.0, 0).is_err());
    assert!(RopeTable::new(8, 0.0, 8).is_err());
    assert!(RopeTable::new(8, f32::NAN, 8).is_err());
    let t = RopeTable::new(8, 10000.0, 10).unwrap();
    let mut x = vec![0.0f32; 2 * 3 * 8];
    for style in STYLES {
        assert!(t.apply(&mut x, 2, 3, 8, style).is_ok()); // positions 8, 9: the last two
        assert!(t.apply(&mut x, 2, 3, 9, style).is_err()); // position 10 is past the table
        assert!(t.apply(&mut x, 2, 3, usize::MAX, style).is_err()); // overflow, no panic
        assert!(t.apply_scalar(&mut x, 2, 3, 9, style).is_err());
        assert!(t.apply(&mut x, 2, 2, 0, style).is_err()); // wrong length
        assert!(t.apply(&mut x, 2, 0, 0, style).is_err()); // zero heads
        assert!(t.apply(&mut x[..47], 2, 3, 0, style).is_err());
        assert!(t.apply(&mut [], 0, 3, 0, style).is_ok()); // zero rows
                                                           // strided: stride shorter than a row, buffer too short
        assert!(t.apply_strided(&mut x, 2, 3, 23, 0, style).is_err());
        assert!(t.apply_strided(&mut x, 2, 3, 25, 0, style).is_err());
        assert!(t.apply_strided(&mut x, 2, 3, 24, 0, style).is_ok());
        assert!(t.apply_strided(&mut x, 2, 3, 24, 9, style).is_err());
        assert!(t.apply_strided_scalar(&mut x, 2, 3, 23, 0, style).is_err());
    }
}

/// A table too large to hold is a typed error naming its size, not a capacity-overflow
/// panic or an allocation-failure abort.
#[test]
fn rope_table_too_large_is_an_error() {
    // 2⁶² pairs: the element count fits, the bytes do not.
    match RopeTable::new(2, 1e4, 1 << 62) {
        Err(KernelError::Invalid(msg)) => {
            assert!(
                msg.contains("RoPE cos and sin tables") && msg.contains("cannot be allocated"),
                "{msg}"
            )
        }
        other => panic!("expected an Invalid error, got {other:?}"),
    }
    // 2⁶¹ pairs: 2⁶³ bytes, past isize::MAX, which no allocator can provide.
    assert!(matches!(
        RopeTable::new(2, 1e4, 1 << 61),
        Err(KernelError::Invalid(_))
    ));
    // The element count itself overflows.
    assert!(matches!(
        RopeTable::new(64, 1e4, usize::MAX),
        Err(KernelError::Invalid(_))
    ));
}

// ---------------------------------------------------------------------------------------
// sinusoidal positions
// ---------------------------------------------------------------------------------------

#[test]
fn sinusoidal_known_values() {
    // By hand, d = 4: div_term = [1, 10000^(-1/2)] = [1, 0.01].
    let pe = sinusoidal_table(3, 4).unwrap();
    let want = [
        0.0,
        1.0,
        0.0,
        1.0, // position 0: sin 0, cos 0
        1f64.sin() as f32,
        1f64.cos() as f32,
        0.01f64.sin() as f32,
        0.01f64.cos() as f32,
        2f64.sin() as f32,
        2f64.cos() as f32,
        0.02f64.sin() as f32,
        0.02f64.cos() as f32,
    ];
    // 0.01 is not an f32; the f32 div_term and angle round, so 1e-7 absolute.
    assert_close("pe d 4", &pe, &want, 1e-7, 0.0);

    // PyTorch 2.x f32, the seed-004 code with d = 512, at positions 500 and 37. Mimicking
    // PyTorch's f32 angle keeps these within ~1 ulp (an f64 angle would be ~1e-5 off).
    let pe = sinusoidal_table(501, 512).unwrap();
    for (p, c, want) in [
        (500, 0, -0.467_771_8f32),
        (500, 1, -0.883_849_26),
        (500, 2, -0.995_363_06),
        (500, 3, 0.096_189_27),
        (500, 100, 0.872_083_25),
        (500, 101, 0.489_357_6),
        (500, 510, 0.051_808_458),
        (500, 511, 0.998_657_05),
        (37, 64, -0.761_706_95),
        (37, 65, 0.647_921_7),
    ] {
        let got = pe[p * 512 + c];
        assert!(
            (got - want).abs() <= 1e-7,
            "pe[{p}, {c}] = {got}, PyTorch {want}"
        );
    }

    // Odd d: the natural extension, the last column is a sine.
    let pe = sinusoidal_table(2, 5).unwrap();
    assert_eq!(pe[..5], [0.0, 1.0, 0.0, 1.0, 0.0]);
    assert!((pe[5] - 1f32.sin()).abs() < 1e-7);
    assert!(sinusoidal_table(0, 8).unwrap().is_empty());
    assert!(sinusoidal_table(8, 0).unwrap().is_empty());
    assert!(sinusoidal_table(usize::MAX, 0).unwrap().is_empty());
}

/// Sizes that overflow or cannot be allocated are typed errors, not panics.
#[test]
fn sinusoidal_table_too_large_is_an_error() {
    for (positions, dim) in [(usize::MAX, 2), (1 << 62, 1), (1 << 61, 1)] {
        match sinusoidal_table(positions, dim) {
            Err(KernelError::Invalid(msg)) => {
                assert!(msg.contains("sinusoidal table"), "{msg}")
            }
            other => panic!("{positions} × {dim}: expected an Invalid error, got {other:?}"),
        }
    }
}

#[test]
fn add_sinusoidal_matches_table() {
    let mut rng = Rng::new(12);
    for &dim in SIZES {
        let (rows, pos0) = (3, 17);
        let table = sinusoidal_table(pos0 + rows, dim).unwrap();
        let x = rng.vec(rows * dim, -1.0, 1.0);
        let mut got = x.clone();
        add_sinusoidal_inplace(&mut got, rows, dim, pos0).unwrap();
        let mut want = x.clone();
        add_inplace(&mut want, &table[pos0 * dim..]).unwrap();
        // Same f32 values added in the same rounding: bitwise equal.
        assert_eq!(got, want, "dim {dim}");
    }
    let mut x = [0.0f32; 12];
    assert!(add_sinusoidal_inplace(&mut x, 3, 0, 0).is_err());
    assert!(add_sinusoidal_inplace(&mut x, 3, 5, 0).is_err());
    assert!(add_sinusoidal_inplace(&mut x, 2, 4, 0).is_err());
    assert!(add_sinusoidal_inplace(&mut x, usize::MAX, 2, 0).is_err());
    assert!(add_sinusoidal_inplace(&mut x, 3, 4, usize::MAX).is_err());
}

/// Runs `f` on a fresh pool of `threads` threads.
fn on_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
        .install(f)
}

/// Prompt-sized inputs (past the point where the row-wise and elementwise kernels split
/// across the pool, with sizes that leave ragged last pieces): the split computes bitwise
/// what one thread computes.
//
// Skipped under Miri: crossing the split threshold takes inputs of 10⁵ elements, hours of
// interpretation; the split itself is safe rayon code (`par_chunks_mut`), and the GEMV's
// raw-pointer split across threads runs under Miri in tests/matmul.rs.
#[test]
#[cfg_attr(miri, ignore = "10⁵-element inputs; see the comment")]
fn split_across_threads_matches_one_thread_bitwise() {
    let mut rng = Rng::new(41);
    let (rows, dim) = (301, 333);
    let x = rng.vec(rows * dim, -3.0, 3.0);
    let w = rng.vec(dim, 0.5, 1.5);
    let gate = rng.vec(100_003, -8.0, 8.0);
    let up = rng.vec(100_003, -2.0, 2.0);
    let table = RopeTable::new(32, 10_000.0, 4096).unwrap();
    let (heads, stride) = (3, 3 * 32 + 5);
    let q = rng.vec(700 * stride, -1.0, 1.0);
    let run = || {
        let mut norm = vec![0.0; x.len()];
        rms_norm(&mut norm, &x, &w, 1e-5, dim).unwrap();
        let mut norm_in_place = x.clone();
        rms_norm_inplace(&mut norm_in_place, &w, 1e-5, dim).unwrap();
        let mut sw = vec![0.0; gate.len()];
        swiglu(&mut sw, &gate, &up).unwrap();
        let mut sum = gate.clone();
        add_inplace(&mut sum, &up).unwrap();
        let mut ropes = Vec::new();
        for style in [RopeStyle::SplitHalf, RopeStyle::AdjacentPairs] {
            let mut r = q[..700 * heads * 32].to_vec();
            table.apply(&mut r, 700, heads, 17, style).unwrap();
            // Strided rows, the slice ending right after the last row's heads.
            let mut s = q[..699 * stride + heads * 32].to_vec();
            table
                .apply_strided(&mut s, 700, heads, stride, 17, style)
                .unwrap();
            ropes.push((r, s));
        }
        (norm, norm_in_place, sw, sum, ropes)
    };
    let one = on_pool(1, run);
    let three = on_pool(3, run);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&one.0), bits(&three.0), "rms_norm");
    assert_eq!(bits(&one.1), bits(&three.1), "rms_norm_inplace");
    assert_eq!(bits(&one.2), bits(&three.2), "swiglu");
    assert_eq!(bits(&one.3), bits(&three.3), "add_inplace");
    for ((r1, s1), (r3, s3)) in one.4.iter().zip(&three.4) {
        assert_eq!(bits(r1), bits(r3), "rope");
        assert_eq!(bits(s1), bits(s3), "rope strided");
    }
    // And the split results are the kernels' own: RoPE against its scalar reference.
    let mut r = q[..700 * heads * 32].to_vec();
    table
        .apply_scalar(&mut r, 700, heads, 17, RopeStyle::SplitHalf)
        .unwrap();
    assert_eq!(bits(&r), bits(&three.4[0].0), "rope vs scalar");
}
