//! Converting any readable GGUF file into one of f32 or f16 tensors.

use super::writer::{write_streaming, write_tensor_bytes, TensorHeader};
use super::{GgufFile, GgufTensorInfo, MetaValue};
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::weights::TensorSource;
use crate::weights::{FloatType, WeightFormat};
use std::path::Path;

/// Converts the GGUF file `input` into a GGUF v3 file `output` whose tensors are all in
/// `dtype`, except 1-D tensors (norm weights, biases), which are kept in f32 as llama.cpp does.
///
/// All metadata is copied, with `general.file_type` set to 1 (f16) or 0 (f32) and
/// `general.alignment` dropped (the output uses the default 32). Quantized and BF16 tensors
/// are dequantized exactly as [`TensorSource::tensor`] does. Tensors are converted and written
/// one at a time, and the output appears under its name only once complete. The result is
/// readable by llama.cpp and maps into qkv without copies.
///
/// An existing `output` is replaced only if it is a regular file: a directory, device (such
/// as `/dev/null`), FIFO, socket or symbolic link there gives [`Error::Io`] and is left alone.
pub fn convert(input: &Path, output: &Path, dtype: FloatType) -> Result<()> {
    let src = GgufFile::open(input)?;
    // Faults of the input's tensors name the input (I/O errors name their own path).
    let in_input = |e: Error| match e {
        Error::Io { .. } | Error::InFile { .. } => e,
        other => Error::InFile {
            path: input.to_owned(),
            source: Box::new(other),
        },
    };
    for info in src.tensor_infos() {
        if !info.ggml_type.is_loadable() {
            return Err(in_input(Error::UnsupportedDType {
                name: info.name.clone(),
                dtype: format!("GGUF {} (cannot convert it)", info.ggml_type),
            }));
        }
    }
    let file_type = match dtype {
        FloatType::F32 => 0u32,
        FloatType::F16 => 1u32,
    };
    let mut metadata: Vec<(String, MetaValue)> = src
        .metadata_entries()
        .iter()
        .filter(|(k, _)| k != "general.alignment")
        .cloned()
        .collect();
    match metadata.iter_mut().find(|(k, _)| k == "general.file_type") {
        Some((_, v)) => *v = MetaValue::U32(file_type),
        None => metadata.push(("general.file_type".into(), MetaValue::U32(file_type))),
    }
    let out_dtype = |info: &GgufTensorInfo| {
        if info.shape.len() == 1 {
            FloatType::F32
        } else {
            dtype
        }
    };
    let headers: Vec<TensorHeader<'_>> = src
        .tensor_infos()
        .iter()
        .map(|info| {
            let t = out_dtype(info);
            TensorHeader {
                name: &info.name,
                shape: &info.shape,
                format: WeightFormat::float(t),
                n_bytes: info.numel() * t.size(),
            }
        })
        .collect();
    write_streaming(output, &metadata, &headers, |i, w| {
        let info = &src.tensor_infos()[i];
        let tensor = src
            .load(info)
            .and_then(|t| t.into_dtype(out_dtype(info)))
            .map_err(in_input)?;
        write_tensor_bytes(&tensor, w, output)
    })
}
