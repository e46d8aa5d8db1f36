//! What a tokenizer file says ([`Parts`], filled by the GGUF and tokenizer.json readers), and
//! the one place that checks it and builds a [`Tokenizer`] from it.

use super::bpe::{self, Bpe, Merges, Unknown, WholePiece, NO_TOKEN};
use super::normalize::Normalizer;
use super::pretok::PreTokenizer;
use super::unigram::{CharsMap, Unigram};
use super::wordpiece::WordPiece;
use super::wpm::Wpm;
use super::{Model, Special, Tokenizer};
use crate::error::{Error, Result};
use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use std::collections::HashMap;

/// What a token is, as GGUF's `tokenizer.ggml.token_type` says (Hugging Face: added tokens are
/// control tokens when `special`, user-defined otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Normal,
    /// The unknown token (type 2).
    Unknown,
    /// Control tokens (type 3): BOS, end of turn, role markers.
    Control,
    /// Added tokens matched whole even in literal text (type 4).
    UserDefined,
    /// Type 5.
    Unused,
    /// A byte, spelt `<0xXX>` (type 6).
    Byte,
}

impl Kind {
    /// The kind GGUF token type `t` stands for; `None` for a value outside 0..=6.
    pub(crate) fn from_gguf(t: i32) -> Option<Kind> {
        Some(match t {
            // 0 is "undefined": llama.cpp tokenizes such tokens as normal ones.
            0 | 1 => Kind::Normal,
            2 => Kind::Unknown,
            3 => Kind::Control,
            4 => Kind::UserDefined,
            5 => Kind::Unused,
            6 => Kind::Byte,
            _ => return None,
        })
    }

    /// Matched whole in text when special tokens are parsed.
    pub(crate) fn is_special(self) -> bool {
        matches!(self, Kind::Unknown | Kind::Control | Kind::UserDefined)
    }
}

/// The vocabulary model, with its data as strings.
pub(crate) enum ModelSpec {
    /// BPE with a merge list, pairs of token strings in rank order.
    Bpe {
        merges: Vec<(String, String)>,
        byte_level: bool,
        unknown: UnknownSpec,
        whole: WholePiece,
    },
    /// SentencePiece merges by score (GGUF `llama`); one score per token.
    Spm { scores: Vec<f32> },
    WordPiece {
        first_prefix: String,
        cont_prefix: String,
        max_chars: usize,
    },
    /// llama.cpp's WordPiece with its own normalization (GGUF `bert`).
    Wpm {
        lowercase: bool,
        strip_accents: bool,
    },
    /// Unigram by score (GGUF `t5`), with SentencePiece's normalizer settings.
    Unigram {
        scores: Vec<f32>,
        /// `tokenizer.ggml.precompiled_charsmap`, as stored.
        charsmap: Option<Vec<u8>>,
        add_space_prefix: bool,
        remove_extra_whitespaces: bool,
    },
}

/// What a BPE symbol without a token becomes (the unknown token is [`Parts::unk`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UnknownSpec {
    Drop,
    ByteFallback,
    Unk { fuse: bool },
}

/// Everything needed to build a [`Tokenizer`], whatever file it came from.
pub(crate) struct Parts {
    pub tokens: Vec<String>,
    pub kinds: Vec<Kind>,
    /// Special tokens that swallow the whitespace before (`lstrip`) or after (`rstrip`) them.
    pub strip: Vec<(u32, bool, bool)>,
    /// Special tokens are cut out of text in llama.cpp's order (longest token first, see
    /// split.rs) rather than Hugging Face's (leftmost first).
    pub llama_split: bool,
    pub model: ModelSpec,
    pub normalizer: Normalizer,
    pub pre: PreTokenizer,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    /// Tokens put before / after the text when special tokens are added.
    pub prefix: Vec<u32>,
    pub suffix: Vec<u32>,
    pub chat_template: Option<String>,
    /// Where the data came from, for error messages.
    pub source: String,
    /// The fill-in-the-middle markers ([`super::FimTokens`]'s order).
    pub fim: [Option<u32>; 6],
}

/// The largest vocabulary qkv builds (2^21 tokens, 8× the largest real ones): the tokenizer
/// keeps each token's text and bytes, so a file must not be able to ask for arbitrarily many.
pub const MAX_VOCAB: usize = 1 << 21;

/// The byte a `<0xXX>` token stands for.
pub(crate) fn byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// What the model builders need of the [`Parts`] besides the model's own data.
struct Context<'a> {
    tokens: &'a [String],
    kinds: &'a [Kind],
    vocab: &'a HashMap<String, u32>,
    unk: Option<u32>,
    source: &'a str,
}

impl Context<'_> {
    fn bad(&self, msg: String) -> Error {
        Error::Tokenizer(format!("{}: {msg}", self.source))
    }

    /// The model, and whether it is byte-level BPE.
    fn model(&self, spec: ModelSpec) -> Result<(Model, bool)> {
        Ok(match spec {
            ModelSpec::Bpe {
                merges,
                byte_level,
                unknown,
                whole,
            } => (self.bpe(&merges, byte_level, unknown, whole)?, byte_level),
            ModelSpec::Spm { scores } => (self.spm(scores)?, false),
            ModelSpec::WordPiece {
                first_prefix,
                cont_prefix,
                max_chars,
            } => {
                let model = Model::WordPiece(WordPiece {
                    first_prefix,
                    cont_prefix,
                    max_chars,
                    unk: self.word_piece_unk()?,
                    max_token_len: self.max_token_len(),
                });
                (model, false)
            }
            ModelSpec::Wpm {
                lowercase,
                strip_accents,
            } => {
                let model = Model::Wpm(Wpm {
                    lowercase,
                    strip_accents,
                    unk: self.word_piece_unk()?,
                    max_token_len: self.max_token_len(),
                });
                (model, false)
            }
            ModelSpec::Unigram {
                scores,
                charsmap,
                add_space_prefix,
                remove_extra_whitespaces,
            } => {
                let mut model = self.unigram(scores, charsmap)?;
                model.add_space_prefix = add_space_prefix;
                model.remove_extra_whitespaces = remove_extra_whitespaces;
                (Model::Unigram(Box::new(model)), false)
            }
        })
    }

    /// The `<0xXX>` token of each byte (the first of duplicates), or [`NO_TOKEN`].
    fn byte_fallback(&self) -> [u32; 256] {
        let mut ids = [NO_TOKEN; 256];
        for (i, t) in self.tokens.iter().enumerate() {
            if let Some(b) = byte_token(t) {
                if ids[b as usize] == NO_TOKEN {
                    ids[b as usize] = i as u32;
                }
            }
        }
        ids
    }

    /// The token of each byte: GPT-2's byte characters when byte-level, else `<0xXX>`.
    fn byte_ids(&self, byte_level: bool) -> Result<[u32; 256]> {
        if !byte_level {
            return Ok(self.byte_fallback());
        }
        let chars = bpe::byte_to_char();
        let mut ids = [NO_TOKEN; 256];
        for (b, c) in chars.iter().enumerate() {
            if let Some(&id) = self.vocab.get(c.to_string().as_str()) {
                ids[b] = id;
            }
        }
        // Bytes without a token (SmolLM2 lacks a few control bytes and bytes that never
        // occur in UTF-8) are dropped when encoding, as llama.cpp does.
        if ids.iter().filter(|&&id| id != NO_TOKEN).count() < 128 {
            return Err(self.bad(
                "fewer than half of the 256 byte tokens are in the vocabulary: not a \
                 byte-level BPE vocabulary"
                    .into(),
            ));
        }
        Ok(ids)
    }

    fn bpe(
        &self,
        merges: &[(String, String)],
        byte_level: bool,
        unknown: UnknownSpec,
        whole: WholePiece,
    ) -> Result<Model> {
        let byte_ids = self.byte_ids(byte_level)?;
        let unknown = match unknown {
            UnknownSpec::Drop => Unknown::Drop,
            UnknownSpec::ByteFallback => {
                if let Some(b) = byte_ids.iter().position(|&id| id == NO_TOKEN) {
                    return Err(self.bad(format!(
                        "byte fallback, but no token <0x{b:02X}> in the vocabulary"
                    )));
                }
                Unknown::ByteFallback
            }
            UnknownSpec::Unk { fuse } => Unknown::Unk {
                id: self
                    .unk
                    .ok_or_else(|| self.bad("BPE with an unknown token that is not set".into()))?,
                fuse,
            },
        };
        Ok(Model::Bpe(Bpe {
            merges: self.merge_table(merges)?,
            byte_level,
            unknown,
            whole,
            byte_ids,
        }))
    }

    /// The merges as token id pairs, each with its rank and the token it makes.
    fn merge_table(&self, merges: &[(String, String)]) -> Result<Merges> {
        let mut table = Merges::with_capacity(merges.len());
        for (rank, (a, b)) in merges.iter().enumerate() {
            let look = |s: &str| {
                self.vocab.get(s).copied().ok_or_else(|| {
                    self.bad(format!(
                        "merge {rank} `{a} {b}`: `{s}` is not in the vocabulary"
                    ))
                })
            };
            let pair = (look(a)?, look(b)?);
            let merged = look(&format!("{a}{b}"))?;
            // An earlier (lower-rank) duplicate wins.
            table.entry(pair).or_insert((rank as u32, merged));
        }
        Ok(table)
    }

    fn spm(&self, scores: Vec<f32>) -> Result<Model> {
        let n = self.tokens.len();
        if scores.len() != n {
            return Err(self.bad(format!("{} scores for {n} tokens", scores.len())));
        }
        if let Some(i) = scores.iter().position(|s| s.is_nan()) {
            return Err(self.bad(format!("the score of token {i} is NaN")));
        }
        let mut byte_ids = self.byte_fallback();
        for (b, id) in byte_ids.iter_mut().enumerate() {
            if *id == NO_TOKEN {
                // Like llama.cpp: the byte as a one-byte token, else the unknown token.
                let single = (b < 0x80).then(|| self.vocab.get(&(b as u8 as char).to_string()));
                *id = single.flatten().copied().or(self.unk).ok_or_else(|| {
                    self.bad(format!(
                        "no token <0x{b:02X}> for byte fallback and no unknown token"
                    ))
                })?;
            }
        }
        Ok(Model::Spm { scores, byte_ids })
    }

    fn word_piece_unk(&self) -> Result<u32> {
        self.unk
            .ok_or_else(|| self.bad("WordPiece without an unknown token".into()))
    }

    fn max_token_len(&self) -> usize {
        self.tokens.iter().map(String::len).max().unwrap_or(0)
    }

    fn unigram(&self, scores: Vec<f32>, charsmap: Option<Vec<u8>>) -> Result<Unigram> {
        let n = self.tokens.len();
        if scores.len() != n {
            return Err(self.bad(format!("{} scores for {n} tokens", scores.len())));
        }
        if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
            return Err(self.bad(format!("the score of token {i} is not finite")));
        }
        let unk = self
            .unk
            .ok_or_else(|| self.bad("Unigram without an unknown token".into()))?;
        let is = |k: Kind| self.kinds.iter().map(|&x| x == k).collect::<Vec<bool>>();
        let mut model = Unigram::new(
            self.tokens,
            scores,
            &is(Kind::Normal),
            is(Kind::UserDefined),
            &is(Kind::Unused),
            unk,
        );
        model.charsmap = match charsmap {
            Some(blob) => Some(
                CharsMap::parse(&blob)
                    .map_err(|e| self.bad(format!("tokenizer.ggml.precompiled_charsmap: {e}")))?,
            ),
            None => None,
        };
        Ok(model)
    }

    /// The special tokens, longest first, with their whitespace stripping.
    fn specials(&self, strip: &[(u32, bool, bool)]) -> Vec<Special> {
        let mut by_id: HashMap<u32, (bool, bool)> = HashMap::new();
        for &(id, l, r) in strip {
            by_id.insert(id, (l, r));
        }
        let mut specials: Vec<Special> = self
            .tokens
            .iter()
            .zip(self.kinds)
            .enumerate()
            .filter(|(_, (t, k))| k.is_special() && !t.is_empty())
            .map(|(i, (t, &k))| {
                let (lstrip, rstrip) = by_id.get(&(i as u32)).copied().unwrap_or_default();
                Special {
                    text: t.clone(),
                    id: i as u32,
                    user_defined: k == Kind::UserDefined,
                    lstrip,
                    rstrip,
                }
            })
            .collect();
        specials.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        specials
    }

    /// A scanner for the specials `which` picks, with their indices in `specials`.
    fn scanner(
        &self,
        specials: &[Special],
        llama_split: bool,
        which: &dyn Fn(&Special) -> bool,
    ) -> Result<Option<(AhoCorasick, Vec<usize>)>> {
        let idx: Vec<usize> = (0..specials.len())
            .filter(|&i| which(&specials[i]))
            .collect();
        if idx.is_empty() {
            return Ok(None);
        }
        // Leftmost match first, the longest one there (Hugging Face's order), in time linear
        // in the text whatever the number and length of the specials. The NFA builds in time
        // linear in the specials' total length (a DFA can take minutes for one very long
        // special token).
        let scan = AhoCorasick::builder()
            .kind(Some(AhoCorasickKind::NoncontiguousNFA))
            .match_kind(if llama_split {
                // Every occurrence, overlapping ones too: split.rs picks among them.
                MatchKind::Standard
            } else {
                MatchKind::LeftmostLongest
            })
            .build(idx.iter().map(|&i| specials[i].text.as_str()))
            .map_err(|e| self.bad(format!("special tokens: {e}")))?;
        Ok(Some((scan, idx)))
    }
}

/// Checks the vocabulary's size and the special ids; the id of each token text (the first of
/// duplicates wins, as in Hugging Face).
fn vocab_index(p: &Parts) -> Result<HashMap<String, u32>> {
    let bad = |msg: String| Error::Tokenizer(format!("{}: {msg}", p.source));
    let n = p.tokens.len();
    if n == 0 || n > MAX_VOCAB {
        return Err(bad(format!(
            "vocabulary of {n} tokens (qkv takes 1 to {MAX_VOCAB})"
        )));
    }
    if p.kinds.len() != n {
        return Err(bad(format!("{} token kinds for {n} tokens", p.kinds.len())));
    }
    let mut vocab = HashMap::with_capacity(n);
    for (i, t) in p.tokens.iter().enumerate() {
        vocab.entry(t.clone()).or_insert(i as u32);
    }
    for (what, id) in [
        ("bos", p.bos),
        ("eos", p.eos),
        ("padding", p.pad),
        ("unknown", p.unk),
        ("separator", p.sep),
    ] {
        if let Some(id) = id.filter(|&id| id as usize >= n) {
            return Err(bad(format!(
                "{what} token id {id} is outside the vocabulary of {n}"
            )));
        }
    }
    if let Some(&id) = p
        .prefix
        .iter()
        .chain(&p.suffix)
        .find(|&&id| id as usize >= n)
    {
        return Err(bad(format!(
            "added special token id {id} is outside the vocabulary of {n}"
        )));
    }
    Ok(vocab)
}

/// The bytes each token decodes to, all in one buffer, and where each token's start
/// (`n + 1` offsets).
fn token_bytes(
    tokens: &[String],
    kinds: &[Kind],
    model: &Model,
    byte_level: bool,
    space: Option<&str>,
) -> (Vec<u8>, Vec<usize>) {
    let char_bytes = bpe::char_to_byte();
    let mut bytes = Vec::new();
    let mut offsets = Vec::with_capacity(tokens.len() + 1);
    for (t, &kind) in tokens.iter().zip(kinds) {
        offsets.push(bytes.len());
        if kind.is_special() || kind == Kind::Unused {
            bytes.extend_from_slice(t.as_bytes());
            continue;
        }
        if let Some(b) = byte_token(t).filter(|_| !byte_level) {
            bytes.push(b);
            continue;
        }
        match model {
            Model::Bpe(_) if byte_level => {
                let mapped: Option<Vec<u8>> =
                    t.chars().map(|c| char_bytes.get(&c).copied()).collect();
                bytes.extend_from_slice(mapped.as_deref().unwrap_or(t.as_bytes()));
            }
            Model::Wpm(_) => space_before(&mut bytes, t, "\u{2581}"),
            Model::Unigram(u) if u.escape_whitespaces => {
                bytes.extend_from_slice(t.replace('\u{2581}', " ").as_bytes())
            }
            Model::WordPiece(w) if !w.first_prefix.is_empty() => {
                space_before(&mut bytes, t, &w.first_prefix)
            }
            Model::WordPiece(w) => match t.strip_prefix(w.cont_prefix.as_str()) {
                Some(rest) if !w.cont_prefix.is_empty() => bytes.extend_from_slice(rest.as_bytes()),
                _ => {
                    bytes.push(b' ');
                    bytes.extend_from_slice(t.as_bytes());
                }
            },
            _ => match space {
                Some(marker) => bytes.extend_from_slice(t.replace(marker, " ").as_bytes()),
                None => bytes.extend_from_slice(t.as_bytes()),
            },
        }
    }
    offsets.push(bytes.len());
    (bytes, offsets)
}

/// Token `t`'s bytes, with a space for the word-start `marker` it begins with.
fn space_before(bytes: &mut Vec<u8>, t: &str, marker: &str) {
    match t.strip_prefix(marker) {
        Some(rest) => {
            bytes.push(b' ');
            bytes.extend_from_slice(rest.as_bytes());
        }
        None => bytes.extend_from_slice(t.as_bytes()),
    }
}

/// Decoding drops the space the encoder put before the text (SentencePiece's prefix space;
/// WordPiece's word-start spaces, which the first word has none of).
fn strips_first_space(model: &Model, normalizer: &Normalizer) -> bool {
    matches!(model, Model::WordPiece(_) | Model::Wpm(_))
        || matches!(model, Model::Unigram(u) if u.add_space_prefix || u.remove_extra_whitespaces)
        || normalizer.steps.iter().any(|s| {
            matches!(
                s,
                super::normalize::Step::Prepend(_) | super::normalize::Step::Metaspace { .. }
            )
        })
}

impl Tokenizer {
    /// Checks `p` and builds the tokenizer it describes.
    pub(crate) fn build(p: Parts) -> Result<Tokenizer> {
        let vocab = vocab_index(&p)?;
        let Parts {
            tokens,
            kinds,
            strip,
            llama_split,
            model: spec,
            normalizer,
            pre,
            bos,
            eos,
            pad,
            unk,
            sep,
            prefix,
            suffix,
            chat_template,
            source,
            fim,
        } = p;
        let cx = Context {
            tokens: &tokens,
            kinds: &kinds,
            vocab: &vocab,
            unk,
            source: &source,
        };
        let (model, byte_level) = cx.model(spec)?;
        let space = normalizer.space_marker();
        let (bytes, offsets) = token_bytes(&tokens, &kinds, &model, byte_level, space);
        let specials = cx.specials(&strip);
        let scan_all = cx.scanner(&specials, llama_split, &|_| true)?;
        let scan_user = cx.scanner(&specials, llama_split, &|s| s.user_defined)?;
        let strip_first_space = strips_first_space(&model, &normalizer);
        Ok(Tokenizer {
            tokens,
            kinds,
            bytes,
            offsets,
            vocab,
            model,
            normalizer,
            pre,
            specials,
            scan_all,
            scan_user,
            bos,
            eos,
            pad,
            unk,
            sep,
            prefix,
            suffix,
            strip_first_space,
            llama_split,
            fim: super::FimTokens {
                prefix: fim[0],
                suffix: fim[1],
                middle: fim[2],
                pad: fim[3],
                repo: fim[4],
                file_sep: fim[5],
            },
            chat_template,
        })
    }
}
