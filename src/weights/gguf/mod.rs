//! llama.cpp's GGUF format (versions 2 and 3, little endian): reading, writing, converting.
//!
//! A GGUF file is a header (`GGUF`, version, tensor count, metadata count), typed metadata
//! key/value pairs, tensor infos (name, dimensions, ggml type, offset), padding to
//! `general.alignment` (32 by default), then the tensor data section.
//!
//! [`GgufFile::open`] maps the file and parses everything but the tensor data. Every read is
//! bounds-checked against the map: a truncated or hostile file (huge counts, lengths past the
//! end, overflowing dimensions, unknown types, duplicate names) gives [`Error::Format`] saying
//! what is wrong, and a tensor whose data runs past the end gives [`Error::TensorPastEnd`];
//! counts never drive an allocation larger than what the remaining bytes could hold. Tensors
//! must not overlap, so the tensor data qkv loads or converts is never larger than the file.
//! A header holds at most [`MAX_METADATA_VALUES`] metadata values (top-level entries plus
//! array elements at every nesting level): each parsed value costs a [`MetaValue`] (32 bytes)
//! however few bytes it takes on disk, so this bounds the metadata's memory whatever the file
//! claims.
//!
//! As a [`TensorSource`], F32, F16 and BF16 tensors are zero-copy views of the map, and so
//! are the quantized formats qkv's kernels run in place (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS,
//! TQ1_0, TQ2_0: [`qkv_kernels::QuantFormat`]); other types (Q8_1, Q8_K, MXFP4, the integer types, …) give [`Error::UnsupportedDType`] naming
//! the tensor and its type.
//!
//! [`write_gguf`] writes version 3 files with f32/f16/bf16 tensors (and quantized blocks), and [`convert`] turns any
//! readable GGUF into such a file (what `decode convert` runs).
//!
//! The code is split along the format's seams: the format's types here, then `reader`
//! ([`GgufFile`]), `writer` ([`write_gguf`]) and `convert` ([`convert()`]).
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

mod convert;
mod reader;
mod writer;

pub use convert::convert;
pub use reader::GgufFile;
pub use writer::write_gguf;

#[cfg(doc)]
use super::TensorSource;
use super::WeightFormat;
#[cfg(doc)]
use crate::error::Error;
use qkv_kernels::QuantFormat;
use std::fmt;

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
    pub(crate) fn min_size(self) -> usize {
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
    pub(crate) fn describe(&self) -> String {
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

    /// True for the types qkv can load (F32, F16, BF16 and the quantized formats, all
    /// mapped).
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
            GgmlType::Q2_K => QuantFormat::Q2_K,
            GgmlType::Q3_K => QuantFormat::Q3_K,
            GgmlType::IQ4_NL => QuantFormat::IQ4_NL,
            GgmlType::IQ4_XS => QuantFormat::IQ4_XS,
            GgmlType::IQ2_XXS => QuantFormat::IQ2_XXS,
            GgmlType::IQ2_XS => QuantFormat::IQ2_XS,
            GgmlType::IQ2_S => QuantFormat::IQ2_S,
            GgmlType::IQ3_XXS => QuantFormat::IQ3_XXS,
            GgmlType::IQ3_S => QuantFormat::IQ3_S,
            GgmlType::IQ1_S => QuantFormat::IQ1_S,
            GgmlType::IQ1_M => QuantFormat::IQ1_M,
            GgmlType::TQ1_0 => QuantFormat::TQ1_0,
            GgmlType::TQ2_0 => QuantFormat::TQ2_0,
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
            WeightFormat::BF16 => GgmlType::BF16,
            WeightFormat::Quant(q) => match q {
                QuantFormat::Q8_0 => GgmlType::Q8_0,
                QuantFormat::Q4_0 => GgmlType::Q4_0,
                QuantFormat::Q4_1 => GgmlType::Q4_1,
                QuantFormat::Q5_0 => GgmlType::Q5_0,
                QuantFormat::Q5_1 => GgmlType::Q5_1,
                QuantFormat::Q4_K => GgmlType::Q4_K,
                QuantFormat::Q5_K => GgmlType::Q5_K,
                QuantFormat::Q6_K => GgmlType::Q6_K,
                QuantFormat::Q2_K => GgmlType::Q2_K,
                QuantFormat::Q3_K => GgmlType::Q3_K,
                QuantFormat::IQ4_NL => GgmlType::IQ4_NL,
                QuantFormat::IQ4_XS => GgmlType::IQ4_XS,
                QuantFormat::IQ2_XXS => GgmlType::IQ2_XXS,
                QuantFormat::IQ2_XS => GgmlType::IQ2_XS,
                QuantFormat::IQ2_S => GgmlType::IQ2_S,
                QuantFormat::IQ3_XXS => GgmlType::IQ3_XXS,
                QuantFormat::IQ3_S => GgmlType::IQ3_S,
                QuantFormat::IQ1_S => GgmlType::IQ1_S,
                QuantFormat::IQ1_M => GgmlType::IQ1_M,
                QuantFormat::TQ1_0 => GgmlType::TQ1_0,
                QuantFormat::TQ2_0 => GgmlType::TQ2_0,
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

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
fn align_up(x: usize, align: usize) -> Option<usize> {
    x.checked_add(align - 1).map(|v| v / align * align)
}
