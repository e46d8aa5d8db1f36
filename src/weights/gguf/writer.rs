//! Writing GGUF v3: [`write_gguf`] for tensors in memory, and the streaming writer that
//! [`convert`](super::convert()) feeds one tensor at a time.

use super::{
    align_up, GgmlType, MetaValue, DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_ARRAY_DEPTH,
    MAX_DIMS,
};
use crate::error::{Error, Result};
use crate::weights::{Tensor, WeightFormat};
use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::Path;

/// What the header says of one tensor to be written.
pub(super) struct TensorHeader<'a> {
    pub(super) name: &'a str,
    pub(super) shape: &'a [usize],
    pub(super) format: WeightFormat,
    pub(super) n_bytes: usize,
}

pub(super) fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

fn write_string(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn check_value(key: &str, v: &MetaValue, depth: usize) -> Result<()> {
    if let MetaValue::Array(elem, items) = v {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(Error::Config(format!(
                "metadata key `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}"
            )));
        }
        for item in items {
            if item.value_type() != *elem {
                return Err(Error::Config(format!(
                    "metadata key `{key}`: an array of {elem} holds a {}",
                    item.value_type()
                )));
            }
            check_value(key, item, depth + 1)?;
        }
    }
    Ok(())
}

fn write_value(w: &mut impl Write, v: &MetaValue) -> std::io::Result<()> {
    match v {
        MetaValue::U8(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I8(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::U16(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I16(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::U32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::U64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::F32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::F64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::Bool(x) => w.write_all(&[u8::from(*x)]),
        MetaValue::String(s) => write_string(w, s),
        MetaValue::Array(elem, items) => {
            w.write_all(&elem.code().to_le_bytes())?;
            w.write_all(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|item| write_value(w, item))
        }
    }
}

/// Checks that `path` is either absent or a regular file, so that renaming a new file onto
/// it replaces nothing but a regular file. A directory, device, FIFO, socket or symbolic link
/// (whatever it points to) under `path` gives [`Error::Io`] of kind
/// [`std::io::ErrorKind::AlreadyExists`]; the rename would otherwise swap a device such as
/// `/dev/null` for a regular file, or a symlink for a file instead of writing where it points.
fn check_replaceable(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path)(e)),
    };
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(());
    }
    let what = if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        special_file_kind(&ft)
    };
    Err(io_err(path)(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("exists and is {what}, not a regular file; refusing to replace it"),
    )))
}

#[cfg(unix)]
fn special_file_kind(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_file_kind(_: &std::fs::FileType) -> &'static str {
    "a special file"
}

/// Writes a GGUF file to a temporary sibling of `path` and renames it into place, so that an
/// interrupted write never leaves a half-written file under `path`. An existing `path` that
/// is not a regular file is an error (see [`check_replaceable`]) and is left untouched.
/// `write_data(i, w)` must write exactly the bytes of tensor `i`.
pub(super) fn write_streaming(
    path: &Path,
    metadata: &[(String, MetaValue)],
    tensors: &[TensorHeader<'_>],
    mut write_data: impl FnMut(usize, &mut dyn Write) -> Result<()>,
) -> Result<()> {
    let mut seen = HashMap::new();
    for (key, value) in metadata {
        if seen.insert(key.as_str(), ()).is_some() {
            return Err(Error::Config(format!("metadata key `{key}` given twice")));
        }
        check_value(key, value, 0)?;
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => match v.as_u32() {
            Some(a) if a.is_power_of_two() => a as usize,
            _ => {
                return Err(Error::Config(format!(
                    "general.alignment {v:?} is not a power of two"
                )))
            }
        },
    };
    let mut names = HashMap::new();
    for t in tensors {
        if names.insert(t.name, ()).is_some() {
            return Err(Error::Config(format!("tensor `{}` given twice", t.name)));
        }
        if t.shape.is_empty() || t.shape.len() > MAX_DIMS {
            return Err(Error::Config(format!(
                "tensor `{}`: GGUF allows 1 to {MAX_DIMS} dimensions, not {}",
                t.name,
                t.shape.len()
            )));
        }
    }

    if path.file_name().is_none() {
        return Err(Error::Config(format!(
            "{} is not a file path",
            path.display()
        )));
    }
    check_replaceable(path)?;
    let tmp = crate::weights::temp_sibling(path);

    let result = (|| -> Result<()> {
        // A fresh name (never another writer's), and errors name the output, not it.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io_err(path))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let mut pos = 0usize;
        let mut header = Vec::new();
        header.extend_from_slice(&GGUF_MAGIC);
        header.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            write_string(&mut header, key).map_err(io_err(&tmp))?;
            header.extend_from_slice(&value.value_type().code().to_le_bytes());
            write_value(&mut header, value).map_err(io_err(&tmp))?;
        }
        let mut rel = 0usize;
        for t in tensors {
            write_string(&mut header, t.name).map_err(io_err(&tmp))?;
            header.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                header.extend_from_slice(&(d as u64).to_le_bytes());
            }
            header.extend_from_slice(&GgmlType::from(t.format).code().to_le_bytes());
            header.extend_from_slice(&(rel as u64).to_le_bytes());
            rel = align_up(rel + t.n_bytes, alignment).expect("sizes were checked");
        }
        let padded = align_up(header.len(), alignment).expect("header fits in memory");
        header.resize(padded, 0);
        w.write_all(&header).map_err(io_err(&tmp))?;
        pos += header.len();
        let zeros = vec![0u8; alignment];
        for (i, t) in tensors.iter().enumerate() {
            let mut counting = CountingWriter {
                inner: &mut w,
                count: 0,
            };
            write_data(i, &mut counting)?;
            if counting.count != t.n_bytes {
                return Err(Error::Config(format!(
                    "tensor `{}`: wrote {} bytes, expected {}",
                    t.name, counting.count, t.n_bytes
                )));
            }
            pos += t.n_bytes;
            let pad = align_up(pos, alignment).expect("fits") - pos;
            w.write_all(&zeros[..pad]).map_err(io_err(&tmp))?;
            pos += pad;
        }
        let file = w.into_inner().map_err(|e| io_err(&tmp)(e.into_error()))?;
        file.sync_all().map_err(io_err(&tmp))?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(io_err(path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

struct CountingWriter<'a, W: Write> {
    inner: &'a mut W,
    count: usize,
}

impl<W: Write> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes a GGUF v3 file (little endian, alignment 32 unless `metadata` sets
/// `general.alignment`) holding `metadata` in the order given and `tensors` as
/// `(name, shape in qkv order, format, little-endian bytes)`; quantized tensors are whole
/// blocks per row, as GGUF stores them.
///
/// The file is written under a temporary name beside `path` and renamed into place when
/// complete. Errors with [`Error::Config`] on duplicate names, arrays whose elements disagree
/// with their declared type, or byte lengths that do not match the shapes; [`Error::Io`] when
/// the file cannot be written, or when `path` exists but is not a regular file (a directory,
/// device, FIFO, socket or symbolic link), which is then left as it was.
pub fn write_gguf(
    path: &Path,
    metadata: &[(String, MetaValue)],
    tensors: &[(String, Vec<usize>, WeightFormat, &[u8])],
) -> Result<()> {
    let mut headers = Vec::with_capacity(tensors.len());
    for (name, shape, format, data) in tensors {
        let row = shape.last().copied().unwrap_or(1);
        let n_bytes = format
            .bytes_for(row)
            .and_then(|b| {
                shape
                    .iter()
                    .rev()
                    .skip(1)
                    .try_fold(b, |a, &d| a.checked_mul(d))
            })
            .ok_or_else(|| {
                Error::Config(format!(
                    "tensor `{name}`: shape {shape:?} overflows or is not whole {format} blocks"
                ))
            })?;
        if n_bytes != data.len() {
            return Err(Error::Config(format!(
                "tensor `{name}`: shape {shape:?} in {format} needs {n_bytes} bytes, got {}",
                data.len()
            )));
        }
        headers.push(TensorHeader {
            name,
            shape,
            format: *format,
            n_bytes,
        });
    }
    write_streaming(path, metadata, &headers, |i, w| {
        w.write_all(tensors[i].3).map_err(io_err(path))
    })
}

/// Writes the elements of `tensor` as little-endian bytes.
pub(super) fn write_tensor_bytes(tensor: &Tensor, w: &mut dyn Write, path: &Path) -> Result<()> {
    let mut buf = Vec::with_capacity(1 << 16);
    match tensor.weights() {
        // Tensors hold their file's layout; only a layer's own copy is ever transposed.
        qkv_kernels::Weights::F32T(_) => {
            return Err(Error::Unsupported(format!(
                "tensor `{}`: writing a transposed f32 matrix",
                tensor.name()
            )))
        }
        qkv_kernels::Weights::F32(v) => {
            for chunk in v.chunks(1 << 14) {
                buf.clear();
                buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                w.write_all(&buf).map_err(io_err(path))?;
            }
        }
        qkv_kernels::Weights::F16(v) => {
            for chunk in v.chunks(1 << 15) {
                buf.clear();
                buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                w.write_all(&buf).map_err(io_err(path))?;
            }
        }
        qkv_kernels::Weights::BF16(v) => {
            for chunk in v.chunks(1 << 15) {
                buf.clear();
                buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                w.write_all(&buf).map_err(io_err(path))?;
            }
        }
        qkv_kernels::Weights::Quant(_, bytes) => w.write_all(bytes).map_err(io_err(path))?,
        // The file's layout back, a group of 8 rows at a time.
        qkv_kernels::Weights::QuantX8(format, _, packed) => {
            let k = tensor.shape().last().copied().unwrap_or(0);
            let group = format
                .row_bytes(k)
                .map_err(|e| Error::Shape(format!("tensor `{}`: {e}", tensor.name())))?
                * qkv_kernels::quant::x8::ROWS;
            buf.resize(group, 0);
            for g in 0..packed.len() / group.max(1) {
                qkv_kernels::quant::x8::unpack_rows(format, packed, k, 8 * g, 8, &mut buf)
                    .map_err(|e| Error::Shape(format!("tensor `{}`: {e}", tensor.name())))?;
                w.write_all(&buf).map_err(io_err(path))?;
            }
        }
    }
    Ok(())
}
