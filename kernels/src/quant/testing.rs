//! Random quantized blocks for the kernels' tests and benches (not part of the API: hidden
//! from the docs, and free to change).
//!
//! Any bytes are a valid block once its f16 scale fields are finite, so a block is random
//! bytes with its scale fields overwritten.

use super::act::{QuantizedActs, ACT_BLOCK};
use super::gemv::group;
use super::QuantFormat;
use half::f16;

/// A xorshift64 generator: deterministic, seeded, no dependency.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A uniform value in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// `n` rows of `k` elements of `format`, weight-like: random integers with finite scales and
/// minimums of sensible sizes (values of order 0.1–1).
pub fn weight_blocks(format: QuantFormat, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = n * format.row_bytes(k).expect("whole blocks");
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
    let put = |block: &mut [u8], at: usize, v: f32| {
        block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes())
    };
    for block in w.chunks_exact_mut(format.block_bytes()) {
        let d = 0.01 + 0.05 * rng.uniform().abs();
        let m = 0.5 * rng.uniform();
        match format {
            QuantFormat::Q8_0 | QuantFormat::Q4_0 | QuantFormat::Q5_0 => put(block, 0, d),
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                put(block, 0, d);
                put(block, 2, m);
            }
            QuantFormat::Q4_K | QuantFormat::Q5_K => {
                put(block, 0, d / 16.0);
                put(block, 2, m.abs() / 16.0);
            }
            QuantFormat::Q6_K => put(block, 208, d / 64.0),
        }
    }
    w
}

/// `n` blocks of `format` whose scale fields are any finite f16, and in about a quarter of
/// the blocks an extreme one (±0, subnormals, the smallest normal, ±65504): for decoders
/// that must match bit for bit over the whole range.
pub fn any_blocks(format: QuantFormat, n: usize, rng: &mut Rng) -> Vec<u8> {
    const EXTREME: [u16; 10] = [
        0x0000, 0x8000, 0x0001, 0x8001, 0x0155, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF,
    ];
    let mut src: Vec<u8> = (0..n * format.block_bytes())
        .map(|_| rng.next_u64() as u8)
        .collect();
    for block in src.chunks_exact_mut(format.block_bytes()) {
        let extreme = rng.next_u64().is_multiple_of(4);
        for &o in format.scale_offsets() {
            let bits = if extreme {
                EXTREME[(rng.next_u64() % EXTREME.len() as u64) as usize]
            } else {
                loop {
                    let b = rng.next_u64() as u16;
                    if f16::from_bits(b).is_finite() {
                        break b;
                    }
                }
            };
            block[o..o + 2].copy_from_slice(&bits.to_le_bytes());
        }
    }
    src
}

/// The size that f32 roundings in `y[i, j] = x·Wᵀ` scale with, for kernels on quantized
/// activations: Σ over the groups of row `j` of `W` of `|xs·a·q·xq| + |c·Σx|`, in f64.
pub fn magnitude(acts: &QuantizedActs, format: QuantFormat, w: &[u8], i: usize, j: usize) -> f64 {
    let (k, be, bb) = (acts.k, format.block_elems(), format.block_bytes());
    let row = &w[j * (k / be * bb)..(j + 1) * (k / be * bb)];
    let mut mag = 0.0f64;
    for (b, block) in row.chunks_exact(bb).enumerate() {
        for g in 0..be / ACT_BLOCK {
            let grp = group(format, block, g);
            let at = i * acts.blocks_per_row() + b * be / ACT_BLOCK + g;
            for e in 0..32 {
                let prod = f64::from(grp.q[e]) * f64::from(acts.q[at * 32 + e]);
                mag += (f64::from(acts.scale[at]) * f64::from(grp.a[e / 16]) * prod).abs();
            }
            mag += f64::from(grp.c * acts.sum[at]).abs();
        }
    }
    mag
}
