//! A generated sequence's text, token by token, as the server streams it: each token's
//! bytes added to what is pending and only complete UTF-8 let out; special tokens (end of
//! turn, role markers) add no text, except the markup of tool calls and reasoning when the
//! reply is parsed. The server's runs and the Python package's sessions and engine share it.

use crate::tools::MARKUP_TOKENS;
use qkv::tokenizer::{take_complete_utf8, Tokenizer};

/// The text of one sequence, token by token.
#[derive(Debug, Default)]
pub struct TokenText {
    /// Bytes of an unfinished character.
    pending: Vec<u8>,
    /// Keep the special tokens that are part of a reply's markup (`<tool_call>`, `<think>`).
    markup: bool,
}

impl TokenText {
    /// Nothing pending; `markup`: keep the markup tokens' text (the reply is parsed).
    pub fn new(markup: bool) -> TokenText {
        TokenText {
            pending: Vec::new(),
            markup,
        }
    }

    /// Adds token `id` and returns the text now complete (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        let markup = self.markup
            && tokenizer
                .token_str(id)
                .is_ok_and(|t| MARKUP_TOKENS.contains(&t));
        if !tokenizer.is_special(id) || markup {
            if let Ok(bytes) = tokenizer.token_bytes(id) {
                self.pending.extend_from_slice(bytes);
            }
        }
        take_complete_utf8(&mut self.pending)
    }

    /// What is left (an unfinished character becomes U+FFFD), and nothing pending after.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qkv::load::{Model, ModelOptions};
    use qkv::testing::synthetic::{model_file, Storage, EOS};
    use qkv::tokenizer::EncodeOptions;

    fn model() -> Model {
        Model::load(&model_file(Storage::F32), &ModelOptions::default()).expect("loads")
    }

    const PLAIN: EncodeOptions = EncodeOptions {
        add_special: false,
        parse_special: false,
    };

    #[test]
    fn a_character_split_across_tokens_comes_out_whole() {
        let model = model();
        let tokenizer = model
            .tokenizer()
            .expect("the synthetic model has a tokenizer");
        // Two bytes, each its own token of the byte-level vocabulary.
        let ids = tokenizer.encode_with("é!", PLAIN).expect("encodes");
        assert!(ids.len() >= 2, "{ids:?}");
        let mut text = TokenText::new(false);
        let pieces: Vec<String> = ids.iter().map(|&id| text.push(tokenizer, id)).collect();
        assert_eq!(pieces[0], "", "half a character is held back");
        assert_eq!(pieces.concat(), "é!");
        assert_eq!(text.finish(), "");
    }

    #[test]
    fn an_unfinished_character_ends_as_a_replacement() {
        let model = model();
        let tokenizer = model
            .tokenizer()
            .expect("the synthetic model has a tokenizer");
        let ids = tokenizer.encode_with("é", PLAIN).expect("encodes");
        let mut text = TokenText::new(false);
        assert_eq!(text.push(tokenizer, ids[0]), "");
        assert_eq!(text.finish(), "\u{FFFD}");
        assert_eq!(text.finish(), "");
    }

    #[test]
    fn special_tokens_add_no_text() {
        let model = model();
        let tokenizer = model
            .tokenizer()
            .expect("the synthetic model has a tokenizer");
        let ids = tokenizer.encode_with("ok", PLAIN).expect("encodes");
        for markup in [false, true] {
            let mut text = TokenText::new(markup);
            let mut out: String = ids.iter().map(|&id| text.push(tokenizer, id)).collect();
            // The end of turn is no reply markup: it adds nothing either way.
            out.push_str(&text.push(tokenizer, EOS));
            assert_eq!(out, "ok");
        }
    }
}
