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
///
/// The scales are drawn as f16 bit patterns, not rounded with `f16::from_f32`: built with F16C
/// enabled (the Miri run of the AVX2 kernels), `half` rounds with `vcvtps2ph`, which Miri
/// does not implement.
pub fn weight_blocks(format: QuantFormat, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = n * format.row_bytes(k).expect("whole blocks");
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
    // A positive f16 with bits in lo..hi (the order of positive f16 bits is their value's),
    // negated half of the time with `signed`.
    let mut bits = |lo: u16, hi: u16, signed: bool| {
        let r = rng.next_u64();
        let b = lo + (r % u64::from(hi - lo)) as u16;
        if signed && r >> 63 == 1 {
            b | 0x8000
        } else {
            b
        }
    };
    // 2^-7 and 2^-4 (0.0078 to 0.0625), 2^-1 (0.5); the K-formats' super-block scales are
    // 16 times smaller (exponent − 4), Q6_K's 64 times (exponent − 6), and so on for the
    // formats with larger integers.
    const D: (u16, u16) = (0x2000, 0x2C00);
    const HALF: u16 = 0x3800;
    for block in w.chunks_exact_mut(format.block_bytes()) {
        let mut put = |at: usize, v: u16| block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        match format {
            QuantFormat::Q8_0 | QuantFormat::Q4_0 | QuantFormat::Q5_0 => {
                put(0, bits(D.0, D.1, false))
            }
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                put(0, bits(D.0, D.1, false));
                put(2, bits(0, HALF, true));
            }
            QuantFormat::Q4_K | QuantFormat::Q5_K => {
                put(0, bits(D.0 - 0x1000, D.1 - 0x1000, false));
                put(2, bits(0, HALF - 0x1000, false));
            }
            QuantFormat::Q6_K => put(208, bits(D.0 - 0x1800, D.1 - 0x1800, false)),
            // Scales up to 15 times integers up to 3, minimums up to 15.
            QuantFormat::Q2_K => {
                put(80, bits(D.0 - 0x1400, D.1 - 0x1400, false));
                put(82, bits(0, D.1 - 0x0C00, false));
            }
            // Scales up to 32 times integers up to 4.
            QuantFormat::Q3_K => put(108, bits(D.0 - 0x1400, D.1 - 0x1400, false)),
            // Table values up to 127 (times scales up to 32 for IQ4_XS).
            QuantFormat::IQ4_NL => put(0, bits(D.0 - 0x1C00, D.1 - 0x1C00, false)),
            QuantFormat::IQ4_XS => put(0, bits(0x0400, 0x1000, false)),
            // Lattice values up to 62 times scales up to 15.5 (IQ2: ·0.25, IQ3_XXS: ·0.5,
            // IQ3_S: up to 31 times values up to 15; IQ1: up to 15 times 1.125).
            QuantFormat::IQ2_XXS
            | QuantFormat::IQ2_XS
            | QuantFormat::IQ2_S
            | QuantFormat::IQ3_XXS
            | QuantFormat::IQ3_S => put(0, bits(D.0 - 0x1C00, D.1 - 0x1C00, false)),
            QuantFormat::IQ1_S => put(0, bits(D.0 - 0x1000, D.1 - 0x1000, false)),
            QuantFormat::IQ1_M => iq1_m_put_d(block, bits(D.0 - 0x1000, D.1 - 0x1000, false)),
            QuantFormat::TQ1_0 => put(52, bits(D.0, D.1, false)),
            QuantFormat::TQ2_0 => put(64, bits(D.0, D.1, false)),
        }
    }
    w
}

/// Writes the f16 bits `d` into an IQ1_M block: nibble `w` of `d` becomes the top nibble of
/// scale word `w` (bytes 48–55).
pub fn iq1_m_put_d(block: &mut [u8], d: u16) {
    for w in 0..4 {
        let at = 49 + 2 * w;
        block[at] = (block[at] & 0x0F) | ((((d >> (4 * w)) & 0x0F) as u8) << 4);
    }
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
        if format == QuantFormat::IQ1_M {
            let bits = loop {
                let b = rng.next_u64() as u16;
                if f16::from_bits(b).is_finite() {
                    break b;
                }
            };
            iq1_m_put_d(block, bits);
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
            if format.half_mins() {
                for e in 0..32 {
                    let x = f64::from(acts.scale[at]) * f64::from(acts.q[at * 32 + e]);
                    mag += (f64::from(grp.c[e / 16]) * x).abs();
                }
            } else {
                mag += f64::from(grp.c[0] * acts.sum[at]).abs();
            }
        }
    }
    mag
}

/// The signature of the quantized GEMV's column kernels (`columns` and its SIMD variants,
/// in either weight layout), for the tests that compare them.
#[cfg(test)]
pub(crate) type ColumnsKernel = unsafe fn(
    crate::par::SharedOut,
    &QuantizedActs,
    QuantFormat,
    &[u8],
    Option<&[f32]>,
    usize,
    usize,
    usize,
);

/// Runs `kernel` on `w` over columns `0..cut`, then `cut..n`, and checks every output against
/// `want` within 1e-6 of its magnitude ([`magnitude`] of `w_gguf`, the same matrix in GGUF's
/// layout). Returns the worst error relative to the magnitude.
///
/// # Safety
/// This CPU runs `kernel`; `w` holds `n` rows of `acts.k` elements in the layout `kernel`
/// reads, `w_gguf` the same in GGUF's; `want` and `bias` fit `acts.m` and `n`; `cut ≤ n`.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn check_split_columns(
    name: &str,
    kernel: ColumnsKernel,
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    w_gguf: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    cut: usize,
    want: &[f32],
) -> f64 {
    let m = acts.m;
    let mut got = vec![f32::NAN; m * n];
    for (j0, j1) in [(0, cut), (cut, n)] {
        // SAFETY: `got` is m·n and the two ranges are disjoint and run in turn; the rest is
        // the caller's contract.
        unsafe {
            kernel(
                crate::par::SharedOut(got.as_mut_ptr()),
                acts,
                format,
                w,
                bias,
                n,
                j0,
                j1,
            )
        };
    }
    let mut worst = 0.0f64;
    for i in 0..m {
        for j in 0..n {
            let mag = magnitude(acts, format, w_gguf, i, j) + 1.0;
            let (g, e) = (got[i * n + j], want[i * n + j]);
            let err = f64::from((g - e).abs()) / mag;
            worst = worst.max(err);
            assert!(
                err <= 1e-6,
                "{name} {format} m={m} k={} n={n} ({i},{j}): {g} vs {e} (error {err:e} of the \
                 magnitude {mag})",
                acts.k
            );
        }
    }
    worst
}
