//! Reading Rust source as plain text for the layering check: comments, literals and test
//! items blanked out (offsets kept), and the small scanners the parser is built from.

/// `raw` with comments and string and char literals turned into spaces (newlines kept, so
/// that offsets and line numbers still match).
pub(super) fn blank_literals(raw: &str) -> String {
    let c: Vec<char> = raw.chars().collect();
    let mut blanked = vec![false; c.len()];
    let blank = |out: &mut Vec<bool>, from: usize, to: usize| {
        out[from..to.min(c.len())]
            .iter_mut()
            .for_each(|b| *b = true);
    };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let prev_ident = i > 0 && ident(c[i - 1]);
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            let end = (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len());
            blank(&mut blanked, i, end);
            i = end;
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < c.len() && depth > 0 {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut blanked, i, j);
            i = j;
        } else if (c[i] == 'r' || (c[i] == 'b' && c.get(i + 1) == Some(&'r'))) && !prev_ident {
            let mut j = i + if c[i] == 'b' { 2 } else { 1 };
            let hashes = (j..c.len()).take_while(|&k| c[k] == '#').count();
            j += hashes;
            if c.get(j) == Some(&'"') {
                let close: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let rest: String = c[j + 1..].iter().collect();
                let end = rest
                    .find(&close)
                    .map(|e| j + 1 + rest[..e].chars().count() + close.len())
                    .unwrap_or(c.len());
                blank(&mut blanked, i, end);
                i = end;
            } else {
                i += 1;
            }
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut blanked, i, j + 1);
            i = j + 1;
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            if c.get(i + 1) == Some(&'\\') {
                let end = (i + 2..c.len()).find(|&j| c[j] == '\'').unwrap_or(c.len());
                blank(&mut blanked, i, end + 1);
                i = end + 1;
            } else if c.get(i + 2) == Some(&'\'') {
                blank(&mut blanked, i, i + 3);
                i += 3;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    // A blanked character becomes as many spaces as it had bytes, so byte offsets still match.
    let mut out = String::with_capacity(raw.len());
    for (ch, gone) in c.iter().zip(blanked) {
        if gone && *ch != '\n' {
            out.extend(std::iter::repeat_n(' ', ch.len_utf8()));
        } else {
            out.push(*ch);
        }
    }
    out
}

/// `text` with every item under a `#[cfg(…test…)]` attribute turned into spaces.
pub(super) fn blank_tests(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    while let Some(k) = text[i..].find("#[cfg(") {
        let start = i + k;
        let end = matching_bracket(b, start + 1);
        let attr = &text[start..end];
        i = end;
        if find_word(attr, "test", 0).is_none() || find_word(attr, "not", 0).is_some() {
            continue;
        }
        // The item runs to its first `;` or through its first block.
        let mut j = end;
        while j < b.len() && b[j] != b';' && b[j] != b'{' {
            j += 1;
        }
        let item_end = if b.get(j) == Some(&b'{') {
            matching(b, j) + 1
        } else {
            j + 1
        };
        for byte in &mut out[start..item_end.min(b.len())] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
        i = item_end;
    }
    String::from_utf8(out).unwrap()
}

pub(super) fn find_word(text: &str, word: &str, from: usize) -> Option<usize> {
    let b = text.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = from;
    while let Some(k) = text.get(i..)?.find(word) {
        let at = i + k;
        let end = at + word.len();
        if (at == 0 || !is_ident(b[at - 1])) && (end >= b.len() || !is_ident(b[end])) {
            return Some(at);
        }
        i = end;
    }
    None
}

pub(super) fn ident_at(text: &str, i: usize) -> (String, usize) {
    let b = text.as_bytes();
    let mut j = i;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
        j += 1;
    }
    let name = &text[i..j];
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return (String::new(), i);
    }
    (name.to_string(), j)
}

pub(super) fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The offset of the `}` closing the `{` at `open`.
pub(super) fn matching(b: &[u8], open: usize) -> usize {
    let mut depth = 0;
    for (k, &c) in b.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    b.len()
}

/// The offset just past the `]` closing the `[` at `open`.
fn matching_bracket(b: &[u8], open: usize) -> usize {
    let mut depth = 0;
    for (k, &c) in b.iter().enumerate().skip(open) {
        match c {
            b'[' => depth += 1,
            b']' => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    b.len()
}

pub(super) fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}
