//! Dequantization bit-equal to gguf-py's on every block of the real quantized files: the
//! default model in every format tests/quantized_files.rs runs (the published Q4_1 file and
//! the ones `tools/quantized_models.py` makes with llama-quantize). `tools/dequant_refs.py`
//! dequantizes each of their block-quantized tensors with `gguf.quants.dequantize` and keeps
//! the SHA-256 of the values as little-endian f32; here qkv dequantizes the same tensors, with
//! `QuantFormat::dequantize` (the SIMD path where the CPU has it) and with the scalar
//! reference `QuantFormat::dequantize_scalar`, and both hashes must be gguf-py's.
//!
//! kernels/tests/dequant_gguf_py.rs does the same on random blocks of every format, extreme
//! scales included; this covers the blocks llama-quantize really writes, every one of them.
//!
//! The references are the JSON file named by `$QKV_DEQUANT_REFS`, else
//! `<cache>/dequant/refs.json` (the path the script prints). Without it this test (named
//! `network_…`: the files are made from the fetched model) prints why and passes, unless
//! `QKV_REQUIRE_QUANT_MODELS=1` (set by `.ci/run`, which makes it) turns that into a failure.

mod common;

use qkv::weights::gguf::{GgmlType, GgufFile};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Every file the references cover, by the kind `common::quant_model` takes.
const KINDS: [&str; 24] = [
    "Q4_1",
    "Q8_0",
    "Q4_0",
    "Q5_1",
    "Q4_K_M",
    "Q5_K_M",
    "Q6_K",
    "Q2_K",
    "Q2_K_PURE",
    "Q3_K_S",
    "Q3_K_M",
    "Q3_K_L",
    "IQ4_NL",
    "IQ4_XS",
    "IQ3_XXS",
    "IQ3_S",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ2_M",
    "IQ1_S",
    "IQ1_M",
    "TQ1_0",
    "TQ2_0",
];

/// Types stored as plain numbers, not blocks: the script leaves them out too.
const PLAIN: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F64,
    GgmlType::I8,
    GgmlType::I16,
    GgmlType::I32,
    GgmlType::I64,
];

/// The references, or `None` after a printed skip (a failure under
/// `QKV_REQUIRE_QUANT_MODELS=1`).
fn refs() -> Option<Value> {
    let path = std::env::var_os("QKV_DEQUANT_REFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::cache_dir().join("dequant/refs.json"));
    if !path.is_file() {
        let why = format!(
            "{} is missing (make it with `python3 tools/dequant_refs.py`)",
            path.display()
        );
        if std::env::var_os("QKV_REQUIRE_QUANT_MODELS").is_some_and(|v| v == "1") {
            panic!("QKV_REQUIRE_QUANT_MODELS=1, but {why}");
        }
        eprintln!("skipped: {why}");
        return None;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    Some(serde_json::from_str(&text).unwrap())
}

/// SHA-256 of `values` as little-endian f32, in lowercase hex.
fn sha256_le(values: &[f32]) -> String {
    let mut hasher = Sha256::new();
    for v in values {
        hasher.update(v.to_le_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn network_every_quantized_tensor_dequantizes_as_gguf_py_does() {
    let Some(refs) = refs() else {
        return;
    };
    let mut checked = 0usize;
    let mut failures: Vec<String> = Vec::new();
    for kind in KINDS {
        let Some(path) = common::quant_model(kind) else {
            continue;
        };
        let want = refs["files"][kind]["tensors"]
            .as_object()
            .unwrap_or_else(|| panic!("the references have no file {kind}"));
        let bytes = std::fs::metadata(&path).unwrap().len();
        assert_eq!(
            refs["files"][kind]["bytes"].as_u64(),
            Some(bytes),
            "{kind}: the references were made from another {} (run tools/dequant_refs.py again)",
            path.display()
        );
        let file = GgufFile::open(&path).unwrap();
        let mut seen = BTreeSet::new();
        for info in file.tensor_infos() {
            if PLAIN.contains(&info.ggml_type) {
                continue;
            }
            let name = &info.name;
            let here = format!("{kind}: {name} ({}, {:?})", info.ggml_type, info.shape);
            let Some(r) = want.get(name) else {
                failures.push(format!("{here}: not in gguf-py's references"));
                continue;
            };
            seen.insert(name.clone());
            let shape: Vec<usize> = r["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            if r["type"] != info.ggml_type.to_string() || shape != info.shape {
                failures.push(format!(
                    "{here}: gguf-py reads it as {} {shape:?}",
                    r["type"]
                ));
                continue;
            }
            let Some(format) = info.ggml_type.quant_format() else {
                failures.push(format!("{here}: qkv has no decoder for it"));
                continue;
            };
            let src = file.tensor_bytes(name).unwrap();
            let mut simd = vec![0.0f32; info.numel()];
            let mut scalar = vec![0.0f32; info.numel()];
            format.dequantize(src, &mut simd).unwrap();
            format.dequantize_scalar(src, &mut scalar).unwrap();
            let expected = r["sha256"].as_str().unwrap();
            let (h_simd, h_scalar) = (sha256_le(&simd), sha256_le(&scalar));
            // gguf-py's values are known only by their hash; when the two paths disagree,
            // the first element where they do shows where to look.
            let split = simd
                .iter()
                .zip(&scalar)
                .position(|(a, b)| a.to_bits() != b.to_bits())
                .map(|i| {
                    format!(
                        "; SIMD and scalar first differ at element {i} \
                         (block {}): {} vs {}",
                        i / format.block_elems(),
                        simd[i],
                        scalar[i]
                    )
                })
                .unwrap_or_default();
            for (path_name, got) in [("SIMD", &h_simd), ("scalar", &h_scalar)] {
                if got != expected {
                    failures.push(format!(
                        "{here}: {path_name} dequantization hashes to {got}, gguf-py's to \
                         {expected}{split}"
                    ));
                }
            }
            checked += 1;
        }
        for name in want.keys().filter(|n| !seen.contains(*n)) {
            failures.push(format!(
                "{kind}: {name} is in gguf-py's references, not a block tensor of {}",
                path.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of the checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{checked} tensors dequantize as gguf-py does, SIMD and scalar");
}
