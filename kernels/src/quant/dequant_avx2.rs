//! AVX2 block decoders, bit-identical to the scalar ones in [`super::blocks`].
//!
//! Every value is computed as the scalar reference computes it: the f16 scales widened
//! exactly (F16C), the scale products of the K-formats (`d·sc`, `dmin·mn`, `d·sc` of Q6_K)
//! rounded to f32 first (a vector multiply of broadcast values, lane for lane the scalar
//! one), the integer converted exactly to f32, then one separate vector multiply and, where
//! the format has one, one separate add or subtract — never a fused multiply-add, so the
//! rounding is the reference's, lane for lane.
//!
//! The bit unpacking (nibbles, fifth and sixth bits) runs on 128- and 256-bit integer
//! vectors; the last step, 16 signed bytes to 16 f32 values written out, is the [`Widen`]
//! trait, implemented here with two 256-bit registers ([`Avx2`]). The per-format loops are
//! generic over it and `#[inline(always)]`, so an instance is compiled inside its ISA's
//! `#[target_feature]` entry point. A 512-bit `Widen` (one `vpmovsxbd`/`vcvtdq2ps`/`vmulps`
//! on zmm per 16 values) was tried on Zen 4, which splits 512-bit operations in two, and was
//! no clear gain (faster on some formats, slower on Q8_0), so there is none.

use super::blocks::{iq4_xs_scale, k_scale_min, q3_k_scale};
use super::frame::{iq4_lookup, q2k_half, q3k_half};
use super::QuantFormat;
use core::arch::x86_64::*;

/// The value is `q·d`.
const MUL: u8 = 0;
/// The value is `q·d + m`.
const ADD: u8 = 1;
/// The value is `q·d − m`.
const SUB: u8 = 2;

/// The last step of every decoder: 16 signed bytes to 16 f32 values.
trait Widen {
    /// A vector of broadcast f32 scale (or minimum).
    type V: Copy;

    /// `x` in every lane.
    ///
    /// # Safety
    /// The CPU must have this implementation's features (the caller runs inside its
    /// `#[target_feature]` entry point).
    unsafe fn splat(x: f32) -> Self::V;

    /// The f16 with bits `bits`, widened exactly (F16C converts subnormals exactly too), in
    /// every lane. (Converted as a broadcast vector rather than as one scalar lane: LLVM
    /// narrows a one-lane conversion's input to a `vpinsrw` that merges into a stale
    /// register, a false dependency that chained every block to the one before.)
    ///
    /// # Safety
    /// As [`Widen::splat`].
    unsafe fn splat_f16(bits: u16) -> Self::V;

    /// `a·b` lane by lane (one f32 multiply each, rounded as the scalar one is).
    ///
    /// # Safety
    /// As [`Widen::splat`].
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;

    /// Writes `out[0..16]`: the 16 signed bytes of `b`, each converted to f32 and multiplied
    /// by `d`, then plus `m` ([`ADD`]), minus `m` ([`SUB`]) or left alone ([`MUL`]) — a
    /// separate multiply and add, as the scalar reference rounds.
    ///
    /// # Safety
    /// `out..out + 16` must be writable f32s, and the CPU must have this implementation's
    /// features.
    unsafe fn store16<const OP: u8>(out: *mut f32, b: __m128i, d: Self::V, m: Self::V);
}

/// The 256-bit [`Widen`]: two registers of 8 lanes.
struct Avx2;

impl Widen for Avx2 {
    type V = __m256;

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        // SAFETY: the caller has the CPU features (this function's contract); these intrinsics only
        // compute on registers.
        unsafe { _mm256_set1_ps(x) }
    }

    /// # Safety
    /// As [`Widen::splat_f16`].
    #[inline(always)]
    unsafe fn splat_f16(bits: u16) -> __m256 {
        // SAFETY: the caller has the CPU features (this function's contract); these intrinsics only
        // compute on registers.
        unsafe { _mm256_cvtph_ps(_mm_set1_epi16(bits as i16)) }
    }

    /// # Safety
    /// As [`Widen::mul`].
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller has the CPU features (this function's contract); these intrinsics only
        // compute on registers.
        unsafe { _mm256_mul_ps(a, b) }
    }

    /// # Safety
    /// As [`Widen::store16`].
    #[inline(always)]
    unsafe fn store16<const OP: u8>(out: *mut f32, b: __m128i, d: __m256, m: __m256) {
        // SAFETY: the caller guarantees 16 writable f32 at `out` (two unaligned stores of 8) and
        // the CPU features (this function's contract).
        unsafe {
            _mm256_storeu_ps(out, finish8::<OP>(b, d, m));
            _mm256_storeu_ps(out.add(8), finish8::<OP>(_mm_srli_si128::<8>(b), d, m));
        }
    }
}

/// The low 8 signed bytes of `b` as f32, times `d`, then `OP` with `m`.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn finish8<const OP: u8>(b: __m128i, d: __m256, m: __m256) -> __m256 {
    // SAFETY: the caller has the CPU features (this function's contract); these intrinsics only
    // compute on registers.
    unsafe {
        let p = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), d);
        match OP {
            ADD => _mm256_add_ps(p, m),
            SUB => _mm256_sub_ps(p, m),
            _ => p,
        }
    }
}

/// The bits of the little-endian f16 at `p`.
///
/// # Safety
/// `p..p + 2` must be readable.
#[inline(always)]
unsafe fn f16_bits(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees 2 readable bytes at `p`.
    unsafe { u16::from_le_bytes([*p, *p.add(1)]) }
}

/// The 32 signed bytes of `v` (in order) as 32 values at `out`.
///
/// # Safety
/// `out..out + 32` must be writable and the CPU must have `W`'s features and AVX2.
#[inline(always)]
unsafe fn store32<W: Widen, const OP: u8>(out: *mut f32, v: __m256i, d: W::V, m: W::V) {
    // SAFETY: the caller guarantees 32 writable f32 at `out`, which the two `store16` of 16
    // cover, and the CPU features (this function's contract).
    unsafe {
        W::store16::<OP>(out, _mm256_castsi256_si128(v), d, m);
        W::store16::<OP>(out.add(16), _mm256_extracti128_si256::<1>(v), d, m);
    }
}

/// The 32 nibbles of the 16 bytes at `p` in the 32-element formats' order: byte `j`'s low
/// nibble is element `j`, its high nibble element `j + 16`.
///
/// # Safety
/// `p..p + 16` must be readable and the CPU must have AVX2.
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at `p` (one unaligned load) and AVX2.
    unsafe {
        let qs = _mm_loadu_si128(p.cast());
        let m4 = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(qs, m4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), m4);
        _mm256_set_m128i(hi, lo)
    }
}

/// `0x10` in byte `j` where bit `j` of the little-endian u32 at `p` is set, else 0: the
/// fifth bits of a Q5_0/Q5_1 block.
///
/// # Safety
/// `p..p + 4` must be readable and the CPU must have AVX2.
#[inline(always)]
unsafe fn fifth_bits32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at `p` and AVX2.
    unsafe {
        let qh = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
        // Byte j gets byte j / 8 of qh (shuffles stay inside 128-bit lanes; every lane holds
        // the whole broadcast word).
        #[rustfmt::skip]
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh as i32),
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
            ),
        );
        // Byte j keeps bit j % 8 of it.
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// Q8_0 blocks: `q·d`.
///
/// # Safety
/// The CPU must have AVX2, F16C and `W`'s features. `src` should be exactly the Q8_0 blocks
/// of `dst` (the loop walks whole chunks of both, so other lengths stay in bounds).
#[inline(always)]
unsafe fn q8_0<W: Widen>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). Every pointer
    // below stays inside `block`, a chunk of exactly 34 bytes (the loads read at most
    // its last byte, as the offsets show), and inside `out`, a chunk of exactly 32 f32.
    unsafe {
        let zero = W::splat(0.0);
        for (block, out) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
            let p = block.as_ptr();
            let d = W::splat_f16(f16_bits(p));
            let q = _mm256_loadu_si256(p.add(2).cast());
            store32::<W, MUL>(out.as_mut_ptr(), q, d, zero);
        }
    }
}

/// Q4_0 blocks: `(q − 8)·d`.
///
/// # Safety
/// As [`q8_0`], for Q4_0 blocks.
#[inline(always)]
unsafe fn q4_0<W: Widen>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). Every pointer
    // below stays inside `block`, a chunk of exactly 18 bytes (the loads read at most
    // its last byte, as the offsets show), and inside `out`, a chunk of exactly 32 f32.
    unsafe {
        let zero = W::splat(0.0);
        for (block, out) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
            let p = block.as_ptr();
            let d = W::splat_f16(f16_bits(p));
            let q = _mm256_sub_epi8(nibbles32(p.add(2)), _mm256_set1_epi8(8));
            store32::<W, MUL>(out.as_mut_ptr(), q, d, zero);
        }
    }
}

/// Q4_1 blocks: `q·d + m`.
///
/// # Safety
/// As [`q8_0`], for Q4_1 blocks.
#[inline(always)]
unsafe fn q4_1<W: Widen>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). Every pointer
    // below stays inside `block`, a chunk of exactly 20 bytes (the loads read at most
    // its last byte, as the offsets show), and inside `out`, a chunk of exactly 32 f32.
    unsafe {
        for (block, out) in src.chunks_exact(20).zip(dst.chunks_exact_mut(32)) {
            let p = block.as_ptr();
            let (d, m) = (W::splat_f16(f16_bits(p)), W::splat_f16(f16_bits(p.add(2))));
            store32::<W, ADD>(out.as_mut_ptr(), nibbles32(p.add(4)), d, m);
        }
    }
}

/// Q5_0 blocks: `(q − 16)·d`.
///
/// # Safety
/// As [`q8_0`], for Q5_0 blocks.
#[inline(always)]
unsafe fn q5_0<W: Widen>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). Every pointer
    // below stays inside `block`, a chunk of exactly 22 bytes (the loads read at most
    // its last byte, as the offsets show), and inside `out`, a chunk of exactly 32 f32.
    unsafe {
        let zero = W::splat(0.0);
        for (block, out) in src.chunks_exact(22).zip(dst.chunks_exact_mut(32)) {
            let p = block.as_ptr();
            let d = W::splat_f16(f16_bits(p));
            let q = _mm256_or_si256(nibbles32(p.add(6)), fifth_bits32(p.add(2)));
            let q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
            store32::<W, MUL>(out.as_mut_ptr(), q, d, zero);
        }
    }
}

/// Q5_1 blocks: `q·d + m`.
///
/// # Safety
/// As [`q8_0`], for Q5_1 blocks.
#[inline(always)]
unsafe fn q5_1<W: Widen>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). Every pointer
    // below stays inside `block`, a chunk of exactly 24 bytes (the loads read at most
    // its last byte, as the offsets show), and inside `out`, a chunk of exactly 32 f32.
    unsafe {
        for (block, out) in src.chunks_exact(24).zip(dst.chunks_exact_mut(32)) {
            let p = block.as_ptr();
            let (d, m) = (W::splat_f16(f16_bits(p)), W::splat_f16(f16_bits(p.add(2))));
            let q = _mm256_or_si256(nibbles32(p.add(8)), fifth_bits32(p.add(4)));
            store32::<W, ADD>(out.as_mut_ptr(), q, d, m);
        }
    }
}

/// Q4_K (`FIFTH = false`) and Q5_K (`FIFTH = true`) blocks: sub-block `s` is
/// `(d·sc)·q − dmin·mn`, the two products rounded to f32 first as the reference does.
///
/// # Safety
/// As [`q8_0`], for Q4_K or Q5_K blocks.
#[inline(always)]
unsafe fn k_quant_4_5<W: Widen, const FIFTH: bool>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). Every pointer
    // below stays inside `block`, a chunk of exactly 144 (Q4_K) or 176 (Q5_K) bytes: the
    // 32-byte loads start at 16 (Q5_K's fifth bits) and at `qs_at + 32·c ≤ qs_at + 96`, so
    // they end at 144 or 176; the stores write sub-block `s < 8` of `out`, 256 f32.
    unsafe {
        let bytes = if FIFTH { 176 } else { 144 };
        let qs_at = if FIFTH { 48 } else { 16 };
        let m4 = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        for (block, out) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(256)) {
            let p = block.as_ptr();
            let d = W::splat_f16(f16_bits(p));
            let dmin = W::splat_f16(f16_bits(p.add(2)));
            let scales = &block[4..16];
            // Bit s of qh[l] is the fifth bit of element l of sub-block s; shifted right by 2
            // after each pair of sub-blocks (bits never cross a byte: each is masked to bit 0).
            let mut qh = if FIFTH {
                _mm256_loadu_si256(p.add(16).cast())
            } else {
                _mm256_setzero_si256()
            };
            for c in 0..4 {
                let v = _mm256_loadu_si256(p.add(qs_at + 32 * c).cast());
                let mut lo = _mm256_and_si256(v, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                if FIFTH {
                    let b0 = _mm256_and_si256(qh, one);
                    let b1 = _mm256_and_si256(_mm256_srli_epi16::<1>(qh), one);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(b0));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(b1));
                    qh = _mm256_srli_epi16::<2>(qh);
                }
                for (s, q) in [(2 * c, lo), (2 * c + 1, hi)] {
                    let (sc, mn) = k_scale_min(scales, s);
                    let ds = W::mul(d, W::splat(f32::from(sc)));
                    let dm = W::mul(dmin, W::splat(f32::from(mn)));
                    store32::<W, SUB>(out.as_mut_ptr().add(32 * s), q, ds, dm);
                }
            }
        }
    }
}

/// Bits 0-1 of each byte of `v` moved to bits 4-5 (the rest cleared).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn two_bits_up(v: __m256i) -> __m256i {
    // SAFETY: the caller has the CPU features (this function's contract); these intrinsics only
    // compute on registers.
    unsafe { _mm256_slli_epi16::<4>(_mm256_and_si256(v, _mm256_set1_epi8(3))) }
}

/// Q6_K blocks: `(d·sc)·(q − 32)`, one i8 scale per 16 values.
///
/// # Safety
/// As [`q8_0`], for Q6_K blocks.
#[inline(always)]
unsafe fn q6_k<W: Widen>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). Every pointer
    // below stays inside `block`, a chunk of exactly 210 bytes (the loads read at most
    // its last byte, as the offsets show), and inside `out`, a chunk of exactly 256 f32.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let c32 = _mm256_set1_epi8(32);
        let zero = W::splat(0.0);
        for (block, out) in src.chunks_exact(210).zip(dst.chunks_exact_mut(256)) {
            let p = block.as_ptr();
            let d = W::splat_f16(f16_bits(p.add(208)));
            for h in 0..2 {
                let ql0 = _mm256_loadu_si256(p.add(64 * h).cast());
                let ql1 = _mm256_loadu_si256(p.add(64 * h + 32).cast());
                let qh = _mm256_loadu_si256(p.add(128 + 32 * h).cast());
                // Group g (values 32g..32g+32 of the half): the low or high nibbles of ql0 or
                // ql1, and bits 2g, 2g+1 of qh as bits 4-5.
                let groups = [
                    (_mm256_and_si256(ql0, m4), two_bits_up(qh)),
                    (
                        _mm256_and_si256(ql1, m4),
                        two_bits_up(_mm256_srli_epi16::<2>(qh)),
                    ),
                    (
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        two_bits_up(_mm256_srli_epi16::<4>(qh)),
                    ),
                    (
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        two_bits_up(_mm256_srli_epi16::<6>(qh)),
                    ),
                ];
                for (g, (low, hi2)) in groups.into_iter().enumerate() {
                    let q = _mm256_sub_epi8(_mm256_or_si256(low, hi2), c32);
                    let i = 128 * h + 32 * g;
                    let s0 = W::mul(d, W::splat(f32::from(block[192 + i / 16] as i8)));
                    let s1 = W::mul(d, W::splat(f32::from(block[193 + i / 16] as i8)));
                    let o = out.as_mut_ptr().add(i);
                    W::store16::<MUL>(o, _mm256_castsi256_si128(q), s0, zero);
                    W::store16::<MUL>(o.add(16), _mm256_extracti128_si256::<1>(q), s1, zero);
                }
            }
        }
    }
}

/// Q2_K blocks: `(d·sc)·q − dmin·mn`, a 4-bit scale and minimum per 16 values.
///
/// # Safety
/// As [`q8_0`], for Q2_K blocks.
#[inline(always)]
unsafe fn q2_k<W: Widen>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). `q2k_half` and the
    // scale reads stay inside `block`, a chunk of exactly 84 bytes, and the stores write
    // sub-block `s + t < 16` of `out`, a chunk of exactly 256 f32.
    unsafe {
        for (block, out) in src.chunks_exact(84).zip(dst.chunks_exact_mut(256)) {
            let p = block.as_ptr();
            let d = W::splat_f16(f16_bits(p.add(80)));
            let dmin = W::splat_f16(f16_bits(p.add(82)));
            for h in 0..2 {
                for (j, q) in q2k_half(p, h).into_iter().enumerate() {
                    let s = 2 * (4 * h + j);
                    let halves = [_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q)];
                    for (t, b) in halves.into_iter().enumerate() {
                        let sc = block[s + t];
                        let dl = W::mul(d, W::splat(f32::from(sc & 0x0F)));
                        let ml = W::mul(dmin, W::splat(f32::from(sc >> 4)));
                        W::store16::<SUB>(out.as_mut_ptr().add(16 * (s + t)), b, dl, ml);
                    }
                }
            }
        }
    }
}

/// Q3_K blocks: `(d·(sc − 32))·q`, one 6-bit scale per 16 values.
///
/// # Safety
/// As [`q8_0`], for Q3_K blocks.
#[inline(always)]
unsafe fn q3_k<W: Widen>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). `q3k_half` reads
    // inside `block`, a chunk of exactly 110 bytes, and the stores write half-group
    // `2(4h + j) + t < 16` of `out`, a chunk of exactly 256 f32.
    unsafe {
        let zero = W::splat(0.0);
        for (block, out) in src.chunks_exact(110).zip(dst.chunks_exact_mut(256)) {
            let p = block.as_ptr();
            let d = W::splat_f16(f16_bits(p.add(108)));
            let scale = |s: usize| {
                let sc = q3_k_scale(&block[96..108], s) as i8 - 32;
                W::mul(d, W::splat(f32::from(sc)))
            };
            for h in 0..2 {
                for (j, q) in q3k_half(p, h).into_iter().enumerate() {
                    let s = 2 * (4 * h + j);
                    let o = out.as_mut_ptr().add(16 * s);
                    W::store16::<MUL>(o, _mm256_castsi256_si128(q), scale(s), zero);
                    let hi = _mm256_extracti128_si256::<1>(q);
                    W::store16::<MUL>(o.add(16), hi, scale(s + 1), zero);
                }
            }
        }
    }
}

/// IQ4_NL blocks: `d·T[q]`.
///
/// # Safety
/// As [`q8_0`], for IQ4_NL blocks.
#[inline(always)]
unsafe fn iq4_nl<W: Widen>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). Every pointer
    // below stays inside `block`, a chunk of exactly 18 bytes (the load reads bytes 2–17),
    // and inside `out`, a chunk of exactly 32 f32.
    unsafe {
        let zero = W::splat(0.0);
        for (block, out) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
            let p = block.as_ptr();
            let d = W::splat_f16(f16_bits(p));
            let q = iq4_lookup(nibbles32(p.add(2)));
            store32::<W, MUL>(out.as_mut_ptr(), q, d, zero);
        }
    }
}

/// IQ4_XS blocks: `(d·(sc − 32))·T[q]`, one 6-bit scale per 32 values.
///
/// # Safety
/// As [`q8_0`], for IQ4_XS blocks.
#[inline(always)]
unsafe fn iq4_xs<W: Widen>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract). Every pointer
    // below stays inside `block`, a chunk of exactly 136 bytes (the loads read bytes
    // `8 + 16s..24 + 16s` for `s < 8`), and inside `out`, a chunk of exactly 256 f32.
    unsafe {
        let zero = W::splat(0.0);
        for (block, out) in src.chunks_exact(136).zip(dst.chunks_exact_mut(256)) {
            let p = block.as_ptr();
            let d = W::splat_f16(f16_bits(p));
            for s in 0..8 {
                let sc = iq4_xs_scale(block, s) as i8 - 32;
                let ds = W::mul(d, W::splat(f32::from(sc)));
                let q = iq4_lookup(nibbles32(p.add(8 + 16 * s)));
                store32::<W, MUL>(out.as_mut_ptr().add(32 * s), q, ds, zero);
            }
        }
    }
}

/// Decodes `src`, whole blocks of `format`, into `dst` with the 16-lane step `W`.
///
/// # Safety
/// The CPU must have AVX2, F16C and `W`'s features. `src` should be exactly the blocks of
/// `dst.len()` values (`format.elems_in(src.len()) == dst.len()`); other lengths decode
/// only the blocks both hold, without touching memory outside either slice.
#[inline(always)]
unsafe fn run<W: Widen>(format: QuantFormat, src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller has the CPU features (this function's contract), which is all the
    // per-format loops ask: they walk whole chunks of both slices.
    unsafe {
        debug_assert_eq!(format.elems_in(src.len()).ok(), Some(dst.len()));
        match format {
            QuantFormat::Q8_0 => q8_0::<W>(src, dst),
            QuantFormat::Q4_0 => q4_0::<W>(src, dst),
            QuantFormat::Q4_1 => q4_1::<W>(src, dst),
            QuantFormat::Q5_0 => q5_0::<W>(src, dst),
            QuantFormat::Q5_1 => q5_1::<W>(src, dst),
            QuantFormat::Q4_K => k_quant_4_5::<W, false>(src, dst),
            QuantFormat::Q5_K => k_quant_4_5::<W, true>(src, dst),
            QuantFormat::Q6_K => q6_k::<W>(src, dst),
            QuantFormat::Q2_K => q2_k::<W>(src, dst),
            QuantFormat::Q3_K => q3_k::<W>(src, dst),
            QuantFormat::IQ4_NL => iq4_nl::<W>(src, dst),
            QuantFormat::IQ4_XS => iq4_xs::<W>(src, dst),
            // One AVX2 decoder for the lattice and ternary formats, whatever `W`.
            _ => super::frame::dequantize_lattice(format, src, dst),
        }
    }
}

/// Decodes `src`, whole blocks of `format`, into `dst` with AVX2: bit for bit what
/// `QuantFormat::dequantize_scalar` writes.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C ([`crate::simd::Isa::avx2_fma_f16c`]).
/// `format.elems_in(src.len())` should equal `Ok(dst.len())`, else only the blocks both
/// slices hold are written (memory outside them is never touched).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dequantize(format: QuantFormat, src: &[u8], dst: &mut [f32]) {
    // SAFETY: this function enables AVX2, FMA and F16C, the features `Avx2` and the loops
    // need; the loops take whole chunks of both slices, so any lengths stay in bounds.
    unsafe { run::<Avx2>(format, src, dst) }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{any_blocks, Rng};
    use super::super::QuantFormat;

    /// xorshift64*.
    /// The AVX2 decoders match the scalar ones bit for bit (called directly, so this runs
    /// under `QKV_ISA=scalar` too).
    #[test]
    fn simd_decoders_match_the_scalar_reference_bit_for_bit() {
        if !crate::simd::Isa::detect().avx2_fma_f16c {
            return;
        }
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for format in QuantFormat::ALL {
            // Under Miri, which interprets every lane, a few blocks (the loops are per block).
            let ns: &[usize] = if cfg!(miri) {
                &[1, 3]
            } else {
                &[1, 2, 3, 5, 8, 13, 64, 100]
            };
            for &n in ns {
                let src = any_blocks(format, n, &mut rng);
                let len = n * format.block_elems();
                let mut want = vec![f32::NAN; len];
                format.dequantize_scalar(&src, &mut want).unwrap();
                let mut got = vec![f32::NAN; len];
                // SAFETY: the features were checked above; src holds len values' blocks.
                unsafe { super::dequantize(format, &src, &mut got) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "AVX2 {format}, {n} blocks");
            }
        }
    }
}
