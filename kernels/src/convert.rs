//! f16 ↔ f32 and bf16 → f32 conversion of whole slices (F16C, or AVX2 shifts for bf16,
//! when the CPU has them).

use crate::error::{check_len, Result};
use half::{bf16, f16};

/// Widens `src` into `dst` (same length).
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) -> Result<()> {
    check_len("dst", src.len(), dst.len())?;
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2 and F16C were detected at run time just above.
        unsafe { avx2::widen(src, dst) };
        return Ok(());
    }
    f16_to_f32_scalar(src, dst)
}

/// Widens `src` into `dst` (same length): exact, each bf16 being the top half of its f32,
/// NaN payloads included.
pub fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) -> Result<()> {
    check_len("dst", src.len(), dst.len())?;
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2 was detected at run time just above.
        unsafe { avx2::widen_bf16(src, dst) };
        return Ok(());
    }
    bf16_to_f32_scalar(src, dst)
}

/// Rounds `src` to the nearest f16 (ties to even) into `dst` (same length).
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) -> Result<()> {
    check_len("dst", src.len(), dst.len())?;
    // Miri does not interpret F16C's f32 → f16 instruction (`vcvtps2ph`), so under Miri the
    // narrowing takes the scalar loop, which writes the same bits.
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c && !cfg!(miri) {
        // SAFETY: AVX2 and F16C were detected at run time just above.
        unsafe { avx2::narrow(src, dst) };
        return Ok(());
    }
    f32_to_f16_scalar(src, dst)
}

scalar_reference! {
    /// Scalar reference for [`f16_to_f32`]. Errors as it does if the lengths differ.
    pub fn f16_to_f32_scalar(src: &[f16], dst: &mut [f32]) -> Result<()> {
        check_len("dst", src.len(), dst.len())?;
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
        Ok(())
    }
}

scalar_reference! {
    /// Scalar reference for [`bf16_to_f32`]. Errors as it does if the lengths differ.
    pub fn bf16_to_f32_scalar(src: &[bf16], dst: &mut [f32]) -> Result<()> {
        check_len("dst", src.len(), dst.len())?;
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits(u32::from(s.to_bits()) << 16);
        }
        Ok(())
    }
}

scalar_reference! {
    /// Scalar reference for [`f32_to_f16`]. Errors as it does if the lengths differ.
    pub fn f32_to_f16_scalar(src: &[f32], dst: &mut [f16]) -> Result<()> {
        check_len("dst", src.len(), dst.len())?;
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f16::from_f32(*s);
        }
        Ok(())
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The F16C loops. They are safe functions with `#[target_feature]`: calling one is
    //! `unsafe` only where the caller has not itself enabled AVX2 and F16C. Each walks whole
    //! chunks of 8 of both slices (zipped, so a shorter `dst` just stops the loop early), and
    //! the tail converts element by element.
    use core::arch::x86_64::*;
    use half::{bf16, f16};

    /// `dst = src` widened to f32, over the common length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn widen(src: &[f16], dst: &mut [f32]) {
        let mut s8 = src.chunks_exact(8);
        let mut d8 = dst.chunks_exact_mut(8);
        for (s, d) in (&mut s8).zip(&mut d8) {
            // SAFETY: `s` is 8 f16 = 16 readable bytes and `d` 8 writable f32 (chunks of
            // exactly 8); both intrinsics are unaligned accesses.
            unsafe {
                let h = _mm_loadu_si128(s.as_ptr() as *const __m128i);
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        for (d, s) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
            *d = s.to_f32();
        }
    }

    /// `dst = src` widened from bf16 to f32, over the common length: each value zero-extended
    /// to 32 bits and shifted into the top half.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
        let mut s8 = src.chunks_exact(8);
        let mut d8 = dst.chunks_exact_mut(8);
        for (s, d) in (&mut s8).zip(&mut d8) {
            // SAFETY: `s` is 8 bf16 = 16 readable bytes and `d` 8 writable f32 (chunks of
            // exactly 8); both intrinsics are unaligned accesses.
            unsafe {
                let h = _mm_loadu_si128(s.as_ptr() as *const __m128i);
                let v = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_castsi256_ps(v));
            }
        }
        for (d, s) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
            *d = f32::from_bits(u32::from(s.to_bits()) << 16);
        }
    }

    /// `dst = src` rounded to f16 (nearest, ties to even), over the common length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn narrow(src: &[f32], dst: &mut [f16]) {
        let mut s8 = src.chunks_exact(8);
        let mut d8 = dst.chunks_exact_mut(8);
        for (s, d) in (&mut s8).zip(&mut d8) {
            // SAFETY: `s` is 8 readable f32 and `d` 8 f16 = 16 writable bytes (chunks of
            // exactly 8); both intrinsics are unaligned accesses.
            unsafe {
                let v = _mm256_loadu_ps(s.as_ptr());
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(d.as_mut_ptr() as *mut __m128i, h);
            }
        }
        for (d, s) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
            *d = f16::from_f32(*s);
        }
    }
}
