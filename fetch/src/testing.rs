//! How the tests and benches of qkv, qkv-cli and qkv-server find the real models: the default
//! model (fetched once), its quantized variants made by `tools/quantized_models.py`, and the
//! cache directory the Python references are written to. A test that cannot have what it needs
//! prints why and skips, except under the CI variables named below, where it fails.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The default model's source GGUF (Q4_1), for the tests that need it (their names say
/// `network`): `QKV_TEST_GGUF`, else [`crate::default_model`], which fetches it once.
/// `None` when it cannot be had, after [`skip`] printed why.
///
/// # Panics
/// When `QKV_TEST_GGUF` names no file, and as [`skip`].
pub fn default_gguf() -> Option<PathBuf> {
    static GOT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let got = GOT.get_or_init(|| {
        if let Ok(p) = std::env::var("QKV_TEST_GGUF") {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "QKV_TEST_GGUF={} is not a file", p.display());
            return Ok(p);
        }
        // The published Q4_1 file, fetched into the cache like the CLI's default model.
        crate::default_model().map_err(|e| format!("the default model cannot be fetched: {e}"))
    });
    match got {
        Ok(p) => Some(p.clone()),
        Err(why) => skip(why),
    }
}

/// A test that cannot have what the network provides prints `skipped: {why}` and returns
/// `None`, except with `QKV_REQUIRE_MODEL=1` (set by `.ci/run`), where it fails: CI never
/// skips silently.
///
/// # Panics
/// Under `QKV_REQUIRE_MODEL=1`.
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
///
/// # Panics
/// Under `QKV_REQUIRE_QUANT_MODELS=1` when the file is missing, and as [`default_gguf`].
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

/// Where fetched models and generated references live: [`crate::cache_dir`], as the CLI
/// finds it.
///
/// # Panics
/// When there is no cache directory ([`crate::Error::NoCacheDir`]).
pub fn cache_dir() -> PathBuf {
    crate::cache_dir().expect("a cache directory")
}
