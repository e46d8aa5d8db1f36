//! Speculative decoding in the server: the default every request gets (`--spec
//! ngram|draft|off`, `--spec-max N`, `--spec-min N`, `--model-draft FILE`, and
//! llama-server's spellings `--spec-type ngram-simple|draft-simple`, `--draft-max N`,
//! `--spec-draft-n-max N`, `--spec-draft-n-min N`, `-md FILE`), and what one request asks
//! for: llama-server's `speculative.n_max` / `speculative.n_min` / `speculative.p_min`
//! fields (on every route), and qkv's `speculative` field (`"ngram"`, `"draft"`, `"off"`,
//! `true` or `false`).
//!
//! Greedy requests get exactly the tokens of plain decoding; sampled ones are verified by
//! the speculative-sampling rule, so their tokens have the distribution of plain sampling.
//!
//! ```
//! use qkv::speculative::{Speculation, MAX_DRAFT};
//! use qkv_server::body::Body;
//! use qkv_server::speculative::{resolve, server_default, spec_fields};
//!
//! let default = server_default(Some("ngram-simple"), Some(4), None, false)?;
//! assert_eq!(default.max_draft(), 4);
//! let b = Body::parse(br#"{"speculative.n_max": 16, "speculative.n_min": 2}"#)?;
//! let f = spec_fields(&b)?;
//! // 16 drafts asked: as many as a verify pass holds; shorter than 2 are not verified.
//! let s = resolve(default, &f, false)?;
//! assert_eq!((s.max_draft(), s.min_draft()), (MAX_DRAFT, 2));
//! let off = Body::parse(br#"{"speculative": "off"}"#)?;
//! assert_eq!(resolve(default, &spec_fields(&off)?, false)?, Speculation::Off);
//! // A draft model is drafted with only where the server has one.
//! let draft = Body::parse(br#"{"speculative": "draft"}"#)?;
//! assert!(resolve(default, &spec_fields(&draft)?, false).is_err());
//! assert!(matches!(resolve(default, &spec_fields(&draft)?, true)?, Speculation::Draft(_)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::body::Body;
use crate::error::ApiError;
use qkv::speculative::{DraftOptions, NgramOptions, Speculation, MAX_DRAFT};

/// A kind of speculation, by the names a flag or a request gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// n-gram lookup in the prompt and the text so far.
    Ngram,
    /// The server's draft model (`--model-draft`).
    Draft,
    /// No speculation.
    Off,
}

/// What a request says about speculation; `None` leaves the server's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecFields {
    /// `speculative`: a kind (`true` is n-gram drafting, or the server's default kind when
    /// it speculates; `false` is off).
    pub kind: Option<Kind>,
    /// `speculative.n_max`: most tokens per draft (0: off; more than
    /// [`MAX_DRAFT`] is taken as [`MAX_DRAFT`]).
    pub n_max: Option<usize>,
    /// `speculative.n_min`: fewest tokens a draft must hold to be verified (a shorter one
    /// is dropped and the token runs alone); at most the draft length.
    pub n_min: Option<usize>,
    /// `speculative: true`: on, of the server's default kind.
    pub on: bool,
}

/// The largest `speculative.n_max` / `n_min` accepted (llama-server's own bound is the
/// context; any larger draft is cut to [`MAX_DRAFT`] anyway).
const MAX_FIELD: u64 = 1 << 16;

/// Reads a request's speculation fields; a 400 naming the field for a wrong type, a value
/// out of range, an unknown `speculative` kind, or `n_min` above `n_max`.
pub fn spec_fields(b: &Body) -> Result<SpecFields, ApiError> {
    let (kind, on) = match b.field("speculative") {
        None => (None, false),
        Some(serde_json::Value::Bool(true)) => (None, true),
        Some(serde_json::Value::Bool(false)) => (Some(Kind::Off), false),
        Some(serde_json::Value::String(s)) => (
            Some(
                kind(s)
                    .map_err(|e| ApiError::invalid("speculative", format!("`speculative`: {e}")))?,
            ),
            false,
        ),
        Some(v) => {
            return Err(ApiError::invalid(
                "speculative",
                format!(
                    "`speculative` must be \"ngram\", \"draft\", \"off\" or a boolean, got {v}"
                ),
            ))
        }
    };
    let n_max = b.uint("speculative.n_max", MAX_FIELD)?.map(|n| n as usize);
    let n_min = b.uint("speculative.n_min", MAX_FIELD)?.map(|n| n as usize);
    // Drafts are judged by the rule, not by a probability floor; the field is checked only.
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
        kind,
        n_max,
        n_min,
        on,
    })
}

/// A kind of speculation by name: qkv's `ngram`, `draft` and `off`, and llama-server's
/// `--spec-type` names (its n-gram kinds all map to qkv's n-gram lookup, `draft-simple` to
/// the draft model, `none` to off).
fn kind(name: &str) -> Result<Kind, String> {
    match name {
        "ngram" | "ngram-simple" | "ngram-map-k" | "ngram-map-k4v" | "ngram-mod"
        | "ngram-cache" => Ok(Kind::Ngram),
        "draft" | "draft-simple" => Ok(Kind::Draft),
        "off" | "none" => Ok(Kind::Off),
        other => Err(format!(
            "unknown kind of speculation `{other}` (ngram, ngram-simple, ngram-map-k, \
             ngram-mod, ngram-cache, draft, draft-simple, off, none)"
        )),
    }
}

/// The speculation of `kind` with drafts of `min..=max` tokens.
fn build(kind: Kind, max: usize, min: usize, base: Speculation) -> Speculation {
    match kind {
        Kind::Off => Speculation::Off,
        Kind::Ngram => {
            let o = match base {
                Speculation::Ngram(o) => o,
                _ => NgramOptions::default(),
            };
            Speculation::Ngram(NgramOptions {
                max_draft: max,
                min_draft: min.min(max),
                ..o
            })
        }
        Kind::Draft => Speculation::Draft(DraftOptions {
            max_draft: max,
            min_draft: min.min(max),
        }),
    }
}

/// The server's default from `--spec` (or `--spec-type`), `--spec-max` (or `--draft-max`),
/// `--spec-min` (or `--spec-draft-n-min`) and whether a draft model was given
/// (`--model-draft`): off without `--spec`, unless a draft model is given (then `draft`)
/// or `--spec-max` is (as llama-server's `--draft-max` does not, but a draft length says as
/// much: `ngram`). An error names the flag and the value at fault.
pub fn server_default(
    spec: Option<&str>,
    max: Option<usize>,
    min: Option<usize>,
    draft_model: bool,
) -> Result<Speculation, String> {
    let kind = match spec {
        Some(s) => kind(s).map_err(|e| format!("--spec: {e}"))?,
        None if draft_model => Kind::Draft,
        None if max.is_some_and(|m| m > 0) => Kind::Ngram,
        None => Kind::Off,
    };
    if kind == Kind::Draft && !draft_model {
        return Err("--spec draft: drafting with a model needs --model-draft FILE".into());
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
    let min_draft = min.unwrap_or(0);
    if min_draft > max_draft {
        return Err(format!(
            "--spec-min {min_draft}: above the most tokens per draft ({max_draft})"
        ));
    }
    Ok(build(kind, max_draft, min_draft, Speculation::Off))
}

/// What a request runs with: the server's `default`, its kind and draft lengths set by the
/// request's fields (`draft_model`: whether the server has a draft model). A 400 naming
/// `speculative` when the request asks for a draft model the server does not have.
pub fn resolve(
    default: Speculation,
    f: &SpecFields,
    draft_model: bool,
) -> Result<Speculation, ApiError> {
    if f.kind == Some(Kind::Off) || f.n_max == Some(0) {
        return Ok(Speculation::Off);
    }
    let default_kind = match default {
        Speculation::Off => None,
        Speculation::Ngram(_) => Some(Kind::Ngram),
        Speculation::Draft(_) => Some(Kind::Draft),
    };
    let asked = f.on || f.n_max.is_some();
    let kind = match (f.kind, default_kind) {
        (Some(k), _) => k,
        (None, Some(k)) => k,
        (None, None) if asked && draft_model => Kind::Draft,
        (None, None) if asked => Kind::Ngram,
        (None, None) => return Ok(Speculation::Off),
    };
    if kind == Kind::Draft && !draft_model {
        return Err(ApiError::invalid(
            "speculative",
            "`speculative`: this server has no draft model (qkv-server --model-draft FILE)",
        ));
    }
    let same_kind = default_kind == Some(kind);
    let max = match f.n_max {
        Some(n) => n.min(MAX_DRAFT),
        None if same_kind => default.max_draft(),
        None => MAX_DRAFT,
    };
    let min = match f.n_min {
        Some(n) => n,
        None if same_kind => default.min_draft(),
        None => 0,
    };
    Ok(build(kind, max, min, default))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> Result<SpecFields, ApiError> {
        spec_fields(&Body::parse(json.as_bytes()).unwrap())
    }

    fn resolved(default: Speculation, json: &str, draft: bool) -> Speculation {
        resolve(default, &fields(json).unwrap(), draft).unwrap()
    }

    #[test]
    fn request_fields_turn_speculation_on_and_off() {
        let on = server_default(Some("ngram"), None, None, false).unwrap();
        assert_eq!(on.max_draft(), MAX_DRAFT);
        let off = Speculation::Off;
        assert_eq!(resolved(on, "{}", false), on);
        assert_eq!(resolved(off, "{}", false), off);
        let three = r#"{"speculative.n_max": 3, "speculative.n_min": 1}"#;
        assert_eq!(resolved(off, three, false).max_draft(), 3);
        assert_eq!(resolved(on, three, false).max_draft(), 3);
        assert_eq!(resolved(on, three, false).min_draft(), 1);
        for j in [r#"{"speculative.n_max": 0}"#, r#"{"speculative": false}"#] {
            assert_eq!(resolved(on, j, false), off, "{j}");
        }
        let yes = r#"{"speculative": "ngram-simple"}"#;
        assert_eq!(resolved(off, yes, false).max_draft(), MAX_DRAFT);
        // `true` takes the server's kind, n-gram when it has none.
        assert!(matches!(
            resolved(off, r#"{"speculative": true}"#, false),
            Speculation::Ngram(_)
        ));
        let drafting = server_default(None, Some(4), Some(2), true).unwrap();
        assert_eq!(
            drafting,
            Speculation::Draft(DraftOptions {
                max_draft: 4,
                min_draft: 2
            })
        );
        assert_eq!(
            resolved(drafting, r#"{"speculative": true}"#, true),
            drafting
        );
        // A request's n_min above the server's draft length is cut to it.
        let s = resolved(drafting, r#"{"speculative.n_min": 6}"#, true);
        assert_eq!((s.max_draft(), s.min_draft()), (4, 4));
        assert!(matches!(
            resolved(drafting, r#"{"speculative": "ngram"}"#, true),
            Speculation::Ngram(_)
        ));
        let e = resolve(on, &fields(r#"{"speculative": "draft"}"#).unwrap(), false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("speculative"));
    }

    #[test]
    fn bad_fields_are_400s_naming_them() {
        for (json, param) in [
            (r#"{"speculative": 3}"#, "speculative"),
            (r#"{"speculative": "eagle"}"#, "speculative"),
            (r#"{"speculative.n_max": -1}"#, "speculative.n_max"),
            (r#"{"speculative.n_max": "8"}"#, "speculative.n_max"),
            (r#"{"speculative.n_min": 1.5}"#, "speculative.n_min"),
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
            let s = server_default(Some(name), Some(5), Some(2), false).unwrap();
            assert_eq!((s.max_draft(), s.min_draft()), (5, 2));
        }
        for name in ["draft", "draft-simple"] {
            let s = server_default(Some(name), None, None, true).unwrap();
            assert!(matches!(s, Speculation::Draft(_)), "{name}");
        }
        assert_eq!(
            server_default(Some("none"), None, None, true).unwrap(),
            Speculation::Off
        );
        assert_eq!(
            server_default(None, None, None, false).unwrap(),
            Speculation::Off
        );
        assert_eq!(
            server_default(None, Some(4), None, false)
                .unwrap()
                .max_draft(),
            4
        );
        for (spec, max, min) in [
            (Some("draft-simple"), None, None),
            (Some("x"), None, None),
            (None, Some(99), None),
            (Some("ngram"), Some(3), Some(4)),
        ] {
            let e = server_default(spec, max, min, false).unwrap_err();
            assert!(e.starts_with("--spec"), "{e}");
        }
    }
}
