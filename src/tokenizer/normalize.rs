//! Normalization: what happens to text before it is pre-tokenized (Hugging Face's
//! normalizers; for GGUF files, the fixed steps of each tokenizer model).

use regex_syntax::hir::{Class, HirKind};
use std::borrow::Cow;
use std::sync::OnceLock;
use unicode_normalization::UnicodeNormalization;

/// Hugging Face's `BertNormalizer` options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bert {
    /// Drop NUL, U+FFFD and control/format/private-use characters; every whitespace becomes a
    /// space.
    pub clean_text: bool,
    /// Put spaces around CJK ideographs, so that each is a word.
    pub chinese_chars: bool,
    /// Decompose (NFD) and drop non-spacing marks.
    pub strip_accents: bool,
    /// Lowercase, character by character.
    pub lowercase: bool,
}

/// One normalization step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Bert(Bert),
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
    Lowercase,
    /// NFD, then non-spacing marks dropped.
    StripAccents,
    /// Every occurrence of the first string replaced by the second.
    Replace(String, String),
    /// The string put before every non-empty text (each text between special tokens).
    Prepend(String),
    /// Hugging Face's `Metaspace` prefix: the string put before a text that does not already
    /// start with it; with `first_only`, only before the text at the very start of the input
    /// (`prepend_scheme: first`), else before every text (`always`).
    Metaspace {
        prefix: String,
        first_only: bool,
    },
}

/// A sequence of steps; none leaves the text as it is.
#[derive(Clone, Debug, Default)]
pub(crate) struct Normalizer {
    pub(crate) steps: Vec<Step>,
}

impl Normalizer {
    /// Normalizes `text`, a run of text between special tokens; `at_start` when it begins the
    /// input.
    pub(crate) fn apply<'t>(&self, text: &'t str, at_start: bool) -> Cow<'t, str> {
        let mut s = Cow::Borrowed(text);
        for step in &self.steps {
            s = match step {
                Step::Bert(b) => Cow::Owned(bert(&s, b)),
                Step::Nfc => Cow::Owned(s.nfc().collect()),
                Step::Nfd => Cow::Owned(s.nfd().collect()),
                Step::Nfkc => Cow::Owned(s.nfkc().collect()),
                Step::Nfkd => Cow::Owned(s.nfkd().collect()),
                Step::Lowercase => Cow::Owned(lowercase(&s)),
                Step::StripAccents => Cow::Owned(strip_accents(&s)),
                Step::Replace(from, to) if s.contains(from.as_str()) => {
                    Cow::Owned(s.replace(from.as_str(), to))
                }
                Step::Replace(..) => s,
                Step::Prepend(p) if !s.is_empty() => Cow::Owned(format!("{p}{s}")),
                Step::Metaspace { prefix, first_only }
                    if (at_start || !first_only)
                        && !s.is_empty()
                        && !s.starts_with(prefix.as_str()) =>
                {
                    Cow::Owned(format!("{prefix}{s}"))
                }
                Step::Prepend(_) | Step::Metaspace { .. } => s,
            };
        }
        s
    }

    /// The space marker tokens spell spaces with (`▁`), when a step replaces spaces by it.
    pub(crate) fn space_marker(&self) -> Option<&str> {
        self.steps.iter().find_map(|s| match s {
            Step::Replace(from, to) if from == " " => Some(to.as_str()),
            _ => None,
        })
    }
}

/// Sorted, disjoint code point ranges of a Unicode class, from the `regex` crate's tables.
pub(crate) struct CharClass(Vec<(char, char)>);

impl CharClass {
    /// The class `class` (a regex character class such as `\p{M}`); panics on anything
    /// else, so only for static classes.
    pub(crate) fn new(class: &str) -> CharClass {
        let hir = regex_syntax::Parser::new()
            .parse(class)
            .expect("a static character class");
        match hir.kind() {
            HirKind::Class(Class::Unicode(c)) => {
                CharClass(c.ranges().iter().map(|r| (r.start(), r.end())).collect())
            }
            _ => unreachable!("{class} is a Unicode class"),
        }
    }

    /// Whether `c` is in the class.
    pub(crate) fn contains(&self, c: char) -> bool {
        self.0
            .binary_search_by(|&(lo, hi)| {
                if hi < c {
                    std::cmp::Ordering::Less
                } else if lo > c {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
    }
}

/// Control, format and private-use characters (`Cc`, `Cf`, `Co`), which BERT's `clean_text`
/// drops, except tab, newline and carriage return (whitespace to it).
fn is_bert_control(c: char) -> bool {
    static CLASS: OnceLock<CharClass> = OnceLock::new();
    !matches!(c, '\t' | '\n' | '\r')
        && CLASS
            .get_or_init(|| CharClass::new(r"[\p{Cc}\p{Cf}\p{Co}]"))
            .contains(c)
}

/// Non-spacing marks (`Mn`): the accents `strip_accents` drops after NFD.
fn is_nonspacing_mark(c: char) -> bool {
    static CLASS: OnceLock<CharClass> = OnceLock::new();
    CLASS.get_or_init(|| CharClass::new(r"\p{Mn}")).contains(c)
}

/// The CJK ideograph blocks BERT isolates (the ranges of Google's original BERT code); the
/// GGUF WordPiece pre-tokenizer (`wpm`) isolates the same.
pub(super) fn is_chinese_char(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// Lowercasing one character at a time (no context-dependent rule such as the final sigma),
/// as Hugging Face does.
fn lowercase(s: &str) -> String {
    s.chars().flat_map(char::to_lowercase).collect()
}

fn strip_accents(s: &str) -> String {
    s.nfd().filter(|&c| !is_nonspacing_mark(c)).collect()
}

fn bert(text: &str, o: &Bert) -> String {
    let mut s = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if o.clean_text {
            if c == '\0' || c == '\u{FFFD}' || is_bert_control(c) {
                continue;
            }
            if c.is_whitespace() {
                s.push(' ');
                continue;
            }
        }
        if o.chinese_chars && is_chinese_char(c) {
            s.push(' ');
            s.push(c);
            s.push(' ');
        } else {
            s.push(c);
        }
    }
    if o.strip_accents {
        s = strip_accents(&s);
    }
    if o.lowercase {
        s = lowercase(&s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bert_normalizer() {
        let n = Normalizer {
            steps: vec![Step::Bert(Bert {
                clean_text: true,
                chinese_chars: true,
                strip_accents: true,
                lowercase: true,
            })],
        };
        assert_eq!(n.apply("İstanbul Äpfel", true), "istanbul apfel");
        assert_eq!(n.apply("a\u{200b}b\u{e000}c\td", true), "abc d");
        assert_eq!(n.apply("我想x", true), " 我  想 x");
        // Unassigned code points are kept.
        assert_eq!(n.apply("a\u{378}b", true), "a\u{378}b");
    }

    #[test]
    fn prepend_and_replace() {
        let llama = Normalizer {
            steps: vec![
                Step::Prepend("▁".into()),
                Step::Replace(" ".into(), "▁".into()),
            ],
        };
        assert_eq!(llama.apply(" a b", false), "▁▁a▁b");
        assert_eq!(llama.apply("", true), "");
        let meta = Normalizer {
            steps: vec![
                Step::Replace(" ".into(), "▁".into()),
                Step::Metaspace {
                    prefix: "▁".into(),
                    first_only: true,
                },
            ],
        };
        assert_eq!(meta.apply(" a", true), "▁a");
        assert_eq!(meta.apply("a", true), "▁a");
        assert_eq!(meta.apply("a", false), "a");
        assert_eq!(meta.space_marker(), Some("▁"));
    }
}
