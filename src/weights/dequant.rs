//! Scalar, exact dequantization of the GGUF storage formats qkv loads by conversion.
//!
//! Each function turns raw little-endian bytes into f32 values, computing exactly what
//! llama.cpp's reference (`ggml-quants.c`) and gguf-py's numpy code compute: the block scale
//! `d` (and minimum `m`) are widened from f16 to f32, and each value is one f32 multiply
//! (plus one f32 add for Q4_1), never a fused multiply-add.
//!
//! | format | block | bytes | layout                              | value                 |
//! |--------|-------|-------|-------------------------------------|-----------------------|
//! | BF16   | 1     | 2     | upper half of an f32                | `f32(bits << 16)`     |
//! | Q8_0   | 32    | 34    | f16 `d`, 32 × i8 `q`                | `q·d`                 |
//! | Q4_0   | 32    | 18    | f16 `d`, 16 bytes of nibbles        | `(nibble − 8)·d`      |
//! | Q4_1   | 32    | 20    | f16 `d`, f16 `m`, 16 bytes nibbles  | `nibble·d + m`        |
//!
//! In the 4-bit formats byte `j` of a block holds element `j` in its low nibble and element
//! `j + 16` in its high nibble.
//!
//! These run once, at load; they are plain loops, not kernels.

use half::f16;

/// Elements per block of the Q8_0, Q4_0 and Q4_1 formats.
pub const QK: usize = 32;
/// Bytes per Q8_0 block.
pub const Q8_0_BLOCK_BYTES: usize = 2 + QK;
/// Bytes per Q4_0 block.
pub const Q4_0_BLOCK_BYTES: usize = 2 + QK / 2;
/// Bytes per Q4_1 block.
pub const Q4_1_BLOCK_BYTES: usize = 4 + QK / 2;

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

fn check(name: &str, src: usize, block_bytes: usize, dst: usize, block_elems: usize) {
    assert!(
        src.is_multiple_of(block_bytes) && src / block_bytes * block_elems == dst,
        "{name}: {src} source bytes do not hold exactly {dst} values"
    );
}

/// Widens bf16 values (2 bytes each, little endian) to f32: exact.
///
/// # Panics
/// If `src.len() != 2 * dst.len()` (the GGUF reader checks sizes before calling).
pub fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    check("bf16", src.len(), 2, dst.len(), 1);
    for (out, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *out = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
    }
}

/// Dequantizes Q8_0 blocks (f16 scale `d`, then 32 signed bytes `q`; value `q·d`).
///
/// # Panics
/// If `src` is not exactly `dst.len() / 32` blocks of 34 bytes.
pub fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    check("q8_0", src.len(), Q8_0_BLOCK_BYTES, dst.len(), QK);
    for (out, block) in dst
        .chunks_exact_mut(QK)
        .zip(src.chunks_exact(Q8_0_BLOCK_BYTES))
    {
        let d = f16_at(block, 0);
        for (o, &q) in out.iter_mut().zip(&block[2..]) {
            *o = f32::from(q as i8) * d;
        }
    }
}

/// Dequantizes Q4_0 blocks (f16 scale `d`, then 16 bytes of nibbles; value `(nibble − 8)·d`).
///
/// # Panics
/// If `src` is not exactly `dst.len() / 32` blocks of 18 bytes.
pub fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    check("q4_0", src.len(), Q4_0_BLOCK_BYTES, dst.len(), QK);
    for (out, block) in dst
        .chunks_exact_mut(QK)
        .zip(src.chunks_exact(Q4_0_BLOCK_BYTES))
    {
        let d = f16_at(block, 0);
        let (low, high) = out.split_at_mut(QK / 2);
        for (j, &q) in block[2..].iter().enumerate() {
            low[j] = f32::from(i16::from(q & 0x0F) as i8 - 8) * d;
            high[j] = f32::from(i16::from(q >> 4) as i8 - 8) * d;
        }
    }
}

/// Dequantizes Q4_1 blocks (f16 scale `d`, f16 minimum `m`, then 16 bytes of nibbles; value
/// `nibble·d + m`).
///
/// # Panics
/// If `src` is not exactly `dst.len() / 32` blocks of 20 bytes.
pub fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    check("q4_1", src.len(), Q4_1_BLOCK_BYTES, dst.len(), QK);
    for (out, block) in dst
        .chunks_exact_mut(QK)
        .zip(src.chunks_exact(Q4_1_BLOCK_BYTES))
    {
        let d = f16_at(block, 0);
        let m = f16_at(block, 2);
        let (low, high) = out.split_at_mut(QK / 2);
        for (j, &q) in block[4..].iter().enumerate() {
            low[j] = f32::from(q & 0x0F) * d + m;
            high[j] = f32::from(q >> 4) * d + m;
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
    fn bf16_is_upper_half_of_f32() {
        let vals = [1.0f32, -2.5, 3.140625, 0.0, f32::INFINITY, -1.0e-30];
        let src: Vec<u8> = vals
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let mut dst = [0.0f32; 6];
        dequantize_bf16(&src, &mut dst);
        for (a, b) in dst.iter().zip(&vals) {
            assert_eq!(a.to_bits(), b.to_bits() & 0xFFFF_0000);
        }
    }

    #[test]
    fn q8_0_hand_block() {
        let mut block = h(0.5).to_vec();
        block.extend((0..32).map(|i| (i as i8 - 16) as u8));
        block.extend(h(-2.0));
        block.extend([127u8, 128, 255, 0].iter().cycle().take(32));
        let mut dst = [0.0f32; 64];
        dequantize_q8_0(&block, &mut dst);
        for (i, v) in dst[..32].iter().enumerate() {
            assert_eq!(*v, (i as f32 - 16.0) * 0.5);
        }
        assert_eq!(&dst[32..36], &[-254.0, 256.0, 2.0, -0.0]);
    }

    #[test]
    fn q4_0_nibble_order() {
        let mut block = h(0.25).to_vec();
        // byte j: low nibble j, high nibble 15 - j
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut dst = [0.0f32; 32];
        dequantize_q4_0(&block, &mut dst);
        for j in 0..16 {
            assert_eq!(dst[j], (j as f32 - 8.0) * 0.25, "low {j}");
            assert_eq!(dst[16 + j], (7.0 - j as f32) * 0.25, "high {j}");
        }
    }

    #[test]
    fn q4_1_scale_and_min() {
        let mut block = h(0.125).to_vec();
        block.extend(h(-1.0));
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut dst = [0.0f32; 32];
        dequantize_q4_1(&block, &mut dst);
        for j in 0..16 {
            assert_eq!(dst[j], j as f32 * 0.125 - 1.0);
            assert_eq!(dst[16 + j], (15 - j) as f32 * 0.125 - 1.0);
        }
    }

    #[test]
    #[should_panic(expected = "q4_1: 20 source bytes do not hold exactly 31 values")]
    fn size_mismatch_panics() {
        dequantize_q4_1(&[0u8; 20], &mut [0.0f32; 31]);
    }
}
