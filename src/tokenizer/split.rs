//! Cutting special tokens out of text the way llama.cpp does for GGUF vocabularies.
//!
//! llama.cpp does not scan the text once for the leftmost special token. It takes the special
//! tokens one at a time, longest first, and cuts every occurrence of each out of whatever text
//! is still plain, left to right. The two orders differ when special tokens overlap in the text
//! (a shorter one starting before a longer one): llama.cpp keeps the longer one. A token marked
//! `lstrip` also removes the ASCII whitespace just before it, `rstrip` the whitespace just after
//! it, within the plain text it was cut from.
//!
//! The occurrences come from one Aho–Corasick pass that reports overlapping matches; they are
//! then accepted in llama.cpp's order, an occurrence only when all of its bytes are still plain.

use super::Special;
use aho_corasick::AhoCorasick;

/// A piece of the input: plain text (a byte range) or a special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(usize, usize),
    Token(u32),
}

/// What each byte of the text has become.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Byte {
    Plain,
    /// Whitespace a stripping token removed.
    Removed,
    /// Part of a special token's occurrence; the first byte carries the token.
    Start(u32),
    Inside,
}

/// The whitespace C's `isspace` accepts in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Cuts the special tokens of `scan` (an overlapping-match automaton over the texts of
/// `specials[index[p]]` for pattern `p`) out of `text`, in llama.cpp's order. `specials` is
/// sorted longest first, so pattern order by `index` is the acceptance order.
pub(crate) fn partition(
    text: &str,
    specials: &[Special],
    scan: &AhoCorasick,
    index: &[usize],
    out: &mut Vec<Piece>,
) {
    out.clear();
    if text.is_empty() {
        return;
    }
    // Occurrences per pattern, in order of start.
    let mut found: Vec<(usize, usize)> = scan
        .find_overlapping_iter(text)
        .map(|m| (m.pattern().as_usize(), m.start()))
        .collect();
    if found.is_empty() {
        out.push(Piece::Text(0, text.len()));
        return;
    }
    // llama.cpp's order: the special tokens longest first (their order in `specials`), each
    // one's occurrences left to right.
    found.sort_unstable_by_key(|&(p, start)| (index[p], start));
    let bytes = text.as_bytes();
    let mut state = vec![Byte::Plain; bytes.len()];
    for &(p, start) in &found {
        let sp = &specials[index[p]];
        let end = start + sp.text.len();
        if state[start..end].iter().any(|&b| b != Byte::Plain) {
            continue;
        }
        state[start] = Byte::Start(sp.id);
        state[start + 1..end].fill(Byte::Inside);
        if sp.lstrip {
            let mut i = start;
            while i > 0 && state[i - 1] == Byte::Plain && is_c_space(bytes[i - 1]) {
                i -= 1;
                state[i] = Byte::Removed;
            }
        }
        if sp.rstrip {
            let mut i = end;
            while i < bytes.len() && state[i] == Byte::Plain && is_c_space(bytes[i]) {
                state[i] = Byte::Removed;
                i += 1;
            }
        }
    }
    let mut i = 0;
    while i < bytes.len() {
        match state[i] {
            Byte::Plain => {
                let start = i;
                while i < bytes.len() && state[i] == Byte::Plain {
                    i += 1;
                }
                out.push(Piece::Text(start, i));
            }
            Byte::Start(id) => {
                out.push(Piece::Token(id));
                i += 1;
            }
            Byte::Removed | Byte::Inside => i += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aho_corasick::MatchKind;

    fn special(text: &str, id: u32, lstrip: bool, rstrip: bool) -> Special {
        Special {
            text: text.into(),
            id,
            user_defined: false,
            lstrip,
            rstrip,
        }
    }

    fn run(specials: &[Special], text: &str) -> Vec<Piece> {
        let index: Vec<usize> = (0..specials.len()).collect();
        let scan = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .build(specials.iter().map(|s| s.text.as_str()))
            .unwrap();
        let mut out = Vec::new();
        partition(text, specials, &scan, &index, &mut out);
        out
    }

    #[test]
    fn longer_tokens_are_cut_first() {
        // "yzw" is cut before "xy", although "xy" starts first.
        let sp = [
            special("yzw", 1, false, false),
            special("xy", 2, false, false),
        ];
        assert_eq!(
            run(&sp, "xyzw xy"),
            [
                Piece::Text(0, 1),
                Piece::Token(1),
                Piece::Text(4, 5),
                Piece::Token(2)
            ]
        );
    }

    #[test]
    fn stripping_removes_ascii_whitespace_only() {
        let sp = [special("<m>", 7, true, true)];
        assert_eq!(
            run(&sp, "a \t<m>\n b"),
            [Piece::Text(0, 1), Piece::Token(7), Piece::Text(8, 9)]
        );
        // U+3000 is not C whitespace.
        assert_eq!(
            run(&sp, "a\u{3000}<m>"),
            [Piece::Text(0, 4), Piece::Token(7)]
        );
        assert_eq!(run(&sp, "  <m>  "), [Piece::Token(7)]);
        assert_eq!(run(&sp, ""), []);
    }
}
