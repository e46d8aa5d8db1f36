//! GGUF's block-quantized weight formats, read in place.
//!
//! A quantized matrix `[n, k]` is `n` rows of `k / block` blocks each; a block holds its own
//! scale(s) and packed integers. qkv never widens such a matrix as a whole: the GEMV reads
//! each block once per step, and prefill widens cache-sized panels of rows
//! ([`crate::matmul`]).
//!
//! | format | block | bytes | layout (little endian)                                        |
//! |--------|-------|-------|---------------------------------------------------------------|
//! | Q8_0   | 32    | 34    | f16 `d`, 32 × i8 `q`; value `q·d`                             |
//! | Q4_0   | 32    | 18    | f16 `d`, 16 bytes of nibbles; `(q − 8)·d`                     |
//! | Q4_1   | 32    | 20    | f16 `d`, f16 `m`, 16 bytes of nibbles; `q·d + m`              |
//! | Q5_0   | 32    | 22    | f16 `d`, u32 high bits, 16 bytes of nibbles; `(q − 16)·d`     |
//! | Q5_1   | 32    | 24    | f16 `d`, f16 `m`, u32 high bits, nibbles; `q·d + m`           |
//! | Q4_K   | 256   | 144   | f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; `(d·sc)·q − dmin·mn` per 32 |
//! | Q5_K   | 256   | 176   | as Q4_K, plus 32 bytes of fifth bits before the nibbles        |
//! | Q6_K   | 256   | 210   | 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 i8 scales, f16 `d`; `(d·sc)·(q − 32)` per 16 |
//! | Q2_K   | 256   | 84    | 16 bytes of 4-bit scales (low nibble) and minimums (high), 64 of 2-bit pairs, f16 `d`, f16 `dmin`; `(d·sc)·q − dmin·mn` per 16 |
//! | Q3_K   | 256   | 110   | 32 bytes of high bits, 64 of 2-bit pairs, 12 bytes of 6-bit scales, f16 `d`; `(d·(sc − 32))·q` per 16, `q` in −4..3 |
//! | IQ4_NL | 32    | 18    | f16 `d`, 16 bytes of nibbles; `d·T[q]` with `T` the 16-entry table [`blocks::IQ4_TABLE`] |
//! | IQ4_XS | 256   | 136   | f16 `d`, 2 + 4 bytes of 6-bit scales, 128 bytes of nibbles; `(d·(sc − 32))·T[q]` per 32 |
//! | IQ2_XXS, IQ2_XS, IQ2_S | 256 | 66, 74, 82 | f16 `d`, signed points of 8 of a lattice ([`blocks::grids`]), 4-bit scales per 32 or 16 |
//! | IQ3_XXS, IQ3_S | 256 | 98, 110 | f16 `d`, signed points of 4 of a lattice, 4-bit scales per 32 |
//! | IQ1_S, IQ1_M | 256 | 50, 56 | ternary points of 8 shifted by ±1/8, 3-bit scales per 32 or 16 |
//! | TQ1_0, TQ2_0 | 256 | 54, 66 | ternary digits (base 3, five to a byte; or 2 bits), f16 `d` |
//!
//! The last four rows' layouts are spelled out in [`blocks::iq`].
//!
//! In the 32-element formats byte `j` holds element `j` in its low nibble and element `j + 16`
//! in its high nibble, and bit `j` of the high-bit word is element `j`'s fifth bit. The
//! K-formats' layouts are spelled out in [`blocks`].
//!
//! `QuantFormat::dequantize_scalar` is the scalar reference: it computes exactly what
//! gguf-py's numpy dequantizers (and ggml's `dequantize_row_*`) compute, bit for bit — scales
//! widened from f16, each value one f32 multiply (and one add or subtract), never a fused
//! multiply-add. [`QuantFormat::dequantize`] writes the same bits with AVX2 where the CPU has
//! it (`dequant_avx2`), else with the scalar decoders.

pub mod act;
pub mod blocks;
#[cfg(target_arch = "x86_64")]
mod dequant_avx2;
#[cfg(target_arch = "x86_64")]
mod frame;
pub mod gemm;
pub mod gemv;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod x8;

use crate::error::{KernelError, Result};

/// A GGUF block-quantized storage format that qkv runs in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantFormat {
    /// 8-bit, one f16 scale per 32.
    Q8_0,
    /// 4-bit symmetric, one f16 scale per 32.
    Q4_0,
    /// 4-bit with an f16 scale and minimum per 32.
    Q4_1,
    /// 5-bit symmetric, one f16 scale per 32.
    Q5_0,
    /// 5-bit with an f16 scale and minimum per 32.
    Q5_1,
    /// 4-bit k-quant: super-blocks of 256, 6-bit scales and mins per 32.
    Q4_K,
    /// 5-bit k-quant: super-blocks of 256, 6-bit scales and mins per 32.
    Q5_K,
    /// 6-bit k-quant: super-blocks of 256, 8-bit scales per 16.
    Q6_K,
    /// 2-bit k-quant: super-blocks of 256, 4-bit scales and minimums per 16.
    Q2_K,
    /// 3-bit k-quant: super-blocks of 256, 6-bit signed scales per 16.
    Q3_K,
    /// 4-bit indices into a fixed non-linear table, one f16 scale per 32.
    IQ4_NL,
    /// IQ4_NL's table in super-blocks of 256, with 6-bit signed scales per 32.
    IQ4_XS,
    /// 2.06 bits: 8-value points of a 256-point lattice with 8-bit sign patterns, a 4-bit
    /// scale per 32.
    IQ2_XXS,
    /// 2.31 bits: a 512-point lattice, 4-bit scales per 16.
    IQ2_XS,
    /// 2.56 bits: a 1024-point lattice, explicit signs, 4-bit scales per 16.
    IQ2_S,
    /// 3.06 bits: 4-value points of a 256-point lattice, a 4-bit scale per 32.
    IQ3_XXS,
    /// 3.44 bits: a 512-point lattice, explicit signs, 4-bit scales per 32.
    IQ3_S,
    /// 1.56 bits: 8-value ternary points of a 2048-point lattice shifted by ±1/8, a 3-bit
    /// scale per 32.
    IQ1_S,
    /// 1.75 bits: IQ1_S's lattice with a shift per 8 and 3-bit scales per 16.
    IQ1_M,
    /// Ternary, 1.69 bits: base-3 digits five to a byte, one f16 scale per 256.
    TQ1_0,
    /// Ternary, 2.06 bits: 2-bit digits, one f16 scale per 256.
    TQ2_0,
}

impl QuantFormat {
    /// Every format, in GGUF code order.
    pub const ALL: [QuantFormat; 21] = [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q8_0,
        QuantFormat::Q2_K,
        QuantFormat::Q3_K,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
        QuantFormat::IQ2_XXS,
        QuantFormat::IQ2_XS,
        QuantFormat::IQ3_XXS,
        QuantFormat::IQ1_S,
        QuantFormat::IQ4_NL,
        QuantFormat::IQ3_S,
        QuantFormat::IQ2_S,
        QuantFormat::IQ4_XS,
        QuantFormat::IQ1_M,
        QuantFormat::TQ1_0,
        QuantFormat::TQ2_0,
    ];

    /// Elements per block (32 for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL, else 256).
    pub const fn block_elems(self) -> usize {
        match self {
            QuantFormat::Q8_0
            | QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q5_0
            | QuantFormat::Q5_1
            | QuantFormat::IQ4_NL => 32,
            _ => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q5_0 => 22,
            QuantFormat::Q5_1 => 24,
            QuantFormat::Q4_K => 144,
            QuantFormat::Q5_K => 176,
            QuantFormat::Q6_K => 210,
            QuantFormat::Q2_K => 84,
            QuantFormat::Q3_K => 110,
            QuantFormat::IQ4_NL => 18,
            QuantFormat::IQ4_XS => 136,
            QuantFormat::IQ2_XXS => 66,
            QuantFormat::IQ2_XS => 74,
            QuantFormat::IQ2_S => 82,
            QuantFormat::IQ3_XXS => 98,
            QuantFormat::IQ3_S => 110,
            QuantFormat::IQ1_S => 50,
            QuantFormat::IQ1_M => 56,
            QuantFormat::TQ1_0 => 54,
            QuantFormat::TQ2_0 => 66,
        }
    }

    /// GGUF's name for it (`"Q4_K"`).
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "Q8_0",
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q5_0 => "Q5_0",
            QuantFormat::Q5_1 => "Q5_1",
            QuantFormat::Q4_K => "Q4_K",
            QuantFormat::Q5_K => "Q5_K",
            QuantFormat::Q6_K => "Q6_K",
            QuantFormat::Q2_K => "Q2_K",
            QuantFormat::Q3_K => "Q3_K",
            QuantFormat::IQ4_NL => "IQ4_NL",
            QuantFormat::IQ4_XS => "IQ4_XS",
            QuantFormat::IQ2_XXS => "IQ2_XXS",
            QuantFormat::IQ2_XS => "IQ2_XS",
            QuantFormat::IQ2_S => "IQ2_S",
            QuantFormat::IQ3_XXS => "IQ3_XXS",
            QuantFormat::IQ3_S => "IQ3_S",
            QuantFormat::IQ1_S => "IQ1_S",
            QuantFormat::IQ1_M => "IQ1_M",
            QuantFormat::TQ1_0 => "TQ1_0",
            QuantFormat::TQ2_0 => "TQ2_0",
        }
    }

    /// Bytes of one row of `k` elements, or an error when `k` is not a whole number of
    /// blocks (or the byte count overflows).
    pub fn row_bytes(self, k: usize) -> Result<usize> {
        if !k.is_multiple_of(self.block_elems()) {
            return Err(KernelError::Invalid(format!(
                "{self}: a row of {k} elements is not a whole number of {}-element blocks",
                self.block_elems()
            )));
        }
        (k / self.block_elems())
            .checked_mul(self.block_bytes())
            .ok_or_else(|| KernelError::Invalid(format!("{self}: {k} elements overflow")))
    }

    /// Elements held by `bytes` bytes of whole blocks, or an error when `bytes` is not a
    /// whole number of blocks.
    pub fn elems_in(self, bytes: usize) -> Result<usize> {
        if !bytes.is_multiple_of(self.block_bytes()) {
            return Err(KernelError::Invalid(format!(
                "{self}: {bytes} bytes are not a whole number of {}-byte blocks",
                self.block_bytes()
            )));
        }
        (bytes / self.block_bytes())
            .checked_mul(self.block_elems())
            .ok_or_else(|| KernelError::Invalid(format!("{self}: {bytes} bytes overflow")))
    }

    /// Dequantizes whole blocks `src` into `dst`, exactly as gguf-py does: bit for bit what
    /// `QuantFormat::dequantize_scalar` writes, with AVX2 where the CPU has it
    /// ([`crate::simd::Isa::avx2_fma_f16c`]). Errors unless `src` is exactly the blocks that
    /// hold `dst.len()` values.
    ///
    /// ```
    /// use qkv_kernels::quant::QuantFormat;
    /// // One Q8_0 block: scale 0.5 (f16 0x3800), then 32 signed bytes.
    /// let mut block = vec![0x00, 0x38];
    /// block.extend((0..32).map(|i| (i as i8 - 16) as u8));
    /// let mut out = [0.0f32; 32];
    /// QuantFormat::Q8_0.dequantize(&block, &mut out).unwrap();
    /// assert_eq!(out[0], -8.0);
    /// assert_eq!(out[31], 7.5);
    /// ```
    pub fn dequantize(self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        self.check_dequantize(src, dst)?;
        #[cfg(target_arch = "x86_64")]
        if crate::simd::isa().avx2_fma_f16c {
            // SAFETY: the lengths were checked just above and AVX2, FMA and F16C were
            // detected.
            unsafe { dequant_avx2::dequantize(self, src, dst) };
            return Ok(());
        }
        self.decode_scalar(src, dst);
        Ok(())
    }

    /// The scalar reference of [`QuantFormat::dequantize`], one block at a time with the
    /// decoders of [`blocks`]: what the SIMD paths are tested against, and what runs on
    /// every CPU (and under `QKV_ISA=scalar`). Errors as `dequantize` does.
    #[cfg(any(test, feature = "testing"))]
    pub fn dequantize_scalar(self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        self.check_dequantize(src, dst)?;
        self.decode_scalar(src, dst);
        Ok(())
    }

    /// An error unless `src` is exactly the blocks that hold `dst.len()` values.
    fn check_dequantize(self, src: &[u8], dst: &[f32]) -> Result<()> {
        let elems = self.elems_in(src.len())?;
        if elems != dst.len() {
            return Err(KernelError::Length {
                what: "dequantized values",
                expected: elems,
                actual: dst.len(),
            });
        }
        Ok(())
    }

    /// Decodes whole blocks with the scalar decoders; the lengths are already checked.
    fn decode_scalar(self, src: &[u8], dst: &mut [f32]) {
        let decode = blocks::decoder(self);
        for (out, block) in dst
            .chunks_exact_mut(self.block_elems())
            .zip(src.chunks_exact(self.block_bytes()))
        {
            decode(block, out);
        }
    }

    /// Byte offsets of the f16 scale fields in every block: the places where a NaN or an
    /// infinity would poison the block's values (for load-time checks). IQ1_M has none: its
    /// f16 is spread over the top nibbles of its scale words ([`blocks::iq::iq1_m_d_bits`]),
    /// which [`QuantFormat::first_nonfinite_scale`] reads apart.
    pub fn scale_offsets(self) -> &'static [usize] {
        match self {
            QuantFormat::Q8_0
            | QuantFormat::Q4_0
            | QuantFormat::Q5_0
            | QuantFormat::IQ4_NL
            | QuantFormat::IQ4_XS
            | QuantFormat::IQ2_XXS
            | QuantFormat::IQ2_XS
            | QuantFormat::IQ2_S
            | QuantFormat::IQ3_XXS
            | QuantFormat::IQ3_S
            | QuantFormat::IQ1_S => &[0],
            QuantFormat::IQ1_M => &[],
            QuantFormat::TQ1_0 => &[52],
            QuantFormat::TQ2_0 => &[64],
            QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4_K | QuantFormat::Q5_K => {
                &[0, 2]
            }
            QuantFormat::Q6_K => &[208],
            QuantFormat::Q3_K => &[108],
            QuantFormat::Q2_K => &[80, 82],
        }
    }

    /// True when the additive constant `c` of `w = a·q + c` changes within a group of 32
    /// (one minimum per 16: Q2_K), so that the kernels need the activations' sums per 16.
    pub(crate) const fn half_mins(self) -> bool {
        matches!(self, QuantFormat::Q2_K)
    }

    /// The first block of `src` (whole blocks of this format) whose f16 scale or minimum is
    /// NaN or infinite, with the field's byte offset in the block: such a block would
    /// dequantize to non-finite values. `None` when every scale is finite.
    pub fn first_nonfinite_scale(self, src: &[u8]) -> Option<(usize, usize)> {
        let offsets = self.scale_offsets();
        // Exponent bits all ones: infinity or NaN.
        let bad = |bits: u16| bits & 0x7C00 == 0x7C00;
        src.chunks_exact(self.block_bytes())
            .enumerate()
            .find_map(|(b, block)| {
                if self == QuantFormat::IQ1_M {
                    // Reported at the first scale word, which holds the f16's low nibble.
                    return bad(blocks::iq::iq1_m_d_bits(block)).then_some((b, 48));
                }
                offsets.iter().copied().find_map(|o| {
                    let bits = u16::from_le_bytes([block[o], block[o + 1]]);
                    bad(bits).then_some((b, o))
                })
            })
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_ggml() {
        // ggml's type_traits: blck_size / type_size.
        let expected = [
            (QuantFormat::Q4_0, 32, 18),
            (QuantFormat::Q4_1, 32, 20),
            (QuantFormat::Q5_0, 32, 22),
            (QuantFormat::Q5_1, 32, 24),
            (QuantFormat::Q8_0, 32, 34),
            (QuantFormat::Q4_K, 256, 144),
            (QuantFormat::Q5_K, 256, 176),
            (QuantFormat::Q6_K, 256, 210),
            (QuantFormat::Q2_K, 256, 84),
            (QuantFormat::Q3_K, 256, 110),
            (QuantFormat::IQ4_NL, 32, 18),
            (QuantFormat::IQ4_XS, 256, 136),
            (QuantFormat::IQ2_XXS, 256, 66),
            (QuantFormat::IQ2_XS, 256, 74),
            (QuantFormat::IQ2_S, 256, 82),
            (QuantFormat::IQ3_XXS, 256, 98),
            (QuantFormat::IQ3_S, 256, 110),
            (QuantFormat::IQ1_S, 256, 50),
            (QuantFormat::IQ1_M, 256, 56),
            (QuantFormat::TQ1_0, 256, 54),
            (QuantFormat::TQ2_0, 256, 66),
        ];
        for (f, elems, bytes) in expected {
            assert_eq!((f.block_elems(), f.block_bytes()), (elems, bytes), "{f}");
        }
    }

    /// The other low-bit formats have no interleaved layout yet: they stay in GGUF's, which
    /// every kernel reads.
    #[test]
    fn low_bit_formats_stay_in_file_layout() {
        for f in QuantFormat::ALL {
            if !matches!(
                f,
                QuantFormat::Q4_0
                    | QuantFormat::Q4_1
                    | QuantFormat::Q4_K
                    | QuantFormat::Q6_K
                    | QuantFormat::Q8_0
                    | QuantFormat::Q3_K
                    | QuantFormat::Q5_K
                    | QuantFormat::IQ4_NL
                    | QuantFormat::IQ4_XS
            ) {
                assert!(!x8::supports(f), "{f}");
            }
        }
    }

    #[test]
    fn row_bytes_refuses_partial_blocks() {
        assert_eq!(QuantFormat::Q4_1.row_bytes(576).unwrap(), 18 * 20);
        assert!(QuantFormat::Q4_K.row_bytes(576).is_err());
        assert_eq!(QuantFormat::Q6_K.row_bytes(1536).unwrap(), 6 * 210);
        assert!(QuantFormat::Q8_0.elems_in(35).is_err());
    }

    #[test]
    fn dequantize_checks_lengths() {
        let mut out = [0.0f32; 31];
        assert!(QuantFormat::Q4_1.dequantize(&[0u8; 20], &mut out).is_err());
        assert!(QuantFormat::Q4_1
            .dequantize(&[0u8; 19], &mut [0.0; 32])
            .is_err());
    }

    #[test]
    fn nonfinite_scales_are_found() {
        let mut blocks = vec![0u8; 3 * 20];
        assert_eq!(QuantFormat::Q4_1.first_nonfinite_scale(&blocks), None);
        // Block 2's minimum is +inf (0x7C00).
        blocks[2 * 20 + 2] = 0x00;
        blocks[2 * 20 + 3] = 0x7C;
        assert_eq!(
            QuantFormat::Q4_1.first_nonfinite_scale(&blocks),
            Some((2, 2))
        );
        let mut q6 = vec![0u8; 210];
        q6[209] = 0x7E; // NaN in d
        assert_eq!(QuantFormat::Q6_K.first_nonfinite_scale(&q6), Some((0, 208)));
        // IQ1_M's f16 is spread over the top nibbles of its 4 scale words: 0x7C00 has its
        // exponent in the top two.
        let mut iq1m = vec![0u8; 2 * 56];
        assert_eq!(QuantFormat::IQ1_M.first_nonfinite_scale(&iq1m), None);
        iq1m[56 + 53] = 0xC0;
        iq1m[56 + 55] = 0x70;
        assert_eq!(
            QuantFormat::IQ1_M.first_nonfinite_scale(&iq1m),
            Some((1, 48))
        );
    }
}
