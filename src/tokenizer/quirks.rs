//! What llama.cpp changes in a GGUF vocabulary's token types when it loads one, reproduced so
//! that special tokens are cut out of text exactly where llama.cpp cuts them.
//!
//! GGUF stores one type per token, but llama.cpp does not take them as they are:
//!
//! - Tokens whose text names an end of generation (`</s>`, `<|im_end|>`, `<|endoftext|>`,
//!   `<end_of_turn>`, …) become control tokens whatever their type. Qwen2's vocabulary holds a
//!   normal token `</s>`; with special tokens parsed, llama.cpp keeps it whole.
//! - Fill-in-the-middle markers (`<|fim_prefix|>`, `<PRE>`, …) become control tokens when the
//!   file does not name that marker's id.
//! - A few tokens of OpenAI's and Solar's vocabularies become user-defined, and Gemma 4's and
//!   PLaMo's `</s>` a normal token.
//! - Some model families strip whitespace around special tokens: Phi-3 after every special
//!   token but `<unk>`, `<s>` and `<|endoftext|>` (so `</s> x` is `</s>`, `▁x`); Nomic's and
//!   Jina's `<mask>`, and ModernBERT's `[MASK]`, before them.

use super::parts::Kind;
use std::collections::HashMap;

/// Texts that mark the end of generation.
const END_OF_GENERATION: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
];

/// Fill-in-the-middle markers, each group with the GGUF key that names its id.
const FIM: &[(&str, &[&str])] = &[
    (
        "tokenizer.ggml.fim_pre_token_id",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<\u{ff5c}fim\u{2581}begin\u{ff5c}>",
            "<PRE>",
            "\u{2581}<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<\u{ff5c}fim\u{2581}hole\u{ff5c}>",
            "<SUF>",
            "\u{2581}<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<\u{ff5c}fim\u{2581}end\u{ff5c}>",
            "<MID>",
            "\u{2581}<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        "tokenizer.ggml.fim_pad_token_id",
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        "tokenizer.ggml.fim_rep_token_id",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"]),
];

/// The fill-in-the-middle markers' ids in [`FIM`]'s order (prefix, suffix, middle, pad,
/// repository, file separator), as llama.cpp finds them: the id the file names under the
/// marker's key (`named`), else the first of the marker's texts the vocabulary holds.
pub(crate) fn fim_ids(tokens: &[String], named: &dyn Fn(&str) -> Option<u32>) -> [Option<u32>; 6] {
    let mut ids: HashMap<&str, u32> = HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        ids.insert(t.as_str(), i as u32);
    }
    let mut out = [None; 6];
    for (o, (key, names)) in out.iter_mut().zip(FIM) {
        *o = named(key)
            .filter(|&i| (i as usize) < tokens.len())
            .or_else(|| names.iter().find_map(|n| ids.get(n).copied()));
    }
    out
}

/// What the file says that the adjustments depend on.
pub(crate) struct Context<'a> {
    /// `general.name`.
    pub name: &'a str,
    /// `general.architecture`.
    pub arch: &'a str,
    /// `tokenizer.ggml.pre`.
    pub pre: &'a str,
    /// Whether the file has the given metadata key.
    pub has_key: &'a dyn Fn(&str) -> bool,
}

/// Adjusts `kinds` as llama.cpp does, and returns the special tokens that strip whitespace:
/// `(id, lstrip, rstrip)`.
pub(crate) fn apply(
    tokens: &[String],
    kinds: &mut [Kind],
    cx: &Context<'_>,
) -> Vec<(u32, bool, bool)> {
    // The last of duplicate texts, as llama.cpp's text → id map keeps it.
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        ids.insert(t.as_str(), i);
    }
    // A token llama.cpp makes a control token is matched only when special tokens are
    // parsed (the unknown token already is).
    let make_control = |k: &mut Kind| {
        if *k != Kind::Unknown {
            *k = Kind::Control;
        }
    };
    for (key, names) in FIM {
        if (cx.has_key)(key) {
            continue;
        }
        // llama.cpp takes the first marker its hash map yields; vocabularies hold one.
        if let Some(&i) = names.iter().find_map(|n| ids.get(n)) {
            make_control(&mut kinds[i]);
        }
    }
    for name in END_OF_GENERATION {
        if let Some(&i) = ids.get(name) {
            make_control(&mut kinds[i]);
        }
    }
    for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&i) = ids.get(name) {
            kinds[i] = Kind::UserDefined;
        }
    }
    let has = |n: &str| ids.contains_key(n);
    if has("<|end|>")
        && ((has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")))
    {
        kinds[ids["<|end|>"]] = Kind::UserDefined;
    }
    if has("</s>") && (has("<|tool_response>") || has("<|plamo:eos|>")) {
        kinds[ids["</s>"]] = Kind::Normal;
    }

    let mut strip = Vec::new();
    let name = cx.name.to_lowercase();
    if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
        .iter()
        .any(|p| cx.pre.contains(p))
        || ["nomic-bert-moe", "jina-bert-v3"]
            .iter()
            .any(|a| cx.arch.contains(a))
    {
        if let Some(&i) = ids.get("<mask>") {
            strip.push((i as u32, true, false));
        }
    } else if name.contains("phi-3") || name.contains("phi3") {
        let keep = ["<unk>", "<s>", "<|endoftext|>"];
        for (i, (t, k)) in tokens.iter().zip(kinds.iter()).enumerate() {
            if k.is_special() && !keep.contains(&t.as_str()) {
                strip.push((i as u32, false, true));
            }
        }
        if let Some(&i) = ids.get("</s>") {
            if !kinds[i].is_special() {
                strip.push((i as u32, false, true));
            }
        }
    } else if name.contains("modern-bert") {
        if let Some(&i) = ids.get("[MASK]") {
            strip.push((i as u32, true, false));
        }
    }
    strip
}
