//! Helpers shared by qkv's integration tests: the PyTorch fixtures of
//! `tools/seq2seq_fixtures.py` and tolerances, and, from the crates qkv-cli's tests use too,
//! the default model or a printed skip (`qkv_fetch::testing`) and the synthetic model
//! (`qkv::testing::synthetic`).
#![allow(dead_code)] // each test binary uses its own subset
#![allow(unused_imports)]

pub use qkv::testing::synthetic;
pub use qkv_fetch::testing::{cache_dir, default_gguf, quant_model, skip};

use qkv::weights::gguf::GgufFile;
use qkv::weights::safetensors::SafeTensorsFile;
use qkv::weights::TensorSource;
use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// Tolerance with f32 weights: relative to the largest expected magnitude.
pub const F32_TOL: f32 = 1e-5;
/// Tolerance with f16 (or bf16) weights. The fixtures compute their expected outputs in f32
/// from the already-rounded weights, and qkv widens those weights exactly, so only the
/// arithmetic differs, as with f32 weights (the cases pass at F32_TOL; this leaves 2×).
pub const F16_TOL: f32 = 2e-5;

/// A fresh directory for test `tag`'s files under the system's temporary directory, unique
/// to this process.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qkv-test-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

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

/// The directory of references that a script of `tools/` makes with the network: `$var`,
/// else `name` in the cache, when it holds `marker`. Otherwise `None` after a printed skip,
/// or a failure under CI (`CI=true`), which makes them.
///
/// # Panics
/// Under CI, when the directory has no `marker`.
pub fn reference_dir(var: &str, name: &str, marker: &str, tool: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os(var) {
        Some(d) => PathBuf::from(d),
        // No cache directory at all: an empty path, where nothing is found.
        None => qkv_fetch::cache_dir()
            .map(|c| c.join(name))
            .unwrap_or_default(),
    };
    if dir.join(marker).is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "the {name} references are not at {} (.ci/run makes them with {tool})",
        dir.display()
    );
    eprintln!(
        "skipped: the {name} references are not at {} (run python3 {tool})",
        dir.display()
    );
    None
}

/// The little-endian f32 values of a file (logits a reference script wrote).
pub fn read_f32s(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        bytes.len() % 4,
        0,
        "{}: not whole f32 values",
        path.display()
    );
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The largest difference between `got` and the reference `want`, as a share of `range`
/// (the reference logits' range). A value that is not finite fails.
pub fn share_of_range(got: &[f32], want: &[f32], range: f32) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            assert!(g.is_finite(), "non-finite logit {g}");
            (g - w).abs() / range
        })
        .fold(0.0, f32::max)
}

/// The range of `values`: the largest less the smallest.
pub fn range_of(values: &[f32]) -> f32 {
    let (lo, hi) = values
        .iter()
        .fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
    hi - lo
}
