//! Reading a GGUF file's `tokenizer.ggml.*` metadata into the [`Parts`] of a tokenizer.
//!
//! `tokenizer.ggml.model` decides the kind, as in llama.cpp:
//!
//! | model    | algorithm | text before it |
//! |----------|-----------|----------------|
//! | `gpt2`   | byte-level BPE, merges by rank | the splits `tokenizer.ggml.pre` names ([`GGUF_PRE_NAMES`](super::pretok::GGUF_PRE_NAMES)) |
//! | `llama`  | SentencePiece BPE: merges by score, byte fallback | spaces → `▁`, one `▁` before the text (`add_space_prefix`, default on) |
//! | `bert`   | WordPiece, word starts marked `▁` | llama.cpp's BERT normalization and word splitting (lowercase and accent stripping unless the file says otherwise) |
//! | `t5`     | Unigram (Viterbi by score) | the precompiled character map, spaces → `▁`, extra spaces removed |
//! | `gemma4` | BPE on characters, merges by rank, byte fallback | spaces → `▁`, split at newline runs; a run of newlines that is a token stays whole |
//!
//! Special tokens are cut out of text in llama.cpp's order, with the token types and
//! whitespace stripping llama.cpp derives from token texts and model names (quirks.rs).
//!
//! Any other model, or a `pre` qkv does not implement, is [`Error::Unsupported`] naming it.

use super::bpe::WholePiece;
use super::normalize::{Normalizer, Step};
use super::parts::{Kind, ModelSpec, Parts, UnknownSpec};
use super::pretok::{self, Behavior, PreTokenizer, Split};
use super::quirks;
use crate::error::{Error, Result};
use crate::weights::gguf::{GgufFile, MetaValue};

/// Splits a GGUF merge `"a b"` at its first space after the first byte (a token may itself be a
/// space).
fn split_merge(m: &str) -> Option<(&str, &str)> {
    let at = m.bytes().skip(1).position(|b| b == b' ')? + 1;
    Some((&m[..at], &m[at + 1..]))
}

/// The `tokenizer.ggml.*` keys of one file, read with the defaults llama.cpp uses.
struct Keys<'f> {
    file: &'f GgufFile,
    /// The number of tokens.
    n: usize,
}

impl Keys<'_> {
    fn format(&self, msg: String) -> Error {
        Error::Format {
            path: self.file.path().to_owned(),
            msg,
        }
    }

    fn has(&self, key: &str) -> bool {
        self.file.metadata(key).is_some()
    }

    fn id(&self, key: &str) -> Result<Option<u32>> {
        if self.has(key) {
            self.file.get_u32(key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An id the file sets, else the model's default when it is a token.
    fn id_or(&self, key: &str, default: Option<u32>) -> Result<Option<u32>> {
        Ok(self.id(key)?.or(default.filter(|&d| (d as usize) < self.n)))
    }

    fn flag(&self, key: &str) -> Result<Option<bool>> {
        if self.has(key) {
            self.file.get_bool(key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A string key, `""` when the file lacks it.
    fn text(&self, key: &str) -> Result<&str> {
        if self.has(key) {
            self.file.get_str(key)
        } else {
            Ok("")
        }
    }

    /// `tokenizer.ggml.token_type`, one kind per token, if the file has it.
    fn kinds(&self) -> Result<Option<Vec<Kind>>> {
        if !self.has("tokenizer.ggml.token_type") {
            return Ok(None);
        }
        let types = self.file.get_i32_array("tokenizer.ggml.token_type")?;
        if types.len() != self.n {
            return Err(self.format(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                types.len(),
                self.n
            )));
        }
        types
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                Kind::from_gguf(t).ok_or_else(|| {
                    self.format(format!(
                        "tokenizer.ggml.token_type[{i}] = {t} is not a token type"
                    ))
                })
            })
            .collect::<Result<_>>()
            .map(Some)
    }

    /// `tokenizer.ggml.merges`, as pairs of token texts in rank order.
    fn merges(&self) -> Result<Vec<(String, String)>> {
        self.file
            .get_str_array("tokenizer.ggml.merges")?
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                split_merge(m)
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| {
                        self.format(format!(
                            "tokenizer.ggml.merges[{i}] = {m:?} is not two tokens"
                        ))
                    })
            })
            .collect()
    }

    /// `tokenizer.ggml.precompiled_charsmap`'s bytes, if the file has it.
    fn charsmap(&self) -> Result<Option<Vec<u8>>> {
        if !self.has("tokenizer.ggml.precompiled_charsmap") {
            return Ok(None);
        }
        let values = self.file.get_array("tokenizer.ggml.precompiled_charsmap")?;
        let bytes: Option<Vec<u8>> = values
            .iter()
            .map(|v| match v {
                MetaValue::U8(b) => Some(*b),
                MetaValue::I8(b) => Some(*b as u8),
                _ => None,
            })
            .collect();
        bytes
            .ok_or_else(|| {
                self.format("tokenizer.ggml.precompiled_charsmap is not an array of bytes".into())
            })
            .map(Some)
    }
}

/// The special token ids.
#[derive(Default)]
struct Ids {
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    sep: Option<u32>,
    pad: Option<u32>,
}

/// What `tokenizer.ggml.model` makes of the text around the model, and the model's defaults
/// for the tokens added around the text (the file's `add_*_token` flags override them).
struct Section {
    spec: ModelSpec,
    normalizer: Normalizer,
    pre: PreTokenizer,
    add_bos: bool,
    add_sep: bool,
    add_eos: bool,
}

impl Section {
    fn new(spec: ModelSpec, add_bos: bool) -> Section {
        Section {
            spec,
            normalizer: Normalizer::default(),
            pre: PreTokenizer::default(),
            add_bos,
            add_sep: false,
            add_eos: false,
        }
    }
}

/// `gpt2`: byte-level BPE after the splits `tokenizer.ggml.pre` names.
fn gpt2(keys: &Keys, pre: &str) -> Result<Section> {
    let p = pretok::gguf_pre(pre).ok_or_else(|| {
        Error::Unsupported(format!(
            "{}: pre-tokenizer `tokenizer.ggml.pre` = `{}` (qkv implements {})",
            keys.file.path().display(),
            pre.escape_debug(),
            pretok::GGUF_PRE_NAMES.join(", ")
        ))
    })?;
    let mut splits = Vec::new();
    for pattern in p.patterns {
        splits.push(Split::regex(pattern, Behavior::Isolated, false)?);
    }
    let spec = ModelSpec::Bpe {
        merges: keys.merges()?,
        byte_level: true,
        unknown: UnknownSpec::Drop,
        whole: if p.ignore_merges {
            WholePiece::Always
        } else {
            WholePiece::Never
        },
    };
    let mut s = Section::new(spec, p.add_bos_default);
    s.pre.steps = splits;
    Ok(s)
}

/// `gemma4`: BPE on characters with byte fallback, split at newline runs.
fn gemma4(keys: &Keys) -> Result<Section> {
    let split = Split::regex(r"[^\n]+|\n+", Behavior::Isolated, false)?;
    let spec = ModelSpec::Bpe {
        merges: keys.merges()?,
        byte_level: false,
        unknown: UnknownSpec::ByteFallback,
        whole: WholePiece::NewlineRuns,
    };
    // llama.cpp always adds BOS for Gemma 4, whatever the file says.
    let mut s = Section::new(spec, true);
    s.normalizer
        .steps
        .push(Step::Replace(" ".into(), "▁".into()));
    s.pre.steps.push(split);
    Ok(s)
}

/// `llama`: SentencePiece BPE by score; BOS 1, EOS 2 and unknown 0 unless the file says.
fn llama(keys: &Keys, ids: &mut Ids) -> Result<Section> {
    let mut normalizer = Normalizer::default();
    if keys
        .flag("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true)
    {
        normalizer.steps.push(Step::Prepend("▁".into()));
    }
    normalizer.steps.push(Step::Replace(" ".into(), "▁".into()));
    let in_vocab = |id: Option<u32>| id.filter(|&i| (i as usize) < keys.n);
    ids.bos = in_vocab(ids.bos.or(Some(1)));
    ids.eos = in_vocab(ids.eos.or(Some(2)));
    ids.unk = in_vocab(ids.unk.or(Some(0)));
    let spec = ModelSpec::Spm {
        scores: keys.file.get_f32_array("tokenizer.ggml.scores")?,
    };
    let mut s = Section::new(spec, true);
    s.normalizer = normalizer;
    Ok(s)
}

/// `bert`: llama.cpp's WordPiece, which does its own normalization and word splitting
/// (wpm.rs); [CLS] is the BOS, and [SEP] follows the text.
fn bert(keys: &Keys, ids: &mut Ids) -> Result<Section> {
    let lowercase = keys
        .flag("tokenizer.ggml.normalizer.lowercase")?
        .unwrap_or(true);
    let strip_accents = keys
        .flag("tokenizer.ggml.normalizer.strip_accents")?
        .unwrap_or(lowercase);
    ids.bos = match ids.bos {
        Some(b) => Some(b),
        None => keys.id_or("tokenizer.ggml.cls_token_id", Some(101))?,
    };
    ids.unk = ids.unk.or(Some(100).filter(|&u| (u as usize) < keys.n));
    ids.sep = keys.id_or("tokenizer.ggml.seperator_token_id", Some(102))?;
    let spec = ModelSpec::Wpm {
        lowercase,
        strip_accents,
    };
    let mut s = Section::new(spec, true);
    s.add_sep = true;
    Ok(s)
}

/// `t5`: Unigram after the precompiled character map; EOS after the text.
fn t5(keys: &Keys, ids: &mut Ids) -> Result<Section> {
    // llama.cpp's defaults for Unigram vocabularies, then what the file says.
    ids.eos = ids.eos.or(Some(1).filter(|&e| (e as usize) < keys.n));
    ids.unk = ids.unk.or(Some(2).filter(|&u| (u as usize) < keys.n));
    let charsmap = keys.charsmap()?;
    let spec = ModelSpec::Unigram {
        scores: keys.file.get_f32_array("tokenizer.ggml.scores")?,
        charsmap,
        add_space_prefix: keys
            .flag("tokenizer.ggml.add_space_prefix")?
            .unwrap_or(false),
        remove_extra_whitespaces: keys
            .flag("tokenizer.ggml.remove_extra_whitespaces")?
            .unwrap_or(false),
    };
    let mut s = Section::new(spec, false);
    s.add_eos = true;
    Ok(s)
}

/// The model `tokenizer.ggml.model` names, with what goes before it.
fn section(keys: &Keys, model: &str, pre: &str, ids: &mut Ids) -> Result<Section> {
    match model {
        "gpt2" => gpt2(keys, pre),
        "gemma4" => gemma4(keys),
        "llama" => llama(keys, ids),
        "bert" => bert(keys, ids),
        "t5" => t5(keys, ids),
        other => Err(Error::Unsupported(format!(
            "{}: tokenizer model `tokenizer.ggml.model` = `{}` (qkv implements gpt2, llama, \
             bert, t5 and gemma4)",
            keys.file.path().display(),
            other.escape_debug()
        ))),
    }
}

/// Whether BOS, EOS and the separator go around the text: the model's defaults, unless the
/// file's `add_bos_token` / `add_eos_token` / `add_sep_token` say otherwise. Sets the
/// separator and padding ids.
fn flags(keys: &Keys, model: &str, s: &Section, ids: &mut Ids) -> Result<[bool; 3]> {
    let mut add_bos = s.add_bos;
    if model != "gemma4" {
        add_bos = keys
            .flag("tokenizer.ggml.add_bos_token")?
            .unwrap_or(add_bos);
    }
    let add_eos = keys
        .flag("tokenizer.ggml.add_eos_token")?
        .unwrap_or(s.add_eos);
    let add_sep = keys
        .flag("tokenizer.ggml.add_sep_token")?
        .unwrap_or(s.add_sep);
    if model == "bert" && keys.has("tokenizer.ggml.seperator_token_id") {
        ids.sep = keys.id("tokenizer.ggml.seperator_token_id")?;
    }
    ids.pad = keys.id("tokenizer.ggml.padding_token_id")?;
    Ok([add_bos, add_eos, add_sep])
}

/// The tokens put before and after the text, as `flags` says.
fn around(
    keys: &Keys,
    [add_bos, add_eos, add_sep]: [bool; 3],
    ids: &Ids,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let need = |what: &str, id: Option<u32>| {
        id.ok_or_else(|| {
            Error::Tokenizer(format!(
                "{}: {what} is set but the file has no such token",
                keys.file.path().display()
            ))
        })
    };
    let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
    if add_bos {
        prefix.push(need("tokenizer.ggml.add_bos_token", ids.bos)?);
    }
    if add_eos {
        suffix.push(need("tokenizer.ggml.add_eos_token", ids.eos)?);
    }
    if add_sep {
        suffix.push(need("tokenizer.ggml.add_sep_token", ids.sep)?);
    }
    Ok((prefix, suffix))
}

/// Without token types, BOS, EOS, padding and unknown are the control tokens a prompt may
/// spell (a chat template does); the rest is text.
fn default_kinds(n: usize, ids: &Ids) -> Vec<Kind> {
    let mut k = vec![Kind::Normal; n];
    for id in [ids.bos, ids.eos, ids.pad, ids.unk, ids.sep]
        .into_iter()
        .flatten()
    {
        if let Some(slot) = k.get_mut(id as usize) {
            *slot = Kind::Control;
        }
    }
    k
}

/// Reads the tokenizer of GGUF `file`, key group by key group.
pub(super) fn load(file: &GgufFile) -> Result<Parts> {
    let model = file.get_str("tokenizer.ggml.model")?;
    let has = |key: &str| file.metadata(key).is_some();
    let pre = if has("tokenizer.ggml.pre") {
        file.get_str("tokenizer.ggml.pre")?
    } else {
        "default"
    };
    let tokens: Vec<String> = file
        .get_str_array("tokenizer.ggml.tokens")?
        .into_iter()
        .map(str::to_owned)
        .collect();
    let keys = Keys {
        file,
        n: tokens.len(),
    };
    let kinds = keys.kinds()?;
    let mut ids = Ids {
        bos: keys.id("tokenizer.ggml.bos_token_id")?,
        eos: keys.id("tokenizer.ggml.eos_token_id")?,
        unk: keys.id("tokenizer.ggml.unknown_token_id")?,
        ..Ids::default()
    };
    let section = section(&keys, model, pre, &mut ids)?;
    let flags = flags(&keys, model, &section, &mut ids)?;
    let mut kinds = kinds.unwrap_or_else(|| default_kinds(keys.n, &ids));
    let strip = quirks::apply(
        &tokens,
        &mut kinds,
        &quirks::Context {
            name: keys.text("general.name")?,
            arch: keys.text("general.architecture")?,
            pre,
            has_key: &has,
        },
    );
    let (prefix, suffix) = around(&keys, flags, &ids)?;
    let chat_template = if has("tokenizer.chat_template") {
        Some(file.get_str("tokenizer.chat_template")?.to_owned())
    } else {
        None
    };
    let fim = quirks::fim_ids(&tokens, &|key| {
        keys.has(key).then(|| file.get_u32(key).ok()).flatten()
    });
    Ok(Parts {
        tokens,
        kinds,
        strip,
        llama_split: true,
        model: section.spec,
        normalizer: section.normalizer,
        pre: section.pre,
        bos: ids.bos,
        eos: ids.eos,
        pad: ids.pad,
        unk: ids.unk,
        sep: ids.sep,
        prefix,
        suffix,
        fim,
        chat_template,
        source: file.path().display().to_string(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn merges_split_after_the_first_byte() {
        assert_eq!(super::split_merge("a b"), Some(("a", "b")));
        assert_eq!(super::split_merge("  x"), Some((" ", "x")));
        assert_eq!(super::split_merge("\n\n \n"), Some(("\n\n", "\n")));
        assert_eq!(super::split_merge("é x"), Some(("é", "x")));
        assert_eq!(super::split_merge("ab"), None);
        assert_eq!(super::split_merge(""), None);
    }
}
