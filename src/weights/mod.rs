//! Weights: files mapped with memmap2 and turned into named, typed tensor views.
//!
//! A [`Tensor`] knows how it is stored ([`WeightFormat`]: f32, f16, bf16 or a GGUF quantized
//! format) apart from what qkv computes in ([`FloatType`]: activations are f32, the KV cache
//! f16 or f32). Its bytes stay in the mapped file whenever the kernels can read them there:
//! f32, f16 and bf16 when aligned, quantized blocks always. Nothing is widened at load unless
//! asked ([`Tensor::into_dtype`], `--dtype`): the kernels widen f16 and bf16 in registers.
//!
//! - [`safetensors`]: PyTorch / Hugging Face `.safetensors` files.
//! - [`hf_dir`]: a Hugging Face model directory (sharded `*.safetensors`) as one source.
//! - [`gguf`]: llama.cpp's GGUF (v2, v3).
//! - [`Scope`]: a source seen through a name prefix, which modules load through.
//! - `mmap`: the one module of the crate allowed `unsafe` code: it maps files
//!   ([`map_file`], [`MappedFile`]) and hands out typed views of mapped bytes.

pub mod gguf;
pub mod hf_dir;
#[allow(unsafe_code)]
mod mmap;
pub mod safetensors;
mod scope;

pub use mmap::{map_file, MappedFile};
pub use scope::Scope;

use crate::error::{Error, Result};
use half::{bf16, f16};
use mmap::MappedSlice;
use qkv_kernels::quant::act::ActPrecision;
use qkv_kernels::{QuantFormat, Weights};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The dtypes qkv computes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE half float.
    F16,
}

impl FloatType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FloatType::F32 => 4,
            FloatType::F16 => 2,
        }
    }
}

impl std::fmt::Display for FloatType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FloatType::F32 => "f32",
            FloatType::F16 => "f16",
        })
    }
}

impl std::str::FromStr for FloatType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(FloatType::F32),
            "f16" | "float16" | "half" => Ok(FloatType::F16),
            other => Err(Error::Unsupported(format!(
                "compute dtype `{other}` (use f16 or f32)"
            ))),
        }
    }
}

/// How a weight tensor is stored: what its bytes are, as opposed to the [`FloatType`] qkv
/// computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// 32-bit IEEE floats.
    F32,
    /// 16-bit IEEE floats.
    F16,
    /// bfloat16: the top 16 bits of an f32, read in place by the kernels.
    BF16,
    /// Blocks of a GGUF quantized format, read in place by the kernels.
    Quant(QuantFormat),
}

impl WeightFormat {
    /// The format of a compute dtype.
    pub fn float(dtype: FloatType) -> WeightFormat {
        match dtype {
            FloatType::F32 => WeightFormat::F32,
            FloatType::F16 => WeightFormat::F16,
        }
    }

    /// Bytes `count` elements take, or `None` when `count` is not a whole number of blocks
    /// (or the size overflows).
    pub fn bytes_for(self, count: usize) -> Option<usize> {
        match self {
            WeightFormat::F32 => count.checked_mul(4),
            WeightFormat::F16 | WeightFormat::BF16 => count.checked_mul(2),
            WeightFormat::Quant(f) => f.row_bytes(count).ok(),
        }
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightFormat::F32 => f.write_str("F32"),
            WeightFormat::F16 => f.write_str("F16"),
            WeightFormat::BF16 => f.write_str("BF16"),
            WeightFormat::Quant(q) => f.write_str(q.name()),
        }
    }
}

/// How the matrices of a model are prepared for the kernels at load ([`Tensor::interleaved`]):
/// options of one model, so that two models in one process may differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixOptions {
    /// The precision at which activations meet interleaved quantized matrices on every
    /// path (Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, Q3_K, Q5_K, IQ4_NL, IQ4_XS;
    /// [`Weights::QuantX8`]): 16 bits, next to no error of its own, or 8 bits, as
    /// llama.cpp's CPU kernels, faster where a matrix meets many rows. Matrices in GGUF's layout always meet 16-bit activations.
    pub act_precision: ActPrecision,
    /// Whether matrices are copied at load into the layout the matrix products read
    /// fastest (rows interleaved 8 by 8, f16 onto pages of their own): on by default; off,
    /// every matrix stays as the file stores it, mapped (to compare the two, or to save
    /// the copy's load time).
    pub interleave: bool,
}

impl Default for MatrixOptions {
    /// [`qkv_kernels::quant::x8::DEFAULT_ACT_PRECISION`].
    fn default() -> Self {
        MatrixOptions {
            act_precision: qkv_kernels::quant::x8::DEFAULT_ACT_PRECISION,
            interleave: true,
        }
    }
}

/// A hidden name beside `path` for writing it before a rename into place. Unique per process
/// and per call, so that threads (two sessions fetching the default model at once, say) and
/// processes writing the same file never share one. Public for the CLI's fetch, which writes
/// the downloaded model the same way.
pub fn temp_sibling(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("tmp");
    path.with_file_name(format!(".{name}.tmp-{}-{call}", std::process::id()))
}

enum Storage {
    /// f32 elements borrowed from a mapped file.
    MappedF32(MappedSlice<f32>),
    /// f16 elements borrowed from a mapped file.
    MappedF16(MappedSlice<f16>),
    /// bf16 elements borrowed from a mapped file.
    MappedBF16(MappedSlice<bf16>),
    /// Quantized blocks borrowed from a mapped file.
    Quant(MappedSlice<u8>, QuantFormat),
    /// Quantized blocks with every 8 rows interleaved ([`Tensor::interleaved`]), owned, and
    /// the precision of the activations they meet.
    QuantX8(crate::alloc::Pages, QuantFormat, ActPrecision),
    /// f16 elements copied out of a mapped file onto pages of their own
    /// ([`Tensor::interleaved`]), owned.
    PagesF16(crate::alloc::Pages),
    /// bf16 elements copied onto pages of their own, as [`Storage::PagesF16`].
    PagesBF16(crate::alloc::Pages),
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

/// A named tensor, f32, f16, bf16 or quantized, either borrowed from a mapped file or owned.
pub struct Tensor {
    name: String,
    shape: Vec<usize>,
    storage: Storage,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("name", &self.name)
            .field("shape", &self.shape)
            .field("format", &self.format())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

fn numel_of(name: &str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Config(format!("tensor `{name}`: shape {shape:?} overflows")))
}

impl Tensor {
    /// A view of `shape` elements of `dtype` at byte `offset` of `map`. Borrows the bytes when
    /// they are suitably aligned, and copies them otherwise (a file that packs tensors at odd
    /// offsets still loads). [`Error::TensorPastEnd`] if the range runs past the end of the
    /// file.
    pub fn from_mapped(
        name: &str,
        shape: Vec<usize>,
        map: Arc<MappedFile>,
        offset: usize,
        dtype: FloatType,
    ) -> Result<Tensor> {
        let count = numel_of(name, &shape)?;
        let storage = match dtype {
            FloatType::F32 => match MappedSlice::new(map.clone(), name, offset, count) {
                Ok(view) => Storage::MappedF32(view),
                Err(Error::MisalignedTensor { .. }) => Storage::F32(
                    map[offset..offset + count * 4]
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ),
                Err(e) => return Err(e),
            },
            FloatType::F16 => match MappedSlice::new(map.clone(), name, offset, count) {
                Ok(view) => Storage::MappedF16(view),
                Err(Error::MisalignedTensor { .. }) => Storage::F16(
                    map[offset..offset + count * 2]
                        .chunks_exact(2)
                        .map(|b| f16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                ),
                Err(e) => return Err(e),
            },
        };
        Ok(Tensor {
            name: name.to_owned(),
            shape,
            storage,
        })
    }

    /// A view of `shape` bf16 elements at byte `offset` of `map`, as [`Tensor::from_mapped`]
    /// makes for f32 and f16: borrowed when aligned (the kernels read it as stored), copied
    /// otherwise. [`Error::TensorPastEnd`] if the range runs past the end of the file.
    pub fn from_mapped_bf16(
        name: &str,
        shape: Vec<usize>,
        map: Arc<MappedFile>,
        offset: usize,
    ) -> Result<Tensor> {
        let count = numel_of(name, &shape)?;
        let storage = match MappedSlice::new(map.clone(), name, offset, count) {
            Ok(view) => Storage::MappedBF16(view),
            Err(Error::MisalignedTensor { .. }) => Storage::BF16(
                map[offset..offset + count * 2]
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            Err(e) => return Err(e),
        };
        Ok(Tensor {
            name: name.to_owned(),
            shape,
            storage,
        })
    }

    /// A view of quantized blocks of `format` at byte `offset` of `map`, holding `shape`
    /// (outermost first; its innermost dimension, the row, must be whole blocks). Never
    /// copies. Errors name the tensor: a row that is not whole blocks, a range past the end
    /// of the map, or a block whose f16 scale is NaN or infinite (it would turn its values
    /// into NaN or infinity at every use).
    pub fn from_mapped_quant(
        name: &str,
        shape: Vec<usize>,
        map: Arc<MappedFile>,
        offset: usize,
        format: QuantFormat,
    ) -> Result<Tensor> {
        let count = numel_of(name, &shape)?;
        let row = shape.last().copied().unwrap_or(1);
        if !row.is_multiple_of(format.block_elems()) {
            return Err(Error::Config(format!(
                "tensor `{name}` ({format}, shape {shape:?}): a row of {row} elements is not a whole number of {}-element blocks",
                format.block_elems()
            )));
        }
        let len = count / format.block_elems() * format.block_bytes();
        let blocks = MappedSlice::<u8>::new(map, name, offset, len)?;
        if let Some((block, field)) = format.first_nonfinite_scale(blocks.get()) {
            return Err(Error::Config(format!(
                "tensor `{name}` ({format}): block {block} has a NaN or infinite scale (the f16 at byte {field} of the block)"
            )));
        }
        Ok(Tensor {
            name: name.to_owned(),
            shape,
            storage: Storage::Quant(blocks, format),
        })
    }

    /// An owned f32 tensor. Errors if `data` does not hold `shape`'s element count.
    pub fn from_f32(name: &str, shape: Vec<usize>, data: Vec<f32>) -> Result<Tensor> {
        Self::check_owned(name, &shape, data.len())?;
        Ok(Tensor {
            name: name.to_owned(),
            shape,
            storage: Storage::F32(data),
        })
    }

    /// An owned f16 tensor. Errors if `data` does not hold `shape`'s element count.
    pub fn from_f16(name: &str, shape: Vec<usize>, data: Vec<f16>) -> Result<Tensor> {
        Self::check_owned(name, &shape, data.len())?;
        Ok(Tensor {
            name: name.to_owned(),
            shape,
            storage: Storage::F16(data),
        })
    }

    /// An owned bf16 tensor. Errors if `data` does not hold `shape`'s element count.
    pub fn from_bf16(name: &str, shape: Vec<usize>, data: Vec<bf16>) -> Result<Tensor> {
        Self::check_owned(name, &shape, data.len())?;
        Ok(Tensor {
            name: name.to_owned(),
            shape,
            storage: Storage::BF16(data),
        })
    }

    fn check_owned(name: &str, shape: &[usize], len: usize) -> Result<()> {
        let count = numel_of(name, shape)?;
        if count != len {
            return Err(Error::Config(format!(
                "tensor `{name}`: shape {shape:?} needs {count} elements, got {len}"
            )));
        }
        Ok(())
    }

    /// The tensor's name in its file.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its shape, outermost dimension first (PyTorch order).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// How its elements are stored.
    pub fn format(&self) -> WeightFormat {
        match &self.storage {
            Storage::MappedF32(_) => WeightFormat::F32,
            Storage::MappedF16(_) => WeightFormat::F16,
            Storage::Quant(_, format) | Storage::QuantX8(_, format, _) => {
                WeightFormat::Quant(*format)
            }
            Storage::F32(_) => WeightFormat::F32,
            Storage::F16(_) | Storage::PagesF16(_) => WeightFormat::F16,
            Storage::MappedBF16(_) | Storage::BF16(_) | Storage::PagesBF16(_) => WeightFormat::BF16,
        }
    }

    /// True when the data is borrowed from a mapped file (no copy was made).
    pub fn is_mapped(&self) -> bool {
        matches!(
            self.storage,
            Storage::MappedF32(_)
                | Storage::MappedF16(_)
                | Storage::MappedBF16(_)
                | Storage::Quant(..)
        )
    }

    /// Bytes its data takes (mapped or owned).
    pub fn bytes(&self) -> usize {
        self.weights().bytes()
    }

    /// The data as a kernel operand.
    pub fn weights(&self) -> Weights<'_> {
        match &self.storage {
            Storage::MappedF32(v) => Weights::F32(v.get()),
            Storage::MappedF16(v) => Weights::F16(v.get()),
            Storage::MappedBF16(v) => Weights::BF16(v.get()),
            Storage::Quant(blocks, format) => Weights::Quant(*format, blocks.get()),
            Storage::QuantX8(blocks, format, precision) => {
                Weights::QuantX8(*format, *precision, blocks)
            }
            Storage::F32(v) => Weights::F32(v),
            Storage::F16(v) => Weights::F16(v),
            Storage::BF16(v) => Weights::BF16(v),
            // The pages start on a 2 MiB boundary and hold whole f16s (bf16s).
            Storage::PagesF16(p) => Weights::F16(bytemuck::cast_slice(p)),
            Storage::PagesBF16(p) => Weights::BF16(bytemuck::cast_slice(p)),
        }
    }

    /// The data as f32 slice, when that is its format.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self.weights() {
            Weights::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Elements per row: the innermost dimension (1 for a scalar).
    fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1).max(1)
    }

    /// Rows `r0..r0 + out.len() / row` widened exactly to f32 into `out`, where a row is the
    /// innermost dimension (an embedding lookup, or a panel of a matrix).
    pub fn rows_to_f32(&self, r0: usize, out: &mut [f32]) -> Result<()> {
        let k = self.row_len();
        self.weights()
            .rows_to_f32(r0, out.len() / k, k, out)
            .map_err(|e| Error::Shape(format!("tensor `{}`: {e}", self.name)))
    }

    /// The data widened to an owned f32 vector (biases, norms, embeddings).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let mut out =
            crate::alloc::zeroed(self.numel(), || format!("tensor `{}` in f32", self.name))?;
        self.rows_to_f32(0, &mut out)?;
        Ok(out)
    }

    /// This tensor in `dtype`: itself when it already is, else an owned copy, widened exactly
    /// (f16, bf16, quantized blocks) or rounded to nearest (f32 and bf16 to f16). A quantized tensor is
    /// widened a chunk of rows at a time, so no f32 copy of the whole is held on the way to
    /// f16.
    pub fn into_dtype(self, dtype: FloatType) -> Result<Tensor> {
        if self.format() == WeightFormat::float(dtype) {
            return Ok(self);
        }
        let what = || format!("tensor `{}` in {dtype}", self.name);
        let storage = match dtype {
            FloatType::F32 => Storage::F32(self.to_f32_vec()?),
            FloatType::F16 => {
                let mut out = crate::alloc::zeroed(self.numel(), what)?;
                let k = self.row_len();
                let rows_per = (1usize << 14).div_ceil(k);
                // No longer than the tensor: a tensor of no rows may have rows of any length.
                let mut scratch = crate::alloc::zeroed((rows_per * k).min(out.len()), what)?;
                for (i, dst) in out.chunks_mut(rows_per * k).enumerate() {
                    let tmp = &mut scratch[..dst.len()];
                    self.rows_to_f32(i * rows_per, tmp)?;
                    qkv_kernels::convert::f32_to_f16(tmp, dst)?;
                }
                Storage::F16(out)
            }
        };
        Ok(Tensor {
            name: self.name,
            shape: self.shape,
            storage,
        })
    }

    /// The same matrix as the matrix products read it fastest, copied out of the mapped file
    /// onto pages of its own, huge where the kernel grants them ([`qkv_kernels::pages`]):
    /// with its rows interleaved 8 by 8 ([`qkv_kernels::quant::x8`]) when it is 2-D, of a
    /// format that has that layout ([`qkv_kernels::quant::x8::supports`]) and has a multiple
    /// of 8 rows; as it is when it is a mapped 2-D f16 or bf16 matrix. Anything else comes back
    /// unchanged. The copy takes as many bytes as the file's, and the mapped pages it was
    /// made from are let go, so the process holds one copy of the weights, not two. An
    /// interleaved matrix meets activations at `options.act_precision`. Without
    /// `options.interleave` every matrix comes back as the file stores it.
    /// Errors with [`Error::AllocationRefused`] when the buffer cannot be had.
    pub fn interleaved(self, options: &MatrixOptions) -> Result<Tensor> {
        let (blocks, format) = match &self.storage {
            Storage::Quant(blocks, format) => (blocks, *format),
            Storage::MappedF16(v) if self.shape.len() == 2 && options.interleave => {
                let out = copy_onto_pages(v, &self.name, 4 << 20)?;
                return Ok(Tensor {
                    name: self.name,
                    shape: self.shape,
                    storage: Storage::PagesF16(out),
                });
            }
            Storage::MappedBF16(v) if self.shape.len() == 2 && options.interleave => {
                let out = copy_onto_pages(v, &self.name, 4 << 20)?;
                return Ok(Tensor {
                    name: self.name,
                    shape: self.shape,
                    storage: Storage::PagesBF16(out),
                });
            }
            _ => return Ok(self),
        };
        let [n, k] = *self.shape.as_slice() else {
            return Ok(self);
        };
        if !options.interleave || qkv_kernels::quant::x8::check(format, n, k).is_err() {
            return Ok(self);
        }
        let src = blocks.get();
        let mut out =
            crate::alloc::pages(src.len(), || format!("tensor `{}` interleaved", self.name))?;
        qkv_kernels::quant::x8::pack(format, src, n, k, &mut out)
            .map_err(|e| Error::Shape(format!("tensor `{}`: {e}", self.name)))?;
        blocks.release();
        Ok(Tensor {
            name: self.name,
            shape: self.shape,
            storage: Storage::QuantX8(out, format, options.act_precision),
        })
    }

    /// Splits a matrix into consecutive blocks of rows, `rows[i]` rows each, named
    /// `name[a..b]`: a fused projection (Phi-3's QKV, its gate/up) as separate matrices.
    /// Mapped and quantized data stay borrowed (each part is a view of its rows); owned data
    /// is copied. [`Error::TensorShape`] unless the tensor is 2-D with exactly
    /// `rows.iter().sum()` rows.
    pub fn split_rows(self, rows: &[usize]) -> Result<Vec<Tensor>> {
        let total = rows.iter().try_fold(0usize, |a, &r| a.checked_add(r));
        let [n, k] = *self.shape.as_slice() else {
            return Err(self.shape_error(total.unwrap_or(usize::MAX)));
        };
        if total != Some(n) {
            return Err(self.shape_error(total.unwrap_or(usize::MAX)));
        }
        let row_bytes = match self.format().bytes_for(k) {
            Some(b) => b,
            None => return Err(self.shape_error(n)),
        };
        let mut parts = Vec::with_capacity(rows.len());
        let mut r0 = 0;
        for &r in rows {
            let name = format!("{}[{r0}..{}]", self.name, r0 + r);
            // Rows r0..r0 + r of the matrix: in range, as the parts add up to its rows.
            let out_of_range = || self.shape_error(n);
            let storage = match &self.storage {
                Storage::MappedF32(v) => {
                    Storage::MappedF32(v.sub(r0 * k, r * k).ok_or_else(out_of_range)?)
                }
                Storage::MappedF16(v) => {
                    Storage::MappedF16(v.sub(r0 * k, r * k).ok_or_else(out_of_range)?)
                }
                Storage::MappedBF16(v) => {
                    Storage::MappedBF16(v.sub(r0 * k, r * k).ok_or_else(out_of_range)?)
                }
                Storage::Quant(blocks, format) => Storage::Quant(
                    blocks
                        .sub(r0 * row_bytes, r * row_bytes)
                        .ok_or_else(out_of_range)?,
                    *format,
                ),
                Storage::QuantX8(blocks, format, precision) => {
                    if !(r0.is_multiple_of(8) && r.is_multiple_of(8)) {
                        return Err(Error::Shape(format!(
                            "tensor `{}`: rows {r0}..{} cut a group of 8 interleaved rows",
                            self.name,
                            r0 + r
                        )));
                    }
                    let bytes = &blocks[r0 * row_bytes..(r0 + r) * row_bytes];
                    let mut part = crate::alloc::pages(bytes.len(), || name.clone())?;
                    part.copy_from_slice(bytes);
                    Storage::QuantX8(part, *format, *precision)
                }
                Storage::F32(v) => Storage::F32(v[r0 * k..(r0 + r) * k].to_vec()),
                Storage::F16(v) => Storage::F16(v[r0 * k..(r0 + r) * k].to_vec()),
                Storage::BF16(v) => Storage::BF16(v[r0 * k..(r0 + r) * k].to_vec()),
                Storage::PagesF16(p) => {
                    let v: &[f16] = bytemuck::cast_slice(p);
                    Storage::F16(v[r0 * k..(r0 + r) * k].to_vec())
                }
                Storage::PagesBF16(p) => {
                    let v: &[bf16] = bytemuck::cast_slice(p);
                    Storage::BF16(v[r0 * k..(r0 + r) * k].to_vec())
                }
            };
            parts.push(Tensor {
                name,
                shape: vec![r, k],
                storage,
            });
            r0 += r;
        }
        Ok(parts)
    }

    /// Splits a 3-D tensor `[n, rows, cols]` (a stack of matrices, such as a GGUF file's
    /// `ffn_gate_exps`, one matrix per expert) into its `n` matrices `[rows, cols]`, named
    /// `name[i]`. As with [`split_rows`](Self::split_rows), mapped and quantized data stay
    /// borrowed, each part a view of its rows; owned data is copied. [`Error::TensorShape`]
    /// unless the tensor is 3-D.
    pub fn split_outer(self) -> Result<Vec<Tensor>> {
        let [n, rows, cols] = *self.shape.as_slice() else {
            return Err(Error::TensorShape {
                name: self.name.clone(),
                expected: vec![0, 0, 0],
                actual: self.shape.clone(),
            });
        };
        let name = self.name.clone();
        let flat_rows = numel_of(&name, &[n, rows])?;
        let flat = Tensor {
            name: name.clone(),
            shape: vec![flat_rows, cols],
            storage: self.storage,
        };
        let mut parts = flat.split_rows(&vec![rows; n])?;
        for (i, p) in parts.iter_mut().enumerate() {
            p.name = format!("{name}[{i}]");
        }
        Ok(parts)
    }

    fn shape_error(&self, rows: usize) -> Error {
        Error::TensorShape {
            name: self.name.clone(),
            expected: vec![rows, self.shape.last().copied().unwrap_or(0)],
            actual: self.shape.clone(),
        }
    }

    /// Errors with [`Error::TensorShape`] unless the shape is `expected`.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<&Tensor> {
        if self.shape != expected {
            return Err(Error::TensorShape {
                name: self.name.clone(),
                expected: expected.to_vec(),
                actual: self.shape.clone(),
            });
        }
        Ok(self)
    }
}

/// The 16-bit elements (f16 or bf16) of `v` copied onto pages of their own
/// ([`crate::alloc::pages`]), `piece` elements at a time, each piece's mapped pages let go
/// once copied, so that the process never holds two copies of more than a piece (4 Mi
/// elements, 8 MiB, for the models).
fn copy_onto_pages<T: bytemuck::Pod>(
    v: &MappedSlice<T>,
    name: &str,
    piece: usize,
) -> Result<crate::alloc::Pages> {
    let size = std::mem::size_of::<T>();
    let mut out = crate::alloc::pages(std::mem::size_of_val(v.get()), || {
        format!("tensor `{name}` on its own pages")
    })?;
    for (i, dst) in out.chunks_mut(size * piece.max(1)).enumerate() {
        let src = v
            .sub(i * piece.max(1), dst.len() / size)
            .ok_or_else(|| Error::Shape(format!("tensor `{name}`: a piece past its end")))?;
        dst.copy_from_slice(bytemuck::cast_slice(src.get()));
        src.release();
    }
    Ok(out)
}

/// Anything that hands out tensors by name: a safetensors file, a GGUF file, a directory.
pub trait TensorSource: Send + Sync {
    /// The tensor called `name`, as it is stored (f32, f16, bf16, the quantized formats of
    /// [`QuantFormat`]). [`Error::MissingTensor`] when absent.
    fn tensor(&self, name: &str) -> Result<Tensor>;
    /// True when the source has a tensor of that name.
    fn contains(&self, name: &str) -> bool;
    /// All tensor names, in file order.
    fn names(&self) -> Vec<String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_copied_onto_pages_piece_by_piece_keeps_every_value() {
        let values: Vec<f16> = (0..1001).map(|i| f16::from_f32(i as f32 - 500.0)).collect();
        let (dir, file) = mmap::tests::mapped_bytes("pages", bytemuck::cast_slice(&values));
        // From element 1 on (an offset inside the file), in pieces that do not divide it.
        let v = MappedSlice::<f16>::new(file, "w", 2, 1000).unwrap();
        for piece in [1, 7, 1000, 4096] {
            let pages = copy_onto_pages(&v, "w", piece).unwrap();
            assert_eq!(bytemuck::cast_slice::<u8, f16>(&pages), &values[1..]);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// bf16 is mapped where aligned and copied where not, the same values either way; a
    /// range past the end is an error naming the tensor.
    #[test]
    fn bf16_is_mapped_when_aligned_and_copied_when_not() {
        let values: Vec<bf16> = (0..9).map(|i| bf16::from_f32(i as f32 * -1.5)).collect();
        // The values at byte 1 (misaligned), then again at byte 20 (aligned).
        let mut bytes = vec![0u8];
        bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        bytes.push(0);
        bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        let (dir, file) = mmap::tests::mapped_bytes("bf16", &bytes);
        let want: Vec<f32> = values.iter().map(|v| v.to_f32()).collect();
        let odd = Tensor::from_mapped_bf16("w", vec![3, 3], file.clone(), 1).unwrap();
        assert!(!odd.is_mapped() && odd.format() == WeightFormat::BF16);
        assert_eq!(odd.to_f32_vec().unwrap(), want);
        let even = Tensor::from_mapped_bf16("w", vec![3, 3], file.clone(), 20).unwrap();
        assert!(even.is_mapped());
        assert_eq!(even.to_f32_vec().unwrap(), want);
        match Tensor::from_mapped_bf16("w", vec![10], file, 20) {
            Err(Error::TensorPastEnd { tensor, .. }) => assert_eq!(tensor, "w"),
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `MatrixOptions` decide per call: the file's layout kept, mapped, without
    /// `interleave`; the interleaved copy meeting activations at the precision asked.
    #[test]
    fn matrix_options_choose_the_layout_and_the_precision() {
        let (n, k, format) = (8, 64, QuantFormat::Q8_0);
        let bytes: Vec<u8> = (0..n * format.row_bytes(k).unwrap())
            .map(|i| (i % 7) as u8)
            .collect();
        let (dir, file) = mmap::tests::mapped_bytes("layout", &bytes);
        let tensor = || Tensor::from_mapped_quant("w", vec![n, k], file.clone(), 0, format);
        let kept = MatrixOptions {
            interleave: false,
            ..MatrixOptions::default()
        };
        let t = tensor().unwrap().interleaved(&kept).unwrap();
        assert!(t.is_mapped() && matches!(t.weights(), Weights::Quant(..)));
        for precision in [ActPrecision::Wide, ActPrecision::Byte] {
            let options = MatrixOptions {
                act_precision: precision,
                interleave: true,
            };
            let t = tensor().unwrap().interleaved(&options).unwrap();
            assert!(!t.is_mapped() && matches!(t.weights(), Weights::QuantX8(..)));
            assert_eq!(t.weights().act_precision(), Some(precision));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
