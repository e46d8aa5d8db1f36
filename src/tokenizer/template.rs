//! Chat templates: a model's Jinja `chat_template`, rendered the way Hugging Face
//! transformers' `apply_chat_template(..., tokenize=False)` renders it.
//!
//! transformers runs Jinja2 in a sandbox with `trim_blocks` and `lstrip_blocks`, the
//! `loopcontrols` extension (`break`, `continue`) and a `{% generation %}` tag, and adds
//! `raise_exception`, `strftime_now`, `namespace`, `dict` and its own `tojson` (Python's
//! `json.dumps`: no HTML escaping, `ensure_ascii=False`, `indent`, `separators`, `sort_keys`).
//! The template sees `messages`, `tools`, `documents` (None unless given),
//! `add_generation_prompt`, the tokenizer's `bos_token` and `eos_token`, and any extra
//! variables. Here the same runs on [minijinja], with minijinja-contrib's `pycompat` for the
//! Python string and dict methods templates call (`.strip()`, `.split()`, `.items()`, …).
//!
//! `tests/chat_templates.rs` renders every template in llama.cpp's `models/templates/` and
//! compares each with transformers' output (`tools/template_fixtures.py`).

use crate::error::{Error, Result};
use minijinja::value::{Kwargs, Value as JValue, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// What a chat template is rendered with besides the messages.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    /// End with the header of an assistant turn, for the model to write it.
    pub add_generation_prompt: bool,
    /// Tool (function) schemas, as transformers' `tools`: usually
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    /// `None` renders `tools` as none, as transformers does.
    pub tools: Option<Vec<Value>>,
    /// More variables for the template, as transformers' extra keyword arguments
    /// (`enable_thinking`, `reasoning_effort`, …). They override the defaults of the same name.
    pub extra: Map<String, Value>,
    /// The time `strftime_now` reports (UTC); `None` for the current time. Set it to render the
    /// same prompt on another day.
    pub now: Option<SystemTime>,
}

/// A Jinja chat template and the special tokens it is rendered with.
///
/// ```
/// use qkv::tokenizer::{ChatOptions, ChatTemplate};
/// use serde_json::json;
///
/// let t = ChatTemplate::new(
///     "example",
///     "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content.strip() }}\n\
///      {% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}",
/// )
/// .with_special_tokens(Some("<s>"), Some("</s>"));
/// let messages = [json!({"role": "user", "content": " Hi! "})];
/// let opts = ChatOptions { add_generation_prompt: true, ..Default::default() };
/// assert_eq!(t.render(&messages, &opts)?, "<s>[user] Hi!\n[assistant] ");
///
/// // Errors name the template and carry minijinja's message.
/// let bad = ChatTemplate::new("broken", "{% if %}");
/// let err = bad.render(&messages, &opts).unwrap_err();
/// assert!(err.to_string().contains("broken"), "{err}");
/// # Ok::<(), qkv::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    name: String,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

/// ChatML, for a model that has no template of its own but whose vocabulary has the markers.
const CHATML: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

impl ChatTemplate {
    /// A template named `name` (shown in errors: the file and key it came from) with Jinja
    /// source `source`, and no special tokens.
    pub fn new(name: impl Into<String>, source: impl Into<String>) -> ChatTemplate {
        ChatTemplate {
            name: name.into(),
            source: source.into(),
            bos_token: None,
            eos_token: None,
        }
    }

    /// Plain ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
    /// `<|im_start|>assistant\n` with `add_generation_prompt`.
    pub fn chatml() -> ChatTemplate {
        ChatTemplate::new("built-in ChatML", CHATML)
    }

    /// Sets the `bos_token` and `eos_token` the template sees (undefined when `None`).
    pub fn with_special_tokens(mut self, bos: Option<&str>, eos: Option<&str>) -> ChatTemplate {
        self.bos_token = bos.map(str::to_owned);
        self.eos_token = eos.map(str::to_owned);
        self
    }

    /// The template's name, as given to [`ChatTemplate::new`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (objects with at least `role` and `content`; anything else a template
    /// reads, such as `tool_calls`, passes through) with `options`.
    ///
    /// [`Error::ChatTemplate`] with minijinja's message when the template does not compile,
    /// fails while rendering, or calls `raise_exception` (a template refusing, say, a system
    /// message).
    pub fn render(&self, messages: &[Value], options: &ChatOptions) -> Result<String> {
        let fail = |e: minijinja::Error| Error::ChatTemplate {
            template: self.name.clone(),
            msg: describe(&e),
        };
        let source = generation_tags_as_blocks(&self.source);
        let env = environment(options.now.unwrap_or_else(SystemTime::now));
        let template = env
            .template_from_named_str(&self.name, &source)
            .map_err(fail)?;
        let mut ctx: Vec<(String, JValue)> = vec![
            // Messages with a None value lose that key, as transformers' normalization does.
            (
                "messages".into(),
                messages.iter().map(message_value).collect(),
            ),
            (
                "tools".into(),
                match &options.tools {
                    Some(t) => t.iter().map(to_value).collect(),
                    None => JValue::from(()),
                },
            ),
            ("documents".into(), JValue::from(())),
            (
                "add_generation_prompt".into(),
                JValue::from(options.add_generation_prompt),
            ),
        ];
        for (key, token) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ] {
            if let Some(t) = token {
                ctx.push((key.into(), JValue::from(t.as_str())));
            }
        }
        for (key, value) in &options.extra {
            ctx.retain(|(k, _)| k != key);
            ctx.push((key.clone(), to_value(value)));
        }
        template.render(JValue::from_pairs(ctx)).map_err(fail)
    }
}

/// minijinja's message with the template line it points at, and the chain of causes.
fn describe(e: &minijinja::Error) -> String {
    let mut msg = match (e.kind(), e.detail()) {
        // raise_exception's message is the template's own words.
        (ErrorKind::InvalidOperation, Some(detail)) if e.name().is_some() => detail.to_owned(),
        _ => e.to_string(),
    };
    if let Some(line) = e.line() {
        if !msg.contains("line") {
            let _ = write!(msg, " (line {line})");
        }
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let _ = write!(msg, ": {c}");
        cause = c.source();
    }
    msg
}

/// transformers' `{% generation %}…{% endgeneration %}` marks the assistant's text (for
/// training masks) and renders its body unchanged. minijinja has no such tag, so each becomes
/// an always-true `if` block with the same whitespace control, which renders identically.
fn generation_tags_as_blocks(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            rest = tag;
            break;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => write!(out, "{{%{lead} if true {trail}%}}").unwrap_or(()),
            "endgeneration" => write!(out, "{{%{lead} endif {trail}%}}").unwrap_or(()),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// The environment transformers sets up, on minijinja.
fn environment(now: SystemTime) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid"),
    );
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    // Jinja2's type tests ask Python's protocols: a string or a mapping has a length and
    // items, so it is a sequence; undefined iterates (as empty); a bool is a number. A
    // template writing `tools is iterable and tools | length > 0` relies on None failing.
    env.add_test("iterable", |v: &JValue| {
        v.is_undefined()
            || matches!(
                v.kind(),
                ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
            )
    });
    env.add_test("sequence", |v: &JValue| {
        v.is_undefined()
            || matches!(
                v.kind(),
                ValueKind::String | ValueKind::Seq | ValueKind::Map
            )
    });
    env.add_test("number", |v: &JValue| {
        matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
    });
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<JValue, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_function("strftime_now", move |format: &str| strftime(now, format));
    env
}

/// A message as the template sees it: a JSON object, keys whose value is null left out
/// (transformers drops them, so `message.content is defined` is false for `content: null`).
fn message_value(m: &Value) -> JValue {
    match m {
        Value::Object(map) => JValue::from_pairs(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.as_str(), to_value(v))),
        ),
        other => to_value(other),
    }
}

/// A JSON value as a template value; objects keep their key order.
pub(crate) fn to_value(v: &Value) -> JValue {
    match v {
        Value::Null => JValue::from(()),
        Value::Bool(b) => JValue::from(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => JValue::from(i),
            (None, Some(u)) => JValue::from(u),
            _ => JValue::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => JValue::from(s.as_str()),
        Value::Array(items) => items.iter().map(to_value).collect(),
        Value::Object(map) => {
            JValue::from_pairs(map.iter().map(|(k, v)| (k.as_str(), to_value(v))))
        }
    }
}

// ------------------------------------------------------------------------------- tojson

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, each overridable by keyword (`indent` also
/// positionally).
fn tojson(
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
            None => Some(" ".repeat(i64::try_from(v)?.max(0) as usize)),
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
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write(
        &self,
        out: &mut String,
        v: &JValue,
        depth: usize,
    ) -> std::result::Result<(), minijinja::Error> {
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
            self.newline(out, depth + 1);
            each(out, item, depth + 1)?;
        }
        self.newline(out, depth);
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

// ------------------------------------------------------------------------- strftime_now

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Calendar fields of a UTC time.
struct Civil {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: usize, // 0 = Monday
    yday: u32,      // 1..=366
}

fn civil(t: SystemTime) -> Civil {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64) - 1,
    };
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400) as u32;
    // Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[month as usize - 1] + day + u32::from(leap && month > 2);
    Civil {
        year,
        month,
        day,
        hour: rem / 3600,
        minute: rem / 60 % 60,
        second: rem % 60,
        weekday: (days + 3).rem_euclid(7) as usize, // 1970-01-01 was a Thursday
        yday,
    }
}

/// Python's `datetime.strftime` for the C directives that do not depend on the locale beyond
/// English names; other `%x` pass through unchanged, as glibc leaves them.
fn strftime(now: SystemTime, format: &str) -> String {
    let c = civil(now);
    let hour12 = match c.hour % 12 {
        0 => 12,
        h => h,
    };
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match d {
            'Y' => write!(out, "{}", c.year),
            'y' => write!(out, "{:02}", c.year.rem_euclid(100)),
            'm' => write!(out, "{:02}", c.month),
            'd' => write!(out, "{:02}", c.day),
            'e' => write!(out, "{:2}", c.day),
            'H' => write!(out, "{:02}", c.hour),
            'I' => write!(out, "{hour12:02}"),
            'M' => write!(out, "{:02}", c.minute),
            'S' => write!(out, "{:02}", c.second),
            'p' => write!(out, "{}", if c.hour < 12 { "AM" } else { "PM" }),
            'j' => write!(out, "{:03}", c.yday),
            'B' => write!(out, "{}", MONTHS[c.month as usize - 1]),
            'b' | 'h' => write!(out, "{}", &MONTHS[c.month as usize - 1][..3]),
            'A' => write!(out, "{}", DAYS[c.weekday]),
            'a' => write!(out, "{}", &DAYS[c.weekday][..3]),
            'u' => write!(out, "{}", c.weekday + 1),
            'w' => write!(out, "{}", (c.weekday + 1) % 7),
            'F' => write!(out, "{}-{:02}-{:02}", c.year, c.month, c.day),
            'T' => write!(out, "{:02}:{:02}:{:02}", c.hour, c.minute, c.second),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: &[Value]) -> Result<String> {
        ChatTemplate::new("t", src).render(messages, &ChatOptions::default())
    }

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

    #[test]
    fn civil_dates() {
        let at = |s: u64| UNIX_EPOCH + std::time::Duration::from_secs(s);
        assert_eq!(
            strftime(at(0), "%Y-%m-%d %H:%M:%S %a %j"),
            "1970-01-01 00:00:00 Thu 001"
        );
        // 2024-02-29 12:34:56 UTC, a leap day (Thursday).
        assert_eq!(
            strftime(at(1_709_210_096), "%d %b %Y|%B %d, %Y|%A|%I %p|%j|%%"),
            "29 Feb 2024|February 29, 2024|Thursday|12 PM|060|%"
        );
        assert_eq!(
            strftime(at(1_738_919_103), "%d %b %Y %H:%M:%S"),
            "07 Feb 2025 09:05:03"
        );
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let m = [json!({"role": "user", "content": "é \"q\" <b>\n", "n": [1, 2.5, null, true]})];
        let out = render("{{ messages[0] | tojson }}", &m).unwrap();
        assert_eq!(
            out,
            r#"{"role": "user", "content": "é \"q\" <b>\n", "n": [1, 2.5, null, true]}"#
        );
        let out = render("{{ messages[0].n | tojson(indent=2) }}", &m).unwrap();
        assert_eq!(out, "[\n  1,\n  2.5,\n  null,\n  true\n]");
        let out = render(
            "{{ messages[0] | tojson(separators=(',', ':'), sort_keys=true, ensure_ascii=true) }}",
            &m,
        )
        .unwrap();
        assert_eq!(
            out,
            r#"{"content":"\u00e9 \"q\" <b>\n","n":[1,2.5,null,true],"role":"user"}"#
        );
        assert_eq!(
            render("{{ {} | tojson }}{{ [] | tojson(indent=4) }}", &m).unwrap(),
            "{}[]"
        );
    }

    #[test]
    fn generation_tags_render_their_body() {
        let src = "a\n{%- generation -%}\n b {{ 1 }} \n{%- endgeneration %}\nc";
        assert_eq!(render(src, &[]).unwrap(), "ab 1c");
        assert_eq!(
            generation_tags_as_blocks("x{% if y %}{% endif %}"),
            "x{% if y %}{% endif %}"
        );
    }

    #[test]
    fn errors_name_the_template_and_carry_the_message() {
        let m = [json!({"role": "system", "content": "x"})];
        let t = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}";
        let err = ChatTemplate::new("model.gguf", t)
            .render(&m, &ChatOptions::default())
            .unwrap_err();
        match &err {
            Error::ChatTemplate { template, msg } => {
                assert_eq!(template, "model.gguf");
                assert!(msg.contains("System role not supported"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        let err = render("{% for %}", &m).unwrap_err();
        assert!(matches!(err, Error::ChatTemplate { .. }), "{err}");
        assert!(err.to_string().contains("syntax error"), "{err}");
        let err = render("{{ messages[0].nope.deeper }}", &m).unwrap_err();
        assert!(err.to_string().contains("undefined"), "{err}");
    }

    /// Jinja2's answers (3.1.6, in transformers' sandbox) for each test on none, undefined,
    /// a string, a list, a mapping, an int, a float and a bool.
    #[test]
    fn type_tests_answer_as_jinja2() {
        let table = [
            ("iterable", "FTTTTFFF"),
            ("sequence", "FTTTTFFF"),
            ("mapping", "FFFFTFFF"),
            ("string", "FFTFFFFF"),
            ("number", "FFFFFTTT"),
            ("integer", "FFFFFTFF"),
            ("float", "FFFFFFTF"),
            ("boolean", "FFFFFFFT"),
            ("none", "TFFFFFFF"),
            ("defined", "TFTTTTTT"),
            ("true", "FFFFFFFT"),
            ("false", "FFFFFFFF"),
        ];
        let values = [
            "none",
            "undefined_name",
            "'ab'",
            "[1]",
            "{'a': 1}",
            "1",
            "1.5",
            "true",
        ];
        for (test, want) in table {
            let got: String = values
                .iter()
                .map(|v| {
                    let src = format!("{{{{ ({v}) is {test} }}}}");
                    match render(&src, &[]).unwrap().as_str() {
                        "True" => 'T',
                        "False" => 'F',
                        other => panic!("{src}: {other}"),
                    }
                })
                .collect();
            assert_eq!(got, want, "is {test} on {values:?}");
        }
    }

    #[test]
    fn context_matches_transformers() {
        let m = [json!({"role": "user", "content": "  hi  ", "tool_calls": null})];
        let t = "{{ tools is none }} {{ documents is none }} {{ bos_token is defined }} \
                 {{ messages[0].tool_calls is defined }} [{{ messages[0].content.strip() }}] \
                 {{ messages[0].content.split() }} {{ none }} {{ true }}";
        assert_eq!(
            render(t, &m).unwrap(),
            "True True False False [hi] ['hi'] None True"
        );
        let opts = ChatOptions {
            extra: [("enable_thinking".to_string(), json!(false))]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let out = ChatTemplate::new("t", "{{ enable_thinking }}{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}{% set ns = namespace(x=1) %}{% set ns.x = 2 %}{{ ns.x }}")
            .render(&m, &opts)
            .unwrap();
        assert_eq!(out, "False0122");
    }
}
