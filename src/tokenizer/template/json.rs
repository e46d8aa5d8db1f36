//! transformers' `tojson` filter: Python's `json.dumps`, which differs from minijinja's own
//! (no HTML escaping, Python's separators and float formatting, insertion-ordered keys).

use minijinja::value::{Kwargs, Value as JValue, ValueKind};
use minijinja::ErrorKind;
use std::fmt::Write as _;

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, each overridable by keyword (`indent` also
/// positionally).
pub(super) fn tojson(
    value: &JValue,
    indent: Option<JValue>,
    kwargs: Kwargs,
) -> std::result::Result<JValue, minijinja::Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<JValue>>("indent")?,
    };
    let indent: Option<String> = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let n = i64::try_from(v)?.max(0);
                if n > MAX_JSON as i64 {
                    return Err(too_long());
                }
                Some(" ".repeat(n as usize))
            }
        },
    };
    let separators: Option<JValue> = kwargs.get("separators")?;
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<JValue> = s.try_iter()?.collect();
            match (
                parts.first().and_then(JValue::as_str),
                parts.get(1).and_then(JValue::as_str),
            ) {
                (Some(a), Some(b)) if parts.len() == 2 => (a.to_owned(), b.to_owned()),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        // Python's defaults: ", " without indent, "," with it (lines end there).
        _ if indent.is_some() => (",".into(), ": ".into()),
        _ => (", ".into(), ": ".into()),
    };
    let json = Json {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    json.write(&mut out, value, 0)?;
    Ok(JValue::from_safe_string(out))
}

/// The longest JSON text `tojson` writes: the bound on a whole rendered prompt.
const MAX_JSON: usize = super::MAX_TEMPLATE_OUTPUT;

/// How deep `tojson` follows nested values: Python's default recursion limit, past which
/// `json.dumps` raises `RecursionError`.
const MAX_JSON_DEPTH: usize = 1000;

fn too_long() -> minijinja::Error {
    minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: the JSON text would pass {MAX_JSON} bytes"),
    )
}

/// Python's `json.dumps` settings.
struct Json {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

fn not_serializable(v: &JValue) -> minijinja::Error {
    minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: a {} is not JSON serializable", v.kind()),
    )
}

impl Json {
    fn newline(&self, out: &mut String, depth: usize) -> std::result::Result<(), minijinja::Error> {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                if out.len() + indent.len() > MAX_JSON {
                    return Err(too_long());
                }
                out.push_str(indent);
            }
        }
        Ok(())
    }

    fn write(
        &self,
        out: &mut String,
        v: &JValue,
        depth: usize,
    ) -> std::result::Result<(), minijinja::Error> {
        // A shared list is written as often as it is referenced, so a small value can stand
        // for an exponentially long text: the length is checked at every item.
        if out.len() > MAX_JSON {
            return Err(too_long());
        }
        if depth > MAX_JSON_DEPTH {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value nested deeper than {MAX_JSON_DEPTH} levels"),
            ));
        }
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&number(v)),
            ValueKind::String => self.string(out, v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<JValue> = v.try_iter()?.collect();
                self.container(out, depth, '[', ']', &items, |out, item, d| {
                    self.write(out, item, d)
                })?;
            }
            ValueKind::Map => {
                let obj = v.as_object().ok_or_else(|| not_serializable(v))?;
                let mut pairs: Vec<(JValue, JValue)> = obj
                    .try_iter_pairs()
                    .ok_or_else(|| not_serializable(v))?
                    .collect();
                if self.sort_keys {
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(out, depth, '{', '}', &pairs, |out, (k, val), d| {
                    let key = match k.kind() {
                        ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
                        ValueKind::None => "null".into(),
                        ValueKind::Bool | ValueKind::Number => {
                            let mut s = String::new();
                            self.write(&mut s, k, 0)?;
                            s
                        }
                        _ => {
                            return Err(minijinja::Error::new(
                                ErrorKind::InvalidOperation,
                                format!("tojson: keys must be strings, not {}", k.kind()),
                            ))
                        }
                    };
                    self.string(out, &key);
                    out.push_str(&self.key_sep);
                    self.write(out, val, d)
                })?;
            }
            _ => return Err(not_serializable(v)),
        }
        Ok(())
    }

    fn container<T>(
        &self,
        out: &mut String,
        depth: usize,
        open: char,
        close: char,
        items: &[T],
        mut each: impl FnMut(&mut String, &T, usize) -> std::result::Result<(), minijinja::Error>,
    ) -> std::result::Result<(), minijinja::Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            self.newline(out, depth + 1)?;
            each(out, item, depth + 1)?;
        }
        self.newline(out, depth)?;
        out.push(close);
        Ok(())
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{u:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A number as Python's `repr` (and so `json.dumps`) writes it: integers in full; floats in
/// the shortest form that reads back the same, with `.0` on whole numbers and an exponent
/// below 1e-4 or from 1e16 on.
fn number(v: &JValue) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    let Ok(x) = f64::try_from(v.clone()) else {
        return v.to_string();
    };
    py_float(x)
}

fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-tripping digits: "d.ddde±x".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!(
                "{sign}{digits}{}.0",
                "0".repeat(point as usize - digits.len())
            )
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        format!(
            "{sign}{first}{frac}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr() {
        for (x, s) in [
            (1.0, "1.0"),
            (18.5, "18.5"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (-2.5, "-2.5"),
            (123456789012345.6, "123456789012345.6"),
            (1e22, "1e+22"),
        ] {
            assert_eq!(py_float(x), s, "{x}");
        }
    }
}
