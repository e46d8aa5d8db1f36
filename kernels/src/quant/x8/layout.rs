//! The interleaved layouts of the low-bit K and IQ formats (Q3_K, Q5_K, IQ4_XS; IQ4_NL
//! takes Q4_0's): weaving 8 rows' blocks into one column and taking one row back out. The tables
//! of [`super`] describe them; every bit of the file's bytes is kept, so
//! [`super::unpack_rows`] gives them back exactly.

use super::{pack_q4_k, unpack_q4_k, ROWS};
use crate::quant::blocks::{iq4_xs_scale, q3_k_scale};

/// Stores `vals` (`n` six-bit values, `n` a multiple of 4) in `3n / 4` bytes: byte `i` of
/// the first `n / 2` holds value `i`'s low 4 bits in its low nibble and value `i + n / 2`'s
/// in its high nibble; byte `i` of the last `n / 4` holds the top 2 bits of values `i`,
/// `i + n / 4`, `i + n / 2` and `i + 3n / 4` in its bits 0–1, 2–3, 4–5 and 6–7. With the
/// values numbered `8s + r` (sub-block `s`, row `r`), a kernel takes the 32 values of four
/// sub-blocks apart with a few whole-vector shifts and masks.
fn pack_six(vals: &[u8], out: &mut [u8]) {
    let n = vals.len();
    let (half, quarter) = (n / 2, n / 4);
    for i in 0..half {
        out[i] = (vals[i] & 15) | (vals[i + half] & 15) << 4;
    }
    for i in 0..quarter {
        out[half + i] = (0..4).fold(0u8, |b, j| b | (vals[i + j * quarter] >> 4) << (2 * j));
    }
}

/// Value `v` of `n` six-bit values stored by [`pack_six`] in `packed`.
fn six(packed: &[u8], n: usize, v: usize) -> u8 {
    let (half, quarter) = (n / 2, n / 4);
    let low = packed[v % half] >> (4 * (v / half)) & 15;
    let top = packed[half + v % quarter] >> (2 * (v / quarter)) & 3;
    low | top << 4
}

/// Offset of Q3_K's low-bit chunk `(h, p)` of row `r` in a column: bytes `32h + 4p..+4` of
/// the row's 64 bytes `qs`.
pub(super) const fn q3_k_low(h: usize, p: usize, r: usize) -> usize {
    112 + 256 * h + 32 * p + 4 * r
}

/// Offset of Q3_K's high-bit chunk `p` of row `r` in a column: bytes `4p..4p + 4` of the
/// row's 32 bytes `hmask`.
pub(super) const fn q3_k_high(p: usize, r: usize) -> usize {
    624 + 32 * p + 4 * r
}

/// Q3_K (110-byte blocks `hmask[32], qs[64], scales[12], d`): the 8 `d` (16 bytes); the
/// 16 six-bit scales of the 8 rows, numbered `8s + r`, as [`pack_six`] stores them (96);
/// the low 2 bits in 16 chunks (`q3_k_low`, 512) and the high bits in 8 (`q3_k_high`, 256).
pub(super) fn pack_q3_k<'a>(block: impl Fn(usize) -> &'a [u8], out: &mut [u8]) {
    let mut scales = [0u8; 128];
    for r in 0..ROWS {
        let b = block(r);
        out[2 * r..2 * r + 2].copy_from_slice(&b[108..110]);
        for s in 0..16 {
            scales[8 * s + r] = q3_k_scale(&b[96..108], s);
        }
        for p in 0..8 {
            for h in 0..2 {
                let at = q3_k_low(h, p, r);
                out[at..at + 4].copy_from_slice(&b[32 + 32 * h + 4 * p..36 + 32 * h + 4 * p]);
            }
            let at = q3_k_high(p, r);
            out[at..at + 4].copy_from_slice(&b[4 * p..4 * p + 4]);
        }
    }
    pack_six(&scales, &mut out[16..112]);
}

/// Row `r` of a Q3_K column back in GGUF's layout (110 bytes).
pub(super) fn unpack_q3_k(column: &[u8], r: usize, out: &mut [u8]) {
    out[108..110].copy_from_slice(&column[2 * r..2 * r + 2]);
    // The inverse of `q3_k_scale`: scale s's low nibble is nibble s / 8 of byte s % 8, its
    // top 2 bits are bits 2(s / 4).. of byte 8 + s % 4.
    let scales = &mut out[96..108];
    scales.fill(0);
    for s in 0..16 {
        let v = six(&column[16..112], 128, 8 * s + r);
        scales[s % 8] |= (v & 15) << (4 * (s / 8));
        scales[8 + s % 4] |= (v >> 4) << (2 * (s / 4));
    }
    for p in 0..8 {
        for h in 0..2 {
            let at = q3_k_low(h, p, r);
            out[32 + 32 * h + 4 * p..36 + 32 * h + 4 * p].copy_from_slice(&column[at..at + 4]);
        }
        let at = q3_k_high(p, r);
        out[4 * p..4 * p + 4].copy_from_slice(&column[at..at + 4]);
    }
}

/// Offset of IQ4_XS's chunk `(g, p)` of row `r` in a column: bytes `4p..4p + 4` of the
/// row's 16 bytes of sub-block `g`.
pub(super) const fn iq4_xs_chunk(g: usize, p: usize, r: usize) -> usize {
    64 + 128 * g + 32 * p + 4 * r
}

/// IQ4_XS (136-byte blocks `d, scales_h, scales_l[4], qs[128]`): the 8 `d` (16 bytes); the
/// 8 six-bit scales of the 8 rows, numbered `8g + r`, as [`pack_six`] stores them (48);
/// then per sub-block `g` its 4 chunks of Q4_0's layout (`iq4_xs_chunk`, 128 each).
pub(super) fn pack_iq4_xs<'a>(block: impl Fn(usize) -> &'a [u8], out: &mut [u8]) {
    let mut scales = [0u8; 64];
    for r in 0..ROWS {
        let b = block(r);
        out[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
        for g in 0..8 {
            scales[8 * g + r] = iq4_xs_scale(b, g);
            for p in 0..4 {
                let (at, from) = (iq4_xs_chunk(g, p, r), 8 + 16 * g + 4 * p);
                out[at..at + 4].copy_from_slice(&b[from..from + 4]);
            }
        }
    }
    pack_six(&scales, &mut out[16..64]);
}

/// Row `r` of an IQ4_XS column back in GGUF's layout (136 bytes).
pub(super) fn unpack_iq4_xs(column: &[u8], r: usize, out: &mut [u8]) {
    out[..2].copy_from_slice(&column[2 * r..2 * r + 2]);
    // The inverse of `iq4_xs_scale`: the top 2 bits of scale g at bits 2g.. of the
    // little-endian `scales_h`, its low nibble at nibble g % 2 of `scales_l[g / 2]`.
    let mut high = 0u16;
    out[4..8].fill(0);
    for g in 0..8 {
        let v = six(&column[16..64], 64, 8 * g + r);
        high |= u16::from(v >> 4) << (2 * g);
        out[4 + g / 2] |= (v & 15) << (4 * (g % 2));
        for p in 0..4 {
            let (at, to) = (iq4_xs_chunk(g, p, r), 8 + 16 * g + 4 * p);
            out[to..to + 4].copy_from_slice(&column[at..at + 4]);
        }
    }
    out[2..4].copy_from_slice(&high.to_le_bytes());
}

/// Offset of Q5_K's fifth-bit chunk `p` of row `r` in a column: bytes `4p..4p + 4` of the
/// row's 32 bytes `qh`.
pub(super) const fn q5_k_high(p: usize, r: usize) -> usize {
    1152 + 32 * p + 4 * r
}

/// Q5_K (176-byte blocks `d, dmin, scales[12], qh[32], qs[128]`): Q4_K's column of the
/// same rows (1152 bytes: `d`, `dmin`, scales and minimums, quant nibbles), then the fifth
/// bits in 8 chunks (`q5_k_high`, 256), as Q3_K's high bits: bit `g` of a byte is the fifth
/// bit of sub-block `g`'s element.
pub(super) fn pack_q5_k<'a>(block: impl Fn(usize) -> &'a [u8] + Copy, out: &mut [u8]) {
    pack_q4_k(block, 48, &mut out[..1152]);
    for r in 0..ROWS {
        let b = block(r);
        for p in 0..8 {
            let at = q5_k_high(p, r);
            out[at..at + 4].copy_from_slice(&b[16 + 4 * p..20 + 4 * p]);
        }
    }
}

/// Row `r` of a Q5_K column back in GGUF's layout (176 bytes).
pub(super) fn unpack_q5_k(column: &[u8], r: usize, out: &mut [u8]) {
    unpack_q4_k(&column[..1152], r, 48, out);
    for p in 0..8 {
        let at = q5_k_high(p, r);
        out[16 + 4 * p..20 + 4 * p].copy_from_slice(&column[at..at + 4]);
    }
}
