//! The lattice (IQ1, IQ2, IQ3) and ternary (TQ1_0, TQ2_0) formats, scalar: every group of 32
//! values of their 256-element blocks as 32 small integers `q` and one scale per 16, `a`,
//! with the value `a·q` (one f32 multiply) — exactly what gguf-py computes.
//!
//! Layouts (little endian; `d` an f16; groups `g < 8` of 32 elements):
//!
//! - **IQ2_XXS** (66 bytes) `d, qs[64]`: group `g` is the two u32 at `2 + 8g`: the first's
//!   4 bytes index [`IQ2XXS_GRID`] (8 values each), the second holds four 7-bit sign indices
//!   into [`KSIGNS`] (bits `7l..7l+7`) and a 4-bit scale `s` (bits 28–31):
//!   `a = (d·(0.5 + s))·0.25`.
//! - **IQ2_XS** (74) `d, qs[32] (u16), scales[8]`: u16 `4g + l` indexes [`IQ2XS_GRID`] with
//!   its low 9 bits and [`KSIGNS`] with its top 7; half `h` of group `g` has the scale of
//!   nibble `h` of `scales[g]`, as IQ2_XXS's.
//! - **IQ2_S** (82) `d, qs[32], signs[32], qh[8], scales[8]`: index `4g + l` is
//!   `qs[4g + l]` with bits `2l, 2l+1` of `qh[g]` on top, into [`IQ2S_GRID`]; the sign bits of
//!   its 8 values are `signs[4g + l]`; scales as IQ2_XS.
//! - **IQ3_XXS** (98) `d, qs[64], aux[8] (u32)`: `qs[8g..8g+8]` index [`IQ3XXS_GRID`] (4
//!   values each); `aux[g]` holds the signs of its four runs of 8 as IQ2_XXS does and a
//!   4-bit scale: `a = (d·(0.5 + s))·0.5`.
//! - **IQ3_S** (110) `d, qs[64], qh[8], signs[32], scales[4]`: index `8g + l` is
//!   `qs[8g + l]` with bit `l` of `qh[g]` as its ninth bit, into [`IQ3S_GRID`]; the signs of
//!   the group are the 32 bits of `signs[4g..4g+4]`; `a = d·(1 + 2s)` with `s` nibble `g % 2`
//!   of `scales[g / 2]`.
//! - **IQ1_S** (50) `d, qs[32], qh[8] (u16)`: index `4g + l` is `qs[4g + l]` with bits
//!   `3l..3l+3` of `qh[g]` on top, into [`IQ1S_GRID`] (values −1, 0, 1); bits 12–14 of
//!   `qh[g]` are the scale `s`, bit 15 the sign of the shift `δ = ±1/8`: the value is
//!   `(d·(2s + 1))·(v + δ)`, here `q = 8v ± 1` and `a = d·(2s + 1)/8` (the same product:
//!   dividing by 8 is exact).
//! - **IQ1_M** (56) `qs[32], qh[16], scales[4] (u16)`: index `i = 4g + l` is `qs[i]` with
//!   the low 3 bits of nibble `i % 2` of `qh[i / 2]` on top, the nibble's bit 3 the sign of
//!   its 8 values' `δ`; `d` is the f16 made of the top nibbles of the 4 scale words (word 0's
//!   lowest); half `h` of group `g` has the 3-bit scale `2g + h` (bits `3(s % 4)` of word
//!   `s / 4`), as IQ1_S's.
//! - **TQ1_0** (54) `qs[48], qh[4], d`: base-3 digits, 5 per byte of `qs`, 4 per byte of
//!   `qh`. Element `e < 160` is digit `e / 32` of byte `e % 32`, `160 ≤ e < 240` digit
//!   `(e − 160) / 16` of byte `32 + e % 16`, `e ≥ 240` digit `(e − 240) / 4` of byte
//!   `48 + e % 4`; digit `p` of byte `b` is `((b·3^p mod 256)·3) >> 8`; the value is
//!   `d·(digit − 1)`.
//! - **TQ2_0** (66) `qs[64], d`: element `128c + 32s + j` is bits `2s, 2s+1` of `qs[32c + j]`,
//!   less 1, times `d`.

use super::f16_at;
use super::grids::KSIGNS;
use super::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::QuantFormat;

/// The little-endian u16 at `at`.
#[inline(always)]
fn u16_le(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The little-endian u32 at `at`.
#[inline(always)]
fn u32_le(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Writes the 8 bytes of grid point `point` into `q`, negated where bit `j` of `signs` is set.
#[inline(always)]
fn signed8(q: &mut [i8], point: u64, signs: u8) {
    for (j, v) in q[..8].iter_mut().enumerate() {
        let x = (point >> (8 * j)) as u8 as i8;
        *v = if (signs >> j) & 1 == 1 { -x } else { x };
    }
}

/// As [`signed8`] for a grid point of 4 bytes and 4 sign bits.
#[inline(always)]
fn signed4(q: &mut [i8], point: u32, signs: u8) {
    for (j, v) in q[..4].iter_mut().enumerate() {
        let x = (point >> (8 * j)) as u8 as i8;
        *v = if (signs >> j) & 1 == 1 { -x } else { x };
    }
}

/// The f16 `d` of an IQ1_M block, from the top nibbles of its 4 scale words (bytes 48–55).
#[inline(always)]
pub fn iq1_m_d_bits(block: &[u8]) -> u16 {
    (0..4).fold(0u16, |d, w| {
        d | ((u16_le(block, 48 + 2 * w) >> 12) << (4 * w))
    })
}

/// The IQ2 formats' scale from a 4-bit field: `(d·(0.5 + s))·0.25`.
#[inline(always)]
fn iq2_scale(d: f32, s: u32) -> f32 {
    d * (0.5 + s as f32) * 0.25
}

/// IQ1_S's and IQ1_M's `q = 8v ± 1` for the 8 values of grid point `index` into `q`.
#[inline(always)]
fn iq1_points(q: &mut [i8], index: usize, negative_shift: bool) {
    let point = IQ1S_GRID[index];
    let shift = if negative_shift { -1 } else { 1 };
    for (j, v) in q[..8].iter_mut().enumerate() {
        *v = 8 * ((point >> (8 * j)) as u8 as i8) + shift;
    }
}

/// Group `g` (< 8) of a block of one of the formats of this module ([`is_lattice`]): its 32
/// integers into `q` and the scales of its two halves.
pub fn group(format: QuantFormat, block: &[u8], g: usize, q: &mut [i8; 32]) -> [f32; 2] {
    ints(format, block, g, q);
    scales(format, block, g)
}

/// The scales `a` of the two halves of group `g` (< 8) of a block of `format` (one of this
/// module's).
pub fn scales(format: QuantFormat, block: &[u8], g: usize) -> [f32; 2] {
    match format {
        QuantFormat::IQ2_XXS => [iq2_scale(f16_at(block, 0), u32_le(block, 6 + 8 * g) >> 28); 2],
        QuantFormat::IQ2_XS | QuantFormat::IQ2_S => {
            let d = f16_at(block, 0);
            let s = block[if format == QuantFormat::IQ2_XS {
                66
            } else {
                74
            } + g];
            [
                iq2_scale(d, u32::from(s & 0x0F)),
                iq2_scale(d, u32::from(s >> 4)),
            ]
        }
        QuantFormat::IQ3_XXS => {
            let s = u32_le(block, 66 + 4 * g) >> 28;
            [f16_at(block, 0) * (0.5 + s as f32) * 0.5; 2]
        }
        QuantFormat::IQ3_S => {
            let s = (block[106 + g / 2] >> (4 * (g % 2))) & 0x0F;
            [f16_at(block, 0) * f32::from(1 + 2 * s); 2]
        }
        QuantFormat::IQ1_S => {
            let qh = u16_le(block, 34 + 2 * g);
            [f16_at(block, 0) * f32::from(2 * ((qh >> 12) & 7) + 1) * 0.125; 2]
        }
        QuantFormat::IQ1_M => {
            let d = half::f16::from_bits(iq1_m_d_bits(block)).to_f32();
            let scale = |s: usize| {
                let field = (u16_le(block, 48 + 2 * (s / 4)) >> (3 * (s % 4))) & 7;
                d * f32::from(2 * field + 1) * 0.125
            };
            [scale(2 * g), scale(2 * g + 1)]
        }
        QuantFormat::TQ1_0 => [f16_at(block, 52); 2],
        QuantFormat::TQ2_0 => [f16_at(block, 64); 2],
        _ => unreachable!("{format} is not a lattice or ternary format"),
    }
}

/// The 32 integers of group `g` (< 8) of a block of `format` (one of this module's) into `q`.
pub fn ints(format: QuantFormat, block: &[u8], g: usize, q: &mut [i8; 32]) {
    match format {
        QuantFormat::IQ2_XXS => {
            let aux = u32_le(block, 6 + 8 * g);
            for (l, run) in q.chunks_exact_mut(8).enumerate() {
                let point = IQ2XXS_GRID[usize::from(block[2 + 8 * g + l])];
                signed8(run, point, KSIGNS[((aux >> (7 * l)) & 0x7F) as usize]);
            }
        }
        QuantFormat::IQ2_XS => {
            for (l, run) in q.chunks_exact_mut(8).enumerate() {
                let w = u16_le(block, 2 + 2 * (4 * g + l));
                signed8(
                    run,
                    IQ2XS_GRID[usize::from(w & 0x1FF)],
                    KSIGNS[usize::from(w >> 9)],
                );
            }
        }
        QuantFormat::IQ2_S => {
            let qh = block[66 + g];
            for (l, run) in q.chunks_exact_mut(8).enumerate() {
                let i = 4 * g + l;
                let index = usize::from(block[2 + i]) | (usize::from((qh >> (2 * l)) & 3) << 8);
                signed8(run, IQ2S_GRID[index], block[34 + i]);
            }
        }
        QuantFormat::IQ3_XXS => {
            let aux = u32_le(block, 66 + 4 * g);
            for (l, run) in q.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS[((aux >> (7 * l)) & 0x7F) as usize];
                let at = 2 + 8 * g + 2 * l;
                signed4(run, IQ3XXS_GRID[usize::from(block[at])], signs);
                signed4(
                    &mut run[4..],
                    IQ3XXS_GRID[usize::from(block[at + 1])],
                    signs >> 4,
                );
            }
        }
        QuantFormat::IQ3_S => {
            let qh = block[66 + g];
            for (l, four) in q.chunks_exact_mut(4).enumerate() {
                let index = usize::from(block[2 + 8 * g + l]) | (usize::from((qh >> l) & 1) << 8);
                let signs = block[74 + 4 * g + l / 2] >> (4 * (l % 2));
                signed4(four, IQ3S_GRID[index], signs);
            }
        }
        QuantFormat::IQ1_S => {
            let qh = u16_le(block, 34 + 2 * g);
            for (l, run) in q.chunks_exact_mut(8).enumerate() {
                let high = usize::from((qh >> (3 * l)) & 7) << 8;
                iq1_points(
                    run,
                    usize::from(block[2 + 4 * g + l]) | high,
                    qh & 0x8000 != 0,
                );
            }
        }
        QuantFormat::IQ1_M => {
            for (l, run) in q.chunks_exact_mut(8).enumerate() {
                let i = 4 * g + l;
                let nib = block[32 + i / 2] >> (4 * (i % 2));
                let index = usize::from(block[i]) | (usize::from(nib & 7) << 8);
                iq1_points(run, index, nib & 8 != 0);
            }
        }
        QuantFormat::TQ1_0 => {
            for (l, v) in q.iter_mut().enumerate() {
                let e = 32 * g + l;
                let (byte, p) = match e {
                    0..160 => (e % 32, e / 32),
                    160..240 => (32 + e % 16, (e - 160) / 16),
                    _ => (48 + e % 4, (e - 240) / 4),
                };
                *v = tq1_digit(block[byte], p) as i8 - 1;
            }
        }
        QuantFormat::TQ2_0 => {
            let (c, s) = (g / 4, g % 4);
            for (j, v) in q.iter_mut().enumerate() {
                *v = ((block[32 * c + j] >> (2 * s)) & 3) as i8 - 1;
            }
        }
        _ => unreachable!("{format} is not a lattice or ternary format"),
    }
}

/// Base-3 digit `p` (< 5) of a TQ1_0 byte: `((b·3^p mod 256)·3) >> 8`, 0..2.
#[inline(always)]
pub fn tq1_digit(b: u8, p: usize) -> u8 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    ((u16::from(b.wrapping_mul(POW3[p])) * 3) >> 8) as u8
}

/// True for the formats of this module.
pub const fn is_lattice(format: QuantFormat) -> bool {
    matches!(
        format,
        QuantFormat::IQ2_XXS
            | QuantFormat::IQ2_XS
            | QuantFormat::IQ2_S
            | QuantFormat::IQ3_XXS
            | QuantFormat::IQ3_S
            | QuantFormat::IQ1_S
            | QuantFormat::IQ1_M
            | QuantFormat::TQ1_0
            | QuantFormat::TQ2_0
    )
}

/// Decodes one block of `format` (one of this module's) as `a·q` per element.
#[inline(always)]
fn decode(format: QuantFormat, block: &[u8], out: &mut [f32]) {
    let mut q = [0i8; 32];
    for (g, chunk) in out[..256].chunks_exact_mut(32).enumerate() {
        let a = group(format, block, g, &mut q);
        for (e, (o, &v)) in chunk.iter_mut().zip(&q).enumerate() {
            *o = a[e / 16] * f32::from(v);
        }
    }
}

macro_rules! decoders {
    ($($name:ident => $format:ident),* $(,)?) => {$(
        #[doc = concat!("One ", stringify!($format), " block: `a·q` per element.")]
        pub fn $name(block: &[u8], out: &mut [f32]) {
            decode(QuantFormat::$format, block, out)
        }
    )*};
}

decoders!(
    iq2_xxs => IQ2_XXS,
    iq2_xs => IQ2_XS,
    iq2_s => IQ2_S,
    iq3_xxs => IQ3_XXS,
    iq3_s => IQ3_S,
    iq1_s => IQ1_S,
    iq1_m => IQ1_M,
    tq1_0 => TQ1_0,
    tq2_0 => TQ2_0,
);
