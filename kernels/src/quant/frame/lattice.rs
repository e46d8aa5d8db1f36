//! The lattice (IQ1, IQ2, IQ3) and ternary (TQ1_0, TQ2_0) formats on the frame: each group
//! of 32 becomes 32 signed bytes ([`Lattice::bytes`]) — grid points looked up and signed,
//! IQ1's shifts folded in as `q = 8v ± 1` — widened for whichever kernel takes it (the
//! 256-bit and 512-bit GEMVs, the VNNI GEMM), with the scales of [`blocks::iq`] per group
//! (per half-group for IQ2_XS, IQ2_S and IQ1_M). The AVX2 dequantization ([`dequantize`])
//! multiplies the same bytes by the same scales, as the scalar decoders do.
//!
//! The grid lookups are scalar loads assembled into vectors (4 points of 8 bytes, or 8 of
//! 4); the signs become byte masks with [`bit_bytes`] and negate by `(v ^ m) − m`.
//!
//! [`blocks::iq`]: crate::quant::blocks::iq

use super::{bit_bytes, bytes, u16_at, u32_at, Chunk, Format, Sink, Unpack, W2};
use crate::quant::blocks::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS};
use crate::quant::blocks::grids::{IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::blocks::iq::{scales, tq1_digit};
use crate::quant::QuantFormat;
use core::arch::x86_64::*;

/// A lattice or ternary format: its 256-element block's groups as signed bytes.
pub(in crate::quant) trait Lattice {
    /// The format.
    const FORMAT: QuantFormat;
    /// Bytes per block.
    const BB: usize;
    /// One scale per 16 rather than per 32.
    const HALVES: bool;

    /// The 32 integers of group `g` (< 8) of the block at `p`, as signed bytes.
    ///
    /// # Safety
    /// `p` points to one whole block; the CPU has AVX2.
    unsafe fn bytes(p: *const u8, g: usize) -> __m256i;
}

/// `v` negated in the bytes where bit `e` of `signs` is set.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn signed(v: __m256i, signs: u32) -> __m256i {
    // SAFETY: the caller has AVX2 (this function's contract); registers only.
    unsafe {
        let m = bit_bytes(signs);
        _mm256_sub_epi8(_mm256_xor_si256(v, m), m)
    }
}

/// The 32 sign bits of four 7-bit [`KSIGNS`] indices, at bits `0, 7, 14, 21` of `aux`.
#[inline(always)]
fn ksigns4(aux: u32) -> u32 {
    (0..4).fold(0, |s, l| {
        s | (u32::from(KSIGNS[((aux >> (7 * l)) & 0x7F) as usize]) << (8 * l))
    })
}

/// Four grid points of 8 bytes, in order.
///
/// # Safety
/// The CPU has AVX.
#[inline(always)]
unsafe fn points8(p: [u64; 4]) -> __m256i {
    // SAFETY: the caller has AVX (this function's contract); registers only.
    unsafe { _mm256_set_epi64x(p[3] as i64, p[2] as i64, p[1] as i64, p[0] as i64) }
}

/// Eight grid points of 4 bytes, in order.
///
/// # Safety
/// The CPU has AVX.
#[inline(always)]
unsafe fn points4(p: [u32; 8]) -> __m256i {
    // SAFETY: the caller has AVX (this function's contract); registers only.
    unsafe {
        let w = p.map(|x| x as i32);
        _mm256_setr_epi32(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])
    }
}

/// IQ1's `8v ± 1` from grid values `v` (−1, 0, 1) and the shifts' bytes (±1).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn iq1_ints(v: __m256i, shift: __m256i) -> __m256i {
    // SAFETY: the caller has AVX2 (this function's contract); registers only.
    unsafe { _mm256_add_epi8(_mm256_sign_epi8(bytes(8), v), shift) }
}

macro_rules! lattice {
    ($name:ident, $bb:expr, halves = $halves:expr, |$p:ident, $g:ident| $body:block) => {
        #[doc = concat!("The ", stringify!($name), " layout.")]
        #[allow(non_camel_case_types)]
        pub(in crate::quant) struct $name;
        impl Lattice for $name {
            const FORMAT: QuantFormat = QuantFormat::$name;
            const BB: usize = $bb;
            const HALVES: bool = $halves;
            #[inline(always)]
            unsafe fn bytes($p: *const u8, $g: usize) -> __m256i {
                // SAFETY: the trait's contract: a whole block at `p` (every read below is
                // inside its bytes for `g < 8`, as the layouts of `blocks::iq` place them) and
                // AVX2.
                unsafe { $body }
            }
        }
        impl Format for $name {
            const BE: usize = 256;
            const BB: usize = $bb;
            const HALVES: bool = $halves;
            const MIN: bool = false;
            #[inline(always)]
            unsafe fn scales(p: *const u8, nb: usize, ch: &mut Chunk) {
                // SAFETY: the trait's contract: `nb` whole blocks at `p`, `8·nb ≤ CHUNK`.
                unsafe { lattice_scales::<$name>(p, nb, ch) }
            }
        }
        impl Unpack<W2> for $name {
            #[inline(always)]
            unsafe fn block(p: *const u8, f: &mut impl Sink<W2>) {
                // SAFETY: the trait's contract: one whole block at `p` and AVX2.
                unsafe {
                    for g in 0..8 {
                        let v = <$name as Lattice>::bytes(p, g);
                        let w = (
                            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
                            _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(v)),
                        );
                        f.group(g, g % 2 == 1, w);
                    }
                }
            }
        }
        impl Unpack<__m512i> for $name {
            #[inline(always)]
            unsafe fn block(p: *const u8, f: &mut impl Sink<__m512i>) {
                // SAFETY: the trait's contract: one whole block at `p` and AVX-512 F, BW, VL
                // (which the 256-bit byte assembly needs only AVX2 of).
                unsafe {
                    for g in 0..8 {
                        let v = <$name as Lattice>::bytes(p, g);
                        f.group(g, g % 2 == 1, _mm512_cvtepi8_epi16(v));
                    }
                }
            }
        }
    };
}

/// The scales of `nb` blocks of `L` into `ch.a`, per group (per half-group with
/// [`Lattice::HALVES`]), from the scalar decoders' [`scales`].
///
/// # Safety
/// `p` points to `nb` whole blocks of `L`, `8·nb ≤ CHUNK`.
#[inline(always)]
unsafe fn lattice_scales<L: Lattice>(p: *const u8, nb: usize, ch: &mut Chunk) {
    for b in 0..nb {
        // SAFETY: block `b < nb` lies inside the caller's blocks.
        let block = unsafe { core::slice::from_raw_parts(p.add(b * L::BB), L::BB) };
        for g in 0..8 {
            let a = scales(L::FORMAT, block, g);
            if L::HALVES {
                ch.a[16 * b + 2 * g] = a[0];
                ch.a[16 * b + 2 * g + 1] = a[1];
            } else {
                ch.a[8 * b + g] = a[0];
            }
        }
    }
}

lattice!(IQ2_XXS, 66, halves = false, |p, g| {
    let q = p.add(2 + 8 * g);
    let points = [0, 1, 2, 3].map(|l| IQ2XXS_GRID[usize::from(*q.add(l))]);
    signed(points8(points), ksigns4(u32_at(q.add(4))))
});

lattice!(IQ2_XS, 74, halves = true, |p, g| {
    let w = [0, 1, 2, 3].map(|l| u16_at(p.add(2 + 2 * (4 * g + l))));
    let points = w.map(|w| IQ2XS_GRID[usize::from(w & 0x1FF)]);
    let signs = (0..4).fold(0u32, |s, l| {
        s | (u32::from(KSIGNS[usize::from(w[l] >> 9)]) << (8 * l))
    });
    signed(points8(points), signs)
});

lattice!(IQ2_S, 82, halves = true, |p, g| {
    let qh = *p.add(66 + g);
    let points = [0, 1, 2, 3].map(|l| {
        let index = usize::from(*p.add(2 + 4 * g + l)) | (usize::from((qh >> (2 * l)) & 3) << 8);
        IQ2S_GRID[index]
    });
    signed(points8(points), u32_at(p.add(34 + 4 * g)))
});

lattice!(IQ3_XXS, 98, halves = false, |p, g| {
    let q = p.add(2 + 8 * g);
    let points = [0, 1, 2, 3, 4, 5, 6, 7].map(|l| IQ3XXS_GRID[usize::from(*q.add(l))]);
    signed(points4(points), ksigns4(u32_at(p.add(66 + 4 * g))))
});

lattice!(IQ3_S, 110, halves = false, |p, g| {
    let qh = *p.add(66 + g);
    let points = [0, 1, 2, 3, 4, 5, 6, 7]
        .map(|l| IQ3S_GRID[usize::from(*p.add(2 + 8 * g + l)) | (usize::from((qh >> l) & 1) << 8)]);
    signed(points4(points), u32_at(p.add(74 + 4 * g)))
});

lattice!(IQ1_S, 50, halves = false, |p, g| {
    let qh = u16_at(p.add(34 + 2 * g));
    let points = [0, 1, 2, 3].map(|l| {
        IQ1S_GRID[usize::from(*p.add(2 + 4 * g + l)) | (usize::from((qh >> (3 * l)) & 7) << 8)]
    });
    let shift = if qh & 0x8000 != 0 { -1 } else { 1 };
    iq1_ints(points8(points), _mm256_set1_epi8(shift))
});

lattice!(IQ1_M, 56, halves = true, |p, g| {
    let nib = [0, 1, 2, 3].map(|l| {
        let i = 4 * g + l;
        (*p.add(32 + i / 2) >> (4 * (i % 2))) & 0x0F
    });
    let points = [0, 1, 2, 3]
        .map(|l| IQ1S_GRID[usize::from(*p.add(4 * g + l)) | (usize::from(nib[l] & 7) << 8)]);
    // ±1 in every byte of a run of 8: all ones, or 1 in each byte.
    let shifts = nib.map(|n| {
        if n & 8 != 0 {
            u64::MAX
        } else {
            0x0101_0101_0101_0101
        }
    });
    iq1_ints(points8(points), points8(shifts))
});

lattice!(TQ1_0, 54, halves = false, |p, g| {
    // Base-3 digits: rare enough a format to assemble with the scalar digit rule.
    let mut q = [0i8; 32];
    for (l, v) in q.iter_mut().enumerate() {
        let e = 32 * g + l;
        let (byte, d) = match e {
            0..160 => (e % 32, e / 32),
            160..240 => (32 + e % 16, (e - 160) / 16),
            _ => (48 + e % 4, (e - 240) / 4),
        };
        *v = tq1_digit(*p.add(byte), d) as i8 - 1;
    }
    _mm256_loadu_si256(q.as_ptr() as *const __m256i)
});

lattice!(TQ2_0, 66, halves = false, |p, g| {
    let v = _mm256_loadu_si256(p.add(32 * (g / 4)) as *const __m256i);
    let shifted = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (g % 4) as i32));
    _mm256_sub_epi8(_mm256_and_si256(shifted, bytes(3)), bytes(1))
});

/// Decodes whole blocks of `L` with AVX2: the bytes of [`Lattice::bytes`] converted
/// exactly, times the scalar decoders' scales — one f32 multiply per value, as they round.
///
/// # Safety
/// The CPU has AVX2; only the blocks both slices hold are written.
#[inline(always)]
unsafe fn decode<L: Lattice>(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(L::BB).zip(dst.chunks_exact_mut(256)) {
        for g in 0..8 {
            let a = scales(L::FORMAT, block, g);
            // SAFETY: `block` is one whole block; the four stores of 8 write group `g`'s 32
            // values, inside `out`'s 256; AVX2 is the caller's.
            unsafe {
                let v = L::bytes(block.as_ptr(), g);
                let o = out.as_mut_ptr().add(32 * g);
                for (t, half) in [_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v)]
                    .into_iter()
                    .enumerate()
                {
                    let s = _mm256_set1_ps(a[t]);
                    let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(half));
                    let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(half)));
                    _mm256_storeu_ps(o.add(16 * t), _mm256_mul_ps(s, lo));
                    _mm256_storeu_ps(o.add(16 * t + 8), _mm256_mul_ps(s, hi));
                }
            }
        }
    }
}

/// Decodes whole blocks of `format`, a lattice or ternary format, with AVX2: bit for bit
/// what the scalar decoders write.
///
/// # Safety
/// The CPU has AVX2; only the blocks both slices hold are written.
#[inline(always)]
pub(in crate::quant) unsafe fn dequantize(format: QuantFormat, src: &[u8], dst: &mut [f32]) {
    // SAFETY: the caller's contract is every arm's.
    unsafe {
        match format {
            QuantFormat::IQ2_XXS => decode::<IQ2_XXS>(src, dst),
            QuantFormat::IQ2_XS => decode::<IQ2_XS>(src, dst),
            QuantFormat::IQ2_S => decode::<IQ2_S>(src, dst),
            QuantFormat::IQ3_XXS => decode::<IQ3_XXS>(src, dst),
            QuantFormat::IQ3_S => decode::<IQ3_S>(src, dst),
            QuantFormat::IQ1_S => decode::<IQ1_S>(src, dst),
            QuantFormat::IQ1_M => decode::<IQ1_M>(src, dst),
            QuantFormat::TQ1_0 => decode::<TQ1_0>(src, dst),
            QuantFormat::TQ2_0 => decode::<TQ2_0>(src, dst),
            _ => unreachable!("{format} is not a lattice or ternary format"),
        }
    }
}
