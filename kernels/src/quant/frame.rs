//! The frame the quantized SIMD kernels share, GEMV ([`super::gemv`]) and GEMM
//! ([`super::gemm`]) alike: the per-chunk scratch of scales ([`Chunk`]), each block
//! format's layout and scale decoding ([`Format`], one type per format), and how a block is
//! unpacked into groups of 32 16-bit integers ([`Unpack`]) handed to a [`Sink`].
//!
//! A row of `W` is taken in chunks of up to [`CHUNK`] groups of 32; the kernels decode a
//! chunk's scales once, then unpack each group once and meet it with their rows of `xq`.

mod lattice;
mod unpack;

pub(in crate::quant) use lattice::dequantize as dequantize_lattice;
pub(in crate::quant) use lattice::{IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS};
pub(in crate::quant) use lattice::{TQ1_0, TQ2_0};

pub(in crate::quant) use unpack::{
    bit_bytes, bytes, iq4_lookup, k_pair, nibble_bytes, q2k_half, q3k_half, q6k_half, W2,
};

use core::arch::x86_64::*;

/// Groups of 32 weights per chunk of scales: 2048 elements, 8 K-format super-blocks.
pub(in crate::quant) const CHUNK: usize = 64;

/// Rows of `x` that share one unpacking of a weight group.
pub(in crate::quant) const ROWS: usize = 4;

/// Per-chunk scratch: weight scales, their products with the activation scales, and the
/// f16 bits they are widened from.
pub(in crate::quant) struct Chunk {
    /// Weight scale per group (per half-group of 16 for Q6_K and Q3_K).
    pub(in crate::quant) a: [f32; 2 * CHUNK],
    /// Additive constant per group (per half-group of 16 for Q2_K).
    pub(in crate::quant) c: [f32; 2 * CHUNK],
    /// f16 bits of the scales and minimums of the 32-element formats.
    pub(in crate::quant) bits_a: [u16; CHUNK],
    pub(in crate::quant) bits_c: [u16; CHUNK],
    /// `xs·a` per row of the pass and group (half-group for Q6_K).
    pub(in crate::quant) s: [[f32; 2 * CHUNK]; ROWS],
}

impl Chunk {
    pub(in crate::quant) fn new() -> Self {
        Chunk {
            a: [0.0; 2 * CHUNK],
            c: [0.0; 2 * CHUNK],
            bits_a: [0; CHUNK],
            bits_c: [0; CHUNK],
            s: [[0.0; 2 * CHUNK]; ROWS],
        }
    }
}

/// A block format's layout facts and its scale decoding.
pub(in crate::quant) trait Format {
    /// Elements per block.
    const BE: usize;
    /// Bytes per block.
    const BB: usize;
    /// Two scales per group (one per 16): Q6_K and Q3_K.
    const HALVES: bool = false;
    /// A nonzero additive constant per group (Q4_1, Q5_1, Q4_K, Q5_K).
    const MIN: bool;
    /// A nonzero additive constant per half-group of 16 instead (Q2_K, with [`Self::HALVES`]):
    /// `ch.c` then holds two per group, each met by `xs·Σxq` of its 16 activations.
    const MIN16: bool = false;

    /// Decodes the scales of the `nb` blocks at `p` into `ch.a` and (if [`Self::MIN`] or
    /// [`Self::MIN16`]) `ch.c`, in group (or half-group) order.
    ///
    /// # Safety
    /// `p` points to `nb` whole blocks, `nb·BE ≤ 32·CHUNK`; the CPU has AVX2 and F16C.
    unsafe fn scales(p: *const u8, nb: usize, ch: &mut Chunk);
}

/// Receives a block's unpacked groups (a trait rather than a closure so that it is always
/// inlined into the `#[target_feature]` kernel).
pub(in crate::quant) trait Sink<W> {
    /// Takes group `g` of the current block; `odd` picks one of two accumulators (a
    /// constant at each call site, so the choice costs nothing).
    ///
    /// # Safety
    /// As the kernel that calls it: the CPU has the features of `W`'s
    /// [`Isa`](super::gemv::avx2::Isa).
    unsafe fn group(&mut self, g: usize, odd: bool, w: W);
}

/// How a format's block is unpacked into groups of 32 16-bit integers of type `W`.
pub(in crate::quant) trait Unpack<W>: Format {
    /// Hands every group of the block at `p` to `sink`, in order.
    ///
    /// # Safety
    /// `p` points to one whole block; the CPU has the features of `W`'s
    /// [`Isa`](super::gemv::avx2::Isa).
    unsafe fn block(p: *const u8, sink: &mut impl Sink<W>);
}

/// The little-endian u16 at `p`.
///
/// # Safety
/// `p..p + 2` must be readable.
#[inline(always)]
pub(in crate::quant) unsafe fn u16_at(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees 2 readable bytes at `p`; the read is unaligned.
    unsafe { u16::from_le((p as *const u16).read_unaligned()) }
}

/// The little-endian u32 at `p`.
///
/// # Safety
/// `p..p + 4` must be readable.
#[inline(always)]
pub(in crate::quant) unsafe fn u32_at(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees 4 readable bytes at `p`; the read is unaligned.
    unsafe { u32::from_le((p as *const u32).read_unaligned()) }
}

/// Scales of the 32-element formats: the f16 `d` at offset 0 of each block and, with `min`,
/// the f16 `m` at offset 2, gathered and widened 8 at a time.
///
/// # Safety
/// `p` points to `nb ≤ CHUNK` blocks of `bb` bytes; AVX2 and F16C.
#[inline(always)]
unsafe fn scales32(p: *const u8, nb: usize, bb: usize, min: bool, ch: &mut Chunk) {
    // SAFETY: the caller guarantees `nb ≤ CHUNK` blocks of `bb` bytes at `p` and AVX2 and
    // F16C (this function's contract). The f16 fields read are at offsets 0 and 2 of a block.
    // The vector loop reads and writes 8 entries at `t < nb`, `t` a multiple of 8, so
    // `t + 8 ≤ CHUNK` (CHUNK is a multiple of 8) keeps it inside the `Chunk` arrays.
    unsafe {
        for b in 0..nb {
            ch.bits_a[b] = u16_at(p.add(b * bb));
            if min {
                ch.bits_c[b] = u16_at(p.add(b * bb + 2));
            }
        }
        // Whole vectors of 8: t + 8 ≤ CHUNK, entries past nb are stale and never used.
        let mut t = 0;
        while t < nb {
            let d = _mm_loadu_si128(ch.bits_a.as_ptr().add(t) as *const __m128i);
            _mm256_storeu_ps(ch.a.as_mut_ptr().add(t), _mm256_cvtph_ps(d));
            if min {
                let m = _mm_loadu_si128(ch.bits_c.as_ptr().add(t) as *const __m128i);
                _mm256_storeu_ps(ch.c.as_mut_ptr().add(t), _mm256_cvtph_ps(m));
            }
            t += 8;
        }
    }
}

/// One Q4_K or Q5_K super-block's scales: `a = d·sc` and `c = −dmin·mn` for its 8
/// sub-blocks, the 6-bit fields unpacked 4 at a time in 32-bit words.
///
/// # Safety
/// `q` points to one block (at least 16 readable bytes); AVX2 and F16C.
#[inline(always)]
pub(in crate::quant) unsafe fn k45_scales(q: *const u8) -> (__m256, __m256) {
    // SAFETY: the caller guarantees AVX2, F16C and bytes 0–15 of a block at `q`, which are
    // all that is read.
    unsafe {
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(u32_at(q) as i32));
        let d = _mm256_broadcastss_ps(dm);
        let neg_dmin = _mm256_broadcastss_ps(_mm_sub_ps(_mm_setzero_ps(), _mm_movehdup_ps(dm)));
        let (w0, w1, w2) = (u32_at(q.add(4)), u32_at(q.add(8)), u32_at(q.add(12)));
        // Bytes 0–3: low 6 bits of sub-blocks 0–3; sub-blocks 4–7 take their low 4 bits from
        // bytes 8–11 and their top 2 from the top bits of bytes 0–3 (scales) or 4–7
        // (minimums). Shifting whole words moves no bit across the masked fields.
        let sc_hi = (w2 & 0x0F0F_0F0F) | ((w0 >> 2) & 0x3030_3030);
        let mn_hi = ((w2 >> 4) & 0x0F0F_0F0F) | ((w1 >> 2) & 0x3030_3030);
        let sc = u64::from(w0 & 0x3F3F_3F3F) | (u64::from(sc_hi) << 32);
        let mn = u64::from(w1 & 0x3F3F_3F3F) | (u64::from(mn_hi) << 32);
        let scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64)));
        let mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64)));
        (_mm256_mul_ps(d, scf), _mm256_mul_ps(neg_dmin, mnf))
    }
}

/// Scales of Q4_K and Q5_K ([`k45_scales`]) for `nb` super-blocks, in group order.
///
/// # Safety
/// `p` points to `nb ≤ CHUNK / 8` blocks of `bb` bytes; AVX2 and F16C.
#[inline(always)]
unsafe fn scales_k45(p: *const u8, nb: usize, bb: usize, ch: &mut Chunk) {
    // SAFETY: the caller guarantees `nb ≤ CHUNK / 8` blocks of `bb ≥ 16` bytes at `p` and
    // AVX2 and F16C; the stores write 8 entries at `8b < CHUNK` of `ch.a` (2·CHUNK entries)
    // and `ch.c` (CHUNK entries).
    unsafe {
        for b in 0..nb {
            let (a, c) = k45_scales(p.add(b * bb));
            _mm256_storeu_ps(ch.a.as_mut_ptr().add(8 * b), a);
            _mm256_storeu_ps(ch.c.as_mut_ptr().add(8 * b), c);
        }
    }
}

/// One Q6_K super-block's scales `d·sc` for its 16 half-groups, 8 per vector.
///
/// # Safety
/// `q` points to one block of 210 bytes; AVX2 and F16C.
#[inline(always)]
pub(in crate::quant) unsafe fn q6k_scales(q: *const u8) -> [__m256; 2] {
    // SAFETY: the caller guarantees AVX2, F16C and a whole block at `q`; the reads are bytes
    // 192–207 and 208–209.
    unsafe {
        let d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16_at(
            q.add(208),
        )))));
        let sc0 = _mm_loadl_epi64(q.add(192) as *const __m128i);
        let sc1 = _mm_loadl_epi64(q.add(200) as *const __m128i);
        [
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc0))),
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc1))),
        ]
    }
}

/// Scales of Q6_K ([`q6k_scales`]) for `nb` super-blocks, in half-group order.
///
/// # Safety
/// `p` points to `nb ≤ CHUNK / 8` blocks of 210 bytes; AVX2 and F16C.
#[inline(always)]
unsafe fn scales_q6k(p: *const u8, nb: usize, ch: &mut Chunk) {
    // SAFETY: the caller guarantees `nb ≤ CHUNK / 8` blocks of 210 bytes at `p` and AVX2
    // and F16C; the stores write 8 entries at `16b + 8h < 2·CHUNK` of `ch.a`.
    unsafe {
        for b in 0..nb {
            let [a0, a1] = q6k_scales(p.add(b * 210));
            _mm256_storeu_ps(ch.a.as_mut_ptr().add(16 * b), a0);
            _mm256_storeu_ps(ch.a.as_mut_ptr().add(16 * b + 8), a1);
        }
    }
}

/// Eight bytes of `v` (each 0..63, the stored 6-bit scales) less 32, widened to f32 and
/// times `d`.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn signed6_times(v: u64, d: __m256) -> __m256 {
    // SAFETY: the caller has AVX2 (this function's contract); registers only.
    unsafe {
        let s = _mm_sub_epi8(_mm_cvtsi64_si128(v as i64), _mm_set1_epi8(32));
        _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)))
    }
}

/// One Q3_K super-block's scales `d·(sc − 32)` for its 16 half-groups, 8 per vector.
///
/// # Safety
/// `q` points to one block of 110 bytes; AVX2 and F16C.
#[inline(always)]
pub(in crate::quant) unsafe fn q3k_scales(q: *const u8) -> [__m256; 2] {
    // SAFETY: the caller guarantees AVX2, F16C and a whole block at `q`; the reads are bytes
    // 96–107 (the packed scales) and 108–109 (`d`).
    unsafe {
        let d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16_at(
            q.add(108),
        )))));
        let (w0, w1, w2) = (u32_at(q.add(96)), u32_at(q.add(100)), u32_at(q.add(104)));
        // Scales 0–7 take the low nibbles of bytes 0–7, 8–15 their high nibbles; bits
        // 2t, 2t+1 of byte 8 + u are the top bits of scale 4t + u, so word 2 shifted by 2t
        // gives the top bits of scales 4t..4t+4 at the bottom of each byte.
        let top = |t: u32| ((w2 >> (2 * t)) & 0x0303_0303) << 4;
        let low =
            u64::from((w0 & 0x0F0F_0F0F) | top(0)) | (u64::from((w1 & 0x0F0F_0F0F) | top(1)) << 32);
        let high = u64::from(((w0 >> 4) & 0x0F0F_0F0F) | top(2))
            | (u64::from(((w1 >> 4) & 0x0F0F_0F0F) | top(3)) << 32);
        [signed6_times(low, d), signed6_times(high, d)]
    }
}

/// Scales of Q3_K ([`q3k_scales`]) for `nb` super-blocks, in half-group order.
///
/// # Safety
/// `p` points to `nb ≤ CHUNK / 8` blocks of 110 bytes; AVX2 and F16C.
#[inline(always)]
unsafe fn scales_q3k(p: *const u8, nb: usize, ch: &mut Chunk) {
    // SAFETY: the caller guarantees `nb ≤ CHUNK / 8` blocks of 110 bytes at `p` and AVX2
    // and F16C; the stores write 8 entries at `16b + 8h < 2·CHUNK` of `ch.a`.
    unsafe {
        for b in 0..nb {
            let [a0, a1] = q3k_scales(p.add(b * 110));
            _mm256_storeu_ps(ch.a.as_mut_ptr().add(16 * b), a0);
            _mm256_storeu_ps(ch.a.as_mut_ptr().add(16 * b + 8), a1);
        }
    }
}

/// One IQ4_XS super-block's scales `d·(sc − 32)` for its 8 groups.
///
/// # Safety
/// `q` points to one block (at least 8 readable bytes); AVX2 and F16C.
#[inline(always)]
pub(in crate::quant) unsafe fn iq4xs_scales(q: *const u8) -> __m256 {
    // SAFETY: the caller guarantees AVX2, F16C and bytes 0–7 of a block at `q`, which are
    // all that is read.
    unsafe {
        let d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16_at(q)))));
        let (high, low) = (u32::from(u16_at(q.add(2))), u32_at(q.add(4)));
        // Scale s: nibble s of the 4 low-bit bytes read as one word, bits 2s, 2s+1 of the
        // high-bit half-word on top.
        let mut v = 0u64;
        for s in 0..8 {
            let sc = ((low >> (4 * s)) & 0x0F) | (((high >> (2 * s)) & 3) << 4);
            v |= u64::from(sc) << (8 * s);
        }
        signed6_times(v, d)
    }
}

/// Scales of IQ4_XS ([`iq4xs_scales`]) for `nb` super-blocks, in group order.
///
/// # Safety
/// `p` points to `nb ≤ CHUNK / 8` blocks of 136 bytes; AVX2 and F16C.
#[inline(always)]
unsafe fn scales_iq4xs(p: *const u8, nb: usize, ch: &mut Chunk) {
    // SAFETY: the caller guarantees `nb ≤ CHUNK / 8` blocks of 136 bytes at `p` and AVX2
    // and F16C; the stores write 8 entries at `8b < CHUNK` of `ch.a`.
    unsafe {
        for b in 0..nb {
            _mm256_storeu_ps(ch.a.as_mut_ptr().add(8 * b), iq4xs_scales(p.add(b * 136)));
        }
    }
}

/// Scales of Q2_K for `nb` super-blocks, in half-group order: `a = d·sc` into `ch.a` and
/// `c = −dmin·mn` into `ch.c`, from the 16 bytes of 4-bit scales (low nibbles) and minimums
/// (high nibbles), 8 at a time.
///
/// # Safety
/// `p` points to `nb ≤ CHUNK / 8` blocks of 84 bytes; AVX2 and F16C.
#[inline(always)]
unsafe fn scales_q2k(p: *const u8, nb: usize, ch: &mut Chunk) {
    // SAFETY: the caller guarantees `nb ≤ CHUNK / 8` blocks of 84 bytes at `p` and AVX2 and
    // F16C; the reads are bytes 0–15 and 80–83 of each block, the stores write 8 entries at
    // `16b + 8t < 2·CHUNK` of `ch.a` and `ch.c`.
    unsafe {
        for b in 0..nb {
            let q = p.add(b * 84);
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(u32_at(q.add(80)) as i32));
            let d = _mm256_broadcastss_ps(dm);
            let neg_dmin = _mm256_broadcastss_ps(_mm_sub_ps(_mm_setzero_ps(), _mm_movehdup_ps(dm)));
            let v = _mm_loadu_si128(q as *const __m128i);
            let sc = _mm_and_si128(v, _mm_set1_epi8(0x0F));
            let mn = _mm_and_si128(_mm_srli_epi16::<4>(v), _mm_set1_epi8(0x0F));
            for (t, (s, m)) in [(sc, mn), (_mm_srli_si128::<8>(sc), _mm_srli_si128::<8>(mn))]
                .into_iter()
                .enumerate()
            {
                let sf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(s));
                let mf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m));
                let at = 16 * b + 8 * t;
                _mm256_storeu_ps(ch.a.as_mut_ptr().add(at), _mm256_mul_ps(d, sf));
                _mm256_storeu_ps(ch.c.as_mut_ptr().add(at), _mm256_mul_ps(neg_dmin, mf));
            }
        }
    }
}

/// The Q2_K layout (by hand rather than by `layout!`: its constants are per 16).
#[allow(non_camel_case_types)]
pub(in crate::quant) struct Q2_K;

impl Format for Q2_K {
    const BE: usize = 256;
    const BB: usize = 84;
    const HALVES: bool = true;
    const MIN: bool = false;
    const MIN16: bool = true;
    #[inline(always)]
    unsafe fn scales(p: *const u8, nb: usize, ch: &mut Chunk) {
        // SAFETY: the trait's contract is `scales_q2k`'s.
        unsafe { scales_q2k(p, nb, ch) }
    }
}

/// The sums of every 16 integers of `q`: what [`QuantizedActs::isum16`] holds when
/// `quantize` fills it, for the kernels of formats with a constant per 16 when it is empty.
///
/// [`QuantizedActs::isum16`]: crate::quant::act::QuantizedActs::isum16
pub(in crate::quant) fn half_sums(q: &[i16]) -> Vec<i32> {
    q.chunks_exact(16)
        .map(|h| h.iter().map(|&v| i32::from(v)).sum())
        .collect()
}

macro_rules! layout {
    ($name:ident, $be:expr, $bb:expr, min = $min:expr, halves = $halves:expr, |$p:ident, $nb:ident, $ch:ident| $scales:expr) => {
        #[doc = concat!("The ", stringify!($name), " layout.")]
        #[allow(non_camel_case_types)]
        pub(in crate::quant) struct $name;
        impl Format for $name {
            const BE: usize = $be;
            const BB: usize = $bb;
            const MIN: bool = $min;
            const HALVES: bool = $halves;
            #[inline(always)]
            unsafe fn scales($p: *const u8, $nb: usize, $ch: &mut Chunk) {
                // SAFETY: the trait's contract (`nb` whole blocks at `p`, AVX2 and F16C) is
                // the contract of the scale decoder it forwards to.
                unsafe { $scales }
            }
        }
    };
}

layout!(Q8_0, 32, 34, min = false, halves = false, |p, nb, ch| {
    scales32(p, nb, 34, false, ch)
});
layout!(Q4_0, 32, 18, min = false, halves = false, |p, nb, ch| {
    scales32(p, nb, 18, false, ch)
});
layout!(Q4_1, 32, 20, min = true, halves = false, |p, nb, ch| {
    scales32(p, nb, 20, true, ch)
});
layout!(Q5_0, 32, 22, min = false, halves = false, |p, nb, ch| {
    scales32(p, nb, 22, false, ch)
});
layout!(Q5_1, 32, 24, min = true, halves = false, |p, nb, ch| {
    scales32(p, nb, 24, true, ch)
});
layout!(Q4_K, 256, 144, min = true, halves = false, |p, nb, ch| {
    scales_k45(p, nb, 144, ch)
});
layout!(Q5_K, 256, 176, min = true, halves = false, |p, nb, ch| {
    scales_k45(p, nb, 176, ch)
});
layout!(Q6_K, 256, 210, min = false, halves = true, |p, nb, ch| {
    scales_q6k(p, nb, ch)
});
layout!(Q3_K, 256, 110, min = false, halves = true, |p, nb, ch| {
    scales_q3k(p, nb, ch)
});
layout!(IQ4_NL, 32, 18, min = false, halves = false, |p, nb, ch| {
    scales32(p, nb, 18, false, ch)
});
layout!(
    IQ4_XS,
    256,
    136,
    min = false,
    halves = false,
    |p, nb, ch| scales_iq4xs(p, nb, ch)
);
