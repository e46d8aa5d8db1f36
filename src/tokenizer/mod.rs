//! Text ↔ token ids: byte-level BPE (GGUF's `gpt2` tokenizer model, Hugging Face's
//! `ByteLevel` + `BPE`), built from GGUF metadata or from a Hugging Face `tokenizer.json`, plus
//! the ChatML chat template and a streaming decoder that never splits a character.
//!
//! # How text is encoded
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
//! # Why not the `tokenizers` crate
//!
//! It is the reference implementation, but qkv needs only one of its models (BPE) and one
//! pre-tokenizer family, and the crate (with `fancy-regex`, no default features) took 57 s to
//! build in debug on one core of this machine, pulling in ~80 crates, for every clean build on
//! a 2-core box shared by several builders. The byte-level BPE here is ~300 lines on the
//! `regex` crate the workspace already builds; the look-ahead `\s+(?!\S)`, which `regex`
//! lacks, is a two-line rule. Equality with `tokenizers` is enforced by the fixture tests
//! rather than assumed.
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
mod hf;
mod template;

pub use template::{ChatOptions, ChatTemplate};

use crate::error::{Error, Result};
use crate::weights::gguf::GgufFile;
use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use bpe::{bpe_word, Merges, PreTokenizer, Scratch};
use std::collections::HashMap;
use std::path::Path;

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

/// Everything needed to build a [`Tokenizer`], whatever file it came from.
pub(crate) struct Parts {
    pub tokens: Vec<String>,
    /// Tokens matched whole in the text (control / added tokens).
    pub special: Vec<bool>,
    /// Merges as pairs of token strings, in rank order.
    pub merges: Vec<(String, String)>,
    pub split_digits: bool,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub chat_template: Option<String>,
    /// Where the data came from, for error messages.
    pub source: String,
}

/// A byte-level BPE tokenizer. Immutable once built; `Send + Sync`, so one serves every
/// session.
pub struct Tokenizer {
    tokens: Vec<String>,
    /// Decoded bytes of every token, back to back; token `i` is
    /// `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    vocab: HashMap<String, u32>,
    merges: Merges,
    byte_ids: [u32; 256],
    byte_chars: [char; 256],
    /// Special tokens as (text, id), longest first.
    specials: Vec<(String, u32)>,
    /// Per token: special (control, user-defined), as the model file marks it.
    special_flags: Vec<bool>,
    /// Finds the special tokens in text: leftmost match first, the longest one there (the
    /// order a left-to-right scan trying the longest special first would give), in time
    /// linear in the text whatever the number and length of the specials. `None` without
    /// specials.
    special_scan: Option<AhoCorasick>,
    pre: PreTokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("merges", &self.merges.len())
            .field("specials", &self.specials.len())
            .field("split_digits", &self.pre.split_digits)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

/// Marks a byte without a token in `Tokenizer::byte_ids`.
const NO_TOKEN: u32 = u32::MAX;

/// GGUF `tokenizer.ggml.pre` values whose pre-tokenizer isolates each digit before the GPT-2
/// regex (llama.cpp groups them the same way).
const DIGIT_SPLITTING_PRE: &[&str] = &["smollm", "starcoder", "refact", "codeshell", "exaone"];

/// GGUF `tokenizer.ggml.pre` values that mean the plain GPT-2 regex. Any other value names a
/// pre-tokenizer qkv does not implement, and is refused rather than silently split wrongly.
const GPT2_PRE: &[&str] = &["default", "gpt-2", "gpt2"];

/// The largest vocabulary qkv builds (2^21 tokens, 8× the largest real ones): the tokenizer
/// keeps each token's text and bytes, so a file must not be able to ask for arbitrarily many.
pub const MAX_VOCAB: usize = 1 << 21;

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata: `model` must be
    /// `gpt2`; `tokens`, `merges`, `token_type` (3 and 4 are kept whole in text), the optional
    /// `bos_token_id`, `eos_token_id`, `padding_token_id`, `add_bos_token`, `add_eos_token`,
    /// `pre` (digit splitting, see the module doc) and `tokenizer.chat_template`.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let model = file.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(Error::Unsupported(format!(
                "{}: tokenizer model `{model}` (qkv supports byte-level BPE, `gpt2`)",
                file.path().display()
            )));
        }
        let tokens: Vec<String> = file
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let mut special = match file.metadata("tokenizer.ggml.token_type") {
            // Without types, the BOS, EOS and padding tokens (marked below) are the control
            // tokens a prompt may spell, as a chat template does.
            None => vec![false; tokens.len()],
            Some(_) => {
                let types = file.get_i32_array("tokenizer.ggml.token_type")?;
                if types.len() != tokens.len() {
                    return Err(Error::Format {
                        path: file.path().to_owned(),
                        msg: format!(
                            "tokenizer.ggml.token_type has {} entries for {} tokens",
                            types.len(),
                            tokens.len()
                        ),
                    });
                }
                types.iter().map(|&t| t == 3 || t == 4).collect()
            }
        };
        let mut merges = Vec::new();
        if file.metadata("tokenizer.ggml.merges").is_some() {
            for (i, m) in file
                .get_str_array("tokenizer.ggml.merges")?
                .into_iter()
                .enumerate()
            {
                let (a, b) = m.split_once(' ').ok_or_else(|| Error::Format {
                    path: file.path().to_owned(),
                    msg: format!("tokenizer.ggml.merges[{i}] = {m:?} is not two tokens"),
                })?;
                merges.push((a.to_owned(), b.to_owned()));
            }
        }
        let id = |key: &str| -> Result<Option<u32>> {
            match file.metadata(key) {
                None => Ok(None),
                Some(_) => file.get_u32(key).map(Some),
            }
        };
        let flag = |key: &str| -> Result<Option<bool>> {
            match file.metadata(key) {
                None => Ok(None),
                Some(_) => file.get_bool(key).map(Some),
            }
        };
        let pre = match file.metadata("tokenizer.ggml.pre") {
            None => "default",
            Some(_) => file.get_str("tokenizer.ggml.pre")?,
        };
        if !GPT2_PRE.contains(&pre) && !DIGIT_SPLITTING_PRE.contains(&pre) {
            return Err(Error::Unsupported(format!(
                "{}: pre-tokenizer `{}` (qkv implements {} and, splitting digits, {})",
                file.path().display(),
                pre.escape_debug(),
                GPT2_PRE.join(", "),
                DIGIT_SPLITTING_PRE.join(", ")
            )));
        }
        let chat_template = match file.metadata("tokenizer.chat_template") {
            None => None,
            Some(_) => Some(file.get_str("tokenizer.chat_template")?.to_owned()),
        };
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let eos = id("tokenizer.ggml.eos_token_id")?;
        let pad = id("tokenizer.ggml.padding_token_id")?;
        if file.metadata("tokenizer.ggml.token_type").is_none() {
            // Ids past the vocabulary are refused by `build`.
            for id in [bos, eos, pad].into_iter().flatten() {
                if let Some(s) = special.get_mut(id as usize) {
                    *s = true;
                }
            }
        }
        Tokenizer::build(Parts {
            tokens,
            special,
            merges,
            split_digits: DIGIT_SPLITTING_PRE.contains(&pre),
            bos,
            eos,
            pad,
            add_bos: flag("tokenizer.ggml.add_bos_token")?.unwrap_or(false),
            add_eos: flag("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            chat_template,
            source: file.path().display().to_string(),
        })
    }

    /// Builds the tokenizer from a Hugging Face `tokenizer.json` (a `BPE` model with a
    /// `ByteLevel` pre-tokenizer, optionally after `Digits`). BOS/EOS ids, `add_bos_token` and
    /// the chat template come from a `tokenizer_config.json` beside it when there is one.
    pub fn from_tokenizer_json(path: &Path) -> Result<Tokenizer> {
        Tokenizer::build(hf::load(path)?)
    }

    pub(crate) fn build(p: Parts) -> Result<Tokenizer> {
        let bad = |msg: String| Error::Tokenizer(format!("{}: {msg}", p.source));
        let n = p.tokens.len();
        if n == 0 || n > MAX_VOCAB {
            return Err(bad(format!(
                "vocabulary of {n} tokens (qkv takes 1 to {MAX_VOCAB})"
            )));
        }
        let mut vocab = HashMap::with_capacity(n);
        for (i, t) in p.tokens.iter().enumerate() {
            // The first of duplicate strings wins, as in Hugging Face.
            vocab.entry(t.clone()).or_insert(i as u32);
        }
        for (what, id) in [("bos", p.bos), ("eos", p.eos), ("padding", p.pad)] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(bad(format!(
                        "{what} token id {id} is outside the vocabulary of {n}"
                    )));
                }
            }
        }
        if p.add_bos && p.bos.is_none() {
            return Err(bad("add_bos_token is set but there is no bos token".into()));
        }
        if p.add_eos && p.eos.is_none() {
            return Err(bad("add_eos_token is set but there is no eos token".into()));
        }

        let byte_chars = bpe::byte_to_char();
        let char_bytes = bpe::char_to_byte();
        // Bytes the vocabulary has no token for (SmolLM2 lacks a few control bytes and bytes
        // that never occur in UTF-8) are dropped when encoding, as Hugging Face's BPE without
        // an unknown token and llama.cpp both do.
        let mut byte_ids = [NO_TOKEN; 256];
        for (b, c) in byte_chars.iter().enumerate() {
            if let Some(&id) = vocab.get(c.to_string().as_str()) {
                byte_ids[b] = id;
            }
        }
        if byte_ids.iter().filter(|&&id| id != NO_TOKEN).count() < 128 {
            return Err(bad(
                "fewer than half of the 256 byte tokens are in the vocabulary: not a \
                 byte-level BPE vocabulary"
                    .into(),
            ));
        }

        let mut merges = Merges::with_capacity(p.merges.len());
        for (rank, (a, b)) in p.merges.iter().enumerate() {
            let look = |s: &str| {
                vocab.get(s).copied().ok_or_else(|| {
                    bad(format!(
                        "merge {rank} `{a} {b}`: `{s}` is not in the vocabulary"
                    ))
                })
            };
            let pair = (look(a)?, look(b)?);
            let merged = look(&format!("{a}{b}"))?;
            // An earlier (lower-rank) duplicate wins.
            merges.entry(pair).or_insert((rank as u32, merged));
        }

        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n + 1);
        let mut specials = Vec::new();
        for (i, t) in p.tokens.iter().enumerate() {
            offsets.push(bytes.len());
            let is_special = p.special.get(i).copied().unwrap_or(false);
            if is_special && !t.is_empty() {
                specials.push((t.clone(), i as u32));
            }
            let mapped: Option<Vec<u8>> = t.chars().map(|c| char_bytes.get(&c).copied()).collect();
            match mapped {
                Some(m) if !is_special => bytes.extend_from_slice(&m),
                _ => bytes.extend_from_slice(t.as_bytes()),
            }
        }
        offsets.push(bytes.len());
        let special_flags: Vec<bool> = (0..p.tokens.len())
            .map(|i| p.special.get(i).copied().unwrap_or(false))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let special_scan = if specials.is_empty() {
            None
        } else {
            // The NFA builds in time linear in the specials' total length (the DFA the
            // builder would pick can take minutes for one very long special token).
            let scan = AhoCorasick::builder()
                .kind(Some(AhoCorasickKind::NoncontiguousNFA))
                .match_kind(MatchKind::LeftmostLongest)
                .build(specials.iter().map(|(s, _)| s.as_str()))
                .map_err(|e| bad(format!("special tokens: {e}")))?;
            Some(scan)
        };

        Ok(Tokenizer {
            tokens: p.tokens,
            bytes,
            offsets,
            vocab,
            merges,
            byte_ids,
            byte_chars,
            specials,
            special_flags,
            special_scan,
            pre: PreTokenizer::new(p.split_digits),
            bos: p.bos,
            eos: p.eos,
            pad: p.pad,
            add_bos: p.add_bos,
            add_eos: p.add_eos,
            chat_template: p.chat_template,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// True for the special tokens (control and user-defined: end of turn, role markers,
    /// padding…), which [`encode`](Self::encode) matches whole in text and which a reader of
    /// generated text usually does not want to see. False for ids outside the vocabulary.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_flags
            .get(id as usize)
            .copied()
            .unwrap_or(false)
    }

    /// The beginning-of-sequence token, if the model has one.
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

    /// True when [`encode`](Self::encode) prepends the BOS token.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// The chat template stored with the model (Jinja source), if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The id of the token spelt `text`: first as the vocabulary spells it (`<|im_end|>`,
    /// `Ġthe`), else as the token whose bytes are `text` (` the`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        if let Some(&id) = self.vocab.get(text) {
            return Some(id);
        }
        let spelt: String = text.bytes().map(|b| self.byte_chars[b as usize]).collect();
        self.vocab.get(&spelt).copied()
    }

    /// The vocabulary's spelling of token `id` (byte-level characters, e.g. `Ġthe`).
    pub fn token_str(&self, id: u32) -> Result<&str> {
        self.tokens
            .get(id as usize)
            .map(String::as_str)
            .ok_or(Error::TokenOutOfRange {
                id,
                vocab: self.tokens.len(),
            })
    }

    /// The bytes token `id` stands for (` the` for `Ġthe`); possibly part of a UTF-8
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

    /// Encodes `text` into token ids. Special tokens in the text are kept whole. The BOS token
    /// is prepended only when the model asks for it (`tokenizer.ggml.add_bos_token`), EOS
    /// appended only when it asks for that.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true)
    }

    /// Encodes `text` as [`encode`](Self::encode) does, except that text that spells a
    /// special token is split like any other text: for untrusted input (a user's message in
    /// a chat prompt built from ids) that must not be able to inject `<|im_end|>` and the
    /// like. BOS and EOS are still added when the model asks for them.
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
        self.encode_with(text, false)
    }

    fn encode_with(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if self.add_bos {
            out.extend(self.bos);
        }
        let mut scratch = Scratch::default();
        let mut word_ids = Vec::new();
        let mut plain_start = 0;
        let scan = self.special_scan.as_ref().filter(|_| parse_special);
        for m in scan.into_iter().flat_map(|scan| scan.find_iter(text)) {
            self.encode_plain(
                &text[plain_start..m.start()],
                &mut scratch,
                &mut word_ids,
                &mut out,
            );
            out.push(self.specials[m.pattern().as_usize()].1);
            plain_start = m.end();
        }
        self.encode_plain(&text[plain_start..], &mut scratch, &mut word_ids, &mut out);
        if self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    fn encode_plain(
        &self,
        text: &str,
        scratch: &mut Scratch,
        word_ids: &mut Vec<u32>,
        out: &mut Vec<u32>,
    ) {
        self.pre.split(text, |word| {
            word_ids.clear();
            word_ids.extend(
                word.bytes()
                    .map(|b| self.byte_ids[b as usize])
                    .filter(|&id| id != NO_TOKEN),
            );
            bpe_word(word_ids, &self.merges, scratch, out);
        });
    }

    /// Decodes ids into text: the tokens' bytes are joined, then read as UTF-8, invalid
    /// sequences (only possible from unusual id sequences) becoming U+FFFD.
    /// [`Error::TokenOutOfRange`] for an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// Formats a conversation with the model's ChatML template: for each message
    /// `<|im_start|>{role}\n{content}<|im_end|>\n`, then `<|im_start|>assistant\n` when
    /// `add_generation_prompt`. When the model's template inserts a default system message
    /// before a conversation that does not start with one (SmolLM2: "You are a helpful AI
    /// assistant named SmolLM, trained by Hugging Face"), so does this. A model stored
    /// without a template gets plain ChatML if its vocabulary has both markers.
    ///
    /// [`Error::Unsupported`] when the model's template is not ChatML, or when it has none
    /// and its vocabulary lacks `<|im_start|>` or `<|im_end|>` (a base model: its turns would
    /// be plain text it was never trained on).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let default_system = match &self.chat_template {
            None if ["<|im_start|>", "<|im_end|>"]
                .iter()
                .all(|m| self.vocab.contains_key(*m)) =>
            {
                None
            }
            None => {
                return Err(Error::Unsupported(
                    "the model has no chat template, and its vocabulary has no ChatML markers \
                     (`<|im_start|>`, `<|im_end|>`): it has no chat format to follow"
                        .into(),
                ))
            }
            Some(t) if t.contains("<|im_start|>") => chatml_default_system(t),
            Some(_) => {
                return Err(Error::Unsupported(
                    "the model's chat template is not ChatML (`<|im_start|>`), the only \
                     template qkv implements"
                        .into(),
                ))
            }
        };
        let mut out = String::new();
        let mut turn = |role: &str, content: &str| {
            out.push_str("<|im_start|>");
            out.push_str(role);
            out.push('\n');
            out.push_str(content);
            out.push_str("<|im_end|>\n");
        };
        if let (Some(sys), Some(first)) = (&default_system, messages.first()) {
            if first.role != "system" {
                turn("system", sys);
            }
        }
        for m in messages {
            turn(&m.role, &m.content);
        }
        if add_generation_prompt {
            out.push_str("<|im_start|>assistant\n");
        }
        Ok(out)
    }
}

/// The default system prompt of a ChatML template of the form
/// `{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n…<|im_end|>\n' }}`.
fn chatml_default_system(template: &str) -> Option<String> {
    let cond = template
        .find("!= 'system'")
        .or_else(|| template.find("!= \"system\""))?;
    let rest = &template[cond..];
    let endif = rest.find("endif").unwrap_or(rest.len());
    let block = &rest[..endif];
    const OPEN: &str = "<|im_start|>system";
    let start = block.find(OPEN)? + OPEN.len();
    let body = &block[start..];
    let body = body
        .strip_prefix("\\n")
        .or_else(|| body.strip_prefix('\n'))?;
    let end = body.find("<|im_end|>")?;
    Some(body[..end].replace("\\n", "\n"))
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
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    let s = &self.pending[start..start + valid];
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
        self.pending.drain(..start);
        Ok(out)
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
