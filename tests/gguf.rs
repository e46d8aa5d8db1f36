//! GGUF reader, writer and converter: the real default model, hand-built and hostile files.

use qkv::weights::gguf::{convert, write_gguf, GgmlType, GgufFile, MetaValue, MetaValueType};
use qkv::weights::{FloatType, TensorSource, WeightFormat};
use qkv::Error;
use std::path::Path;

mod common;
use common::{default_gguf, temp_dir};

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
        // Finite scales: 0.5 (f16 0x3800) in every scale field (IQ1_M's spread over the top
        // nibbles of its scale words).
        for block in data.chunks_exact_mut(format.block_bytes()) {
            for &o in format.scale_offsets() {
                block[o..o + 2].copy_from_slice(&[0x00, 0x38]);
            }
            if format == QuantFormat::IQ1_M {
                qkv_kernels::quant::testing::iq1_m_put_d(block, 0x3800);
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
        for bits in [0x7C00u16, 0x7E01] {
            let mut bad = data.clone();
            let last = (rows * k / format.block_elems() - 1) * format.block_bytes();
            let block = &mut bad[last..last + format.block_bytes()];
            match format.scale_offsets().first() {
                Some(&o) => block[o..o + 2].copy_from_slice(&bits.to_le_bytes()),
                None => qkv_kernels::quant::testing::iq1_m_put_d(block, bits),
            }
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

/// A BF16 tensor, written by the writer as GGUF type 30 and read back, is a view of the file
/// (never widened at load) whose values are exact; it widens exactly to f32, rounds to
/// nearest for f16, splits into row views, survives a copy onto pages of its own, and
/// `convert` writes its exact f32 values.
#[test]
fn bf16_tensors_are_mapped_exact_and_convert() {
    use half::bf16;
    use qkv::kernels::Weights;
    use qkv::weights::{MatrixOptions, Tensor};
    let dir = temp_dir("bf16");
    let path = dir.join("b.gguf");
    let values: Vec<bf16> = (0..24)
        .map(|i| bf16::from_f32((i as f32 - 11.5) * 1.0e3_f32.powi(i % 3)))
        .chain([bf16::from_bits(0x0001), bf16::from_bits(0x8000)])
        .collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_gguf(
        &path,
        &[],
        &[("w".into(), vec![2, 13], WeightFormat::BF16, &bytes[..])],
    )
    .unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensor_infos()[0].ggml_type, GgmlType::BF16);
    let t = f.tensor("w").unwrap();
    assert!(t.is_mapped());
    assert_eq!(t.format(), WeightFormat::BF16);
    assert_eq!(t.bytes(), bytes.len());
    match t.weights() {
        Weights::BF16(v) => assert_eq!(v, &values[..]),
        _ => panic!("not bf16"),
    }
    let exact: Vec<f32> = values.iter().map(|v| v.to_f32()).collect();
    assert_eq!(t.to_f32_vec().unwrap(), exact);
    let wide = f.tensor("w").unwrap().into_dtype(FloatType::F32).unwrap();
    assert_eq!(wide.as_f32().unwrap(), &exact[..]);
    let half = f.tensor("w").unwrap().into_dtype(FloatType::F16).unwrap();
    let rounded: Vec<f32> = exact
        .iter()
        .map(|&v| half::f16::from_f32(v).to_f32())
        .collect();
    assert_eq!(half.to_f32_vec().unwrap(), rounded);
    let parts = f.tensor("w").unwrap().split_rows(&[1, 1]).unwrap();
    assert!(parts.iter().all(|p| p.is_mapped()));
    assert_eq!(parts[1].to_f32_vec().unwrap(), &exact[13..]);
    let paged = f
        .tensor("w")
        .unwrap()
        .interleaved(&MatrixOptions::default())
        .unwrap();
    assert!(!paged.is_mapped() && paged.format() == WeightFormat::BF16);
    assert_eq!(paged.to_f32_vec().unwrap(), exact);
    // An owned bf16 tensor checks its element count.
    assert!(Tensor::from_bf16("o", vec![3], values[..2].to_vec()).is_err());

    let out = dir.join("f32.gguf");
    convert(&path, &out, FloatType::F32).unwrap();
    let c = GgufFile::open(&out).unwrap();
    assert_eq!(c.tensor("w").unwrap().as_f32().unwrap(), &exact[..]);

    std::fs::remove_dir_all(&dir).ok();
}
