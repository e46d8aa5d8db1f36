//! llama.cpp's GGUF format (versions 2 and 3, little endian): reading, writing, converting.
//!
//! A GGUF file is a header (`GGUF`, version, tensor count, metadata count), typed metadata
//! key/value pairs, tensor infos (name, dimensions, ggml type, offset), padding to
//! `general.alignment` (32 by default), then the tensor data section.
//!
//! [`GgufFile::open`] maps the file and parses everything but the tensor data. Every read is
//! bounds-checked against the map: a truncated or hostile file (huge counts, lengths past the
//! end, overflowing dimensions, unknown types, data past the end, duplicate names) gives
//! [`Error::Format`] saying what is wrong; counts never drive an allocation larger than what
//! the remaining bytes could hold. Tensors must not overlap, so the tensor data qkv loads or
//! converts is never larger than the file. A header holds at most [`MAX_METADATA_VALUES`]
//! metadata values (top-level entries plus array elements at every nesting level): each
//! parsed value costs a [`MetaValue`] (32 bytes) however few bytes it takes on disk, so this
//! bounds the metadata's memory whatever the file claims.
//!
//! As a [`TensorSource`], F32 and F16 tensors are zero-copy views of the map, and so are the
//! quantized formats qkv's kernels run in place (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
//! Q6_K: [`qkv_kernels::QuantFormat`]); BF16 is widened once, at load, to f32; other types
//! (IQ*, Q2_K, Q3_K, …) give [`Error::UnsupportedDType`] naming the tensor and its type.
//!
//! [`write_gguf`] writes version 3 files with f32/f16 tensors, and [`convert`] turns any
//! readable GGUF into such a file (what `decode convert` runs).
//!
//! Dimensions: GGUF lists them innermost first (`ne0, ne1, …`); qkv shapes are outermost first,
//! so a GGUF tensor with `ne = [576, 49152]` has the qkv shape `[49152, 576]`.
//!
//! ```
//! use qkv::weights::gguf::{write_gguf, GgufFile, MetaValue};
//! use qkv::weights::{TensorSource, WeightFormat};
//!
//! let dir = std::env::temp_dir().join(format!("qkv-gguf-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("tiny.gguf");
//! let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
//!     .iter()
//!     .flat_map(|v| v.to_le_bytes())
//!     .collect();
//! write_gguf(
//!     &path,
//!     &[("general.architecture".to_string(), MetaValue::String("llama".into()))],
//!     &[("w".to_string(), vec![2, 3], WeightFormat::F32, &data[..])],
//! )?;
//!
//! let file = GgufFile::open(&path)?;
//! assert_eq!(file.get_str("general.architecture")?, "llama");
//! let w = file.tensor("w")?;
//! assert_eq!(w.shape(), &[2, 3]);
//! assert!(w.is_mapped());
//! assert_eq!(w.as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::{map_file, FloatType, Tensor, TensorSource, WeightFormat};
use crate::error::{Error, Result};
use memmap2::Mmap;
use qkv_kernels::QuantFormat;
use std::collections::HashMap;
use std::fmt;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The version [`write_gguf`] writes.
pub const GGUF_VERSION: u32 = 3;
/// Alignment of the data section and of every tensor in it, unless `general.alignment` says
/// otherwise.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// Nesting limit for arrays of arrays (a hostile file could otherwise exhaust the stack).
const MAX_ARRAY_DEPTH: usize = 16;
/// The most metadata values [`GgufFile::open`] accepts in one header: top-level entries plus
/// the elements of every array, nested ones included (2^24, about 16.8 million).
///
/// A parsed value takes `size_of::<MetaValue>()` (32) bytes even when it took one byte in the
/// file, so without a cap a 64 MiB `u8` array would cost 2 GiB; with it, the values take at
/// most 512 MiB (plus the contents of their strings, no more than the bytes those take in the
/// file). Real headers hold far fewer: a 262,144-token vocabulary with scores, token types
/// and merges is about a million values.
pub const MAX_METADATA_VALUES: usize = 1 << 24;
/// GGML tensors have at most four dimensions.
const MAX_DIMS: usize = 4;

/// The type tag of a metadata value, with its GGUF code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaValueType {
    /// `uint8` (0).
    U8,
    /// `int8` (1).
    I8,
    /// `uint16` (2).
    U16,
    /// `int16` (3).
    I16,
    /// `uint32` (4).
    U32,
    /// `int32` (5).
    I32,
    /// `float32` (6).
    F32,
    /// `bool` (7), one byte 0 or 1.
    Bool,
    /// `string` (8): u64 length, then UTF-8 bytes.
    String,
    /// `array` (9): element type, u64 count, elements.
    Array,
    /// `uint64` (10).
    U64,
    /// `int64` (11).
    I64,
    /// `float64` (12).
    F64,
}

impl MetaValueType {
    /// The type for a GGUF code, if there is one.
    pub fn from_code(code: u32) -> Option<MetaValueType> {
        use MetaValueType::*;
        Some(match code {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The GGUF code of this type.
    pub fn code(self) -> u32 {
        use MetaValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// The fewest bytes one value of this type occupies in a file.
    fn min_size(self) -> usize {
        use MetaValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    fn describe(self) -> &'static str {
        use MetaValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for MetaValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float32`.
    F32(f32),
    /// `float64`.
    F64(f64),
    /// `bool`.
    Bool(bool),
    /// `string` (UTF-8).
    String(String),
    /// `array`: the element type (kept so that an empty array round-trips) and the elements,
    /// each of that type. Arrays may nest.
    Array(MetaValueType, Vec<MetaValue>),
}

impl MetaValue {
    /// This value's type tag.
    pub fn value_type(&self) -> MetaValueType {
        match self {
            MetaValue::U8(_) => MetaValueType::U8,
            MetaValue::I8(_) => MetaValueType::I8,
            MetaValue::U16(_) => MetaValueType::U16,
            MetaValue::I16(_) => MetaValueType::I16,
            MetaValue::U32(_) => MetaValueType::U32,
            MetaValue::I32(_) => MetaValueType::I32,
            MetaValue::U64(_) => MetaValueType::U64,
            MetaValue::I64(_) => MetaValueType::I64,
            MetaValue::F32(_) => MetaValueType::F32,
            MetaValue::F64(_) => MetaValueType::F64,
            MetaValue::Bool(_) => MetaValueType::Bool,
            MetaValue::String(_) => MetaValueType::String,
            MetaValue::Array(..) => MetaValueType::Array,
        }
    }

    /// The value as an i128 when it is an integer of any width (an exact, lossless view).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as u32 when it is an integer (of any width) in u32's range.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_integer().and_then(|v| u32::try_from(v).ok())
    }

    /// The value as u64 when it is an integer (of any width) in u64's range.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_integer().and_then(|v| u64::try_from(v).ok())
    }

    /// The value as i32 when it is an integer (of any width) in i32's range.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_integer().and_then(|v| i32::try_from(v).ok())
    }

    /// The value as f32 when it is a float (f64 is rounded to f32).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements when the value is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, v) => Some(v),
            _ => None,
        }
    }

    /// A short description for error messages (`u32`, `array of string`, …).
    fn describe(&self) -> String {
        match self {
            MetaValue::Array(t, _) => format!("array of {t}"),
            other => other.value_type().to_string(),
        }
    }
}

/// The storage type of a GGUF tensor (ggml's `ggml_type`), with its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types, missing_docs)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

impl GgmlType {
    /// The type for a ggml code, if it is one this reader knows (codes of types ggml removed,
    /// such as 4, 5 and 31–33, are unknown).
    pub fn from_code(code: u32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match code {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            _ => return None,
        })
    }

    /// The ggml code of this type.
    pub fn code(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1_M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
            MXFP4 => 39,
        }
    }

    /// Elements per block and bytes per block (`(1, size)` for plain element types).
    pub fn block_layout(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 => (1, 2),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 40),
            Q2_K => (256, 84),
            Q3_K => (256, 110),
            Q4_K => (256, 144),
            Q5_K => (256, 176),
            Q6_K => (256, 210),
            Q8_K => (256, 292),
            IQ2_XXS => (256, 66),
            IQ2_XS => (256, 74),
            IQ3_XXS => (256, 98),
            IQ1_S => (256, 50),
            IQ4_NL => (32, 18),
            IQ3_S => (256, 110),
            IQ2_S => (256, 82),
            IQ4_XS => (256, 136),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 => (1, 8),
            F64 => (1, 8),
            IQ1_M => (256, 56),
            BF16 => (1, 2),
            TQ1_0 => (256, 54),
            TQ2_0 => (256, 66),
            MXFP4 => (32, 17),
        }
    }

    /// True for the types qkv can load (F32, F16 and the quantized formats mapped; BF16
    /// converted).
    pub fn is_loadable(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
            || self.quant_format().is_some()
    }

    /// The kernels' format for the quantized types qkv runs in place.
    pub fn quant_format(self) -> Option<QuantFormat> {
        Some(match self {
            GgmlType::Q8_0 => QuantFormat::Q8_0,
            GgmlType::Q4_0 => QuantFormat::Q4_0,
            GgmlType::Q4_1 => QuantFormat::Q4_1,
            GgmlType::Q5_0 => QuantFormat::Q5_0,
            GgmlType::Q5_1 => QuantFormat::Q5_1,
            GgmlType::Q4_K => QuantFormat::Q4_K,
            GgmlType::Q5_K => QuantFormat::Q5_K,
            GgmlType::Q6_K => QuantFormat::Q6_K,
            _ => return None,
        })
    }
}

impl fmt::Display for MetaValue {
    /// Numbers and booleans as written, strings quoted and escaped, arrays in brackets (the
    /// first 8 elements, then the count): short enough for an error message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaValue::F32(x) => write!(f, "{x}"),
            MetaValue::F64(x) => write!(f, "{x}"),
            MetaValue::Bool(b) => write!(f, "{b}"),
            MetaValue::String(s) => write!(f, "{s:?}"),
            MetaValue::Array(_, items) => {
                write!(f, "[")?;
                for (i, v) in items.iter().take(8).enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{v}")?;
                }
                if items.len() > 8 {
                    write!(f, ", … {} items", items.len())?;
                }
                write!(f, "]")
            }
            other => write!(f, "{}", other.as_integer().unwrap_or_default()),
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl From<WeightFormat> for GgmlType {
    fn from(t: WeightFormat) -> GgmlType {
        match t {
            WeightFormat::F32 => GgmlType::F32,
            WeightFormat::F16 => GgmlType::F16,
            WeightFormat::Quant(q) => match q {
                QuantFormat::Q8_0 => GgmlType::Q8_0,
                QuantFormat::Q4_0 => GgmlType::Q4_0,
                QuantFormat::Q4_1 => GgmlType::Q4_1,
                QuantFormat::Q5_0 => GgmlType::Q5_0,
                QuantFormat::Q5_1 => GgmlType::Q5_1,
                QuantFormat::Q4_K => GgmlType::Q4_K,
                QuantFormat::Q5_K => GgmlType::Q5_K,
                QuantFormat::Q6_K => GgmlType::Q6_K,
            },
        }
    }
}

/// One tensor's entry in the file's tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// Its name (e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// Its shape in qkv order, outermost dimension first (the reverse of GGUF's `ne`).
    pub shape: Vec<usize>,
    /// Its storage type.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of its data in the file (data section start + the stored
    /// relative offset).
    pub offset: usize,
    /// Size of its data in bytes.
    pub n_bytes: usize,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: Arc<Mmap>,
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

fn align_up(x: usize, align: usize) -> Option<usize> {
    x.checked_add(align - 1).map(|v| v / align * align)
}

impl GgufFile {
    /// Maps and parses the GGUF file at `path` (v2 or v3). Tensor data is not read until a
    /// tensor is requested.
    ///
    /// Errors: [`Error::Io`] when the file cannot be opened or mapped, [`Error::Format`] when it
    /// is not a valid GGUF file (the message says what is wrong and where).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let map = map_file(path)?;
        Self::parse(path, map)
    }

    fn parse(path: &Path, map: Arc<Mmap>) -> Result<GgufFile> {
        let bytes: &[u8] = &map;
        let mut c = Cursor {
            bytes,
            pos: 0,
            path,
            values_left: MAX_METADATA_VALUES,
        };
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

        // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes.
        if kv_count > c.remaining() / 13 {
            return Err(c.err(format!(
                "{kv_count} metadata entries cannot fit in a {}-byte file",
                bytes.len()
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

        let alignment = match meta_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => match metadata[i].1.as_u32() {
                Some(a) if a.is_power_of_two() => a as usize,
                _ => {
                    return Err(c.err(format!(
                        "general.alignment is {:?}; it must be a power of two",
                        metadata[i].1
                    )))
                }
            },
        };

        // Each tensor info takes at least 8 (name length) + 4 + 8 + 4 + 8 bytes.
        if tensor_count > c.remaining() / 32 {
            return Err(c.err(format!(
                "{tensor_count} tensor infos cannot fit in a {}-byte file",
                bytes.len()
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

        let data_offset =
            align_up(c.pos, alignment).ok_or_else(|| c.err("data section offset overflows"))?;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, ne, ggml_type, rel) in raw {
            let (block, block_bytes) = ggml_type.block_layout();
            let numel = ne.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let numel = numel
                .ok_or_else(|| c.err(format!("tensor `{name}`: dimensions {ne:?} overflow")))?;
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
            let (offset, _) = match (offset, end) {
                (Some(o), Some(e)) if e <= bytes.len() => (o, e),
                _ => {
                    return Err(c.err(format!(
                        "tensor `{name}` ({ggml_type}, {n_bytes} bytes at data offset {rel}) \
                         runs past the end of the file ({} bytes; data section at {data_offset})",
                        bytes.len()
                    )))
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

    fn load(&self, info: &GgufTensorInfo) -> Result<Tensor> {
        let shape = info.shape.clone();
        let name = info.name.as_str();
        match info.ggml_type {
            GgmlType::F32 => {
                Tensor::from_mapped(name, shape, self.map.clone(), info.offset, FloatType::F32)
            }
            GgmlType::F16 => {
                Tensor::from_mapped(name, shape, self.map.clone(), info.offset, FloatType::F16)
            }
            GgmlType::BF16 => {
                let src = &self.map[info.offset..info.offset + info.n_bytes];
                let mut out = crate::models::zeroed(info.numel(), || format!("tensor `{name}` in f32"))?;
                for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                    *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
                }
                Tensor::from_f32(name, shape, out)
            }
            other => match other.quant_format() {
                Some(format) => {
                    Tensor::from_mapped_quant(name, shape, self.map.clone(), info.offset, format)
                }
                None => Err(Error::UnsupportedDType {
                    name: name.to_owned(),
                    dtype: format!(
                        "GGUF {other} (qkv runs F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K)"
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

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

struct TensorHeader<'a> {
    name: &'a str,
    shape: &'a [usize],
    format: WeightFormat,
    n_bytes: usize,
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
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
fn write_streaming(
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
    let tmp = super::temp_sibling(path);

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
fn write_tensor_bytes(tensor: &Tensor, w: &mut dyn Write, path: &Path) -> Result<()> {
    let mut buf = Vec::with_capacity(1 << 16);
    match tensor.weights() {
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
        qkv_kernels::Weights::Quant(_, bytes) => w.write_all(bytes).map_err(io_err(path))?,
    }
    Ok(())
}

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
