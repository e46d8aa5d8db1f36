//! WordPiece as llama.cpp runs it on GGUF `bert` vocabularies, which differs from Hugging
//! Face's BERT on text outside Latin script:
//!
//! - "Stripping accents" maps every character to the first character of its canonical
//!   decomposition (`é` → `e`, but also a Hangul syllable `한` → its first jamo `ᄒ`), then
//!   drops every mark (`\p{M}`: spacing ones too, such as Devanagari's vowel signs), where
//!   Hugging Face decomposes fully and drops only non-spacing marks.
//! - Control, format and private-use characters, NUL and U+FFFD are dropped;
//!   whitespace (Unicode's `White_Space`) ends a word; punctuation, ASCII symbols and CJK
//!   ideographs are words of their own; lowercasing is one character to one character.
//! - Each word, with `▁` before it, is cut greedily into the longest tokens from the left, in
//!   bytes, with no limit on the word's length; a word that cannot be cut so is `[UNK]`.

use super::normalize::is_chinese_char;
use super::normalize::CharClass;
use std::collections::HashMap;
use std::sync::OnceLock;

/// The word-start marker of GGUF BERT vocabularies.
const MARK: &str = "\u{2581}";

/// llama.cpp's WordPiece for one vocabulary.
#[derive(Clone, Debug)]
pub(crate) struct Wpm {
    pub lowercase: bool,
    pub strip_accents: bool,
    pub unk: u32,
    /// The longest token, in bytes.
    pub max_token_len: usize,
}

struct Classes {
    mark: CharClass,
    punct: CharClass,
    symbol: CharClass,
    control: CharClass,
}

fn classes() -> &'static Classes {
    static C: OnceLock<Classes> = OnceLock::new();
    C.get_or_init(|| Classes {
        mark: CharClass::new(r"\p{M}"),
        punct: CharClass::new(r"\p{P}"),
        symbol: CharClass::new(r"\p{S}"),
        control: CharClass::new(r"[\p{Cc}\p{Cf}\p{Co}]"),
    })
}

/// Unicode's `White_Space` characters.
fn is_white_space(c: char) -> bool {
    matches!(c as u32,
        0x09..=0x0D | 0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029
        | 0x202F | 0x205F | 0x3000)
}

/// The first character of `c`'s canonical decomposition (`c` itself when it has none).
fn first_of_decomposition(c: char) -> char {
    let mut first = None;
    unicode_normalization::char::decompose_canonical(c, |d| {
        first.get_or_insert(d);
    });
    first.unwrap_or(c)
}

impl Wpm {
    /// Cuts `text` into words as llama.cpp's preprocessing does; `words` gets their byte
    /// ranges in `buf`.
    fn words(&self, text: &str, buf: &mut String, words: &mut Vec<(usize, usize)>) {
        let cl = classes();
        buf.clear();
        words.clear();
        let mut start = 0;
        let end_word = |buf: &String, start: &mut usize, words: &mut Vec<(usize, usize)>| {
            if buf.len() > *start {
                words.push((*start, buf.len()));
            }
            *start = buf.len();
        };
        for c in text.chars() {
            let c = if self.strip_accents {
                first_of_decomposition(c)
            } else {
                c
            };
            if is_white_space(c) {
                end_word(buf, &mut start, words);
                continue;
            }
            if c == '\0' || c == '\u{FFFD}' || cl.control.contains(c) {
                continue;
            }
            if self.strip_accents && cl.mark.contains(c) {
                continue;
            }
            let lower = if self.lowercase {
                c.to_lowercase().next().unwrap_or(c)
            } else {
                c
            };
            let alone = cl.punct.contains(c)
                || ((c as u32) < 0x7F && cl.symbol.contains(c))
                || is_chinese_char(c);
            if alone {
                end_word(buf, &mut start, words);
                buf.push(lower);
                end_word(buf, &mut start, words);
            } else {
                buf.push(lower);
            }
        }
        end_word(buf, &mut start, words);
    }

    /// Appends the tokens of `text` (a run between special tokens) to `out`.
    pub(crate) fn encode(
        &self,
        text: &str,
        vocab: &HashMap<String, u32>,
        buf: &mut String,
        word: &mut String,
        out: &mut Vec<u32>,
    ) {
        let mut words = Vec::new();
        self.words(text, buf, &mut words);
        for &(ws, we) in &words {
            word.clear();
            word.push_str(MARK);
            word.push_str(&buf[ws..we]);
            let first = out.len();
            let n = word.len();
            let mut i = 0;
            while i < n {
                let mut j = n.min(i + self.max_token_len);
                let mut found = None;
                while j > i {
                    if let Some(&id) = word.get(i..j).and_then(|piece| vocab.get(piece)) {
                        found = Some((id, j));
                        break;
                    }
                    j -= 1;
                }
                match found {
                    Some((id, j)) => {
                        out.push(id);
                        i = j;
                    }
                    None => {
                        out.truncate(first);
                        break;
                    }
                }
            }
            if out.len() == first {
                out.push(self.unk);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &Wpm, s: &str) -> Vec<String> {
        let (mut buf, mut ws) = (String::new(), Vec::new());
        w.words(s, &mut buf, &mut ws);
        ws.iter().map(|&(a, b)| buf[a..b].to_string()).collect()
    }

    #[test]
    fn llama_cpp_preprocessing() {
        let w = Wpm {
            lowercase: true,
            strip_accents: true,
            unk: 0,
            max_token_len: 10,
        };
        assert_eq!(words(&w, "Héllo, WORLD!"), ["hello", ",", "world", "!"]);
        // A Hangul syllable keeps its first jamo; Devanagari loses its vowel signs and virama.
        assert_eq!(words(&w, "한국"), ["\u{1112}\u{1100}"]);
        assert_eq!(words(&w, "नमस्ते"), ["नमसत"]);
        assert_eq!(words(&w, "a\u{200b}b 我们"), ["ab", "我", "们"]);
        assert_eq!(words(&w, "İ $x"), ["i", "$", "x"]);
    }

    #[test]
    fn greedy_longest_or_unknown() {
        let vocab: HashMap<String, u32> = [("[UNK]", 0), ("▁un", 1), ("aff", 2), ("able", 3)]
            .iter()
            .map(|&(t, i)| (t.to_string(), i))
            .collect();
        let w = Wpm {
            lowercase: true,
            strip_accents: true,
            unk: 0,
            max_token_len: 5,
        };
        let mut out = Vec::new();
        w.encode(
            "Unaffable unx",
            &vocab,
            &mut String::new(),
            &mut String::new(),
            &mut out,
        );
        assert_eq!(out, [1, 2, 3, 0]);
    }
}
