//! `y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n])`: the `nn.Linear` product, with `W` stored f32,
//! f16, bf16 or in GGUF quantized blocks ([`Weights`]) in PyTorch's `[out_features, in_features]`
//! layout (or, for f32 weights that only ever meet many rows, transposed: [`Weights::F32T`]),
//! and activations in f32.
//!
//! - Few rows (`m ≤` [`GEMV_MAX_ROWS`], decode): our own GEMV streams `W` once, split across
//!   threads by rows of `W`: f16 and bf16 widened to f32 in registers (bf16 then runs the
//!   f32 kernel's FMAs in its order, so it gives the bits of the same matrix stored in f32),
//!   quantized blocks multiplied as
//!   integers against `x` rounded to 16 bits per 32 values ([`crate::quant::gemv`]).
//! - Interleaved quantized weights ([`Weights::QuantX8`]), any number of rows: the same
//!   split of `W`'s rows across threads, each group of 8 rows met by every row of `x` in
//!   tiles of 8 while it sits in cache, as integers ([`crate::quant::x8`]): `W` is read from
//!   memory once per call, for a decode step, a batched step or a prompt alike.
//! - f32, f16 and bf16 weights up to [`FLOAT_ONE_PASS_MAX_ROWS`] rows whose `x` stays in L2
//!   ([`ONE_PASS_X_ELEMS`]; a batched step): the same split, every row of `x` in one pass,
//!   in register tiles of 4 rows of `x` by 3 of `W`.
//! - Many rows (prefill) of f16 and bf16 weights, where the CPU has AVX2, FMA and F16C: our
//!   own blocked GEMM, widening each block of `W` once into the micro-kernel's layout
//!   (`f16gemm`).
//! - Many rows (prefill) of other formats: the gemm crate in f32, parallel with rayon; the
//!   crate picks its AVX-512 micro-kernels at run time where the CPU has them (its `x86-v4`
//!   feature), else AVX2/FMA. 16-bit and quantized weights are widened to f32 one cache-sized
//!   panel of rows at a time inside the call, never as a whole-matrix copy.
//!
//! ```
//! use qkv_kernels::{linear, Weights};
//! // y = x·Wᵀ + b with x [1, 2], W [3, 2]
//! let x = [1.0, 2.0];
//! let w = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let b = [0.5, 0.5, 0.5];
//! let mut y = [0.0; 3];
//! linear(&mut y, &x, Weights::F32(&w), Some(&b), 1, 2, 3).unwrap();
//! assert_eq!(y, [1.5, 2.5, 3.5]);
//! ```

#[cfg(target_arch = "x86_64")]
mod f16gemm;
mod gemv;
#[cfg(test)]
mod tests;

use crate::error::{check_len, check_nonzero, KernelError, Result};
use crate::par::SharedOut;
use crate::quant::{self, act::ActPrecision, QuantFormat};
use gemv::{gemv, gemv_parts, GemvPart};
use half::{bf16, f16};
use rayon::prelude::*;
use std::cell::RefCell;

/// Up to this many rows of `x`, [`linear`] takes the streaming GEMV instead of gemm.
pub const GEMV_MAX_ROWS: usize = 8;
// The quantized GEMV kernels take at most this many rows per call.
const _: () = assert!(GEMV_MAX_ROWS <= quant::gemv::MAX_ROWS);

/// Up to this many rows, quantized weights in GGUF's layout run as GEMVs of
/// [`GEMV_MAX_ROWS`] rows each, on every CPU: each row then gets exactly the bits it gets
/// alone, so a verify pass of speculative decoding or a batched step of up to this many
/// sequences gives the tokens of one-row steps. Taller `x` (prefill) takes the integer GEMM
/// where AVX-512 VNNI runs it, else f32 panels widened for gemm. (Interleaved weights give
/// a row the same bits at any height.)
pub const QUANT_GEMV_MAX_ROWS: usize = 16;

/// Up to this many rows, and while `x` holds no more than [`ONE_PASS_X_ELEMS`], f32 and f16
/// weights (`[n, k]`) meet all rows of `x` in one pass of the GEMV's split of `W`'s rows, in
/// register tiles of 4 rows of `x` by 3 of `W`, rather than going to a GEMM that widens `W`
/// (f16: our own, with its 6 × 32 tiles; f32: the gemm crate): up to here the one pass
/// was as fast or faster in `gemm_rows f16` ([BENCHMARKS.md](../../BENCHMARKS.md), Kernels),
/// and a row's bits stay those of a decode step.
pub const FLOAT_ONE_PASS_MAX_ROWS: usize = 256;

/// Elements of `x` (`m·k`) one pass over `W` keeps at most: every block of `W` in a thread's
/// piece walks all of the call's `x`, so beyond what L2 holds (1 MiB of f32, 0.6 MiB of
/// 16-bit activations with their byte split, 0.35 MiB at 8 bits) `x` comes from L3 or
/// memory. f32 and f16 weights take the GEMM past it, where it starts to win; interleaved
/// weights take taller `x` in chunks (`one_pass_chunk_rows`).
pub const ONE_PASS_X_ELEMS: usize = 1 << 18;

/// How [`linear`] runs `m` rows of `x` against a matrix: decided in one place, [`plan`], from
/// the weights' kind and layout, `m`, `k` and the CPU, then carried out as it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// The GEMV's split of `W`'s rows across the threads, `rows` rows of `x` per call: all
    /// of them in one pass (up to a chunk of [`one_pass_chunk_rows`]) where [`one_pass`]
    /// takes the matrix, else [`GEMV_MAX_ROWS`].
    Gemv { rows: usize },
    /// f32 weights (either layout) through the gemm crate.
    F32Gemm,
    /// f16 and bf16 weights through our own blocked GEMM (AVX2, FMA, F16C).
    F16Gemm,
    /// Quantized weights (either layout) through the integer GEMM (AVX-512 VNNI).
    IntGemm,
    /// Anything else: panels of `W` widened to f32 for the gemm crate.
    Panels,
}

/// The one dispatch decision of [`linear`] and [`linear_many`]: the GEMV where it reads
/// `W` once for all rows ([`one_pass`]), for every format but [`Weights::F32T`] up to
/// [`GEMV_MAX_ROWS`] rows and for quantized weights up to [`QUANT_GEMV_MAX_ROWS`]; past
/// those, the GEMM of the weights' kind that this CPU runs.
fn plan(w: Weights<'_>, m: usize, k: usize) -> Path {
    if one_pass(w, m, k) {
        return Path::Gemv {
            rows: m.min(one_pass_chunk_rows(k)),
        };
    }
    let gemv_max = match w {
        Weights::F32T(_) => 0,
        Weights::Quant(..) | Weights::QuantX8(..) => QUANT_GEMV_MAX_ROWS,
        Weights::F32(_) | Weights::F16(_) | Weights::BF16(_) => GEMV_MAX_ROWS,
    };
    if m <= gemv_max {
        return Path::Gemv {
            rows: GEMV_MAX_ROWS,
        };
    }
    match w {
        Weights::F32(_) | Weights::F32T(_) => Path::F32Gemm,
        #[cfg(target_arch = "x86_64")]
        Weights::F16(_) | Weights::BF16(_) if f16gemm::available() => Path::F16Gemm,
        Weights::Quant(..) | Weights::QuantX8(..) if quant::gemm::available() => Path::IntGemm,
        _ => Path::Panels,
    }
}

/// True when the GEMV takes all `m` rows of `x` in one pass over `w`, so that `W` is read
/// from memory once per call: interleaved weights, whose kernel takes the rows in tiles of
/// 8 against each group of `W` while it sits in cache (up to [`x8_one_pass_max_rows`], in
/// chunks of [`one_pass_chunk_rows`]); and f32/f16/bf16 weights up to [`FLOAT_ONE_PASS_MAX_ROWS`]
/// rows and [`ONE_PASS_X_ELEMS`] elements of `x`.
fn one_pass(w: Weights<'_>, m: usize, k: usize) -> bool {
    match w {
        Weights::QuantX8(format, precision, _) => m <= x8_one_pass_max_rows(format, precision),
        Weights::F32(_) | Weights::F16(_) | Weights::BF16(_) => {
            m <= FLOAT_ONE_PASS_MAX_ROWS && m.saturating_mul(k) <= ONE_PASS_X_ELEMS
        }
        _ => false,
    }
}

/// Up to how many rows interleaved weights of `format` take the one-pass GEMV rather than
/// the integer GEMM: all rows where the GEMM does not run (without AVX-512 VNNI). Where it
/// does, the GEMM reads GGUF's layout, so each of its panels first takes its rows apart
/// again; at 8 bits the interleaved kernels (on `vpdpbusd` there) are faster at every
/// count of rows, and at 16 bits until the GEMM's integer rate pays for that, past about
/// 64 rows except for Q6_K (`gemm_rows`; [BENCHMARKS.md](../../BENCHMARKS.md), Kernels).
/// The GEMM gives a row the bits the interleaved kernels give it; Q3_K, Q5_K, IQ4_NL and
/// IQ4_XS never take it.
fn x8_one_pass_max_rows(format: QuantFormat, precision: ActPrecision) -> usize {
    if !quant::gemm::available() || precision == ActPrecision::Byte {
        return usize::MAX;
    }
    match format {
        // The 16-bit kernels of Q3_K, Q5_K and the IQ4 formats (`madd`, as Q8_0's) are not
        // held to the GEMM's order of f32 steps (Q3_K's scales, per 16 elements, apply one
        // by one there), so they keep every height to themselves.
        QuantFormat::Q6_K
        | QuantFormat::Q3_K
        | QuantFormat::Q5_K
        | QuantFormat::IQ4_NL
        | QuantFormat::IQ4_XS => usize::MAX,
        _ => 64,
    }
}

/// Rows of `x` per one-pass GEMV call over interleaved weights for rows of `k` elements:
/// about [`ONE_PASS_X_ELEMS`], never fewer than 64 (each chunk streams `W` again), and a
/// multiple of the kernels' tile of 8 rows, so that every row meets the same tile (and
/// gets the same bits) as in one call over all rows. Each group of `W` reads all of the
/// call's `x`, so in one call taller `x` would come from memory instead of L2.
fn one_pass_chunk_rows(k: usize) -> usize {
    (ONE_PASS_X_ELEMS / k.max(1)).max(64) / quant::act::TILE_ROWS * quant::act::TILE_ROWS
}

/// A weight matrix `[n, k]` (row-major, one row per output feature) as it is stored:
/// f32, f16, bf16, or whole blocks of a GGUF quantized format; or f32 transposed. Activations are
/// always f32.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    /// 32-bit floats.
    F32(&'a [f32]),
    /// 32-bit floats stored transposed, `[k, n]`: one row per input feature. gemm reads this
    /// layout in whole rows where `[n, k]` makes it gather one value from each row, which
    /// is faster. For weights that only ever meet many rows (encoders); every call, even
    /// of one row, goes to gemm.
    F32T(&'a [f32]),
    /// IEEE half floats, widened to f32 inside the kernels.
    F16(&'a [f16]),
    /// bfloat16 (the top 16 bits of an f32), widened to f32 inside the kernels: exactly, by
    /// a shift, so every product gives the bits of the same matrix in [`Weights::F32`] on
    /// the paths that take both alike (the GEMV, and the one pass up to
    /// [`FLOAT_ONE_PASS_MAX_ROWS`]).
    BF16(&'a [bf16]),
    /// Blocks of a quantized format, row after row (each row `k / block` whole blocks),
    /// decoded inside the kernels.
    Quant(QuantFormat, &'a [u8]),
    /// The same blocks with every 8 rows interleaved ([`quant::x8`]: Q4_0, Q4_1, Q4_K, Q6_K,
    /// Q8_0, Q3_K, Q5_K, IQ4_NL and IQ4_XS, `n` a multiple of 8), the layout the matrix products read fastest for any
    /// number of rows, and the precision at which the activations meet them on every path
    /// (the operand carries it, so that every product of a model, alone or batched, sees
    /// the same one, and two models in one process may differ). As many bytes as
    /// [`Weights::Quant`]; [`Weights::rows_to_f32`] and the other paths take the rows apart
    /// again.
    QuantX8(QuantFormat, ActPrecision, &'a [u8]),
}

impl Weights<'_> {
    /// Number of elements (for [`Weights::Quant`], those its whole blocks hold).
    pub fn len(&self) -> usize {
        match self {
            Weights::F32(w) | Weights::F32T(w) => w.len(),
            Weights::F16(w) => w.len(),
            Weights::BF16(w) => w.len(),
            Weights::Quant(f, b) | Weights::QuantX8(f, _, b) => {
                b.len() / f.block_bytes() * f.block_elems()
            }
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the matrix takes: what a pass over it reads from memory.
    pub fn bytes(&self) -> usize {
        match self {
            Weights::F32(w) | Weights::F32T(w) => std::mem::size_of_val(*w),
            Weights::F16(w) => std::mem::size_of_val(*w),
            Weights::BF16(w) => std::mem::size_of_val(*w),
            Weights::Quant(_, b) | Weights::QuantX8(_, _, b) => b.len(),
        }
    }

    /// True for block-quantized weights, in either layout.
    pub fn is_quantized(&self) -> bool {
        matches!(self, Weights::Quant(..) | Weights::QuantX8(..))
    }

    /// The precision at which the activations meet these weights, for quantized ones: 16
    /// bits in GGUF's layout, the operand's own for the interleaved layout. It depends on
    /// the matrix, never on the number of rows, so a row's result does not depend on the
    /// rows beside it.
    pub fn act_precision(&self) -> Option<ActPrecision> {
        match self {
            Weights::Quant(..) => Some(ActPrecision::Wide),
            Weights::QuantX8(_, precision, _) => Some(*precision),
            _ => None,
        }
    }

    /// Checks that the matrix is exactly `n` rows of `k` (for quantized formats, `k` whole
    /// blocks per row).
    pub fn check_shape(&self, n: usize, k: usize) -> Result<()> {
        match self {
            Weights::Quant(f, b) => check_len(
                "weights (bytes)",
                product("n·row bytes", n, f.row_bytes(k)?)?,
                b.len(),
            ),
            Weights::QuantX8(f, _, b) => {
                check_len("weights (bytes)", quant::x8::check(*f, n, k)?, b.len())
            }
            _ => check_len("weights", product("n·k", n, k)?, self.len()),
        }
    }

    /// Rows `j0..j0 + rows` of the `[n, k]` matrix widened to f32 into `dst` (`rows·k`
    /// values): exact, so it serves as the reference, the embedding lookup and the panels
    /// of the prefill path. Errors when the rows or `dst` do not fit the matrix.
    pub fn rows_to_f32(&self, j0: usize, rows: usize, k: usize, dst: &mut [f32]) -> Result<()> {
        check_len("dst", product("rows·k", rows, k)?, dst.len())?;
        // The element (or byte) range of the rows, checked: a wrapped product could land
        // inside the slice.
        let span = |per_row: usize, len: usize, what: &'static str| {
            let start = j0.checked_mul(per_row);
            let end = j0
                .checked_add(rows)
                .and_then(|e| e.checked_mul(per_row))
                .filter(|&e| e <= len);
            match (start, end) {
                (Some(s), Some(e)) => Ok(s..e),
                _ => Err(KernelError::Invalid(format!(
                    "{what}: rows {j0}..{j0}+{rows} of {per_row} lie outside the {len} there are"
                ))),
            }
        };
        match self {
            Weights::F32(w) => {
                dst.copy_from_slice(&w[span(k, w.len(), "weights")?]);
                Ok(())
            }
            Weights::F16(w) => crate::convert::f16_to_f32(&w[span(k, w.len(), "weights")?], dst),
            Weights::BF16(w) => crate::convert::bf16_to_f32(&w[span(k, w.len(), "weights")?], dst),
            Weights::F32T(w) => {
                // Row j of W is column j of the stored [k, n]: every n-th value.
                let n = w.len().checked_div(k).unwrap_or(0);
                span(1, n, "weights")?;
                for r in 0..rows {
                    for p in 0..k {
                        dst[r * k + p] = w[p * n + j0 + r];
                    }
                }
                Ok(())
            }
            Weights::Quant(f, b) => {
                f.dequantize(&b[span(f.row_bytes(k)?, b.len(), "weights (bytes)")?], dst)
            }
            Weights::QuantX8(f, _, b) => {
                let blocks = rows * f.row_bytes(k)?;
                UNPACKED.with(|u| {
                    let mut u = u.borrow_mut();
                    if u.len() < blocks {
                        u.resize(blocks, 0);
                    }
                    quant::x8::unpack_rows(*f, b, k, j0, rows, &mut u[..blocks])?;
                    f.dequantize(&u[..blocks], dst)
                })
            }
        }
    }
}

/// `a · b` for the shape product named `what` (e.g. `"m·k"`), or an error naming it.
fn product(what: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| KernelError::Invalid(format!("linear: {what} = {a} × {b} overflows usize")))
}

#[allow(clippy::too_many_arguments)]
fn validate(
    y: &[f32],
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    check_nonzero("m", m)?;
    check_nonzero("k", k)?;
    check_nonzero("n", n)?;
    // Checked: a wrapped product could match a short slice and let the kernels run off it.
    check_len("x", product("m·k", m, k)?, x.len())?;
    w.check_shape(n, k)?;
    check_len("y", product("m·n", m, n)?, y.len())?;
    if let Some(b) = bias {
        check_len("bias", n, b.len())?;
    }
    Ok(())
}

/// `y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias)`, overwriting `y`.
///
/// Picks the GEMV for `m ≤ GEMV_MAX_ROWS` (for quantized weights, GEMVs of that many rows
/// up to [`QUANT_GEMV_MAX_ROWS`]; for interleaved weights, one pass over all rows up to
/// `x8_one_pass_max_rows`) and gemm otherwise; both use rayon's current pool.
/// Errors if a slice length disagrees with `m`, `k`, `n`, a dimension is zero, or a product
/// of them (`m·k`, `n·k`, `m·n`) overflows `usize`.
pub fn linear(
    y: &mut [f32],
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    validate(y, x, w, bias, m, k, n)?;
    match (plan(w, m, k), w) {
        (Path::Gemv { rows: step }, _) => {
            for (r0, rows) in (0..m).step_by(step).map(|r| (r, step.min(m - r))) {
                let (xs, ys) = (&x[r0 * k..(r0 + rows) * k], &mut y[r0 * n..(r0 + rows) * n]);
                gemv(ys, xs, w, bias, rows, k, n);
            }
        }
        (Path::F32Gemm, Weights::F32(w)) => gemm_f32(y, x, Rhs::Rows(w), bias, m, k, n),
        (Path::F32Gemm, Weights::F32T(w)) => gemm_f32(y, x, Rhs::Cols(w), bias, m, k, n),
        #[cfg(target_arch = "x86_64")]
        (Path::F16Gemm, Weights::F16(w)) => f16gemm::gemm(y, x, w, bias, m, k, n),
        #[cfg(target_arch = "x86_64")]
        (Path::F16Gemm, Weights::BF16(w)) => f16gemm::gemm(y, x, w, bias, m, k, n),
        (Path::IntGemm, Weights::Quant(format, blocks)) => {
            gemv::with_quantized(x, m, k, ActPrecision::Wide, false, |acts| {
                quant::gemm::gemm(y, acts, format, blocks, bias, n)
            })?;
        }
        (Path::IntGemm, Weights::QuantX8(format, precision, packed)) => {
            // At the operand's precision, which the interleaved kernels use too, so that
            // a row's result does not depend on how many rows came with it.
            gemv::with_quantized(x, m, k, precision, false, |acts| {
                quant::gemm::gemm_interleaved(y, acts, format, packed, bias, n)
            })?;
        }
        _ => gemm_panels(y, x, w, bias, m, k, n),
    }
    Ok(())
}

/// The plain reference for [`linear`]: one dot product per output, f32 accumulation over
/// the weights widened exactly to f32 (quantized ones by [`QuantFormat::dequantize`]).
#[cfg(any(test, feature = "testing"))]
pub fn linear_scalar(
    y: &mut [f32],
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    validate(y, x, w, bias, m, k, n)?;
    let mut row = vec![0.0f32; k];
    for j in 0..n {
        w.rows_to_f32(j, 1, k, &mut row)?;
        for i in 0..m {
            let mut acc = 0.0f32;
            for (xv, wv) in x[i * k..(i + 1) * k].iter().zip(&row) {
                acc += xv * wv;
            }
            y[i * n + j] = acc + bias.map_or(0.0, |b| b[j]);
        }
    }
    Ok(())
}

/// One of several projections of the same input, for [`linear_many`].
pub struct Projection<'a, 'y> {
    /// The weight matrix `[n, k]`.
    pub w: Weights<'a>,
    /// Optional bias `[n]`.
    pub bias: Option<&'a [f32]>,
    /// Output features `n`.
    pub n: usize,
    /// The output `[m, n]`, overwritten.
    pub y: &'y mut [f32],
}

/// Several products of the same `x[m, k]` at once: `p.y = x·p.wᵀ (+ p.bias)` for every
/// projection `p` (Q, K and V; or gate and up). Equal to calling [`linear`] on each, but in
/// the GEMV regime the rows of all matrices are split across the threads as one range, so
/// the group costs one hand-off instead of one per matrix, and no weight is copied to fuse
/// them. Errors as [`linear`] would on any projection.
pub fn linear_many(
    x: &[f32],
    m: usize,
    k: usize,
    projections: &mut [Projection<'_, '_>],
) -> Result<()> {
    for p in projections.iter() {
        validate(p.y, x, p.w, p.bias, m, k, p.n)?;
    }
    // The rows per GEMV call the group can share: the fewest any of its matrices takes, or
    // none when one of them goes to a GEMM.
    let step = projections
        .iter()
        .try_fold(usize::MAX, |step, p| match plan(p.w, m, k) {
            Path::Gemv { rows } => Some(step.min(rows)),
            _ => None,
        });
    let Some(step) = step.filter(|_| projections.len() <= MAX_GROUP) else {
        for p in projections.iter_mut() {
            linear(p.y, x, p.w, p.bias, m, k, p.n)?;
        }
        return Ok(());
    };
    // On the stack: the decode step allocates nothing.
    let mut parts = [GemvPart::EMPTY; MAX_GROUP];
    for r0 in (0..m).step_by(step) {
        let rows = step.min(m - r0);
        for (part, p) in parts.iter_mut().zip(projections.iter_mut()) {
            *part = GemvPart {
                w: p.w,
                bias: p.bias,
                n: p.n,
                y: SharedOut(p.y[r0 * p.n..].as_mut_ptr()),
            };
        }
        gemv_parts(
            &parts[..projections.len()],
            &x[r0 * k..(r0 + rows) * k],
            rows,
            k,
        );
    }
    Ok(())
}

/// Projections [`linear_many`] runs as one GEMV group; larger groups run one by one.
const MAX_GROUP: usize = 8;

/// `W` as gemm's right operand, the `k × n` matrix `Wᵀ`.
#[derive(Clone, Copy)]
enum Rhs<'a> {
    /// `W` stored `[n, k]`: `Wᵀ` read with row stride 1 and column stride `k`.
    Rows(&'a [f32]),
    /// `W` stored `[k, n]`: `Wᵀ` itself, row-major.
    Cols(&'a [f32]),
}

impl Rhs<'_> {
    /// Pointer to column `j` of `Wᵀ` and the (row, column) strides, for an `[·, k]` or
    /// `[k, ·]` matrix of `n` columns.
    fn column(self, j: usize, k: usize, n: usize) -> (*const f32, isize, isize) {
        match self {
            Rhs::Rows(w) => {
                debug_assert!(w.len() >= n * k && j <= n);
                (w[j * k..].as_ptr(), 1, k as isize)
            }
            Rhs::Cols(w) => {
                debug_assert!(w.len() >= n * k && j <= n);
                (w[j..].as_ptr(), n as isize, 1)
            }
        }
    }
}

/// Calls the gemm crate for `dst[m, n] (row stride dst_rs) = x[m, k] · Wᵀ`. With
/// `accumulate`, adds to `dst`.
#[allow(clippy::too_many_arguments)]
fn gemm_raw(
    dst: &mut [f32],
    dst_rs: usize,
    x: &[f32],
    w: Rhs<'_>,
    m: usize,
    k: usize,
    n: usize,
    accumulate: bool,
) {
    debug_assert!(dst.len() >= (m - 1) * dst_rs + n);
    debug_assert!(x.len() >= m * k);
    let threads = rayon::current_num_threads();
    // Saturating: m·n and n·k fit (validated), their product with k need not.
    let parallel = threads > 1 && m.saturating_mul(n).saturating_mul(k) >= 1 << 16;
    // Up to a few threads and prompt-sized m, one single-threaded gemm call per block of
    // columns beats the crate's own split, most at narrow n. Each call packs all of x, so
    // very tall x or many threads keep gemm's split.
    let per = n.div_ceil(threads).div_ceil(16) * 16;
    if parallel && threads <= COLUMN_SPLIT_MAX_THREADS && m <= COLUMN_SPLIT_MAX_M && per >= 64 {
        let out = SharedOut(dst.as_mut_ptr());
        (0..n.div_ceil(per)).into_par_iter().for_each(|b| {
            let (j0, nb) = (b * per, per.min(n - b * per));
            let (wt, rs, cs) = w.column(j0, k, n);
            // SAFETY: as below, for columns j0..j0+nb of dst and of Wᵀ; the blocks' columns
            // are disjoint, so no two tasks write the same element.
            unsafe {
                gemm_call(
                    out.get().add(j0),
                    dst_rs,
                    x,
                    (wt, rs, cs),
                    m,
                    k,
                    nb,
                    accumulate,
                    gemm::Parallelism::None,
                )
            };
        });
        return;
    }
    let par = if parallel {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the debug-asserted bounds hold for every caller (validated in `linear`): dst
    // covers m rows of stride dst_rs with n columns, x is m·k row-major, and `column` gives
    // the k×n matrix Wᵀ inside w.
    unsafe {
        gemm_call(
            dst.as_mut_ptr(),
            dst_rs,
            x,
            w.column(0, k, n),
            m,
            k,
            n,
            accumulate,
            par,
        )
    };
}

/// Most pool threads, and most rows of `x`, for which [`gemm_raw`] splits by columns itself.
const COLUMN_SPLIT_MAX_THREADS: usize = 4;
const COLUMN_SPLIT_MAX_M: usize = 2048;

/// `dst[m, n] (row stride dst_rs) (+)= x[m, k] · Wᵀ` through the gemm crate, `Wᵀ` given as
/// a pointer with its row and column strides.
///
/// # Safety
/// `dst` must cover `m` rows of stride `dst_rs` with `n` columns that no one else touches
/// during the call, `x` holds `m·k` values and `wt` with its strides addresses a `k × n`
/// matrix of readable values.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_call(
    dst: *mut f32,
    dst_rs: usize,
    x: &[f32],
    (wt, wt_rs, wt_cs): (*const f32, isize, isize),
    m: usize,
    k: usize,
    n: usize,
    accumulate: bool,
    par: gemm::Parallelism,
) {
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            x.as_ptr(),
            1,
            k as isize,
            wt,
            wt_cs,
            wt_rs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    }
}

fn fill_bias(y: &mut [f32], bias: Option<&[f32]>, n: usize) -> bool {
    match bias {
        Some(b) => {
            for row in y.chunks_exact_mut(n) {
                row.copy_from_slice(b);
            }
            true
        }
        None => false,
    }
}

fn gemm_f32(
    y: &mut [f32],
    x: &[f32],
    w: Rhs<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) {
    let accumulate = fill_bias(y, bias, n);
    gemm_raw(y, n, x, w, m, k, n, accumulate);
}

thread_local! {
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Interleaved rows taken back to GGUF's layout before they are widened.
    static UNPACKED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// f32 elements per converted panel of `W` (4 MiB, well inside L3). Measured at m = 512:
/// 512 KiB panels left f16 13–21% behind f32, 4 MiB panels 3–7%.
const PANEL_ELEMS: usize = 1 << 20;

/// Rows of `W` converted per panel: about [`PANEL_ELEMS`] f32, a multiple of 16 rows. Large
/// panels keep gemm calls few (each packs `x` again); the panel still fits in L3.
fn panel_rows(k: usize, n: usize) -> usize {
    let rows = (PANEL_ELEMS / k).max(16) / 16 * 16;
    rows.min(n)
}

/// Widens rows `j0..j0 + rows` of `w` into `dst` on every thread: the conversion is
/// memory-bound (f16) or decode-bound (quantized) and would otherwise leave the other
/// threads idle between gemm calls. Pieces are whole rows, so the result is the one pass's.
fn widen_panel(w: Weights<'_>, j0: usize, rows: usize, k: usize, dst: &mut [f32]) {
    const CHUNK: usize = 1 << 16;
    let per = (CHUNK / k).max(1);
    let widen = |r0: usize, d: &mut [f32]| {
        w.rows_to_f32(j0 + r0, d.len() / k, k, d)
            .expect("panel rows lie inside the validated matrix")
    };
    if rows <= per || rayon::current_num_threads() == 1 {
        widen(0, dst);
        return;
    }
    dst.par_chunks_mut(per * k)
        .enumerate()
        .for_each(|(c, d)| widen(c * per, d));
}

/// gemm over `W` widened to f32 one panel of rows at a time (quantized weights, and f16
/// where the CPU lacks what `f16gemm` needs).
#[allow(clippy::too_many_arguments)]
fn gemm_panels(
    y: &mut [f32],
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) {
    let accumulate = fill_bias(y, bias, n);
    let rows = panel_rows(k, n);
    // Taken out of the thread-local rather than borrowed: the widening and gemm run on the
    // pool, and while this thread waits there it may run another `linear` (another
    // session's prefill), which would find the buffer still borrowed. That call then
    // starts from an empty buffer of its own.
    let mut panel = PANEL.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if panel.len() < rows * k {
        panel.resize(rows * k, 0.0);
    }
    let mut j0 = 0;
    while j0 < n {
        let nr = rows.min(n - j0);
        let dst = &mut panel[..nr * k];
        widen_panel(w, j0, nr, k, dst);
        gemm_raw(&mut y[j0..], n, x, Rhs::Rows(dst), m, k, nr, accumulate);
        j0 += nr;
    }
    PANEL.with(|p| {
        let mut kept = p.borrow_mut();
        if kept.len() < panel.len() {
            *kept = panel;
        }
    });
}
