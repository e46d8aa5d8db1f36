//! Activations quantized to integers per block of 32, for the quantized matrix products.
//!
//! The quantized kernels multiply the weights' small integers by integer activations and
//! apply both scales once per block. Two precisions ([`ActPrecision`]):
//!
//! - **16 bits** (`|q| ≤ 32767`), for every kernel of weights in GGUF's layout, and the
//!   exact mode of the interleaved ones: the error (at most 1/65534 of the block's largest
//!   value per element) stays far below the weights' own, and the products still fit
//!   `madd`'s 32-bit sums.
//! - **8 bits** (`|q| ≤ 127`), as ggml's Q8 activations: an error of up to 1/254 of the
//!   block's largest value, and each byte of weights meets a byte of activations in one
//!   `maddubs` (32 products per instruction): 4-bit weights where 16 bits take two, one per
//!   byte of the integer ([`QuantizedActs::split`]), and Q6_K's and Q8_0's where 16 bits
//!   take two `madd` of 16 products. Every interleaved format (Q4_0, Q4_1, Q4_K, Q6_K,
//!   Q8_0, Q3_K, Q5_K, IQ4_NL, IQ4_XS) takes it when its operand asks for it (`Weights::QuantX8`'s precision; the
//!   default is 8 bits: [`crate::quant::x8::DEFAULT_ACT_PRECISION`]).
//!
//! The precision is part of the weight operand, never of the number of rows, so a sequence
//! gets the same numbers alone or in a batch, and two models in one process may differ.
//!
//! Block `b` of row `i` holds `x[i, 32b..32b+32]` as `q = round(x · max / amax)` with
//! `amax = max |x|` over the block, its scale `amax / max` (0 for an all-zero block), and
//! its sum for the Q4_1/Q5_1/K-formats' minimum terms ([`QuantizedActs::sum`]).

/// Elements per activation block.
pub const ACT_BLOCK: usize = 32;

use crate::error::{check_len, KernelError, Result};

/// Most rows for which [`QuantizedActs::quantize`] also fills the half-block sums
/// ([`QuantizedActs::isum16`]).
pub const HALF_SUMS_MAX_ROWS: usize = 16;

/// Rows per tile of the layouts the interleaved kernels read ([`QuantizedActs::split`],
/// [`QuantizedActs::bytes`]; [`QuantizedActs::tile_at`]).
pub const TILE_ROWS: usize = 8;

/// How finely activations are quantized (see the module's introduction).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActPrecision {
    /// 16-bit integers, `|q| ≤ 32767`.
    #[default]
    Wide,
    /// 8-bit integers, `|q| ≤ 127`, also laid out as bytes ([`QuantizedActs::bytes`]).
    Byte,
}

impl ActPrecision {
    /// The largest magnitude of a quantized activation: 32767 or 127.
    pub const fn max(self) -> f32 {
        match self {
            ActPrecision::Wide => 32767.0,
            ActPrecision::Byte => 127.0,
        }
    }

    /// Bits per quantized activation: 16 or 8.
    pub const fn bits(self) -> u8 {
        match self {
            ActPrecision::Wide => 16,
            ActPrecision::Byte => 8,
        }
    }
}

/// The precision of `bits` bits: 16 ([`ActPrecision::Wide`]) or 8 ([`ActPrecision::Byte`]);
/// any other count is an error that names it. The one place where a number given by a user
/// (`--act-bits`) becomes a precision.
///
/// ```
/// use qkv_kernels::quant::act::ActPrecision;
/// assert_eq!(ActPrecision::try_from(8).unwrap(), ActPrecision::Byte);
/// assert_eq!(ActPrecision::try_from(16).unwrap().bits(), 16);
/// assert!(ActPrecision::try_from(12).unwrap_err().to_string().contains("12"));
/// ```
impl TryFrom<u8> for ActPrecision {
    type Error = KernelError;
    fn try_from(bits: u8) -> Result<Self> {
        match bits {
            16 => Ok(ActPrecision::Wide),
            8 => Ok(ActPrecision::Byte),
            other => Err(KernelError::Invalid(format!(
                "activation precision of {other} bits (use 8 or 16)"
            ))),
        }
    }
}

/// Parses `"8"` or `"16"` as [`TryFrom<u8>`] does; anything else is an error naming it.
///
/// ```
/// use qkv_kernels::quant::act::ActPrecision;
/// assert_eq!("16".parse::<ActPrecision>().unwrap(), ActPrecision::Wide);
/// assert!("eight".parse::<ActPrecision>().unwrap_err().to_string().contains("eight"));
/// ```
impl std::str::FromStr for ActPrecision {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().parse::<u8>() {
            Ok(bits) => ActPrecision::try_from(bits),
            Err(_) => Err(KernelError::Invalid(format!(
                "activation precision `{s}` (use 8 or 16 bits)"
            ))),
        }
    }
}

impl std::fmt::Display for ActPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-bit", self.bits())
    }
}

/// One block of one row at [`ActPrecision::Wide`], split into bytes: `q = 256·hi + lo`
/// element by element.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub struct SplitBlock {
    /// The high bytes, signed.
    pub hi: [i8; ACT_BLOCK],
    /// The low bytes, unsigned.
    pub lo: [u8; ACT_BLOCK],
}

/// One block of one row at [`ActPrecision::Byte`]: its 32 integers as bytes.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub struct ByteBlock {
    /// The integers, −127..=127.
    pub q: [i8; ACT_BLOCK],
}

/// What the kernels of interleaved weights read beside a [`SplitBlock`] or a [`ByteBlock`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct TileMeta {
    /// The block's scale ([`QuantizedActs::scale`]).
    pub scale: f32,
    /// The f32 sum of its original values ([`QuantizedActs::sum`]).
    pub sum: f32,
    /// The integer sum of its 32 `q`.
    pub isum: i32,
    /// The integer sum of its first 16 `q` (the second 16 sum to `isum − isum_lo`): the
    /// interleaved Q6_K kernel at 8 bits takes its offset of 32 off per 16 elements.
    pub isum_lo: i32,
}

/// `x[m, k]` quantized per block of [`ACT_BLOCK`]: reused across calls, so a decode step
/// allocates nothing once it has grown.
#[derive(Clone, Debug, Default)]
pub struct QuantizedActs {
    /// The integers, `m·k`, row-major like `x`, within ±[`ActPrecision::max`].
    pub q: Vec<i16>,
    /// One scale per block (`m·k / 32`): a value is `q · scale`.
    pub scale: Vec<f32>,
    /// Each block's sum (`m·k / 32`), for the minimum terms of Q4_1, Q5_1 and the K-formats:
    /// at 16 bits the exact f32 sum of its original values; at 8 bits the sum of its
    /// rounded ones, `scale·Σq`, so that a weight's minimum meets the same rounded
    /// activations as the rest of the weight. (With the exact sum, each activation's
    /// rounding error would meet only the weight's offset from its block's minimum, 0 to 15
    /// steps of a 4-bit scale, rather than the weight itself, about −8 to 7 steps, and the
    /// default model's KL divergence from f32 grows several times over: BENCHMARKS.md,
    /// Quality of the quantized paths.)
    pub sum: Vec<f32>,
    /// For up to [`HALF_SUMS_MAX_ROWS`] rows, the integer sum of `q` over each half-block of
    /// 16 elements (two per block, `m·k / 16`): the GEMV kernels take a format's offset
    /// (Q4_0's −8, Q5_0's −16, Q6_K's −32) off the weights' sums once per block, exactly,
    /// instead of off every weight. Empty for more rows.
    pub isum16: Vec<i32>,
    /// At [`ActPrecision::Wide`], when [`QuantizedActs::add_split`] made it: every integer
    /// split into bytes as `q = 256·hi + lo` (`hi` the arithmetic high byte, −128..=127,
    /// `lo` the low byte read unsigned), which the interleaved 4-bit kernels
    /// ([`crate::quant::x8`]) multiply byte by byte (`maddubs`) and put back together
    /// exactly. One [`SplitBlock`] per block of each row, in tiles of [`TILE_ROWS`] rows:
    /// within a tile, block by block, and the tile's rows within each block
    /// ([`QuantizedActs::tile_at`]), so that a kernel taking a tile of rows against a column
    /// of weight blocks reads one stream. Else empty.
    pub split: Vec<SplitBlock>,
    /// At [`ActPrecision::Byte`], for every row, the integers as bytes: one [`ByteBlock`]
    /// per block of each row, in the tiles of [`QuantizedActs::split`]. Empty at
    /// [`ActPrecision::Wide`].
    pub bytes: Vec<ByteBlock>,
    /// Each block's scale, sum and integer sum, in the order of the tiles, for whichever of
    /// [`QuantizedActs::split`] and [`QuantizedActs::bytes`] is there.
    pub tile_meta: Vec<TileMeta>,
    /// The precision `q` holds.
    pub precision: ActPrecision,
    /// Rows.
    pub m: usize,
    /// Elements per row (a multiple of 32).
    pub k: usize,
}

impl QuantizedActs {
    /// Blocks per row.
    pub fn blocks_per_row(&self) -> usize {
        self.k / ACT_BLOCK
    }

    /// Quantizes `x[m, k]` into `self` at 16 bits ([`ActPrecision::Wide`]), growing its
    /// buffers when needed.
    ///
    /// Errors, leaving `self` as it was, unless `k` is a multiple of 32 and
    /// `x.len() == m·k`.
    ///
    /// Non-finite values make their block's scale non-finite, so that the GEMV's result is
    /// NaN or infinite as an f32 product would be: nothing is hidden.
    pub fn quantize(&mut self, x: &[f32], m: usize, k: usize) -> Result<()> {
        self.quantize_at(x, m, k, ActPrecision::Wide)
    }

    /// [`QuantizedActs::quantize`] at `precision`; at [`ActPrecision::Byte`] also the byte
    /// layout ([`QuantizedActs::bytes`]) for every row.
    ///
    /// ```
    /// use qkv_kernels::quant::act::{ActPrecision, QuantizedActs};
    /// let mut acts = QuantizedActs::default();
    /// let mut x = vec![0.25f32; 20 * 32];
    /// x[17 * 32 + 1] = -0.5;
    /// acts.quantize_at(&x, 20, 32, ActPrecision::Byte).unwrap();
    /// acts.check().unwrap();
    /// // Row 17, block 0: 0.25 is half the block's largest magnitude.
    /// let at = acts.tile_at(17, 0);
    /// assert_eq!(&acts.bytes[at].q[..3], &[64, -127, 64]);
    /// assert_eq!(acts.tile_meta[at].scale, 0.5 / 127.0);
    /// ```
    pub fn quantize_at(
        &mut self,
        x: &[f32],
        m: usize,
        k: usize,
        precision: ActPrecision,
    ) -> Result<()> {
        if !k.is_multiple_of(ACT_BLOCK) {
            return Err(KernelError::Mismatch {
                what: "quantized activations: k must be a multiple of the 32-element block",
                left: k,
                right: ACT_BLOCK,
            });
        }
        let needed = m.checked_mul(k).ok_or_else(|| {
            KernelError::Invalid(format!("quantized activations: {m}·{k} elements overflow"))
        })?;
        check_len("x", needed, x.len())?;
        self.quantize_validated(x, m, k, precision);
        Ok(())
    }

    /// [`QuantizedActs::quantize_at`] for callers that validated `k % 32 == 0` and
    /// `x.len() == m·k` (the matmul entry points check their shapes before they get here).
    pub(crate) fn quantize_validated(
        &mut self,
        x: &[f32],
        m: usize,
        k: usize,
        precision: ActPrecision,
    ) {
        debug_assert!(k.is_multiple_of(ACT_BLOCK) && x.len() == m * k);
        let blocks = m * k / ACT_BLOCK;
        self.q.resize(m * k, 0);
        self.scale.resize(blocks, 0.0);
        self.sum.resize(blocks, 0.0);
        self.m = m;
        self.k = k;
        self.precision = precision;
        quantize_any(x, &mut self.q, &mut self.scale, &mut self.sum, precision);
        self.isum16.clear();
        self.split.clear();
        self.bytes.clear();
        self.tile_meta.clear();
        if m <= HALF_SUMS_MAX_ROWS {
            self.isum16.extend(
                self.q
                    .chunks_exact(16)
                    .map(|h| h.iter().map(|&v| i32::from(v)).sum::<i32>()),
            );
        }
        if precision == ActPrecision::Byte {
            self.fill_bytes();
        }
    }

    /// Lays the 8-bit integers out as [`QuantizedActs::bytes`], with their
    /// [`QuantizedActs::tile_meta`].
    fn fill_bytes(&mut self) {
        let (m, bpr) = (self.m, self.blocks_per_row());
        self.bytes.resize(m * bpr, ByteBlock { q: [0; ACT_BLOCK] });
        self.fill_tile_meta();
        for row in 0..m {
            for b in 0..bpr {
                let (src, at) = (row * bpr + b, self.tile_at(row, b));
                let q = &self.q[ACT_BLOCK * src..ACT_BLOCK * (src + 1)];
                for (o, &v) in self.bytes[at].q.iter_mut().zip(q) {
                    // Within ±127 at this precision.
                    *o = v as i8;
                }
            }
        }
    }

    /// Fills the byte split ([`QuantizedActs::split`], with its
    /// [`QuantizedActs::tile_meta`]) of 16-bit activations, for every row: the kernels of
    /// interleaved 4-bit weights read it at [`ActPrecision::Wide`]. Does nothing when it is
    /// already there, or at [`ActPrecision::Byte`] (whose [`QuantizedActs::bytes`] those
    /// kernels read instead).
    ///
    /// ```
    /// use qkv_kernels::quant::act::QuantizedActs;
    /// let mut acts = QuantizedActs::default();
    /// acts.quantize(&vec![0.25; 20 * 32], 20, 32).unwrap();
    /// assert!(!acts.has_tiles());
    /// acts.add_split();
    /// assert!(acts.has_tiles());
    /// acts.check().unwrap();
    /// // Row 17, block 0: 32767 = 256·127 + 255.
    /// let at = acts.tile_at(17, 0);
    /// assert_eq!((acts.split[at].hi[0], acts.split[at].lo[0]), (127, 255));
    /// ```
    pub fn add_split(&mut self) {
        if self.has_tiles() || self.precision == ActPrecision::Byte {
            return;
        }
        let (m, bpr) = (self.m, self.blocks_per_row());
        let empty = SplitBlock {
            hi: [0; ACT_BLOCK],
            lo: [0; ACT_BLOCK],
        };
        self.split.resize(m * bpr, empty);
        self.fill_tile_meta();
        for row in 0..m {
            for b in 0..bpr {
                let (src, at) = (row * bpr + b, self.tile_at(row, b));
                let q = &self.q[ACT_BLOCK * src..ACT_BLOCK * (src + 1)];
                let out = &mut self.split[at];
                for (e, &v) in q.iter().enumerate() {
                    out.hi[e] = (v >> 8) as i8;
                    out.lo[e] = v as u8;
                }
            }
        }
    }

    /// Every block's [`TileMeta`] in the order of the tiles.
    fn fill_tile_meta(&mut self) {
        let (m, bpr) = (self.m, self.blocks_per_row());
        self.tile_meta.resize(m * bpr, TileMeta::default());
        for row in 0..m {
            for b in 0..bpr {
                let (src, at) = (row * bpr + b, self.tile_at(row, b));
                let q = &self.q[ACT_BLOCK * src..ACT_BLOCK * (src + 1)];
                self.tile_meta[at] = TileMeta {
                    scale: self.scale[src],
                    sum: self.sum[src],
                    isum: q.iter().map(|&v| i32::from(v)).sum(),
                    isum_lo: q[..16].iter().map(|&v| i32::from(v)).sum(),
                };
            }
        }
    }

    /// Where block `b` of row `row` sits in [`QuantizedActs::split`] and
    /// [`QuantizedActs::bytes`]: tile `t = row / 8` starts after the `8t` rows before it,
    /// and within a tile of `r` rows (8, or fewer for the last) block `b` of its row `i` is
    /// entry `b·r + i`.
    pub fn tile_at(&self, row: usize, b: usize) -> usize {
        let t0 = row / TILE_ROWS * TILE_ROWS;
        let r = TILE_ROWS.min(self.m - t0);
        t0 * self.blocks_per_row() + b * r + (row - t0)
    }

    /// True when the tiles the interleaved 4-bit kernels read cover all `m` rows: the byte
    /// split at [`ActPrecision::Wide`], the bytes at [`ActPrecision::Byte`].
    pub fn has_tiles(&self) -> bool {
        let blocks = self.q.len() / ACT_BLOCK;
        let tiles = match self.precision {
            ActPrecision::Wide => self.split.len(),
            ActPrecision::Byte => self.bytes.len(),
        };
        blocks > 0 && tiles == blocks && self.tile_meta.len() == blocks
    }

    /// Checks that the buffers agree with `m`, `k` and the precision (`k` a multiple of
    /// 32, `m·k` integers, one scale and one sum per block, the bytes at
    /// [`ActPrecision::Byte`], the byte split at [`ActPrecision::Wide`] if there is one), as
    /// [`QuantizedActs::quantize_at`] and [`QuantizedActs::add_split`] leave them. The fields are public, so the kernels that read them through raw
    /// pointers check them first.
    pub fn check(&self) -> Result<()> {
        if !self.k.is_multiple_of(ACT_BLOCK) {
            return Err(KernelError::Mismatch {
                what: "quantized activations: k must be a multiple of the 32-element block",
                left: self.k,
                right: ACT_BLOCK,
            });
        }
        let elems = self.m.checked_mul(self.k).ok_or_else(|| {
            KernelError::Invalid(format!(
                "quantized activations: {}·{} elements overflow",
                self.m, self.k
            ))
        })?;
        check_len("quantized activations q", elems, self.q.len())?;
        check_len(
            "quantized activations scale",
            elems / ACT_BLOCK,
            self.scale.len(),
        )?;
        check_len(
            "quantized activations sum",
            elems / ACT_BLOCK,
            self.sum.len(),
        )?;
        if self.m <= HALF_SUMS_MAX_ROWS {
            check_len(
                "quantized activations isum16",
                elems / 16,
                self.isum16.len(),
            )?;
        }
        let tiles = match self.precision {
            ActPrecision::Byte => Some(("quantized activations bytes", self.bytes.len())),
            ActPrecision::Wide if !self.split.is_empty() || !self.tile_meta.is_empty() => {
                Some(("quantized activations split", self.split.len()))
            }
            ActPrecision::Wide => None,
        };
        if let Some((what, len)) = tiles {
            check_len(what, elems / ACT_BLOCK, len)?;
            check_len(
                "quantized activations tile_meta",
                elems / ACT_BLOCK,
                self.tile_meta.len(),
            )?;
        }
        Ok(())
    }
}

/// Quantizes whole blocks at `precision` with AVX2 where the CPU has it, else with the
/// scalar loop.
fn quantize_any(
    x: &[f32],
    q: &mut [i16],
    scale: &mut [f32],
    sum: &mut [f32],
    precision: ActPrecision,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa().avx2_fma_f16c {
        // SAFETY: AVX2 and FMA were detected at run time just above (the function's only
        // contract: it indexes through chunks and bounds-checked slots).
        unsafe { avx2::quantize(x, q, scale, sum, precision.max()) };
    } else {
        quantize_blocks(x, q, scale, sum, precision.max());
    }
    #[cfg(not(target_arch = "x86_64"))]
    quantize_blocks(x, q, scale, sum, precision.max());
    rounded_sums(q, scale, sum, precision);
}

/// At [`ActPrecision::Byte`], replaces each block's exact sum by the sum of its rounded
/// values, `scale·Σq` (see [`QuantizedActs::sum`]).
fn rounded_sums(q: &[i16], scale: &[f32], sum: &mut [f32], precision: ActPrecision) {
    if precision == ActPrecision::Byte {
        for ((qb, s), out) in q.chunks_exact(ACT_BLOCK).zip(scale).zip(sum) {
            // At most 32·127 in magnitude: exact in f32.
            let isum: i32 = qb.iter().map(|&v| i32::from(v)).sum();
            *out = s * isum as f32;
        }
    }
}

/// The scale and its inverse for a block whose largest magnitude is `amax`, for integers
/// up to `max`.
#[inline(always)]
fn scales(amax: f32, max: f32) -> (f32, f32) {
    if !amax.is_finite() {
        // A NaN or infinity in the block: the scale carries it into the result.
        (amax, 0.0)
    } else if max / amax < f32::INFINITY {
        (amax / max, max / amax)
    } else {
        // Zero, or so small (below 1e-34) that max / amax overflows: a block of values
        // whose products with any weight are lost in f32 rounding anyway.
        (0.0, 0.0)
    }
}

/// The plain reference for [`QuantizedActs::quantize_at`]'s integers, scales and sums:
/// round half away from zero.
///
/// Errors unless `x.len()` is a multiple of 32, `q` holds as many values as `x`, and `scale`
/// and `sum` one per block of 32.
#[cfg(any(test, feature = "testing"))]
pub fn quantize_scalar(
    x: &[f32],
    q: &mut [i16],
    scale: &mut [f32],
    sum: &mut [f32],
    precision: ActPrecision,
) -> Result<()> {
    if !x.len().is_multiple_of(ACT_BLOCK) {
        return Err(KernelError::Mismatch {
            what: "quantize_scalar: x must be whole 32-element blocks",
            left: x.len(),
            right: ACT_BLOCK,
        });
    }
    check_len("q", x.len(), q.len())?;
    check_len("scale", x.len() / ACT_BLOCK, scale.len())?;
    check_len("sum", x.len() / ACT_BLOCK, sum.len())?;
    quantize_blocks(x, q, scale, sum, precision.max());
    rounded_sums(q, scale, sum, precision);
    Ok(())
}

/// The loop of [`quantize_scalar`], lengths already checked.
fn quantize_blocks(x: &[f32], q: &mut [i16], scale: &mut [f32], sum: &mut [f32], max: f32) {
    for (b, (xb, qb)) in x
        .chunks_exact(ACT_BLOCK)
        .zip(q.chunks_exact_mut(ACT_BLOCK))
        .enumerate()
    {
        // `f32::max` skips NaN; keep it visible instead.
        let amax = xb.iter().fold(0.0f32, |a, v| {
            if v.is_nan() || a.is_nan() {
                f32::NAN
            } else {
                a.max(v.abs())
            }
        });
        let (s, inv) = scales(amax, max);
        scale[b] = s;
        sum[b] = sum8(xb);
        for (o, &v) in qb.iter_mut().zip(xb) {
            let t = v * inv;
            *o = (t + 0.5f32.copysign(t)) as i16;
        }
    }
}

/// The sum of 32 values in the order the AVX2 path adds them: 8 lanes of 4 values each,
/// then the lanes pairwise (so both paths give the same bits).
#[inline(always)]
fn sum8(xb: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    for chunk in xb.chunks_exact(8) {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *l += v;
        }
    }
    let quads = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    let pairs = [quads[0] + quads[2], quads[1] + quads[3]];
    pairs[0] + pairs[1]
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{scales, ACT_BLOCK};
    use core::arch::x86_64::*;

    /// [`super::quantize_scalar`] with 256-bit vectors; the same bits. A safe function: it
    /// walks whole chunks of 32 and writes `scale` and `sum` through bounds-checked indices,
    /// so calling it is `unsafe` only for the CPU features (AVX2 and FMA).
    #[target_feature(enable = "avx2,fma")]
    pub fn quantize(x: &[f32], q: &mut [i16], scale: &mut [f32], sum: &mut [f32], max: f32) {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
        let half = _mm256_set1_ps(0.5);
        for (b, (xb, qb)) in x
            .chunks_exact(ACT_BLOCK)
            .zip(q.chunks_exact_mut(ACT_BLOCK))
            .enumerate()
        {
            let p = xb.as_ptr();
            // SAFETY: each chunk holds 32 floats: four loads of 8.
            let v = unsafe {
                [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ]
            };
            // Largest magnitude, NaN-propagating: a NaN compares unordered with itself.
            let mut amax = _mm256_setzero_ps();
            let mut nan = _mm256_setzero_ps();
            for vi in v {
                amax = _mm256_max_ps(amax, _mm256_and_ps(vi, abs_mask));
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(vi, vi));
            }
            let mut lanes = [0.0f32; 8];
            // SAFETY: 8 floats fit `lanes`.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), amax) };
            let mut a = lanes.iter().fold(0.0f32, |m, &l| m.max(l));
            if _mm256_movemask_ps(nan) != 0 {
                a = f32::NAN;
            }
            let (s, inv) = scales(a, max);
            scale[b] = s;
            // Same order as the scalar `sum8`: lanes over the 4 vectors, then halves.
            let s4 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), v[2]), v[3]);
            let quad = _mm_add_ps(_mm256_castps256_ps128(s4), _mm256_extractf128_ps::<1>(s4));
            let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
            let one = _mm_add_ss(pair, _mm_shuffle_ps::<0b01>(pair, pair));
            sum[b] = _mm_cvtss_f32(one);
            let invv = _mm256_set1_ps(inv);
            let mut ints = [_mm256_setzero_si256(); 4];
            for (o, vi) in ints.iter_mut().zip(v) {
                let t = _mm256_mul_ps(vi, invv);
                let r = _mm256_add_ps(t, _mm256_or_ps(half, _mm256_and_ps(t, sign_mask)));
                *o = _mm256_cvttps_epi32(r);
            }
            // Pack to i16 (saturating; values are within ±max) and undo the lane interleave.
            let lo =
                _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(ints[0], ints[1]));
            let hi =
                _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(ints[2], ints[3]));
            // SAFETY: each chunk of q holds 32 i16: two stores of 16.
            unsafe {
                _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, lo);
                _mm256_storeu_si256(qb.as_mut_ptr().add(16) as *mut __m256i, hi);
            }
        }
    }
}

#[cfg(test)]
mod tests;
