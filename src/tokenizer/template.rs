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
//! A template is untrusted input (it comes with the model file), so every render is bounded:
//! it may spend at most [`MAX_TEMPLATE_FUEL`] of minijinja's fuel (about one unit per
//! instruction run, per 64 bytes of data it creates and per two items the engine walks over
//! when it formats, compares or hashes a value, which bounds both its time and its memory),
//! and its output may take at most [`MAX_TEMPLATE_OUTPUT`] bytes. Past either bound the render
//! stops with [`Error::ChatTemplate`] saying which. Walks over values also stop at 1,000 levels
//! of nesting, as Python's do. The walks are charged by a patch to minijinja that qkv carries
//! (`third_party/minijinja/QKV-PATCH.md`).
//!
//! `tests/chat_templates.rs` renders every template in llama.cpp's `models/templates/` and
//! compares each with transformers' output (`tools/template_fixtures.py`).

mod clock;
mod json;

use crate::error::{Error, Result};
use minijinja::value::{Value as JValue, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::SystemTime;

/// The fuel one render may spend: minijinja charges about one unit per instruction, one per
/// 64 bytes of data the template creates (output, captured blocks, strings and lists built by
/// operators and filters) and one per two items it walks over, so this bounds a render's time
/// and its allocations (about 256 MB). A 5,000-turn ChatML conversation (1 MB of prompt)
/// renders within it.
pub const MAX_TEMPLATE_FUEL: u64 = 4_000_000;

/// Bytes a rendered prompt may take: several times what the longest context window of the
/// supported families (128k tokens, under 1 MB of text) holds. Fuel charges output at the
/// next instruction, so this also bounds what one instruction may print.
pub const MAX_TEMPLATE_OUTPUT: usize = 4 << 20;

/// Bytes a template's source may take: fifteen times the largest chat template in llama.cpp's
/// collection (16.7 KB). minijinja's parser bounds how deep brackets, unary operators and
/// blocks nest, but chains such as `x.a.b.c…`, `f()()…` or `1 + 1 + …` build a tree one level
/// per link that compiling and dropping walk recursively: this bound keeps them (128k links at
/// most) within the render thread's stack.
pub const MAX_TEMPLATE_SOURCE: usize = 256 << 10;

/// The stack of the thread a render runs on (see [`ChatTemplate::render`]).
const RENDER_STACK: usize = 64 << 20;

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
    fuel: u64,
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
            fuel: MAX_TEMPLATE_FUEL,
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

    /// Sets the fuel a render may spend, in place of [`MAX_TEMPLATE_FUEL`] (a server may want
    /// a tighter bound; the fuzz target uses one to catch work the fuel does not see).
    pub fn with_fuel(mut self, fuel: u64) -> ChatTemplate {
        self.fuel = fuel;
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
    /// message); also when the render spends more than its fuel ([`MAX_TEMPLATE_FUEL`] unless
    /// set otherwise) or writes more than [`MAX_TEMPLATE_OUTPUT`] bytes (a hostile or broken
    /// template looping for ever or building a huge prompt).
    pub fn render(&self, messages: &[Value], options: &ChatOptions) -> Result<String> {
        // The render recurses: minijinja's compiler once per link of a chain such as
        // `x.a.b…` (up to 128k links in MAX_TEMPLATE_SOURCE), its VM once per macro call or
        // include (up to its recursion limit), and its walks over values and `tojson` once per
        // level of nesting (up to 1,000). The deepest chain takes more stack than a caller's
        // thread may have (a test thread has 2 MB), so the render gets a thread of its own
        // whose stack holds it; the stack is reserved, and touched only as used.
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("qkv-chat-template".into())
                .stack_size(RENDER_STACK)
                .spawn_scoped(scope, || self.render_here(messages, options))
                .map_err(|e| Error::ChatTemplate {
                    template: self.name.clone(),
                    msg: format!("could not start the thread that renders it: {e}"),
                })?
                .join()
                // A panic in the template engine is a bug there, but the template is the
                // caller's input: it gets an error, never a crashed process.
                .unwrap_or_else(|panic| {
                    let msg = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Err(Error::ChatTemplate {
                        template: self.name.clone(),
                        msg: format!("the template engine panicked: {msg}"),
                    })
                })
        })
    }

    fn render_here(&self, messages: &[Value], options: &ChatOptions) -> Result<String> {
        let fail = |e: minijinja::Error| Error::ChatTemplate {
            template: self.name.clone(),
            msg: describe(&e),
        };
        if self.source.len() > MAX_TEMPLATE_SOURCE {
            return Err(Error::ChatTemplate {
                template: self.name.clone(),
                msg: format!(
                    "the template's source is {} bytes, past the {MAX_TEMPLATE_SOURCE} a chat \
                     template may take",
                    self.source.len()
                ),
            });
        }
        let source = generation_tags_as_blocks(&self.source);
        let env = environment(options.now.unwrap_or_else(SystemTime::now), self.fuel);
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
        let mut out = Bounded {
            bytes: Vec::new(),
            limit: MAX_TEMPLATE_OUTPUT,
            full: false,
        };
        match template.render_captured_to(JValue::from_pairs(ctx), &mut out) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::OutOfFuel => {
                return Err(Error::ChatTemplate {
                    template: self.name.clone(),
                    msg: format!(
                        "the render used up its budget of {} fuel (instructions run, data \
                         created and walked){}",
                        self.fuel,
                        e.line().map_or(String::new(), |l| format!(" at line {l}"))
                    ),
                })
            }
            Err(_) if out.full => {
                return Err(Error::ChatTemplate {
                    template: self.name.clone(),
                    msg: format!("the rendered text passed {MAX_TEMPLATE_OUTPUT} bytes"),
                })
            }
            Err(e) => return Err(fail(e)),
        }
        // minijinja writes whole `str`s, so the bytes are UTF-8; lossy only to avoid a panic.
        Ok(match String::from_utf8(out.bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }
}

/// The render's output, refusing writes that would take it past `limit` bytes (and then
/// `full`).
struct Bounded {
    bytes: Vec<u8>,
    limit: usize,
    full: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() > self.limit - self.bytes.len() {
            self.full = true;
            return Err(std::io::Error::other("the output bound was reached"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
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
        // The closer is searched after the opener: in `{%}` the `%` is the opener's.
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
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
/// The current UTC time formatted as Python's `datetime.strftime` formats it in the C locale:
/// what a template's `strftime_now(format)` returns, for callers that pass dates to templates
/// as variables (llama-server's `date_string`).
///
/// ```
/// let year = qkv::tokenizer::strftime_now("%Y");
/// assert_eq!(year.len(), 4);
/// ```
pub fn strftime_now(format: &str) -> String {
    clock::strftime(SystemTime::now(), format)
}

fn environment(now: SystemTime, fuel: u64) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(fuel));
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid"),
    );
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", json::tojson);
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
    env.add_function("strftime_now", move |format: &str| {
        clock::strftime(now, format)
    });
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: &[Value]) -> Result<String> {
        ChatTemplate::new("t", src).render(messages, &ChatOptions::default())
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
