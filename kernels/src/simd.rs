//! Run-time CPU feature detection and the small AVX2 helpers the hand-written kernels share.
//!
//! The portable kernels dispatch through [`pulp::Arch`]. The GEMV and attention kernels need
//! F16C conversions and a vector `exp`, which pulp's portable `Simd` trait lacks, so they are
//! written with `core::arch` intrinsics inside `#[target_feature]` functions and chosen here
//! at run time; every such kernel has a scalar fallback that runs on any machine.

use std::sync::OnceLock;

/// True when the CPU has AVX2, FMA and F16C (x86-64-v3), the level the fast kernels need.
/// Set `QKV_FORCE_SCALAR=1` to take the scalar paths everywhere (for testing and comparison).
pub fn has_avx2_fma_f16c() -> bool {
    static CACHE: OnceLock<bool> = OnceLock::new();
    *CACHE.get_or_init(|| {
        if std::env::var_os("QKV_FORCE_SCALAR").is_some_and(|v| v != "0") {
            return false;
        }
        detect()
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! Building blocks for `#[target_feature(enable = "avx2,fma,f16c")]` kernels. Each is
    //! `#[inline(always)]` so it inherits the caller's features.
    use core::arch::x86_64::*;
    use half::f16;

    /// Elements that load into one 256-bit f32 register.
    pub trait Lane: Copy + Send + Sync + 'static {
        /// Loads 8 consecutive elements as f32.
        ///
        /// # Safety
        /// `p..p+8` must be readable and the caller must have AVX2, FMA and F16C.
        unsafe fn load8(p: *const Self) -> __m256;
        /// Converts one element to f32.
        fn to_f32(self) -> f32;
    }

    impl Lane for f32 {
        #[inline(always)]
        unsafe fn load8(p: *const f32) -> __m256 {
            // SAFETY: the caller guarantees 8 readable f32 at `p`.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        fn to_f32(self) -> f32 {
            self
        }
    }

    impl Lane for f16 {
        #[inline(always)]
        unsafe fn load8(p: *const f16) -> __m256 {
            // SAFETY: the caller guarantees 8 readable f16 (16 bytes) at `p` and F16C.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        #[inline(always)]
        fn to_f32(self) -> f32 {
            f16::to_f32(self)
        }
    }

    /// Horizontal sum of 8 lanes.
    #[inline(always)]
    pub unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Horizontal max of 8 lanes.
    #[inline(always)]
    pub unsafe fn hmax(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_max_ps(lo, hi);
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_max_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// `exp(x)` for 8 lanes, relative error below 2e-7 on [-87, 88]; inputs below -87 give 0
    /// (including -inf), so masked scores vanish instead of producing NaN.
    #[inline(always)]
    pub unsafe fn exp(x: __m256) -> __m256 {
        // exp(x) = 2^n · exp(r), n = round(x / ln 2), r = x - n·ln 2 in [-ln2/2, ln2/2].
        let lo = _mm256_set1_ps(-87.0);
        let hi = _mm256_set1_ps(88.0);
        let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
        let x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        // Cody–Waite split of ln 2 keeps r exact to f32 precision.
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
        // Degree-6 Taylor polynomial of exp on the reduced range, Horner form.
        let mut p = _mm256_set1_ps(1.0 / 720.0);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 120.0));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 24.0));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 6.0));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_andnot_ps(underflow, _mm256_mul_ps(p, pow2))
    }

    /// `exp(x)` for 8 lanes of `x ≤ 0` (softmax numerators: a score minus the running max),
    /// cheaper than [`exp`]: no overflow side, base-2 range reduction without the Cody–Waite
    /// split. Relative error ≤ 2.4e-7 + 6e-8·|x|; lanes below −87 (and −∞) give exactly 0.
    #[inline(always)]
    pub unsafe fn exp_nonpositive(x: __m256) -> __m256 {
        let lo = _mm256_set1_ps(-87.0);
        let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
        let t = _mm256_mul_ps(
            _mm256_max_ps(x, lo),
            _mm256_set1_ps(std::f32::consts::LOG2_E),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let f = _mm256_sub_ps(t, n);
        // 2^f on [-1/2, 1/2]: degree-5 polynomial fitted for relative error (2.3e-7).
        let mut p = _mm256_set1_ps(1.327_646_4e-3);
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.675_541e-3));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550_713_5e-2));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402_212e-1));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931_469_4e-1));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.000_000_1));
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_andnot_ps(underflow, _mm256_mul_ps(p, pow2))
    }
}
