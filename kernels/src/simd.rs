//! Run-time CPU feature detection, done once per process into one [`Isa`], and the small
//! AVX2 helpers the hand-written kernels share.
//!
//! The portable kernels dispatch through [`pulp::Arch`]. The GEMV and attention kernels need
//! F16C conversions and a vector `exp`, which pulp's portable `Simd` trait lacks, so they are
//! written with `core::arch` intrinsics inside `#[target_feature]` functions and chosen at
//! run time from [`isa()`]; every such kernel has a scalar fallback that runs on any machine.
//!
//! `QKV_ISA`, a debugging override, is the one environment variable the library reads: it
//! caps what [`isa()`] reports, to test or measure the other paths on one machine.
//! `QKV_ISA=scalar` takes the scalar fallbacks everywhere; `avx2` the AVX2 kernels (no
//! AVX-512 code, no VNNI); `avx512` everything the CPU has, with 512-bit code preferred even
//! where the CPU splits it ([`Isa::prefer_512`]). Unset (or `native`), the kernels use what
//! the CPU has. A cap never adds a feature the CPU lacks.

use std::sync::OnceLock;

/// The instruction sets the kernels may use, as [`isa()`] detected them once for the process
/// (after the `QKV_ISA` cap). Each level implies the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa {
    /// AVX2, FMA and F16C (x86-64-v3): the level of every hand-written SIMD kernel.
    pub avx2_fma_f16c: bool,
    /// AVX-512 F, BW and VL as well: the 512-bit kernels may run.
    pub avx512: bool,
    /// AVX-512 VNNI as well: the integer GEMM of quantized prefill (`vpdpwssd`) and the
    /// interleaved kernels' byte products (`vpdpbusd`, on 256-bit vectors).
    pub avx512_vnni: bool,
    /// 512-bit operations run at full width, or the override asked for 512-bit code anyway:
    /// false on AMD's family 0x19 (Zen 4), which runs each as two 256-bit halves.
    pub full_width_512: bool,
}

impl Isa {
    /// No SIMD level at all: every kernel takes its scalar path.
    pub const SCALAR: Isa = Isa {
        avx2_fma_f16c: false,
        avx512: false,
        avx512_vnni: false,
        full_width_512: false,
    };

    /// What this CPU has, without the override.
    pub fn detect() -> Isa {
        let avx2_fma_f16c = detect_avx2_fma_f16c();
        let avx512 = avx2_fma_f16c && detect_avx512();
        Isa {
            avx2_fma_f16c,
            avx512,
            avx512_vnni: avx512 && detect_vnni(),
            full_width_512: avx512 && !splits_512_bit_ops(),
        }
    }

    /// This ISA under `cap`: levels above it turned off; [`IsaCap::Avx512`] keeps every level
    /// and prefers 512-bit code even where the CPU splits it.
    ///
    /// ```
    /// use qkv_kernels::simd::{Isa, IsaCap};
    /// let all = Isa { avx2_fma_f16c: true, avx512: true, avx512_vnni: true, full_width_512: false };
    /// assert_eq!(all.capped(IsaCap::Scalar), Isa::SCALAR);
    /// let avx2 = all.capped(IsaCap::Avx2);
    /// assert!(avx2.avx2_fma_f16c && !avx2.avx512 && !avx2.avx512_vnni && !avx2.prefer_512());
    /// assert!(!all.prefer_512() && all.capped(IsaCap::Avx512).prefer_512());
    /// assert_eq!(Isa::SCALAR.capped(IsaCap::Avx512), Isa::SCALAR);
    /// ```
    pub fn capped(self, cap: IsaCap) -> Isa {
        match cap {
            IsaCap::Scalar => Isa::SCALAR,
            IsaCap::Avx2 => Isa {
                avx2_fma_f16c: self.avx2_fma_f16c,
                ..Isa::SCALAR
            },
            IsaCap::Avx512 => Isa {
                full_width_512: self.avx512,
                ..self
            },
        }
    }

    /// The one rule for 512-bit code: a kernel written both for 256-bit and for 512-bit
    /// vectors takes the 512-bit one when the CPU has AVX-512 F/BW/VL and runs its
    /// operations at full width. Where they are split in halves the 256-bit kernels do the
    /// same work in as many operations without the wider registers' costs (the quantized
    /// GEMV is slower at 512 bits on Zen 4). Kernels that exist only in one width
    /// check their features alone.
    pub const fn prefer_512(self) -> bool {
        self.avx512 && self.full_width_512
    }
}

/// A cap on the instruction sets (`QKV_ISA`'s values): `scalar`, `avx2` or `avx512`.
///
/// ```
/// use qkv_kernels::simd::IsaCap;
/// assert_eq!("AVX2".parse::<IsaCap>().unwrap(), IsaCap::Avx2);
/// assert!("sse9".parse::<IsaCap>().unwrap_err().to_string().contains("sse9"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsaCap {
    /// No SIMD kernels.
    Scalar,
    /// AVX2, FMA and F16C at most.
    Avx2,
    /// Everything the CPU has, 512-bit code preferred.
    Avx512,
}

impl std::str::FromStr for IsaCap {
    type Err = crate::error::KernelError;
    /// `scalar`, `avx2` or `avx512`; anything else is an error naming it.
    fn from_str(s: &str) -> crate::error::Result<IsaCap> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Ok(IsaCap::Scalar),
            "avx2" => Ok(IsaCap::Avx2),
            "avx512" => Ok(IsaCap::Avx512),
            other => Err(crate::error::KernelError::Invalid(format!(
                "QKV_ISA={other}: use scalar, avx2, avx512 or native"
            ))),
        }
    }
}

/// The instruction sets the kernels use in this process: [`Isa::detect`] under the
/// `QKV_ISA` cap, read once at the first call. An unknown value is reported once on stderr
/// and ignored (the CPU's own ISA is used), so that a typo cannot stop a program.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let detected = Isa::detect();
        match std::env::var("QKV_ISA") {
            Err(_) => detected,
            Ok(v) if v.is_empty() || v.eq_ignore_ascii_case("native") => detected,
            Ok(v) => match v.parse::<IsaCap>() {
                Ok(cap) => detected.capped(cap),
                Err(e) => {
                    eprintln!("qkv-kernels: {e}; using the CPU's own instruction sets");
                    detected
                }
            },
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn detect_vnni() -> bool {
    is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_vnni() -> bool {
    false
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
fn detect_avx2_fma_f16c() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_avx2_fma_f16c() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! Building blocks for `#[target_feature(enable = "avx2,fma,f16c")]` kernels. Each is
    //! `#[inline(always)]` so it inherits the caller's features.
    use core::arch::x86_64::*;
    use half::{bf16, f16};

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

    impl Lane for bf16 {
        /// Zero-extended to 32 bits and shifted into the top half: the f32 whose top half
        /// the bf16 is, exactly.
        #[inline(always)]
        unsafe fn load8(p: *const bf16) -> __m256 {
            // SAFETY: the caller guarantees 8 readable bf16 (16 bytes) at `p` and AVX2.
            unsafe {
                let h = _mm_loadu_si128(p as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
        }
        #[inline(always)]
        fn to_f32(self) -> f32 {
            f32::from_bits(u32::from(self.to_bits()) << 16)
        }
    }

    /// How far ahead of the f16/f32 GEMV's weight stream [`prefetch_far`] asks for its
    /// bytes: 16 KiB.
    ///
    /// Left to the hardware prefetcher, the f16 kernel waited on memory for part of every
    /// row: its time per byte from memory was the sum of its time in L2 and the read
    /// bandwidth's, not the larger of the two. 16 KiB ahead into L2 (`prefetcht1`) hides
    /// that; nearer gained less, farther no more, and into L1 (`prefetcht0`, which holds one
    /// of the core's few L1 miss buffers for a whole trip to memory) nothing. The quantized
    /// kernels keep their near `prefetcht0`: far prefetches displaced the lines they leave
    /// to the hardware prefetcher and slowed Q4_K and Q6_K.
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
        if !super::isa().avx2_fma_f16c {
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
        if !super::isa().avx2_fma_f16c {
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
        if !super::isa().avx2_fma_f16c {
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
