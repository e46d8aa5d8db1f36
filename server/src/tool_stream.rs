//! A reply read while it is generated: its reasoning, its content and its tool calls, each
//! sent as soon as it cannot change any more. [`ReplyStream::update`] takes the whole text so
//! far and returns what is new since the last call: reasoning and content text, a call's
//! start (its function name, once the name is complete and names a known tool) and then its
//! arguments in fragments as the model writes them (whitespace outside strings dropped).
//! Text that may still turn out to be markup (the start of `<tool_call>`, a reply that opens
//! with `{`) is held back. [`ReplyStream::finish`] reads the whole reply with
//! [`parse_reply`] and sends what the stream had not, so that the pieces add up to the whole
//! reply's parts.
//!
//! ```
//! use qkv_server::tool_stream::{Piece, ReplyStream};
//! use qkv_server::tools::ToolFormat;
//!
//! let mut s = ReplyStream::new(ToolFormat::Hermes, vec!["get_weather".into()]);
//! let text = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os";
//! let got = s.update(text);
//! assert_eq!(got[0], Piece::Content("Sure.".into()));
//! assert_eq!(got[1], Piece::CallStart { index: 0, name: "get_weather".into() });
//! assert_eq!(got[2], Piece::CallArgs { index: 0, fragment: "{\"city\":\"Os".into() });
//! let (rest, reply) = s.finish(&format!("{text}lo\"}}}}\n</tool_call>"));
//! assert_eq!(rest, [Piece::CallArgs { index: 0, fragment: "lo\"}".into() }]);
//! assert_eq!(reply.calls[0].arguments, r#"{"city":"Oslo"}"#);
//! ```

use crate::tools::{parse_reply, Reply, ToolFormat};

/// A new piece of a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// More reasoning text.
    Reasoning(String),
    /// More content text.
    Content(String),
    /// Call `index` begins: its function's name.
    CallStart {
        /// The call's position in the reply.
        index: usize,
        /// The function's name.
        name: String,
    },
    /// More of call `index`'s arguments (JSON text).
    CallArgs {
        /// The call's position in the reply.
        index: usize,
        /// The next fragment.
        fragment: String,
    },
}

/// What can be said of a reply so far; each field only grows as the reply does.
#[derive(Default, Debug)]
struct Snapshot {
    reasoning: String,
    content: String,
    /// Calls whose name is known: (name, arguments so far).
    calls: Vec<(String, String)>,
}

/// A reply being streamed: what was sent of it so far.
#[derive(Debug)]
pub struct ReplyStream {
    format: ToolFormat,
    names: Vec<String>,
    sent: Snapshot,
}

const MARKERS: [&str; 2] = ["<tool_call>", "[TOOL_CALLS]"];

/// How many bytes at the end of `text` could start one of `words`.
fn held(text: &str, words: &[&str]) -> usize {
    words
        .iter()
        .map(|w| {
            (1..w.len().min(text.len() + 1))
                .rev()
                .find(|&n| {
                    text.is_char_boundary(text.len() - n) && w.starts_with(&text[text.len() - n..])
                })
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// Where a JSON value starting at `s[i..]` ends (the index after it); `None` while it may
/// still go on.
fn value_end(s: &[u8], i: usize) -> Option<usize> {
    match s.get(i)? {
        b'"' => string_end(s, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < s.len() {
                match s[j] {
                    b'"' => {
                        j = string_end(s, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let n = s[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\t' | b'\r'))?;
            Some(i + n)
        }
    }
}

/// The index after the string that starts at `s[i]` (a quote).
fn string_end(s: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < s.len() {
        match s[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && s[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// An object's members so far: (key, value start, value end when complete); the index
/// after the object once it is closed; `Err` when it is not an object.
type Members = (Vec<(String, usize, Option<usize>)>, Option<usize>);

fn scan_object(s: &[u8], start: usize) -> Result<Members, ()> {
    let mut members = Vec::new();
    let mut i = skip_ws(s, start);
    if i >= s.len() {
        return Ok((members, None));
    }
    if s[i] != b'{' {
        return Err(());
    }
    i += 1;
    loop {
        i = skip_ws(s, i);
        match s.get(i) {
            None => return Ok((members, None)),
            Some(b'}') => return Ok((members, Some(i + 1))),
            Some(b',') => {
                i += 1;
                continue;
            }
            Some(b'"') => {}
            Some(_) => return Err(()),
        }
        let Some(kend) = string_end(s, i) else {
            return Ok((members, None));
        };
        let key: String = serde_json::from_slice(&s[i..kend]).map_err(|_| ())?;
        i = skip_ws(s, kend);
        match s.get(i) {
            None => return Ok((members, None)),
            Some(b':') => {}
            Some(_) => return Err(()),
        }
        i = skip_ws(s, i + 1);
        if i >= s.len() {
            return Ok((members, None));
        }
        let end = value_end(s, i);
        members.push((key, i, end));
        match end {
            Some(e) => i = e,
            None => return Ok((members, None)),
        }
    }
}

/// Array elements so far: (start, end when complete), and the index after the array.
type Items = (Vec<(usize, Option<usize>)>, Option<usize>);

fn scan_array(s: &[u8], start: usize) -> Result<Items, ()> {
    let mut items = Vec::new();
    let mut i = skip_ws(s, start);
    if i >= s.len() {
        return Ok((items, None));
    }
    if s[i] != b'[' {
        return Err(());
    }
    i += 1;
    loop {
        i = skip_ws(s, i);
        match s.get(i) {
            None => return Ok((items, None)),
            Some(b']') => return Ok((items, Some(i + 1))),
            Some(b',') => {
                i += 1;
                continue;
            }
            Some(_) => {}
        }
        let end = value_end(s, i);
        items.push((i, end));
        match end {
            Some(e) => i = e,
            None => return Ok((items, None)),
        }
    }
}

/// JSON text without the whitespace outside strings; a prefix of a value gives a prefix of
/// the value's result.
fn minify(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in raw.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if !c.is_whitespace() {
            if c == '"' {
                in_string = true;
            }
            out.push(c);
        }
    }
    out
}

/// A call's (name, arguments so far) once its name is known, and the index after it.
type CallScan = (Option<(String, String)>, Option<usize>);

/// What can be said of a call object at `s[start..]`: its name (once complete), its
/// arguments so far, and the index after the object. `Err` when it is not a call.
fn scan_call(text: &str, start: usize, names: &[String]) -> Result<CallScan, ()> {
    let s = text.as_bytes();
    let (members, end) = scan_object(s, start)?;
    let mut name = None;
    let mut args = String::new();
    for (key, vs, ve) in &members {
        match key.as_str() {
            "name" => {
                if let Some(ve) = ve {
                    let n: String = serde_json::from_slice(&s[*vs..*ve]).map_err(|_| ())?;
                    if !names.contains(&n) {
                        return Err(());
                    }
                    name = Some(n);
                }
            }
            // Arguments written as a JSON string are sent whole at the end.
            "arguments" | "parameters" if s[*vs] != b'"' => {
                args = minify(&text[*vs..ve.unwrap_or(s.len())]);
            }
            _ => {}
        }
    }
    Ok((name.map(|n| (n, args)), end))
}

/// The calls in `text` from `start`, a format's call objects: for the JSON formats, a list of
/// call objects (Llama 3's, `;`-separated), or `{"tool_calls": […]}` / `{"tool_call": {…}}`.
fn json_calls(
    text: &str,
    start: usize,
    names: &[String],
    out: &mut Vec<(String, String)>,
) -> Result<(), ()> {
    let s = text.as_bytes();
    let mut i = start;
    loop {
        i = skip_ws(s, i);
        if i < s.len() && s[i] == b';' {
            i = skip_ws(s, i + 1);
        }
        if i >= s.len() {
            return Ok(());
        }
        let (members, end) = scan_object(s, i)?;
        match members.first().map(|m| m.0.as_str()) {
            Some("tool_calls") => {
                let (_, vs, _) = members[0];
                let (items, _) = scan_array(s, vs)?;
                for (is, _) in items {
                    let (call, _) = scan_call(text, is, names)?;
                    match call {
                        Some(c) => out.push(c),
                        None => return Ok(()),
                    }
                }
            }
            Some("tool_call") => {
                let (call, _) = scan_call(text, members[0].1, names)?;
                out.extend(call);
            }
            _ => {
                let (call, _) = scan_call(text, i, names)?;
                out.extend(call);
            }
        }
        match end {
            Some(e) => i = e,
            None => return Ok(()),
        }
    }
}

impl ReplyStream {
    /// A stream of a reply in `format` that may call the functions `names` (none: only
    /// reasoning and content).
    pub fn new(format: ToolFormat, names: Vec<String>) -> ReplyStream {
        ReplyStream {
            format,
            names,
            sent: Snapshot::default(),
        }
    }

    /// What can be said of `text`, a reply that may still go on.
    fn snapshot(&self, text: &str) -> Snapshot {
        let mut snap = Snapshot::default();
        let t = text.trim_start();
        if t.is_empty() || ("<think>".starts_with(t) && t.len() < "<think>".len()) {
            return snap;
        }
        let rest = if let Some(body) = t.strip_prefix("<think>") {
            match body.find("</think>") {
                Some(end) => {
                    snap.reasoning = body[..end].trim().to_owned();
                    &body[end + "</think>".len()..]
                }
                None => {
                    let keep = &body[..body.len() - held(body, &["</think>"])];
                    snap.reasoning = keep.trim().to_owned();
                    return snap;
                }
            }
        } else if let Some(end) = t.find("</think>") {
            snap.reasoning = t[..end].trim().to_owned();
            &t[end + "</think>".len()..]
        } else {
            t
        };
        // Text outside calls, with leading whitespace dropped and trailing whitespace held.
        let mut content = String::new();
        let push = |content: &mut String, piece: &str| content.push_str(piece);
        if self.names.is_empty() {
            push(&mut content, rest);
            snap.content = content.trim().to_owned();
            return snap;
        }
        let lead = rest.trim_start();
        if lead.starts_with('{')
            || lead.starts_with("<|python_tag|>")
            || "<|python_tag|>".starts_with(lead)
        {
            // A reply of bare JSON calls: nothing is content until the end.
            let body = lead.strip_prefix("<|python_tag|>").unwrap_or(lead);
            let start = text.len() - body.len();
            json_calls(text, start, &self.names, &mut snap.calls).ok();
            return snap;
        }
        let s = text.as_bytes();
        let mut pos = text.len() - rest.len();
        loop {
            let next = MARKERS
                .iter()
                .filter_map(|m| text[pos..].find(m).map(|at| (pos + at, *m)))
                .min();
            let Some((at, marker)) = next else {
                let tail = &text[pos..];
                push(&mut content, &tail[..tail.len() - held(tail, &MARKERS)]);
                break;
            };
            push(&mut content, &text[pos..at]);
            let mut i = at + marker.len();
            if marker == "<tool_call>" {
                match scan_call(text, i, &self.names) {
                    Ok((call, end)) => {
                        snap.calls.extend(call);
                        let Some(e) = end else { break };
                        i = skip_ws(s, e);
                        let close = "</tool_call>";
                        if text[i..].starts_with(close) {
                            pos = i + close.len();
                        } else if close.starts_with(&text[i..]) {
                            break;
                        } else {
                            pos = i;
                        }
                    }
                    Err(()) => break,
                }
            } else {
                // Mistral: a list of calls, or `name[ARGS]{…}` pieces.
                i = skip_ws(s, i);
                if i >= s.len() {
                    break;
                }
                if s[i] == b'[' {
                    if let Ok((items, _)) = scan_array(s, i) {
                        for (is, _) in items {
                            match scan_call(text, is, &self.names) {
                                Ok((Some(c), _)) => snap.calls.push(c),
                                _ => break,
                            }
                        }
                    }
                } else if let Some(a) = text[i..].find("[ARGS]") {
                    let name = text[i..i + a].trim().to_owned();
                    if self.names.contains(&name) {
                        let vs = skip_ws(s, i + a + "[ARGS]".len());
                        let ve = if vs < s.len() { value_end(s, vs) } else { None };
                        let args = if vs < s.len() {
                            minify(&text[vs..ve.unwrap_or(s.len())])
                        } else {
                            String::new()
                        };
                        snap.calls.push((name, args));
                    }
                }
                break;
            }
        }
        snap.content = content.trim().to_owned();
        snap
    }

    /// The pieces that take the sent reply to `next`; those that do not extend what was sent
    /// are dropped.
    fn advance(&mut self, next: Snapshot) -> Vec<Piece> {
        let mut out = Vec::new();
        let grow = |sent: &mut String, now: &str| -> Option<String> {
            let more = now.strip_prefix(sent.as_str())?;
            if more.is_empty() {
                return None;
            }
            sent.push_str(more);
            Some(more.to_owned())
        };
        if let Some(r) = grow(&mut self.sent.reasoning, &next.reasoning) {
            out.push(Piece::Reasoning(r));
        }
        if let Some(c) = grow(&mut self.sent.content, &next.content) {
            out.push(Piece::Content(c));
        }
        for (index, (name, args)) in next.calls.into_iter().enumerate() {
            if index == self.sent.calls.len() {
                out.push(Piece::CallStart {
                    index,
                    name: name.clone(),
                });
                self.sent.calls.push((name.clone(), String::new()));
            }
            if self.sent.calls[index].0 != name {
                break;
            }
            if let Some(f) = grow(&mut self.sent.calls[index].1, &args) {
                out.push(Piece::CallArgs { index, fragment: f });
            }
        }
        out
    }

    /// The new pieces of `text`, the whole reply so far.
    pub fn update(&mut self, text: &str) -> Vec<Piece> {
        let next = self.snapshot(text);
        self.advance(next)
    }

    /// The last pieces of `text`, the whole reply, read with [`parse_reply`], and that reply.
    pub fn finish(&mut self, text: &str) -> (Vec<Piece>, Reply) {
        let reply = parse_reply(self.format, text, &self.names);
        let snap = Snapshot {
            reasoning: reply.reasoning.clone().unwrap_or_default(),
            content: reply.content.clone(),
            calls: reply
                .calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect(),
        };
        (self.advance(snap), reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::parse_reply;

    /// Streams `text` token by token (split into pieces of `step` characters) and checks that
    /// the pieces add up to the whole reply, and that each call's name comes before its
    /// arguments, which arrive in more than one fragment when `fragments`.
    fn check(format: ToolFormat, text: &str, step: usize, fragments: bool) {
        let names = vec!["get_weather".to_owned(), "search".to_owned()];
        let mut s = ReplyStream::new(format, names.clone());
        let chars: Vec<char> = text.chars().collect();
        let mut pieces = Vec::new();
        let mut so_far = String::new();
        for chunk in chars.chunks(step) {
            so_far.extend(chunk);
            pieces.extend(s.update(&so_far));
        }
        let (last, reply) = s.finish(text);
        let streamed_before_end = pieces.len();
        pieces.extend(last);
        let whole = parse_reply(format, text, &names);
        assert_eq!(reply, whole);
        let mut reasoning = String::new();
        let mut content = String::new();
        let mut calls: Vec<(String, String, usize)> = Vec::new();
        for p in &pieces {
            match p {
                Piece::Reasoning(r) => reasoning.push_str(r),
                Piece::Content(c) => content.push_str(c),
                Piece::CallStart { index, name } => {
                    assert_eq!(*index, calls.len());
                    calls.push((name.clone(), String::new(), 0));
                }
                Piece::CallArgs { index, fragment } => {
                    calls[*index].1.push_str(fragment);
                    calls[*index].2 += 1;
                }
            }
        }
        assert_eq!(
            reasoning,
            whole.reasoning.clone().unwrap_or_default(),
            "{text}"
        );
        assert_eq!(content, whole.content, "{text}");
        assert_eq!(calls.len(), whole.calls.len(), "{text}: {pieces:?}");
        for (c, w) in calls.iter().zip(&whole.calls) {
            assert_eq!(c.0, w.name);
            assert_eq!(c.1, w.arguments, "{text}");
            if fragments {
                assert!(c.2 > 1, "arguments in one piece: {pieces:?}");
            }
        }
        if fragments {
            assert!(streamed_before_end > 0);
        }
    }

    #[test]
    fn every_format_streams_its_calls_in_fragments() {
        let args = r#"{"city": "Oslo", "days": [1, 2], "unit": "celsius"}"#;
        for (format, text) in [
            (
                ToolFormat::Hermes,
                format!("<think>\nLook it up.\n</think>\nOne moment.\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>\n<tool_call>\n{{\"name\": \"search\", \"arguments\": {{\"q\": \"a b\"}}}}\n</tool_call>"),
            ),
            (
                ToolFormat::Generic,
                format!("{{\"tool_calls\": [{{\"name\": \"get_weather\", \"arguments\": {args}}}, {{\"name\": \"search\", \"arguments\": {{\"q\": \"x\"}}}}]}}"),
            ),
            (
                ToolFormat::Llama3,
                format!("<|python_tag|>{{\"name\": \"get_weather\", \"parameters\": {args}}}"),
            ),
            (
                ToolFormat::Mistral,
                format!("[TOOL_CALLS][{{\"name\": \"get_weather\", \"arguments\": {args}}}]"),
            ),
            (ToolFormat::Mistral, format!("[TOOL_CALLS]get_weather[ARGS]{args}")),
        ] {
            for step in [1, 3, 7] {
                check(format, &text, step, true);
            }
        }
    }

    #[test]
    fn text_that_only_looks_like_a_call_stays_content() {
        for text in [
            "Plain text, no call.",
            "  Text with < and [ and {braces}  ",
            "<tool_call>\n{\"name\": \"unknown\", \"arguments\": {}}\n</tool_call>",
            "{\"answer\": 42}",
            "<think>only reasoning, cut",
        ] {
            for step in [1, 4] {
                check(ToolFormat::Hermes, text, step, false);
                check(ToolFormat::Generic, text, step, false);
            }
        }
    }
}
