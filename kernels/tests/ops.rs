//! Elementwise and norm kernels: each fast kernel against its scalar reference on awkward
//! sizes, known values (several taken from PyTorch 2.x in f32, marked as such), and the
//! error cases. Here the f16 conversions, the norms and the split across threads; the
//! activations and the positions in the two modules below.

use qkv_kernels::activation::{add_inplace, swiglu};
use qkv_kernels::convert::{
    bf16_to_f32, bf16_to_f32_scalar, f16_to_f32, f16_to_f32_scalar, f32_to_f16, f32_to_f16_scalar,
};
use qkv_kernels::f16;
use qkv_kernels::norm::{
    layer_norm, layer_norm_scalar, rms_norm, rms_norm_inplace, rms_norm_scalar,
};
use qkv_kernels::rope::{RopeStyle, RopeTable};
use qkv_kernels::KernelError;

#[path = "ops/activations.rs"]
mod activations;
#[path = "ops/positions.rs"]
mod positions;

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

/// bf16 → f32 against its scalar reference, bit for bit, on lengths around the 8-lane step,
/// over every bit pattern of the format (±0, subnormals, infinities, NaNs with payloads):
/// each must be the f32 whose top half it is.
#[test]
fn bf16_widening_matches_scalar_on_every_pattern() {
    let all: Vec<qkv_kernels::bf16> = (0..=u16::MAX).map(qkv_kernels::bf16::from_bits).collect();
    for n in [0, 1, 7, 8, 9, 15, 17, 65536] {
        // From an odd start, so that no load is aligned.
        let src = &all[(all.len() - n) / 2 + (n < all.len()) as usize..][..n];
        let (mut fast, mut slow) = (vec![0.0f32; n], vec![0.0f32; n]);
        bf16_to_f32(src, &mut fast).unwrap();
        bf16_to_f32_scalar(src, &mut slow).unwrap();
        for (i, s) in src.iter().enumerate() {
            let want = u32::from(s.to_bits()) << 16;
            assert_eq!(
                fast[i].to_bits(),
                want,
                "bf16_to_f32 of {:#06x}",
                s.to_bits()
            );
            assert_eq!(slow[i].to_bits(), want, "scalar of {:#06x}", s.to_bits());
        }
    }
    let mut short = [0.0f32; 2];
    assert!(matches!(
        bf16_to_f32(&[qkv_kernels::bf16::ONE; 3], &mut short),
        Err(KernelError::Length { .. })
    ));
}
