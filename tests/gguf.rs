//! GGUF reader, writer and converter: the real default model, hand-built and hostile files.

use qkv::weights::gguf::{convert, write_gguf, GgmlType, GgufFile, MetaValue, MetaValueType};
use qkv::weights::{FloatType, TensorSource, WeightFormat};
use qkv::Error;
use std::path::{Path, PathBuf};

mod common;
use common::default_gguf;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qkv-test-gguf-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn network_real_model_metadata() {
    let Some(path) = default_gguf() else { return };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(f.get_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(f.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(f.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(f.get_u32("llama.vocab_size").unwrap(), 49152);
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert!((f.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap() - 1e-5).abs() < 1e-9);
    assert!(!f.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(f.get_str_array("general.languages").unwrap(), vec!["en"]);
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[1], "<|im_start|>");
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );
    assert_eq!(
        f.get_str_array("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert!(f
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("<|im_start|>"));
    assert_eq!(f.metadata_keys().count(), 33);

    // Errors name the key.
    let e = f.get_u32("no.such.key").unwrap_err().to_string();
    assert!(e.contains("no.such.key"), "{e}");
    let e = f.get_u32("general.architecture").unwrap_err().to_string();
    assert!(
        e.contains("general.architecture") && e.contains("string"),
        "{e}"
    );
    assert!(f.get_f32_array("tokenizer.ggml.tokens").is_err());

    assert_eq!(f.tensor_infos().len(), 272);
    let emb = f.tensor_info("token_embd.weight").unwrap();
    assert_eq!(emb.shape, vec![49152, 576]);
    assert_eq!(emb.ggml_type, GgmlType::Q8_0);
    let q = f.tensor_info("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.shape, vec![576, 576]);
    assert_eq!(q.ggml_type, GgmlType::Q4_1);
    let k = f.tensor_info("blk.0.attn_k.weight").unwrap();
    assert_eq!(k.shape, vec![192, 576]);
    let norm = f.tensor_info("blk.0.attn_norm.weight").unwrap();
    assert_eq!(
        (norm.shape.clone(), norm.ggml_type),
        (vec![576], GgmlType::F32)
    );
    assert!(f.contains("output_norm.weight"));
    assert_eq!(f.names().len(), 272);
}

#[test]
fn network_real_model_tensors_load() {
    let Some(path) = default_gguf() else { return };
    let f = GgufFile::open(&path).unwrap();
    let norm = f.tensor("blk.0.attn_norm.weight").unwrap();
    assert!(norm.is_mapped());
    assert_eq!(norm.format(), WeightFormat::F32);
    // Quantized blocks stay in the file, as they are stored.
    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert!(q.is_mapped());
    assert_eq!(
        q.format(),
        WeightFormat::Quant(qkv_kernels::QuantFormat::Q4_1)
    );
    assert_eq!(q.shape(), &[576, 576]);
    assert_eq!(q.bytes(), 576 * 576 / 32 * 20);
    // Widened on request: to f32 exactly, to f16 by rounding that.
    let b = q.to_f32_vec().unwrap();
    let q32 = f.tensor("blk.0.attn_q.weight").unwrap();
    let q32 = q32.into_dtype(FloatType::F32).unwrap();
    assert_eq!(q32.format(), WeightFormat::F32);
    assert_eq!(q32.as_f32().unwrap(), &b[..]);
    let q16 = q.into_dtype(FloatType::F16).unwrap();
    assert_eq!(q16.format(), WeightFormat::F16);
    assert!(!q16.is_mapped());
    let a = q16.to_f32_vec().unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(*x, half::f16::from_f32(*y).to_f32());
    }
    match f.tensor("nope") {
        Err(Error::MissingTensor { name }) => assert_eq!(name, "nope"),
        other => panic!("{other:?}"),
    }
}

/// Metadata of every value type, nested arrays included.
fn every_kind_of_metadata() -> Vec<(String, MetaValue)> {
    use MetaValue as M;
    let s = |x: &str| M::String(x.to_string());
    vec![
        ("general.architecture".into(), s("llama")),
        ("t.u8".into(), M::U8(200)),
        ("t.i8".into(), M::I8(-100)),
        ("t.u16".into(), M::U16(60000)),
        ("t.i16".into(), M::I16(-30000)),
        ("t.u32".into(), M::U32(4_000_000_000)),
        ("t.i32".into(), M::I32(-2_000_000_000)),
        ("t.u64".into(), M::U64(u64::MAX)),
        ("t.i64".into(), M::I64(i64::MIN)),
        ("t.f32".into(), M::F32(1.5e-5)),
        ("t.f64".into(), M::F64(-2.25e100)),
        ("t.bool".into(), M::Bool(true)),
        ("t.str".into(), s("héllo 日本 😀")),
        ("t.empty_str".into(), s("")),
        (
            "t.arr_str".into(),
            M::Array(MetaValueType::String, vec![s("a"), s(""), s("Ġthe")]),
        ),
        (
            "t.arr_i32".into(),
            M::Array(MetaValueType::I32, vec![M::I32(-1), M::I32(3)]),
        ),
        (
            "t.arr_f32".into(),
            M::Array(MetaValueType::F32, vec![M::F32(0.5), M::F32(-1.0)]),
        ),
        ("t.arr_empty".into(), M::Array(MetaValueType::U64, vec![])),
        (
            "t.arr_nested".into(),
            M::Array(
                MetaValueType::Array,
                vec![
                    M::Array(MetaValueType::U8, vec![M::U8(1), M::U8(2)]),
                    M::Array(MetaValueType::String, vec![s("x")]),
                    M::Array(MetaValueType::Bool, vec![]),
                ],
            ),
        ),
    ]
}

/// A small valid file: two tensors, the last 64 bytes long, so the file ends exactly where
/// its data does (every strict prefix is then invalid).
fn write_small(path: &Path) -> (Vec<f32>, Vec<half::f16>) {
    let a: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let b: Vec<half::f16> = (0..32)
        .map(|i| half::f16::from_f32(i as f32 / 8.0))
        .collect();
    let b_bytes: Vec<u8> = b.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_gguf(
        path,
        &every_kind_of_metadata(),
        &[
            (
                "a".into(),
                vec![2, 3],
                WeightFormat::F32,
                &f32_bytes(&a)[..],
            ),
            (
                "b.weight".into(),
                vec![4, 2, 4],
                WeightFormat::F16,
                &b_bytes[..],
            ),
        ],
    )
    .unwrap();
    (a, b)
}

#[test]
fn write_read_round_trip() {
    let dir = temp_dir("roundtrip");
    let path = dir.join("small.gguf");
    let (a, b) = write_small(&path);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    let want = every_kind_of_metadata();
    assert_eq!(
        f.metadata_keys().collect::<Vec<_>>(),
        want.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()
    );
    for (k, v) in &want {
        assert_eq!(f.metadata(k), Some(v), "{k}");
    }
    assert_eq!(f.get_u32("t.u8").unwrap(), 200);
    assert!(f
        .get_u32("t.u64")
        .unwrap_err()
        .to_string()
        .contains("t.u64"));
    assert!(f.get_u32("t.i8").is_err());
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(f.get_str("t.str").unwrap(), "héllo 日本 😀");
    assert_eq!(f.get_str_array("t.arr_str").unwrap(), vec!["a", "", "Ġthe"]);
    assert_eq!(f.get_i32_array("t.arr_i32").unwrap(), vec![-1, 3]);
    assert_eq!(f.get_f32_array("t.arr_f32").unwrap(), vec![0.5, -1.0]);
    assert_eq!(f.get_f32("t.f64").unwrap(), -2.25e100f64 as f32);
    assert!(f.get_bool("t.bool").unwrap());

    let infos = f.tensor_infos();
    assert_eq!(infos.len(), 2);
    assert_eq!(
        (infos[0].shape.clone(), infos[0].ggml_type),
        (vec![2, 3], GgmlType::F32)
    );
    assert_eq!(
        (infos[1].shape.clone(), infos[1].ggml_type),
        (vec![4, 2, 4], GgmlType::F16)
    );
    let ta = f.tensor("a").unwrap();
    assert!(ta.is_mapped());
    assert_eq!(ta.as_f32().unwrap(), &a[..]);
    let tb = f.tensor("b.weight").unwrap();
    assert!(tb.is_mapped());
    assert_eq!(tb.shape(), &[4, 2, 4]);
    match tb.weights() {
        qkv::kernels::Weights::F16(v) => assert_eq!(v, &b[..]),
        _ => panic!("not f16"),
    }
    // The file ends where the last tensor's data ends.
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    assert_eq!(infos[1].offset + infos[1].n_bytes, len);
    // Nothing but the file is left in the directory.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn writer_rejects_bad_input() {
    let dir = temp_dir("badwrite");
    let p = dir.join("x.gguf");
    let one = f32_bytes(&[1.0]);
    let bad_len = write_gguf(
        &p,
        &[],
        &[("t".into(), vec![2], WeightFormat::F32, &one[..])],
    );
    assert!(bad_len.is_err());
    let dup = write_gguf(
        &p,
        &[],
        &[
            ("t".into(), vec![1], WeightFormat::F32, &one[..]),
            ("t".into(), vec![1], WeightFormat::F32, &one[..]),
        ],
    );
    assert!(dup.is_err());
    let mixed = MetaValue::Array(MetaValueType::U8, vec![MetaValue::I8(1)]);
    assert!(write_gguf(&p, &[("k".into(), mixed)], &[]).is_err());
    assert!(!p.exists());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "no temp file left behind"
    );
    std::fs::remove_dir_all(&dir).ok();
}

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

#[test]
fn every_truncation_is_an_error() {
    let dir = temp_dir("trunc");
    let path = dir.join("small.gguf");
    write_small(&path);
    let full = std::fs::read(&path).unwrap();
    assert!(GgufFile::open(&path).is_ok());
    let cut = dir.join("cut.gguf");
    for n in 0..full.len() {
        std::fs::write(&cut, &full[..n]).unwrap();
        match GgufFile::open(&cut) {
            // A cut in the header, or in a tensor's data.
            Err(Error::Format { .. } | Error::TensorPastEnd { .. }) => {}
            Err(e) => panic!("prefix of {n} bytes: wrong error kind {e:?}"),
            Ok(_) => panic!("prefix of {n} of {} bytes was accepted", full.len()),
        }
    }
    std::fs::remove_dir_all(&dir).ok();
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
fn hostile_files_are_errors_not_panics() {
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
    // A tensor of a type qkv parses but cannot load is a typed error at load, naming it.
    for (code, ty, bytes) in [
        (10u32, "Q2_K", 84usize),
        (20, "IQ4_NL", 18),
        (23, "IQ4_XS", 136),
    ] {
        let block = if ty == "IQ4_NL" { 32 } else { 256 };
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
fn network_dequantization_matches_gguf_py() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gguf/dequant.json"
    );
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let Some(model) = default_gguf() else { return };
    let f = GgufFile::open(&model).unwrap();
    let mut types = std::collections::HashSet::new();
    for slice in fx["slices"].as_array().unwrap() {
        let name = slice["name"].as_str().unwrap();
        let start = slice["start"].as_u64().unwrap() as usize;
        let want: Vec<f32> = slice["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let t = f.tensor(name).unwrap();
        let got = t.to_f32_vec().unwrap();
        for (i, (g, w)) in got[start..start + want.len()].iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{name}[{}]: {g} vs gguf-py {w}",
                start + i
            );
        }
        types.insert(slice["type"].as_str().unwrap().to_string());
    }
    for t in ["Q8_0", "Q4_1", "F32"] {
        assert!(types.contains(t), "fixture lacks a {t} tensor");
    }
}

/// Threads of one process writing the same file at once (two sessions fetching the default
/// model into an empty cache, say) each write their own temporary file: every call succeeds
/// and the file at the path is one writer's whole output. With one temporary name per
/// process they truncated each other's, and a zero-holed file could be published.
#[test]
fn threads_writing_one_path_never_mix_their_files() {
    let dir = temp_dir("threads");
    let out = dir.join("same.gguf");
    let n = 1 << 21; // 8 MB per tensor, so that the writes overlap in time
    let datas: Vec<Vec<u8>> = (1..=4u32)
        .map(|t| {
            (0..n as u32)
                .flat_map(|i| (t as f32 + i as f32 * 1e-6).to_le_bytes())
                .collect()
        })
        .collect();
    std::thread::scope(|scope| {
        for data in &datas {
            let out = &out;
            scope.spawn(move || {
                let meta = vec![(
                    "general.architecture".to_owned(),
                    MetaValue::String("x".into()),
                )];
                write_gguf(
                    out,
                    &meta,
                    &[("w".to_owned(), vec![n], WeightFormat::F32, &data[..])],
                )
                .unwrap();
            });
        }
    });
    let got = GgufFile::open(&out)
        .unwrap()
        .tensor("w")
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let first = got[0].round() as usize;
    assert!((1..=4).contains(&first), "{}", got[0]);
    let want = &datas[first - 1];
    let got_bytes: Vec<u8> = got.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert!(got_bytes == *want, "the file mixes writers' data");
    // Nothing but the file itself is left.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn network_convert_real_model_to_f16() {
    let Some(src_path) = default_gguf() else {
        return;
    };
    let dir = temp_dir("convert");
    let out = dir.join("model.f16.gguf");
    convert(&src_path, &out, FloatType::F16).unwrap();
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "temp file left behind"
    );

    let src = GgufFile::open(&src_path).unwrap();
    let dst = GgufFile::open(&out).unwrap();
    assert_eq!(dst.version(), 3);
    assert_eq!(dst.get_u32("general.file_type").unwrap(), 1);
    for key in src.metadata_keys() {
        if key != "general.file_type" {
            assert_eq!(dst.metadata(key), src.metadata(key), "{key}");
        }
    }
    assert_eq!(dst.names(), src.names());
    for info in dst.tensor_infos() {
        let t = dst.tensor(&info.name).unwrap();
        assert!(t.is_mapped(), "{} is not mapped", info.name);
        let want = if info.shape.len() == 1 {
            GgmlType::F32
        } else {
            GgmlType::F16
        };
        assert_eq!(info.ggml_type, want, "{}", info.name);
        assert_eq!(info.shape, src.tensor_info(&info.name).unwrap().shape);
    }
    // Values: f16 tensors equal the source dequantized to f16; 1-D ones are exact.
    for name in [
        "token_embd.weight",
        "blk.3.ffn_up.weight",
        "output_norm.weight",
    ] {
        let t = src.tensor(name).unwrap();
        let t = if t.shape().len() == 1 {
            t
        } else {
            t.into_dtype(FloatType::F16).unwrap()
        };
        let a = t.to_f32_vec().unwrap();
        let b = dst.tensor(name).unwrap().to_f32_vec().unwrap();
        assert_eq!(a, b, "{name}");
    }

    // llama.cpp's own reader accepts the file (when gguf-py is installed).
    let py = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sys, gguf; r = gguf.GGUFReader(sys.argv[1]); print(len(r.tensors), sorted({t.tensor_type.name for t in r.tensors}))")
        .arg(&out)
        .output();
    match py {
        Ok(o) if o.status.success() => {
            let s = String::from_utf8_lossy(&o.stdout);
            assert_eq!(s.trim(), "272 ['F16', 'F32']", "gguf-py says {s}");
        }
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No module named 'gguf'") => {
            eprintln!("note: gguf-py is not installed (pip install gguf); skipped its check")
        }
        Ok(o) => panic!(
            "gguf-py rejects the file: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => eprintln!("note: python3 not runnable ({e}); skipped the gguf-py check"),
    }

    // A failed conversion leaves nothing behind.
    let bad = dir.join("missing-dir").join("x.gguf");
    match convert(&src_path, &bad, FloatType::F16) {
        // The error names the output asked for, not the hidden temporary file.
        Err(Error::Io { path, .. }) => assert_eq!(path, bad),
        other => panic!("{other:?}"),
    }
    assert!(convert(&dir.join("nope.gguf"), &dir.join("y.gguf"), FloatType::F16).is_err());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(&dir).ok();
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

#[cfg(unix)]
#[test]
fn convert_refuses_non_regular_output() {
    use std::os::unix::fs::symlink;
    let dir = temp_dir("nonregular");
    let input = dir.join("in.gguf");
    write_small(&input);

    #[track_caller]
    fn expect_refused(r: qkv::Result<()>, what: &str) {
        match r {
            Err(Error::Io { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists, "{what}");
                let msg = source.to_string();
                assert!(
                    msg.contains("not a regular file") && msg.contains(what),
                    "{msg:?} lacks {what:?}"
                );
            }
            other => panic!("{what}: {other:?}"),
        }
    }

    // A directory (with something in it).
    let sub = dir.join("out.d");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("keep"), b"keep").unwrap();
    expect_refused(convert(&input, &sub, FloatType::F16), "directory");
    expect_refused(write_gguf(&sub, &[], &[]), "directory");
    assert!(std::fs::symlink_metadata(&sub).unwrap().is_dir());
    assert_eq!(std::fs::read(sub.join("keep")).unwrap(), b"keep");

    // A symlink, to a regular file or to nothing: the link stays, its target is untouched.
    let target = dir.join("target");
    std::fs::write(&target, b"target").unwrap();
    let link = dir.join("link.gguf");
    symlink(&target, &link).unwrap();
    expect_refused(convert(&input, &link, FloatType::F32), "symbolic link");
    assert_eq!(std::fs::read_link(&link).unwrap(), target);
    assert_eq!(std::fs::read(&target).unwrap(), b"target");
    let dangling = dir.join("dangling.gguf");
    symlink(dir.join("nowhere"), &dangling).unwrap();
    expect_refused(convert(&input, &dangling, FloatType::F16), "symbolic link");
    assert!(!dir.join("nowhere").exists());

    // A FIFO (a stand-in for a device node such as /dev/null), and a symlink to it.
    let fifo = dir.join("fifo");
    match std::process::Command::new("mkfifo").arg(&fifo).status() {
        Ok(s) if s.success() => {
            use std::os::unix::fs::FileTypeExt;
            expect_refused(convert(&input, &fifo, FloatType::F16), "FIFO");
            assert!(std::fs::symlink_metadata(&fifo)
                .unwrap()
                .file_type()
                .is_fifo());
            let to_fifo = dir.join("to-fifo.gguf");
            symlink(&fifo, &to_fifo).unwrap();
            expect_refused(convert(&input, &to_fifo, FloatType::F16), "symbolic link");
            assert!(std::fs::symlink_metadata(&to_fifo)
                .unwrap()
                .file_type()
                .is_symlink());
        }
        other => eprintln!("note: mkfifo unavailable ({other:?}); skipped the FIFO case"),
    }

    // An existing regular file is replaced as before.
    let out = dir.join("out.gguf");
    std::fs::write(&out, b"old").unwrap();
    convert(&input, &out, FloatType::F16).unwrap();
    assert_eq!(GgufFile::open(&out).unwrap().names(), vec!["a", "b.weight"]);

    // No temporary file is left behind by any refusal.
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Quantized blocks go through qkv's writer unchanged, load mapped, and dequantize exactly;
/// a block whose f16 scale is NaN or infinite is refused at load, naming the tensor and block.
#[test]
fn quantized_tensors_round_trip_and_bad_scales_are_refused() {
    use qkv_kernels::QuantFormat;
    let dir = temp_dir("quant");
    for format in QuantFormat::ALL {
        let k = format.block_elems() * 2;
        let rows = 3;
        let mut data = vec![0u8; rows * format.row_bytes(k).unwrap()];
        let mut state = 0x1234_5678u32 ^ format.block_bytes() as u32;
        for b in data.iter_mut() {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            *b = (state >> 24) as u8;
        }
        // Finite scales: 0.5 (f16 0x3800) in every scale field.
        for block in data.chunks_exact_mut(format.block_bytes()) {
            for &o in format.scale_offsets() {
                block[o..o + 2].copy_from_slice(&[0x00, 0x38]);
            }
        }
        let path = dir.join(format!("{format}.gguf"));
        let fmt = WeightFormat::Quant(format);
        write_gguf(&path, &[], &[("w".into(), vec![rows, k], fmt, &data[..])]).unwrap();
        let f = GgufFile::open(&path).unwrap();
        let t = f.tensor("w").unwrap();
        assert!(t.is_mapped(), "{format}");
        assert_eq!((t.format(), t.bytes()), (fmt, data.len()), "{format}");
        let mut want = vec![0.0f32; rows * k];
        format.dequantize(&data, &mut want).unwrap();
        assert_eq!(t.to_f32_vec().unwrap(), want, "{format}");

        // The second block of the last row gets an infinite scale (f16 0x7C00), then a NaN.
        for bits in [[0x00u8, 0x7C], [0x01, 0x7E]] {
            let mut bad = data.clone();
            let at = (rows * k / format.block_elems() - 1) * format.block_bytes()
                + format.scale_offsets()[0];
            bad[at..at + 2].copy_from_slice(&bits);
            write_gguf(&path, &[], &[("w".into(), vec![rows, k], fmt, &bad[..])]).unwrap();
            let f = GgufFile::open(&path).unwrap();
            match f.tensor("w") {
                Err(Error::Config(msg)) => {
                    assert!(
                        msg.contains("`w`")
                            && msg.contains("NaN or infinite")
                            && msg.contains(&format!("block {}", rows * 2 - 1)),
                        "{format}: {msg}"
                    );
                }
                other => panic!("{format}: {other:?}"),
            }
        }
        // The writer refuses bytes that are not whole blocks of the shape.
        let short = write_gguf(&path, &[], &[("w".into(), vec![rows, k], fmt, &data[1..])]);
        assert!(matches!(short, Err(Error::Config(_))), "{format}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
