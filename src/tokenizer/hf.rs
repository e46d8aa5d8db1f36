//! Reading a Hugging Face `tokenizer.json` (and the `tokenizer_config.json` beside it) into the
//! [`Parts`] of a tokenizer.
//!
//! Understood: models `BPE` (byte-level, or on characters with `byte_fallback` / `unk_token`,
//! `ignore_merges`) and `WordPiece`; normalizers `BertNormalizer`, `NFC`/`NFD`/`NFKC`/`NFKD`,
//! `Lowercase`, `StripAccents`, `Replace` (of a string), `Prepend` and `Sequence`;
//! pre-tokenizers `ByteLevel` (without `add_prefix_space`), `Split`, `Digits`, `Punctuation`,
//! `Metaspace` (first), `BertPreTokenizer`, `Whitespace`, `WhitespaceSplit` and `Sequence`;
//! post-processors `TemplateProcessing`, `BertProcessing`, `RobertaProcessing`, `ByteLevel` and
//! `Sequence`. Anything else is [`Error::Unsupported`] naming it, never ignored. The `padding`
//! and `truncation` sections are not applied: [`encode`](super::Tokenizer::encode) returns every
//! token of the text.

use super::bpe::WholePiece;
use super::hf_config::{read_json, Config, Specials};
use super::normalize::{Bert, Normalizer, Step};
use super::parts::{byte_token, Kind, ModelSpec, Parts, UnknownSpec};
use super::pretok::{self, Behavior, PreTokenizer, Split};
use crate::error::{Error, Result};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// A section's `type`.
fn kind_of(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("?")
}

/// Reads `tokenizer.json` files; `unsupported` and `format` name the file.
pub(super) struct Reader<'p> {
    pub(super) path: &'p Path,
}

impl Reader<'_> {
    pub(super) fn format(&self, msg: String) -> Error {
        Error::Format {
            path: self.path.to_owned(),
            msg,
        }
    }

    fn unsupported(&self, what: String) -> Error {
        Error::Unsupported(format!("{}: {what}", self.path.display()))
    }

    fn bool_field(&self, v: &Value, key: &str, default: bool) -> Result<bool> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.format(format!("{key} is {other}, not true or false"))),
        }
    }

    /// A `Split`/`Replace` pattern: `{"String": s}` or `{"Regex": r}`, as a regex.
    fn pattern(&self, v: Option<&Value>) -> Result<String> {
        match v {
            Some(p) => {
                if let Some(s) = p.get("String").and_then(Value::as_str) {
                    Ok(regex::escape(s))
                } else if let Some(r) = p.get("Regex").and_then(Value::as_str) {
                    Ok(r.to_owned())
                } else {
                    Err(self.format(format!("pattern {p} is neither a String nor a Regex")))
                }
            }
            None => Err(self.format("a split without a pattern".into())),
        }
    }

    fn normalizer(&self, v: &Value, steps: &mut Vec<Step>) -> Result<()> {
        let text = |key: &str| {
            v.get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| self.format(format!("normalizer {} without `{key}`", kind_of(v))))
        };
        match kind_of(v) {
            "Sequence" => {
                for n in v
                    .get("normalizers")
                    .and_then(Value::as_array)
                    .ok_or_else(|| self.format("normalizer Sequence without a list".into()))?
                {
                    self.normalizer(n, steps)?;
                }
            }
            "BertNormalizer" => {
                let lowercase = self.bool_field(v, "lowercase", true)?;
                steps.push(Step::Bert(Bert {
                    clean_text: self.bool_field(v, "clean_text", true)?,
                    chinese_chars: self.bool_field(v, "handle_chinese_chars", true)?,
                    strip_accents: self.bool_field(v, "strip_accents", lowercase)?,
                    lowercase,
                }))
            }
            "NFC" => steps.push(Step::Nfc),
            "NFD" => steps.push(Step::Nfd),
            "NFKC" => steps.push(Step::Nfkc),
            "NFKD" => steps.push(Step::Nfkd),
            "Lowercase" => steps.push(Step::Lowercase),
            "StripAccents" => steps.push(Step::StripAccents),
            "Prepend" => steps.push(Step::Prepend(text("prepend")?)),
            "Replace" => match v.get("pattern").and_then(|p| p.get("String")) {
                Some(Value::String(from)) => {
                    steps.push(Step::Replace(from.clone(), text("content")?))
                }
                _ => return Err(self.unsupported("normalizer Replace of a regex".into())),
            },
            other => return Err(self.unsupported(format!("normalizer {other}"))),
        }
        Ok(())
    }

    /// Adds the splits of pre-tokenizer `v`; a `Metaspace` adds normalizer steps instead (it
    /// must come first, before any split). A `ByteLevel` step sets `byte_level`.
    fn pre_tokenizer(
        &self,
        v: &Value,
        pre: &mut PreTokenizer,
        norm: &mut Vec<Step>,
        byte_level: &mut bool,
    ) -> Result<()> {
        let behavior = |default: Behavior| -> Result<Behavior> {
            match v.get("behavior").and_then(Value::as_str) {
                None => Ok(default),
                Some(b) => Behavior::parse(b)
                    .ok_or_else(|| self.format(format!("unknown split behavior {b}"))),
            }
        };
        let split = |p: &str, b: Behavior, inv: bool| Split::regex(p, b, inv);
        match kind_of(v) {
            "Sequence" => {
                for p in v
                    .get("pretokenizers")
                    .and_then(Value::as_array)
                    .ok_or_else(|| self.format("pre_tokenizer Sequence without a list".into()))?
                {
                    self.pre_tokenizer(p, pre, norm, byte_level)?;
                }
            }
            "ByteLevel" => {
                *byte_level = true;
                if self.bool_field(v, "add_prefix_space", false)? {
                    return Err(
                        self.unsupported("ByteLevel pre-tokenizer with add_prefix_space".into())
                    );
                }
                if self.bool_field(v, "use_regex", true)? {
                    pre.steps
                        .push(split(pretok::GPT2, Behavior::Isolated, false)?);
                }
            }
            "Split" => {
                let p = self.pattern(v.get("pattern"))?;
                let invert = self.bool_field(v, "invert", false)?;
                pre.steps
                    .push(split(&p, behavior(Behavior::Isolated)?, invert)?);
            }
            "Digits" => {
                let p = if self.bool_field(v, "individual_digits", false)? {
                    r"\p{N}"
                } else {
                    r"\p{N}+"
                };
                pre.steps.push(split(p, Behavior::Isolated, false)?);
            }
            "Punctuation" => pre.steps.push(split(
                r"[\p{P}!-/:-@\[-`{-~]",
                behavior(Behavior::Isolated)?,
                false,
            )?),
            "BertPreTokenizer" => pre.steps.extend(pretok::bert()),
            "Whitespace" => pre
                .steps
                .push(split(r"\w+|[^\w\s]+", Behavior::Removed, true)?),
            "WhitespaceSplit" => pre.steps.push(split(r"\s+", Behavior::Removed, false)?),
            "Metaspace" => self.metaspace(v, pre, norm)?,
            other => return Err(self.unsupported(format!("pre-tokenizer {other}"))),
        }
        Ok(())
    }

    /// A `Metaspace` pre-tokenizer: spaces become its marker (and one goes before the text,
    /// as its prepend scheme says) in the normalizer; the text splits before each marker.
    fn metaspace(&self, v: &Value, pre: &mut PreTokenizer, norm: &mut Vec<Step>) -> Result<()> {
        if !pre.steps.is_empty() {
            return Err(self.unsupported("a Metaspace pre-tokenizer after a split".into()));
        }
        let marker = v
            .get("replacement")
            .and_then(Value::as_str)
            .unwrap_or("▁")
            .to_owned();
        // Newer files say `prepend_scheme`, older ones `add_prefix_space`.
        let scheme = match v.get("prepend_scheme").and_then(Value::as_str) {
            Some(s) => s.to_owned(),
            None if self.bool_field(v, "add_prefix_space", true)? => "always".into(),
            None => "never".into(),
        };
        norm.push(Step::Replace(" ".into(), marker.clone()));
        match scheme.as_str() {
            "always" | "first" => norm.push(Step::Metaspace {
                prefix: marker.clone(),
                first_only: scheme == "first",
            }),
            "never" => {}
            other => return Err(self.unsupported(format!("Metaspace prepend_scheme {other}"))),
        }
        if self.bool_field(v, "split", true)? {
            pre.steps
                .push(Split::literal(&marker, Behavior::MergedWithNext, false)?);
        }
        Ok(())
    }

    /// The special tokens a post-processor puts before and after a single text.
    fn post_processor(
        &self,
        v: &Value,
        vocab: &HashMap<&str, u32>,
        prefix: &mut Vec<u32>,
        suffix: &mut Vec<u32>,
    ) -> Result<()> {
        let pair_id = |key: &str| -> Result<u32> {
            let p = v.get(key).and_then(Value::as_array);
            match p.map(|p| {
                (
                    p.first().and_then(Value::as_str),
                    p.get(1).and_then(Value::as_u64),
                )
            }) {
                Some((Some(_), Some(id))) if id < u32::MAX as u64 => Ok(id as u32),
                _ => Err(self.format(format!("post_processor {} without `{key}`", kind_of(v)))),
            }
        };
        match kind_of(v) {
            "Sequence" => {
                for p in v
                    .get("processors")
                    .and_then(Value::as_array)
                    .ok_or_else(|| self.format("post_processor Sequence without a list".into()))?
                {
                    self.post_processor(p, vocab, prefix, suffix)?;
                }
            }
            "ByteLevel" => {}
            "BertProcessing" | "RobertaProcessing" => {
                prefix.push(pair_id("cls")?);
                suffix.push(pair_id("sep")?);
            }
            "TemplateProcessing" => self.template_processing(v, vocab, prefix, suffix)?,
            other => return Err(self.unsupported(format!("post-processor {other}"))),
        }
        Ok(())
    }

    /// A `TemplateProcessing` post-processor's `single` template: the special tokens before
    /// the text (`Sequence`) go to `prefix`, the ones after it to `suffix`.
    fn template_processing(
        &self,
        v: &Value,
        vocab: &HashMap<&str, u32>,
        prefix: &mut Vec<u32>,
        suffix: &mut Vec<u32>,
    ) -> Result<()> {
        let single = v
            .get("single")
            .and_then(Value::as_array)
            .ok_or_else(|| self.format("TemplateProcessing without `single`".into()))?;
        let specials = v.get("special_tokens");
        let mut seen_text = false;
        for piece in single {
            if piece.get("Sequence").is_some() {
                seen_text = true;
                continue;
            }
            let name = piece
                .get("SpecialToken")
                .and_then(|s| s.get("id"))
                .and_then(Value::as_str)
                .ok_or_else(|| self.format(format!("template piece {piece}")))?;
            let ids: Vec<u32> = match specials
                .and_then(|s| s.get(name))
                .and_then(|s| s.get("ids"))
                .and_then(Value::as_array)
            {
                Some(ids) => ids
                    .iter()
                    .map(|i| {
                        i.as_u64()
                            .filter(|&i| i < u32::MAX as u64)
                            .map(|i| i as u32)
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(|| self.format(format!("template token {name} ids")))?,
                None => vec![*vocab.get(name).ok_or_else(|| {
                    self.format(format!("template token {name} is not in the vocabulary"))
                })?],
            };
            if seen_text {
                &mut *suffix
            } else {
                &mut *prefix
            }
            .extend(ids);
        }
        Ok(())
    }
}

/// The ids a token text has in `tokens` (the first of duplicates wins).
fn index_of(tokens: &[String]) -> HashMap<&str, u32> {
    tokens
        .iter()
        .enumerate()
        .rev()
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect()
}

/// The vocabulary: every token's text and kind, and the special tokens that strip whitespace.
struct Vocabulary {
    tokens: Vec<String>,
    kinds: Vec<Kind>,
    strip: Vec<(u32, bool, bool)>,
}

impl Reader<'_> {
    /// The `model` section and its type.
    fn model<'j>(&self, json: &'j Value) -> Result<(&'j Value, &'j str)> {
        let model = json
            .get("model")
            .filter(|m| m.is_object())
            .ok_or_else(|| self.format("no `model`".into()))?;
        let model_type = match model.get("type").and_then(Value::as_str) {
            Some(t) => t,
            // Old files leave the type out; a merge list means BPE.
            None if model.get("merges").is_some() => "BPE",
            None => return Err(self.format("the model has no type".into())),
        };
        Ok((model, model_type))
    }

    /// `model.vocab`, then the added tokens (which may extend it), as one list of tokens.
    fn vocabulary(&self, json: &Value, model: &Value, model_type: &str) -> Result<Vocabulary> {
        let vocab =
            model
                .get("vocab")
                .and_then(Value::as_object)
                .ok_or_else(|| match model_type {
                    "BPE" | "WordPiece" => self.format("model.vocab is not an object".into()),
                    other => self.unsupported(format!(
                        "tokenizer model {other} (qkv implements BPE and WordPiece)"
                    )),
                })?;
        let mut entries: Vec<(usize, String, Kind)> = Vec::with_capacity(vocab.len() + 32);
        for (tok, id) in vocab {
            let id = id
                .as_u64()
                .filter(|&i| i < u32::MAX as u64)
                .ok_or_else(|| self.format(format!("model.vocab[{tok:?}] is not a token id")))?;
            entries.push((id as usize, tok.clone(), Kind::Normal));
        }
        let strip = self.added_tokens(json, &mut entries)?;
        let (tokens, kinds) = self.by_id(entries)?;
        Ok(Vocabulary {
            tokens,
            kinds,
            strip,
        })
    }

    /// Adds `added_tokens` to `entries`; returns the ones that strip whitespace.
    fn added_tokens(
        &self,
        json: &Value,
        entries: &mut Vec<(usize, String, Kind)>,
    ) -> Result<Vec<(u32, bool, bool)>> {
        let added = match json.get("added_tokens") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(list)) => &list[..],
            Some(other) => return Err(self.format(format!("added_tokens is {other}, not a list"))),
        };
        let has_normalizer = !json.get("normalizer").is_none_or(Value::is_null);
        let mut strip = Vec::new();
        for a in added {
            let id = a.get("id").and_then(Value::as_u64);
            let content = a.get("content").and_then(Value::as_str);
            let (Some(id), Some(content)) = (id, content) else {
                return Err(self.format(format!("added token {a} lacks an id or content")));
            };
            if id >= u32::MAX as u64 {
                return Err(self.format(format!("added token {content:?} has id {id}")));
            }
            if self.bool_field(a, "single_word", false)? {
                return Err(self.unsupported(format!("added token {content:?} with single_word")));
            }
            let special = self.bool_field(a, "special", false)?;
            // Hugging Face matches `normalized` tokens in the normalized text; qkv matches
            // added tokens in the text as given, which is the same only without a normalizer.
            if has_normalizer && self.bool_field(a, "normalized", !special)? {
                return Err(self.unsupported(format!(
                    "added token {content:?} matched after normalization (normalized: true)"
                )));
            }
            let (lstrip, rstrip) = (
                self.bool_field(a, "lstrip", false)?,
                self.bool_field(a, "rstrip", false)?,
            );
            if lstrip || rstrip {
                strip.push((id as u32, lstrip, rstrip));
            }
            let kind = if special {
                Kind::Control
            } else {
                Kind::UserDefined
            };
            entries.push((id as usize, content.to_owned(), kind));
        }
        Ok(strip)
    }

    /// The tokens and kinds in id order: every id below the largest defined once.
    fn by_id(&self, entries: Vec<(usize, String, Kind)>) -> Result<(Vec<String>, Vec<Kind>)> {
        let n = entries.iter().map(|e| e.0 + 1).max().unwrap_or(0);
        if n > entries.len() {
            return Err(self.format(format!(
                "token ids run to {} but only {} tokens are defined",
                n - 1,
                entries.len()
            )));
        }
        let mut tokens: Vec<Option<String>> = vec![None; n];
        let mut kinds = vec![Kind::Normal; n];
        for (id, tok, kind) in entries {
            match &tokens[id] {
                Some(existing) if *existing != tok => {
                    return Err(
                        self.format(format!("token id {id} is both {existing:?} and {tok:?}"))
                    )
                }
                _ => tokens[id] = Some(tok),
            }
            if kind != Kind::Normal {
                kinds[id] = kind;
            }
        }
        let tokens: Vec<String> = tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| t.ok_or_else(|| self.format(format!("no token has id {i}"))))
            .collect::<Result<_>>()?;
        Ok((tokens, kinds))
    }

    /// The `normalizer` and `pre_tokenizer` sections (a `Metaspace` pre-tokenizer adds
    /// normalizer steps); whether the pre-tokenizer is byte-level.
    fn text_steps(&self, json: &Value) -> Result<(Normalizer, PreTokenizer, bool)> {
        let mut normalizer = Normalizer::default();
        match json.get("normalizer") {
            None | Some(Value::Null) => {}
            Some(v) => self.normalizer(v, &mut normalizer.steps)?,
        }
        let mut pre = PreTokenizer::default();
        let mut byte_level = false;
        match json.get("pre_tokenizer") {
            None | Some(Value::Null) => {}
            Some(v) => self.pre_tokenizer(v, &mut pre, &mut normalizer.steps, &mut byte_level)?,
        }
        Ok((normalizer, pre, byte_level))
    }

    /// `model.unk_token`, as an id.
    fn unk(&self, model: &Value, index: &HashMap<&str, u32>) -> Result<Option<u32>> {
        match model.get("unk_token") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => index
                .get(s.as_str())
                .copied()
                .map(Some)
                .ok_or_else(|| self.format(format!("unk_token {s:?} is not in the vocabulary"))),
            Some(other) => Err(self.format(format!("unk_token is {other}"))),
        }
    }

    /// The model section as a [`ModelSpec`]; byte-fallback BPE marks the `<0xXX>` tokens as
    /// bytes in `kinds`.
    fn model_spec(
        &self,
        model: &Value,
        model_type: &str,
        byte_level: bool,
        unk: Option<u32>,
        tokens: &[String],
        kinds: &mut [Kind],
    ) -> Result<ModelSpec> {
        match model_type {
            "BPE" => self.bpe(model, byte_level, unk, tokens, kinds),
            "WordPiece" => Ok(ModelSpec::WordPiece {
                first_prefix: String::new(),
                cont_prefix: model
                    .get("continuing_subword_prefix")
                    .and_then(Value::as_str)
                    .unwrap_or("##")
                    .to_owned(),
                max_chars: model
                    .get("max_input_chars_per_word")
                    .and_then(Value::as_u64)
                    .map_or(100, |m| m.min(usize::MAX as u64) as usize),
            }),
            other => Err(self.unsupported(format!(
                "tokenizer model {other} (qkv implements BPE and WordPiece)"
            ))),
        }
    }

    fn bpe(
        &self,
        model: &Value,
        byte_level: bool,
        unk: Option<u32>,
        tokens: &[String],
        kinds: &mut [Kind],
    ) -> Result<ModelSpec> {
        for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if model
                .get(key)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
            {
                return Err(self.unsupported(format!("BPE with {key}")));
            }
        }
        if model
            .get("dropout")
            .and_then(Value::as_f64)
            .is_some_and(|d| d > 0.0)
        {
            return Err(self.unsupported("BPE with dropout".into()));
        }
        let merges = self.merges(model)?;
        let unknown = if self.bool_field(model, "byte_fallback", false)? {
            UnknownSpec::ByteFallback
        } else if unk.is_some() {
            UnknownSpec::Unk {
                fuse: self.bool_field(model, "fuse_unk", false)?,
            }
        } else {
            UnknownSpec::Drop
        };
        if unknown == UnknownSpec::ByteFallback {
            for (t, kind) in tokens.iter().zip(kinds.iter_mut()) {
                if *kind == Kind::Normal && byte_token(t).is_some() {
                    *kind = Kind::Byte;
                }
            }
        }
        Ok(ModelSpec::Bpe {
            merges,
            byte_level,
            unknown,
            whole: if self.bool_field(model, "ignore_merges", false)? {
                WholePiece::Always
            } else {
                WholePiece::Never
            },
        })
    }

    /// `model.merges`: `"a b"` strings or `["a", "b"]` pairs, in rank order.
    fn merges(&self, model: &Value) -> Result<Vec<(String, String)>> {
        let mut merges = Vec::new();
        for (i, m) in model
            .get("merges")
            .and_then(Value::as_array)
            .ok_or_else(|| self.format("model.merges is not an array".into()))?
            .iter()
            .enumerate()
        {
            let pair = match m {
                Value::String(s) => s.split_once(' ').map(|(a, b)| (a.to_owned(), b.to_owned())),
                Value::Array(v) if v.len() == 2 => match (v[0].as_str(), v[1].as_str()) {
                    (Some(a), Some(b)) => Some((a.to_owned(), b.to_owned())),
                    _ => None,
                },
                _ => None,
            };
            merges.push(
                pair.ok_or_else(|| self.format(format!("model.merges[{i}] = {m} is not a pair")))?,
            );
        }
        Ok(merges)
    }
}

/// Reads `tokenizer.json` at `path`, and `tokenizer_config.json` beside it, section by
/// section.
pub(super) fn load(path: &Path) -> Result<Parts> {
    let r = Reader { path };
    let json = read_json(path)?;
    let (model, model_type) = r.model(&json)?;
    let Vocabulary {
        tokens,
        mut kinds,
        strip,
    } = r.vocabulary(&json, model, model_type)?;
    let index = index_of(&tokens);
    let (normalizer, pre, byte_level) = r.text_steps(&json)?;
    let unk = r.unk(model, &index)?;
    let spec = r.model_spec(model, model_type, byte_level, unk, &tokens, &mut kinds)?;

    let config = Config::read(path)?;
    let specials = config.specials(&index)?;
    let chat_template = config.chat_template();
    // Special tokens around the text: the post-processor's, unless tokenizer_config says.
    let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
    match json.get("post_processor") {
        None | Some(Value::Null) => {}
        Some(v) => r.post_processor(v, &index, &mut prefix, &mut suffix)?,
    }
    config.around(&specials, &mut prefix, &mut suffix)?;
    let Specials { bos, eos, pad, sep } = specials;
    let fim = super::quirks::fim_ids(&tokens, &|_| None);
    Ok(Parts {
        tokens,
        kinds,
        strip,
        llama_split: false,
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
        fim,
        chat_template,
        source: path.display().to_string(),
    })
}
