//! Text ↔ token ids, built from GGUF metadata or from a Hugging Face `tokenizer.json`, with
//! five model kinds: BPE by merge rank (byte-level, as GPT-2, SmolLM2, Llama 3 and Qwen; or on
//! characters with byte fallback, as Gemma), SentencePiece BPE by score (GGUF `llama`),
//! WordPiece (Hugging Face's), llama.cpp's WordPiece with its own normalization (GGUF
//! `bert`) and Unigram (GGUF `t5`); plus the model's chat template (Jinja, [`ChatTemplate`]) and a streaming decoder that
//! never splits a character.
//!
//! A file is read section by section into the `Parts` of a tokenizer (`hf.rs` and
//! `hf_config.rs` for `tokenizer.json` and `tokenizer_config.json`, `gguf.rs` for the
//! `tokenizer.ggml.*` keys), which `parts.rs` checks and builds.
//!
//! # How text is encoded (byte-level BPE)
//!
//! 1. Special tokens (GGUF token types 3 *control* and 4 *user defined*, Hugging Face
//!    `added_tokens`) are cut out of the text and kept whole: `<|im_start|>` in a prompt is
//!    one token, never `<`, `|`, `im`, ….
//! 2. The rest is pre-tokenized into words: for models whose pre-tokenizer isolates digits
//!    (GGUF `tokenizer.ggml.pre` = `smollm`, `starcoder`, `refact`, …; a `Digits` step in
//!    `tokenizer.json`), every numeric character becomes a word of its own; then GPT-2's
//!    regex `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//!    splits each piece, with no prefix space added. That is SmolLM2's `tokenizer.json`
//!    (`Sequence[Digits(individual_digits), ByteLevel(add_prefix_space=false)]`) and
//!    llama.cpp's `smollm` pre-tokenizer.
//! 3. Each word's UTF-8 bytes become the vocabulary's byte tokens (GPT-2's byte ↔ character
//!    map), and the merges are applied, lowest rank first, leftmost among equals. A byte the
//!    vocabulary has no token for is dropped, as Hugging Face (BPE without `unk_token`) and
//!    llama.cpp do: SmolLM2 lacks tokens for bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D and for
//!    bytes that are rare or never occur in UTF-8 (0xC0, 0xC1, 0xF1, 0xF2, 0xF5–0xFF).
//!
//! The tests compare this, id for id, with Hugging Face `tokenizers` on a few hundred strings
//! (`tests/fixtures/tokenizer/cases.json`, written by `tools/tokenizer_fixtures.py`).
//!
//! # GGUF vocabularies follow llama.cpp
//!
//! A GGUF file is tokenized as llama.cpp tokenizes it, which is not always what Hugging Face
//! does with the original tokenizer: special tokens are cut out longest first, with the token
//! types and whitespace stripping llama.cpp derives from token texts and model names; `bert`
//! vocabularies get llama.cpp's WordPiece normalization (Hangul to initial jamo, every mark
//! dropped); `t5` vocabularies are Unigram models (Viterbi over the token scores, after the
//! precompiled character map). `tests/tokenizer_suite.rs` holds qkv to llama.cpp's own
//! tokenizer suite and to held-out strings on all 19 vocabularies of llama.cpp's `models/`.
//!
//! # Why not the `tokenizers` crate
//!
//! Hugging Face's `tokenizers` is the reference, and the tests hold qkv to it id for id. qkv
//! does not use it, for four reasons that hold today (this module is about 5,900 lines in 17
//! files, of which about 1,000 are the chat template and 550 unit tests):
//!
//! - **GGUF files tokenize as llama.cpp tokenizes them**, which `tokenizers` does not do: it
//!   cannot read GGUF, and llama.cpp's rules differ from Hugging Face's (special tokens cut
//!   out longest first, token types and whitespace stripping derived from token texts and
//!   model names, llama.cpp's own WordPiece normalization, Unigram over the precompiled
//!   character map). Most of this module's size is there; the `tokenizer.json` side shares
//!   the models and adds its normalizers, pre-tokenizers and post-processors.
//! - **Files are untrusted input**: vocabularies are bounded ([`MAX_VOCAB`]), every
//!   unsupported or malformed section is a typed error naming it, and the readers are fuzzed
//!   (`fuzz/`).
//! - **Build cost**: `tokenizers` 0.22.2 (no default features, `fancy-regex`) brings 84
//!   crates, and a clean build of it alone took 34 s in debug and 63 s in release with two
//!   jobs on the quiet 2-core host (2026-11-27), added to every clean build of a workspace
//!   that several builders share; qkv's tokenizers stand on `regex`, `regex-automata`,
//!   `aho-corasick` and `unicode-normalization`, which the workspace builds anyway or which
//!   are small.
//! - **It is not slower.** `python3 tools/tokenizer_speed.py` loads the same `tokenizer.json`
//!   files in both (the Python `tokenizers` package is the same Rust crate) and encodes the
//!   same text; both give the same ids, and qkv loads and encodes faster (BENCHMARKS.md,
//!   Tokenizers, embeddings and seq2seq).
//!
//! The byte-level BPE's look-ahead `\s+(?!\S)`, which `regex` lacks, is a two-line rule.
//!
//! ```
//! use qkv::tokenizer::{ChatMessage, Tokenizer};
//! use qkv::weights::gguf::{write_gguf, GgufFile, MetaValue, MetaValueType};
//!
//! // A toy vocabulary: the 256 byte tokens, "ab", and one control token.
//! let map = qkv::tokenizer::gpt2_byte_chars();
//! let mut tokens: Vec<String> = map.iter().map(|c| c.to_string()).collect();
//! tokens.push("ab".into());
//! tokens.push("<|im_end|>".into());
//! let mut types = vec![1i32; 257];
//! types.push(3);
//! let strings = |v: Vec<String>| {
//!     MetaValue::Array(MetaValueType::String, v.into_iter().map(MetaValue::String).collect())
//! };
//! let meta = vec![
//!     ("tokenizer.ggml.model".to_string(), MetaValue::String("gpt2".into())),
//!     ("tokenizer.ggml.tokens".to_string(), strings(tokens)),
//!     ("tokenizer.ggml.merges".to_string(), strings(vec!["a b".into()])),
//!     (
//!         "tokenizer.ggml.token_type".to_string(),
//!         MetaValue::Array(MetaValueType::I32, types.into_iter().map(MetaValue::I32).collect()),
//!     ),
//!     ("tokenizer.ggml.eos_token_id".to_string(), MetaValue::U32(257)),
//! ];
//! let dir = std::env::temp_dir().join(format!("qkv-tok-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("vocab.gguf");
//! write_gguf(&path, &meta, &[])?;
//!
//! let tok = Tokenizer::from_gguf(&GgufFile::open(&path)?)?;
//! let ids = tok.encode("abc<|im_end|>")?;
//! // "ab" merges; "c" is its byte token (tokens 0..256 are the bytes in order here).
//! assert_eq!(ids, vec![256, u32::from(b'c'), 257]);
//! assert_eq!(tok.decode(&ids)?, "abc<|im_end|>");
//! assert_eq!(tok.eos_id(), Some(257));
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bpe;
mod gguf;
mod hf;
mod hf_config;
mod normalize;
mod parts;
mod pretok;
mod quirks;
mod split;
mod spm;
mod template;
mod unigram;
mod wordpiece;
mod wpm;

pub use template::{
    strftime_now, ChatOptions, ChatTemplate, MAX_TEMPLATE_FUEL, MAX_TEMPLATE_OUTPUT,
    MAX_TEMPLATE_SOURCE,
};

pub use parts::MAX_VOCAB;

use crate::error::{Error, Result};
use crate::weights::gguf::GgufFile;
use aho_corasick::AhoCorasick;
use bpe::Bpe;
use normalize::Normalizer;
use parts::Kind;
use pretok::PreTokenizer;
use std::collections::HashMap;
use std::path::Path;
use wordpiece::WordPiece;

/// GPT-2's byte → character map: `gpt2_byte_chars()[b]` is the character byte `b` is spelt
/// with in a byte-level BPE vocabulary (`Ġ` for a space, `Ċ` for a newline, …).
pub fn gpt2_byte_chars() -> [char; 256] {
    bpe::byte_to_char()
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A special token: matched whole in text instead of being split.
#[derive(Clone, Debug)]
struct Special {
    text: String,
    id: u32,
    /// Matched even when special tokens are not parsed ([`EncodeOptions::parse_special`]).
    user_defined: bool,
    /// Swallows the whitespace before / after it.
    lstrip: bool,
    rstrip: bool,
}

/// The vocabulary model.
#[derive(Clone, Debug)]
enum Model {
    Bpe(Bpe),
    Spm {
        scores: Vec<f32>,
        byte_ids: [u32; 256],
    },
    WordPiece(WordPiece),
    Wpm(wpm::Wpm),
    Unigram(Box<unigram::Unigram>),
}

/// How [`Tokenizer::encode_with`] treats the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Put the special tokens the file asks for around the text: BOS (and EOS) for decoders,
    /// `[CLS]` … `[SEP]` for BERT.
    pub add_special: bool,
    /// Keep control tokens spelt in the text (`<|im_end|>`, `<s>`) whole. When false they are
    /// split like any text; user-defined tokens (GGUF token type 4, Hugging Face added tokens
    /// that are not `special`) stay whole either way, as in llama.cpp and Hugging Face.
    pub parse_special: bool,
}

impl Default for EncodeOptions {
    /// What [`Tokenizer::encode`] does: add special tokens, parse them in text.
    fn default() -> EncodeOptions {
        EncodeOptions {
            add_special: true,
            parse_special: true,
        }
    }
}

/// A tokenizer: byte-level BPE, SentencePiece BPE, Unigram or WordPiece, with its normalizer,
/// pre-tokenizer and special tokens. Immutable once built; `Send + Sync`, so one serves every
/// session.
pub struct Tokenizer {
    tokens: Vec<String>,
    kinds: Vec<Kind>,
    /// Decoded bytes of every token, back to back; token `i` is
    /// `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    vocab: HashMap<String, u32>,
    model: Model,
    normalizer: Normalizer,
    pre: PreTokenizer,
    /// Special tokens, longest first.
    specials: Vec<Special>,
    /// Finders of the special tokens (all of them; the user-defined ones), with the index in
    /// `specials` of each pattern. `None` when there are none.
    scan_all: Option<(AhoCorasick, Vec<usize>)>,
    scan_user: Option<(AhoCorasick, Vec<usize>)>,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
    sep: Option<u32>,
    /// Tokens put around the text when special tokens are added.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    /// Decoding drops one leading space (the encoder's prefix space).
    strip_first_space: bool,
    /// Special tokens are cut out in llama.cpp's order (GGUF files), not Hugging Face's.
    llama_split: bool,
    fim: FimTokens,
    chat_template: Option<String>,
}

/// A vocabulary's fill-in-the-middle markers, as llama.cpp finds them: the ids a GGUF file
/// names (`tokenizer.ggml.fim_pre_token_id`, …), else the first of each marker's known
/// texts in the vocabulary (`<|fim_prefix|>`, `<fim_prefix>`, `<PRE>`, …). `None` where
/// neither gives one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FimTokens {
    /// Before the code that precedes the hole.
    pub prefix: Option<u32>,
    /// Before the code that follows it.
    pub suffix: Option<u32>,
    /// Where the model writes the middle.
    pub middle: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
    /// Before a repository's name (repository-level prompts).
    pub repo: Option<u32>,
    /// Before each file's name (repository-level prompts).
    pub file_sep: Option<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let model = match &self.model {
            Model::Bpe(b) if b.byte_level => "byte-level BPE",
            Model::Bpe(_) => "BPE",
            Model::Spm { .. } => "SentencePiece BPE",
            Model::WordPiece(_) | Model::Wpm(_) => "WordPiece",
            Model::Unigram(_) => "Unigram",
        };
        f.debug_struct("Tokenizer")
            .field("model", &model)
            .field("vocab_size", &self.tokens.len())
            .field("specials", &self.specials.len())
            .field("pre_tokenizer_steps", &self.pre.steps.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

/// Reusable buffers of one encode call.
#[derive(Default)]
struct Scratch {
    bpe: bpe::Scratch,
    spm: spm::Scratch,
    unigram: unigram::Scratch,
    buf: String,
    word: String,
    pieces: Vec<split::Piece>,
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata. The file need hold
    /// no tensors (llama.cpp's vocab-only files load).
    ///
    /// `tokenizer.ggml.model` decides the algorithm: `gpt2` (byte-level BPE, split as
    /// `tokenizer.ggml.pre` names), `llama` (SentencePiece BPE by score with byte fallback),
    /// `bert` (WordPiece, normalized as llama.cpp does), `t5` (Unigram, with its precompiled
    /// character map and `remove_extra_whitespaces`) or `gemma4` (BPE on characters with byte
    /// fallback). Also read:
    /// `tokens`, `token_type` (2 unknown, 3 control and 4 user-defined are special and kept
    /// whole), `merges` or `scores`, the `bos`/`eos`/`unknown`/`seperator`/`padding` token ids,
    /// `add_bos_token`, `add_eos_token`, `add_sep_token`, `add_space_prefix`, the BERT
    /// `normalizer.lowercase`/`strip_accents` flags and `tokenizer.chat_template`.
    ///
    /// [`Error::Unsupported`] names an unknown model or pre-tokenizer; [`Error::Format`] a
    /// malformed array (a type per token, a score per token, merges of two tokens).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        Tokenizer::build(gguf::load(file)?)
    }

    /// Builds the tokenizer from a Hugging Face `tokenizer.json`: BPE (byte-level, or
    /// SentencePiece-style with `byte_fallback`) or WordPiece, with the normalizer,
    /// pre-tokenizer, added tokens and post-processor it declares. BOS/EOS ids, `add_bos_token`,
    /// `add_eos_token` and the chat template come from a `tokenizer_config.json` beside it when
    /// there is one; without those flags, the post-processor's template decides the tokens put
    /// around the text.
    ///
    /// A BERT `tokenizer.json` (`BertNormalizer`, `BertPreTokenizer`, WordPiece,
    /// `TemplateProcessing` `[CLS] $A [SEP]`) gives [`encode`](Self::encode) =
    /// `[CLS]` + word pieces + `[SEP]`, as Hugging Face's `encode(text)`:
    /// [`special_prefix`](Self::special_prefix) is `[CLS]`, [`special_suffix`](Self::special_suffix)
    /// `[SEP]`, and [`adds_bos`](Self::adds_bos) is true. `padding` and `truncation` are not
    /// applied.
    ///
    /// ```
    /// use qkv::tokenizer::{EncodeOptions, Tokenizer};
    /// let dir = std::env::temp_dir().join(format!("qkv-doc-bert-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// std::fs::write(dir.join("tokenizer.json"), r###"{
    ///   "added_tokens": [
    ///     {"id": 0, "content": "[UNK]", "special": true},
    ///     {"id": 1, "content": "[CLS]", "special": true},
    ///     {"id": 2, "content": "[SEP]", "special": true}],
    ///   "normalizer": {"type": "BertNormalizer", "lowercase": true},
    ///   "pre_tokenizer": {"type": "BertPreTokenizer"},
    ///   "post_processor": {"type": "TemplateProcessing",
    ///     "single": [{"SpecialToken": {"id": "[CLS]"}}, {"Sequence": {"id": "A"}},
    ///                {"SpecialToken": {"id": "[SEP]"}}],
    ///     "special_tokens": {"[CLS]": {"ids": [1]}, "[SEP]": {"ids": [2]}}},
    ///   "model": {"type": "WordPiece", "unk_token": "[UNK]",
    ///     "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "play": 3, "##ing": 4, "!": 5}}
    /// }"###)?;
    /// let tok = Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json"))?;
    /// assert_eq!(tok.encode("Playing!")?, [1, 3, 4, 5, 2]);
    /// assert_eq!((tok.special_prefix(), tok.special_suffix()), (&[1][..], &[2][..]));
    /// let bare = EncodeOptions { add_special: false, ..Default::default() };
    /// assert_eq!(tok.encode_with("PLAY ing", bare)?, [3, 0]);
    /// assert_eq!(tok.decode(&[3, 4, 5])?, "playing !");
    /// # std::fs::remove_dir_all(&dir).ok();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_tokenizer_json(path: &Path) -> Result<Tokenizer> {
        Tokenizer::build(hf::load(path)?)
    }

    /// The tokenizer of a model file or directory: a GGUF file (tensors or not: vocab-only
    /// files load), a Hugging Face directory (its `tokenizer.json`), or a `tokenizer.json`
    /// itself. [`Error::Io`] names a path that cannot be read.
    pub fn load(path: &Path) -> Result<Tokenizer> {
        let meta = std::fs::metadata(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        if meta.is_dir() {
            Tokenizer::from_tokenizer_json(&path.join("tokenizer.json"))
        } else if path.extension().is_some_and(|e| e == "json") {
            Tokenizer::from_tokenizer_json(path)
        } else {
            Tokenizer::from_gguf(&GgufFile::open(path)?)
        }
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// True for the special tokens (control, user-defined and unknown: end of turn, role
    /// markers, padding…), which [`encode`](Self::encode) matches whole in text and which a
    /// reader of generated text usually does not want to see. False for ids outside the
    /// vocabulary.
    pub fn is_special(&self, id: u32) -> bool {
        self.kinds.get(id as usize).is_some_and(|k| k.is_special())
    }

    /// The beginning-of-sequence token, if the model has one (`[CLS]` for BERT).
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token (for chat models, the end-of-turn token), if any.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The padding token, if any.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// The unknown token, if any.
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    /// The separator token (`[SEP]` for BERT), if any.
    pub fn sep_id(&self) -> Option<u32> {
        self.sep
    }

    /// The fill-in-the-middle markers of the vocabulary.
    pub fn fim(&self) -> FimTokens {
        self.fim
    }

    /// True when [`encode`](Self::encode) puts a special token before the text: BOS for most
    /// decoders (`add_bos_token`), `[CLS]` for BERT.
    pub fn adds_bos(&self) -> bool {
        !self.prefix.is_empty()
    }

    /// The tokens [`encode`](Self::encode) puts before the text (`[BOS]`, `[CLS]`, or none).
    pub fn special_prefix(&self) -> &[u32] {
        &self.prefix
    }

    /// The tokens [`encode`](Self::encode) puts after the text (`[EOS]` when the file asks
    /// for it, `[SEP]` for BERT, or none).
    pub fn special_suffix(&self) -> &[u32] {
        &self.suffix
    }

    /// The chat template stored with the model (Jinja source), if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The id of the token spelt `text`: first as the vocabulary spells it (`<|im_end|>`,
    /// `Ġthe`, `▁the`), else as the token whose bytes are `text` (` the`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        if let Some(&id) = self.vocab.get(text) {
            return Some(id);
        }
        let spelt: String = match &self.model {
            Model::Bpe(b) if b.byte_level => {
                let chars = bpe::byte_to_char();
                text.bytes().map(|b| chars[b as usize]).collect()
            }
            Model::Unigram(u) => return u.lookup(&self.vocab, text),
            _ => text.replace(' ', self.normalizer.space_marker().unwrap_or(" ")),
        };
        self.vocab.get(&spelt).copied()
    }

    /// The vocabulary's spelling of token `id` (e.g. `Ġthe`, `▁the`, `##ing`).
    pub fn token_str(&self, id: u32) -> Result<&str> {
        self.tokens
            .get(id as usize)
            .map(String::as_str)
            .ok_or(Error::TokenOutOfRange {
                id,
                vocab: self.tokens.len(),
            })
    }

    /// The bytes token `id` stands for (` the` for `Ġthe` or `▁the`); possibly part of a UTF-8
    /// character. [`Error::TokenOutOfRange`] for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        let i = id as usize;
        if i >= self.tokens.len() {
            return Err(Error::TokenOutOfRange {
                id,
                vocab: self.tokens.len(),
            });
        }
        Ok(&self.bytes[self.offsets[i]..self.offsets[i + 1]])
    }

    /// Encodes `text` into token ids. Special tokens in the text are kept whole. The special
    /// tokens the model asks for are put around the text ([`special_prefix`](Self::special_prefix),
    /// [`special_suffix`](Self::special_suffix)).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, EncodeOptions::default())
    }

    /// Encodes `text` with the given options: `add_special: false, parse_special: false` is
    /// what llama.cpp's tokenizer tests and `llama-tokenize --no-bos --no-parse-special` do.
    pub fn encode_with(&self, text: &str, opts: EncodeOptions) -> Result<Vec<u32>> {
        let scan = if opts.parse_special {
            self.scan_all.as_ref()
        } else {
            self.scan_user.as_ref()
        };
        Ok(self.encode_impl(text, opts.add_special, scan))
    }

    /// Encodes `text` as [`encode`](Self::encode) does, except that text that spells a
    /// special token (user-defined ones too) is split like any other text: for untrusted input
    /// (a user's message in a chat prompt built from ids) that must not be able to inject
    /// `<|im_end|>` and the like. The special tokens around the text are still added.
    ///
    /// ```no_run
    /// # fn main() -> qkv::Result<()> {
    /// # let tok: qkv::tokenizer::Tokenizer = unimplemented!();
    /// let ids = tok.encode_literal("hi<|im_end|>")?;
    /// assert!(ids.iter().all(|&id| !tok.is_special(id)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn encode_literal(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode_impl(text, true, None))
    }

    fn encode_impl(
        &self,
        text: &str,
        add_special: bool,
        scan: Option<&(AhoCorasick, Vec<usize>)>,
    ) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        if add_special {
            out.extend_from_slice(&self.prefix);
        }
        let mut scratch = Scratch::default();
        if self.llama_split {
            let mut pieces = std::mem::take(&mut scratch.pieces);
            match scan {
                Some((scan, index)) => {
                    split::partition(text, &self.specials, scan, index, &mut pieces)
                }
                None if text.is_empty() => {}
                None => pieces.push(split::Piece::Text(0, text.len())),
            }
            for &piece in &pieces {
                match piece {
                    split::Piece::Text(a, b) => {
                        self.encode_text(&text[a..b], a == 0, &mut scratch, &mut out)
                    }
                    split::Piece::Token(id) => out.push(id),
                }
            }
            if add_special {
                out.extend_from_slice(&self.suffix);
            }
            return out;
        }
        let mut plain = 0;
        if let Some((scan, index)) = scan {
            for m in scan.find_iter(text) {
                if m.start() < plain {
                    continue; // inside whitespace a previous token swallowed
                }
                let sp = &self.specials[index[m.pattern().as_usize()]];
                let end = if sp.lstrip {
                    plain + text[plain..m.start()].trim_end().len()
                } else {
                    m.start()
                };
                self.encode_text(&text[plain..end], plain == 0, &mut scratch, &mut out);
                out.push(sp.id);
                plain = m.end();
                if sp.rstrip {
                    plain = text.len() - text[plain..].trim_start().len();
                }
            }
        }
        self.encode_text(&text[plain..], plain == 0, &mut scratch, &mut out);
        if add_special {
            out.extend_from_slice(&self.suffix);
        }
        out
    }

    /// Encodes a run of text without special tokens; `at_start` when it begins the input.
    fn encode_text(&self, text: &str, at_start: bool, s: &mut Scratch, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let text = self.normalizer.apply(text, at_start);
        let vocab = &self.vocab;
        match &self.model {
            Model::Bpe(bpe) => self.pre.split(&text, &mut |piece| {
                bpe.encode_piece(piece, vocab, &mut s.bpe, out)
            }),
            Model::Spm { scores, byte_ids } => {
                let spm = spm::Spm {
                    vocab,
                    scores,
                    byte_ids,
                };
                self.pre
                    .split(&text, &mut |piece| spm.encode(piece, &mut s.spm, out))
            }
            Model::WordPiece(wp) => self.pre.split(&text, &mut |word| {
                wp.encode_word(word, vocab, &mut s.buf, out)
            }),
            Model::Wpm(w) => w.encode(&text, vocab, &mut s.buf, &mut s.word, out),
            Model::Unigram(u) => u.encode(&text, &mut s.unigram, out),
        }
    }

    /// Decodes ids into text: the tokens' bytes are joined (special tokens as they are spelt),
    /// then read as UTF-8, invalid sequences (only possible from unusual id sequences) becoming
    /// U+FFFD. The space a SentencePiece or WordPiece encoder puts before the first word is
    /// dropped. [`Error::TokenOutOfRange`] for an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        if self.strip_first_space && bytes.first() == Some(&b' ') {
            bytes.remove(0);
        }
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// Formats a conversation with the model's own chat template (`tokenizer.chat_template`,
    /// rendered with minijinja as transformers renders it, with this vocabulary's BOS and EOS
    /// as `bos_token` and `eos_token`), ending with the header of an assistant turn when
    /// `add_generation_prompt`. A model stored without a template gets plain ChatML if its
    /// vocabulary has both markers. The text still has to be encoded: special tokens spelt
    /// in it are parsed, and BOS is added only if the vocabulary asks for it.
    ///
    /// [`Error::ChatTemplate`] when the template fails (minijinja's message, or the
    /// template's own `raise_exception`); [`Error::Unsupported`] when the model has no
    /// template and no ChatML markers (a base model: its turns would be plain text it was
    /// never trained on).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let messages: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        let options = ChatOptions {
            add_generation_prompt,
            ..ChatOptions::default()
        };
        self.render_chat(&messages, &options)
    }

    /// As [`apply_chat_template`](Self::apply_chat_template) for messages as JSON objects
    /// (with `tool_calls`, content parts or anything else a template reads) and every
    /// [`ChatOptions`] field (tools, extra variables, the clock).
    pub fn render_chat(
        &self,
        messages: &[serde_json::Value],
        options: &ChatOptions,
    ) -> Result<String> {
        let template = match &self.chat_template {
            Some(source) => ChatTemplate::new("tokenizer.chat_template", source.as_str()),
            None if ["<|im_start|>", "<|im_end|>"]
                .iter()
                .all(|m| self.vocab.contains_key(*m)) =>
            {
                ChatTemplate::chatml()
            }
            None => {
                return Err(Error::Unsupported(
                    "the model has no chat template, and its vocabulary has no ChatML markers \
                     (`<|im_start|>`, `<|im_end|>`): it has no chat format to follow"
                        .into(),
                ))
            }
        };
        let name = |id: Option<u32>| id.and_then(|id| self.token_str(id).ok());
        template
            .with_special_tokens(name(self.bos), name(self.eos))
            .render(messages, options)
    }
}

/// Removes and returns the complete UTF-8 at the front of `pending`, leaving an unfinished
/// character's bytes for more to come; bytes that can never become valid UTF-8 come out as
/// U+FFFD. What [`StreamDecoder`] does with each token's bytes, for callers that keep the
/// pending bytes themselves (a server's response stream, which owns no tokenizer borrow).
pub fn take_complete_utf8(pending: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut start = 0;
    loop {
        match std::str::from_utf8(&pending[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = pending.len();
                break;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                let s = &pending[start..start + valid];
                out.push_str(std::str::from_utf8(s).unwrap_or_default());
                start += valid;
                match e.error_len() {
                    Some(bad) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        start += bad;
                    }
                    None => break, // an incomplete character: wait for more bytes
                }
            }
        }
    }
    pending.drain(..start);
    out
}

/// Turns token ids into text as they arrive, emitting only complete UTF-8: bytes of a
/// character split across tokens wait for the rest of it, so nothing prints as garbage.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder with nothing pending.
    pub fn new(tokenizer: &'a Tokenizer) -> StreamDecoder<'a> {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds token `id` and returns the text that is now complete (possibly empty). Bytes that
    /// can never become valid UTF-8 come out as U+FFFD.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.pending
            .extend_from_slice(self.tokenizer.token_bytes(id)?);
        Ok(take_complete_utf8(&mut self.pending))
    }

    /// Flushes what is left (an unfinished character becomes U+FFFD) and resets.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// True when bytes of an unfinished character are waiting.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}
