//! Quantized weights with 8 rows interleaved: the layout the matrix products read fastest.
//!
//! In GGUF's layout each row of `W` is its own run of blocks, and a one-row kernel reduces
//! every block's 8 partial sums to one number before it can scale it. Here the blocks of 8
//! neighbouring rows are woven together per column of blocks, 4 bytes at a time, so that one
//! 256-bit load holds 4 consecutive weights of each of the 8 rows: lane `r` of every vector
//! is row `r`, and a column of blocks ends as one vector of 8 sums, scaled by the 8 rows'
//! scales at once. No horizontal reduction is left. The bytes are the same as the file's,
//! only moved: a matrix takes exactly the bytes it took before ([`pack`], [`unpack_rows`]).
//!
//! The activations meet 4-bit weights as bytes (`maddubs`, 32 byte products per
//! instruction). At 16 bits ([`ActPrecision::Wide`]) each integer is split
//! exactly as `q = 256·hi + lo` ([`QuantizedActs::split`]): the weights' unsigned nibbles
//! times `hi` (signed) and `lo` (unsigned) times the nibbles (as signed bytes, which they
//! fit), each summed over a group of 32 in 16-bit lanes that cannot overflow (at most
//! 8·2·15·128 = 30720 and, unsigned, 8·2·255·15 = 61200), then widened and put together as
//! `256·Σ(q·hi) + Σ(q·lo)`: the same exact integer dot product as the other kernels. At 8
//! bits ([`ActPrecision::Byte`], when the weight operand asks for it) the
//! bytes are the integers themselves, and one `maddubs` does what took two. Six- and
//! eight-bit weights would overflow those 16-bit sums of the split; against 16-bit
//! activations Q6_K and Q8_0 are widened to 16 bits instead, two elements of each row per
//! 32-bit lane, and meet pairs of the activations in one `madd` each (`avx2_i16.rs`).
//! Against 8-bit activations they meet the bytes in `maddubs` too (`avx2_byte.rs`): Q6_K's
//! stored values `q + 32` (0..=63) as they are, two products summed per 16-bit lane, two
//! such sums added before they are widened (at most 4·63·127 = 32004), the offset taken off
//! per 16 elements; Q8_0's signed weights as their magnitudes against the activations
//! given the weights' signs, each sum of two products (at most 2·128·127 = 32512) widened
//! at once. Where the CPU has AVX-512 VNNI, every 8-bit kernel takes `vpdpbusd` instead,
//! which adds each lane's 4 byte products straight into its 32-bit sum: the same integers
//! in fewer instructions (`avx2::columns_vnni`); so do the 4-bit kernels' two byte products
//! of the split at 16 bits (`SplitVnni`).
//!
//! The low-bit formats' values meet 8-bit activations the same ways: IQ4_NL's and IQ4_XS's
//! nibbles become the table's values by one `pshufb`, met as Q8_0's signed bytes (with VNNI,
//! the values plus 128 unsigned and the offset taken off per block); Q3_K's 3-bit values,
//! put together from their two chunks as `q + 4`, as Q6_K's; Q5_K's 5-bit values, put
//! together the same way, in `maddubs` summed 4 at a time before they are widened, or
//! `vpdpbusd` (`avx2_iq4.rs`, `avx2_q3_k.rs`, `avx2_q5_k.rs`). Against 16-bit activations they are widened to 16 bits and meet pairs
//! of activations in `madd`, as Q8_0's.
//!
//! Layouts, for rows `8t..8t + 8` (a row group; groups follow each other, and within a group
//! the columns of blocks follow in order):
//!
//! | format | bytes per column | layout of one column |
//! |---|---|---|
//! | Q4_0 | 8 × 18 = 144 | the 8 rows' f16 `d` (16 bytes); then 4 chunks of 32 bytes: chunk `p` holds bytes `4p..4p+4` of each row's 16 quant bytes, row `r` at `4r` |
//! | Q4_1 | 8 × 20 = 160 | the 8 `d` (16), the 8 `m` (16); then 4 chunks of 32 bytes as in Q4_0 |
//! | Q6_K | 8 × 210 = 1680 | the 8 rows' f16 `d` (16); the 16 scales of each of the 8 rows (128, scale `h` of row `r` at `16 + 8h + r`); then per 16 elements `h` (96 bytes at `144 + 96h`) the 6-bit values `q + 32` in three vectors: low nibbles in 64 bytes, top 2 bits in 32 (see `pack_q6_k`) |
//! | Q8_0 | 8 × 34 = 272 | the 8 `d` (16); then 8 vectors of 32 bytes, vector `v` holding elements `4v..4v + 4` of the 8 rows (see `pair_byte`) |
//! | Q4_K | 8 × 144 = 1152 | the 8 `d` (16), the 8 `dmin` (16); the 64 six-bit scales and 64 minimums re-packed (96, see below); then 4 pairs of 8 chunks: chunk `(j, p)` at `128 + 256j + 32p` holds bytes `32j + 4p..+4` of each row's 128 quant bytes, row `r` at `4r` |
//! | IQ4_NL | 8 × 18 = 144 | as Q4_0: the 8 `d` (16), then 4 chunks of 32 bytes; a nibble indexes the table |
//! | IQ4_XS | 8 × 136 = 1088 | the 8 `d` (16); the 64 six-bit scales `8g + r` (48, in the six-bit packing below); then per sub-block `g` of 32 the 4 chunks of Q4_0's layout at `64 + 128g + 32p` (bytes `16g + 4p..+4` of each row's 128 quant bytes, row `r` at `4r`) |
//! | Q5_K | 8 × 176 = 1408 | Q4_K's column of the same rows (1152 bytes, the quant nibbles from each row's 128 bytes `qs`), then the fifth bits in 8 chunks, `p` at `1152 + 32p` holding bytes `4p..+4` of each row's 32 bytes `qh` (bit `g` of a byte for sub-block `g`, as in the file), row `r` at `4r` |
//! | Q3_K | 8 × 110 = 880 | the 8 `d` (16); the 128 six-bit scales `8s + r` of the 16 sub-blocks of 16 (96, in the six-bit packing below); the low 2 bits in 16 chunks, `(h, p)` at `112 + 256h + 32p` holding bytes `32h + 4p..+4` of each row's 64 bytes `qs`; the high bits in 8 chunks, `p` at `624 + 32p` holding bytes `4p..+4` of each row's 32 bytes `hmask`; row `r` at `4r` |
//!
//! Q4_K's scales and minimums are numbered `v = 8g + r` (group `g`, row `r`). Byte `i`
//! (0..32) of the first 32 holds scale `i`'s low 4 bits in its low nibble and scale
//! `i + 32`'s in its high nibble; the next 32 bytes do the same for the minimums; the last
//! 32 hold the top 2 bits of scale `i` (bits 0–1), scale `i + 32` (2–3), minimum `i` (4–5)
//! and minimum `i + 32` (6–7). All 96 bits of each row's 12 bytes are kept, so
//! [`unpack_rows`] gives the file's bytes back exactly.
//!
//! The six-bit packing of IQ4_XS's and Q3_K's scales, for `n` values (64 or 128, numbered
//! `8s + r`, each the file's stored field, which less 32 is the scale): byte `i` of the
//! first `n / 2` holds value `i`'s low 4 bits in its low nibble and value `i + n / 2`'s in
//! its high nibble; byte `i` of the last `n / 4` holds the top 2 bits of values `i`,
//! `i + n / 4`, `i + n / 2`, `i + 3n / 4` in bits 0–1, 2–3, 4–5, 6–7. In Q3_K a sub-block
//! `g` of 32 takes bits `2j, 2j + 1` (`g = 4h + j`) of its low-bit chunks and bit `g` of the
//! high-bit chunks: a chunk's 32 bytes serve 4 sub-blocks (low bits) or all 8 (high bits),
//! as in the file. Every bit is kept here too.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_byte;
#[cfg(target_arch = "x86_64")]
mod avx2_i16;
#[cfg(target_arch = "x86_64")]
mod avx2_iq4;
#[cfg(target_arch = "x86_64")]
mod avx2_parts;
#[cfg(target_arch = "x86_64")]
mod avx2_q3_k;
#[cfg(target_arch = "x86_64")]
mod avx2_q5_k;
mod layout;

use super::act::{ActPrecision, QuantizedActs};
use super::blocks::{k_scale_min, q6_k_value};
use super::gemv::row_scalar;
use super::QuantFormat;
use crate::error::{KernelError, Result};
use crate::par::SharedOut;

/// Rows woven together.
pub const ROWS: usize = 8;

/// True for the formats that have an interleaved layout (Q4_0, Q4_1, Q4_K, Q6_K, Q8_0,
/// Q3_K, Q5_K, IQ4_NL and IQ4_XS).
pub fn supports(format: QuantFormat) -> bool {
    matches!(
        format,
        QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q4_K
            | QuantFormat::Q6_K
            | QuantFormat::Q8_0
            | QuantFormat::Q3_K
            | QuantFormat::Q5_K
            | QuantFormat::IQ4_NL
            | QuantFormat::IQ4_XS
    )
}

/// True when the kernel of `format` reads the activations' byte split at 16 bits
/// ([`QuantizedActs::split`], which [`QuantizedActs::add_split`] makes): the 4-bit formats
/// do, and Q6_K where the CPU has AVX-512 VNNI; Q8_0, and Q6_K elsewhere, read the 16-bit
/// integers themselves. At 8 bits every interleaved kernel reads the bytes
/// ([`QuantizedActs::bytes`]), which [`QuantizedActs::quantize_at`] always lays out.
pub fn reads_tiles(format: QuantFormat) -> bool {
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q4_K => true,
        QuantFormat::Q6_K => crate::simd::isa().avx512_vnni,
        _ => false,
    }
}

/// The precision at which activations meet interleaved weights unless a caller asks for
/// the other one (a model's options, `--act-bits`): 8 bits ([`ActPrecision::Byte`], as
/// llama.cpp's CPU kernels), which reads prompts fastest and loses no more than llama.cpp
/// does. 16 bits ([`ActPrecision::Wide`]) is the exact mode, whose rounding stays far below
/// the weights' own. At either, a row gets the same bits whatever rows share its pass.
pub const DEFAULT_ACT_PRECISION: ActPrecision = ActPrecision::Byte;

/// The bytes of an interleaved `[n, k]` matrix of `format` (the same as in GGUF's layout),
/// or an error naming what does not fit: a format without an interleaved layout, `n` not a
/// multiple of [`ROWS`], or `k` not whole blocks.
pub fn check(format: QuantFormat, n: usize, k: usize) -> Result<usize> {
    if !supports(format) {
        return Err(KernelError::Invalid(format!(
            "{format} has no interleaved layout (Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, Q3_K, Q5_K, \
             IQ4_NL and IQ4_XS do)"
        )));
    }
    if !n.is_multiple_of(ROWS) {
        return Err(KernelError::Invalid(format!(
            "{format}: {n} rows cannot be interleaved in groups of {ROWS}"
        )));
    }
    format
        .row_bytes(k)?
        .checked_mul(n)
        .ok_or_else(|| KernelError::Invalid(format!("{format}: {n} rows of {k} elements overflow")))
}

/// Weaves `src`, an `[n, k]` matrix of `format` in GGUF's layout, into `dst` (as many
/// bytes) in the interleaved layout. Errors as [`check`] does, or when a length disagrees.
///
/// ```
/// use qkv_kernels::quant::{x8, QuantFormat};
/// let (n, k) = (8, 64);
/// let src: Vec<u8> = (0..n * QuantFormat::Q4_0.row_bytes(k).unwrap()).map(|i| i as u8).collect();
/// let mut packed = vec![0; src.len()];
/// x8::pack(QuantFormat::Q4_0, &src, n, k, &mut packed).unwrap();
/// let mut back = vec![0; src.len()];
/// x8::unpack_rows(QuantFormat::Q4_0, &packed, k, 0, n, &mut back).unwrap();
/// assert_eq!(back, src);
/// ```
pub fn pack(format: QuantFormat, src: &[u8], n: usize, k: usize, dst: &mut [u8]) -> Result<()> {
    let bytes = check(format, n, k)?;
    crate::error::check_len("interleaved source", bytes, src.len())?;
    crate::error::check_len("interleaved destination", bytes, dst.len())?;
    let (bb, nb) = (format.block_bytes(), k / format.block_elems());
    let column = ROWS * bb;
    let group = |(t, out_group): (usize, &mut [u8])| {
        for (b, out) in out_group.chunks_exact_mut(column).enumerate() {
            let block = |r: usize| {
                let at = ((ROWS * t + r) * nb + b) * bb;
                &src[at..at + bb]
            };
            match format {
                QuantFormat::Q4_K => pack_q4_k(block, 16, out),
                QuantFormat::Q5_K => layout::pack_q5_k(block, out),
                QuantFormat::Q6_K => pack_q6_k(block, out),
                QuantFormat::Q8_0 => pack_q8_0(block, out),
                QuantFormat::Q3_K => layout::pack_q3_k(block, out),
                QuantFormat::IQ4_XS => layout::pack_iq4_xs(block, out),
                _ => pack_q4(q4_fields(format), block, out),
            }
        }
    };
    // On every thread for large matrices: a model's load packs gigabytes.
    if bytes >= 1 << 20 {
        use rayon::prelude::*;
        dst.par_chunks_exact_mut(nb * column)
            .enumerate()
            .for_each(group);
    } else {
        dst.chunks_exact_mut(nb * column)
            .enumerate()
            .for_each(group);
    }
    Ok(())
}

/// Rows `j0..j0 + rows` of an interleaved `[·, k]` matrix back in GGUF's layout, into
/// `dst` (`rows` rows of bytes). Errors when the rows lie outside `packed` or a length
/// disagrees.
pub fn unpack_rows(
    format: QuantFormat,
    packed: &[u8],
    k: usize,
    j0: usize,
    rows: usize,
    dst: &mut [u8],
) -> Result<()> {
    let row_bytes = format.row_bytes(k)?;
    let n = check_rows(format, packed, row_bytes, j0, rows)?;
    crate::error::check_len("unpacked rows", rows * row_bytes, dst.len())?;
    debug_assert!(j0 + rows <= n);
    let (bb, nb) = (format.block_bytes(), k / format.block_elems());
    for (j, out_row) in (j0..).zip(dst.chunks_exact_mut(row_bytes)) {
        for (b, out) in out_row.chunks_exact_mut(bb).enumerate() {
            let at = ((j / ROWS) * nb + b) * ROWS * bb;
            let column = &packed[at..at + ROWS * bb];
            match format {
                QuantFormat::Q4_K => unpack_q4_k(column, j % ROWS, 16, out),
                QuantFormat::Q5_K => layout::unpack_q5_k(column, j % ROWS, out),
                QuantFormat::Q6_K => unpack_q6_k(column, j % ROWS, out),
                QuantFormat::Q8_0 => unpack_q8_0(column, j % ROWS, out),
                QuantFormat::Q3_K => layout::unpack_q3_k(column, j % ROWS, out),
                QuantFormat::IQ4_XS => layout::unpack_iq4_xs(column, j % ROWS, out),
                _ => unpack_q4(q4_fields(format), column, j % ROWS, out),
            }
        }
    }
    Ok(())
}

/// The rows `packed` holds (whole groups of [`ROWS`]), or an error unless rows
/// `j0..j0 + rows` lie inside them and the format has a layout.
fn check_rows(
    format: QuantFormat,
    packed: &[u8],
    row_bytes: usize,
    j0: usize,
    rows: usize,
) -> Result<usize> {
    let group = ROWS * row_bytes;
    if !supports(format) || group == 0 || !packed.len().is_multiple_of(group) {
        return Err(KernelError::Invalid(format!(
            "{format}: {} bytes are not whole interleaved groups of {group}",
            packed.len()
        )));
    }
    let n = packed.len() / row_bytes;
    match j0.checked_add(rows) {
        Some(end) if end <= n => Ok(n),
        _ => Err(KernelError::Invalid(format!(
            "{format}: rows {j0}..{j0}+{rows} lie outside the {n} there are"
        ))),
    }
}

/// f16 fields per row at the head of a Q4_0 or IQ4_NL (`d`) or Q4_1 (`d`, `m`) block.
const fn q4_fields(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q4_1 => 2,
        _ => 1,
    }
}

/// Offset of field `f`'s value for row `r` in a Q4_0/Q4_1 column (the 8 rows' `d`, then
/// Q4_1's 8 `m`).
const fn q4_field(f: usize, r: usize) -> usize {
    16 * f + 2 * r
}

/// Offset of quant bytes `4p..4p + 4` of row `r` in a Q4_0/Q4_1 column of `fields` fields.
const fn q4_chunk(fields: usize, p: usize, r: usize) -> usize {
    16 * fields + 32 * p + 4 * r
}

fn pack_q4<'a>(fields: usize, block: impl Fn(usize) -> &'a [u8], out: &mut [u8]) {
    for r in 0..ROWS {
        let b = block(r);
        for f in 0..fields {
            out[q4_field(f, r)..q4_field(f, r) + 2].copy_from_slice(&b[2 * f..2 * f + 2]);
        }
        for p in 0..4 {
            let (at, from) = (q4_chunk(fields, p, r), 2 * fields + 4 * p);
            out[at..at + 4].copy_from_slice(&b[from..from + 4]);
        }
    }
}

fn unpack_q4(fields: usize, column: &[u8], r: usize, out: &mut [u8]) {
    for f in 0..fields {
        out[2 * f..2 * f + 2].copy_from_slice(&column[q4_field(f, r)..q4_field(f, r) + 2]);
    }
    for p in 0..4 {
        let (at, to) = (q4_chunk(fields, p, r), 2 * fields + 4 * p);
        out[to..to + 4].copy_from_slice(&column[at..at + 4]);
    }
}

/// Offset of Q4_K's chunk `(j, p)` for row `r` in a column.
pub(super) const fn q4_k_chunk(j: usize, p: usize, r: usize) -> usize {
    128 + 256 * j + 32 * p + 4 * r
}

/// Q4_K, and the first 1152 bytes of a Q5_K column: `qs` is where the block's 128 quant
/// bytes start (16 in Q4_K, 48 in Q5_K).
pub(super) fn pack_q4_k<'a>(block: impl Fn(usize) -> &'a [u8], qs: usize, out: &mut [u8]) {
    let (mut sc, mut mn) = ([0u8; 64], [0u8; 64]);
    for r in 0..ROWS {
        let b = block(r);
        out[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
        out[16 + 2 * r..18 + 2 * r].copy_from_slice(&b[2..4]);
        for g in 0..8 {
            (sc[8 * g + r], mn[8 * g + r]) = k_scale_min(&b[4..16], g);
        }
        for j in 0..4 {
            for p in 0..8 {
                let at = q4_k_chunk(j, p, r);
                let from = qs + 32 * j + 4 * p;
                out[at..at + 4].copy_from_slice(&b[from..from + 4]);
            }
        }
    }
    for i in 0..32 {
        out[32 + i] = (sc[i] & 15) | (sc[i + 32] & 15) << 4;
        out[64 + i] = (mn[i] & 15) | (mn[i + 32] & 15) << 4;
        out[96 + i] =
            (sc[i] >> 4) | (sc[i + 32] >> 4) << 2 | (mn[i] >> 4) << 4 | (mn[i + 32] >> 4) << 6;
    }
}

/// Scale and minimum of group `g`, row `r`, from a Q4_K column's re-packed 96 bytes.
fn q4_k_scale_min(column: &[u8], g: usize, r: usize) -> (u8, u8) {
    let v = 8 * g + r;
    let (i, upper) = (v % 32, v >= 32);
    let nib = |b: u8| if upper { b >> 4 } else { b & 15 };
    let top = column[96 + i] >> if upper { 2 } else { 0 };
    (
        nib(column[32 + i]) | (top & 3) << 4,
        nib(column[64 + i]) | ((top >> 4) & 3) << 4,
    )
}

/// Row `r` of a Q4_K column (or the Q4_K part of a Q5_K one) back in GGUF's layout, its
/// quant bytes at `qs`.
pub(super) fn unpack_q4_k(column: &[u8], r: usize, qs: usize, out: &mut [u8]) {
    out[..2].copy_from_slice(&column[2 * r..2 * r + 2]);
    out[2..4].copy_from_slice(&column[16 + 2 * r..18 + 2 * r]);
    // The inverse of `k_scale_min`'s 12-byte packing.
    let scales = &mut out[4..16];
    for s in 0..4 {
        let (sc_lo, mn_lo) = q4_k_scale_min(column, s, r);
        let (sc_hi, mn_hi) = q4_k_scale_min(column, s + 4, r);
        scales[s] = sc_lo | (sc_hi >> 4) << 6;
        scales[s + 4] = mn_lo | (mn_hi >> 4) << 6;
        scales[s + 8] = (sc_hi & 15) | (mn_hi & 15) << 4;
    }
    for j in 0..4 {
        for p in 0..8 {
            let at = q4_k_chunk(j, p, r);
            let to = qs + 32 * j + 4 * p;
            out[to..to + 4].copy_from_slice(&column[at..at + 4]);
        }
    }
}

/// Where element `e` of row `r` sits in a 32-byte vector of Q6_K's or Q8_0's layout that
/// holds 4 consecutive elements (`e` taken modulo 4) of the 8 rows: the vector's two 128-bit
/// halves are rows 0–3 and 4–7, each half the first two elements then the next two, row by
/// row. So `unpacklo_epi8` widens the first two elements of every row to 16-bit lanes in
/// row order, and `unpackhi_epi8` the next two: one vector of element pairs each, ready for
/// `madd` against a pair of activations.
const fn pair_byte(r: usize, e: usize) -> usize {
    16 * (r / 4) + 8 * ((e / 2) % 2) + 2 * (r % 4) + e % 2
}

/// Offset of the 96 bytes of Q6_K's half-group `h` (elements `16h..16h + 16`) in a column.
const fn q6_k_half(h: usize) -> usize {
    144 + 96 * h
}

/// Q6_K: each 16 elements' 8 × 16 six-bit values `u = q + 32` (0..=63) as three vectors:
/// vector `v` (0..4) holds elements `4v..4v + 4` of the 8 rows at [`pair_byte`], its low 4
/// bits in a nibble of the first 64 bytes (vectors 0 and 1 in the low and high nibbles of
/// bytes 0..32, vectors 2 and 3 of bytes 32..64) and its top 2 bits in bits `2v, 2v + 1` of
/// the last 32.
fn pack_q6_k<'a>(block: impl Fn(usize) -> &'a [u8], out: &mut [u8]) {
    out[q6_k_half(0)..].fill(0);
    for r in 0..ROWS {
        let b = block(r);
        out[2 * r..2 * r + 2].copy_from_slice(&b[208..210]);
        for h in 0..16 {
            out[16 + 8 * h + r] = b[192 + h];
        }
        for i in 0..256 {
            let u = (q6_k_value(b, i / 128, i % 128) + 32) as u8;
            let (base, v) = (q6_k_half(i / 16), (i % 16) / 4);
            let at = pair_byte(r, i % 16);
            out[base + 32 * (v / 2) + at] |= (u & 15) << (4 * (v % 2));
            out[base + 64 + at] |= (u >> 4) << (2 * v);
        }
    }
}

fn unpack_q6_k(column: &[u8], r: usize, out: &mut [u8]) {
    out[..208].fill(0);
    out[208..210].copy_from_slice(&column[2 * r..2 * r + 2]);
    for h in 0..16 {
        out[192 + h] = column[16 + 8 * h + r];
    }
    for i in 0..256 {
        let (base, v) = (q6_k_half(i / 16), (i % 16) / 4);
        let at = pair_byte(r, i % 16);
        let low = (column[base + 32 * (v / 2) + at] >> (4 * (v % 2))) & 15;
        let high = (column[base + 64 + at] >> (2 * v)) & 3;
        // GGUF's places for element e of half hh: a nibble of ql[64hh + e % 64], two bits
        // of qh[32hh + e % 32] (see `q6_k_value`).
        let (hh, e) = (i / 128, i % 128);
        out[64 * hh + e % 64] |= low << (4 * (e / 64));
        out[128 + 32 * hh + e % 32] |= high << (2 * (e / 32));
    }
}

/// Q8_0: the 8 `d` (16 bytes), then 8 vectors of 32 bytes, vector `v` holding elements
/// `4v..4v + 4` of the 8 rows at [`pair_byte`].
fn pack_q8_0<'a>(block: impl Fn(usize) -> &'a [u8], out: &mut [u8]) {
    for r in 0..ROWS {
        let b = block(r);
        out[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
        for e in 0..32 {
            out[16 + 32 * (e / 4) + pair_byte(r, e)] = b[2 + e];
        }
    }
}

fn unpack_q8_0(column: &[u8], r: usize, out: &mut [u8]) {
    out[..2].copy_from_slice(&column[2 * r..2 * r + 2]);
    // Row r's elements 4v, 4v + 1 sit side by side at `pair_byte(r, 0)` of vector v, and
    // 4v + 2, 4v + 3 eight bytes on: two pairs per vector, five times faster than element
    // by element.
    let at = pair_byte(r, 0);
    for v in 0..8 {
        let src = &column[16 + 32 * v + at..16 + 32 * v + at + 10];
        out[2 + 4 * v..4 + 4 * v].copy_from_slice(&src[..2]);
        out[4 + 4 * v..6 + 4 * v].copy_from_slice(&src[8..]);
    }
}

/// The plain reference: columns `j0..j1` of `y[m, n] = x·Wᵀ (+ b)` with `W` interleaved,
/// each row taken back to GGUF's layout and multiplied exactly as the GGUF-layout reference
/// multiplies it (so the two agree bit for bit).
///
/// # Safety
/// `y` points to `m·n` floats (`m = acts.m`) of which no one else touches columns `j0..j1`
/// during the call; `w` holds `n` interleaved rows of `acts.k` elements of `format`, a
/// format [`supports`] takes; `j1 ≤ n`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn columns_scalar(
    y: SharedOut,
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    let row_bytes = acts.k / format.block_elems() * format.block_bytes();
    let mut row = vec![0u8; row_bytes];
    let mut acc = vec![0.0f32; acts.m];
    for j in j0..j1 {
        unpack_rows(format, w, acts.k, j, 1, &mut row).expect("rows inside the matrix");
        acc.fill(0.0);
        row_scalar(acts, format, &row, 0, &mut acc);
        for (i, a) in acc.iter().enumerate() {
            // SAFETY: i < m and j < j1 ≤ n: inside y, in this call's own columns.
            unsafe { *y.get().add(i * n + j) = a + bias.map_or(0.0, |b| b[j]) };
        }
    }
}

/// Columns `j0..j1` of `y[m, n] = x·Wᵀ (+ b)` with `W` interleaved, with the fastest kernel
/// for this CPU.
///
/// # Safety
/// As [`columns_scalar`]; and `acts` has its tiles ([`QuantizedActs::has_tiles`]), for any
/// number of rows, at [`ActPrecision::Byte`] or when [`reads_tiles`] is true of `format`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn columns(
    y: SharedOut,
    acts: &QuantizedActs,
    format: QuantFormat,
    w: &[u8],
    bias: Option<&[f32]>,
    n: usize,
    j0: usize,
    j1: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::isa().avx512_vnni {
            // SAFETY: AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C were detected; the rest
            // is the caller's contract.
            unsafe { avx2::columns_vnni(y, acts, format, w, bias, n, j0, j1) };
            return;
        }
        if crate::simd::isa().avx2_fma_f16c {
            // SAFETY: AVX2, FMA and F16C were detected; the rest is the caller's contract.
            unsafe { avx2::columns(y, acts, format, w, bias, n, j0, j1) };
            return;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { columns_scalar(y, acts, format, w, bias, n, j0, j1) }
}

#[cfg(test)]
mod tests;
