//! The quantized GEMV with 512-bit vectors (AVX-512 F, BW, VL): a group of 32 weights is one
//! vector of 32 i16, met by one `madd` per row of `x`, and its two Q6_K scales are one
//! blended vector. The frame (chunks, scales, passes of up to 4 rows) is the AVX2 one,
//! [`super::avx2::columns_with`].

use super::avx2::{dispatch, Isa};
use crate::par::SharedOut;
use crate::quant::act::QuantizedActs;
use crate::quant::frame::{bytes, iq4_lookup, k_pair, nibble_bytes, q2k_half, q3k_half, q6k_half};
use crate::quant::frame::{u32_at, Sink, Unpack};
use crate::quant::frame::{
    IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0,
};
use core::arch::x86_64::*;

/// The 16 bytes at `p` as 32 bytes: their low nibbles (elements 0–15), then their high
/// nibbles (16–31).
///
/// # Safety
/// `p..p + 16` must be readable and the caller must have AVX2.
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at `p` (one unaligned load) and AVX2.
    unsafe {
        let v = _mm_loadu_si128(p as *const __m128i);
        let both = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(v), _mm_srli_epi16::<4>(v));
        _mm256_and_si256(both, bytes(0x0F))
    }
}

impl Unpack<__m512i> for Q8_0 {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read bytes 2–33 of the 34-byte block.
        unsafe {
            f.group(
                0,
                false,
                _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.add(2) as *const __m256i)),
            );
        }
    }
}

impl Unpack<__m512i> for Q4_0 {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read bytes 2–17 of the 18-byte block.
        unsafe {
            let q = _mm256_sub_epi8(nibbles32(p.add(2)), bytes(8));
            f.group(0, false, _mm512_cvtepi8_epi16(q));
        }
    }
}

impl Unpack<__m512i> for Q4_1 {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read bytes 4–19 of the 20-byte block.
        unsafe {
            f.group(0, false, _mm512_cvtepu8_epi16(nibbles32(p.add(4))));
        }
    }
}

impl Unpack<__m512i> for Q5_0 {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read bytes 2–21 of the 22-byte block.
        unsafe {
            // Bit e of qh is element e's fifth bit: q − 16 = nibble − 16 where the bit is clear.
            let qh = u32_at(p.add(2));
            let nib = nibbles32(p.add(6));
            let q = _mm256_mask_sub_epi8(nib, !qh, nib, bytes(16));
            f.group(0, false, _mm512_cvtepi8_epi16(q));
        }
    }
}

impl Unpack<__m512i> for Q5_1 {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read bytes 4–23 of the 24-byte block.
        unsafe {
            let qh = u32_at(p.add(4));
            let nib = nibbles32(p.add(8));
            let q = _mm256_mask_add_epi8(nib, qh, nib, bytes(16));
            f.group(0, false, _mm512_cvtepu8_epi16(q));
        }
    }
}

impl Unpack<__m512i> for Q4_K {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read bytes 16–143 of the 144-byte block.
        unsafe {
            for c in 0..4 {
                let (lo, hi) = k_pair(p.add(16), None, c);
                f.group(2 * c, false, _mm512_cvtepu8_epi16(lo));
                f.group(2 * c + 1, true, _mm512_cvtepu8_epi16(hi));
            }
        }
    }
}

impl Unpack<__m512i> for Q5_K {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read bytes 16–175 of the 176-byte block.
        unsafe {
            let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
            for c in 0..4 {
                let (lo, hi) = k_pair(p.add(48), Some(qh), c);
                f.group(2 * c, false, _mm512_cvtepu8_epi16(lo));
                f.group(2 * c + 1, true, _mm512_cvtepu8_epi16(hi));
            }
        }
    }
}

impl Unpack<__m512i> for Q6_K {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read the 210-byte block as `q6k_half` reads it.
        unsafe {
            for h in 0..2 {
                let [g0, g1, g2, g3] = q6k_half(p, h);
                f.group(4 * h, false, _mm512_cvtepi8_epi16(g0));
                f.group(4 * h + 1, true, _mm512_cvtepi8_epi16(g1));
                f.group(4 * h + 2, false, _mm512_cvtepi8_epi16(g2));
                f.group(4 * h + 3, true, _mm512_cvtepi8_epi16(g3));
            }
        }
    }
}

impl Unpack<__m512i> for Q2_K {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read the 84-byte block as `q2k_half` reads it.
        unsafe {
            for h in 0..2 {
                let [g0, g1, g2, g3] = q2k_half(p, h);
                f.group(4 * h, false, _mm512_cvtepu8_epi16(g0));
                f.group(4 * h + 1, true, _mm512_cvtepu8_epi16(g1));
                f.group(4 * h + 2, false, _mm512_cvtepu8_epi16(g2));
                f.group(4 * h + 3, true, _mm512_cvtepu8_epi16(g3));
            }
        }
    }
}

impl Unpack<__m512i> for Q3_K {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read the 110-byte block as `q3k_half` reads it.
        unsafe {
            for h in 0..2 {
                let [g0, g1, g2, g3] = q3k_half(p, h);
                f.group(4 * h, false, _mm512_cvtepi8_epi16(g0));
                f.group(4 * h + 1, true, _mm512_cvtepi8_epi16(g1));
                f.group(4 * h + 2, false, _mm512_cvtepi8_epi16(g2));
                f.group(4 * h + 3, true, _mm512_cvtepi8_epi16(g3));
            }
        }
    }
}

impl Unpack<__m512i> for IQ4_NL {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read bytes 2–17 of the 18-byte block.
        unsafe {
            let q = iq4_lookup(nibble_bytes(p.add(2)));
            f.group(0, false, _mm512_cvtepi8_epi16(q));
        }
    }
}

impl Unpack<__m512i> for IQ4_XS {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX-512
        // F, BW and VL; the loads read bytes 8–135 of the 136-byte block, 16 per group.
        unsafe {
            for c in 0..4 {
                let g = 2 * c;
                let even = iq4_lookup(nibble_bytes(p.add(8 + 16 * g)));
                f.group(g, false, _mm512_cvtepi8_epi16(even));
                let odd = iq4_lookup(nibble_bytes(p.add(24 + 16 * g)));
                f.group(g + 1, true, _mm512_cvtepi8_epi16(odd));
            }
        }
    }
}

/// AVX-512: one `madd` per group and row; lanes 0–7 hold elements 0–15, lanes 8–15 the rest.
pub(super) struct Avx512;

impl Isa for Avx512 {
    type W = __m512i;
    type Acc = __m512;

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: the caller has AVX-512F (the trait's contract).
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn group(acc: __m512, w: __m512i, x: *const i16, s: *const f32, halves: bool) -> __m512 {
        // SAFETY: the trait's contract: AVX-512 F and BW, 32 readable i16 at `x` (one unaligned
        // load) and 1 (2 with `halves`) readable f32 at `s`.
        unsafe {
            let p = _mm512_madd_epi16(w, _mm512_loadu_si512(x as *const __m512i));
            let scale = if halves {
                _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(*s), _mm512_set1_ps(*s.add(1)))
            } else {
                _mm512_set1_ps(*s)
            };
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc)
        }
    }

    #[inline(always)]
    unsafe fn hsum2(a: __m512, b: __m512) -> f32 {
        // SAFETY: the caller has AVX-512F (the trait's contract).
        unsafe { _mm512_reduce_add_ps(_mm512_add_ps(a, b)) }
    }
}

/// Columns `j0..j1` of `y = x·Wᵀ (+ b)` with 512-bit vectors.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VL, AVX2, FMA and F16C; the rest as
/// `super::columns_scalar`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn columns(
    y: SharedOut,
    acts: &QuantizedActs,
    format: crate::quant::QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    // SAFETY: the features are enabled on this function; the rest is the caller's contract.
    unsafe { dispatch!(Avx512, format, y, acts, w, bias, n, j0, j1) }
}
