//! f16 ↔ f32 conversion of whole slices (F16C when the CPU has it).

use crate::error::{check_len, Result};
use half::f16;

/// Widens `src` into `dst` (same length).
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) -> Result<()> {
    check_len("dst", src.len(), dst.len())?;
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma_f16c() {
        // SAFETY: F16C/AVX2 checked above; lengths equal (checked).
        unsafe { avx2::widen(src, dst) };
        return Ok(());
    }
    f16_to_f32_scalar(src, dst);
    Ok(())
}

/// Rounds `src` to the nearest f16 (ties to even) into `dst` (same length).
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) -> Result<()> {
    check_len("dst", src.len(), dst.len())?;
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma_f16c() {
        // SAFETY: F16C/AVX2 checked above; lengths equal (checked).
        unsafe { avx2::narrow(src, dst) };
        return Ok(());
    }
    f32_to_f16_scalar(src, dst);
    Ok(())
}

/// Scalar reference for [`f16_to_f32`]. Panics if the lengths differ.
pub fn f16_to_f32_scalar(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// Scalar reference for [`f32_to_f16`]. Panics if the lengths differ.
pub fn f32_to_f16_scalar(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len());
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(*s);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use core::arch::x86_64::*;
    use half::f16;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        let n8 = src.len() / 8 * 8;
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 ≤ len for both slices.
            let h = _mm_loadu_si128(s.add(i) as *const __m128i);
            _mm256_storeu_ps(d.add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for j in n8..src.len() {
            dst[j] = src[j].to_f32();
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        let n8 = src.len() / 8 * 8;
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 ≤ len for both slices.
            let v = _mm256_loadu_ps(s.add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(d.add(i) as *mut __m128i, h);
            i += 8;
        }
        for j in n8..src.len() {
            dst[j] = f16::from_f32(src[j]);
        }
    }
}
