//! Probes of the machine's two ceilings, so that kernels can be quoted against them: the
//! memory read bandwidth (what a decode step, which reads every weight once, cannot beat) and
//! the FMA peak (what a prefill, which is matmul-bound, cannot beat). The benchmarks and
//! `examples/roofline.rs` use them; measure in the same sitting as what they are compared
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
/// the CPUs qkv targets), so the chains never wait on each other.
pub const FMA_CHAINS: usize = 12;

/// Runs `rounds` rounds of [`FMA_CHAINS`] independent 8-lane f32 FMAs on every thread of the
/// current pool at once (no memory traffic) and returns the floating-point operations done
/// (2 per lane per FMA), or `None` on a CPU without AVX2 and FMA. Time the call to get the
/// FMA peak in FLOP/s.
pub fn fma_spin(rounds: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma_f16c() {
        // SAFETY: AVX2 and FMA were detected just above; every pool thread runs on this CPU.
        let sinks = rayon::broadcast(|_| unsafe { avx2::spin(rounds) });
        std::hint::black_box(sinks);
        return Some((rayon::current_num_threads() * rounds * FMA_CHAINS * 8 * 2) as f64);
    }
    let _ = rounds;
    None
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::FMA_CHAINS;
    use core::arch::x86_64::*;

    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn spin(rounds: usize) -> f32 {
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
        _mm256_storeu_ps(lanes.as_mut_ptr(), total);
        lanes.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
