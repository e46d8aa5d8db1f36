//! Reading GGUF: [`GgufFile::open`] maps a file and parses its header, metadata and tensor
//! table, checking every read against the map; tensors are handed out as [`TensorSource`].

use super::{
    align_up, GgmlType, GgufTensorInfo, MetaValue, MetaValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC,
    MAX_ARRAY_DEPTH, MAX_DIMS, MAX_METADATA_VALUES,
};
use crate::error::{Error, Result};
use crate::weights::{map_file, FloatType, MappedFile, Tensor, TensorSource};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: Arc<MappedFile>,
    version: u32,
    alignment: usize,
    data_offset: usize,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// A bounds-checked little-endian reader over the map.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// How many more metadata values (entries and array elements) the header may hold; see
    /// [`MAX_METADATA_VALUES`].
    values_left: usize,
}

impl<'a> Cursor<'a> {
    fn err(&self, msg: impl Into<String>) -> Error {
        Error::Format {
            path: self.path.to_owned(),
            msg: msg.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: {} needs {n} bytes at offset {}, the file has {} left",
                what(),
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    /// A u64 count or length that must fit in usize.
    fn len(&mut self, what: &dyn Fn() -> String) -> Result<usize> {
        let v = self.u64(what)?;
        usize::try_from(v).map_err(|_| self.err(format!("{}: length {v} is absurd", what())))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let n = self.len(&|| format!("length of {}", what()))?;
        if n > self.remaining() {
            return Err(self.err(format!(
                "{} claims {n} bytes at offset {}, past the end of the file ({} bytes left)",
                what(),
                self.pos,
                self.remaining()
            )));
        }
        let start = self.pos;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.err(format!("{} at offset {start} is not valid UTF-8", what())))
    }

    fn value(&mut self, ty: MetaValueType, key: &str, depth: usize) -> Result<MetaValue> {
        let what = || format!("value of metadata key `{key}`");
        Ok(match ty {
            MetaValueType::U8 => MetaValue::U8(self.array::<1>(&what)?[0]),
            MetaValueType::I8 => MetaValue::I8(self.array::<1>(&what)?[0] as i8),
            MetaValueType::U16 => MetaValue::U16(u16::from_le_bytes(self.array(&what)?)),
            MetaValueType::I16 => MetaValue::I16(i16::from_le_bytes(self.array(&what)?)),
            MetaValueType::U32 => MetaValue::U32(u32::from_le_bytes(self.array(&what)?)),
            MetaValueType::I32 => MetaValue::I32(i32::from_le_bytes(self.array(&what)?)),
            MetaValueType::U64 => MetaValue::U64(u64::from_le_bytes(self.array(&what)?)),
            MetaValueType::I64 => MetaValue::I64(i64::from_le_bytes(self.array(&what)?)),
            MetaValueType::F32 => MetaValue::F32(f32::from_le_bytes(self.array(&what)?)),
            MetaValueType::F64 => MetaValue::F64(f64::from_le_bytes(self.array(&what)?)),
            MetaValueType::Bool => match self.array::<1>(&what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(self.err(format!(
                        "metadata key `{key}`: bool byte {b} at offset {} is neither 0 nor 1",
                        self.pos - 1
                    )))
                }
            },
            MetaValueType::String => MetaValue::String(self.string(&what)?),
            MetaValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!(
                        "metadata key `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    )));
                }
                let code = self.u32(&|| format!("array element type of metadata key `{key}`"))?;
                let elem = MetaValueType::from_code(code).ok_or_else(|| {
                    self.err(format!(
                        "metadata key `{key}`: unknown array element type {code}"
                    ))
                })?;
                let count = self.len(&|| format!("array length of metadata key `{key}`"))?;
                let max = self.remaining() / elem.min_size();
                if count > max {
                    return Err(self.err(format!(
                        "metadata key `{key}`: array of {count} {elem} elements cannot fit in \
                         the {} bytes left in the file",
                        self.remaining()
                    )));
                }
                if count > self.values_left {
                    return Err(self.err(format!(
                        "metadata key `{key}`: array of {count} {elem} elements would take \
                         the header past the limit of {MAX_METADATA_VALUES} metadata values \
                         ({} already used)",
                        MAX_METADATA_VALUES - self.values_left
                    )));
                }
                self.values_left -= count;
                let mut values = Vec::with_capacity(count);
                for _ in 0..count {
                    values.push(self.value(elem, key, depth + 1)?);
                }
                MetaValue::Array(elem, values)
            }
        })
    }
}

/// Checks that no two tensors' data ranges overlap (empty tensors overlap nothing), so that
/// the tensors' bytes add up to at most the file's size. Otherwise says which two tensors
/// overlap and where they lie in the data section (which starts at byte `data_offset`).
fn check_no_overlap(
    tensors: &[GgufTensorInfo],
    data_offset: usize,
) -> std::result::Result<(), String> {
    let mut order: Vec<&GgufTensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    // Sorted by start, the ranges are disjoint exactly when each one starts at or after the
    // end of the one before it.
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // Both ends were checked to lie inside the file, so neither sum overflows.
        if b.offset < a.offset + a.n_bytes {
            return Err(format!(
                "tensors `{}` ({}, {} bytes at data offset {}) and `{}` ({}, {} bytes at data \
                 offset {}) overlap",
                a.name,
                a.ggml_type,
                a.n_bytes,
                a.offset - data_offset,
                b.name,
                b.ggml_type,
                b.n_bytes,
                b.offset - data_offset,
            ));
        }
    }
    Ok(())
}

/// A tensor info as the header gives it: name, dimensions (innermost first), type and
/// offset from the data section.
type RawInfo = (String, Vec<usize>, GgmlType, u64);

/// The metadata entries in file order, and their index by key.
type Metadata = (Vec<(String, MetaValue)>, HashMap<String, usize>);

/// The magic, the version (2 or 3) and the tensor and metadata counts.
fn read_preamble(c: &mut Cursor<'_>) -> Result<(u32, usize, usize)> {
    let magic = c.array::<4>(&|| "the magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(c.err(format!(
            "not a GGUF file: it starts with {magic:02x?}, not \"GGUF\""
        )));
    }
    let version = c.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => return Err(c.err("GGUF version 1 is not supported (only 2 and 3)")),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(c.err("big-endian GGUF is not supported"))
        }
        v => return Err(c.err(format!("unknown GGUF version {v} (only 2 and 3)"))),
    }
    let tensor_count = c.len(&|| "the tensor count".into())?;
    let kv_count = c.len(&|| "the metadata count".into())?;
    Ok((version, tensor_count, kv_count))
}

/// The `kv_count` metadata entries, in file order, and their index by key.
fn read_metadata(c: &mut Cursor<'_>, kv_count: usize) -> Result<Metadata> {
    // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes.
    if kv_count > c.remaining() / 13 {
        return Err(c.err(format!(
            "{kv_count} metadata entries cannot fit in a {}-byte file",
            c.bytes.len()
        )));
    }
    if kv_count > c.values_left {
        return Err(c.err(format!(
            "{kv_count} metadata entries are more than the {MAX_METADATA_VALUES} metadata \
             values a header may hold"
        )));
    }
    c.values_left -= kv_count;
    let mut metadata = Vec::with_capacity(kv_count);
    let mut meta_index = HashMap::with_capacity(kv_count);
    for i in 0..kv_count {
        let key = c.string(&|| format!("key of metadata entry {i}"))?;
        let code = c.u32(&|| format!("type of metadata key `{key}`"))?;
        let ty = MetaValueType::from_code(code).ok_or_else(|| {
            c.err(format!(
                "metadata key `{key}` has unknown value type {code}"
            ))
        })?;
        let value = c.value(ty, &key, 0)?;
        if meta_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(c.err(format!("metadata key `{key}` appears twice")));
        }
        metadata.push((key, value));
    }
    Ok((metadata, meta_index))
}

/// `general.alignment`, a power of two, or the default.
fn alignment_of(
    c: &Cursor<'_>,
    metadata: &[(String, MetaValue)],
    meta_index: &HashMap<String, usize>,
) -> Result<usize> {
    match meta_index.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(&i) => match metadata[i].1.as_u32() {
            Some(a) if a.is_power_of_two() => Ok(a as usize),
            _ => Err(c.err(format!(
                "general.alignment is {:?}; it must be a power of two",
                metadata[i].1
            ))),
        },
    }
}

/// The `tensor_count` tensor infos, in file order, and their index by name.
fn read_tensor_infos(
    c: &mut Cursor<'_>,
    tensor_count: usize,
) -> Result<(Vec<RawInfo>, HashMap<String, usize>)> {
    // Each tensor info takes at least 8 (name length) + 4 + 8 + 4 + 8 bytes.
    if tensor_count > c.remaining() / 32 {
        return Err(c.err(format!(
            "{tensor_count} tensor infos cannot fit in a {}-byte file",
            c.bytes.len()
        )));
    }
    let mut raw = Vec::with_capacity(tensor_count);
    let mut tensor_index = HashMap::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let name = c.string(&|| format!("name of tensor {i}"))?;
        let n_dims = c.u32(&|| format!("dimension count of tensor `{name}`"))? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.err(format!(
                "tensor `{name}` has {n_dims} dimensions (GGUF allows 1 to {MAX_DIMS})"
            )));
        }
        let mut ne = Vec::with_capacity(n_dims);
        for d in 0..n_dims {
            let v = c.u64(&|| format!("dimension {d} of tensor `{name}`"))?;
            let v = usize::try_from(v).ok().filter(|&v| v <= i64::MAX as usize);
            ne.push(v.ok_or_else(|| {
                c.err(format!("tensor `{name}`: dimension {d} is absurdly large"))
            })?);
        }
        let code = c.u32(&|| format!("type of tensor `{name}`"))?;
        let ggml_type = GgmlType::from_code(code)
            .ok_or_else(|| c.err(format!("tensor `{name}` has unknown ggml type {code}")))?;
        let rel = c.u64(&|| format!("data offset of tensor `{name}`"))?;
        if tensor_index.insert(name.clone(), i).is_some() {
            return Err(c.err(format!("tensor `{name}` appears twice")));
        }
        raw.push((name, ne, ggml_type, rel));
    }
    Ok((raw, tensor_index))
}

/// Each tensor's place in the file: its size from its shape and type, its offset past the
/// header, both checked to lie inside the file.
fn place_tensors(
    c: &Cursor<'_>,
    raw: Vec<RawInfo>,
    data_offset: usize,
    alignment: usize,
) -> Result<Vec<GgufTensorInfo>> {
    let bytes = c.bytes;
    let mut tensors = Vec::with_capacity(raw.len());
    for (name, ne, ggml_type, rel) in raw {
        let (block, block_bytes) = ggml_type.block_layout();
        let numel = ne.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let numel =
            numel.ok_or_else(|| c.err(format!("tensor `{name}`: dimensions {ne:?} overflow")))?;
        if ne[0] % block != 0 {
            return Err(c.err(format!(
                "tensor `{name}` ({ggml_type}): innermost dimension {} is not a multiple \
                 of the block size {block}",
                ne[0]
            )));
        }
        let n_bytes = (numel / block)
            .checked_mul(block_bytes)
            .ok_or_else(|| c.err(format!("tensor `{name}`: byte size of {ne:?} overflows")))?;
        if rel % alignment as u64 != 0 {
            return Err(c.err(format!(
                "tensor `{name}`: data offset {rel} is not a multiple of the alignment \
                 {alignment}"
            )));
        }
        let offset = usize::try_from(rel)
            .ok()
            .and_then(|r| r.checked_add(data_offset));
        let end = offset.and_then(|o| o.checked_add(n_bytes));
        let offset = match (offset, end) {
            (Some(o), Some(e)) if e <= bytes.len() => o,
            _ => {
                return Err(Error::TensorPastEnd {
                    path: c.path.to_owned(),
                    tensor: name,
                    offset: rel.saturating_add(data_offset as u64),
                    length: n_bytes as u64,
                    file_size: bytes.len() as u64,
                })
            }
        };
        tensors.push(GgufTensorInfo {
            name,
            shape: ne.into_iter().rev().collect(),
            ggml_type,
            offset,
            n_bytes,
        });
    }
    Ok(tensors)
}

impl GgufFile {
    /// Maps and parses the GGUF file at `path` (v2 or v3). Tensor data is not read until a
    /// tensor is requested.
    ///
    /// Errors: [`Error::Io`] when the file cannot be opened or mapped,
    /// [`Error::TensorPastEnd`] when a tensor's data runs past the end of the file (naming the
    /// tensor, its offset and length, and the file's size), [`Error::Format`] when it is
    /// otherwise not a valid GGUF file (the message says what is wrong and where).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let map = map_file(path)?;
        Self::parse(path, map)
    }

    /// Reads the header of `map` as a list of named steps; each checks what it reads and
    /// errors naming what is wrong and where.
    fn parse(path: &Path, map: Arc<MappedFile>) -> Result<GgufFile> {
        let bytes: &[u8] = &map;
        let mut c = Cursor {
            bytes,
            pos: 0,
            path,
            values_left: MAX_METADATA_VALUES,
        };
        let (version, tensor_count, kv_count) = read_preamble(&mut c)?;
        let (metadata, meta_index) = read_metadata(&mut c, kv_count)?;
        let alignment = alignment_of(&c, &metadata, &meta_index)?;
        let (raw, tensor_index) = read_tensor_infos(&mut c, tensor_count)?;
        let data_offset =
            align_up(c.pos, alignment).ok_or_else(|| c.err("data section offset overflows"))?;
        let tensors = place_tensors(&c, raw, data_offset, alignment)?;
        check_no_overlap(&tensors, data_offset).map_err(|msg| c.err(msg))?;
        Ok(GgufFile {
            path: path.to_owned(),
            map,
            version,
            alignment,
            data_offset,
            metadata,
            meta_index,
            tensors,
            tensor_index,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The alignment of the data section and its tensors.
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// The byte offset of the data section.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The value of a metadata key.
    pub fn metadata(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All metadata keys, in file order.
    pub fn metadata_keys(&self) -> impl Iterator<Item = &str> {
        self.metadata.iter().map(|(k, _)| k.as_str())
    }

    /// All metadata entries, in file order.
    pub fn metadata_entries(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The tensor table, in file order.
    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The entry for tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw stored bytes of tensor `name` (in its ggml type).
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.tensor_info(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
        })?;
        Ok(&self.map[info.offset..info.offset + info.n_bytes])
    }

    fn format_err(&self, msg: String) -> Error {
        Error::Format {
            path: self.path.clone(),
            msg,
        }
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        get: impl FnOnce(&'a MetaValue) -> Option<T>,
    ) -> Result<T> {
        let value = self
            .metadata(key)
            .ok_or_else(|| self.format_err(format!("metadata key `{key}` is missing")))?;
        get(value).ok_or_else(|| {
            self.format_err(format!(
                "metadata key `{key}` is {} ({}), expected {expected}",
                value.describe(),
                short_debug(value)
            ))
        })
    }

    /// An integer key as u32 (any integer type whose value fits is accepted).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.typed(key, "an integer that fits in u32", MetaValue::as_u32)
    }

    /// An integer key as u64 (any non-negative integer type is accepted).
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.typed(key, "an integer that fits in u64", MetaValue::as_u64)
    }

    /// A float key as f32 (f64 is rounded).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.typed(key, "a float", MetaValue::as_f32)
    }

    /// A string key.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.typed(key, "a string", MetaValue::as_str)
    }

    /// A bool key.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.typed(key, "a bool", MetaValue::as_bool)
    }

    /// An array key.
    pub fn get_array(&self, key: &str) -> Result<&[MetaValue]> {
        self.typed(key, "an array", MetaValue::as_array)
    }

    /// An array-of-strings key.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.typed(key, "an array of strings", |v| {
            v.as_array()?.iter().map(MetaValue::as_str).collect()
        })
    }

    /// An array-of-floats key, as f32.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.typed(key, "an array of floats", |v| {
            v.as_array()?.iter().map(MetaValue::as_f32).collect()
        })
    }

    /// An array-of-integers key, as i32 (every element must fit).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.typed(key, "an array of integers that fit in i32", |v| {
            v.as_array()?.iter().map(MetaValue::as_i32).collect()
        })
    }

    pub(super) fn load(&self, info: &GgufTensorInfo) -> Result<Tensor> {
        let shape = info.shape.clone();
        let name = info.name.as_str();
        match info.ggml_type {
            GgmlType::F32 => {
                Tensor::from_mapped(name, shape, self.map.clone(), info.offset, FloatType::F32)
            }
            GgmlType::F16 => {
                Tensor::from_mapped(name, shape, self.map.clone(), info.offset, FloatType::F16)
            }
            GgmlType::BF16 => Tensor::from_mapped_bf16(name, shape, self.map.clone(), info.offset),
            other => match other.quant_format() {
                Some(format) => {
                    Tensor::from_mapped_quant(name, shape, self.map.clone(), info.offset, format)
                }
                None => Err(Error::UnsupportedDType {
                    name: name.to_owned(),
                    dtype: format!(
                        "GGUF {other} (qkv runs F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0 and TQ2_0)"
                    ),
                }),
            },
        }
    }
}

fn short_debug(v: &MetaValue) -> String {
    match v {
        MetaValue::Array(_, items) => format!("{} elements", items.len()),
        MetaValue::String(s) if s.len() > 40 => {
            let cut = (0..=40).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
            format!("{:?}…", &s[..cut])
        }
        other => format!("{other:?}"),
    }
}

impl TensorSource for GgufFile {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.tensor_info(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
        })?;
        self.load(info)
    }

    fn contains(&self, name: &str) -> bool {
        self.tensor_index.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.name.clone()).collect()
    }
}
