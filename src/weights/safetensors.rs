//! `.safetensors` files (PyTorch / Hugging Face) mapped with memmap2.
//!
//! The header is parsed and validated by the `safetensors` crate over the mapped bytes; this
//! module turns its entries into [`Tensor`]s. f32, f16 and bf16 tensors borrow the mapped
//! bytes (no copy, [`Tensor::is_mapped`] is true; the kernels widen f16 and bf16 in
//! registers). Other dtypes (integers, f64, fp8…) give
//! [`Error::UnsupportedDType`].
//!
//! A state_dict written by `safetensors.torch.save_file(module.state_dict(), path)` loads as
//! it is: names are PyTorch's (`q.weight`, `Encoder.Layers.0.attn.wq.bias`, …). The optional
//! `__metadata__` string map is available through [`SafeTensorsFile::metadata`].
//!
//! A truncated, inconsistent or hostile file gives [`Error::Format`] naming the file; nothing
//! panics.
//!
//! ```
//! use qkv::weights::safetensors::SafeTensorsFile;
//! use qkv::weights::TensorSource;
//! # fn main() -> qkv::Result<()> {
//! // A file with one f32 tensor `w` of shape [2]: 8-byte header length, JSON header, data.
//! // The header is space-padded to a multiple of 8 bytes, as writers do, so the data is aligned.
//! let mut header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#.to_vec();
//! header.resize(header.len().next_multiple_of(8), b' ');
//! let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
//! bytes.extend_from_slice(&header);
//! bytes.extend_from_slice(&1.5f32.to_le_bytes());
//! bytes.extend_from_slice(&(-2.0f32).to_le_bytes());
//! let path = std::env::temp_dir().join(format!("qkv-doc-{}.safetensors", std::process::id()));
//! std::fs::write(&path, &bytes).unwrap();
//!
//! let file = SafeTensorsFile::open(&path)?;
//! let w = file.tensor("w")?;
//! assert_eq!(w.shape(), &[2]);
//! assert_eq!(w.as_f32(), Some(&[1.5f32, -2.0][..]));
//! assert!(w.is_mapped());
//! # std::fs::remove_file(&path).ok();
//! # Ok(())
//! # }
//! ```

use super::{map_file, FloatType, MappedFile, Tensor, TensorSource};
use crate::error::{Error, Result};
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A `.safetensors` file, mapped read-only, handing out tensors by their stored names.
pub struct SafeTensorsFile {
    path: PathBuf,
    map: Arc<MappedFile>,
    /// Byte offset of the data section (8 + header length).
    data_start: usize,
    header: Metadata,
}

impl std::fmt::Debug for SafeTensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeTensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.header.tensors().len())
            .finish()
    }
}

impl SafeTensorsFile {
    /// Maps `path` and validates its header (lengths, offsets, dtypes, shapes).
    ///
    /// Errors: [`Error::Io`] if the file cannot be opened or mapped, [`Error::Format`] if the
    /// header is malformed, the offsets overlap or leave gaps, or the data is truncated.
    /// A tensor whose data runs past the end of the file is [`Error::TensorPastEnd`] when it
    /// is loaded.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_owned();
        let map = map_file(&path)?;
        let (header_len, header) =
            SafeTensors::read_metadata(&map[..]).map_err(|e| Error::Format {
                path: path.clone(),
                msg: format!("not a valid safetensors file: {e}"),
            })?;
        // `read_metadata` checked that 8 + header_len + data fits the buffer exactly.
        let data_start = 8 + header_len;
        Ok(SafeTensorsFile {
            path,
            map,
            data_start,
            header,
        })
    }

    /// The file this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The free-form `__metadata__` string map of the header (empty when absent).
    pub fn metadata(&self) -> HashMap<String, String> {
        self.header.metadata().clone().unwrap_or_default()
    }

    /// The stored shape of tensor `name`, without loading it.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.header.info(name).map(|i| i.shape.as_slice())
    }

    fn format_error(&self, msg: String) -> Error {
        Error::Format {
            path: self.path.clone(),
            msg,
        }
    }
}

impl TensorSource for SafeTensorsFile {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.header.info(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
        })?;
        let (start, end) = info.data_offsets;
        let offset = self
            .data_start
            .checked_add(start)
            .filter(|_| end >= start)
            .ok_or_else(|| self.format_error(format!("tensor `{name}`: bad data offsets")))?;
        // The end checked here too, so that a range past the file names the file.
        self.data_start
            .checked_add(end)
            .filter(|&s| s <= self.map.len())
            .ok_or_else(|| Error::TensorPastEnd {
                path: self.path.clone(),
                tensor: name.to_owned(),
                offset: offset as u64,
                length: (end - start) as u64,
                file_size: self.map.len() as u64,
            })?;
        let shape = info.shape.clone();
        // The bounds errors of the mapped views name the file already.
        let in_file = |e: Error| match e {
            Error::TensorPastEnd { .. } => e,
            other => self.format_error(other.to_string()),
        };
        match info.dtype {
            Dtype::F32 => {
                Tensor::from_mapped(name, shape, self.map.clone(), offset, FloatType::F32)
                    .map_err(in_file)
            }
            Dtype::F16 => {
                Tensor::from_mapped(name, shape, self.map.clone(), offset, FloatType::F16)
                    .map_err(in_file)
            }
            Dtype::BF16 => {
                Tensor::from_mapped_bf16(name, shape, self.map.clone(), offset).map_err(in_file)
            }
            other => Err(Error::UnsupportedDType {
                name: name.to_owned(),
                dtype: format!("{other:?}"),
            }),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.header.info(name).is_some()
    }

    fn names(&self) -> Vec<String> {
        self.header.offset_keys()
    }
}
