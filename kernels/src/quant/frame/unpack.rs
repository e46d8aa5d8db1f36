//! 256-bit unpacking: a group of 32 weights becomes two vectors of 16 i16 (elements 0–15
//! and 16–31), one [`Unpack`] implementation per format, with the bit-twiddling helpers
//! that the 512-bit kernel shares.

use super::{u32_at, Sink, Unpack, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0};
use super::{IQ4_NL, IQ4_XS, Q2_K, Q3_K};
use core::arch::x86_64::*;

/// A group as two vectors of 16 i16: elements 0–15 and 16–31.
pub(in crate::quant) type W2 = (__m256i, __m256i);

/// `set1_epi8` of a byte given as `u8`.
///
/// # Safety
/// The caller must have AVX.
#[inline(always)]
pub(in crate::quant) unsafe fn bytes(v: u8) -> __m256i {
    // SAFETY: the caller has AVX2 (this function's contract); these intrinsics only compute on
    // registers.
    unsafe { _mm256_set1_epi8(v as i8) }
}

/// The 16 bytes at `p` as 16 i16 of their low nibbles and 16 of their high nibbles.
///
/// # Safety
/// `p..p + 16` must be readable and the caller must have AVX2.
#[inline(always)]
unsafe fn nibbles16(p: *const u8) -> W2 {
    // SAFETY: the caller guarantees 16 readable bytes at `p` (one unaligned load) and AVX2.
    unsafe {
        let t = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
        (
            _mm256_and_si256(t, _mm256_set1_epi16(0x0F)),
            _mm256_srli_epi16::<4>(t),
        )
    }
}

/// The 16 bytes at `p` as 32 bytes of nibbles: the low nibbles (elements 0–15) in the low
/// 128 bits, the high nibbles (elements 16–31) in the high 128 bits.
///
/// # Safety
/// `p..p + 16` must be readable and the caller must have AVX2.
#[inline(always)]
pub(in crate::quant) unsafe fn nibble_bytes(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at `p` (one unaligned load) and AVX2.
    unsafe {
        let v = _mm_loadu_si128(p as *const __m128i);
        let both = _mm256_set_m128i(_mm_srli_epi16::<4>(v), v);
        _mm256_and_si256(both, bytes(0x0F))
    }
}

/// Byte `e` (0–31) of the result is 0xFF where bit `e` of `h` is set, else 0.
///
/// # Safety
/// The caller must have AVX2.
#[inline(always)]
pub(in crate::quant) unsafe fn bit_bytes(h: u32) -> __m256i {
    // SAFETY: the caller has AVX2 (this function's contract); these intrinsics only compute on
    // registers.
    unsafe {
        // Every 32-bit lane holds h; byte e takes byte e / 8 of it (within its 128-bit lane),
        // then keeps bit e % 8.
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let v = _mm256_shuffle_epi8(_mm256_set1_epi32(h as i32), spread);
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit)
    }
}

/// 32 bytes of unsigned values as two vectors of 16 i16.
///
/// # Safety
/// The caller must have AVX2.
#[inline(always)]
unsafe fn widen_u8(v: __m256i) -> W2 {
    // SAFETY: the caller has AVX2 (this function's contract); these intrinsics only compute on
    // registers.
    unsafe {
        (
            _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v)),
            _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(v)),
        )
    }
}

/// 32 bytes of signed values as two vectors of 16 i16.
///
/// # Safety
/// The caller must have AVX2.
#[inline(always)]
unsafe fn widen_i8(v: __m256i) -> W2 {
    // SAFETY: the caller has AVX2 (this function's contract); these intrinsics only compute on
    // registers.
    unsafe {
        (
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(v)),
        )
    }
}

/// Bit `s` of every byte of `qh`, moved to bit 4 (the fifth bit of a Q5_K value).
///
/// # Safety
/// The caller must have AVX2.
#[inline(always)]
unsafe fn k_fifth(qh: __m256i, s: usize) -> __m256i {
    // SAFETY: the caller has AVX2 (this function's contract); these intrinsics only compute on
    // registers.
    unsafe {
        // 16-bit shifts: the masked bit 4 of each byte comes from bit s of the same byte.
        let moved = match s {
            0 => _mm256_slli_epi16::<4>(qh),
            1 => _mm256_slli_epi16::<3>(qh),
            2 => _mm256_slli_epi16::<2>(qh),
            3 => _mm256_slli_epi16::<1>(qh),
            4 => qh,
            5 => _mm256_srli_epi16::<1>(qh),
            6 => _mm256_srli_epi16::<2>(qh),
            _ => _mm256_srli_epi16::<3>(qh),
        };
        _mm256_and_si256(moved, bytes(0x10))
    }
}

/// The 32 unsigned values (0–15, or 0–31 with `qh`) of sub-blocks `2c` (low nibbles) and
/// `2c + 1` (high nibbles) of a Q4_K/Q5_K block, as bytes.
///
/// # Safety
/// `qs + 32c..qs + 32c + 32` must be readable and the caller must have AVX2.
#[inline(always)]
pub(in crate::quant) unsafe fn k_pair(
    qs: *const u8,
    qh: Option<__m256i>,
    c: usize,
) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees AVX2 and 32 readable bytes at `qs + 32c` (one unaligned
    // load).
    unsafe {
        let v = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
        let mut lo = _mm256_and_si256(v, bytes(0x0F));
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), bytes(0x0F));
        if let Some(qh) = qh {
            lo = _mm256_or_si256(lo, k_fifth(qh, 2 * c));
            hi = _mm256_or_si256(hi, k_fifth(qh, 2 * c + 1));
        }
        (lo, hi)
    }
}

/// The stored values (0..63) of the four groups of half `h` of a Q6_K block, as bytes in
/// element order.
///
/// # Safety
/// `p` must point to a whole Q6_K block (210 readable bytes), `h < 2`, and the caller must
/// have AVX2.
#[inline(always)]
pub(super) unsafe fn q6k_bytes(p: *const u8, h: usize) -> [__m256i; 4] {
    // SAFETY: the caller guarantees AVX2 and a whole Q6_K block at `p`: the loads read
    // bytes `64h..64h + 64` and `128 + 32h..160 + 32h`, inside its 210 bytes for `h < 2`.
    unsafe {
        let ql0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
        let ql1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
        let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
        let (low, top) = (bytes(0x0F), bytes(0x30));
        // Group g takes bits 2g, 2g+1 of qh as bits 4–5; every shift's masked bits come from
        // the same byte.
        [
            _mm256_or_si256(
                _mm256_and_si256(ql0, low),
                _mm256_and_si256(_mm256_slli_epi16::<4>(qh), top),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, low),
                _mm256_and_si256(_mm256_slli_epi16::<2>(qh), top),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low),
                _mm256_and_si256(qh, top),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), top),
            ),
        ]
    }
}

/// The signed values (−32..31) of the four groups of half `h` of a Q6_K block, as bytes.
///
/// # Safety
/// As [`q6k_bytes`].
#[inline(always)]
pub(in crate::quant) unsafe fn q6k_half(p: *const u8, h: usize) -> [__m256i; 4] {
    // SAFETY: the caller's contract is `q6k_bytes`'s; the rest is register arithmetic.
    unsafe { q6k_bytes(p, h).map(|g| _mm256_sub_epi8(g, bytes(32))) }
}

/// The signed values (−4..3) of the four groups of half `h` of a Q3_K block, as bytes in
/// element order: group `j` takes bits `2j, 2j+1` of the half's 32 bytes of pairs, less 4
/// where bit `4h + j` of the high-bit bytes is clear.
///
/// # Safety
/// `p` must point to a whole Q3_K block (110 readable bytes), `h < 2`, and the caller must
/// have AVX2.
#[inline(always)]
pub(in crate::quant) unsafe fn q3k_half(p: *const u8, h: usize) -> [__m256i; 4] {
    // SAFETY: the caller guarantees AVX2 and a whole Q3_K block at `p`: the loads read bytes
    // 0–31 (high bits) and `32 + 32h..64 + 32h`, inside its 110 bytes for `h < 2`.
    unsafe {
        let hm = _mm256_loadu_si256(p as *const __m256i);
        let qs = _mm256_loadu_si256(p.add(32 + 32 * h) as *const __m256i);
        // Half h's high bits are bits 4h..4h+4 of each byte: bring them to bits 0–3, so that
        // group j's is bit j. Every shift below is on 16-bit lanes, and every bit kept after
        // its mask comes from the same byte. (Straight-line code: written with closures over
        // the group number, the shifts were not resolved at compile time.)
        let hm = if h == 0 {
            hm
        } else {
            _mm256_srli_epi16::<4>(hm)
        };
        let (three, four) = (bytes(3), bytes(4));
        let group = |pair: __m256i, high: __m256i| {
            let q = _mm256_or_si256(_mm256_and_si256(pair, three), _mm256_and_si256(high, four));
            _mm256_sub_epi8(q, four)
        };
        [
            group(qs, _mm256_slli_epi16::<2>(hm)),
            group(_mm256_srli_epi16::<2>(qs), _mm256_slli_epi16::<1>(hm)),
            group(_mm256_srli_epi16::<4>(qs), hm),
            group(_mm256_srli_epi16::<6>(qs), _mm256_srli_epi16::<1>(hm)),
        ]
    }
}

/// The values (0..3) of the four groups of half `h` of a Q2_K block, as bytes in element
/// order: group `j` takes bits `2j, 2j+1` of the half's 32 bytes.
///
/// # Safety
/// `p` must point to a whole Q2_K block (84 readable bytes), `h < 2`, and the caller must
/// have AVX2.
#[inline(always)]
pub(in crate::quant) unsafe fn q2k_half(p: *const u8, h: usize) -> [__m256i; 4] {
    // SAFETY: the caller guarantees AVX2 and a whole Q2_K block at `p`: the load reads bytes
    // `16 + 32h..48 + 32h`, inside its 84 bytes for `h < 2`.
    unsafe {
        let qs = _mm256_loadu_si256(p.add(16 + 32 * h) as *const __m256i);
        // 16-bit shifts: the two bits kept from each byte come from that byte.
        let three = bytes(3);
        [
            _mm256_and_si256(qs, three),
            _mm256_and_si256(_mm256_srli_epi16::<2>(qs), three),
            _mm256_and_si256(_mm256_srli_epi16::<4>(qs), three),
            _mm256_and_si256(_mm256_srli_epi16::<6>(qs), three),
        ]
    }
}

/// Each byte of `nibbles` (0..15) replaced by its entry of the IQ4 table
/// ([`IQ4_TABLE`](crate::quant::blocks::IQ4_TABLE)), as signed bytes.
///
/// # Safety
/// The caller must have AVX2.
#[inline(always)]
pub(in crate::quant) unsafe fn iq4_lookup(nibbles: __m256i) -> __m256i {
    // SAFETY: the caller has AVX2 (this function's contract); registers only. The table is
    // in both 128-bit lanes, since the byte shuffle looks up within each lane.
    unsafe {
        let t = _mm_loadu_si128(crate::quant::blocks::IQ4_TABLE.as_ptr() as *const __m128i);
        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t), nibbles)
    }
}

impl Unpack<W2> for Q3_K {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read the 110-byte block as `q3k_half` reads it.
        unsafe {
            for h in 0..2 {
                let [g0, g1, g2, g3] = q3k_half(p, h);
                f.group(4 * h, false, widen_i8(g0));
                f.group(4 * h + 1, true, widen_i8(g1));
                f.group(4 * h + 2, false, widen_i8(g2));
                f.group(4 * h + 3, true, widen_i8(g3));
            }
        }
    }
}

impl Unpack<W2> for Q2_K {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read the 84-byte block as `q2k_half` reads it.
        unsafe {
            for h in 0..2 {
                let [g0, g1, g2, g3] = q2k_half(p, h);
                f.group(4 * h, false, widen_u8(g0));
                f.group(4 * h + 1, true, widen_u8(g1));
                f.group(4 * h + 2, false, widen_u8(g2));
                f.group(4 * h + 3, true, widen_u8(g3));
            }
        }
    }
}

impl Unpack<W2> for IQ4_NL {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read bytes 2–17 of the 18-byte block.
        unsafe {
            f.group(0, false, widen_i8(iq4_lookup(nibble_bytes(p.add(2)))));
        }
    }
}

impl Unpack<W2> for IQ4_XS {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read bytes 8–135 of the 136-byte block, 16 per group.
        unsafe {
            for c in 0..4 {
                let g = 2 * c;
                f.group(
                    g,
                    false,
                    widen_i8(iq4_lookup(nibble_bytes(p.add(8 + 16 * g)))),
                );
                let odd = widen_i8(iq4_lookup(nibble_bytes(p.add(24 + 16 * g))));
                f.group(g + 1, true, odd);
            }
        }
    }
}

impl Unpack<W2> for Q8_0 {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read bytes 2–33 of the 34-byte block.
        unsafe {
            let lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2) as *const __m128i));
            let hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18) as *const __m128i));
            f.group(0, false, (lo, hi));
        }
    }
}

impl Unpack<W2> for Q4_0 {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read bytes 2–17 of the 18-byte block.
        unsafe {
            let (lo, hi) = nibbles16(p.add(2));
            let eight = _mm256_set1_epi16(8);
            f.group(
                0,
                false,
                (_mm256_sub_epi16(lo, eight), _mm256_sub_epi16(hi, eight)),
            );
        }
    }
}

impl Unpack<W2> for Q4_1 {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read bytes 4–19 of the 20-byte block.
        unsafe {
            f.group(0, false, nibbles16(p.add(4)));
        }
    }
}

impl Unpack<W2> for Q5_0 {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read bytes 2–21 of the 22-byte block.
        unsafe {
            // q − 16 = nibble − 16·(1 − fifth bit), in bytes, then widened.
            let clear = _mm256_andnot_si256(bit_bytes(u32_at(p.add(2))), bytes(16));
            f.group(
                0,
                false,
                widen_i8(_mm256_sub_epi8(nibble_bytes(p.add(6)), clear)),
            );
        }
    }
}

impl Unpack<W2> for Q5_1 {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read bytes 4–23 of the 24-byte block.
        unsafe {
            let set = _mm256_and_si256(bit_bytes(u32_at(p.add(4))), bytes(16));
            f.group(
                0,
                false,
                widen_u8(_mm256_or_si256(nibble_bytes(p.add(8)), set)),
            );
        }
    }
}

impl Unpack<W2> for Q4_K {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read bytes 16–143 of the 144-byte block.
        unsafe {
            for c in 0..4 {
                let (lo, hi) = k_pair(p.add(16), None, c);
                f.group(2 * c, false, widen_u8(lo));
                f.group(2 * c + 1, true, widen_u8(hi));
            }
        }
    }
}

impl Unpack<W2> for Q5_K {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read bytes 16–175 of the 176-byte block.
        unsafe {
            let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
            for c in 0..4 {
                let (lo, hi) = k_pair(p.add(48), Some(qh), c);
                f.group(2 * c, false, widen_u8(lo));
                f.group(2 * c + 1, true, widen_u8(hi));
            }
        }
    }
}

impl Unpack<W2> for Q6_K {
    #[inline(always)]
    unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
        // SAFETY: the trait's contract: `p` points to one whole block and the CPU has AVX2;
        // the loads read the 210-byte block as `q6k_half` reads it.
        unsafe {
            for h in 0..2 {
                let [g0, g1, g2, g3] = q6k_half(p, h);
                f.group(4 * h, false, widen_i8(g0));
                f.group(4 * h + 1, true, widen_i8(g1));
                f.group(4 * h + 2, false, widen_i8(g2));
                f.group(4 * h + 3, true, widen_i8(g3));
            }
        }
    }
}
