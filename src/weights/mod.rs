//! Weights: files mapped with memmap2 and turned into named, typed tensor views.
//!
//! A [`Tensor`] knows how it is stored ([`WeightFormat`]: f32, f16 or a GGUF quantized
//! format) apart from what qkv computes in ([`FloatType`]: activations are f32, the KV cache
//! f16 or f32). Its bytes stay in the mapped file whenever the kernels can read them there:
//! f32 and f16 when aligned, quantized blocks always. Nothing is widened at load unless asked
//! ([`Tensor::into_dtype`], `--dtype`); bf16, which no kernel reads, is converted once at load
//! into an owned buffer.
//!
//! - [`safetensors`]: PyTorch / Hugging Face `.safetensors` files.
//! - [`gguf`]: llama.cpp's GGUF (v2, v3).

pub mod gguf;
pub mod safetensors;

use crate::error::{Error, Result};
use half::f16;
use memmap2::Mmap;
use qkv_kernels::{QuantFormat, Weights};
use std::fs::File;
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
            WeightFormat::F16 => count.checked_mul(2),
            WeightFormat::Quant(f) => f.row_bytes(count).ok(),
        }
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightFormat::F32 => f.write_str("F32"),
            WeightFormat::F16 => f.write_str("F16"),
            WeightFormat::Quant(q) => f.write_str(q.name()),
        }
    }
}

/// A hidden name beside `path` for writing it before a rename into place. Unique per process
/// and per call, so that threads (two sessions fetching the default model at once, say) and
/// processes writing the same file never share one.
pub(crate) fn temp_sibling(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("tmp");
    path.with_file_name(format!(".{name}.tmp-{}-{call}", std::process::id()))
}

/// Maps a whole file read-only, with errors that name it.
///
/// The file must not change while the map lives: tensors read it in place, so a file that
/// another process truncates makes reads fault (SIGBUS), and one rewritten in place changes
/// the weights under the model. Replace model files by renaming a new file over the old
/// path (as `decode convert` does), which leaves existing maps on the old contents.
pub fn map_file(path: &Path) -> Result<Arc<Mmap>> {
    let file = File::open(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    // SAFETY: the map is read-only and qkv never writes to it. A file truncated or rewritten
    // in place by another process while mapped is outside what any mmap-based reader can
    // defend against; this function's docs, `Model::load`'s and the README say so.
    let map = unsafe { Mmap::map(&file) }.map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(Arc::new(map))
}

enum Storage {
    /// Borrowed from a mapped file: `count` elements of `dtype` at byte `offset`, aligned.
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        dtype: FloatType,
    },
    /// Quantized blocks borrowed from a mapped file: `len` bytes at byte `offset`.
    Quant {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
        format: QuantFormat,
    },
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// A named tensor, f32, f16 or quantized, either borrowed from a mapped file or owned.
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
    /// offsets still loads). Errors if the range lies outside the map.
    pub fn from_mapped(
        name: &str,
        shape: Vec<usize>,
        map: Arc<Mmap>,
        offset: usize,
        dtype: FloatType,
    ) -> Result<Tensor> {
        let count = numel_of(name, &shape)?;
        let bytes = count
            .checked_mul(dtype.size())
            .and_then(|b| b.checked_add(offset))
            .filter(|&end| end <= map.len())
            .ok_or_else(|| {
                Error::Config(format!(
                    "tensor `{name}` ({dtype}, shape {shape:?}) at byte {offset} runs past the end of its file ({} bytes)",
                    map.len()
                ))
            })?;
        let raw = &map[offset..bytes];
        let aligned = (raw.as_ptr() as usize).is_multiple_of(dtype.size());
        let storage = if aligned {
            Storage::Mapped { map, offset, dtype }
        } else {
            match dtype {
                FloatType::F32 => Storage::F32(
                    raw.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ),
                FloatType::F16 => Storage::F16(
                    raw.chunks_exact(2)
                        .map(|b| f16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                ),
            }
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
        map: Arc<Mmap>,
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
        let end = offset.checked_add(len).filter(|&end| end <= map.len()).ok_or_else(|| {
            Error::Config(format!(
                "tensor `{name}` ({format}, shape {shape:?}) at byte {offset} runs past the end of its file ({} bytes)",
                map.len()
            ))
        })?;
        if let Some((block, field)) = format.first_nonfinite_scale(&map[offset..end]) {
            return Err(Error::Config(format!(
                "tensor `{name}` ({format}): block {block} has a NaN or infinite scale (the f16 at byte {field} of the block)"
            )));
        }
        Ok(Tensor {
            name: name.to_owned(),
            shape,
            storage: Storage::Quant {
                map,
                offset,
                len,
                format,
            },
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
            Storage::Mapped { dtype, .. } => WeightFormat::float(*dtype),
            Storage::Quant { format, .. } => WeightFormat::Quant(*format),
            Storage::F32(_) => WeightFormat::F32,
            Storage::F16(_) => WeightFormat::F16,
        }
    }

    /// True when the data is borrowed from a mapped file (no copy was made).
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. } | Storage::Quant { .. })
    }

    /// Bytes its data takes (mapped or owned).
    pub fn bytes(&self) -> usize {
        self.weights().bytes()
    }

    /// The data as a kernel operand.
    pub fn weights(&self) -> Weights<'_> {
        match &self.storage {
            Storage::Mapped { map, offset, dtype } => {
                let n = self.numel();
                let ptr = map[*offset..].as_ptr();
                match dtype {
                    // SAFETY: `from_mapped` checked that offset + n·4 bytes lie inside the
                    // map and that `ptr` is 4-aligned; the map lives as long as `self`.
                    FloatType::F32 => {
                        Weights::F32(unsafe { std::slice::from_raw_parts(ptr as *const f32, n) })
                    }
                    // SAFETY: as above with 2-byte elements; f16 is a plain 16-bit value.
                    FloatType::F16 => {
                        Weights::F16(unsafe { std::slice::from_raw_parts(ptr as *const f16, n) })
                    }
                }
            }
            Storage::Quant {
                map,
                offset,
                len,
                format,
            } => Weights::Quant(*format, &map[*offset..*offset + *len]),
            Storage::F32(v) => Weights::F32(v),
            Storage::F16(v) => Weights::F16(v),
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
            crate::models::zeroed(self.numel(), || format!("tensor `{}` in f32", self.name))?;
        self.rows_to_f32(0, &mut out)?;
        Ok(out)
    }

    /// This tensor in `dtype`: itself when it already is, else an owned copy, widened exactly
    /// (f16, quantized blocks) or rounded to nearest (f32 to f16). A quantized tensor is
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
                let mut out = crate::models::zeroed(self.numel(), what)?;
                let k = self.row_len();
                let rows_per = (1usize << 14).div_ceil(k);
                let mut scratch = vec![0.0f32; rows_per * k];
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
            let storage = match &self.storage {
                Storage::Mapped { map, offset, dtype } => Storage::Mapped {
                    map: map.clone(),
                    offset: offset + r0 * row_bytes,
                    dtype: *dtype,
                },
                Storage::Quant {
                    map,
                    offset,
                    format,
                    ..
                } => Storage::Quant {
                    map: map.clone(),
                    offset: offset + r0 * row_bytes,
                    len: r * row_bytes,
                    format: *format,
                },
                Storage::F32(v) => Storage::F32(v[r0 * k..(r0 + r) * k].to_vec()),
                Storage::F16(v) => Storage::F16(v[r0 * k..(r0 + r) * k].to_vec()),
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

/// Anything that hands out tensors by name: a safetensors file, a GGUF file, a directory.
pub trait TensorSource: Send + Sync {
    /// The tensor called `name`, as it is stored when the kernels can read that (f32, f16,
    /// the quantized formats of [`QuantFormat`]), else converted once (bf16).
    /// [`Error::MissingTensor`] when absent.
    fn tensor(&self, name: &str) -> Result<Tensor>;
    /// True when the source has a tensor of that name.
    fn contains(&self, name: &str) -> bool;
    /// All tensor names, in file order.
    fn names(&self) -> Vec<String>;
}
