//! Tests of activation quantization: both precisions, the tile layouts and their sums.

use super::*;

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let v = (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
            // Blocks of very different magnitudes, and one all-zero block.
            if (i / 32) % 7 == 3 {
                0.0
            } else {
                v * 10f32.powi((i / 32 % 5) as i32 - 2)
            }
        })
        .collect()
}

/// Half a step, plus the f32 roundings of a step count near 32767 (`x·inv`, `inv` itself
/// and `t ± 0.5` each round by up to 2⁻¹⁰ of a step there, `q·s` by 2⁻²⁴ of the value):
/// 1/128 of a step covers them, far below the whole step an off-by-one would cost. (The
/// bound was 0.5·1.0001 steps, which a Miri run broke on slightly different inputs: Miri's
/// float functions such as `powi` are deliberately not bit-exact.)
#[test]
fn error_is_within_half_a_step() {
    let x = values(32 * 40, 7);
    let mut acts = QuantizedActs::default();
    for precision in [ActPrecision::Wide, ActPrecision::Byte] {
        acts.quantize_at(&x, 2, 32 * 20, precision).unwrap();
        for (b, xb) in x.chunks_exact(32).enumerate() {
            let s = acts.scale[b];
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            assert_eq!(s, amax / precision.max(), "block {b}");
            for (j, &v) in xb.iter().enumerate() {
                let back = f32::from(acts.q[32 * b + j]) * s;
                let err = (back - v).abs();
                assert!(
                    err <= (0.5 + 1.0 / 128.0) * s,
                    "{precision:?} block {b} elem {j}: {err} of {s}"
                );
            }
            let exact: f64 = match precision {
                ActPrecision::Wide => xb.iter().map(|&v| f64::from(v)).sum(),
                ActPrecision::Byte => {
                    let q = &acts.q[32 * b..32 * b + 32];
                    f64::from(s) * q.iter().map(|&v| f64::from(v)).sum::<f64>()
                }
            };
            assert!((f64::from(acts.sum[b]) - exact).abs() <= 1e-6 * (1.0 + exact.abs()));
        }
    }
}

/// Up to 16 rows get their half-block sums; 8-bit activations get their bytes and 16-bit ones their byte split
/// when asked, for any number of rows; and a later call does not see stale ones.
#[test]
fn rows_get_half_sums_tiles_and_bytes() {
    let mut acts = QuantizedActs::default();
    let k = 96;
    acts.quantize(&values(2 * k, 5), 2, k).unwrap();
    assert!(acts.isum16.len() == 2 * k / 16);
    assert!(!acts.has_tiles());
    for m in [2, 17] {
        acts.quantize(&values(m * k, 5), m, k).unwrap();
        assert_eq!(acts.isum16.is_empty(), m > HALF_SUMS_MAX_ROWS);
        acts.add_split();
        acts.check().unwrap();
        check_tiles(&acts);
        acts.quantize_at(&values(m * k, 5), m, k, ActPrecision::Byte)
            .unwrap();
        assert!(acts.split.is_empty());
        acts.check().unwrap();
        check_tiles(&acts);
        // The byte split is for 16-bit activations only.
        acts.add_split();
        assert!(acts.split.is_empty());
    }
    for precision in [ActPrecision::Wide, ActPrecision::Byte] {
        let x = values(k, 9);
        acts.quantize_at(&x, 1, k, precision).unwrap();
        acts.check().unwrap();
        for b in 0..k / 32 {
            let q = &acts.q[32 * b..32 * b + 32];
            for h in 0..2 {
                let want: i32 = q[16 * h..16 * h + 16].iter().map(|&v| i32::from(v)).sum();
                assert_eq!(acts.isum16[2 * b + h], want, "block {b}, half {h}");
            }
        }
    }
    acts.quantize(&values(2 * k, 5), 2, k).unwrap();
    assert!(acts.bytes.is_empty() && acts.tile_meta.is_empty());
    // Tiles that disagree with the shape are refused.
    acts.quantize_at(&values(2 * k, 5), 2, k, ActPrecision::Byte)
        .unwrap();
    acts.bytes.pop();
    assert!(matches!(acts.check(), Err(KernelError::Length { .. })));
    acts.quantize(&values(2 * k, 5), 2, k).unwrap();
    acts.add_split();
    acts.tile_meta.pop();
    assert!(matches!(acts.check(), Err(KernelError::Length { .. })));
}

/// Every block of every row is in the tiles where `tile_at` says, its bytes putting `q`
/// back together (the bytes themselves within ±127 at 8 bits, `256·hi + lo` at 16), with
/// its scale, sum and integer sum; and every entry is some block's (the tiles leave no
/// gaps).
fn check_tiles(acts: &QuantizedActs) {
    let bpr = acts.blocks_per_row();
    let mut seen = vec![false; acts.tile_meta.len()];
    for row in 0..acts.m {
        for b in 0..bpr {
            let at = acts.tile_at(row, b);
            assert!(
                !std::mem::replace(&mut seen[at], true),
                "row {row} block {b}"
            );
            let src = row * bpr + b;
            let q = &acts.q[32 * src..32 * src + 32];
            for (e, &v) in q.iter().enumerate() {
                let back = match acts.precision {
                    ActPrecision::Byte => {
                        assert!(v.abs() <= 127);
                        i32::from(acts.bytes[at].q[e])
                    }
                    ActPrecision::Wide => {
                        let t = &acts.split[at];
                        256 * i32::from(t.hi[e]) + i32::from(t.lo[e])
                    }
                };
                assert_eq!(back, i32::from(v));
            }
            let meta = acts.tile_meta[at];
            assert_eq!(meta.scale.to_bits(), acts.scale[src].to_bits());
            assert_eq!(meta.sum.to_bits(), acts.sum[src].to_bits());
            assert_eq!(meta.isum, q.iter().map(|&v| i32::from(v)).sum::<i32>());
            assert_eq!(
                meta.isum_lo,
                q[..16].iter().map(|&v| i32::from(v)).sum::<i32>()
            );
        }
    }
    assert!(seen.iter().all(|&s| s));
}

#[test]
fn simd_and_scalar_agree_bitwise() {
    let x = values(32 * 64, 11);
    let mut acts = QuantizedActs::default();
    for precision in [ActPrecision::Wide, ActPrecision::Byte] {
        acts.quantize_at(&x, 4, 32 * 16, precision).unwrap();
        let mut q = vec![0i16; x.len()];
        let (mut scale, mut sum) = (vec![0.0; 64], vec![0.0; 64]);
        quantize_scalar(&x, &mut q, &mut scale, &mut sum, precision).unwrap();
        assert_eq!(acts.q, q, "{precision:?}");
        assert_eq!(
            acts.scale.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            scale.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            acts.sum.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            sum.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn nan_and_inf_stay_visible() {
    let mut x = vec![1.0f32; 96];
    x[5] = f32::NAN;
    x[40] = f32::INFINITY;
    let mut acts = QuantizedActs::default();
    acts.quantize(&x, 1, 96).unwrap();
    assert!(acts.scale[0].is_nan());
    assert!(acts.scale[1].is_infinite());
    assert_eq!(acts.scale[2], 1.0 / 32767.0);
}

#[test]
fn wrong_lengths_are_errors() {
    let mut acts = QuantizedActs::default();
    let x = vec![1.0f32; 64];
    assert!(matches!(
        acts.quantize(&x, 1, 48),
        Err(KernelError::Mismatch { left: 48, .. })
    ));
    assert_eq!(
        acts.quantize(&x, 3, 32),
        Err(KernelError::Length {
            what: "x",
            expected: 96,
            actual: 64
        })
    );
    assert!(acts.quantize(&x, usize::MAX, 32).is_err());
    acts.quantize(&x, 2, 32).unwrap();
    acts.check().unwrap();
    acts.m = 3;
    assert!(matches!(acts.check(), Err(KernelError::Length { .. })));

    let (mut q, mut scale, mut sum) = (vec![0i16; 64], vec![0.0; 2], vec![0.0; 2]);
    assert!(quantize_scalar(
        &x[..40],
        &mut q[..40],
        &mut scale,
        &mut sum,
        ActPrecision::Wide
    )
    .is_err());
    assert!(matches!(
        quantize_scalar(&x, &mut q[..32], &mut scale, &mut sum, ActPrecision::Wide),
        Err(KernelError::Length { what: "q", .. })
    ));
    assert!(matches!(
        quantize_scalar(&x, &mut q, &mut scale[..1], &mut sum, ActPrecision::Wide),
        Err(KernelError::Length { what: "scale", .. })
    ));
    assert!(matches!(
        quantize_scalar(&x, &mut q, &mut scale, &mut sum[..1], ActPrecision::Byte),
        Err(KernelError::Length { what: "sum", .. })
    ));
    quantize_scalar(&x, &mut q, &mut scale, &mut sum, ActPrecision::Byte).unwrap();
}
