//! The attention kernel (SIMD and scalar paths) against a naive softmax(Q·Kᵀ·scale)·V written
//! plainly here, on awkward shapes, masks, strides and dtypes.

use qkv_kernels::attention::attention_scalar;
use qkv_kernels::{
    attention, attention_with_probs, f16, AttentionMask, KernelError, KvData, KvView, QueryView,
};

/// Whether the tests may use f16 K and V: not under Miri with F16C enabled at compile time
/// (`RUSTFLAGS="-C target-feature=+avx2,+fma,+f16c"`, the run that takes the AVX2 kernels),
/// as Miri has no F16C conversions; the f32 cases then run on the AVX2 path.
const F16: bool = !cfg!(all(miri, target_feature = "f16c"));

/// Small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn vec(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * amp).collect()
    }
}

/// Plain attention on dense `[t, heads, d]` arrays, f64 accumulation, by the rule in the
/// kernel's documentation: masked keys take no part; a NaN or +∞ visible score makes the row
/// (output and probabilities) NaN; a row with visible keys whose scores are all −∞ is NaN;
/// a row with no visible key is zeros. Scores are soft-capped (`cap·tanh(s/cap)`, in f64)
/// when `softcap` is given.
#[allow(clippy::too_many_arguments)]
fn naive(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    tq: usize,
    tk: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    dv: usize,
    visible: &dyn Fn(usize, usize) -> bool,
    softcap: Option<f32>,
) -> (Vec<f32>, Vec<f32>) {
    let group = heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f32; tq * heads * dv];
    let mut probs = vec![0.0f32; heads * tq * tk];
    for h in 0..heads {
        let g = h / group;
        for i in 0..tq {
            let o = &mut out[(i * heads + h) * dv..][..dv];
            let pr = &mut probs[(h * tq + i) * tk..][..tk];
            let seen: Vec<usize> = (0..tk).filter(|&j| visible(i, j)).collect();
            let s: Vec<f64> = seen
                .iter()
                .map(|&j| {
                    let dot: f64 = (0..d)
                        .map(|p| {
                            q[(i * heads + h) * d + p] as f64 * k[(j * kv_heads + g) * d + p] as f64
                        })
                        .sum();
                    let s = dot * scale;
                    match softcap {
                        Some(cap) => cap as f64 * (s / cap as f64).tanh(),
                        None => s,
                    }
                })
                .collect();
            if seen.is_empty() {
                continue;
            }
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if s.iter().any(|x| x.is_nan()) || m == f64::INFINITY || m == f64::NEG_INFINITY {
                o.fill(f32::NAN);
                pr.fill(f32::NAN);
                continue;
            }
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for c in 0..dv {
                let acc: f64 = seen
                    .iter()
                    .zip(&e)
                    .map(|(&j, e)| e / z * v[(j * kv_heads + g) * dv + c] as f64)
                    .sum();
                o[c] = acc as f32;
            }
            for (&j, e) in seen.iter().zip(&e) {
                pr[j] = (e / z) as f32;
            }
        }
    }
    (out, probs)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// K and V as the kernel reads them: f32, or rounded to f16, and then `k` and `v` hold the
/// rounded values, which are what the reference must see.
struct Kv {
    k: Vec<f32>,
    v: Vec<f32>,
    k16: Vec<f16>,
    v16: Vec<f16>,
    half: bool,
}

impl Kv {
    /// Rounds only when `f16` (Miri's AVX2 run has no F16C to round with).
    fn new(k: Vec<f32>, v: Vec<f32>, f16: bool) -> Kv {
        if !f16 {
            return Kv {
                k,
                v,
                k16: Vec::new(),
                v16: Vec::new(),
                half: false,
            };
        }
        let halves = |x: &[f32]| -> Vec<f16> { x.iter().map(|&x| f16::from_f32(x)).collect() };
        let (k16, v16) = (halves(&k), halves(&v));
        Kv {
            k: k16.iter().map(|x| x.to_f32()).collect(),
            v: v16.iter().map(|x| x.to_f32()).collect(),
            k16,
            v16,
            half: true,
        }
    }

    /// The views of `tk` keys over `kv_heads` heads of `d` (keys) and `dv` (values) floats.
    fn views(&self, tk: usize, kv_heads: usize, d: usize, dv: usize) -> (KvView<'_>, KvView<'_>) {
        if self.half {
            (
                KvView::contiguous_f16(&self.k16, tk, kv_heads, d),
                KvView::contiguous_f16(&self.v16, tk, kv_heads, dv),
            )
        } else {
            (
                KvView::contiguous_f32(&self.k, tk, kv_heads, d),
                KvView::contiguous_f32(&self.v, tk, kv_heads, dv),
            )
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    tq: usize,
    tk: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    dv: usize,
    f16_kv: bool,
    causal: Option<usize>,
    /// Sliding window (only with `causal`).
    window: Option<usize>,
    softcap: Option<f32>,
    pads: bool,
    dense: bool,
}

fn check(case: Case, rng: &mut Rng) {
    let Case {
        tq,
        tk,
        heads,
        kv_heads,
        d,
        dv,
        f16_kv,
        causal,
        window,
        softcap,
        pads,
        dense,
    } = case;
    let q = rng.vec(tq * heads * d, 2.0);
    let k = rng.vec(tk * kv_heads * d, 2.0);
    let v = rng.vec(tk * kv_heads * dv, 1.0);
    let kv_data = Kv::new(k, v, f16_kv);
    let (k, v) = (&kv_data.k, &kv_data.v);
    // Pads anywhere: every third key in the middle region, plus the last one.
    let keep: Vec<bool> = (0..tk)
        .map(|j| !(pads && ((j % 3 == 1 && j > tk / 4) || j + 1 == tk && tk > 1)))
        .collect();
    let dense_keep: Vec<bool> = (0..tq * tk).map(|x| !(dense && x % 7 == 3)).collect();
    let mut mask = AttentionMask {
        causal_offset: causal,
        window,
        softcap,
        ..Default::default()
    };
    if pads {
        mask.key_keep = Some(&keep);
    }
    if dense {
        mask.dense_keep = Some(&dense_keep);
    }
    let visible = |i: usize, j: usize| mask.visible(i, j, tk);
    let (expected, expected_probs) =
        naive(&q, k, v, tq, tk, heads, kv_heads, d, dv, &visible, softcap);

    let qv = QueryView::contiguous(&q, tq, heads, d);
    let (kv, vv) = kv_data.views(tk, kv_heads, d, dv);
    let mut fast = vec![f32::NAN; tq * heads * dv];
    let mut scalar = vec![f32::NAN; tq * heads * dv];
    let mut slow = vec![f32::NAN; tq * heads * dv];
    attention(&qv, &kv, &vv, &mask, None, &mut fast).unwrap();
    attention_scalar(&qv, &kv, &vv, &mask, None, &mut scalar).unwrap();
    let probs = attention_with_probs(&qv, &kv, &vv, &mask, None, &mut slow).unwrap();

    // Outputs are convex combinations of V (|V| ≤ 1): f32 summation-order differences stay
    // far below 1e-5 absolute; the vector exp adds < 2.5e-7 relative.
    let tol = 1e-5;
    for (name, got) in [("simd", &fast), ("scalar", &scalar), ("with_probs", &slow)] {
        assert!(
            got.iter().all(|x| x.is_finite()),
            "{name}: non-finite output for {case:?}"
        );
        let err = max_abs_diff(got, &expected);
        assert!(err <= tol, "{name}: max error {err} > {tol} for {case:?}");
    }
    let perr = max_abs_diff(&probs, &expected_probs);
    assert!(perr <= 1e-5, "probabilities off by {perr} for {case:?}");
}

#[test]
fn matches_naive_on_awkward_shapes() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let head_cfgs = [(1, 1), (4, 4), (6, 2), (9, 3), (4, 1), (8, 8)];
    // Under Miri: a few small cases (it interprets every operation).
    let (dims, ts, cases): (&[usize], &[usize], usize) = if cfg!(miri) {
        (&[1, 3, 8, 9], &[1, 2, 5, 9], 6)
    } else {
        (
            &[1, 3, 7, 8, 9, 16, 31, 64, 65],
            &[1, 2, 5, 17, 63, 64, 65, 129, 200],
            400,
        )
    };
    for n in 0..cases {
        let (heads, kv_heads) = head_cfgs[rng.below(head_cfgs.len())];
        let tq = ts[rng.below(ts.len())];
        let tk = ts[rng.below(ts.len())];
        let case = Case {
            tq,
            tk,
            heads,
            kv_heads,
            d: dims[rng.below(dims.len())],
            dv: dims[rng.below(dims.len())],
            f16_kv: n % 2 == 1 && F16,
            causal: match rng.below(3) {
                0 => None,
                1 => Some(0),
                _ => Some(rng.below(tk + 3)),
            },
            window: None,
            softcap: (rng.below(4) == 0).then(|| 0.5 + 4.0 * (rng.uniform() + 1.0) / 2.0),
            pads: rng.below(2) == 0,
            dense: rng.below(4) == 0,
        };
        let window = case
            .causal
            .filter(|_| rng.below(2) == 0)
            .map(|_| 1 + rng.below(tk + 2));
        check(Case { window, ..case }, &mut rng);
    }
}

#[test]
fn long_prefill_and_decode_paths() {
    if cfg!(miri) {
        return; // thousands of keys: the non-finite tests cover these paths at small sizes
    }
    let mut rng = Rng(42);
    let base = Case {
        tq: 1,
        tk: 1,
        heads: 9,
        kv_heads: 3,
        d: 64,
        dv: 64,
        f16_kv: false,
        causal: None,
        window: None,
        softcap: None,
        pads: false,
        dense: false,
    };
    // Causal prefill, several query blocks, tq > tk blocks skipped correctly.
    check(
        Case {
            tq: 300,
            tk: 300,
            causal: Some(0),
            ..base
        },
        &mut rng,
    );
    check(
        Case {
            tq: 300,
            tk: 300,
            causal: Some(0),
            f16_kv: true,
            pads: true,
            ..base
        },
        &mut rng,
    );
    // Decode against a long cache: keys split across threads and merged.
    check(
        Case {
            tq: 1,
            tk: 3000,
            causal: Some(2999),
            ..base
        },
        &mut rng,
    );
    check(
        Case {
            tq: 1,
            tk: 3001,
            causal: Some(3000),
            f16_kv: true,
            pads: true,
            ..base
        },
        &mut rng,
    );
    // A few queries (speculative / chunked decode) against a long cache.
    check(
        Case {
            tq: 4,
            tk: 2500,
            causal: Some(2496),
            ..base
        },
        &mut rng,
    );
    // Sliding windows: a prefill whose windows start inside blocks (packed path, blocks
    // wholly before every window skipped), on top of a cache; decode against a long cache
    // with the window's keys split across threads; soft-capped scores on both.
    for (tq, tk, w, f16_kv, softcap) in [
        (300, 300, 100, false, None),
        (200, 1200, 333, true, Some(2.0)),
        (1, 3000, 700, false, None),
        (1, 3000, 1, true, None),
        (1, 5000, 4096, true, Some(1.5)),
        (4, 2500, 65, false, None),
        (9, 9, 3, false, Some(0.7)),
    ] {
        check(
            Case {
                tq,
                tk,
                causal: Some(tk - tq),
                window: Some(w),
                softcap,
                f16_kv,
                ..base
            },
            &mut rng,
        );
    }
    // Cross-attention: tq < tk, no causal, padded source.
    check(
        Case {
            tq: 7,
            tk: 1000,
            pads: true,
            ..base
        },
        &mut rng,
    );
}

#[test]
fn fully_masked_rows_are_zero() {
    let (tq, tk, d) = (3, 4, 8);
    let q = vec![1.0; tq * d];
    let k = vec![0.5; tk * d];
    let v = vec![2.0; tk * d];
    let keep = [false; 4];
    let mut out = vec![f32::NAN; tq * d];
    let mask = AttentionMask::none().with_key_keep(&keep);
    let qv = QueryView::contiguous(&q, tq, 1, d);
    let kv = KvView::contiguous_f32(&k, tk, 1, d);
    let vv = KvView::contiguous_f32(&v, tk, 1, d);
    attention(&qv, &kv, &vv, &mask, None, &mut out).unwrap();
    assert!(out.iter().all(|&x| x == 0.0));
    attention_scalar(&qv, &kv, &vv, &mask, None, &mut out).unwrap();
    assert!(out.iter().all(|&x| x == 0.0));
    let probs = attention_with_probs(&qv, &kv, &vv, &mask, None, &mut out).unwrap();
    assert!(probs.iter().all(|&x| x == 0.0) && out.iter().all(|&x| x == 0.0));
    // Causal with tq > tk and a dense mask that blocks row 0 entirely.
    let dense: Vec<bool> = (0..tq * tk).map(|x| x >= tk).collect();
    let mask = AttentionMask::causal(0).with_dense_keep(&dense);
    attention(&qv, &kv, &vv, &mask, None, &mut out).unwrap();
    assert!(out[..d].iter().all(|&x| x == 0.0));
    assert!(out[d..].iter().all(|&x| (x - 2.0).abs() < 1e-6));
}

#[test]
fn strided_cache_views_read_in_place() {
    // Five queries (packed K/V blocks) and one (decode: K and V read in place).
    for tq in [5, 1] {
        strided_cache_case(tq);
    }
}

fn strided_cache_case(tq: usize) {
    // A cache of capacity 100 holding 37 positions, head-major layout [kv_heads, cap, d].
    let mut rng = Rng(7);
    let (cap, tk, kv_heads, heads, d) = (100, 37, 2, 6, 16);
    let kc = rng.vec(kv_heads * cap * d, 1.0);
    let vc = rng.vec(kv_heads * cap * d, 1.0);
    // Queries embedded in a wider fused buffer: row stride 3·heads·d.
    let wide = rng.vec(tq * 3 * heads * d, 1.0);
    let qv = QueryView {
        data: &wide,
        rows: tq,
        heads,
        dim: d,
        row_stride: 3 * heads * d,
        head_stride: d,
    };
    let view = |data: &[f32]| -> Vec<f32> {
        let mut dense = vec![0.0; tk * kv_heads * d];
        for j in 0..tk {
            for g in 0..kv_heads {
                dense[(j * kv_heads + g) * d..][..d]
                    .copy_from_slice(&data[(g * cap + j) * d..][..d]);
            }
        }
        dense
    };
    let (kd, vd) = (view(&kc), view(&vc));
    let qd: Vec<f32> = (0..tq)
        .flat_map(|i| wide[i * 3 * heads * d..][..heads * d].to_vec())
        .collect();
    let mask = AttentionMask::causal(tk - tq);
    let (expected, _) = naive(
        &qd,
        &kd,
        &vd,
        tq,
        tk,
        heads,
        kv_heads,
        d,
        d,
        &|i, j| mask.visible(i, j, tk),
        None,
    );
    let strided = |data| KvView {
        data: KvData::F32(data),
        rows: tk,
        heads: kv_heads,
        dim: d,
        row_stride: d,
        head_stride: cap * d,
    };
    let mut out = vec![0.0; tq * heads * d];
    attention(&qv, &strided(&kc), &strided(&vc), &mask, None, &mut out).unwrap();
    assert!(max_abs_diff(&out, &expected) < 1e-5);
}

#[test]
fn explicit_scale_is_used() {
    let q = [1.0, 2.0];
    let k = [1.0, 0.0, 0.0, 1.0];
    let v = [1.0, 0.0, 0.0, 1.0];
    let mut out = [0.0; 2];
    let kv = KvView::contiguous_f32(&k, 2, 1, 2);
    let vv = KvView::contiguous_f32(&v, 2, 1, 2);
    attention(
        &QueryView::contiguous(&q, 1, 1, 2),
        &kv,
        &vv,
        &AttentionMask::none(),
        Some(0.0),
        &mut out,
    )
    .unwrap();
    assert_same(&out, &[0.5, 0.5]); // scale 0: uniform weights
}

#[test]
fn bad_input_is_a_typed_error() {
    let q = vec![0.0; 2 * 4 * 8];
    let k = vec![0.0; 3 * 2 * 8];
    let mut out = vec![0.0; 2 * 4 * 8];
    let qv = QueryView::contiguous(&q, 2, 4, 8);
    let kv = KvView::contiguous_f32(&k, 3, 2, 8);
    let none = AttentionMask::none();
    assert!(attention(&qv, &kv, &kv, &none, None, &mut out).is_ok());
    // heads not a multiple of kv_heads
    let kv3 = KvView::contiguous_f32(&k, 2, 3, 8);
    assert!(matches!(
        attention(&qv, &kv3, &kv3, &none, None, &mut out),
        Err(KernelError::Mismatch { .. })
    ));
    // output too short
    assert!(matches!(
        attention(&qv, &kv, &kv, &none, None, &mut out[1..]),
        Err(KernelError::Length { what: "out", .. })
    ));
    // view longer than its slice
    let long = KvView::contiguous_f32(&k, 4, 2, 8);
    assert!(matches!(
        attention(&qv, &long, &long, &none, None, &mut out),
        Err(KernelError::Length { what: "k", .. })
    ));
    // zero-sized dimensions
    let empty = KvView::contiguous_f32(&k, 0, 2, 8);
    assert!(matches!(
        attention(&qv, &empty, &empty, &none, None, &mut out),
        Err(KernelError::ZeroDim(_))
    ));
    // masks of the wrong size
    let keep = [true; 2];
    assert!(attention(
        &qv,
        &kv,
        &kv,
        &AttentionMask::none().with_key_keep(&keep),
        None,
        &mut out
    )
    .is_err());
    let dense = [true; 5];
    assert!(attention(
        &qv,
        &kv,
        &kv,
        &AttentionMask::none().with_dense_keep(&dense),
        None,
        &mut out
    )
    .is_err());
    // key dim disagreeing with query dim
    let k7 = KvView::contiguous_f32(&k, 3, 2, 7);
    assert!(attention(&qv, &k7, &kv, &none, None, &mut out).is_err());
    // non-finite scale
    assert!(attention(&qv, &kv, &kv, &none, Some(f32::NAN), &mut out).is_err());
    // overflowing strides
    let huge = KvView {
        row_stride: usize::MAX / 2,
        ..kv
    };
    assert!(attention(&qv, &huge, &huge, &none, None, &mut out).is_err());
}

/// Asserts `r` is `KernelError::Invalid` with a message containing `what`.
fn assert_invalid_naming<T: std::fmt::Debug>(r: Result<T, KernelError>, what: &str) {
    match r {
        Err(KernelError::Invalid(msg)) => assert!(msg.contains(what), "{msg}"),
        other => panic!("expected an Invalid error naming {what}, got {other:?}"),
    }
}

/// Shapes whose products overflow `usize` (reachable with zero strides, which need no
/// memory) are typed errors; before the checks, `tq·heads·d_v` wrapped to 0, matched an
/// empty `out`, and the kernel wrote past it.
#[test]
fn overflowing_shapes_are_typed_errors() {
    let q = vec![0.5f32; 4 * 8];
    let k = vec![0.25f32; 2 * 8];
    let kv = KvView::contiguous_f32(&k, 2, 1, 8);
    let none = AttentionMask::none();
    // tq = 2⁶² query rows, all reading the same row: tq·heads·d_v = 2⁶⁷ wraps to 0.
    let huge_q = QueryView {
        row_stride: 0,
        ..QueryView::contiguous(&q, 1 << 62, 4, 8)
    };
    let mut empty: [f32; 0] = [];
    assert_invalid_naming(attention(&huge_q, &kv, &kv, &none, None, &mut empty), "out");
    assert_invalid_naming(
        attention_scalar(&huge_q, &kv, &kv, &none, None, &mut empty),
        "out",
    );
    assert_invalid_naming(
        attention_with_probs(&huge_q, &kv, &kv, &none, None, &mut empty),
        "out",
    );
    // tq = 2, tk = 2⁶³ (zero row stride): the dense mask's tq·tk wraps to 0.
    let qv = QueryView::contiguous(&q, 2, 2, 8);
    let huge_k = KvView {
        row_stride: 0,
        ..KvView::contiguous_f32(&k, 1 << 63, 1, 8)
    };
    let mut out = vec![0.0f32; 2 * 2 * 8];
    let dense = AttentionMask::none().with_dense_keep(&[]);
    assert_invalid_naming(
        attention(&qv, &huge_k, &huge_k, &dense, None, &mut out),
        "dense_keep",
    );
    // The probabilities heads·tq·tk = 2⁶⁵ overflow: an error, not a capacity panic.
    assert_invalid_naming(
        attention_with_probs(&qv, &huge_k, &huge_k, &none, None, &mut out),
        "probabilities",
    );
    // Contiguous views whose heads·dim overflow saturate, so the span check rejects them.
    let wide = QueryView::contiguous(&q, 2, 1 << 62, 8);
    assert_invalid_naming(
        attention(
            &wide,
            &KvView::contiguous_f32(&k, 2, 1 << 62, 8),
            &KvView::contiguous_f32(&k, 2, 1 << 62, 8),
            &none,
            None,
            &mut out,
        ),
        "overflow",
    );
}

/// A causal offset whose positions `p₀ + i` would wrap is a typed error; one just inside
/// `usize` sees every key, as a huge position should.
#[test]
fn causal_offset_overflow_is_a_typed_error() {
    let mut rng = Rng(77);
    let (tq, tk, heads, d) = (2, 5, 2, 8);
    let q = rng.vec(tq * heads * d, 1.0);
    let k = rng.vec(tk * heads * d, 1.0);
    let v = rng.vec(tk * heads * d, 1.0);
    let qv = QueryView::contiguous(&q, tq, heads, d);
    let kv = KvView::contiguous_f32(&k, tk, heads, d);
    let vv = KvView::contiguous_f32(&v, tk, heads, d);
    let mut out = vec![0.0f32; tq * heads * d];
    for p0 in [usize::MAX, usize::MAX - 1] {
        let mask = AttentionMask::causal(p0);
        assert_invalid_naming(
            attention(&qv, &kv, &vv, &mask, None, &mut out),
            "causal_offset",
        );
        assert_invalid_naming(
            attention_scalar(&qv, &kv, &vv, &mask, None, &mut out),
            "causal_offset",
        );
        assert_invalid_naming(
            attention_with_probs(&qv, &kv, &vv, &mask, None, &mut out),
            "causal_offset",
        );
    }
    let mut all = vec![0.0f32; out.len()];
    attention(&qv, &kv, &vv, &AttentionMask::none(), None, &mut all).unwrap();
    attention(
        &qv,
        &kv,
        &vv,
        &AttentionMask::causal(usize::MAX - tq),
        None,
        &mut out,
    )
    .unwrap();
    assert_same(&out, &all);
}

/// Bit-equal, or under Miri (whose `exp` varies slightly from call to call, as platforms
/// do) within 1e-6.
fn assert_same(got: &[f32], want: &[f32]) {
    if cfg!(miri) {
        assert!(max_abs_diff(got, want) <= 1e-6, "{got:?} vs {want:?}");
    } else {
        assert_eq!(got, want);
    }
}

/// `AttentionMask::visible` never panics: pairs outside the shapes are not visible.
#[test]
fn mask_visible_out_of_range_is_false() {
    let keep = [true, true];
    let dense = [true; 4];
    let pads = AttentionMask::none().with_key_keep(&keep);
    assert!(pads.visible(0, 1, 2));
    assert!(!pads.visible(0, 5, 2)); // j ≥ tk (and past key_keep)
    assert!(!pads.visible(0, 5, 9)); // j past key_keep
    let full = AttentionMask::none().with_dense_keep(&dense);
    assert!(full.visible(1, 1, 2));
    assert!(!full.visible(2, 0, 2)); // past dense_keep
    assert!(!full.visible(usize::MAX, 1, 2)); // i·tk overflows
    assert!(!AttentionMask::none().visible(0, 3, 3));
    // A causal position past usize::MAX sees every key.
    assert!(AttentionMask::causal(usize::MAX).visible(1, 7, 8));
    assert!(!AttentionMask::causal(0).visible(1, 2, 8));
    // Sliding: query i at p₀ + i sees keys p₀ + i − w < j ≤ p₀ + i.
    let m = AttentionMask::sliding(10, 4);
    let seen: Vec<usize> = (0..20).filter(|&j| m.visible(2, j, 20)).collect();
    assert_eq!(seen, [9, 10, 11, 12]);
    assert_eq!(m.window_start(2), 9);
    assert_eq!(AttentionMask::sliding(0, 100).window_start(3), 0);
    assert_eq!(AttentionMask::causal(7).window_start(3), 0);
    assert!(AttentionMask::sliding(usize::MAX, 2).visible(1, usize::MAX - 1, usize::MAX));
}

/// A window of 0 or without a causal offset, and a soft cap that is not a positive number,
/// are typed errors naming the field.
#[test]
fn bad_window_and_softcap_are_typed_errors() {
    let (tq, tk, heads, d) = (2, 5, 2, 8);
    let q = vec![0.5f32; tq * heads * d];
    let k = vec![0.25f32; tk * heads * d];
    let qv = QueryView::contiguous(&q, tq, heads, d);
    let kv = KvView::contiguous_f32(&k, tk, heads, d);
    let mut out = vec![0.0f32; tq * heads * d];
    let no_causal = AttentionMask {
        window: Some(3),
        ..AttentionMask::none()
    };
    let bad = [
        (AttentionMask::sliding(0, 0), "window"),
        (no_causal, "window"),
        (AttentionMask::causal(3).with_softcap(0.0), "softcap"),
        (AttentionMask::causal(3).with_softcap(-1.0), "softcap"),
        (AttentionMask::none().with_softcap(f32::NAN), "softcap"),
        (AttentionMask::none().with_softcap(f32::INFINITY), "softcap"),
    ];
    for (mask, what) in bad {
        assert_invalid_naming(attention(&qv, &kv, &kv, &mask, None, &mut out), what);
        assert_invalid_naming(attention_scalar(&qv, &kv, &kv, &mask, None, &mut out), what);
        assert_invalid_naming(
            attention_with_probs(&qv, &kv, &kv, &mask, None, &mut out),
            what,
        );
    }
}

/// `reserve_scratch` reports bad and absurd shapes instead of panicking.
#[test]
fn reserve_scratch_rejects_absurd_sizes() {
    use qkv_kernels::attention::reserve_scratch;
    assert!(reserve_scratch(4, 2, 8, 8).is_ok());
    assert_invalid_naming(
        reserve_scratch(usize::MAX / 2, 1, 2, 2),
        "attention scratch",
    );
    assert_invalid_naming(
        reserve_scratch(4, 2, usize::MAX / 8, 2),
        "attention scratch",
    );
    assert_invalid_naming(
        reserve_scratch(4, 2, 8, usize::MAX - 1),
        "attention scratch",
    );
    assert_eq!(
        reserve_scratch(0, 1, 8, 8),
        Err(KernelError::ZeroDim("heads"))
    );
    assert!(matches!(
        reserve_scratch(4, 3, 8, 8),
        Err(KernelError::Mismatch { .. })
    ));
}

/// On a pool much wider than the key splits allow (where the splits are capped), split
/// decode still computes the reference result.
#[test]
fn decode_on_a_wide_pool_matches_the_reference() {
    if cfg!(miri) {
        return; // a hundred threads: the split path runs under Miri in `nonfinite`
    }
    let (tk, heads, d, threads) = (20_000, 2, 8, 100);
    let mut rng = Rng(91);
    let q = rng.vec(heads * d, 1.0);
    let k = rng.vec(tk * d, 1.0);
    let v = rng.vec(tk * d, 1.0);
    let qv = QueryView::contiguous(&q, 1, heads, d);
    let kv = KvView::contiguous_f32(&k, tk, 1, d);
    let vv = KvView::contiguous_f32(&v, tk, 1, d);
    let mask = AttentionMask::causal(tk - 1);
    let mut want = vec![0.0f32; heads * d];
    attention_with_probs(&qv, &kv, &vv, &mask, None, &mut want).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    let got = pool.install(|| {
        qkv_kernels::attention::reserve_scratch(heads, 1, d, d).unwrap();
        let mut out = vec![0.0f32; heads * d];
        attention(&qv, &kv, &vv, &mask, None, &mut out).unwrap();
        out
    });
    assert!(max_abs_diff(&got, &want) < 1e-5, "{got:?} vs {want:?}");
}

#[path = "attention/nonfinite.rs"]
mod nonfinite;

#[path = "attention/many.rs"]
mod many;
