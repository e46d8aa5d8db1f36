//! Constrained decoding with llguidance: the token environment built from qkv's own
//! vocabulary, grammars compiled from what a request asks for ([`OutputConstraint`]), and
//! [`Grammar`], the engine's [`TokenConstraint`] over llguidance's matcher.
//!
//! The vocabulary goes to llguidance as each token's bytes; special tokens (end of turn,
//! role markers) are spelt with llguidance's special-token marker byte in front, so that no
//! text in a grammar can match them (except the tool-call markup, see [`token_words`]), and
//! the end-of-sequence token is the one the grammar allows once the output is complete.

use crate::error::ApiError;
use crate::structured::{with_layout, OutputConstraint};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use qkv::engine::TokenConstraint;
use qkv::load::Model;
use std::sync::Arc;

/// llguidance's view of a qkv tokenizer: the trie of token bytes, and the model's own
/// tokenizer for the text a grammar forces.
struct Env {
    trie: TokTrie,
    model: Arc<Model>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        let options = qkv::tokenizer::EncodeOptions {
            add_special: false,
            parse_special: false,
        };
        match (std::str::from_utf8(s), self.model.tokenizer()) {
            (Ok(text), Some(t)) => t
                .encode_with(text, options)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            _ => self.trie.greedy_tokenize(s),
        }
    }
}

/// The bytes llguidance sees for each token of `tokenizer`: the token's own bytes, or for a
/// special token the marker byte 0xFF followed by its spelling. The special tokens of a
/// reply's markup ([`crate::tools::MARKUP_TOKENS`]: `<tool_call>`, `[TOOL_CALLS]`, …) are
/// text, so that a grammar's `"<tool_call>"` lets the model write its one token.
pub fn token_words(tokenizer: &qkv::tokenizer::Tokenizer) -> Vec<Vec<u8>> {
    (0..tokenizer.vocab_size() as u32)
        .map(|id| {
            let markup = tokenizer
                .token_str(id)
                .is_ok_and(|t| crate::tools::MARKUP_TOKENS.contains(&t));
            if tokenizer.is_special(id) && !markup {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(tokenizer.token_str(id).unwrap_or("").as_bytes());
                w
            } else {
                tokenizer
                    .token_bytes(id)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default()
            }
        })
        .collect()
}

/// Compiles grammars for one model; built once per server.
pub struct Grammars {
    factory: ParserFactory,
    vocab: usize,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab", &self.vocab)
            .finish()
    }
}

impl Grammars {
    /// The grammar compiler for `model`'s vocabulary; an error when the model has no
    /// tokenizer or no end-of-sequence token.
    pub fn new(model: Arc<Model>) -> Result<Grammars, String> {
        let tokenizer = model
            .tokenizer()
            .ok_or("the model has no tokenizer: grammars need one")?;
        let eos = tokenizer
            .eos_id()
            .ok_or("the model has no end-of-sequence token: grammars need one")?;
        let words = token_words(tokenizer);
        let vocab = words.len();
        let mut info = TokRxInfo::new(vocab as u32, eos);
        info.tok_bos = tokenizer.bos_id();
        info.tok_pad = tokenizer.pad_id();
        info.tok_unk = tokenizer.unk_id();
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, model });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Grammars { factory, vocab })
    }

    /// Compiles `c` into a constraint for one sequence; a grammar or schema llguidance
    /// cannot compile is a 400 naming the request field it came from.
    pub fn compile(&self, c: &OutputConstraint) -> Result<Grammar, ApiError> {
        let grammar = match c {
            OutputConstraint::JsonSchema { schema, strict, .. } => {
                TopLevelGrammar::from_json_schema(with_layout(schema, *strict))
            }
            OutputConstraint::Lark { grammar, .. } => TopLevelGrammar::from_lark(grammar.clone()),
        };
        let parser = self.factory.create_parser(grammar).map_err(|e| {
            ApiError::invalid(c.param(), format!("the grammar does not compile: {e}"))
        })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ApiError::invalid(
                c.param(),
                format!("the grammar does not compile: {e}"),
            ));
        }
        Ok(Grammar {
            matcher,
            vocab: self.vocab,
        })
    }
}

/// One sequence's grammar: llguidance's matcher over the tokens generated so far.
pub struct Grammar {
    matcher: Matcher,
    vocab: usize,
}

impl Grammar {
    /// True when the output so far may end here.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

impl TokenConstraint for Grammar {
    fn allows(&mut self, token: u32) -> bool {
        (token as usize) < self.vocab && self.matcher.validate_tokens(&[token]).unwrap_or(0) == 1
    }

    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let mask = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        for (i, l) in logits.iter_mut().enumerate() {
            if i >= self.vocab || !mask.is_allowed(i as u32) {
                *l = f32::MIN;
            }
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}
