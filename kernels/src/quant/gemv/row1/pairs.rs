//! Weights taken apart for activations in even/odd order ([`QuantizedActs::eo`]).
//!
//! Read as 16-bit lanes, a vector of 32 weight bytes holds element `2i` in the low byte of
//! lane `i` and element `2i + 1` in its high byte. Masking the low bytes and shifting the high
//! ones down gives two vectors of 16 integers, the block's even elements and its odd ones,
//! which meet the activations' evens and odds with one `madd` each. No byte is widened with a
//! cross-lane `vpmovzxbw`/`vpmovsxbw`: masks and in-lane shifts do all the work, and they
//! are what the decode GEMV spent most of its time on (the shuffle ports, on Zen 4).
//!
//! The 4-bit formats of 32 elements keep element `j` in the low nibble of byte `j` and
//! element `j + 16` in its high nibble; broadcast to both 128-bit halves, one variable shift
//! per vector picks the right nibble of each 16-bit lane for each half.
//!
//! Offsets (Q4_0's 8, Q5_0's 16, Q6_K's 32) are not subtracted here: the integers stay
//! unsigned, and the kernels take `offset·Σx` off each block's integer sum
//! ([`QuantizedActs::isum16`]), which is exact.
//!
//! [`QuantizedActs::eo`]: crate::quant::act::QuantizedActs::eo
//! [`QuantizedActs::isum16`]: crate::quant::act::QuantizedActs::isum16

use crate::quant::frame::{bit_bytes, bytes, k_pair, nibble_bytes, q6k_bytes, u32_at, Format};
use crate::quant::frame::{Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q8_0};
use core::arch::x86_64::*;

/// A group of 32 as its even elements and its odd ones, 16 i16 each.
pub(super) type Eo = (__m256i, __m256i);

/// `Σ w·x` over a group of 32 as 8 i32 lanes, with `x` the group's 32 activations in
/// even/odd order.
///
/// # Safety
/// `x` points to 32 readable i16; AVX2.
#[inline(always)]
pub(super) unsafe fn dot(w: Eo, x: *const i16) -> __m256i {
    // SAFETY: the caller guarantees 32 readable i16 at `x` (two unaligned loads) and AVX2.
    // |w| ≤ 255 and |x| ≤ 32767: 32 products sum well inside i32.
    unsafe {
        let even = _mm256_madd_epi16(w.0, _mm256_loadu_si256(x as *const __m256i));
        let odd = _mm256_madd_epi16(w.1, _mm256_loadu_si256(x.add(16) as *const __m256i));
        _mm256_add_epi32(even, odd)
    }
}

/// 32 bytes of unsigned values in element order as evens and odds.
///
/// # Safety
/// AVX2.
#[inline(always)]
pub(super) unsafe fn split_u8(v: __m256i) -> Eo {
    // SAFETY: the caller has AVX2; registers only.
    unsafe {
        (
            _mm256_and_si256(v, _mm256_set1_epi16(0x00FF)),
            _mm256_srli_epi16::<8>(v),
        )
    }
}

/// 32 bytes of signed values in element order as evens and odds.
///
/// # Safety
/// AVX2.
#[inline(always)]
pub(super) unsafe fn split_i8(v: __m256i) -> Eo {
    // SAFETY: the caller has AVX2; registers only.
    unsafe {
        (
            _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(v)),
            _mm256_srai_epi16::<8>(v),
        )
    }
}

/// The 32 nibbles of the 16 bytes at `p` (element `j` low in byte `j`, `j + 16` high) as
/// evens and odds.
///
/// # Safety
/// `p..p + 16` readable; AVX2.
#[inline(always)]
unsafe fn split_nibbles16(p: *const u8) -> Eo {
    // SAFETY: the caller guarantees 16 readable bytes at `p` (one broadcast load) and AVX2.
    unsafe {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        // Lane i of the low half takes bits 0–3 (element 2i) and 8–11 (2i + 1) of word i; the
        // high half bits 4–7 (2i + 16) and 12–15 (2i + 17). 32-bit shifts move no masked bit
        // across the two words of a lane.
        let mask = _mm256_set1_epi32(0x000F_000F);
        let even = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        let odd = _mm256_srlv_epi32(v, _mm256_setr_epi32(8, 8, 8, 8, 12, 12, 12, 12));
        (_mm256_and_si256(even, mask), _mm256_and_si256(odd, mask))
    }
}

/// A 32-element format's block (one group, one scale) for the one-row kernel.
pub(in crate::quant::gemv) trait Pairs: Format {
    /// What every stored integer carries: the value is `q − OFFSET`.
    const OFFSET: i32;

    /// The block at `p` as evens and odds of its stored integers (offset not taken off).
    ///
    /// # Safety
    /// `p` points to one whole block; AVX2.
    unsafe fn eo(p: *const u8) -> Eo;
}

impl Pairs for Q8_0 {
    const OFFSET: i32 = 0;
    #[inline(always)]
    unsafe fn eo(p: *const u8) -> Eo {
        // SAFETY: the trait's contract; bytes 2–33 of the 34-byte block.
        unsafe { split_i8(_mm256_loadu_si256(p.add(2) as *const __m256i)) }
    }
}

impl Pairs for Q4_0 {
    const OFFSET: i32 = 8;
    #[inline(always)]
    unsafe fn eo(p: *const u8) -> Eo {
        // SAFETY: the trait's contract; bytes 2–17 of the 18-byte block.
        unsafe { split_nibbles16(p.add(2)) }
    }
}

impl Pairs for Q4_1 {
    const OFFSET: i32 = 0;
    #[inline(always)]
    unsafe fn eo(p: *const u8) -> Eo {
        // SAFETY: the trait's contract; bytes 4–19 of the 20-byte block.
        unsafe { split_nibbles16(p.add(4)) }
    }
}

impl Pairs for Q5_0 {
    const OFFSET: i32 = 16;
    #[inline(always)]
    unsafe fn eo(p: *const u8) -> Eo {
        // SAFETY: the trait's contract; bytes 2–21 of the 22-byte block.
        unsafe {
            let fifth = _mm256_and_si256(bit_bytes(u32_at(p.add(2))), bytes(16));
            split_u8(_mm256_or_si256(nibble_bytes(p.add(6)), fifth))
        }
    }
}

impl Pairs for Q5_1 {
    const OFFSET: i32 = 0;
    #[inline(always)]
    unsafe fn eo(p: *const u8) -> Eo {
        // SAFETY: the trait's contract; bytes 4–23 of the 24-byte block.
        unsafe {
            let fifth = _mm256_and_si256(bit_bytes(u32_at(p.add(4))), bytes(16));
            split_u8(_mm256_or_si256(nibble_bytes(p.add(8)), fifth))
        }
    }
}

/// Q4_K's and Q5_K's super-block for the one-row kernel.
pub(in crate::quant::gemv) trait KDots {
    /// The integer dot products of the super-block's 8 groups (stored integers, 0–31) with
    /// the 256 activations at `x` in even/odd order: 8 i32 lanes per group.
    ///
    /// # Safety
    /// `p` points to one whole block, `x` to 256 readable i16; AVX2.
    unsafe fn dots(p: *const u8, x: *const i16) -> [__m256i; 8];
}

impl KDots for Q4_K {
    #[inline(always)]
    unsafe fn dots(p: *const u8, x: *const i16) -> [__m256i; 8] {
        // SAFETY: the trait's contract; the loads read bytes 16–143 of the 144-byte block
        // and the 256 activations.
        unsafe {
            let mut out = [_mm256_setzero_si256(); 8];
            let low = _mm256_set1_epi16(0x000F);
            for c in 0..4 {
                // Byte e of the 32: group 2c's element e low, group 2c + 1's high.
                let v = _mm256_loadu_si256(p.add(16 + 32 * c) as *const __m256i);
                let first = (
                    _mm256_and_si256(v, low),
                    _mm256_and_si256(_mm256_srli_epi16::<8>(v), low),
                );
                let second = (
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
                    _mm256_srli_epi16::<12>(v),
                );
                out[2 * c] = dot(first, x.add(64 * c));
                out[2 * c + 1] = dot(second, x.add(64 * c + 32));
            }
            out
        }
    }
}

impl KDots for Q5_K {
    #[inline(always)]
    unsafe fn dots(p: *const u8, x: *const i16) -> [__m256i; 8] {
        // SAFETY: the trait's contract; the loads read bytes 16–175 of the 176-byte block
        // and the 256 activations.
        unsafe {
            let mut out = [_mm256_setzero_si256(); 8];
            let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
            for c in 0..4 {
                let (first, second) = k_pair(p.add(48), Some(qh), c);
                out[2 * c] = dot(split_u8(first), x.add(64 * c));
                out[2 * c + 1] = dot(split_u8(second), x.add(64 * c + 32));
            }
            out
        }
    }
}

/// A Q6_K super-block's integer dot products (stored integers, 0–63) with the 256
/// activations at `x` in even/odd order, one i32 per half-group of 16: the first vector
/// holds half-groups 0–7 (group 0's first half, its second, group 1's first, …), the
/// second 8–15.
///
/// # Safety
/// `p` points to one whole Q6_K block (210 bytes), `x` to 256 readable i16; AVX2.
#[inline(always)]
pub(super) unsafe fn q6k_halves(p: *const u8, x: *const i16) -> [__m256i; 2] {
    // SAFETY: the caller's contract covers the block's bytes that `q6k_bytes` reads and the
    // 256 activations; AVX2.
    unsafe {
        let mut v = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            for (g, bytes) in q6k_bytes(p, h).into_iter().enumerate() {
                v[4 * h + g] = dot(split_u8(bytes), x.add(32 * (4 * h + g)));
            }
        }
        // Each group's lanes 0–3 hold its first half (elements 0–15: the even and odd
        // vectors keep them in their low 128 bits), lanes 4–7 its second. Two rounds of
        // `hadd` leave [g0 first, g1 first, g2 first, g3 first | g0 second, …, g3 second].
        let a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        [
            _mm256_permutevar8x32_epi32(a, order),
            _mm256_permutevar8x32_epi32(b, order),
        ]
    }
}
