//! Positions: RoPE (both pair layouts, strided views, known values from Hugging Face) and the
//! sinusoidal table, against their scalar references, and their errors.

use super::{assert_close, Rng, SIZES};
use qkv_kernels::activation::add_inplace;
use qkv_kernels::position::{add_sinusoidal_inplace, sinusoidal_table};
use qkv_kernels::rope::{RopeStyle, RopeTable};
use qkv_kernels::KernelError;

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
    // (Not under Miri, which is slow to interpret 256,512 sines and cosines; they check
    // arithmetic, not memory, through the loop the d = 4 table above already ran.)
    let pe = if cfg!(miri) {
        Vec::new()
    } else {
        sinusoidal_table(501, 512).unwrap()
    };
    assert!(
        cfg!(miri) || pe.len() == 501 * 512,
        "pe 501 × 512: {}",
        pe.len()
    );
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
    ]
    .into_iter()
    .filter(|_| !pe.is_empty())
    {
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
