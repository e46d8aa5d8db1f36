//! llama.cpp's own tokenizer test suite (`tests/test-tokenizer-0.cpp`): every
//! `models/ggml-vocab-*.gguf` with `.inp`/`.out` files, each input tokenized without special
//! tokens added or parsed, must give every expected line (the ids Hugging Face `tokenizers`
//! gives for the model's original tokenizer).
//!
//! The llama.cpp source comes from the llama-cpp-python sdist that `tools/quantized_models.py`
//! unpacks: `QKV_LLAMACPP_DIR`, else `$QKV_CACHE/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp`
//! (`QKV_CACHE` defaulting to `~/.cache/qkv`). Without it the tests skip with a message,
//! except under CI (`CI=true`) or with `QKV_REQUIRE_LLAMACPP=1`, where they fail; their names
//! say `network`, which fetches the suite. `decode tokenize` is tested in cli/tests/tokenize.rs.
//!
//! Held-out strings (scripts, marks, whitespace runs, numbers, special tokens in text) are
//! compared with llama.cpp's tokenizer on every vocabulary of the folder, in three modes
//! (special tokens parsed or not, and with what the vocabulary adds around the text). The
//! references come from `python3 tools/tokenizer_llamacpp_refs.py` (run by `.ci/run`):
//! `$QKV_CACHE/tokenizer/llamacpp_heldout.json`, or the file `QKV_TOKENIZER_REFS` names. Without
//! it that test skips with a message, except under CI or with `QKV_REQUIRE_TOKENIZER_REFS=1`.
//! A few hard cases per vocabulary are also written out below with llama.cpp's ids, so they run
//! without the references (but with the vocabularies).

use qkv::tokenizer::{EncodeOptions, Tokenizer};
use qkv::weights::gguf::GgufFile;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The vocabularies of the suite (llama.cpp's `tests/CMakeLists.txt` runs the same 15).
const VOCABS: &[&str] = &[
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// llama.cpp's `models/` directory, or `None` (with the reason printed) when it is absent and
/// may be.
fn models_dir() -> Option<PathBuf> {
    let root = match std::env::var_os("QKV_LLAMACPP_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            // No cache directory at all: an empty path, where nothing is found.
            let cache = qkv_fetch::cache_dir().unwrap_or_default();
            cache.join("llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp")
        }
    };
    let dir = root.join("models");
    if dir.join("ggml-vocab-gpt-2.gguf.inp").is_file() {
        return Some(dir);
    }
    let required = std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("QKV_REQUIRE_LLAMACPP").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "llama.cpp's tokenizer suite is not at {} (set QKV_LLAMACPP_DIR; .ci/run unpacks it \
         with tools/quantized_models.py)",
        dir.display()
    );
    eprintln!(
        "skipped: llama.cpp's tokenizer suite is not at {} (set QKV_LLAMACPP_DIR)",
        dir.display()
    );
    None
}

/// The test cases of `vocab`: the `.inp` file cut at `\n__ggml_vocab_test__\n` exactly as
/// test-tokenizer-0.cpp cuts it, each with its `.out` line (ids separated by spaces).
fn cases(dir: &Path, vocab: &str) -> Vec<(String, Vec<u32>)> {
    let base = dir.join(format!("ggml-vocab-{vocab}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(SEP) {
            Some(i) => {
                texts.push(inp[pos..pos + i].to_owned());
                pos += i + SEP.len();
            }
            None => {
                texts.push(inp[pos..].to_owned());
                break;
            }
        }
    }
    let expected: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        texts.len(),
        expected.len(),
        "{vocab}: {} inputs, {} outputs",
        texts.len(),
        expected.len()
    );
    texts.into_iter().zip(expected).collect()
}

const BARE: EncodeOptions = EncodeOptions {
    add_special: false,
    parse_special: false,
};

#[test]
fn network_every_vocab_reproduces_every_line() {
    let Some(dir) = models_dir() else { return };
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for vocab in VOCABS {
        let path = dir.join(format!("ggml-vocab-{vocab}.gguf"));
        let tok = match GgufFile::open(&path).and_then(|f| Tokenizer::from_gguf(&f)) {
            Ok(t) => t,
            Err(e) => {
                report.push(format!("{vocab:>15}: does not load: {e}"));
                failures.push(format!("{vocab}: {e}"));
                continue;
            }
        };
        let cases = cases(&dir, vocab);
        let mut matched = 0;
        for (text, want) in &cases {
            let got = tok.encode_with(text, BARE).unwrap();
            if got == *want {
                matched += 1;
            } else {
                failures.push(format!(
                    "{vocab}: {text:?}\n  want {want:?}\n  got  {got:?}"
                ));
            }
        }
        report.push(format!("{vocab:>15}: {matched}/{} lines", cases.len()));
    }
    eprintln!("{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}\n{}",
        failures.len(),
        report.join("\n"),
        failures.join("\n")
    );
}

/// The suite's other vocabularies (no `.inp`/`.out`) load, the Unigram one (`t5`) included.
#[test]
fn network_the_other_vocabs_load() {
    let Some(dir) = models_dir() else { return };
    for vocab in ["aquila", "baichuan", "gpt-neox", "nomic-bert-moe"] {
        let path = dir.join(format!("ggml-vocab-{vocab}.gguf"));
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
            .unwrap_or_else(|e| panic!("{vocab}: {e}"));
        assert!(!tok.encode("Hello world").unwrap().is_empty());
    }
}

const PARSE: EncodeOptions = EncodeOptions {
    add_special: false,
    parse_special: true,
};

/// Hard cases with llama.cpp's ids (`llama-tokenize --no-bos`, special tokens parsed unless
/// the mode says `bare`), written out so that they run without the references file.
const HARD_CASES: &[(&str, &str, &str, &[u32])] = &[
    // A normal token spelt like an end-of-generation marker is a control token to llama.cpp.
    (
        "qwen2",
        "parse",
        "Hello </s> world",
        &[9707, 220, 128247, 1879],
    ),
    ("qwen35", "parse", "a</s>b", &[64, 128247, 65]),
    // Phi-3's special tokens swallow the whitespace after them (no `▁` before `x`)...
    ("phi-3", "parse", "</s> x", &[2, 921]),
    ("phi-3", "parse", "a<|assistant|>  b", &[263, 32001, 289]),
    // ... but not when they are split as text.
    ("phi-3", "bare", "</s> ", &[1533, 29879, 29958, 29871]),
    // WordPiece: Hangul keeps only each syllable's first jamo, Devanagari loses its signs.
    ("bert-bge", "bare", "한국어", &[1469, 29991, 29999]),
    (
        "bert-bge",
        "bare",
        "नमस्ते दुनिया",
        &[1327, 29867, 29874, 29859, 1325, 29863, 29868],
    ),
    // Unigram with the precompiled character map (NFKC: `ﬁ` → `fi`, full-width → ASCII),
    // extra spaces removed, and `<mask>` taking the whitespace before it.
    (
        "nomic-bert-moe",
        "parse",
        "ﬁ ＡＢＣ <mask>",
        &[809, 47457, 250001],
    ),
    (
        "nomic-bert-moe",
        "parse",
        "Hello   world  <mask>  x",
        &[35378, 8999, 250001, 1022],
    ),
];

#[test]
fn network_hard_cases_match_llama_cpp() {
    let Some(dir) = models_dir() else { return };
    let mut failures = Vec::new();
    for &(vocab, mode, text, want) in HARD_CASES {
        let path = dir.join(format!("ggml-vocab-{vocab}.gguf"));
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        let opts = if mode == "bare" { BARE } else { PARSE };
        let got = tok.encode_with(text, opts).unwrap();
        if got != want {
            failures.push(format!(
                "{vocab} {mode} {text:?}: want {want:?}, got {got:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The held-out references, or `None` (with the reason printed) when they are missing and may
/// be.
fn heldout_refs() -> Option<Value> {
    let path = match std::env::var_os("QKV_TOKENIZER_REFS") {
        Some(p) => PathBuf::from(p),
        None => qkv_fetch::cache_dir()
            .expect("a cache directory")
            .join("tokenizer/llamacpp_heldout.json"),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(serde_json::from_str(&text).expect("the references are JSON")),
        Err(e) => {
            let why = format!(
                "{}: {e} (write it with `python3 tools/tokenizer_llamacpp_refs.py`)",
                path.display()
            );
            let required = std::env::var("CI").is_ok_and(|v| v == "true")
                || std::env::var("QKV_REQUIRE_TOKENIZER_REFS").is_ok_and(|v| v == "1");
            assert!(!required, "{why}");
            eprintln!("skipped: {why}");
            None
        }
    }
}

#[test]
fn network_every_vocab_matches_llama_cpp_on_held_out_strings() {
    let Some(dir) = models_dir() else { return };
    let Some(refs) = heldout_refs() else { return };
    let vocabs: Vec<&str> = refs["vocabs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(vocabs.len(), 19, "the folder's 19 vocabularies: {vocabs:?}");
    let mut by_vocab: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for case in refs["cases"].as_array().unwrap() {
        by_vocab
            .entry(case["vocab"].as_str().unwrap())
            .or_default()
            .push(case);
    }
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for vocab in &vocabs {
        let path = dir.join(format!("ggml-vocab-{vocab}.gguf"));
        let tok = match GgufFile::open(&path).and_then(|f| Tokenizer::from_gguf(&f)) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{vocab}: does not load: {e}"));
                continue;
            }
        };
        let cases = by_vocab.get(vocab).map_or(&[][..], Vec::as_slice);
        let mut matched = 0;
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let mode = case["mode"].as_str().unwrap();
            let want: Vec<u32> = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect();
            let opts = match mode {
                "parse" => PARSE,
                "bare" => BARE,
                // llama-tokenize adds special tokens when the vocabulary adds BOS.
                "full" => EncodeOptions {
                    add_special: tok.adds_bos(),
                    parse_special: true,
                },
                other => panic!("unknown mode {other}"),
            };
            let got = tok.encode_with(text, opts).unwrap();
            if got == want {
                matched += 1;
            } else {
                failures.push(format!(
                    "{vocab} {mode} {text:?}\n  want {want:?}\n  got  {got:?}"
                ));
            }
        }
        report.push(format!(
            "{vocab:>15}: {matched}/{} held-out cases",
            cases.len()
        ));
    }
    eprintln!("{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}\n{}",
        failures.len(),
        report.join("\n"),
        failures.join("\n")
    );
}
