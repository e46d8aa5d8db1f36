//! GGUF files built byte by byte: every malformed header, metadata value, tensor entry and
//! data range the reader must refuse with a typed error naming what is wrong, never a panic.

use qkv::weights::gguf::{GgmlType, GgufFile};
use qkv::weights::TensorSource;
use qkv::Error;
use std::path::Path;

mod common;
use common::temp_dir;

fn open_bytes(tag: &str, bytes: &[u8]) -> qkv::Result<GgufFile> {
    let dir = temp_dir(tag);
    let p = dir.join("f.gguf");
    std::fs::write(&p, bytes).unwrap();
    let r = GgufFile::open(&p);
    std::fs::remove_dir_all(&dir).ok();
    r
}

#[track_caller]
fn expect_format_error(tag: &str, bytes: &[u8], needle: &str) {
    match open_bytes(tag, bytes) {
        Err(Error::Format { msg, .. }) => {
            assert!(
                msg.contains(needle),
                "{tag}: message {msg:?} lacks {needle:?}"
            )
        }
        Err(e) => panic!("{tag}: wrong error kind {e:?}"),
        Ok(_) => panic!("{tag}: a bad file was accepted"),
    }
}

/// Opens `bytes` and expects [`Error::TensorPastEnd`] for `tensor`, `length` bytes at `offset`.
#[track_caller]
fn expect_past_end(tag: &str, bytes: &[u8], tensor: &str, offset: u64, length: u64) {
    match open_bytes(tag, bytes) {
        Err(Error::TensorPastEnd {
            path,
            tensor: t,
            offset: o,
            length: l,
            file_size,
        }) => {
            assert!(path.ends_with("f.gguf"), "{tag}: {path:?}");
            assert_eq!((t.as_str(), o, l), (tensor, offset, length), "{tag}");
            assert_eq!(file_size, bytes.len() as u64, "{tag}");
        }
        Err(e) => panic!("{tag}: wrong error kind {e:?}"),
        Ok(_) => panic!("{tag}: a bad file was accepted"),
    }
}

/// Builds GGUF bytes by hand.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, tensors: u64, kvs: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(tensors).u64(kvs);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Raw {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Raw {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Raw {
        self.u64(s.len() as u64);
        self.0.extend(s.as_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Raw {
        self.0.extend(b);
        self
    }
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut Raw {
        self.str(k).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, off: u64) -> &mut Raw {
        self.str(name).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(off)
    }
    fn pad_and_data(&mut self, n: usize) -> Vec<u8> {
        while !self.0.len().is_multiple_of(32) {
            self.0.push(0);
        }
        let mut v = self.0.clone();
        v.resize(v.len() + n, 0);
        v
    }
}

#[test]
fn hostile_headers_and_metadata_are_errors_not_panics() {
    // Sanity: the hand builder makes valid files.
    let ok = Raw::header(3, 1, 1)
        .kv_u32("k", 1)
        .tensor("t", &[8], 0, 0)
        .pad_and_data(32);
    assert!(open_bytes("ok", &ok).is_ok());
    let ok2 = Raw::header(2, 1, 0)
        .tensor("t", &[32, 2], 2, 0)
        .pad_and_data(36);
    let f = open_bytes("ok2", &ok2).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensor_infos()[0].ggml_type, GgmlType::Q4_0);

    expect_format_error("empty", b"", "truncated");
    expect_format_error("magic", b"GGML\x03\0\0\0", "not a GGUF");
    expect_format_error("v1", &Raw::header(1, 0, 0).0, "version 1");
    expect_format_error("v0", &Raw::header(0, 0, 0).0, "version 0");
    expect_format_error("v4", &Raw::header(4, 0, 0).0, "version 4");
    expect_format_error("big-endian", &Raw::header(3 << 24, 0, 0).0, "big-endian");
    expect_format_error(
        "kv count",
        &Raw::header(3, 0, u64::MAX).0,
        "metadata entries",
    );
    expect_format_error(
        "tensor count",
        &Raw::header(3, u64::MAX, 0).0,
        "tensor infos",
    );
    expect_format_error(
        "tensor count 2",
        &Raw::header(3, 1 << 40, 0).0,
        "tensor infos",
    );
    expect_format_error(
        "key length",
        &Raw::header(3, 0, 1).u64(u64::MAX).bytes(&[0; 16]).0,
        "past the end",
    );
    expect_format_error(
        "key length 2",
        &Raw::header(3, 0, 1).u64(1 << 40).bytes(&[b'a'; 16]).0,
        "past the end",
    );
    expect_format_error(
        "value type",
        &Raw::header(3, 0, 1).str("k").u32(13).u32(0).0,
        "unknown value type 13",
    );
    expect_format_error(
        "string value length",
        &Raw::header(3, 0, 1).str("k").u32(8).u64(1 << 50).0,
        "`k`",
    );
    expect_format_error(
        "array count",
        &Raw::header(3, 0, 1)
            .str("k")
            .u32(9)
            .u32(0)
            .u64(u64::MAX >> 1)
            .0,
        "cannot fit",
    );
    expect_format_error(
        "array elem type",
        &Raw::header(3, 0, 1).str("k").u32(9).u32(99).u64(1).0,
        "unknown array element type 99",
    );
    expect_format_error(
        "bool",
        &Raw::header(3, 0, 1).str("k").u32(7).bytes(&[2]).0,
        "bool",
    );
    let mut deep = Raw::header(3, 0, 1);
    deep.str("deep");
    deep.u32(9);
    for _ in 0..100 {
        deep.u32(9).u64(1);
    }
    deep.u32(0).u64(0);
    expect_format_error("deep nesting", &deep.0, "nested");
    expect_format_error(
        "utf8",
        &Raw::header(3, 0, 1)
            .u64(2)
            .bytes(&[0xFF, 0xFE])
            .u32(4)
            .u32(0)
            .0,
        "UTF-8",
    );
    expect_format_error(
        "dup key",
        &Raw::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).0,
        "appears twice",
    );
    expect_format_error(
        "alignment 0",
        &Raw::header(3, 0, 1).kv_u32("general.alignment", 0).0,
        "alignment",
    );
    expect_format_error(
        "alignment 3",
        &Raw::header(3, 0, 1).kv_u32("general.alignment", 3).0,
        "alignment",
    );
}

#[test]
fn hostile_tensor_infos_are_errors_not_panics() {
    expect_format_error(
        "n_dims 0",
        &Raw::header(3, 1, 0).tensor("t", &[], 0, 0).pad_and_data(32),
        "dimensions",
    );
    expect_format_error(
        "n_dims 5",
        &Raw::header(3, 1, 0)
            .tensor("t", &[1; 5], 0, 0)
            .pad_and_data(32),
        "dimensions",
    );
    expect_format_error(
        "dims overflow",
        &Raw::header(3, 1, 0)
            .tensor("t", &[1 << 62, 1 << 62], 0, 0)
            .pad_and_data(32),
        "overflow",
    );
    expect_format_error(
        "dim absurd",
        &Raw::header(3, 1, 0)
            .tensor("t", &[u64::MAX], 0, 0)
            .pad_and_data(32),
        "absurd",
    );
    expect_format_error(
        "bytes overflow",
        &Raw::header(3, 1, 0)
            .tensor("t", &[1 << 31, 1 << 31, 1 << 3], 0, 0)
            .pad_and_data(32),
        "overflow",
    );
    expect_format_error(
        "ggml type removed",
        &Raw::header(3, 1, 0)
            .tensor("t", &[8], 4, 0)
            .pad_and_data(32),
        "unknown ggml type 4",
    );
    expect_format_error(
        "ggml type unknown",
        &Raw::header(3, 1, 0)
            .tensor("t", &[8], 1000, 0)
            .pad_and_data(32),
        "unknown ggml type 1000",
    );
    expect_format_error(
        "block multiple",
        &Raw::header(3, 1, 0)
            .tensor("t", &[16], 2, 0)
            .pad_and_data(32),
        "block size",
    );
    // A tensor past the end of the file: its own error, with the numbers as fields.
    let raw = Raw::header(3, 1, 0)
        .tensor("t", &[8], 0, 0)
        .pad_and_data(31);
    let data_start = raw.len() as u64 - 31;
    expect_past_end("data past end", &raw, "t", data_start, 32);
    expect_past_end(
        "offset past end",
        &Raw::header(3, 1, 0)
            .tensor("t", &[8], 0, u64::MAX - 31)
            .pad_and_data(32),
        "t",
        u64::MAX,
        32,
    );
    expect_format_error(
        "offset unaligned",
        &Raw::header(3, 1, 0)
            .tensor("t", &[1], 0, 4)
            .pad_and_data(64),
        "alignment",
    );
    expect_format_error(
        "dup tensor",
        &Raw::header(3, 2, 0)
            .tensor("t", &[8], 0, 0)
            .tensor("t", &[8], 0, 32)
            .pad_and_data(64),
        "appears twice",
    );
}

#[test]
fn tensor_types_load_in_place_or_are_named_errors() {
    // A tensor of a type qkv parses but cannot load is a typed error at load, naming it.
    for (code, ty, block, bytes) in [
        (9u32, "Q8_1", 32u64, 36usize),
        (15, "Q8_K", 256, 292),
        (39, "MXFP4", 32, 17),
    ] {
        let raw = Raw::header(3, 1, 0)
            .tensor("w", &[block], code, 0)
            .pad_and_data(bytes.next_multiple_of(32));
        let f = open_bytes("unsupported", &raw).unwrap();
        match f.tensor("w") {
            Err(Error::UnsupportedDType { name, dtype }) => {
                assert_eq!(name, "w");
                assert!(dtype.contains(ty), "{dtype}");
            }
            other => panic!("{ty}: {other:?}"),
        }
    }
    // The low-bit K, IQ and TQ types load, in place, as their kernels' formats.
    for (code, ty, elems, bytes) in [
        (10u32, "Q2_K", 256u64, 84usize),
        (11, "Q3_K", 256, 110),
        (20, "IQ4_NL", 32, 18),
        (23, "IQ4_XS", 256, 136),
        (16, "IQ2_XXS", 256, 66),
        (17, "IQ2_XS", 256, 74),
        (22, "IQ2_S", 256, 82),
        (18, "IQ3_XXS", 256, 98),
        (21, "IQ3_S", 256, 110),
        (19, "IQ1_S", 256, 50),
        (29, "IQ1_M", 256, 56),
        (34, "TQ1_0", 256, 54),
        (35, "TQ2_0", 256, 66),
    ] {
        let raw = Raw::header(3, 1, 0)
            .tensor("w", &[elems], code, 0)
            .pad_and_data(bytes.next_multiple_of(32));
        let f = open_bytes(ty, &raw).unwrap();
        if let Err(e) = f.tensor("w") {
            panic!("{ty}: {e}");
        }
    }
    // Quantized rows must be whole blocks.
    expect_format_error(
        "partial block",
        &Raw::header(3, 1, 0)
            .tensor("w", &[48, 2], 8, 0)
            .pad_and_data(128),
        "block size",
    );
    // Blocks past the end of the file.
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[256, 4], 14, 0)
        .pad_and_data(210);
    let data_start = raw.len() as u64 - 210;
    expect_past_end("blocks past the end", &raw, "w", data_start, 4 * 210);
    // Not a file at all.
    assert!(matches!(
        GgufFile::open(Path::new("/nonexistent/x.gguf")),
        Err(Error::Io { .. })
    ));
}

#[test]
fn overlapping_tensors_are_errors() {
    // Disjoint tensors are fine in any order, and an empty tensor overlaps nothing.
    let ok = Raw::header(3, 3, 0)
        .tensor("late", &[8], 0, 32)
        .tensor("early", &[8], 0, 0)
        .tensor("empty", &[0], 0, 0)
        .pad_and_data(64);
    let f = open_bytes("disjoint", &ok).unwrap();
    assert_eq!(f.tensor_infos().len(), 3);

    // Two tensors at the same offset.
    let same = Raw::header(3, 2, 0)
        .tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 0)
        .pad_and_data(32);
    expect_format_error("same offset", &same, "overlap");
    expect_format_error("same offset names a", &same, "`a`");
    expect_format_error("same offset names b", &same, "`b`");
    // One running into the next (64 bytes at 0, then 32 at 32), listed out of order.
    let partial = Raw::header(3, 2, 0)
        .tensor("second", &[8], 0, 32)
        .tensor("first", &[16], 0, 0)
        .pad_and_data(64);
    match open_bytes("partial overlap", &partial) {
        Err(Error::Format { msg, .. }) => {
            for needle in [
                "`first`",
                "`second`",
                "64 bytes at data offset 0",
                "offset 32",
            ] {
                assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
            }
        }
        other => panic!("{other:?}"),
    }
    // One inside another.
    expect_format_error(
        "nested",
        &Raw::header(3, 2, 0)
            .tensor("outer", &[32], 0, 0)
            .tensor("inner", &[8], 0, 32)
            .pad_and_data(128),
        "overlap",
    );

    // The audit's file: 200 [1024, 1024] F16 matrices (2 MiB each) all at data offset 0 of a
    // ~2 MiB file would load or convert as 400 MiB; it is rejected when opened.
    let mut many = Raw::header(3, 200, 0);
    for i in 0..200 {
        many.tensor(&format!("blk.{i}.w"), &[1024, 1024], 1, 0);
    }
    let bytes = many.pad_and_data(1024 * 1024 * 2);
    expect_format_error("200 at offset 0", &bytes, "`blk.0.w`");
    expect_format_error("200 at offset 0 (2)", &bytes, "`blk.1.w`");
}

/// A header whose metadata arrays add up to more values than the reader accepts fails fast,
/// before anything is allocated for them.
#[test]
fn metadata_value_limit() {
    use qkv::weights::gguf::MAX_METADATA_VALUES;
    let max = MAX_METADATA_VALUES as u64;

    // Top-level entries and array elements share one budget: after two entries and a
    // 10-element array, a u8 array of `max - 9` elements is one value too many.
    let mut r = Raw::header(3, 0, 2);
    r.str("a").u32(9).u32(0).u64(10).bytes(&[7; 10]);
    r.str("b").u32(9).u32(0).u64(max - 9);
    let mut bytes = std::mem::take(&mut r.0);
    bytes.resize(bytes.len() + (max - 9) as usize, 0);
    let start = std::time::Instant::now();
    match open_bytes("value limit", &bytes) {
        Err(Error::Format { msg, .. }) => {
            let count = (max - 9).to_string();
            for needle in ["`b`", &count, &max.to_string(), "12 already used"] {
                assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
            }
        }
        Err(e) => panic!("wrong error kind {e:?}"),
        Ok(_) => panic!("{max} u8 values were accepted"),
    }
    let took = start.elapsed();
    assert!(took.as_secs() < 5, "took {took:?}");
    drop(bytes);

    // Nested arrays count every element at every level: an array of arrays whose inner
    // counts add past the limit is refused at the first inner array that crosses it.
    let mut nested = Raw::header(3, 0, 1);
    nested.str("n").u32(9).u32(9).u64(2);
    nested.u32(0).u64(3).bytes(&[1, 2, 3]);
    nested.u32(0).u64(max);
    let mut bytes = std::mem::take(&mut nested.0);
    bytes.resize(bytes.len() + max as usize, 0);
    match open_bytes("nested limit", &bytes) {
        Err(Error::Format { msg, .. }) => {
            assert!(
                msg.contains("`n`") && msg.contains("6 already used"),
                "{msg}"
            )
        }
        other => panic!("{other:?}"),
    }
}
