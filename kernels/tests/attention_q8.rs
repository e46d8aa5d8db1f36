//! The attention kernel over keys and values in Q8_0 blocks (`KvData::Q8_0`): the SIMD and
//! scalar paths against a plain f64 softmax over the dequantized cache, on awkward shapes
//! (head dims 64, 80, 128 and odd ones, odd key counts, GQA, sliding windows, decode with
//! split keys, prefill with packed blocks), the non-finite rule, and the view checks.
//! Under `QKV_ISA=scalar` both paths are the scalar one and the reference still holds.

use qkv_kernels::attention::{attention_scalar, kv_q8};
use qkv_kernels::{attention, f16, AttentionMask, KvData, KvView, QueryView};

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
    fn vec(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * amp).collect()
    }
}

/// A head-major cache `[heads][capacity][padded dim]` in Q8_0 blocks, as qkv's KV cache
/// lays it out, and the dequantized values `[t][heads][dim]` the reference reads.
struct Q8Cache {
    q: Vec<i8>,
    d: Vec<f16>,
    deq: Vec<f32>,
    rows: usize,
    heads: usize,
    dim: usize,
    capacity: usize,
}

impl Q8Cache {
    fn new(x: &[f32], rows: usize, heads: usize, dim: usize, capacity: usize) -> Q8Cache {
        let dp = kv_q8::padded(dim);
        let mut q = vec![0i8; heads * capacity * dp];
        let mut d = vec![f16::ZERO; heads * capacity * dp / kv_q8::BLOCK];
        for t in 0..rows {
            for h in 0..heads {
                let at = (h * capacity + t) * dp;
                let src = &x[(t * heads + h) * dim..][..dim];
                let db = at / kv_q8::BLOCK;
                kv_q8::quantize(src, &mut q[at..at + dp], &mut d[db..db + dp / kv_q8::BLOCK])
                    .unwrap();
            }
        }
        let mut deq = vec![0.0f32; rows * heads * dim];
        for t in 0..rows {
            for h in 0..heads {
                for p in 0..dim {
                    let i = (h * capacity + t) * dp + p;
                    deq[(t * heads + h) * dim + p] = q[i] as f32 * d[i / kv_q8::BLOCK].to_f32();
                }
            }
        }
        Q8Cache {
            q,
            d,
            deq,
            rows,
            heads,
            dim,
            capacity,
        }
    }

    fn view(&self) -> KvView<'_> {
        let dp = kv_q8::padded(self.dim);
        KvView {
            data: KvData::Q8_0 {
                q: &self.q,
                d: &self.d,
            },
            rows: self.rows,
            heads: self.heads,
            dim: self.dim,
            row_stride: dp,
            head_stride: self.capacity * dp,
        }
    }
}

/// Plain attention in f64 over dense `[t, kv_heads, d]` keys and values; masked keys take no
/// part, a row without visible keys is zeros, a NaN or +∞ score makes the row NaN.
#[allow(clippy::too_many_arguments)]
fn naive(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (tq, tk, heads, kv_heads, d, dv): (usize, usize, usize, usize, usize, usize),
    visible: &dyn Fn(usize, usize) -> bool,
) -> Vec<f32> {
    let group = heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f32; tq * heads * dv];
    for h in 0..heads {
        let g = h / group;
        for i in 0..tq {
            let o = &mut out[(i * heads + h) * dv..][..dv];
            let seen: Vec<usize> = (0..tk).filter(|&j| visible(i, j)).collect();
            if seen.is_empty() {
                continue;
            }
            let s: Vec<f64> = seen
                .iter()
                .map(|&j| {
                    (0..d)
                        .map(|p| {
                            q[(i * heads + h) * d + p] as f64 * k[(j * kv_heads + g) * d + p] as f64
                        })
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if s.iter().any(|x| x.is_nan()) || m.is_infinite() {
                o.fill(f32::NAN);
                continue;
            }
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for (c, oc) in o.iter_mut().enumerate() {
                *oc = (seen
                    .iter()
                    .zip(&e)
                    .map(|(&j, e)| e / z * v[(j * kv_heads + g) * dv + c] as f64)
                    .sum::<f64>()) as f32;
            }
        }
    }
    out
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[derive(Clone, Copy, Debug)]
struct Case {
    tq: usize,
    tk: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    dv: usize,
    causal: Option<usize>,
    window: Option<usize>,
}

/// Runs `case` on both paths over a Q8_0 cache with spare capacity and checks them against
/// the reference and against each other.
fn check(case: Case, rng: &mut Rng) {
    let Case {
        tq,
        tk,
        heads,
        kv_heads,
        d,
        dv,
        causal,
        window,
    } = case;
    let q = rng.vec(tq * heads * d, 2.0);
    let kc = Q8Cache::new(&rng.vec(tk * kv_heads * d, 2.0), tk, kv_heads, d, tk + 5);
    let vc = Q8Cache::new(&rng.vec(tk * kv_heads * dv, 1.0), tk, kv_heads, dv, tk + 3);
    let mask = AttentionMask {
        causal_offset: causal,
        window,
        ..AttentionMask::default()
    };
    let want = naive(
        &q,
        &kc.deq,
        &vc.deq,
        (tq, tk, heads, kv_heads, d, dv),
        &|i, j| mask.visible(i, j, tk),
    );
    let qv = QueryView::contiguous(&q, tq, heads, d);
    let (kv, vv) = (kc.view(), vc.view());
    let mut simd = vec![0.0f32; tq * heads * dv];
    let mut scalar = vec![0.0f32; tq * heads * dv];
    attention(&qv, &kv, &vv, &mask, None, &mut simd).unwrap();
    attention_scalar(&qv, &kv, &vv, &mask, None, &mut scalar).unwrap();
    let tol = 2e-5 * (d.max(dv) as f32).sqrt();
    for (what, got) in [("simd", &simd), ("scalar", &scalar)] {
        let err = max_abs_diff(got, &want);
        assert!(err < tol, "{what} vs reference: {err} for {case:?}");
    }
    let err = max_abs_diff(&simd, &scalar);
    assert!(err < tol, "simd vs scalar: {err} for {case:?}");
}

#[test]
fn q8_0_cache_matches_the_reference_on_awkward_shapes() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // (heads, kv_heads): MHA, GQA 3:1 (SmolLM2), GQA 4:1 over 2 heads, MQA 8:1.
    let groups = [(1, 1), (3, 1), (8, 2), (8, 1)];
    for d in [64, 80, 128, 5, 40, 96] {
        for (heads, kv_heads) in groups {
            // Decode (one query, in place; split keys from 256 keys on), then prefill.
            for (tq, tk) in [
                (1, 1),
                (1, 63),
                (1, 65),
                (1, 700),
                (1, 2049),
                (7, 7),
                (100, 301),
            ] {
                let causal = Some(tk - tq);
                check(
                    Case {
                        tq,
                        tk,
                        heads,
                        kv_heads,
                        d,
                        dv: d,
                        causal,
                        window: None,
                    },
                    &mut rng,
                );
            }
        }
    }
}

#[test]
fn q8_0_cache_with_windows_unmasked_and_mixed_dims() {
    let mut rng = Rng(7);
    for (tq, tk, window) in [(1, 700, 100), (1, 300, 1), (5, 129, 33), (130, 400, 64)] {
        for (d, dv) in [(64, 64), (80, 80), (128, 128), (64, 80), (24, 56)] {
            check(
                Case {
                    tq,
                    tk,
                    heads: 6,
                    kv_heads: 2,
                    d,
                    dv,
                    causal: Some(tk - tq),
                    window: Some(window),
                },
                &mut rng,
            );
        }
    }
    // No mask at all (cross-attention shapes), prefill and decode.
    for (tq, tk) in [(1, 77), (33, 65)] {
        check(
            Case {
                tq,
                tk,
                heads: 4,
                kv_heads: 4,
                d: 80,
                dv: 80,
                causal: None,
                window: None,
            },
            &mut rng,
        );
    }
}

#[test]
fn q8_0_cache_splits_keys_on_wide_pools() {
    // Four threads split a decode call's keys into several ranges, merged at the end.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    pool.install(|| {
        let mut rng = Rng(11);
        for (heads, kv_heads, d) in [(3, 1, 64), (32, 8, 128), (10, 2, 80)] {
            check(
                Case {
                    tq: 1,
                    tk: 4097,
                    heads,
                    kv_heads,
                    d,
                    dv: d,
                    causal: Some(4096),
                    window: None,
                },
                &mut rng,
            );
        }
    });
}

/// The positions of NaN in `a` and `b` agree, and the other values are close.
fn assert_same_nonfinite(a: &[f32], b: &[f32], what: &str) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.is_nan(), y.is_nan(), "{what}: element {i}: {x} vs {y}");
        if x.is_finite() || y.is_finite() {
            assert!((x - y).abs() < 1e-4, "{what}: element {i}: {x} vs {y}");
        }
    }
}

#[test]
fn non_finite_scales_follow_the_rule_on_both_paths() {
    // A NaN or infinite scale in a visible key's K block makes its rows NaN; in a masked key
    // it changes nothing; in V it reaches the output of the rows that see it.
    let (heads, kv_heads, d, tk) = (6, 2, 80, 300);
    for tq in [1, 70] {
        for (tensor, bad) in [
            (0, f32::NAN),
            (0, f32::INFINITY),
            (1, f32::NAN),
            (1, f32::INFINITY),
        ] {
            let mut rng = Rng(5 + tq as u64);
            let q = rng.vec(tq * heads * d, 1.0);
            let mut kc = Q8Cache::new(&rng.vec(tk * kv_heads * d, 1.0), tk, kv_heads, d, tk);
            let mut vc = Q8Cache::new(&rng.vec(tk * kv_heads * d, 1.0), tk, kv_heads, d, tk);
            let poisoned = 250; // visible to queries at positions ≥ 250 only
            let c = if tensor == 0 { &mut kc } else { &mut vc };
            let blk = c.capacity * kv_q8::padded(d) / kv_q8::BLOCK + poisoned * 3 + 1; // head 1
            c.d[blk] = f16::from_f32(bad);
            let qv = QueryView::contiguous(&q, tq, heads, d);
            let mask = AttentionMask::causal(tk - tq);
            let (mut simd, mut scalar) = (vec![0.0; tq * heads * d], vec![0.0; tq * heads * d]);
            attention(&qv, &kc.view(), &vc.view(), &mask, None, &mut simd).unwrap();
            attention_scalar(&qv, &kc.view(), &vc.view(), &mask, None, &mut scalar).unwrap();
            let what = format!("tq {tq}, tensor {tensor}, scale {bad}");
            assert_same_nonfinite(&simd, &scalar, &what);
            for i in 0..tq {
                let pos = tk - tq + i;
                for h in 0..heads {
                    let row = &simd[(i * heads + h) * d..][..d];
                    let sees = h / 3 == 1 && pos >= poisoned;
                    if !sees {
                        assert!(row.iter().all(|x| x.is_finite()), "{what}: row {i}, {h}");
                    } else if tensor == 0 {
                        // K: 0·∞ and NaN scales read as NaN in every element of the block.
                        assert!(row.iter().all(|x| x.is_nan()), "{what}: row {i}, {h}");
                    } else {
                        // V: only the poisoned block's columns (32..64) go non-finite.
                        assert!(row[..32].iter().all(|x| x.is_finite()), "{what}: {i}, {h}");
                        assert!(
                            row[32..64].iter().any(|x| !x.is_finite()),
                            "{what}: {i}, {h}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn q8_0_views_are_checked() {
    let q = vec![0.0f32; 64];
    let kq = vec![0i8; 4 * 64];
    let kd = vec![f16::ZERO; 8];
    let qv = QueryView::contiguous(&q, 1, 1, 64);
    let mut out = vec![0.0f32; 64];
    let ok = KvView {
        data: KvData::Q8_0 { q: &kq, d: &kd },
        rows: 4,
        heads: 1,
        dim: 64,
        row_stride: 64,
        head_stride: 64,
    };
    let m = AttentionMask::none();
    attention(&qv, &ok, &ok, &m, None, &mut out).unwrap();
    // A row stride off the blocks.
    let bad = KvView {
        row_stride: 48,
        dim: 40,
        ..ok
    };
    let q40 = vec![0.0f32; 40];
    let qv40 = QueryView::contiguous(&q40, 1, 1, 40);
    let mut out40 = vec![0.0f32; 40];
    assert!(attention(&qv40, &bad, &bad, &m, None, &mut out40).is_err());
    // Scales that do not cover the view.
    let short = KvView {
        data: KvData::Q8_0 {
            q: &kq,
            d: &kd[..7],
        },
        ..ok
    };
    assert!(attention(&qv, &short, &short, &m, None, &mut out).is_err());
    assert!(attention_scalar(&qv, &short, &short, &m, None, &mut out).is_err());
}
