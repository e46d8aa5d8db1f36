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

use qkv::tokenizer::{EncodeOptions, Tokenizer};
use qkv::weights::gguf::GgufFile;
use qkv::Error;
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
            let cache = std::env::var_os("QKV_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("qkv"))
                })
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/qkv")))
                .unwrap_or_default();
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

/// The suite's other vocabularies (no `.inp`/`.out`) load, or are refused with a typed error
/// naming their tokenizer model.
#[test]
fn network_the_other_vocabs_load_or_name_their_model() {
    let Some(dir) = models_dir() else { return };
    for (vocab, refused) in [
        ("aquila", None),
        ("baichuan", None),
        ("gpt-neox", None),
        ("nomic-bert-moe", Some("`t5`")),
    ] {
        let path = dir.join(format!("ggml-vocab-{vocab}.gguf"));
        let got = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap());
        match (got, refused) {
            (Ok(tok), None) => assert!(!tok.encode("Hello world").unwrap().is_empty()),
            (Err(Error::Unsupported(msg)), Some(name)) => {
                assert!(msg.contains(name), "{vocab}: {msg}")
            }
            (Ok(_), Some(_)) => panic!("{vocab} should be refused"),
            (Err(e), _) => panic!("{vocab}: {e}"),
        }
    }
}
