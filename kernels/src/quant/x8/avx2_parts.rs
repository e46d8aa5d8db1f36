//! Small pieces the interleaved AVX2 kernels of several formats share, in a module of
//! their own so that the kernels' files import them without importing each other.

use core::arch::x86_64::*;

/// The low and high nibbles of 32 bytes.
///
/// # Safety
/// `p..p + 32` readable; AVX2.
#[inline(always)]
pub(super) unsafe fn nibbles(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm256_loadu_si256(p as *const __m256i);
        let m4 = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(v, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
        )
    }
}

/// The 8 rows' scales `d·sc` and minimums `dmin·mn` of each of the 8 groups of a Q4_K (or
/// Q5_K) column at `base`: its 8 `d`, 8 `dmin` and 96 bytes of re-packed six-bit fields.
///
/// # Safety
/// `base..base + 128` readable; AVX2, F16C.
#[inline(always)]
pub(super) unsafe fn k_scales(base: *const u8) -> ([__m256; 8], [__m256; 8]) {
    // SAFETY: the caller's contract; `tab` is this frame's.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m30 = _mm256_set1_epi8(0x30);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(base.add(16) as *const __m128i));
        // The 64 scales and 64 minimums as bytes, `8g + r`.
        let lsc = _mm256_loadu_si256(base.add(32) as *const __m256i);
        let lmn = _mm256_loadu_si256(base.add(64) as *const __m256i);
        let h = _mm256_loadu_si256(base.add(96) as *const __m256i);
        let mut tab = [0u8; 128];
        let t = tab.as_mut_ptr();
        let put = |at: usize, v: __m256i| _mm256_storeu_si256(t.add(at) as *mut __m256i, v);
        put(
            0,
            _mm256_or_si256(
                _mm256_and_si256(lsc, m4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(h), m30),
            ),
        );
        put(
            32,
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(lsc), m4),
                _mm256_and_si256(_mm256_slli_epi16::<2>(h), m30),
            ),
        );
        put(
            64,
            _mm256_or_si256(_mm256_and_si256(lmn, m4), _mm256_and_si256(h, m30)),
        );
        put(
            96,
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(lmn), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(h), m30),
            ),
        );
        let byte8 = |at: usize| {
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                tab.as_ptr().add(at) as *const __m128i
            )))
        };
        // Per group: the 8 rows' minimums.
        let mut mn = [_mm256_setzero_ps(); 8];
        for (g, mn) in mn.iter_mut().enumerate() {
            *mn = byte8(64 + 8 * g);
        }
        // Per group: the 8 rows' scales `d·sc` and minimums `dmin·mn`.
        let mut sc = [_mm256_setzero_ps(); 8];
        for (g, (sc, mn)) in sc.iter_mut().zip(mn.iter_mut()).enumerate() {
            *sc = _mm256_mul_ps(d, byte8(8 * g));
            *mn = _mm256_mul_ps(dmin, *mn);
        }
        (sc, mn)
    }
}
