//! The paths a module names, read from its blanked text (see text.rs) for the layering
//! check: its `mod` declarations and `#[path]` attributes, the paths of its `use` trees, and
//! the `crate::…`, `super::…` and `self::…` paths written in its code.

use super::text::{find_word, ident_at, matching, skip_ws};

/// A `mod name;` or `mod name { … }` declaration: where it starts, and its body's byte range.
pub(super) struct ModDecl {
    pub(super) name: String,
    pub(super) at: usize,
    pub(super) body: Option<std::ops::Range<usize>>,
}

pub(super) fn mod_decls(text: &str) -> Vec<ModDecl> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = find_word(text, "mod", i) {
        i = at + 3;
        let (name, after) = ident_at(text, skip_ws(b, i));
        if name.is_empty() {
            continue;
        }
        let j = skip_ws(b, after);
        match b.get(j) {
            Some(b';') => out.push(ModDecl {
                name,
                at,
                body: None,
            }),
            Some(b'{') => {
                let end = matching(b, j);
                out.push(ModDecl {
                    name,
                    at,
                    body: Some(j + 1..end),
                });
                i = end;
            }
            _ => {}
        }
    }
    out
}

/// `#[path = "…"]` attributes: where each ends, and the path.
pub(super) fn path_attributes(raw: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(k) = raw[i..].find("#[path") {
        let start = i + k;
        let Some(end) = raw[start..].find(']').map(|e| start + e + 1) else {
            break;
        };
        let attr = &raw[start..end];
        if let (Some(q0), Some(q1)) = (attr.find('"'), attr.rfind('"')) {
            if q1 > q0 {
                out.push((end, attr[q0 + 1..q1].to_string()));
            }
        }
        i = end;
    }
    out
}

/// The `use` trees of `text`: where each starts, and each path it names, as segments.
pub(super) fn use_paths(text: &str) -> Vec<(usize, Vec<String>)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = find_word(text, "use", i) {
        let Some(end) = text[at..].find(';').map(|e| at + e) else {
            break;
        };
        i = end;
        if !b.get(at + 3).is_some_and(|c| c.is_ascii_whitespace()) {
            continue;
        }
        let tokens = tokenize(&text[at + 3..end]);
        for path in expand(&tokens) {
            out.push((at, path));
        }
    }
    out
}

/// `crate::…`, `super::…` and `self::…` paths written in code, outside `use` declarations.
pub(super) fn code_paths(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut without_uses = text.as_bytes().to_vec();
    let mut i = 0;
    while let Some(at) = find_word(text, "use", i) {
        let end = text[at..].find(';').map_or(text.len(), |e| at + e);
        without_uses[at..end].iter_mut().for_each(|c| {
            if *c != b'\n' {
                *c = b' '
            }
        });
        i = end.max(at + 3);
    }
    let text = String::from_utf8(without_uses).unwrap();
    let b = text.as_bytes();
    let mut out = Vec::new();
    for head in ["crate", "super", "self"] {
        let mut i = 0;
        while let Some(at) = find_word(&text, head, i) {
            i = at + head.len();
            if at > 0 && b[at - 1] == b'$' {
                continue; // `$crate` in a macro
            }
            if text[..at].trim_end().ends_with(" in") || text[..at].trim_end().ends_with("(in") {
                continue; // `pub(in crate::…)`
            }
            let mut segs = vec![head.to_string()];
            let mut j = i;
            loop {
                let k = skip_ws(b, j);
                if !text[k..].starts_with("::") {
                    break;
                }
                let (name, after) = ident_at(&text, skip_ws(b, k + 2));
                if name.is_empty() {
                    break;
                }
                segs.push(name);
                j = after;
            }
            if segs.len() > 1 {
                out.push((at, segs));
            }
        }
    }
    out
}

/// Tokens of a `use` tree: identifiers and `::`, `{`, `}`, `,`, `*`.
pub(super) fn tokenize(s: &str) -> Vec<String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_whitespace() {
            i += 1;
        } else if s[i..].starts_with("::") {
            out.push("::".into());
            i += 2;
        } else if b"{},*".contains(&b[i]) {
            out.push((b[i] as char).to_string());
            i += 1;
        } else {
            let (name, after) = ident_at(s, i);
            if name.is_empty() {
                i += 1;
            } else {
                out.push(name);
                i = after;
            }
        }
    }
    out
}

/// The paths a `use` tree names (`a::{b, c::d as e}` → `a::b`, `a::c::d`).
pub(super) fn expand(tokens: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for part in split_top(tokens) {
        let mut prefix = Vec::new();
        let mut k = 0;
        while k < part.len() {
            match part[k].as_str() {
                "::" => k += 1,
                "{" => {
                    let inner = &part[k + 1..part.len() - 1];
                    for mut sub in expand(inner) {
                        if sub == ["self"] {
                            sub.clear();
                        }
                        let mut p = prefix.clone();
                        p.append(&mut sub);
                        out.push(p);
                    }
                    prefix.clear();
                    break;
                }
                "as" => {
                    // `path as alias`: the alias is kept as the path's last two segments.
                    if let Some(alias) = part.get(k + 1) {
                        prefix.push("as".to_string());
                        prefix.push(alias.clone());
                    }
                    break;
                }
                seg => {
                    prefix.push(seg.to_string());
                    k += 1;
                }
            }
        }
        if !prefix.is_empty() {
            out.push(prefix);
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

/// A `use` path without its `as alias` ending.
pub(super) fn without_alias(segs: &[String]) -> &[String] {
    match segs.len() {
        n if n >= 2 && segs[n - 2] == "as" => &segs[..n - 2],
        _ => segs,
    }
}

/// Splits tokens at the commas outside braces.
pub(super) fn split_top(tokens: &[String]) -> Vec<&[String]> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, t) in tokens.iter().enumerate() {
        match t.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                out.push(&tokens[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    out.push(&tokens[start..]);
    out
}
