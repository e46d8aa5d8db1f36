//! Tokenizers built from untrusted vocabularies, then encode and decode of arbitrary text and
//! ids.
//!
//! The first byte picks the source:
//! - 0: a GGUF file (the rest after the text, see below), its `tokenizer.ggml.*` metadata;
//! - 1: a `tokenizer.json` (the rest after the text), optionally followed by a 0xFF byte and
//!   a `tokenizer_config.json` written beside it;
//! - anything else: a vocabulary drawn from the bytes (model, pre-tokenizer, tokens, types,
//!   merges, scores, special ids and flags) and written with qkv's own GGUF writer, which
//!   reaches the encoders much more often than mutated files do.
//!
//! For 0 and 1, two little-endian bytes give the length of the text to encode, which follows
//! them. Whatever builds is then asked to encode (every option), decode (arbitrary ids and its
//! own output) and stream-decode; the invariants checked are that encode gives ids inside the
//! vocabulary and that decode accepts every id encode gives.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use qkv::tokenizer::{EncodeOptions, StreamDecoder, Tokenizer};
use qkv::weights::gguf::{write_gguf, GgufFile, MetaValue, MetaValueType};

/// Pre-tokenizers the structured vocabularies pick from (a sample of qkv's, and one unknown).
const PRE: &[&str] = &[
    "default",
    "gpt2",
    "llama3",
    "qwen2",
    "smollm",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "gpt-4o",
    "tekken",
    "bloom",
    "starcoder",
    "command-r",
    "no-such-pre",
];

#[derive(Arbitrary, Debug)]
enum ModelKind {
    Gpt2,
    Llama,
    Bert,
    Gemma4,
    Other(String),
}

#[derive(Arbitrary, Debug)]
struct Vocab {
    model: ModelKind,
    pre: u8,
    /// Start with a full byte alphabet (GPT-2's characters, or `<0xXX>` for SentencePiece).
    byte_alphabet: bool,
    tokens: Vec<String>,
    /// GGUF token types, taken modulo 8 (1 normal … 6 byte; 0 and 7 are invalid).
    types: Option<Vec<u8>>,
    /// Merges as pairs of token indices.
    merges: Vec<(u16, u16)>,
    scores: Option<Vec<f32>>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    sep: Option<u32>,
    add_bos: Option<bool>,
    add_eos: Option<bool>,
    add_sep: Option<bool>,
    add_space_prefix: Option<bool>,
    lowercase: Option<bool>,
    strip_accents: Option<bool>,
    text: String,
    ids: Vec<u32>,
}

fn strings(v: impl IntoIterator<Item = String>) -> MetaValue {
    MetaValue::Array(
        MetaValueType::String,
        v.into_iter().map(MetaValue::String).collect(),
    )
}

/// Writes `v` as a vocab-only GGUF file and returns the tokenizer it builds, if any.
fn build(v: &Vocab) -> Option<Tokenizer> {
    let model = match &v.model {
        ModelKind::Gpt2 => "gpt2",
        ModelKind::Llama => "llama",
        ModelKind::Bert => "bert",
        ModelKind::Gemma4 => "gemma4",
        ModelKind::Other(s) => s.as_str(),
    };
    let mut tokens: Vec<String> = Vec::new();
    if v.byte_alphabet {
        if model == "gpt2" {
            tokens.extend(
                qkv::tokenizer::gpt2_byte_chars()
                    .iter()
                    .map(char::to_string),
            );
        } else {
            tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        }
    }
    tokens.extend(v.tokens.iter().cloned());
    let n = tokens.len();
    let key = |k: &str| format!("tokenizer.ggml.{k}");
    let mut meta = vec![
        (key("model"), MetaValue::String(model.into())),
        (
            key("pre"),
            MetaValue::String(PRE[usize::from(v.pre) % PRE.len()].into()),
        ),
    ];
    if let Some(types) = &v.types {
        let types: Vec<MetaValue> = (0..n)
            .map(|i| MetaValue::I32(i32::from(types.get(i).copied().unwrap_or(1) % 8)))
            .collect();
        meta.push((
            key("token_type"),
            MetaValue::Array(MetaValueType::I32, types),
        ));
    }
    if n > 0 {
        let merges = v.merges.iter().map(|&(a, b)| {
            format!(
                "{} {}",
                tokens[usize::from(a) % n],
                tokens[usize::from(b) % n]
            )
        });
        meta.push((key("merges"), strings(merges)));
    }
    if let Some(scores) = &v.scores {
        let scores: Vec<MetaValue> = (0..n)
            .map(|i| MetaValue::F32(scores.get(i).copied().unwrap_or(-(i as f32))))
            .collect();
        meta.push((key("scores"), MetaValue::Array(MetaValueType::F32, scores)));
    }
    for (k, id) in [
        ("bos_token_id", v.bos),
        ("eos_token_id", v.eos),
        ("unknown_token_id", v.unk),
        ("padding_token_id", v.pad),
        ("seperator_token_id", v.sep),
    ] {
        if let Some(id) = id {
            meta.push((key(k), MetaValue::U32(id)));
        }
    }
    for (k, flag) in [
        ("add_bos_token", v.add_bos),
        ("add_eos_token", v.add_eos),
        ("add_sep_token", v.add_sep),
        ("add_space_prefix", v.add_space_prefix),
        ("normalizer.lowercase", v.lowercase),
        ("normalizer.strip_accents", v.strip_accents),
    ] {
        if let Some(flag) = flag {
            meta.push((key(k), MetaValue::Bool(flag)));
        }
    }
    meta.push((key("tokens"), strings(tokens)));
    let path = qkv_fuzz::scratch_dir().join("vocab.gguf");
    write_gguf(&path, &meta, &[]).ok()?;
    let file = GgufFile::open(&path).expect("qkv reads the GGUF files it writes");
    Tokenizer::from_gguf(&file).ok()
}

/// Runs the encoders and decoders on `text` and `ids`.
fn exercise(tok: &Tokenizer, text: &str, ids: &[u32]) {
    let n = tok.vocab_size();
    let _ = format!("{tok:?}");
    let _ = (
        tok.bos_id(),
        tok.eos_id(),
        tok.pad_id(),
        tok.unk_id(),
        tok.sep_id(),
    );
    let _ = (
        tok.special_prefix(),
        tok.special_suffix(),
        tok.chat_template(),
    );
    let mut encoded = Vec::new();
    for (add_special, parse_special) in [(true, true), (false, false), (true, false), (false, true)]
    {
        let opts = EncodeOptions {
            add_special,
            parse_special,
        };
        if let Ok(out) = tok.encode_with(text, opts) {
            encoded.push(out);
        }
    }
    encoded.extend(tok.encode_literal(text));
    for out in &encoded {
        for &id in out {
            assert!(
                (id as usize) < n,
                "encode gave id {id} for a vocabulary of {n}"
            );
        }
        tok.decode(out).expect("decode accepts what encode gives");
    }
    let _ = tok.decode(ids);
    let mut stream = StreamDecoder::new(tok);
    for &id in ids.iter().chain(encoded.first().into_iter().flatten()) {
        let _ = stream.push(id);
    }
    let _ = stream.finish();
    for &id in ids.iter().take(64) {
        if let Ok(s) = tok.token_str(id) {
            let _ = tok.token_id(s);
        }
        let _ = (tok.token_bytes(id), tok.is_special(id));
    }
    let _ = tok.token_id(text);
}

/// The text and the source bytes of modes 0 and 1.
fn split_text(data: &[u8]) -> Option<(String, &[u8])> {
    let [lo, hi, rest @ ..] = data else {
        return None;
    };
    let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
    let (text, source) = rest.split_at(len);
    Some((String::from_utf8_lossy(text).into_owned(), source))
}

/// Ids read from the text's bytes, two at a time, so decoding sees ids near and past the
/// vocabulary's end.
fn ids_of(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(2)
        .map(|c| u32::from(c[0]) | c.get(1).map_or(0, |&b| u32::from(b) << 8))
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode {
        0 => {
            let Some((text, source)) = split_text(rest) else {
                return;
            };
            let path = qkv_fuzz::scratch_file("tokenizer.gguf", source);
            let Ok(file) = GgufFile::open(&path) else {
                return;
            };
            if let Ok(tok) = Tokenizer::from_gguf(&file) {
                exercise(&tok, &text, &ids_of(&text));
            }
        }
        1 => {
            let Some((text, source)) = split_text(rest) else {
                return;
            };
            let mut files = source.splitn(2, |&b| b == 0xFF);
            let json = files.next().unwrap_or_default();
            let dir = qkv_fuzz::scratch_dir().join("hf");
            std::fs::create_dir_all(&dir).expect("creating the scratch directory");
            let config = dir.join("tokenizer_config.json");
            match files.next() {
                Some(c) => std::fs::write(&config, c).expect("writing the scratch config"),
                None => {
                    let _ = std::fs::remove_file(&config);
                }
            }
            let path = dir.join("tokenizer.json");
            std::fs::write(&path, json).expect("writing the scratch tokenizer.json");
            if let Ok(tok) = Tokenizer::from_tokenizer_json(&path) {
                exercise(&tok, &text, &ids_of(&text));
            }
        }
        _ => {
            let Ok(v) = Vocab::arbitrary_take_rest(Unstructured::new(rest)) else {
                return;
            };
            if let Some(tok) = build(&v) {
                exercise(&tok, &v.text, &v.ids);
            }
        }
    }
});
