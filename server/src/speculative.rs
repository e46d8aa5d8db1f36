//! Speculative decoding in the server: the default every request gets (`--spec ngram|off`,
//! `--spec-max N`, and llama-server's spellings `--spec-type ngram-simple`,
//! `--draft-max N`, `--spec-draft-n-max N`), and what one request asks for: llama-server's
//! `speculative.n_max` / `speculative.n_min` / `speculative.p_min` fields (on every route),
//! and qkv's `speculative` field (`"ngram"`, `"off"`, `true` or `false`).
//!
//! Speculation verifies greedy choices only, so a request that samples (temperature > 0)
//! runs without it whatever it asks; its tokens are those of plain decoding either way.
//!
//! ```
//! use qkv::speculative::{Speculation, MAX_DRAFT};
//! use qkv_server::body::Body;
//! use qkv_server::speculative::{resolve, server_default, spec_fields};
//!
//! let default = server_default(Some("ngram-simple"), Some(4))?;
//! assert_eq!(default.max_draft(), 4);
//! let b = Body::parse(br#"{"speculative.n_max": 16}"#)?;
//! let f = spec_fields(&b)?;
//! // 16 drafts asked: as many as a verify pass holds.
//! assert_eq!(resolve(default, &f, true).max_draft(), MAX_DRAFT);
//! // Sampling runs plainly.
//! assert_eq!(resolve(default, &f, false), Speculation::Off);
//! let off = Body::parse(br#"{"speculative": "off"}"#)?;
//! assert_eq!(resolve(default, &spec_fields(&off)?, true), Speculation::Off);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::body::Body;
use crate::error::ApiError;
use qkv::speculative::{NgramOptions, Speculation, MAX_DRAFT};

/// What a request says about speculation; `None` leaves the server's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecFields {
    /// `speculative`: on (n-gram drafting) or off.
    pub enabled: Option<bool>,
    /// `speculative.n_max`: most tokens per draft (0: off; more than
    /// [`MAX_DRAFT`] is taken as [`MAX_DRAFT`]).
    pub n_max: Option<usize>,
    /// `speculative.n_min`: read and checked (at most `n_max`), not applied: qkv's drafts
    /// are as long as the text's earlier occurrence allows, and their governor judges
    /// whether they pay.
    pub n_min: Option<usize>,
}

/// The largest `speculative.n_max` / `n_min` accepted (llama-server's own bound is the
/// context; any larger draft is cut to [`MAX_DRAFT`] anyway).
const MAX_FIELD: u64 = 1 << 16;

/// Reads a request's speculation fields; a 400 naming the field for a wrong type, a value
/// out of range, an unknown `speculative` kind, or `n_min` above `n_max`.
pub fn spec_fields(b: &Body) -> Result<SpecFields, ApiError> {
    let enabled = match b.field("speculative") {
        None => None,
        Some(serde_json::Value::Bool(on)) => Some(*on),
        Some(serde_json::Value::String(s)) => Some(
            kind(s).map_err(|e| ApiError::invalid("speculative", format!("`speculative`: {e}")))?,
        ),
        Some(v) => {
            return Err(ApiError::invalid(
                "speculative",
                format!("`speculative` must be \"ngram\", \"off\" or a boolean, got {v}"),
            ))
        }
    };
    let n_max = b.uint("speculative.n_max", MAX_FIELD)?.map(|n| n as usize);
    let n_min = b.uint("speculative.n_min", MAX_FIELD)?.map(|n| n as usize);
    // Drafts by lookup carry no probability to threshold; the field is checked only.
    b.number("speculative.p_min", 0.0..=1.0)?;
    if let (Some(lo), Some(hi)) = (n_min, n_max) {
        if lo > hi {
            return Err(ApiError::invalid(
                "speculative.n_min",
                format!("`speculative.n_min` ({lo}) is above `speculative.n_max` ({hi})"),
            ));
        }
    }
    Ok(SpecFields {
        enabled,
        n_max,
        n_min,
    })
}

/// Whether a kind of speculation by name turns it on: qkv's `ngram` and `off`, and
/// llama-server's `--spec-type` names (its n-gram kinds all map to qkv's n-gram lookup;
/// `none` is off). A draft model is named as not served.
fn kind(name: &str) -> Result<bool, String> {
    match name {
        "ngram" | "ngram-simple" | "ngram-map-k" | "ngram-map-k4v" | "ngram-mod"
        | "ngram-cache" => Ok(true),
        "off" | "none" => Ok(false),
        "draft" | "draft-simple" => Err(format!(
            "`{name}`: drafting with a second model is not served by qkv-server; use ngram"
        )),
        other => Err(format!(
            "unknown kind of speculation `{other}` (ngram, ngram-simple, ngram-map-k, \
             ngram-mod, ngram-cache, off, none)"
        )),
    }
}

/// The server's default from `--spec` (or `--spec-type`) and `--spec-max` (or
/// `--draft-max`): off without `--spec`; `--spec-max` alone turns n-gram drafting on, as
/// llama-server's `--draft-max` does not, but a draft length says as much. An error names
/// the flag and the value at fault.
pub fn server_default(spec: Option<&str>, max: Option<usize>) -> Result<Speculation, String> {
    let on = match spec {
        Some(s) => kind(s).map_err(|e| format!("--spec: {e}"))?,
        None => max.is_some_and(|m| m > 0),
    };
    if !on {
        return Ok(Speculation::Off);
    }
    let max_draft = match max {
        None => MAX_DRAFT,
        Some(0) => return Ok(Speculation::Off),
        Some(m) if m <= MAX_DRAFT => m,
        Some(m) => {
            return Err(format!(
                "--spec-max {m}: a draft of at most {MAX_DRAFT} tokens (a verify pass of \
                 {} rows) is verified",
                MAX_DRAFT + 1
            ))
        }
    };
    Ok(Speculation::Ngram(NgramOptions {
        max_draft,
        ..NgramOptions::default()
    }))
}

/// What a request runs with: the server's `default`, turned on or off and its draft length
/// set by the request's fields; off for a request that samples (`greedy` false).
pub fn resolve(default: Speculation, f: &SpecFields, greedy: bool) -> Speculation {
    if !greedy || f.enabled == Some(false) || f.n_max == Some(0) {
        return Speculation::Off;
    }
    let asked = f.enabled == Some(true) || f.n_max.is_some();
    let mut o = match default {
        Speculation::Ngram(o) => o,
        _ if asked => NgramOptions::default(),
        _ => return Speculation::Off,
    };
    if let Some(n) = f.n_max {
        o.max_draft = n.min(MAX_DRAFT);
    }
    Speculation::Ngram(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> Result<SpecFields, ApiError> {
        spec_fields(&Body::parse(json.as_bytes()).unwrap())
    }

    #[test]
    fn request_fields_turn_speculation_on_and_off() {
        let on = server_default(Some("ngram"), None).unwrap();
        assert_eq!(on.max_draft(), MAX_DRAFT);
        let off = Speculation::Off;
        let none = fields("{}").unwrap();
        assert_eq!(resolve(on, &none, true), on);
        assert_eq!(resolve(off, &none, true), off);
        let three = fields(r#"{"speculative.n_max": 3, "speculative.n_min": 1}"#).unwrap();
        assert_eq!(resolve(off, &three, true).max_draft(), 3);
        assert_eq!(resolve(on, &three, true).max_draft(), 3);
        for j in [r#"{"speculative.n_max": 0}"#, r#"{"speculative": false}"#] {
            assert_eq!(resolve(on, &fields(j).unwrap(), true), off, "{j}");
        }
        let yes = fields(r#"{"speculative": "ngram-simple"}"#).unwrap();
        assert_eq!(resolve(off, &yes, true).max_draft(), MAX_DRAFT);
        assert_eq!(resolve(off, &yes, false), off);
    }

    #[test]
    fn bad_fields_are_400s_naming_them() {
        for (json, param) in [
            (r#"{"speculative": 3}"#, "speculative"),
            (r#"{"speculative": "eagle"}"#, "speculative"),
            (r#"{"speculative": "draft-simple"}"#, "speculative"),
            (r#"{"speculative.n_max": -1}"#, "speculative.n_max"),
            (r#"{"speculative.n_max": "8"}"#, "speculative.n_max"),
            (r#"{"speculative.p_min": 2}"#, "speculative.p_min"),
            (
                r#"{"speculative.n_max": 2, "speculative.n_min": 3}"#,
                "speculative.n_min",
            ),
        ] {
            let e = fields(json).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{json}");
        }
    }

    #[test]
    fn server_defaults_take_llama_servers_names() {
        for name in [
            "ngram",
            "ngram-simple",
            "ngram-map-k",
            "ngram-mod",
            "ngram-cache",
        ] {
            assert!(server_default(Some(name), Some(5)).unwrap().max_draft() == 5);
        }
        assert_eq!(
            server_default(Some("none"), None).unwrap(),
            Speculation::Off
        );
        assert_eq!(server_default(None, None).unwrap(), Speculation::Off);
        assert_eq!(server_default(None, Some(4)).unwrap().max_draft(), 4);
        for (spec, max) in [
            (Some("draft-simple"), None),
            (Some("x"), None),
            (None, Some(99)),
        ] {
            let e = server_default(spec, max).unwrap_err();
            assert!(e.starts_with("--spec"), "{e}");
        }
    }
}
