//! Helpers shared by the integration tests: the PyTorch fixtures of
//! `tools/seq2seq_fixtures.py`, the default model's source GGUF (or a printed skip), and the
//! synthetic model of `synthetic.rs`. qkv-cli's tests include this module too
//! (`#[path = "../../tests/common/mod.rs"]`), for the models and [`run_decode`].
#![allow(dead_code)] // each test binary uses its own subset

pub mod synthetic;

use qkv::weights::gguf::GgufFile;
use qkv::weights::safetensors::SafeTensorsFile;
use qkv::weights::TensorSource;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Tolerance with f32 weights: relative to the largest expected magnitude.
pub const F32_TOL: f32 = 1e-5;
/// Tolerance with f16 (or bf16) weights. The fixtures compute their expected outputs in f32
/// from the already-rounded weights, and qkv widens those weights exactly, so only the
/// arithmetic differs, as with f32 weights (the cases pass at F32_TOL; this leaves 2×).
pub const F16_TOL: f32 = 2e-5;

/// A file under `tests/fixtures/seq2seq/`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/seq2seq")
        .join(name)
}

/// A case's weights (`NAME.safetensors`) and its inputs / expected outputs
/// (`NAME.io.safetensors`).
pub struct Case {
    pub weights: SafeTensorsFile,
    pub io: SafeTensorsFile,
}

impl Case {
    pub fn open(name: &str) -> Case {
        Case {
            weights: SafeTensorsFile::open(fixture(&format!("{name}.safetensors"))).unwrap(),
            io: SafeTensorsFile::open(fixture(&format!("{name}.io.safetensors"))).unwrap(),
        }
    }
    pub fn get(&self, name: &str) -> Vec<f32> {
        self.io.tensor(name).unwrap().to_f32_vec().unwrap()
    }
    pub fn shape(&self, name: &str) -> Vec<usize> {
        self.io.shape(name).unwrap().to_vec()
    }
    pub fn flags(&self, name: &str) -> Vec<bool> {
        self.get(name).iter().map(|&v| v != 0.0).collect()
    }
    pub fn lengths(&self, name: &str) -> Vec<usize> {
        self.get(name).iter().map(|&v| v as usize).collect()
    }
    pub fn ints<T: TryFrom<u64>>(&self, name: &str) -> Vec<T>
    where
        T::Error: std::fmt::Debug,
    {
        self.get(name)
            .iter()
            .map(|&v| T::try_from(v as u64).unwrap())
            .collect()
    }
    pub fn meta(&self, key: &str) -> usize {
        self.io.metadata()[key].parse().unwrap()
    }
}

/// max |got − want| ≤ tol · max |want|.
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-12);
    let err = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        err <= tol * scale,
        "{what}: max error {err:e} > {tol:e} × {scale:e}"
    );
}

/// The default model's source GGUF (Q4_1), for the tests that need it (their names say
/// `network`): `QKV_TEST_GGUF`, else `qkv_cli::fetch::default_model()`, which fetches it
/// once. `None` when it cannot be had, after [`skip`] printed why.
pub fn default_gguf() -> Option<PathBuf> {
    static GOT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let got = GOT.get_or_init(|| {
        if let Ok(p) = std::env::var("QKV_TEST_GGUF") {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "QKV_TEST_GGUF={} is not a file", p.display());
            return Ok(p);
        }
        // The published Q4_1 file, fetched into the cache like the CLI's default model.
        qkv_cli::fetch::default_model()
            .map_err(|e| format!("the default model cannot be fetched: {e}"))
    });
    match got {
        Ok(p) => Some(p.clone()),
        Err(why) => skip(why),
    }
}

/// A test that cannot have what the network provides prints `skipped: {why}` and returns
/// `None`, except with `QKV_REQUIRE_MODEL=1` (set by `.ci/run`), where it fails: CI never
/// skips silently.
pub fn skip<T>(why: &str) -> Option<T> {
    if std::env::var_os("QKV_REQUIRE_MODEL").is_some_and(|v| v == "1") {
        panic!("QKV_REQUIRE_MODEL=1, but {why}");
    }
    eprintln!("skipped: {why}");
    None
}

/// The default model quantized as `kind` (`Q4_1`: the published file; `Q8_0`, `Q4_K_M`, …:
/// made by `tools/quantized_models.py` into `$QKV_QUANT_MODELS`, else
/// `<cache>/llamacpp/models`), or `None` after a printed skip. A missing file fails instead
/// under `QKV_REQUIRE_QUANT_MODELS=1` (set by `.ci/run`, which makes them).
pub fn quant_model(kind: &str) -> Option<PathBuf> {
    if kind == "Q4_1" {
        return default_gguf();
    }
    let dir = std::env::var_os("QKV_QUANT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("llamacpp/models"));
    let path = dir.join(format!("SmolLM2-135M-Instruct.{kind}.gguf"));
    if path.is_file() {
        return Some(path);
    }
    let why = format!(
        "{kind}: {} is missing (make it with `python3 tools/quantized_models.py`)",
        path.display()
    );
    if std::env::var_os("QKV_REQUIRE_QUANT_MODELS").is_some_and(|v| v == "1") {
        panic!("{why}");
    }
    eprintln!("skipped: {why}");
    None
}

/// Where fetched models and generated references live (`QKV_CACHE`, …): as the CLI finds it.
pub fn cache_dir() -> PathBuf {
    qkv_cli::fetch::cache_dir().expect("a cache directory")
}

/// A GGUF's vocabulary as Hugging Face `tokenizer.json` pieces: the BPE model's `vocab`
/// (token → id) and the `added_tokens` (control and user-defined tokens; control ones are
/// special).
pub fn hf_vocab(f: &GgufFile) -> (Map<String, Value>, Vec<Value>) {
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    let types = f.get_i32_array("tokenizer.ggml.token_type").unwrap();
    let vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), Value::from(i)))
        .collect();
    let added = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| types[*i] == 3 || types[*i] == 4)
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": types[i] == 3})
        })
        .collect();
    (vocab, added)
}

/// Runs qkv-cli's `decode` binary with `args`, `stdin` written to it (closed at once when
/// `None`), and returns its exit status and output. Only in qkv-cli's tests, which cargo
/// builds the binary for.
pub fn run_decode(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let Some(exe) = option_env!("CARGO_BIN_EXE_decode") else {
        panic!("cargo builds decode for qkv-cli's tests only");
    };
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes()).unwrap();
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}
