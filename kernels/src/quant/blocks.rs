//! The scalar block decoders: one block of bytes in, its 32 or 256 f32 values out, exactly
//! as gguf-py computes them.
//!
//! K-format layouts (256 values, in 8 sub-blocks of 32 for Q4_K/Q5_K, 16 of 16 for Q6_K):
//!
//! - **Q4_K** `d, dmin, scales[12], qs[128]`: the 32 bytes `qs[32c..32c+32]` hold sub-block
//!   `2c` in their low nibbles and `2c + 1` in their high nibbles. [`k_scale_min`] unpacks
//!   sub-block `s`'s 6-bit scale and minimum.
//! - **Q5_K** `d, dmin, scales[12], qh[32], qs[128]`: as Q4_K, and bit `s` of `qh[l]` is the
//!   fifth bit of element `l` of sub-block `s`.
//! - **Q6_K** `ql[128], qh[64], scales[16] (i8), d`: two halves of 128 values; in half `h`,
//!   value `e` takes the low nibble of `ql[64h + e]` for `e < 64`, the high nibble of
//!   `ql[64h + e − 64]` otherwise, and bits `2g, 2g+1` of `qh[32h + e % 32]` with `g = e / 32`
//!   as bits 4–5; minus 32, times `d·scales[(128h + e) / 16]`.
//! - **Q2_K** `scales[16], qs[64], d, dmin`: 16 sub-blocks of 16. Element
//!   `i = 128h + 32j + l` is bits `2j, 2j+1` of `qs[32h + l]` (0..3); sub-block `s = i / 16`
//!   has scale `scales[s] & 15` and minimum `scales[s] >> 4`: `(d·sc)·q − dmin·mn`.
//! - **Q3_K** `hmask[32], qs[64], scales[12], d`: 16 sub-blocks of 16. Element
//!   `i = 128h + 32j + l` (`h < 2`, `j < 4`, `l < 32`) takes bits `2j, 2j+1` of `qs[32h + l]`
//!   as its low two bits, and is that less 4 unless bit `4h + j` of `hmask[l]` is set: −4..3.
//!   Its scale is sub-block `i / 16`'s 6-bit field ([`q3_k_scale`]) less 32, times `d`.
//! - **IQ4_XS** `d, scales_h (u16), scales_l[4], qs[128]`: 8 sub-blocks of 32 laid out as
//!   IQ4_NL's blocks (`qs[16s..16s+16]`: low nibbles elements 0–15, high 16–31), each with
//!   the 6-bit scale ([`iq4_xs_scale`]) less 32, times `d`; a nibble `q` stands for
//!   [`IQ4_TABLE`]`[q]`.
//!
//! The lattice and ternary formats (IQ1_*, IQ2_*, IQ3_*, TQ1_0, TQ2_0) are in [`iq`].

use super::QuantFormat;
use half::f16;

pub mod grids;
pub mod iq;

pub use iq::{iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, tq1_0, tq2_0};

/// Widens the little-endian f16 at `at`.
#[inline(always)]
pub fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The decoder of one block of `format`.
pub fn decoder(format: QuantFormat) -> fn(&[u8], &mut [f32]) {
    match format {
        QuantFormat::Q8_0 => q8_0,
        QuantFormat::Q4_0 => q4_0,
        QuantFormat::Q4_1 => q4_1,
        QuantFormat::Q5_0 => q5_0,
        QuantFormat::Q5_1 => q5_1,
        QuantFormat::Q4_K => q4_k,
        QuantFormat::Q5_K => q5_k,
        QuantFormat::Q6_K => q6_k,
        QuantFormat::Q2_K => q2_k,
        QuantFormat::Q3_K => q3_k,
        QuantFormat::IQ4_NL => iq4_nl,
        QuantFormat::IQ4_XS => iq4_xs,
        QuantFormat::IQ2_XXS => iq2_xxs,
        QuantFormat::IQ2_XS => iq2_xs,
        QuantFormat::IQ2_S => iq2_s,
        QuantFormat::IQ3_XXS => iq3_xxs,
        QuantFormat::IQ3_S => iq3_s,
        QuantFormat::IQ1_S => iq1_s,
        QuantFormat::IQ1_M => iq1_m,
        QuantFormat::TQ1_0 => tq1_0,
        QuantFormat::TQ2_0 => tq2_0,
    }
}

/// Q8_0: `q·d`.
pub fn q8_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (o, &q) in out[..32].iter_mut().zip(&block[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// Q4_0: `(nibble − 8)·d`.
pub fn q4_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (j, &q) in block[2..18].iter().enumerate() {
        out[j] = f32::from((q & 0x0F) as i8 - 8) * d;
        out[j + 16] = f32::from((q >> 4) as i8 - 8) * d;
    }
}

/// Q4_1: `nibble·d + m`.
pub fn q4_1(block: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
    for (j, &q) in block[4..20].iter().enumerate() {
        out[j] = f32::from(q & 0x0F) * d + m;
        out[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// The 5-bit values of a Q5 block: nibbles of `qs` with fifth bits from `qh`.
#[inline(always)]
fn q5_values(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (j, &b) in qs[..16].iter().enumerate() {
        q[j] = (b & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (b >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Q5_0: `(q − 16)·d`.
pub fn q5_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    for (o, q) in out[..32].iter_mut().zip(q5_values(qh, &block[6..22])) {
        *o = f32::from(q as i8 - 16) * d;
    }
}

/// Q5_1: `q·d + m`.
pub fn q5_1(block: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
    let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    for (o, q) in out[..32].iter_mut().zip(q5_values(qh, &block[8..24])) {
        *o = f32::from(q) * d + m;
    }
}

/// Sub-block `s`'s 6-bit scale and minimum from a Q4_K/Q5_K block's 12 packed bytes.
///
/// Bytes 0–3 hold the low 6 bits of scales 0–3 (top 2 bits: bits 4–5 of scales 4–7), bytes
/// 4–7 the same for minimums, and bytes 8–11 the low 4 bits of scales 4–7 (low nibble) and
/// minimums 4–7 (high nibble).
#[inline(always)]
pub fn k_scale_min(scales: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (scales[s] & 0x3F, scales[s + 4] & 0x3F)
    } else {
        let packed = scales[s + 4];
        (
            (packed & 0x0F) | ((scales[s - 4] >> 6) << 4),
            (packed >> 4) | ((scales[s] >> 6) << 4),
        )
    }
}

/// Q4_K and Q5_K: sub-block `s` is `(d·sc)·q − dmin·mn`; `qh` holds fifth bits (Q5_K).
fn k_quant_4_5(block: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let scales = &block[4..16];
    for s in 0..8 {
        let (sc, mn) = k_scale_min(scales, s);
        let (ds, dm) = (d * f32::from(sc), dmin * f32::from(mn));
        let bytes = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        let shift = 4 * (s % 2);
        for (l, &b) in bytes.iter().enumerate() {
            let mut q = (b >> shift) & 0x0F;
            if let Some(qh) = qh {
                q |= ((qh[l] >> s) & 1) << 4;
            }
            out[32 * s + l] = ds * f32::from(q) - dm;
        }
    }
}

/// Q4_K.
pub fn q4_k(block: &[u8], out: &mut [f32]) {
    k_quant_4_5(block, None, &block[16..144], out);
}

/// Q5_K.
pub fn q5_k(block: &[u8], out: &mut [f32]) {
    k_quant_4_5(block, Some(&block[16..48]), &block[48..176], out);
}

/// The signed 6-bit value (−32..31) of element `e` (0..128) of half `h` of a Q6_K block.
#[inline(always)]
pub fn q6_k_value(block: &[u8], h: usize, e: usize) -> i8 {
    let (ql, qh) = (
        &block[64 * h..64 * h + 64],
        &block[128 + 32 * h..160 + 32 * h],
    );
    let low = if e < 64 {
        ql[e] & 0x0F
    } else {
        ql[e - 64] >> 4
    };
    let high = (qh[e % 32] >> (2 * (e / 32))) & 3;
    (low | (high << 4)) as i8 - 32
}

/// Q6_K: `(d·sc)·(q − 32)` with one i8 scale per 16.
pub fn q6_k(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 208);
    for h in 0..2 {
        for e in 0..128 {
            let i = 128 * h + e;
            let sc = f32::from(block[192 + i / 16] as i8);
            out[i] = (d * sc) * f32::from(q6_k_value(block, h, e));
        }
    }
}

/// The 2-bit value (0..3) of element `i` (0..256) of a Q2_K block.
#[inline(always)]
pub fn q2_k_value(block: &[u8], i: usize) -> u8 {
    let (h, j, l) = (i / 128, (i % 128) / 32, i % 32);
    (block[16 + 32 * h + l] >> (2 * j)) & 3
}

/// Q2_K: `(d·sc)·q − dmin·mn` with a 4-bit scale and minimum per 16.
pub fn q2_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
    for (s, chunk) in out[..256].chunks_exact_mut(16).enumerate() {
        let (dl, ml) = (
            d * f32::from(block[s] & 0x0F),
            dmin * f32::from(block[s] >> 4),
        );
        for (l, o) in chunk.iter_mut().enumerate() {
            *o = dl * f32::from(q2_k_value(block, 16 * s + l)) - ml;
        }
    }
}

/// Sub-block `s`'s (0..16) stored 6-bit scale in a Q3_K block's 12 scale bytes (the value
/// used is this less 32).
///
/// Bytes 0–7 hold the low 4 bits of scales 0–7 in their low nibbles and of scales 8–15 in
/// their high nibbles; bits `2t, 2t+1` of byte `8 + u` are the top two bits of scale
/// `4t + u`.
#[inline(always)]
pub fn q3_k_scale(scales: &[u8], s: usize) -> u8 {
    let low = (scales[s % 8] >> (4 * (s / 8))) & 0x0F;
    let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    low | (high << 4)
}

/// The signed integer (−4..3) of element `i` (0..256) of a Q3_K block.
#[inline(always)]
pub fn q3_k_value(block: &[u8], i: usize) -> i8 {
    let (h, j, l) = (i / 128, (i % 128) / 32, i % 32);
    let low = (block[32 + 32 * h + l] >> (2 * j)) & 3;
    let set = (block[l] >> (4 * h + j)) & 1;
    low as i8 - if set == 1 { 0 } else { 4 }
}

/// Q3_K: `(d·(sc − 32))·q` with one 6-bit scale per 16.
pub fn q3_k(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 108);
    let scales = &block[96..108];
    for (s, chunk) in out[..256].chunks_exact_mut(16).enumerate() {
        let ds = d * f32::from(q3_k_scale(scales, s) as i8 - 32);
        for (l, o) in chunk.iter_mut().enumerate() {
            *o = ds * f32::from(q3_k_value(block, 16 * s + l));
        }
    }
}

/// The non-linear 4-bit table of IQ4_NL and IQ4_XS: a nibble `q` stands for `IQ4_TABLE[q]`
/// (ggml's `kvalues_iq4nl`).
pub const IQ4_TABLE: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ4_NL: `d·T[q]`.
pub fn iq4_nl(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (j, &q) in block[2..18].iter().enumerate() {
        out[j] = d * f32::from(IQ4_TABLE[usize::from(q & 0x0F)]);
        out[j + 16] = d * f32::from(IQ4_TABLE[usize::from(q >> 4)]);
    }
}

/// Sub-block `s`'s (0..8) stored 6-bit scale in an IQ4_XS block (the value used is this less
/// 32): the low 4 bits are nibble `s % 2` of `scales_l[s / 2]`, the top two bits `2s, 2s+1`
/// of the little-endian `scales_h`.
#[inline(always)]
pub fn iq4_xs_scale(block: &[u8], s: usize) -> u8 {
    let high = u16::from_le_bytes([block[2], block[3]]) >> (2 * s);
    let low = block[4 + s / 2] >> (4 * (s % 2));
    (low & 0x0F) | (((high & 3) as u8) << 4)
}

/// IQ4_XS: `(d·(sc − 32))·T[q]` per sub-block of 32.
pub fn iq4_xs(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for s in 0..8 {
        let ds = d * f32::from(iq4_xs_scale(block, s) as i8 - 32);
        let qs = &block[8 + 16 * s..24 + 16 * s];
        for (j, &q) in qs.iter().enumerate() {
            out[32 * s + j] = ds * f32::from(IQ4_TABLE[usize::from(q & 0x0F)]);
            out[32 * s + j + 16] = ds * f32::from(IQ4_TABLE[usize::from(q >> 4)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q8_0_hand_block() {
        let mut block = h(0.5).to_vec();
        block.extend([127u8, 128, 255, 0].iter().cycle().take(32));
        let mut out = [0.0f32; 32];
        q8_0(&block, &mut out);
        assert_eq!(&out[..4], &[63.5, -64.0, -0.5, 0.0]);
    }

    #[test]
    fn q4_0_nibble_order() {
        let mut block = h(0.25).to_vec();
        // byte j: low nibble j, high nibble 15 - j
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0.0f32; 32];
        q4_0(&block, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 0.25, "low {j}");
            assert_eq!(out[16 + j], (7.0 - j as f32) * 0.25, "high {j}");
        }
    }

    #[test]
    fn q4_1_scale_and_min() {
        let mut block = h(0.125).to_vec();
        block.extend(h(-1.0));
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0.0f32; 32];
        q4_1(&block, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 0.125 - 1.0);
            assert_eq!(out[16 + j], (15 - j) as f32 * 0.125 - 1.0);
        }
    }

    #[test]
    fn q5_fifth_bits() {
        // Q5_0: every nibble 0; fifth bit set on elements 3 and 20.
        let mut block = h(1.0).to_vec();
        block.extend(((1u32 << 3) | (1 << 20)).to_le_bytes());
        block.extend([0u8; 16]);
        let mut out = [0.0f32; 32];
        q5_0(&block, &mut out);
        for (j, v) in out.iter().enumerate() {
            let expected = if j == 3 || j == 20 { 0.0 } else { -16.0 };
            assert_eq!(*v, expected, "element {j}");
        }
    }

    #[test]
    fn k_scales_unpack() {
        // Scales 0..8 = 1..8 and 60..63 for the top ones; mins = 2·s + 1.
        let sc: [u8; 8] = [1, 2, 3, 4, 60, 61, 62, 63];
        let mn: [u8; 8] = [1, 3, 5, 7, 33, 45, 50, 63];
        let mut packed = [0u8; 12];
        for s in 0..4 {
            packed[s] = sc[s] | ((sc[s + 4] >> 4) << 6);
            packed[s + 4] = mn[s] | ((mn[s + 4] >> 4) << 6);
            packed[s + 8] = (sc[s + 4] & 0x0F) | ((mn[s + 4] & 0x0F) << 4);
        }
        for s in 0..8 {
            assert_eq!(k_scale_min(&packed, s), (sc[s], mn[s]), "sub-block {s}");
        }
    }
}
