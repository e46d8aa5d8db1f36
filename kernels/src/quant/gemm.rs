//! The quantized product for many rows (prefill) on integer dot-product units:
//! `y[m, n] = x[m, k]·Wᵀ (+ b)` with `W` in blocks of a [`QuantFormat`] and `x` quantized per
//! 32 ([`QuantizedActs`], as the decode GEMV does).
//!
//! The math is the GEMV's (see [`super::gemv`]): per group of 32, `w = a·q + c`, so a group
//! adds `xs·a·Σ q·xq + c·Σx`. What changes is the shape of the work. A GEMV reads each
//! weight once for at most 8 rows; here every weight meets hundreds of rows, so the weights
//! are first unpacked, a panel of [`NR`] rows of `W` at a time, into 16-bit integers laid out
//! for the multiply (pairs of elements of one row of `W` side by side across the panel's
//! rows), and the panel then sweeps over every row of `x`. AVX-512 VNNI's `vpdpwssd` takes a
//! pair of 16-bit activations broadcast to all lanes and adds 32 products into 16 columns'
//! i32 sums in one instruction: twice the multiply-adds of an f32 FMA, with no widening of
//! the weights to f32 and no f32 panel to stream.
//!
//! Where the CPU lacks AVX-512 VNNI, prefill widens panels of `W` to f32 for the gemm crate
//! instead ([`crate::matmul`]); on AVX2 alone, `madd` plus an add gives no more multiply-adds
//! per instruction than an f32 FMA, so an integer path would not pay there. The scalar
//! reference for this kernel is the GEMV's `columns_scalar` (in `quant::gemv`), which computes
//! the same integer dot products in one order.

#[cfg(target_arch = "x86_64")]
mod vnni;

use super::act::QuantizedActs;
use super::QuantFormat;
use crate::error::{check_len, KernelError, Result};

/// Rows of `W` per packed panel: two 512-bit vectors of 16 i32 sums per row of `x`.
pub const NR: usize = 32;

/// True when [`gemm()`] runs on this CPU: AVX-512 F, BW, VL and VNNI (off under
/// `QKV_ISA=scalar` and `QKV_ISA=avx2`). It has no 256-bit twin, so it runs wherever its
/// features are ([`crate::simd::Isa::prefer_512`] is for kernels that have one).
pub fn available() -> bool {
    crate::simd::isa().avx512_vnni
}

/// `y[m, n] = x·Wᵀ (+ b)` for `x` quantized in `acts` (`m = acts.m`, `k = acts.k`) and `W`
/// the `n` rows of `k` elements of `format` in `w`, split by panels of [`NR`] rows of `W`
/// across rayon's current pool. Returns `Ok(false)`, touching nothing, when [`available`]
/// is false; the caller then takes another path.
///
/// Errors, touching nothing, unless the shapes agree: `acts` as
/// [`QuantizedActs::quantize`] leaves it ([`QuantizedActs::check`]), `y` holding `m·n`
/// floats, `w` exactly `n` rows of `k` elements of `format`, and `bias` (if any) `n` values.
pub fn gemm(
    y: &mut [f32],
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
) -> Result<bool> {
    product(y, acts, format, w, false, bias, n)
}

/// As [`gemm()`], with `W` in the interleaved layout ([`x8`](super::x8), `packed` as
/// [`x8::pack`](super::x8::pack) leaves it): each panel's rows are taken back to GGUF's
/// layout as the panel is packed, on the thread that packs it, so no copy of the whole
/// matrix is made and none of the work is serial. Errors, touching nothing, as [`gemm()`]
/// does, or when the format has no interleaved layout or `n` is not whole groups of 8.
pub fn gemm_interleaved(
    y: &mut [f32],
    acts: &QuantizedActs,
    format: QuantFormat,
    packed: &[u8],
    bias: Option<&[f32]>,
    n: usize,
) -> Result<bool> {
    super::x8::check(format, n, acts.k)?;
    product(y, acts, format, packed, true, bias, n)
}

/// [`gemm()`] (`interleaved` false) and [`gemm_interleaved`] after their own checks.
fn product(
    y: &mut [f32],
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    interleaved: bool,
    bias: Option<&[f32]>,
    n: usize,
) -> Result<bool> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        check_shapes(y, acts, format, w, bias, n)?;
        vnni::gemm(y, acts, format, w, interleaved, bias, n);
        return Ok(true);
    }
    let _ = (y, acts, format, w, interleaved, bias, n);
    Ok(false)
}

/// The shape checks of [`gemm()`], one error per argument.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn check_shapes(
    y: &[f32],
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
) -> Result<()> {
    acts.check()?;
    let overflow = || KernelError::Invalid(format!("quantized gemm: {}·{n} overflows", acts.m));
    check_len("y", acts.m.checked_mul(n).ok_or_else(overflow)?, y.len())?;
    let row = format.row_bytes(acts.k)?;
    let overflow = || KernelError::Invalid(format!("quantized gemm: {n} rows of {row} bytes"));
    check_len("w", row.checked_mul(n).ok_or_else(overflow)?, w.len())?;
    if let Some(b) = bias {
        check_len("bias", n, b.len())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::par::SharedOut;
    use crate::quant::gemv::columns_scalar;
    use crate::quant::testing::{magnitude, weight_blocks, Rng};

    /// `W` interleaved gives the same bits as `W` in GGUF's layout: each panel is taken back
    /// to the same rows before it is packed. `n` of one group of 8, of one panel and a group
    /// (40), and past two panels (72); `m` not a multiple of the tile.
    #[test]
    fn interleaved_weights_give_the_same_bits() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 VNNI (or it is turned off)");
            return;
        }
        let mut rng = Rng(0x1A7E_41EA_5EED_0002);
        for format in QuantFormat::ALL
            .into_iter()
            .filter(|&f| crate::quant::x8::supports(f))
        {
            for (m, n, k) in [(9usize, 8usize, 256usize), (13, 40, 512), (70, 72, 256)] {
                let w = weight_blocks(format, n, k, &mut rng);
                let mut packed = vec![0u8; w.len()];
                crate::quant::x8::pack(format, &w, n, k, &mut packed).unwrap();
                let x: Vec<f32> = (0..m * k).map(|_| rng.uniform()).collect();
                let mut acts = QuantizedActs::default();
                acts.quantize(&x, m, k).unwrap();
                let (mut a, mut b) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
                assert!(gemm(&mut a, &acts, format, &w, None, n).unwrap());
                assert!(gemm_interleaved(&mut b, &acts, format, &packed, None, n).unwrap());
                assert_eq!(
                    a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{format} m={m} n={n} k={k}"
                );
            }
        }
        // Shapes the layout cannot hold are refused, touching nothing.
        let mut acts = QuantizedActs::default();
        acts.quantize(&[0.5; 256], 1, 256).unwrap();
        let mut y = vec![7.0f32; 12];
        let bytes = 12 * QuantFormat::Q4_0.row_bytes(256).unwrap();
        assert!(
            gemm_interleaved(&mut y, &acts, QuantFormat::Q4_0, &vec![0; bytes], None, 12).is_err()
        );
        let bytes = 8 * QuantFormat::Q5_0.row_bytes(256).unwrap();
        assert!(gemm_interleaved(
            &mut y[..8],
            &acts,
            QuantFormat::Q5_0,
            &vec![0; bytes],
            None,
            8
        )
        .is_err());
        assert!(y.iter().all(|&v| v == 7.0));
    }

    /// The integer GEMM against the scalar GEMV on the same integers, on awkward shapes: `m`
    /// not a multiple of the 4-row tile, `n` not a multiple of the 32-row panel (and below
    /// it), `k` an odd number of blocks. Only the order of f32 additions differs, so the
    /// results agree to a few roundings of the terms' magnitude.
    #[test]
    fn matches_the_scalar_reference() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 VNNI (or it is turned off)");
            return;
        }
        let mut rng = Rng(0x5EED_1234_ABCD_0001);
        for format in QuantFormat::ALL {
            for k in [32usize, 96, 256, 576, 768] {
                if !k.is_multiple_of(format.block_elems()) {
                    continue;
                }
                for (m, n) in [(9usize, 1usize), (13, 31), (16, 32), (10, 33), (23, 70)] {
                    let w = weight_blocks(format, n, k, &mut rng);
                    let x: Vec<f32> = (0..m * k)
                        .map(|i| rng.uniform() * if i % 89 == 0 { 25.0 } else { 1.0 })
                        .collect();
                    let bias: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
                    let mut acts = QuantizedActs::default();
                    acts.quantize(&x, m, k).unwrap();
                    let mut want = vec![f32::NAN; m * n];
                    // SAFETY: want is m·n, w holds n rows of k, all columns are ours.
                    unsafe {
                        columns_scalar(
                            SharedOut(want.as_mut_ptr()),
                            &acts,
                            format,
                            &w,
                            Some(&bias),
                            n,
                            0,
                            n,
                        )
                    };
                    let mut got = vec![f32::NAN; m * n];
                    assert!(gemm(&mut got, &acts, format, &w, Some(&bias), n).unwrap());
                    for i in 0..m {
                        for j in 0..n {
                            let (g, e) = (got[i * n + j], want[i * n + j]);
                            let mag = magnitude(&acts, format, &w, i, j) + 1.0;
                            assert!(
                                f64::from((g - e).abs()) <= 1e-6 * mag,
                                "{format} m={m} k={k} n={n} ({i},{j}): {g} vs {e} (magnitude \
                                 {mag})"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A NaN or infinity in `x` makes its row of `y` non-finite, and only its row.
    #[test]
    fn non_finite_x_stays_visible() {
        if !available() {
            return;
        }
        let mut rng = Rng(99);
        for format in QuantFormat::ALL {
            let (m, n, k) = (11, 40, 512);
            let w = weight_blocks(format, n, k, &mut rng);
            for bad in [f32::NAN, f32::INFINITY] {
                let mut x: Vec<f32> = (0..m * k).map(|_| rng.uniform()).collect();
                x[5 * k + 300] = bad;
                let mut acts = QuantizedActs::default();
                acts.quantize(&x, m, k).unwrap();
                let mut y = vec![0.0f32; m * n];
                assert!(gemm(&mut y, &acts, format, &w, None, n).unwrap());
                for (i, row) in y.chunks_exact(n).enumerate() {
                    assert_eq!(
                        row.iter().all(|v| v.is_finite()),
                        i != 5,
                        "{format} {bad}: row {i}"
                    );
                }
            }
        }
    }

    /// Shapes that disagree are typed errors, whether or not the CPU has the kernel.
    #[test]
    fn wrong_shapes_are_errors() {
        let (m, n, k) = (2, 3, 32);
        let format = QuantFormat::Q8_0;
        let w = weight_blocks(format, n, k, &mut Rng(5));
        let mut acts = QuantizedActs::default();
        acts.quantize(&vec![0.5f32; m * k], m, k).unwrap();
        let mut y = vec![0.0f32; m * n];
        for (name, got) in [
            ("y", check_shapes(&y[1..], &acts, format, &w, None, n)),
            ("w", check_shapes(&y, &acts, format, &w[1..], None, n)),
            (
                "bias",
                check_shapes(&y, &acts, format, &w, Some(&[0.0; 2]), n),
            ),
        ] {
            assert!(
                matches!(got, Err(crate::KernelError::Length { what, .. }) if what == name),
                "{name}: {got:?}"
            );
        }
        check_shapes(&y, &acts, format, &w, Some(&[0.0; 3]), n).unwrap();
        // Activations whose public fields were edited out of step with their buffers.
        let mut bad = acts.clone();
        bad.q.pop();
        assert!(gemm(&mut y, &bad, format, &w, None, n).is_err() || !available());
        assert!(check_shapes(&y, &bad, format, &w, None, n).is_err());
        bad = acts.clone();
        bad.k = 64;
        assert!(check_shapes(&y, &bad, format, &w, None, n).is_err());
    }
}
