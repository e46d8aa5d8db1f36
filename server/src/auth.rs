//! API keys for the server: read from the command line and from a key file, and checked
//! against a request's `Authorization: Bearer KEY` header without a timing side channel on
//! the key's bytes.
//!
//! ```
//! use qkv_server::auth::{parse_key_file, ApiKeys};
//!
//! let mut keys = parse_key_file("# the team's key\nsk-team\n\nsk-ci\n").unwrap();
//! keys.push("sk-cli".into());
//! let keys = ApiKeys::new(keys).unwrap();
//! assert!(keys.allows(Some("Bearer sk-ci")));
//! assert!(!keys.allows(Some("Bearer sk-other")));
//! assert!(!keys.allows(None));
//! // No keys: every request passes.
//! assert!(ApiKeys::new(Vec::new()).unwrap().allows(None));
//! ```

/// The keys a server accepts; empty when it needs none. Its `Debug` output never shows a
/// key.
pub struct ApiKeys {
    keys: Vec<Vec<u8>>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.keys.len())
    }
}

/// Why a key is unusable, if it is: empty, or with a character other than printable ASCII
/// without spaces (which a client could not send as a bearer token). The key itself is never
/// part of the message.
fn key_problem(key: &str) -> Option<&'static str> {
    if key.is_empty() {
        Some("a key is empty")
    } else if !key.bytes().all(|b| b.is_ascii_graphic()) {
        Some("a key may hold printable ASCII characters only, without spaces")
    } else {
        None
    }
}

impl ApiKeys {
    /// The accepted keys; an error (naming which key by its position, never its text) for
    /// an empty key or one with spaces or characters outside printable ASCII.
    pub fn new(keys: Vec<String>) -> Result<ApiKeys, String> {
        for (i, k) in keys.iter().enumerate() {
            if let Some(why) = key_problem(k) {
                return Err(format!("API key {}: {why}", i + 1));
            }
        }
        Ok(ApiKeys {
            keys: keys.into_iter().map(String::into_bytes).collect(),
        })
    }

    /// True when no key is set (every request passes).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many keys are accepted.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether a request whose `Authorization` header is `header` may pass: always when no
    /// key is set, else only with `Bearer KEY` (the scheme in any case) for an accepted KEY.
    /// Every accepted key is compared, each with [`constant_time_eq`], whatever matched
    /// before.
    pub fn allows(&self, header: Option<&str>) -> bool {
        if self.keys.is_empty() {
            return true;
        }
        let Some(token) = header.and_then(bearer_token) else {
            return false;
        };
        let mut ok = false;
        for k in &self.keys {
            ok |= constant_time_eq(k, token.as_bytes());
        }
        ok
    }
}

/// The token of an `Authorization: Bearer TOKEN` header value (the scheme matched in any
/// case, surrounding spaces ignored).
fn bearer_token(header: &str) -> Option<&str> {
    let header = header.trim();
    let (scheme, token) = header.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths only: every byte
/// position up to the longer length is visited and the differences are OR-ed together, with
/// no early exit on the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    // Keep the compiler from turning the loop into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

/// The keys of a key file's text: one key per line, surrounding spaces trimmed, blank lines
/// and lines starting with `#` ignored. An error names the line (never its text) of an
/// unusable key, and a file without any key is an error too (a server meant to need keys
/// must not start open).
pub fn parse_key_file(text: &str) -> Result<Vec<String>, String> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(why) = key_problem(line) {
            return Err(format!("line {}: {why}", i + 1));
        }
        keys.push(line.to_owned());
    }
    if keys.is_empty() {
        return Err("no key in the file (one key per line; `#` starts a comment)".into());
    }
    Ok(keys)
}

/// [`parse_key_file`] of the file at `path`; errors name the path.
pub fn read_key_file(path: &std::path::Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_key_file(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bytes_compare_equal_and_any_difference_does_not() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"sk-abc", b"sk-abc"));
        assert!(!constant_time_eq(b"sk-abc", b"sk-abd"));
        assert!(!constant_time_eq(b"sk-abc", b"xk-abc"));
        assert!(!constant_time_eq(b"sk-abc", b"sk-ab"));
        assert!(!constant_time_eq(b"sk-ab", b"sk-abc"));
        // A key padded with what the shorter one reads past its end still differs.
        assert!(!constant_time_eq(b"ab\0", b"ab"));
        assert!(!constant_time_eq(b"", b"\0"));
    }

    #[test]
    fn bearer_headers_are_read_in_any_case() {
        let keys = ApiKeys::new(vec!["k1".into(), "k2".into()]).unwrap();
        for h in ["Bearer k1", "bearer k2", "BEARER   k1 ", " Bearer k2"] {
            assert!(keys.allows(Some(h)), "{h}");
        }
        for h in [
            "k1",
            "Basic k1",
            "Bearer",
            "Bearer ",
            "Bearer k3",
            "Bearer k1k2",
            "",
        ] {
            assert!(!keys.allows(Some(h)), "{h}");
        }
        assert!(!keys.allows(None));
        assert_eq!(format!("{keys:?}"), "ApiKeys(2 keys)");
    }

    #[test]
    fn key_files_skip_comments_and_blank_lines() {
        let text = "# keys\n\n  sk-one  \n#sk-commented\r\nsk-two\r\n\t\n";
        assert_eq!(parse_key_file(text).unwrap(), ["sk-one", "sk-two"]);
        let e = parse_key_file("# nothing\n\n").unwrap_err();
        assert!(e.contains("no key"), "{e}");
        let e = parse_key_file("sk-one\nsk two secret\n").unwrap_err();
        assert!(e.starts_with("line 2:") && !e.contains("secret"), "{e}");
        let e = ApiKeys::new(vec!["ok".into(), String::new()]).unwrap_err();
        assert!(e.contains("API key 2"), "{e}");
        let e = read_key_file(std::path::Path::new("/nonexistent/keys")).unwrap_err();
        assert!(e.contains("/nonexistent/keys"), "{e}");
    }
}
