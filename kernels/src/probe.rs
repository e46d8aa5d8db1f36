//! Probes of the machine's two ceilings, so that kernels can be quoted against them: the
//! memory read bandwidth (what a decode step, which reads every weight once, cannot beat) and
//! the FMA peak (what a prefill, which is matmul-bound, cannot beat) with the widest vectors
//! the CPU has ([`FmaIsa`]: AVX-512 where present, else AVX2). The benchmarks and
//! `examples/roofline.rs` use them; measure them in the same run as what they are compared
//! with, because on a shared host both move by tens of percent from minute to minute.
//!
//! ```
//! // Sum 1 MiB in 4 KiB pieces on the current pool.
//! let words = vec![1u64; 1 << 17];
//! assert_eq!(qkv_kernels::probe::read_sum(&words, 512), 1 << 17);
//! ```

use rayon::prelude::*;

/// Sums `words` (wrapping) on the current rayon pool, each task reading `piece` consecutive
/// words front to back. The loop is a plain vector add that keeps up with memory, so the time
/// it takes over a buffer much larger than the caches is the machine's read bandwidth.
/// `piece` is clamped to at least 1.
pub fn read_sum(words: &[u64], piece: usize) -> u64 {
    words
        .par_chunks(piece.max(1))
        .map(|chunk| {
            let mut acc = [0u64; 8];
            let mut lanes = chunk.chunks_exact(8);
            for v in &mut lanes {
                for (a, x) in acc.iter_mut().zip(v) {
                    *a = a.wrapping_add(*x);
                }
            }
            let tail = lanes
                .remainder()
                .iter()
                .fold(0u64, |s, x| s.wrapping_add(*x));
            acc.iter().fold(tail, |s, a| s.wrapping_add(*a))
        })
        .reduce(|| 0, u64::wrapping_add)
}

/// Independent FMA chains per thread in [`fma_spin`]: more than latency × pipes (4 × 2 on
/// the CPUs qkv targets), so the chains never wait on each other; the same count for 256-
/// and 512-bit registers (a CPU retires at most two FMAs of either width per cycle).
pub const FMA_CHAINS: usize = 12;

/// The vector instruction set an FMA peak is measured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FmaIsa {
    /// `vfmadd` on 256-bit registers (8 f32 lanes): AVX2 + FMA.
    Avx2,
    /// `vfmadd` on 512-bit registers (16 f32 lanes): AVX-512F (used where the kernels'
    /// AVX-512 level, [`crate::simd::Isa::avx512`], is on).
    Avx512,
}

impl FmaIsa {
    /// The name the roofline JSON reports (`"avx2"`, `"avx512"`).
    pub const fn name(self) -> &'static str {
        match self {
            FmaIsa::Avx2 => "avx2",
            FmaIsa::Avx512 => "avx512",
        }
    }

    /// f32 lanes per register.
    pub const fn lanes(self) -> usize {
        match self {
            FmaIsa::Avx2 => 8,
            FmaIsa::Avx512 => 16,
        }
    }

    /// Whether this CPU runs it, as the kernels decide: AVX2 per
    /// [`crate::simd::Isa::avx2_fma_f16c`], AVX-512 per [`crate::simd::Isa::avx512`] (so
    /// neither under `QKV_ISA=scalar`, and not AVX-512 under `QKV_ISA=avx2`).
    pub fn available(self) -> bool {
        match self {
            FmaIsa::Avx2 => crate::simd::isa().avx2_fma_f16c,
            FmaIsa::Avx512 => crate::simd::isa().avx512,
        }
    }

    /// The widest one this CPU runs, or `None` without AVX2 and FMA.
    pub fn widest() -> Option<FmaIsa> {
        [FmaIsa::Avx512, FmaIsa::Avx2]
            .into_iter()
            .find(|isa| isa.available())
    }
}

/// Runs `rounds` rounds of [`FMA_CHAINS`] independent f32 FMAs with the widest registers
/// the CPU has ([`FmaIsa::widest`]) on every thread of the current pool at once (no memory
/// traffic) and returns the floating-point operations done (2 per lane per FMA), or `None`
/// on a CPU without AVX2 and FMA. Time the call to get the FMA peak in FLOP/s.
pub fn fma_spin(rounds: usize) -> Option<f64> {
    fma_spin_with(FmaIsa::widest()?, rounds)
}

/// [`fma_spin`] with the registers of `isa`, or `None` when the CPU does not run it
/// ([`FmaIsa::available`]).
pub fn fma_spin_with(isa: FmaIsa, rounds: usize) -> Option<f64> {
    if !isa.available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let sinks = match isa {
            // SAFETY: AVX2 and FMA were detected (`available`); every pool thread runs on
            // this CPU.
            FmaIsa::Avx2 => rayon::broadcast(|_| unsafe { avx2::spin(rounds) }),
            // SAFETY: AVX-512F was detected (`available`); every pool thread runs on this
            // CPU.
            FmaIsa::Avx512 => rayon::broadcast(|_| unsafe { avx512::spin(rounds) }),
        };
        std::hint::black_box(sinks);
        let fmas = rayon::current_num_threads() * rounds * FMA_CHAINS * isa.lanes();
        Some(2.0 * fmas as f64)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = rounds;
        None
    }
}

/// One timed [`fma_spin_with`]: the FMA peak of all pool threads with `isa`, in GFLOP/s, or
/// `None` when the CPU does not run it. One sample; the roofline example takes a median.
pub fn fma_gflops(isa: FmaIsa, rounds: usize) -> Option<f64> {
    let start = std::time::Instant::now();
    let flops = fma_spin_with(isa, rounds)?;
    Some(flops / start.elapsed().as_secs_f64() / 1e9)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::FMA_CHAINS;
    use core::arch::x86_64::*;

    /// [`FMA_CHAINS`] chains of `rounds` dependent 8-lane FMAs; returns a sum of the lanes
    /// so the work cannot be dropped.
    ///
    /// A safe `#[target_feature]` function: calling it is `unsafe` only where AVX2 and FMA
    /// have not been checked.
    #[target_feature(enable = "avx2,fma")]
    pub fn spin(rounds: usize) -> f32 {
        let m = _mm256_set1_ps(0.999_999);
        let a = _mm256_set1_ps(1e-7);
        let mut acc = [_mm256_set1_ps(1.0); FMA_CHAINS];
        for _ in 0..rounds {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, m, a);
            }
        }
        let total = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x));
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds exactly the 8 f32 the unaligned store writes.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), total) };
        lanes.iter().sum()
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::FMA_CHAINS;
    use core::arch::x86_64::*;

    /// [`FMA_CHAINS`] chains of `rounds` dependent 16-lane FMAs (`_mm512_fmadd_ps` on
    /// independent zmm accumulators); returns a sum of the lanes so the work cannot be
    /// dropped.
    ///
    /// A safe `#[target_feature]` function: calling it is `unsafe` only where AVX-512F has
    /// not been checked.
    #[target_feature(enable = "avx512f")]
    pub fn spin(rounds: usize) -> f32 {
        let m = _mm512_set1_ps(0.999_999);
        let a = _mm512_set1_ps(1e-7);
        let mut acc = [_mm512_set1_ps(1.0); FMA_CHAINS];
        for _ in 0..rounds {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, m, a);
            }
        }
        let total = acc
            .iter()
            .fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x));
        _mm512_reduce_add_ps(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fma_peaks_are_positive_and_finite_where_the_isa_is_present() {
        for isa in [FmaIsa::Avx2, FmaIsa::Avx512] {
            let rounds = if cfg!(miri) { 10 } else { 1000 };
            let Some(flops) = fma_spin_with(isa, rounds) else {
                assert!(!isa.available(), "{isa:?}");
                continue;
            };
            let per_fma = (rayon::current_num_threads() * rounds * FMA_CHAINS) as f64;
            assert_eq!(flops, per_fma * 2.0 * isa.lanes() as f64, "{isa:?}");
            // A short spin under Miri, which interprets every FMA.
            let rounds = if cfg!(miri) { 16 } else { 1 << 14 };
            let gflops = fma_gflops(isa, rounds).expect("available");
            assert!(gflops.is_finite() && gflops > 0.0, "{isa:?}: {gflops}");
        }
        // The default is the widest available.
        match FmaIsa::widest() {
            Some(isa) => {
                assert!(isa.available());
                if FmaIsa::Avx512.available() {
                    assert_eq!(isa, FmaIsa::Avx512);
                }
                assert_eq!(fma_spin(10), fma_spin_with(isa, 10));
            }
            None => assert_eq!(fma_spin(10), None),
        }
        if !crate::simd::isa().avx2_fma_f16c {
            assert_eq!(FmaIsa::widest(), None);
        }
    }

    #[test]
    fn read_sum_counts_every_word_whatever_the_piece() {
        let words: Vec<u64> = (1..=1000).collect();
        for piece in [0, 1, 7, 8, 9, 64, 1000, 5000] {
            assert_eq!(read_sum(&words, piece), 500_500, "piece {piece}");
        }
        assert_eq!(read_sum(&[], 8), 0);
        assert_eq!(read_sum(&[u64::MAX, 2], 8), 1);
    }
}
