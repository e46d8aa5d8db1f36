//! A generated sequence's text, as qkv-server streams it: each token's bytes added to what
//! is pending, and only complete UTF-8 let out; special tokens (end of turn, role markers)
//! add no text, except the markup of tool calls and reasoning when the reply is parsed.

use qkv::tokenizer::{take_complete_utf8, Tokenizer};

/// The text of one sequence, token by token.
#[derive(Debug, Default)]
pub struct TextOut {
    pending: Vec<u8>,
    /// Keep the special tokens that are part of a reply's markup (`<tool_call>`, `<think>`).
    markup: bool,
}

impl TextOut {
    /// Nothing pending; `markup`: keep the markup tokens' text.
    pub fn new(markup: bool) -> TextOut {
        TextOut {
            pending: Vec::new(),
            markup,
        }
    }

    /// Adds token `id` and returns the text now complete (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        let markup = self.markup
            && tokenizer
                .token_str(id)
                .is_ok_and(|t| qkv_server::tools::MARKUP_TOKENS.contains(&t));
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
