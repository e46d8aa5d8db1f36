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

pub(super) fn load(file: &GgufFile) -> Result<Parts> {
    let path = file.path();
    let format = |msg: String| Error::Format {
        path: path.to_owned(),
        msg,
    };
    let has = |key: &str| file.metadata(key).is_some();
    let id = |key: &str| -> Result<Option<u32>> {
        if has(key) {
            file.get_u32(key).map(Some)
        } else {
            Ok(None)
        }
    };
    let flag = |key: &str| -> Result<Option<bool>> {
        if has(key) {
            file.get_bool(key).map(Some)
        } else {
            Ok(None)
        }
    };

    let model = file.get_str("tokenizer.ggml.model")?;
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
    let n = tokens.len();
    let kinds: Option<Vec<Kind>> = if has("tokenizer.ggml.token_type") {
        let types = file.get_i32_array("tokenizer.ggml.token_type")?;
        if types.len() != n {
            return Err(format(format!(
                "tokenizer.ggml.token_type has {} entries for {n} tokens",
                types.len()
            )));
        }
        let kinds = types
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                Kind::from_gguf(t).ok_or_else(|| {
                    format(format!(
                        "tokenizer.ggml.token_type[{i}] = {t} is not a token type"
                    ))
                })
            })
            .collect::<Result<_>>()?;
        Some(kinds)
    } else {
        None
    };
    let merges = || -> Result<Vec<(String, String)>> {
        file.get_str_array("tokenizer.ggml.merges")?
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                split_merge(m)
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| {
                        format(format!(
                            "tokenizer.ggml.merges[{i}] = {m:?} is not two tokens"
                        ))
                    })
            })
            .collect()
    };
    // An id the file sets, else the model's default when it is a token.
    let id_or = |key: &str, default: Option<u32>| -> Result<Option<u32>> {
        Ok(id(key)?.or(default.filter(|&d| (d as usize) < n)))
    };

    let mut normalizer = Normalizer::default();
    let mut pre_tok = PreTokenizer::default();
    let (mut bos, mut eos) = (
        id("tokenizer.ggml.bos_token_id")?,
        id("tokenizer.ggml.eos_token_id")?,
    );
    let mut unk = id("tokenizer.ggml.unknown_token_id")?;
    let mut sep = None;
    let mut add_bos; // set by every model below
    let mut add_sep = false;
    let mut add_eos_default = false;
    let spec = match model {
        "gpt2" => {
            let p = pretok::gguf_pre(pre).ok_or_else(|| {
                Error::Unsupported(format!(
                    "{}: pre-tokenizer `tokenizer.ggml.pre` = `{}` (qkv implements {})",
                    path.display(),
                    pre.escape_debug(),
                    pretok::GGUF_PRE_NAMES.join(", ")
                ))
            })?;
            for pattern in p.patterns {
                pre_tok
                    .steps
                    .push(Split::regex(pattern, Behavior::Isolated, false)?);
            }
            add_bos = p.add_bos_default;
            ModelSpec::Bpe {
                merges: merges()?,
                byte_level: true,
                unknown: UnknownSpec::Drop,
                whole: if p.ignore_merges {
                    WholePiece::Always
                } else {
                    WholePiece::Never
                },
            }
        }
        "gemma4" => {
            normalizer.steps.push(Step::Replace(" ".into(), "▁".into()));
            pre_tok
                .steps
                .push(Split::regex(r"[^\n]+|\n+", Behavior::Isolated, false)?);
            // llama.cpp always adds BOS for Gemma 4, whatever the file says.
            add_bos = true;
            ModelSpec::Bpe {
                merges: merges()?,
                byte_level: false,
                unknown: UnknownSpec::ByteFallback,
                whole: WholePiece::NewlineRuns,
            }
        }
        "llama" => {
            if flag("tokenizer.ggml.add_space_prefix")?.unwrap_or(true) {
                normalizer.steps.push(Step::Prepend("▁".into()));
            }
            normalizer.steps.push(Step::Replace(" ".into(), "▁".into()));
            (bos, eos, unk) = (bos.or(Some(1)), eos.or(Some(2)), unk.or(Some(0)));
            (bos, eos, unk) = (
                bos.filter(|&b| (b as usize) < n),
                eos.filter(|&e| (e as usize) < n),
                unk.filter(|&u| (u as usize) < n),
            );
            add_bos = true;
            ModelSpec::Spm {
                scores: file.get_f32_array("tokenizer.ggml.scores")?,
            }
        }
        "bert" => {
            // llama.cpp's WordPiece does its own normalization and word splitting (wpm.rs).
            let lowercase = flag("tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
            let strip_accents =
                flag("tokenizer.ggml.normalizer.strip_accents")?.unwrap_or(lowercase);
            // The [CLS] token is BERT's BOS.
            bos = match bos {
                Some(b) => Some(b),
                None => id_or("tokenizer.ggml.cls_token_id", Some(101))?,
            };
            unk = unk.or(Some(100).filter(|&u| (u as usize) < n));
            sep = id_or("tokenizer.ggml.seperator_token_id", Some(102))?;
            (add_bos, add_sep) = (true, true);
            ModelSpec::Wpm {
                lowercase,
                strip_accents,
            }
        }
        "t5" => {
            // llama.cpp's defaults for Unigram vocabularies, then what the file says.
            eos = eos.or(Some(1).filter(|&e| (e as usize) < n));
            unk = unk.or(Some(2).filter(|&u| (u as usize) < n));
            add_bos = false;
            add_eos_default = true;
            let charsmap = if has("tokenizer.ggml.precompiled_charsmap") {
                let values = file.get_array("tokenizer.ggml.precompiled_charsmap")?;
                let bytes: Option<Vec<u8>> = values
                    .iter()
                    .map(|v| match v {
                        MetaValue::U8(b) => Some(*b),
                        MetaValue::I8(b) => Some(*b as u8),
                        _ => None,
                    })
                    .collect();
                Some(bytes.ok_or_else(|| {
                    format("tokenizer.ggml.precompiled_charsmap is not an array of bytes".into())
                })?)
            } else {
                None
            };
            ModelSpec::Unigram {
                scores: file.get_f32_array("tokenizer.ggml.scores")?,
                charsmap,
                add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?.unwrap_or(false),
                remove_extra_whitespaces: flag("tokenizer.ggml.remove_extra_whitespaces")?
                    .unwrap_or(false),
            }
        }
        other => {
            return Err(Error::Unsupported(format!(
                "{}: tokenizer model `tokenizer.ggml.model` = `{}` (qkv implements gpt2, \
                 llama, bert, t5 and gemma4)",
                path.display(),
                other.escape_debug()
            )))
        }
    };
    if model != "gemma4" {
        add_bos = flag("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos);
    }
    let add_eos = flag("tokenizer.ggml.add_eos_token")?.unwrap_or(add_eos_default);
    add_sep = flag("tokenizer.ggml.add_sep_token")?.unwrap_or(add_sep);
    if model == "bert" && has("tokenizer.ggml.seperator_token_id") {
        sep = id("tokenizer.ggml.seperator_token_id")?;
    }
    let pad = id("tokenizer.ggml.padding_token_id")?;

    let mut kinds = match kinds {
        Some(k) => k,
        None => {
            // Without types, BOS, EOS, padding and unknown are the control tokens a prompt
            // may spell (a chat template does); the rest is text.
            let mut k = vec![Kind::Normal; n];
            for id in [bos, eos, pad, unk, sep].into_iter().flatten() {
                if let Some(slot) = k.get_mut(id as usize) {
                    *slot = Kind::Control;
                }
            }
            k
        }
    };

    let text_key = |key: &str| -> Result<&str> {
        if has(key) {
            file.get_str(key)
        } else {
            Ok("")
        }
    };
    let strip = quirks::apply(
        &tokens,
        &mut kinds,
        &quirks::Context {
            name: text_key("general.name")?,
            arch: text_key("general.architecture")?,
            pre,
            has_key: &has,
        },
    );

    let need = |what: &str, id: Option<u32>| {
        id.ok_or_else(|| {
            Error::Tokenizer(format!(
                "{}: {what} is set but the file has no such token",
                path.display()
            ))
        })
    };
    let mut prefix = Vec::new();
    let mut suffix = Vec::new();
    if add_bos {
        prefix.push(need("tokenizer.ggml.add_bos_token", bos)?);
    }
    if add_eos {
        suffix.push(need("tokenizer.ggml.add_eos_token", eos)?);
    }
    if add_sep {
        suffix.push(need("tokenizer.ggml.add_sep_token", sep)?);
    }
    let chat_template = if has("tokenizer.chat_template") {
        Some(file.get_str("tokenizer.chat_template")?.to_owned())
    } else {
        None
    };
    Ok(Parts {
        tokens,
        kinds,
        strip,
        llama_split: true,
        model: spec,
        normalizer,
        pre: pre_tok,
        bos,
        eos,
        pad,
        unk,
        sep,
        prefix,
        suffix,
        chat_template,
        source: path.display().to_string(),
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
