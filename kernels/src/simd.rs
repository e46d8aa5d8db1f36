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

/// True when the CPU also has AVX-512 F, BW and VL (besides the AVX2 level of
/// [`has_avx2_fma_f16c`]), the level of the 512-bit kernels. False under
/// `QKV_FORCE_SCALAR=1`, and under `QKV_NO_AVX512=1`, which turns off only the 512-bit paths
/// (so the AVX2 kernels can be tested and measured on an AVX-512 machine).
pub fn has_avx512() -> bool {
    static CACHE: OnceLock<bool> = OnceLock::new();
    *CACHE.get_or_init(|| {
        if std::env::var_os("QKV_NO_AVX512").is_some_and(|v| v != "0") {
            return false;
        }
        has_avx2_fma_f16c() && detect_avx512()
    })
}

/// True when [`has_avx512`] holds and the CPU also has AVX-512 VNNI: the quantized prefill
/// product runs on its `vpdpwssd`, and the interleaved kernels at 8 bits on its `vpdpbusd`
/// (with 256-bit vectors, so also on CPUs that split 512-bit operations). Off under the
/// same variables as [`has_avx512`].
pub fn has_avx512_vnni() -> bool {
    static CACHE: OnceLock<bool> = OnceLock::new();
    *CACHE.get_or_init(|| has_avx512() && detect_vnni())
}

#[cfg(target_arch = "x86_64")]
fn detect_vnni() -> bool {
    is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_vnni() -> bool {
    false
}

/// True when [`has_avx512`] holds and 512-bit vectors are worth taking over 256-bit ones for
/// the integer-heavy kernels (the quantized GEMV): false on AMD's Zen 4 (family 0x19), which
/// runs each 512-bit operation as two 256-bit halves. There the AVX-512 quantized GEMV
/// measured slower than the AVX2 one: 166–170 against 176–189 tokens/s decoding the Q4_1
/// default model, alternated three times. `QKV_AVX512=1` takes the 512-bit kernels anyway
/// (to measure them on such a CPU).
pub fn prefer_avx512() -> bool {
    static CACHE: OnceLock<bool> = OnceLock::new();
    *CACHE.get_or_init(|| {
        if !has_avx512() {
            return false;
        }
        std::env::var_os("QKV_AVX512").is_some_and(|v| v != "0") || !splits_512_bit_ops()
    })
}

/// AMD family 0x19 (Zen 3 and Zen 4; only Zen 4 has AVX-512) splits 512-bit operations.
/// (Not under Miri, which cannot run `cpuid`: there the answer is false, so a Miri run
/// with AVX-512 enabled interprets the 512-bit kernels.)
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn splits_512_bit_ops() -> bool {
    use core::arch::x86_64::__cpuid;
    // CPUID leaves 0 (vendor) and 1 (signature) exist on every x86-64 CPU.
    let (vendor, sig) = (__cpuid(0), __cpuid(1).eax);
    let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6E65, 0x444D_4163);
    let base = (sig >> 8) & 0xF;
    let family = if base == 0xF {
        base + ((sig >> 20) & 0xFF)
    } else {
        base
    };
    amd && family == 0x19
}

#[cfg(any(not(target_arch = "x86_64"), miri))]
fn splits_512_bit_ops() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn detect_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_avx512() -> bool {
    false
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

    /// How far ahead of a one-row f16/f32 GEMV's weight stream [`prefetch_far`] asks for its
    /// bytes: 16 KiB.
    ///
    /// On the Zen 4 hosts the f16 row kernel, left to the hardware prefetcher, waits on
    /// memory for part of every row: its time per byte from memory was the sum of its time
    /// in L2 and the read bandwidth's, not the larger of the two. Asked for 16 KiB ahead into
    /// L2 (`prefetcht1`), 1B-shaped f16 matrices from memory went 19 → 27 GB/s on one
    /// thread and 19.5–29 → 27–31 on two (`gemv_stream 1b f16`, alternated). Nearer (4–8
    /// KiB) gained less and farther (32 KiB) no more; into L1 (`prefetcht0`, which holds one of the
    /// core's few L1 miss buffers for a whole trip to memory) it gained nothing. The
    /// quantized kernels keep their near `prefetcht0`: this one gained nothing on Q4_0, Q8_0
    /// or the experts' Q8_0 matrices in whole decode steps, and halved the Q4_K and Q6_K
    /// kernels' rates (they leave lines of each column, Q4_K its 128-byte header, to the
    /// hardware prefetcher, which the far prefetches displaced; with the header covered,
    /// Q4_K ran as it does today).
    pub const FAR_AHEAD: usize = 16 * 1024;

    /// Asks for the cache line holding `p` into L2 (`prefetcht1`). Never faults, whatever
    /// `p` is, so a stream may prefetch past its end.
    #[inline(always)]
    pub fn prefetch_far(p: *const u8) {
        // SAFETY: a prefetch reads nothing architecturally and never faults; SSE, which it
        // needs, is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p as *const i8) }
    }

    /// The 8×8 transpose of `r`: lane `q` of row `i` becomes lane `i` of row `q`.
    ///
    /// # Safety
    /// The caller must have AVX (it is inlined into `#[target_feature]` functions).
    #[inline(always)]
    pub unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        // SAFETY: register-only intrinsics; the caller has the features.
        unsafe {
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ]
        }
    }

    /// Horizontal sum of 8 lanes.
    ///
    /// # Safety
    /// The caller must have AVX2 (it is inlined into `#[target_feature]` functions).
    #[inline(always)]
    pub unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: the caller has the CPU features (this function's contract); these intrinsics only
        // compute on registers.
        unsafe {
            let lo = _mm256_castps256_ps128(v);
            let hi = _mm256_extractf128_ps::<1>(v);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// Horizontal max of 8 lanes.
    ///
    /// # Safety
    /// The caller must have AVX2 (it is inlined into `#[target_feature]` functions).
    #[inline(always)]
    pub unsafe fn hmax(v: __m256) -> f32 {
        // SAFETY: the caller has the CPU features (this function's contract); these intrinsics only
        // compute on registers.
        unsafe {
            let lo = _mm256_castps256_ps128(v);
            let hi = _mm256_extractf128_ps::<1>(v);
            let s = _mm_max_ps(lo, hi);
            let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_max_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// `exp(x)` for 8 lanes, relative error below 2.5e-7 on [-87, 88] (a sweep in steps of
    /// 3e-5 found at most 2.3e-7, near x = −81); inputs below -87 give 0 (including -inf), so
    /// masked scores vanish instead of producing NaN.
    ///
    /// # Safety
    /// The caller must have AVX2 and FMA (it is inlined into `#[target_feature]` functions).
    #[inline(always)]
    pub unsafe fn exp(x: __m256) -> __m256 {
        // SAFETY: the caller has the CPU features (this function's contract); these intrinsics only
        // compute on registers.
        unsafe {
            // exp(x) = 2^n · exp(r), n = round(x / ln 2), r = x - n·ln 2 in [-ln2/2, ln2/2].
            let lo = _mm256_set1_ps(-87.0);
            let hi = _mm256_set1_ps(88.0);
            let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
            // max_ps/min_ps return their second operand when one is NaN: x goes second, so a
            // NaN lane stays NaN instead of being clamped into a number.
            let x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
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
    }

    /// `exp(x)` for 8 lanes of `x ≤ 0` (softmax numerators: a score minus the running max),
    /// cheaper than [`exp`]: no overflow side, base-2 range reduction without the Cody–Waite
    /// split. Relative error ≤ 3e-7 + 8e-8·|x|: the polynomial's 2.3e-7 and the rounding of
    /// the result, plus the rounding of `x·log₂e` and of the constant, which grow with |x|
    /// (a sweep in steps of 2e-5 found 0.89 of that bound at most, near x = −44.7). Lanes
    /// below −87 (and −∞) give exactly 0.
    ///
    /// # Safety
    /// The caller must have AVX2 and FMA (it is inlined into `#[target_feature]` functions).
    #[inline(always)]
    pub unsafe fn exp_nonpositive(x: __m256) -> __m256 {
        // SAFETY: the caller has the CPU features (this function's contract); these intrinsics only
        // compute on registers.
        unsafe {
            let lo = _mm256_set1_ps(-87.0);
            let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
            // x second: a NaN lane stays NaN (max_ps returns its second operand then).
            let t = _mm256_mul_ps(
                _mm256_max_ps(lo, x),
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
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::avx2;
    use core::arch::x86_64::*;

    /// Applies one of the vector `exp`s to 8 values.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lanes(f: unsafe fn(__m256) -> __m256, x: [f32; 8]) -> [f32; 8] {
        let mut out = [0.0f32; 8];
        // SAFETY: `x` and `out` hold the 8 f32 each unaligned access touches; `f` needs
        // AVX2 and FMA, which this function enables.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), f(_mm256_loadu_ps(x.as_ptr()))) };
        out
    }

    /// Every f32 from `lo` to `hi` in steps of about `step`, plus both ends.
    fn sweep(lo: f32, hi: f32, step: f32) -> Vec<f32> {
        let n = ((hi - lo) / step) as usize;
        let mut xs: Vec<f32> = (0..=n).map(|i| lo + i as f32 * step).collect();
        xs.retain(|&x| x <= hi);
        xs.extend([lo, hi, 0.0, -0.0]);
        while !xs.len().is_multiple_of(8) {
            xs.push(hi);
        }
        xs
    }

    /// The largest relative error against f64 of `f` over `xs`, with each error divided by
    /// the bound `bound(x)` (so the result must stay ≤ 1).
    fn worst(f: unsafe fn(__m256) -> __m256, xs: &[f32], bound: impl Fn(f64) -> f64) -> f64 {
        let mut worst = 0.0f64;
        for c in xs.chunks_exact(8) {
            let x: [f32; 8] = c.try_into().unwrap();
            // SAFETY: callers check the CPU features first.
            let got = unsafe { lanes(f, x) };
            for (&xi, &g) in x.iter().zip(&got) {
                let exact = f64::from(xi).exp();
                let rel = (f64::from(g) - exact).abs() / exact;
                worst = worst.max(rel / bound(f64::from(xi)));
            }
        }
        worst
    }

    #[test]
    fn exp_meets_its_stated_error_on_its_whole_range() {
        if !super::has_avx2_fma_f16c() {
            return;
        }
        // Miri interprets every lane: a sweep 10⁴ times coarser there (still ~600 points).
        let coarse = if cfg!(miri) { 1e4 } else { 1.0 };
        let xs = sweep(-87.0, 88.0, 3.1e-5 * coarse);
        let w = worst(avx2::exp, &xs, |_| 2.5e-7);
        assert!(w <= 1.0, "exp: {w} × the bound");
        let xs = sweep(-87.0, 0.0, 1.7e-5 * coarse);
        let w = worst(avx2::exp_nonpositive, &xs, |x| 3e-7 + 8e-8 * x.abs());
        assert!(w <= 1.0, "exp_nonpositive: {w} × the bound");
    }

    #[test]
    fn exp_below_the_range_is_exactly_zero() {
        if !super::has_avx2_fma_f16c() {
            return;
        }
        let x = [
            -87.01,
            -88.0,
            -100.0,
            -1e30,
            f32::MIN,
            f32::NEG_INFINITY,
            -90.5,
            -1e4,
        ];
        for f in [
            avx2::exp as unsafe fn(__m256) -> __m256,
            avx2::exp_nonpositive,
        ] {
            // SAFETY: the features were checked above.
            let got = unsafe { lanes(f, x) };
            assert_eq!(got, [0.0; 8]);
        }
    }

    #[test]
    fn exp_of_nan_is_nan() {
        if !super::has_avx2_fma_f16c() {
            return;
        }
        let x = [
            f32::NAN,
            -1.0,
            f32::NAN,
            0.0,
            -100.0,
            f32::NAN,
            -0.5,
            f32::NAN,
        ];
        for f in [
            avx2::exp as unsafe fn(__m256) -> __m256,
            avx2::exp_nonpositive,
        ] {
            // SAFETY: the features were checked above.
            let got = unsafe { lanes(f, x) };
            for (xi, g) in x.iter().zip(got) {
                assert_eq!(xi.is_nan(), g.is_nan(), "exp({xi}) gave {g}");
            }
        }
    }
}
