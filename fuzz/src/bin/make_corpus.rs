//! Writes the seed corpus under `fuzz/corpus/<target>/`: tiny valid GGUF files written by
//! qkv's own writer (every metadata type, every tensor type including each quantized block
//! layout, and vocabularies of each tokenizer model), safetensors files written by the
//! format's crate, and tokenizer seeds made from `fuzz/seeds/tokenizer_json/`. Templates and
//! request bodies are written by hand, straight into their corpus directories.
//!
//! Built with the targets (`cargo +nightly fuzz build -O -a` in `fuzz/`); run from the root as
//! `fuzz/target/x86_64-unknown-linux-gnu/release/make_corpus fuzz/corpus`.
//! Every seed is a few KB at most; the whole corpus stays small enough to commit.

use qkv::kernels::QuantFormat;
use qkv::weights::gguf::{write_gguf, MetaValue, MetaValueType};
use qkv::weights::WeightFormat;
use std::path::{Path, PathBuf};

type Meta = Vec<(String, MetaValue)>;

fn strings<S: Into<String>>(v: impl IntoIterator<Item = S>) -> MetaValue {
    MetaValue::Array(
        MetaValueType::String,
        v.into_iter().map(|s| MetaValue::String(s.into())).collect(),
    )
}

/// Bytes that are never a NaN or infinite f16 (every high byte is below 0x7C), so quantized
/// blocks pass the scale check whatever fields they hold.
fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 37 + seed * 11) % 0x70) as u8)
        .collect()
}

/// A GGUF file written by qkv, read back as bytes.
fn gguf_bytes(
    scratch: &Path,
    meta: &Meta,
    tensors: &[(String, Vec<usize>, WeightFormat, Vec<u8>)],
) -> Vec<u8> {
    let path = scratch.join("seed.gguf");
    let t: Vec<(String, Vec<usize>, WeightFormat, &[u8])> = tensors
        .iter()
        .map(|(n, s, f, b)| (n.clone(), s.clone(), *f, b.as_slice()))
        .collect();
    write_gguf(&path, meta, &t).expect("writing a seed GGUF");
    std::fs::read(&path).expect("reading a seed GGUF back")
}

/// Vocabulary metadata of each tokenizer model qkv reads from GGUF.
fn vocabs() -> Vec<(&'static str, Meta)> {
    let k = |s: &str| format!("tokenizer.ggml.{s}");
    let bytes = qkv::tokenizer::gpt2_byte_chars();
    let mut gpt2_tokens: Vec<String> = bytes.iter().map(char::to_string).collect();
    gpt2_tokens.extend(["ab", "Ġt", "he", "Ġthe", "<|im_start|>", "<|im_end|>"].map(String::from));
    let mut gpt2_types = vec![MetaValue::I32(1); gpt2_tokens.len()];
    let n = gpt2_types.len();
    gpt2_types[n - 2] = MetaValue::I32(3);
    gpt2_types[n - 1] = MetaValue::I32(3);
    let gpt2 = vec![
        (k("model"), MetaValue::String("gpt2".into())),
        (k("pre"), MetaValue::String("smollm".into())),
        (k("tokens"), strings(gpt2_tokens)),
        (k("token_type"), MetaValue::Array(MetaValueType::I32, gpt2_types)),
        (k("merges"), strings(["a b", "Ġ t", "h e", "Ġt he"])),
        (k("bos_token_id"), MetaValue::U32(260)),
        (k("eos_token_id"), MetaValue::U32(261)),
        (
            "tokenizer.chat_template".into(),
            MetaValue::String("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}".into()),
        ),
    ];
    let mut spm_tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    spm_tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    spm_tokens.extend(["▁", "▁h", "el", "lo", "▁hel", "▁hello", "w", "or", "ld"].map(String::from));
    let spm_n = spm_tokens.len();
    let mut spm_types = vec![MetaValue::I32(1); spm_n];
    spm_types[0] = MetaValue::I32(2);
    spm_types[1] = MetaValue::I32(3);
    spm_types[2] = MetaValue::I32(3);
    for t in &mut spm_types[3..259] {
        *t = MetaValue::I32(6);
    }
    let llama = vec![
        (k("model"), MetaValue::String("llama".into())),
        (k("tokens"), strings(spm_tokens.clone())),
        (
            k("scores"),
            MetaValue::Array(
                MetaValueType::F32,
                (0..spm_n).map(|i| MetaValue::F32(-(i as f32))).collect(),
            ),
        ),
        (
            k("token_type"),
            MetaValue::Array(MetaValueType::I32, spm_types),
        ),
        (k("add_space_prefix"), MetaValue::Bool(true)),
    ];
    let mut gemma_tokens = spm_tokens;
    gemma_tokens.extend(["\n", "\n\n"].map(String::from));
    let gemma = vec![
        (k("model"), MetaValue::String("gemma4".into())),
        (k("tokens"), strings(gemma_tokens)),
        (k("merges"), strings(["▁ h", "e l", "l o", "▁h el"])),
        (k("bos_token_id"), MetaValue::U32(1)),
    ];
    let bert_tokens = [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁play", "ing", "▁the", "▁!", "▁a",
    ];
    let bert = vec![
        (k("model"), MetaValue::String("bert".into())),
        (k("tokens"), strings(bert_tokens)),
        (k("unknown_token_id"), MetaValue::U32(1)),
        (k("cls_token_id"), MetaValue::U32(2)),
        (k("seperator_token_id"), MetaValue::U32(3)),
        (k("padding_token_id"), MetaValue::U32(0)),
        (k("normalizer.lowercase"), MetaValue::Bool(true)),
    ];
    vec![
        ("gpt2", gpt2),
        ("llama", llama),
        ("gemma4", gemma),
        ("bert", bert),
    ]
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("creating a corpus directory");
    std::fs::write(dir.join(name), bytes).expect("writing a seed");
}

fn gguf_seeds(corpus: &Path, scratch: &Path) {
    let dir = corpus.join("gguf");
    // Every metadata value type, nested arrays, a custom alignment and the float tensors.
    let meta: Meta = vec![
        (
            "general.architecture".into(),
            MetaValue::String("llama".into()),
        ),
        ("general.alignment".into(), MetaValue::U32(64)),
        ("u8".into(), MetaValue::U8(7)),
        ("i8".into(), MetaValue::I8(-7)),
        ("u16".into(), MetaValue::U16(700)),
        ("i16".into(), MetaValue::I16(-700)),
        ("u32".into(), MetaValue::U32(70_000)),
        ("i32".into(), MetaValue::I32(-70_000)),
        ("u64".into(), MetaValue::U64(1 << 40)),
        ("i64".into(), MetaValue::I64(-(1 << 40))),
        ("f32".into(), MetaValue::F32(0.5)),
        ("f64".into(), MetaValue::F64(-0.25)),
        ("bool".into(), MetaValue::Bool(true)),
        (
            "ints".into(),
            MetaValue::Array(
                MetaValueType::I32,
                vec![MetaValue::I32(1), MetaValue::I32(-2)],
            ),
        ),
        (
            "floats".into(),
            MetaValue::Array(MetaValueType::F32, vec![MetaValue::F32(1.5)]),
        ),
        (
            "nested".into(),
            MetaValue::Array(
                MetaValueType::Array,
                vec![strings(["a", "b"]), strings(["c"])],
            ),
        ),
    ];
    let floats: Vec<u8> = [1.0f32, -2.0, 0.5, 3.25, 0.0, -0.125]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let halves: Vec<u8> = [0x3c00u16, 0xc000, 0x3800, 0x0001]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let tensors = vec![
        ("w.f32".to_string(), vec![2, 3], WeightFormat::F32, floats),
        ("w.f16".to_string(), vec![4], WeightFormat::F16, halves),
    ];
    write(&dir, "floats.gguf", &gguf_bytes(scratch, &meta, &tensors));
    // One file per quantized format: a matrix of two rows of one block each.
    for format in QuantFormat::ALL {
        let row = format.block_elems();
        let bytes = pattern(2 * format.block_bytes(), row);
        let meta: Meta = vec![(
            "general.name".into(),
            MetaValue::String(format.name().into()),
        )];
        let tensors = vec![(
            "blk.0.w".to_string(),
            vec![2, row],
            WeightFormat::Quant(format),
            bytes,
        )];
        write(
            &dir,
            &format!("{}.gguf", format.name().to_lowercase()),
            &gguf_bytes(scratch, &meta, &tensors),
        );
    }
    // A BF16 tensor: an F16 one with its type code patched (1 -> 30), in a file holding only
    // that tensor.
    let halves: Vec<u8> = [0x3f80u16, 0xc000]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let mut bytes = gguf_bytes(
        scratch,
        &Vec::new(),
        &[("b".to_string(), vec![2], WeightFormat::F16, halves)],
    );
    // magic 4, version 4, counts 16, name len 8 + "b", n_dims 4, dim 8, then the type.
    let at = 4 + 4 + 16 + 8 + 1 + 4 + 8;
    assert_eq!(bytes[at..at + 4], 1u32.to_le_bytes());
    bytes[at..at + 4].copy_from_slice(&30u32.to_le_bytes());
    write(&dir, "bf16.gguf", &bytes);
    let (_, vocab) = &vocabs()[0];
    write(&dir, "vocab_gpt2.gguf", &gguf_bytes(scratch, vocab, &[]));
}

fn safetensors_seeds(corpus: &Path) {
    use safetensors::tensor::{Dtype, TensorView};
    let dir = corpus.join("safetensors");
    let f32s: Vec<u8> = [1.0f32, -2.0, 0.5, 3.25, 0.0, -0.125]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let f16s: Vec<u8> = [0x3c00u16, 0xc000, 0x3800, 0x0001]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let bf16s: Vec<u8> = [0x3f80u16, 0xc000]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let i32s: Vec<u8> = [1i32, 2].iter().flat_map(|x| x.to_le_bytes()).collect();
    let views = vec![
        (
            "w",
            TensorView::new(Dtype::F32, vec![2, 3], &f32s).expect("f32 view"),
        ),
        (
            "h",
            TensorView::new(Dtype::F16, vec![2, 2], &f16s).expect("f16 view"),
        ),
        (
            "b",
            TensorView::new(Dtype::BF16, vec![2], &bf16s).expect("bf16 view"),
        ),
        (
            "i",
            TensorView::new(Dtype::I32, vec![2], &i32s).expect("i32 view"),
        ),
    ];
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors::serialize(views, Some(meta)).expect("serializing a seed");
    write(&dir, "mixed.safetensors", &bytes);
    let one = vec![(
        "x",
        TensorView::new(Dtype::F32, vec![1], &f32s[..4]).expect("view"),
    )];
    write(
        &dir,
        "one.safetensors",
        &safetensors::serialize(one, None).expect("serializing"),
    );
}

/// Mode byte, text length, text, then the source (see fuzz_targets/tokenizer.rs).
fn tokenizer_seed(mode: u8, text: &str, source: &[u8]) -> Vec<u8> {
    let mut out = vec![mode];
    out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(source);
    out
}

fn tokenizer_seeds(corpus: &Path, scratch: &Path, fixtures: &Path) {
    let dir = corpus.join("tokenizer");
    let text = "Hello the world! <|im_start|>user\n\n ab  12345 héllo 你好 <s>";
    for (name, meta) in vocabs() {
        let seed = tokenizer_seed(0, text, &gguf_bytes(scratch, &meta, &[]));
        write(&dir, &format!("gguf_{name}"), &seed);
    }
    for entry in std::fs::read_dir(fixtures).expect("reading the tokenizer.json seeds") {
        let path = entry.expect("a directory entry").path();
        let json = std::fs::read(&path).expect("reading a tokenizer.json seed");
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("json");
        write(
            &dir,
            &format!("json_{name}"),
            &tokenizer_seed(1, text, &json),
        );
    }
    // A tokenizer.json with its tokenizer_config.json after a 0xFF byte.
    let mut pair = std::fs::read(fixtures.join("bytelevel.json")).expect("reading bytelevel.json");
    pair.push(0xFF);
    pair.extend_from_slice(
        br#"{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": true, "add_eos_token": false, "chat_template": "{{ bos_token }}{{ messages[0].content }}"}"#,
    );
    write(&dir, "json_with_config", &tokenizer_seed(1, text, &pair));
    // Structured vocabularies: any bytes decode to one; these few get it started.
    write(
        &dir,
        "structured_a",
        &[2, 0, 1, 7, 3, b'a', b'b', b'c', 0, 1, 2, 3, 4, 5, 6, 7, 8],
    );
    write(
        &dir,
        "structured_b",
        &[2, 1, 0, 1, 2, b'h', b'i', 0xff, 0x10, 0x20, 0x30, 0x40],
    );
}

fn main() {
    let corpus = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    let seeds = corpus.parent().unwrap_or(Path::new(".")).join("seeds");
    let scratch = qkv_fuzz::scratch_dir();
    gguf_seeds(&corpus, &scratch);
    safetensors_seeds(&corpus);
    tokenizer_seeds(&corpus, &scratch, &seeds.join("tokenizer_json"));
    std::fs::remove_dir_all(&scratch).ok();
    println!("wrote the seeds under {}", corpus.display());
}
