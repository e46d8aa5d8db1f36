//! Non-finite inputs on every path of the kernel, against the rule in its documentation.

use super::{naive, Kv, Rng, F16};
use qkv_kernels::attention::attention_scalar;
use qkv_kernels::{attention, attention_with_probs, AttentionMask, KvView, QueryView};

/// One attention path of the kernel, chosen by its shape (see `streaming::plan`).
#[derive(Clone, Copy, Debug)]
struct PathShape {
    name: &'static str,
    tq: usize,
    tk: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    /// Causal offset (`tk − tq`: the queries are the last positions).
    causal: bool,
    softcap: Option<f32>,
    /// Threads of the pool the call runs on.
    threads: usize,
}

/// Every path but split keys: prefill packing its key blocks once up front (≥ 3 query
/// blocks: 12 queries × 8 heads per block, under Miri 2 × 48), prefill packing per item
/// (one query block of more than 8 rows), decode reading K and V in place (4 rows), and
/// soft-capped decode. Under Miri (which interprets every operation) with 10 keys and
/// `d = 2`; else past one key block.
const PATHS: [PathShape; 4] = [
    PathShape {
        name: "prefill, packed up front",
        tq: if MIRI { 5 } else { 36 },
        tk: if MIRI { 10 } else { 36 },
        heads: if MIRI { 48 } else { 8 },
        kv_heads: 1,
        d: D,
        causal: true,
        softcap: None,
        threads: if MIRI { 1 } else { 2 },
    },
    PathShape {
        name: "prefill, packed per item",
        tq: if MIRI { 2 } else { 12 },
        tk: TK,
        heads: if MIRI { 16 } else { 8 },
        kv_heads: 1,
        d: D,
        causal: true,
        softcap: None,
        threads: 1,
    },
    PathShape {
        name: "decode, in place",
        tq: 1,
        tk: TK,
        heads: 8,
        kv_heads: 2,
        d: 2 * D,
        causal: true,
        softcap: None,
        threads: 1,
    },
    PathShape {
        name: "decode, soft-capped",
        tq: 1,
        tk: TK,
        heads: 4,
        kv_heads: 2,
        d: D,
        causal: true,
        softcap: Some(3.0),
        threads: 1,
    },
];

const MIRI: bool = cfg!(miri);
/// Elements per head of [`PATHS`].
const D: usize = if MIRI { 2 } else { 8 };
/// Keys of the decode paths.
const TK: usize = if MIRI { 10 } else { 70 };

/// Decode with its keys split across threads and merged: 600 keys × 2 heads × d 64 is past
/// the parallel threshold, and gives 2 key ranges on 4 threads.
const SPLIT: PathShape = PathShape {
    name: "decode, split keys",
    tq: 1,
    tk: 600,
    heads: 2,
    kv_heads: 1,
    d: 64,
    causal: true,
    softcap: None,
    threads: 4,
};

/// The paths each test runs: all of them, or under Miri all but split keys (600 keys of
/// 64 elements and a pool of threads cost Miri too long; the split path's own code, the
/// merge, holds no `unsafe`) and, unless `up_front`, all but the path that packs its key
/// blocks up front. That path needs three query blocks of 96 rows, about 8 times the rows of
/// the others, and held each test for tens of minutes under Miri; its blocks run the same
/// micro-kernels as the others, so under Miri it runs in one test (the NaN key) only.
fn paths_with(up_front: bool) -> Vec<PathShape> {
    let mut all = PATHS.to_vec();
    if MIRI {
        if !up_front {
            all.remove(0);
        }
    } else {
        all.push(SPLIT);
    }
    all
}

/// [`paths_with`] as most tests take it.
fn paths() -> Vec<PathShape> {
    paths_with(false)
}

/// What is written where.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Poison {
    /// Element 1 of key `j`'s K row (every KV head).
    Key(usize, f32),
    /// Element 1 of key `j`'s V row (every KV head).
    Value(usize, f32),
    /// Element 1 of query `i`, head 1.
    Query(usize, f32),
}

/// Keys padded away (`key_keep` false): every fifth key from key 2, so that padded keys lie
/// inside blocks the kernel computes.
fn padded(j: usize) -> bool {
    j % 5 == 2
}

/// Runs `shape` with `poison` on both KV types, through `attention`, `attention_scalar` and
/// `attention_with_probs`, and checks each against the rule (`naive`): NaN exactly where it
/// puts NaN, ±∞ where it puts them, the rest within 1e-5. Returns the rule's output (f32 KV).
fn nonfinite_case(shape: PathShape, poison: Poison) -> Vec<f32> {
    let PathShape {
        tq,
        tk,
        heads,
        kv_heads,
        d,
        causal,
        softcap,
        threads,
        ..
    } = shape;
    let dv = d;
    let mut rng = Rng(0x5eed ^ tk as u64);
    let mut q = rng.vec(tq * heads * d, 1.0);
    let mut k = rng.vec(tk * kv_heads * d, 1.0);
    let mut v = rng.vec(tk * kv_heads * dv, 1.0);
    match poison {
        Poison::Key(j, x) => (0..kv_heads).for_each(|g| k[(j * kv_heads + g) * d + 1] = x),
        Poison::Value(j, x) => (0..kv_heads).for_each(|g| v[(j * kv_heads + g) * dv + 1] = x),
        Poison::Query(i, x) => q[(i * heads + 1) * d + 1] = x,
    }
    let keep: Vec<bool> = (0..tk).map(|j| !padded(j)).collect();
    let mut mask = AttentionMask::none().with_key_keep(&keep);
    if causal {
        mask.causal_offset = Some(tk - tq);
    }
    mask.softcap = softcap;
    // One thread: the calling one (no pool to start, which costs Miri most of a case).
    let pool = (threads > 1).then(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool")
    });
    let mut rule_f32 = Vec::new();
    for f16_kv in [false, true].into_iter().filter(|&f| !f || F16) {
        let kv_data = Kv::new(k.clone(), v.clone(), f16_kv);
        let visible = |i: usize, j: usize| mask.visible(i, j, tk);
        let (want, want_probs) = naive(
            &q, &kv_data.k, &kv_data.v, tq, tk, heads, kv_heads, d, dv, &visible, softcap,
        );
        let qv = QueryView::contiguous(&q, tq, heads, d);
        let (kv, vv) = kv_data.views(tk, kv_heads, d, dv);
        let n = tq * heads * dv;
        let (mut simd, mut scalar, mut slow) = (vec![0.5; n], vec![0.5; n], vec![0.5; n]);
        let mut calls = || {
            attention(&qv, &kv, &vv, &mask, None, &mut simd).unwrap();
            attention_scalar(&qv, &kv, &vv, &mask, None, &mut scalar).unwrap();
            attention_with_probs(&qv, &kv, &vv, &mask, None, &mut slow).unwrap()
        };
        let probs = match &pool {
            Some(pool) => pool.install(calls),
            None => calls(),
        };
        let what = format!("{} with {poison:?}, f16 KV {f16_kv}", shape.name);
        for (name, got) in [
            ("simd", &simd),
            ("scalar", &scalar),
            ("with_probs", &slow),
            ("probabilities", &probs),
        ] {
            let want = if name == "probabilities" {
                &want_probs
            } else {
                &want
            };
            assert_same_nonfinite(got, want, &format!("{name}: {what}"));
        }
        // The SIMD and scalar paths put NaN in the same places, bit for bit.
        let nan_at = |x: &[f32]| x.iter().map(|x| x.is_nan()).collect::<Vec<_>>();
        assert_eq!(nan_at(&simd), nan_at(&scalar), "{what}");
        if !f16_kv {
            rule_f32 = want;
        }
    }
    rule_f32
}

/// `got` has NaN exactly where `want` has, the same infinities, and finite values within
/// 1e-5 of `want`'s.
fn assert_same_nonfinite(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (n, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= 1e-5
        };
        assert!(ok, "{what}: element {n} is {g}, the rule gives {w}");
    }
}

/// Rows `(query, head)` of an output whose elements are all NaN, and those with any NaN.
fn nan_rows(out: &[f32], dv: usize) -> (usize, usize) {
    let all = out
        .chunks(dv)
        .filter(|r| r.iter().all(|x| x.is_nan()))
        .count();
    let any = out
        .chunks(dv)
        .filter(|r| r.iter().any(|x| x.is_nan()))
        .count();
    (all, any)
}

/// A NaN in the K row of a visible key makes NaN every row that sees it (and only those);
/// the same NaN in a padded key's row changes nothing.
#[test]
fn nan_in_a_key_propagates_unless_masked() {
    for shape in paths_with(true) {
        let rows = shape.tq * shape.heads;
        // Key 3 is visible to the queries at or after it; key 7 is padding.
        let out = nonfinite_case(shape, Poison::Key(3, f32::NAN));
        let seeing = (0..shape.tq)
            .filter(|&i| shape.tk - shape.tq + i >= 3)
            .count();
        assert_eq!(
            nan_rows(&out, shape.d),
            (seeing * shape.heads, seeing * shape.heads),
            "{}",
            shape.name
        );
        let out = nonfinite_case(shape, Poison::Key(7, f32::NAN));
        assert_eq!(nan_rows(&out, shape.d), (0, 0), "{}", shape.name);
        assert!(rows > 0);
    }
    // Split keys: a NaN in the second range poisons the merged row too.
    if !MIRI {
        let out = nonfinite_case(SPLIT, Poison::Key(500, f32::NAN));
        assert_eq!(nan_rows(&out, SPLIT.d), (2, 2));
    }
}

/// A NaN in a query makes that (query, head) row NaN and no other.
#[test]
fn nan_in_a_query_makes_its_row_nan() {
    for shape in paths() {
        let out = nonfinite_case(shape, Poison::Query(shape.tq - 1, f32::NAN));
        assert_eq!(nan_rows(&out, shape.d), (1, 1), "{}", shape.name);
        let row = ((shape.tq - 1) * shape.heads + 1) * shape.d;
        assert!(out[row..row + shape.d].iter().all(|x| x.is_nan()));
    }
}

/// ±∞ in a visible key: rows whose score is +∞ are NaN (∞ − ∞), rows whose score is −∞ give
/// that key weight 0 and stay finite; soft-capping turns both into ±cap. A padded key's ∞
/// changes nothing.
#[test]
fn infinite_keys_follow_the_softmax() {
    for shape in paths() {
        for x in [f32::INFINITY, f32::NEG_INFINITY] {
            let out = nonfinite_case(shape, Poison::Key(3, x));
            let (all, any) = nan_rows(&out, shape.d);
            assert_eq!(all, any, "{}: whole rows only", shape.name);
            if shape.softcap.is_some() {
                assert_eq!(all, 0, "{}: capped scores are finite", shape.name);
            }
            let out = nonfinite_case(shape, Poison::Key(7, x));
            assert!(out.iter().all(|x| x.is_finite()), "{}", shape.name);
        }
    }
    // Both signs occur: with element 1 of the query positive the score of +∞ is +∞.
    let shape = PATHS[2];
    let out = nonfinite_case(shape, Poison::Key(3, f32::INFINITY));
    let (all, _) = nan_rows(&out, shape.d);
    assert!(
        all > 0 && all < shape.heads,
        "{all} NaN rows of {}",
        shape.heads
    );
}

/// NaN or ∞ in the V row of a visible key reaches the output column it sits in (as `p·V`);
/// in a padded key's V row it never does, though that key lies inside computed blocks.
#[test]
fn nonfinite_values_reach_the_output_unless_masked() {
    for shape in paths() {
        let seeing = (0..shape.tq)
            .filter(|&i| shape.tk - shape.tq + i >= 3)
            .count();
        let out = nonfinite_case(shape, Poison::Value(3, f32::NAN));
        assert_eq!(
            nan_rows(&out, shape.d),
            (0, seeing * shape.heads),
            "{}: column 1 only",
            shape.name
        );
        let out = nonfinite_case(shape, Poison::Value(3, f32::INFINITY));
        let infs = out.iter().filter(|x| **x == f32::INFINITY).count();
        assert_eq!(infs, seeing * shape.heads, "{}", shape.name);
        for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let out = nonfinite_case(shape, Poison::Value(7, x));
            assert!(out.iter().all(|x| x.is_finite()), "{}", shape.name);
        }
    }
    // Future keys are masked as padding is: a NaN in the V row of the last key reaches only
    // the last query's rows in causal prefill.
    let shape = PATHS[1];
    let out = nonfinite_case(shape, Poison::Value(shape.tk - 1, f32::NAN));
    assert_eq!(nan_rows(&out, shape.d), (0, shape.heads));
}

/// A row whose visible keys all score −∞ is NaN (0/0); a row with no visible key is zeros.
#[test]
fn rows_without_weight_are_nan_and_rows_without_keys_are_zero() {
    let (tq, tk, d) = (2, 70, 8);
    let q = vec![1.0f32; tq * d];
    let k = vec![f32::NEG_INFINITY; tk * d];
    let v = vec![1.0f32; tk * d];
    // Query 0 sees nothing, query 1 sees every key.
    let dense: Vec<bool> = (0..tq * tk).map(|x| x >= tk).collect();
    let mask = AttentionMask::none().with_dense_keep(&dense);
    let qv = QueryView::contiguous(&q, tq, 1, d);
    let kv = KvView::contiguous_f32(&k, tk, 1, d);
    let vv = KvView::contiguous_f32(&v, tk, 1, d);
    let mut out = vec![0.5f32; tq * d];
    for run in [attention, attention_scalar] {
        run(&qv, &kv, &vv, &mask, None, &mut out).unwrap();
        assert!(out[..d].iter().all(|&x| x == 0.0), "{out:?}");
        assert!(out[d..].iter().all(|x| x.is_nan()), "{out:?}");
    }
    let probs = attention_with_probs(&qv, &kv, &vv, &mask, None, &mut out).unwrap();
    assert!(probs[..tk].iter().all(|&x| x == 0.0));
    assert!(probs[tk..].iter().all(|x| x.is_nan()));
}
