//! WordPiece (BERT): each word becomes the longest token that starts it, then the longest that
//! continues it, and so on; a word that cannot be spelt so, or is too long, becomes the unknown
//! token.
//!
//! Hugging Face marks continuations (`##ing`); GGUF `bert` vocabularies mark word starts
//! instead (`▁play`, `ing`). Both are described by the two prefixes of [`WordPiece`].

use std::collections::HashMap;

/// A WordPiece model.
#[derive(Clone, Debug)]
pub(crate) struct WordPiece {
    /// Put before the first piece of a word when looking it up (`▁` in GGUF, empty in HF).
    pub first_prefix: String,
    /// Put before every later piece (`##` in HF, empty in GGUF).
    pub cont_prefix: String,
    /// Words of more characters are the unknown token (Hugging Face's
    /// `max_input_chars_per_word`).
    pub max_chars: usize,
    pub unk: u32,
    /// The longest token, in bytes: no longer candidate is looked up.
    pub max_token_len: usize,
}

impl WordPiece {
    /// Appends the tokens of `word` to `out`; `buf` is scratch space.
    pub(crate) fn encode_word(
        &self,
        word: &str,
        vocab: &HashMap<String, u32>,
        buf: &mut String,
        out: &mut Vec<u32>,
    ) {
        if word.chars().count() > self.max_chars {
            out.push(self.unk);
            return;
        }
        let first = out.len();
        let mut start = 0;
        while start < word.len() {
            let prefix = if start == 0 {
                &self.first_prefix
            } else {
                &self.cont_prefix
            };
            let mut end = word.len();
            let mut found = None;
            while end > start {
                if prefix.len() + end - start <= self.max_token_len {
                    buf.clear();
                    buf.push_str(prefix);
                    buf.push_str(&word[start..end]);
                    if let Some(&id) = vocab.get(buf.as_str()) {
                        found = Some(id);
                        break;
                    }
                }
                end = word[..end]
                    .char_indices()
                    .next_back()
                    .map_or(start, |(i, _)| i);
            }
            match found {
                Some(id) => out.push(id),
                None => {
                    out.truncate(first);
                    out.push(self.unk);
                    return;
                }
            }
            start = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_pieces_or_unknown() {
        let vocab: HashMap<String, u32> = ["[UNK]", "un", "##aff", "##able", "##a", "aff"]
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let wp = WordPiece {
            first_prefix: String::new(),
            cont_prefix: "##".into(),
            max_chars: 10,
            unk: 0,
            max_token_len: 6,
        };
        let enc = |w: &str| {
            let mut out = vec![99];
            wp.encode_word(w, &vocab, &mut String::new(), &mut out);
            out
        };
        assert_eq!(enc("unaffable"), [99, 1, 2, 3]);
        assert_eq!(enc("unaffa"), [99, 1, 2, 4]);
        assert_eq!(enc("unx"), [99, 0]);
        assert_eq!(enc("unaffableun"), [99, 0]); // 11 characters
    }
}
